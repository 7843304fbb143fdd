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

// S^T (q.k products) to P^T in place: softcap, the mask of edge blocks (entry masks, the entry's
// last block, keys past the end), then 2^(s - lse2) per q row. `key0` is the tile's first key,
// `key` this thread's first key, lse2 this thread's first column's statistic.
template <int kBlockM, int kBlockN, class Frag>
__device__ __forceinline__ void probabilities_t(const BwdParams& p, Frag& s, const WorkEntry& entry,
                                                int c0, int key0, int key, int col_base,
                                                const float* lse2) {
  // Softcap (t kept implicitly: recomputed from P for the gradient), mask, exponentiate.
  logits_log2(p, s);
  const int end = int(entry.end);
  if (entry.mask != EntryMask::kNone || c0 + kBlockM > end || key0 + kBlockN > p.seqlen_k) {
    const Band band = p.work.bands[entry.band];
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      BlockColumns cols = attended_columns(band, entry.mask, key + 8 * h, c0, end, kBlockM);
      if (key + 8 * h >= p.seqlen_k) cols = {0, 0};
      mask_outside<kBlockM>(s, h, int(cols.lo) - col_base, int(cols.hi) - col_base);
    }
  }
  CUTLASS_PRAGMA_UNROLL
  for (int j = 0; j < kBlockM / 8; ++j) CUTLASS_PRAGMA_UNROLL
  for (int c = 0; c < 2; ++c) {
    const float l = lse2[8 * j + c];
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) s(c + 2 * h + 4 * j) = exp2_approx(s(c + 2 * h + 4 * j) - l);
  }
}

// dP^T to dS^T in place, from P^T and the q rows' delta (and lse2, for softcap's factor).
template <int kBlockM, class Frag>
__device__ __forceinline__ void logit_gradients_t(const BwdParams& p, const Frag& pt, Frag& dpt,
                                                  const float* lse2, const float* delta) {
  auto grad = [&](auto softcapped) {
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kBlockM / 8; ++j) CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < 2; ++c) {
      const float d = delta[8 * j + c], l = lse2[8 * j + c];
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
