// Device pieces both backward kernels share (bwd_kernel.cuh, bwd_dq_kernel.cuh): the logits in
// log2 units, and the gradient of one logit from P and dP.
#pragma once

#include "kernels/lse_merge.h"
#include "kernels/sm90/kernel_common.cuh"

namespace flexcp::sm90::detail {

// q.k products (an accumulator fragment) to log2 units of the logit: s log2(e), with softcap
// s = softcap tanh(q.k scale / softcap), its tanh from 2^(q.k softcap_scale).
template <class Params, class Frag>
__device__ __forceinline__ void logits_log2(const Params& p, Frag& s) {
  if (p.softcap > 0.f) {
    CUTLASS_PRAGMA_UNROLL
    for (int x = 0; x < cute::size(s); ++x)
      s(x) = softcap_from_exp(exp2_approx(s(x) * p.softcap_scale), p.softcap) * kLog2e;
  } else {
    CUTLASS_PRAGMA_UNROLL
    for (int x = 0; x < cute::size(s); ++x) s(x) *= p.scale_log2;
  }
}

// dS of one pair from P, dP and the row's delta (and lse2, for the softcap's factor): P (dP -
// delta), times (1 - t^2) under softcap, where s log2(e) = log2(P) + lse2 and t = s / softcap; a
// masked pair (P = 0) has no gradient.
template <bool kSoftcap>
__device__ __forceinline__ float grad_logit(float pv, float dp, float delta, float lse2,
                                            float softcap_t) {
  float ds = pv * (dp - delta);
  if constexpr (kSoftcap) {
    const float t = (log2_approx(pv) + lse2) * softcap_t;
    ds = pv > 0.f ? ds * (1.f - t * t) : 0.f;
  }
  return ds;
}

}  // namespace flexcp::sm90::detail
