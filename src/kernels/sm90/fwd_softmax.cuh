// The forward's online softmax of one block, in registers: softcap (or the negation of a
// reversed product), the in-tile mask on edge blocks (the one shared rule), and the running row
// maximum and sum. Each consumer thread holds two rows of its group's 64 (the accumulator layout
// of a 64xN wgmma) and, per 8 columns, two of the block's columns (col_base, col_base + 1).
#pragma once

#include "kernels/sm90/fwd_params.h"
#include "kernels/sm90/kernel_common.cuh"
#include "kernels/worklist/tile_mask.h"
#include "kernels/worklist/worklist.h"

namespace flexcp::sm90::detail {

struct Item {
  int tile, kv_head, head0;  // head0: first q head packed into the tile
  int e_begin, e_end;        // the tile's entries (the host keeps their count below 2^31)
};

// What a consumer thread keeps of the item whose rows it holds: the item, its two rows (token, q
// head), and their running maximum (log2 units, scaled) and sum (this thread's share).
struct Rows {
  Item it;
  int token[2], head[2];
  float max[2], sum[2];
};

// The block an S was computed for: its first column, its entry's end, band and mask.
struct FwdBlock {
  int c0, end, band;
  EntryMask mask;
};

// The online softmax in two steps, so that the kernel can wait for its own P V between them:
// softmax_max softcaps and masks S in place and moves the rows' running maxima on (`correction`
// returns the factor that rescales what O accumulated before, `m_use` what row h's exponents
// subtract); softmax_exp turns row h of S into P in fp32 and moves its running sum on.
// `mark(step)` ends its steps for the phase clocks (a no-op unless they are built in): step 0 an
// edge block's bounds (after softcap), step 1 its mask (another block's softcap).
struct NoMarks {
  __device__ __forceinline__ void operator()(int) const {}
};
template <int kBlockN, class Frag, class Mark = NoMarks>
__device__ __forceinline__ void softmax_max(const FwdParams& p, Frag& s, const FwdBlock& blk,
                                            Rows& rows, int col_base, float (&correction)[2],
                                            float (&m_use)[2], Mark&& mark = {}) {
  if (p.softcap > 0.f) {
    CUTLASS_PRAGMA_UNROLL
    for (int x = 0; x < cute::size(s); ++x)
      s(x) = softcap_from_exp(exp2_approx(s(x) * p.softcap_scale), p.softcap);
  } else if (p.negate) {
    CUTLASS_PRAGMA_UNROLL
    for (int x = 0; x < cute::size(s); ++x) s(x) = -s(x);
  }
  // Columns [lo, hi) of the block are attended by each row; masking only on edge blocks.
  if (blk.mask != EntryMask::kNone || blk.c0 + kBlockN > blk.end) {
    const Band band = p.work.bands[blk.band];
    int lo32[2], hi32[2];  // relative to this thread's first column, col_base
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      const BlockColumns cols =
          attended_columns(band, blk.mask, rows.token[h], blk.c0, blk.end, kBlockN);
      lo32[h] = int(cols.lo) - col_base;
      hi32[h] = int(cols.hi) - col_base;
    }
    mark(0);
    mask_outside<kBlockN>(s, lo32, hi32, col_base);
  }
  mark(1);
  // Row maxima as four independent chains per row: with two consumer warps per scheduler,
  // dependent chains (not throughput) bound this loop. Each chain starts from its first pair, not
  // from -inf: fmaxf(-inf, x) is not folded (it differs from x for a NaN x), and the eight it
  // would cost a block sit on the softmax's path. The maximum is the same: fmaxf drops NaNs
  // either way.
  constexpr int kChains = 4;
  static_assert(kBlockN / 8 >= kChains);
  float mx[2];
  CUTLASS_PRAGMA_UNROLL
  for (int h = 0; h < 2; ++h) {
    float part[kChains];
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kBlockN / 8; ++j) {
      const float pair = fmaxf(s(2 * h + 4 * j), s(1 + 2 * h + 4 * j));
      part[j % kChains] = j < kChains ? pair : fmaxf(part[j % kChains], pair);
    }
    mx[h] = fmaxf(fmaxf(part[0], part[1]), fmaxf(part[2], part[3]));
  }
  CUTLASS_PRAGMA_UNROLL
  for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
  CUTLASS_PRAGMA_UNROLL
  for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
  CUTLASS_PRAGMA_UNROLL
  for (int h = 0; h < 2; ++h) {
    const float m_new = fmaxf(rows.max[h], mx[h] * p.scale_log2);
    m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing attended yet
    correction[h] = exp2_approx(rows.max[h] - m_use[h]);
    rows.max[h] = m_new;
  }
}

template <int kBlockN, class Frag>
__device__ __forceinline__ void softmax_exp(const FwdParams& p, Frag& s, Rows& rows, int h,
                                            const float (&correction)[2], const float (&m_use)[2]) {
  // Four independent chains, as the maxima's, each started from its first term rather than from
  // zero (0 + x is not folded: it differs from x for x = -0). The sums are the same bit for bit.
  constexpr int kChains = 4;
  static_assert(kBlockN / 8 >= kChains);
  float part[kChains];
  CUTLASS_PRAGMA_UNROLL
  for (int j = 0; j < kBlockN / 8; ++j) CUTLASS_PRAGMA_UNROLL
  for (int c = 0; c < 2; ++c) {
    float& x = s(c + 2 * h + 4 * j);
    x = exp2_approx(fmaf(x, p.scale_log2, -m_use[h]));
    part[j % kChains] = j < kChains && c == 0 ? x : part[j % kChains] + x;
  }
  rows.sum[h] = rows.sum[h] * correction[h] + ((part[0] + part[1]) + (part[2] + part[3]));
}

// Both steps: S to P in fp32, in place, with the rows' running maximum and sum updated.
template <int kBlockN, class Frag>
__device__ __forceinline__ void online_softmax(const FwdParams& p, Frag& s, const FwdBlock& blk,
                                               Rows& rows, int col_base, float (&correction)[2]) {
  float m_use[2];
  softmax_max<kBlockN>(p, s, blk, rows, col_base, correction, m_use);
  CUTLASS_PRAGMA_UNROLL
  for (int h = 0; h < 2; ++h) softmax_exp<kBlockN>(p, s, rows, h, correction, m_use);
}

}  // namespace flexcp::sm90::detail
