// Device pieces both sm90 kernels use: issuing a warp-group product, and the approximate
// transcendentals (one instruction each) with what they are accurate to.
#pragma once

#include <cute/tensor.hpp>

namespace flexcp::sm90::detail {

// Issues one warp-group matrix product (no commit, no wait). zero_init overwrites the accumulator.
template <bool kZeroInit, class Mma, class TA, class TB, class TC>
__device__ __forceinline__ void issue_gemm(Mma& mma, TA const& a, TB const& b, TC& c) {
  using namespace cute;
  mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTLASS_PRAGMA_UNROLL
  for (int kb = 0; kb < size<2>(a); ++kb) {
    gemm(mma, a(_, _, kb), b(_, _, kb), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// softcap * tanh(x) given e = 2^(2 x log2(e)) = e^(2x), as softcap * (1 - 2 / (e + 1)): absolute
// error near 1e-7 of softcap. (tanh.approx's relative error of 2^-11 would show in fp16 outputs.)
__device__ __forceinline__ float softcap_from_exp(float e, float softcap) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(e + 1.f));
  return fmaf(-2.f * softcap, r, softcap);
}

// Zero, as a value the compiler cannot see through (so that what is computed from it stays in
// the loop that computes it).
__device__ __forceinline__ int opaque_zero() {
  int z;
  asm volatile("mov.u32 %0, 0;" : "=r"(z));
  return z;
}

__device__ __forceinline__ float log2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace flexcp::sm90::detail
