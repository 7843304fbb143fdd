// The backward kernel's softmax part, on the transposed block (keys as the accumulator's rows, q
// rows as its columns): P^T from S^T with the in-tile mask (the one shared rule, on the
// transposed bands) and the rows' lse2, then dS^T from P^T and dP^T. Each thread holds two keys
// (rows row and row + 8 of its warp's 16) and, per 8 columns, two q rows (col_base, col_base + 1).
#pragma once

#include <type_traits>

#include "kernels/sm90/bwd_common.cuh"
#include "kernels/sm90/bwd_params.h"
#include "kernels/sm90/kernel_common.cuh"
#include "kernels/worklist/tile_mask.h"
#include "kernels/worklist/worklist.h"

namespace flexcp::sm90::detail {

// A thread's statistics (lse2 or delta) of a block: value 2 j + c is that of its q column
// 8 j + c (c = 0, 1), either held in registers, loaded while the products run (RegStats), or
// read from the staged copy where it is used (SmemStats): a 128-row block's two sets would take 64
// registers beside S^T and dP^T, and spill them.
template <int kBlockM>
struct RegStats {
  float v[kBlockM / 4];
  __device__ __forceinline__ float operator[](int i) const { return v[i]; }
};
struct SmemStats {
  const float* at;  // this thread's first column in the staged copy
  __device__ __forceinline__ float operator[](int i) const { return at[8 * (i / 2) + i % 2]; }
};

// RegStats from `at`, this thread's first column in the staged copy. Where the block's first row
// is even the pairs are 8-byte aligned there (the copy starts at the 16-byte boundary at or below
// that row): 8-byte loads, half the instructions and shared-memory wavefronts (the branch is
// uniform over the block).
template <int kBlockM>
__device__ __forceinline__ void load_stats(const float* at, bool pairs_aligned,
                                           RegStats<kBlockM>& stats) {
  float* v = stats.v;
  if (pairs_aligned) {
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kBlockM / 8; ++j) {
      const float2 x = *reinterpret_cast<const float2*>(at + 8 * j);
      v[2 * j] = x.x;
      v[2 * j + 1] = x.y;
    }
  } else {
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kBlockM / 8; ++j) CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < 2; ++c) v[2 * j + c] = at[8 * j + c];
  }
}

// S^T (q.k products) to P^T in place: the logit in log2 units less the row's lse2 (one FFMA
// without softcap), the mask of edge blocks (entry masks, the entry's last block, keys past the
// end), then 2^x. `key0` is the tile's first key, `key` this thread's first key, lse2 this
// thread's columns' statistics. The mask comes after the subtraction: -inf times a scale of zero
// or below would not stay -inf.
template <int kBlockM, int kBlockN, class Frag, class Stats>
__device__ __forceinline__ void probabilities_t(const BwdParams& p, Frag& s, const WorkEntry& entry,
                                                int c0, int key0, int key, int col_base,
                                                const Stats& lse2) {
  if (p.softcap > 0.f) {
    logits_log2(p, s);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kBlockM / 8; ++j) CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < 2; ++c) CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) s(c + 2 * h + 4 * j) -= lse2[2 * j + c];
  } else {
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kBlockM / 8; ++j) CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < 2; ++c) CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      float& x = s(c + 2 * h + 4 * j);
      x = fmaf(x, p.scale_log2, -lse2[2 * j + c]);
    }
  }
  const int end = int(entry.end);
  if (entry.mask != EntryMask::kNone || c0 + kBlockM > end || key0 + kBlockN > p.seqlen_k) {
    const Band band = p.work.bands[entry.band];
    int lo32[2], hi32[2];  // relative to this thread's first column, col_base
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      BlockColumns cols = attended_columns(band, entry.mask, key + 8 * h, c0, end, kBlockM);
      if (key + 8 * h >= p.seqlen_k) cols = {0, 0};
      lo32[h] = int(cols.lo) - col_base;
      hi32[h] = int(cols.hi) - col_base;
    }
    mask_outside<kBlockM>(s, lo32, hi32, col_base);
  }
  CUTLASS_PRAGMA_UNROLL
  for (int x = 0; x < cute::size(s); ++x) s(x) = exp2_approx(s(x));
}

// dP^T to dS^T in place, from P^T and the q rows' delta (and lse2, for softcap's factor).
template <int kBlockM, class Frag, class Stats>
__device__ __forceinline__ void logit_gradients_t(const BwdParams& p, const Frag& pt, Frag& dpt,
                                                  const Stats& lse2, const Stats& delta) {
  auto grad = [&](auto softcapped) {
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kBlockM / 8; ++j) CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < 2; ++c) {
      const float d = delta[2 * j + c], l = lse2[2 * j + c];
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int x = c + 2 * h + 4 * j;
        dpt(x) = grad_logit<decltype(softcapped)::value>(pt(x), dpt(x), d, l, p.softcap_t);
      }
    }
  };
  if (p.softcap > 0.f)
    grad(std::true_type{});
  else
    grad(std::false_type{});
}

}  // namespace flexcp::sm90::detail
