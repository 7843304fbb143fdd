#include "flexcp/masks.h"

#include <algorithm>
#include <sstream>

#include "core/text_file.h"
#include "flexcp/status.h"

namespace flexcp::masks {
namespace {

[[noreturn]] void fail(const std::string& message) {
  throw Error(Status::kInvalidArgument, message);
}

void check_lengths(const Lengths& lens, const char* fn, const char* what) {
  for (std::size_t i = 0; i < lens.size(); ++i)
    if (lens[i] < 0)
      fail(std::string("flexcp::masks::") + fn + ": " + what + "[" + std::to_string(i) + "] is " +
           std::to_string(lens[i]) + ", expected >= 0");
}

// Lengths laid end to end after `start` tokens: each >= 0 and their total within kMaxSeqlen (no
// mask holds more; past it the builders' offsets would overflow, and the error would name a
// wrapped length instead of the one that went too far).
void check_documents(const Lengths& lens, const char* fn, const char* what,
                     std::int64_t start = 0) {
  check_lengths(lens, fn, what);
  std::int64_t total = start;
  for (std::size_t i = 0; i < lens.size(); ++i) {
    if (lens[i] > kMaxSeqlen - total)
      fail(std::string("flexcp::masks::") + fn + ": " + what + "[" + std::to_string(i) + "] is " +
           std::to_string(lens[i]) + " after " + std::to_string(total) +
           " tokens, past the most a mask holds (" + std::to_string(kMaxSeqlen) + ", kMaxSeqlen)");
    total += lens[i];
  }
}

void add(std::vector<Slice>& out, std::int64_t qb, std::int64_t qe, std::int64_t kb,
         std::int64_t ke, MaskType type) {
  if (qb < qe && kb < ke) out.push_back({{qb, qe}, {kb, ke}, type});
}

}  // namespace

Mask full(std::int64_t seqlen_q, std::int64_t seqlen_k) {
  validate_seqlens(seqlen_q, seqlen_k, "flexcp::masks::full");
  std::vector<Slice> s;
  add(s, 0, seqlen_q, 0, seqlen_k, MaskType::kFull);
  return Mask(seqlen_q, seqlen_k, std::move(s));
}

Mask causal(std::int64_t seqlen_q, std::int64_t seqlen_k) {
  validate_seqlens(seqlen_q, seqlen_k, "flexcp::masks::causal");
  std::vector<Slice> s;
  add(s, 0, seqlen_q, 0, seqlen_k, MaskType::kCausal);
  return Mask(seqlen_q, seqlen_k, std::move(s));
}

Mask batch(std::int64_t num_seqs, std::int64_t seqlen, MaskType type) {
  if (num_seqs < 0)
    fail("flexcp::masks::batch: num_seqs is " + std::to_string(num_seqs) + ", expected >= 0");
  if (seqlen < 0)
    fail("flexcp::masks::batch: seqlen is " + std::to_string(seqlen) + ", expected >= 0");
  // Before the lengths are allocated: num_seqs comes from a user, and the total is bounded anyway.
  if (num_seqs > kMaxSeqlen || (seqlen > 0 && num_seqs > kMaxSeqlen / seqlen))
    fail("flexcp::masks::batch: " + std::to_string(num_seqs) + " sequences of " +
         std::to_string(seqlen) + " tokens, past the most a mask holds (" +
         std::to_string(kMaxSeqlen) + " tokens and sequences, kMaxSeqlen)");
  return varlen(Lengths(static_cast<std::size_t>(num_seqs), seqlen), type);
}

Mask varlen(const Lengths& doc_lens, MaskType type) {
  check_documents(doc_lens, "varlen", "doc_lens");
  std::vector<Slice> s;
  std::int64_t offset = 0;
  for (std::int64_t n : doc_lens) {
    add(s, offset, offset + n, offset, offset + n, type);
    offset += n;
  }
  return Mask(offset, offset, std::move(s));
}

Mask varlen_full(const Lengths& doc_lens) {
  return varlen(doc_lens, MaskType::kFull);
}
Mask varlen_causal(const Lengths& doc_lens) {
  return varlen(doc_lens, MaskType::kCausal);
}

Mask from_cu_seqlens(const Lengths& cu_q, const Lengths& cu_k, MaskType type) {
  const char* fn = "flexcp::masks::from_cu_seqlens: ";
  if (cu_q.size() != cu_k.size())
    fail(std::string(fn) + "cu_seqlens_q has " + std::to_string(cu_q.size()) +
         " entries and cu_seqlens_k " + std::to_string(cu_k.size()) + ", expected the same count");
  for (const Lengths* cu : {&cu_q, &cu_k}) {
    const char* name = cu == &cu_q ? "cu_seqlens_q" : "cu_seqlens_k";
    if (cu->empty() || cu->front() != 0) fail(std::string(fn) + name + " must start with 0");
    for (std::size_t i = 1; i < cu->size(); ++i)
      if ((*cu)[i] < (*cu)[i - 1])
        fail(std::string(fn) + name + "[" + std::to_string(i) + "] is " + std::to_string((*cu)[i]) +
             ", below the previous entry " + std::to_string((*cu)[i - 1]));
  }
  std::vector<Slice> s;
  for (std::size_t d = 0; d + 1 < cu_q.size(); ++d)
    add(s, cu_q[d], cu_q[d + 1], cu_k[d], cu_k[d + 1], type);
  return Mask(cu_q.back(), cu_k.back(), std::move(s));
}

Mask sliding_window(const Lengths& doc_lens, std::int64_t window, WindowKind kind) {
  check_documents(doc_lens, "sliding_window", "doc_lens");
  if (window < 1)
    fail("flexcp::masks::sliding_window: window is " + std::to_string(window) + ", expected >= 1");
  std::vector<Slice> s;
  std::int64_t o = 0;
  for (std::int64_t n : doc_lens) {
    const std::int64_t w = window;
    // Lower part (keys at or before the query): a causal head, then a band of width w.
    if (n <= w) {
      add(s, o, o + n, o, o + n, MaskType::kCausal);
    } else {
      add(s, o, o + w, o, o + w, MaskType::kCausal);
      add(s, o + w, o + n, o + 1, o + n, MaskType::kBiCausal);  // k in [q - w + 1, q]
    }
    // Upper part for the symmetric window: keys (q, q + w - 1], cut at the document's end.
    if (kind == WindowKind::kSymmetric && w >= 2) {
      if (n >= w) {
        add(s, o, o + n - w + 1, o + 1, o + n, MaskType::kBiCausal);  // k in [q+1, q+w-1]
        add(s, o + n - w + 1, o + n - 1, o + n - w + 2, o + n, MaskType::kInvCausal);  // k > q
      } else {
        add(s, o, o + n - 1, o + 1, o + n, MaskType::kInvCausal);
      }
    }
    o += n;
  }
  return Mask(o, o, std::move(s));
}

Mask block_causal(const Lengths& doc_lens, std::int64_t block) {
  check_documents(doc_lens, "block_causal", "doc_lens");
  if (block < 1)
    fail("flexcp::masks::block_causal: block is " + std::to_string(block) + ", expected >= 1");
  std::vector<Slice> s;
  std::int64_t o = 0;
  for (std::int64_t n : doc_lens) {
    for (std::int64_t b = 0; b < n; b += block) {
      const std::int64_t e = std::min(b + block, n);
      add(s, o + b, o + e, o, o + e, MaskType::kFull);
    }
    o += n;
  }
  return Mask(o, o, std::move(s));
}

Mask prefix_lm(const Lengths& doc_lens, const Lengths& prefix_lens) {
  check_documents(doc_lens, "prefix_lm", "doc_lens");
  check_lengths(prefix_lens, "prefix_lm", "prefix_lens");
  if (doc_lens.size() != prefix_lens.size())
    fail("flexcp::masks::prefix_lm: " + std::to_string(doc_lens.size()) + " documents but " +
         std::to_string(prefix_lens.size()) + " prefix lengths, expected one per document");
  std::vector<Slice> s;
  std::int64_t o = 0;
  for (std::size_t d = 0; d < doc_lens.size(); ++d) {
    const std::int64_t n = doc_lens[d], p = prefix_lens[d];
    if (p > n)
      fail("flexcp::masks::prefix_lm: prefix_lens[" + std::to_string(d) + "] is " +
           std::to_string(p) + ", longer than its document (" + std::to_string(n) + ")");
    add(s, o, o + p, o, o + p, MaskType::kFull);
    add(s, o + p, o + n, o, o + p, MaskType::kFull);
    add(s, o + p, o + n, o + p, o + n, MaskType::kCausal);
    o += n;
  }
  return Mask(o, o, std::move(s));
}

Mask shared_question(std::int64_t question_len, const Lengths& answer_lens) {
  if (question_len < 0 || question_len > kMaxSeqlen)
    fail("flexcp::masks::shared_question: question_len is " + std::to_string(question_len) +
         ", expected 0 to " + std::to_string(kMaxSeqlen) + " (kMaxSeqlen)");
  check_documents(answer_lens, "shared_question", "answer_lens", question_len);
  std::vector<Slice> s;
  add(s, 0, question_len, 0, question_len, MaskType::kCausal);
  std::int64_t o = question_len;
  for (std::int64_t n : answer_lens) {
    add(s, o, o + n, 0, question_len, MaskType::kFull);
    add(s, o, o + n, o, o + n, MaskType::kCausal);
    o += n;
  }
  return Mask(o, o, std::move(s));
}

Mask pack(const std::vector<Mask>& masks) {
  std::vector<Slice> s;
  std::int64_t q0 = 0, k0 = 0;
  for (std::size_t i = 0; i < masks.size(); ++i) {
    const Mask& m = masks[i];
    if (m.seqlen_q() > kMaxSeqlen - q0 || m.seqlen_k() > kMaxSeqlen - k0)
      fail("flexcp::masks::pack: masks[" + std::to_string(i) + "] (" +
           std::to_string(m.seqlen_q()) + " x " + std::to_string(m.seqlen_k()) + ") after " +
           std::to_string(q0) + " x " + std::to_string(k0) +
           " tokens, past the most a mask holds (" + std::to_string(kMaxSeqlen) +
           " a side, kMaxSeqlen)");
    for (const Slice& x : m.slices())
      s.push_back({{x.q.begin + q0, x.q.end + q0}, {x.k.begin + k0, x.k.end + k0}, x.type});
    q0 += m.seqlen_q();
    k0 += m.seqlen_k();
  }
  return Mask(q0, k0, std::move(s));
}

Lengths read_lengths_file(const std::string& path) {
  std::istringstream in(read_text_file(path, "document lengths file"));
  Lengths lens;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    // One decimal integer per line, nothing else: "1.5", "100 200" and "100x" are errors, not 1
    // and 100.
    std::istringstream is(line);
    std::int64_t n = 0;
    std::string rest;
    if (!(is >> n) || (is >> rest))
      fail(path + ":" + std::to_string(line_no) + ": '" + line +
           "' is not one integer, expected one length per line");
    if (n <= 0)
      fail(path + ":" + std::to_string(line_no) + ": length " + std::to_string(n) +
           ", expected > 0");
    lens.push_back(n);
  }
  if (lens.empty()) fail("document lengths file '" + path + "' holds no lengths");
  return lens;
}

Lengths pack_lengths(const Lengths& lengths, std::int64_t total, std::int64_t max_len) {
  if (lengths.empty()) fail("flexcp::masks::pack_lengths: lengths is empty");
  check_lengths(lengths, "pack_lengths", "lengths");
  if (max_len < 1)
    fail("flexcp::masks::pack_lengths: max_len is " + std::to_string(max_len) + ", expected >= 1");
  // The pool may sum past kMaxSeqlen (a corpus's lengths); what is packed may not.
  if (total < 0 || total > kMaxSeqlen)
    fail("flexcp::masks::pack_lengths: total is " + std::to_string(total) + ", expected 0 to " +
         std::to_string(kMaxSeqlen) + " (kMaxSeqlen)");
  if (std::none_of(lengths.begin(), lengths.end(), [](std::int64_t n) { return n > 0; }))
    fail("flexcp::masks::pack_lengths: every length is 0");
  Lengths out;
  std::int64_t filled = 0;
  for (std::size_t i = 0; filled < total; i = (i + 1) % lengths.size()) {
    std::int64_t n = std::min({lengths[i], max_len, total - filled});
    if (n == 0) continue;
    out.push_back(n);
    filled += n;
  }
  return out;
}

}  // namespace flexcp::masks
