// The sm90 backward's scratch in a plan's workspace, after the work lists: the per-row statistics
// the preprocessing kernel writes, the fp32 dQ accumulator, the sink gradient's partial sums, and
// the dK/dV partials of split items (kernels/worklist/bwd_units.h).
// Plain C++ (the plan lays it out in builds without CUDA too).
#pragma once

#include <algorithm>
#include <cstdint>

#include "flexcp/attention_plan.h"
#include "kernels/plan/workspace.h"
#include "kernels/tiles.h"

namespace flexcp::sm90 {

// Row statistics a q block reads: its rows (tiles::sm90_bwd_block_m) from the 16-byte boundary at
// or below its first row (bulk copies need 16-byte aligned sources), so up to 3 more. The dQ pass
// reads kSm90BwdDqBlockM rows from a tile's first row. Each head's run is padded by kBwdStatsPad
// rows so that every such read stays inside it.
constexpr int bwd_stats_span(int block_m) {
  return block_m + 4;
}
inline constexpr int kBwdStatsPad =
    std::max(bwd_stats_span(tiles::kSm90BwdBlockMHd64), tiles::kSm90BwdDqBlockM);
static_assert(tiles::kSm90BwdBlockMHd64 >= tiles::kSm90BwdBlockM);

struct BwdScratch {
  // lse2 = lse * log2(e) (+inf for a row that attends nothing, so that 2^(s - lse2) is 0 even for
  // s = -inf) and delta = <dout, out>, both [Hq, stats_stride] fp32: per head one run of tokens,
  // which the kernel reads a block's span at a time from a 16-byte boundary; the rows past seqlen_q
  // (lse2 +inf, delta 0) keep every such read inside its head's row.
  float* lse2 = nullptr;
  float* delta = nullptr;
  std::int64_t stats_stride = 0;  // seqlen_q rounded up to 4, plus kBwdStatsPad
  // [Tq, Hq, D] fp32, zeroed by the preprocessing kernel, summed into by the main kernel.
  float* dq_accum = nullptr;
  // -sum over a block of kSm90BwdBlockM rows of exp(sink - lse) delta: [Hq, stats_blocks], summed
  // in a fixed order by the postprocessing (so that dsink is deterministic).
  float* dsink_partial = nullptr;
  std::int64_t stats_blocks = 0;
  // [slots][2 x kSm90BwdBlockN x D] fp32: per unit of a split item, its dK and dV (see the kernel
  // for the order within a slot); null when no item is split.
  float* partials = nullptr;
};

// fp32 values in one partial slot: dK and dV of one key tile.
inline std::int64_t bwd_partial_slot_floats(std::int64_t head_dim) {
  return 2 * tiles::kSm90BwdBlockN * head_dim;
}

// `with_rows` false (a keys-only plan): only the partials; the rows' scratch is another plan's.
inline BwdScratch lay_out_bwd_scratch(const AttentionShape& s, std::int64_t partial_slots,
                                      bool with_rows, WorkspaceWriter& writer) {
  BwdScratch b;
  if (with_rows) {
    b.stats_stride = (s.seqlen_q + 3) / 4 * 4 + kBwdStatsPad;
    b.stats_blocks = (s.seqlen_q + tiles::kSm90BwdBlockM - 1) / tiles::kSm90BwdBlockM;
    const auto stats = static_cast<std::size_t>(s.heads_q * b.stats_stride);
    b.lse2 = writer.scratch<float>("backward lse2", stats);
    b.delta = writer.scratch<float>("backward delta", stats);
    b.dq_accum = writer.scratch<float>(
        "backward dQ accumulator", static_cast<std::size_t>(s.seqlen_q * s.heads_q * s.head_dim));
    b.dsink_partial = writer.scratch<float>("backward dsink partials",
                                            static_cast<std::size_t>(s.heads_q * b.stats_blocks));
  }
  if (partial_slots > 0)
    b.partials = writer.scratch<float>(
        "backward dK/dV partials",
        static_cast<std::size_t>(partial_slots * bwd_partial_slot_floats(s.head_dim)));
  return b;
}

}  // namespace flexcp::sm90
