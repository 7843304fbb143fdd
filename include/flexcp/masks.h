// Builders for the masks users actually train with (DESIGN §2). Document lengths describe a
// packed batch: documents are laid end to end, and attention never crosses a document boundary.
// Lengths are >= 0 and their total at most kMaxSeqlen; a builder given others throws
// Error(kInvalidArgument) naming the argument, the entry and the limit.
#pragma once

#include <cstdint>
#include <vector>

#include "flexcp/export.h"
#include "flexcp/mask.h"

namespace flexcp::masks {

using Lengths = std::vector<std::int64_t>;

// Every query sees every key; bottom-right aligned causal (seqlen_q may differ from seqlen_k).
FLEXCP_API Mask full(std::int64_t seqlen_q, std::int64_t seqlen_k);
FLEXCP_API Mask causal(std::int64_t seqlen_q, std::int64_t seqlen_k);

// `num_seqs` sequences of `seqlen` tokens each, packed; each sequence attends to itself.
FLEXCP_API Mask batch(std::int64_t num_seqs, std::int64_t seqlen, MaskType type);

// Packed documents, each attending to itself with one mask type.
FLEXCP_API Mask varlen(const Lengths& doc_lens, MaskType type);
FLEXCP_API Mask varlen_full(const Lengths& doc_lens);
FLEXCP_API Mask varlen_causal(const Lengths& doc_lens);

// Cross-attention between packed q and k documents given as cumulative offsets (cu_seqlens,
// starting at 0, same count for q and k): document d's queries attend its keys.
FLEXCP_API Mask from_cu_seqlens(const Lengths& cu_seqlens_q, const Lengths& cu_seqlens_k,
                                MaskType type);

// Sliding window inside each document: kCausal lets token t see [t - window + 1, t];
// kSymmetric lets it see [t - window + 1, t + window - 1].
enum class WindowKind { kCausal, kSymmetric };
FLEXCP_API Mask sliding_window(const Lengths& doc_lens, std::int64_t window, WindowKind kind);

// Each document is cut into blocks of `block` tokens; a block sees itself and every earlier block
// of its document (bidirectional inside a block).
FLEXCP_API Mask block_causal(const Lengths& doc_lens, std::int64_t block);

// Each document starts with a prefix seen bidirectionally; the rest is causal and sees the prefix.
FLEXCP_API Mask prefix_lm(const Lengths& doc_lens, const Lengths& prefix_lens);

// One causal prompt followed by answers; each answer sees the prompt and itself (causally).
FLEXCP_API Mask shared_question(std::int64_t question_len, const Lengths& answer_lens);

// The masks laid end to end, each over its own queries and keys (those of mask i follow those of
// masks 0..i-1): a packed batch of samples that each bring their own mask, none attending
// another. Its lengths are the sums, at most kMaxSeqlen a side.
FLEXCP_API Mask pack(const std::vector<Mask>& masks);

// Any mask given row by row, as runs of attended keys: each run attends keys [begin, end) from
// query `row`. Runs come sorted by row, then by key; runs of one row may touch (they are joined)
// but not overlap; an empty run is an error. The rows become as few slices as one pass finds:
// consecutive rows whose runs' two ends each stay put or move one key on become one slice
// (full, causal, inv_causal or bi_causal), so a mask written as a predicate (FlexAttention's
// mask_mod) comes back as the slices its builder would give. The result attends exactly the
// pairs given. Errors name the run, its values and what was expected.
struct RowRun {
  std::int64_t row = 0;
  std::int64_t begin = 0;
  std::int64_t end = 0;
};
FLEXCP_API Mask from_row_runs(std::int64_t seqlen_q, std::int64_t seqlen_k,
                              const std::vector<RowRun>& runs);

// The reverse: every row's runs of attended keys, sorted by row, then by key, maximal (touching
// runs joined), rows that attend nothing left out. What another library's per-row bounds take.
FLEXCP_API std::vector<RowRun> row_runs(const Mask& mask);

// A dense row-major seqlen_q x seqlen_k matrix of bytes, nonzero where (q, k) is attended. Costs
// one read of every entry: for masks small enough to hold densely.
FLEXCP_API Mask from_dense(std::int64_t seqlen_q, std::int64_t seqlen_k,
                           const std::uint8_t* attended);

// The pairs any of the masks attends (unite) or all of them attend (intersect), as the fewest
// slices (from_row_runs): e.g. causal text with a bidirectional image block inside is
// unite({causal(T, T), Mask(T, T, {{image, image, kFull}})}); a window inside documents is
// intersect({varlen_causal(docs), sliding_window({T}, w, kCausal)}). The masks must have the same
// lengths (at least one mask). Costs the rows the slices cover times the slices a row meets,
// never the pairs.
FLEXCP_API Mask unite(const std::vector<Mask>& masks);
FLEXCP_API Mask intersect(const std::vector<Mask>& masks);

// The document of each of the max(seqlen_q, seqlen_k) tokens, numbered 0, 1, ... in order: a
// new document starts at token i when no attended pair (q, k) has one of q, k before i and the
// other at or after it. Read from the pairs, not from how the slices are drawn.
FLEXCP_API std::vector<std::int64_t> document_ids(const Mask& mask);

// Reads one positive document length per line (blank lines and '#' comments ignored).
FLEXCP_API Lengths read_lengths_file(const std::string& path);
// Packs documents from `lengths`, cycling through the list, until `total` tokens; each is capped
// at `max_len` tokens and the last is cut to fit.
FLEXCP_API Lengths pack_lengths(const Lengths& lengths, std::int64_t total, std::int64_t max_len);

}  // namespace flexcp::masks
