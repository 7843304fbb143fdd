// Device pieces both sm90 kernels use: issuing a warp-group product, and the approximate
// transcendentals (one instruction each) with what they are accurate to.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <type_traits>

#include "kernels/sm90/grid_dependency.cuh"

namespace flexcp::sm90::detail {

// Slice kb of a product's operand. A shared-memory operand (a tensor of descriptors) gets its
// descriptor by a 64-bit add to the first slice's: CuTe's iterator adds to the low word and copies
// the high one, which ptxas turns into two additions and two moves per wgmma (both words of each
// operand rebuilt in adjacent uniform registers); a 64-bit add is one `UIADD3.64` per operand, as
// FlashAttention-4's issue loops have. The value is the same: the start address, in the low word,
// never carries into the high one.
template <class T>
__device__ __forceinline__ auto k_slice(T const& t, int kb) {
  using namespace cute;
  if constexpr (std::is_same_v<std::decay_t<decltype(t.data())>, GMMA::DescriptorIterator>) {
    GmmaDescriptor d;
    d.desc_ = t.data().desc_.desc_ + std::uint64_t(t.layout()(0, 0, kb));
    return make_tensor(GMMA::DescriptorIterator{d}, t(_, _, kb).layout());
  } else {
    return t(_, _, kb);
  }
}

// Issues one warp-group matrix product (no commit, no wait). zero_init overwrites the accumulator.
template <bool kZeroInit, class Mma, class TA, class TB, class TC>
__device__ __forceinline__ void issue_gemm(Mma& mma, TA const& a, TB const& b, TC& c) {
  using namespace cute;
  mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTLASS_PRAGMA_UNROLL
  for (int kb = 0; kb < size<2>(a); ++kb) {
    gemm(mma, k_slice(a, kb), k_slice(b, kb), c);
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

// The kernel's shared storage at the first 1024-byte boundary of the dynamic shared memory (whose
// base is only 16-byte aligned; 128-byte swizzled tiles need 1024). Aligned by pointer
// arithmetic on the shared array, not through an integer, so that the compiler keeps the shared
// address space and plain loads of the storage are shared-memory loads (not generic ones).
template <class Storage>
__device__ __forceinline__ Storage& shared_storage(char* smem_raw) {
  return *reinterpret_cast<Storage*>(
      smem_raw + ((1024 - (reinterpret_cast<std::uintptr_t>(smem_raw) & 1023)) & 1023));
}

// The parameters of a TMA pipeline whose producer is thread 0 (it arms each stage's barrier with
// `bytes`) and whose stages `consumers` threads release.
template <class Pipeline>
__device__ __forceinline__ typename Pipeline::Params tma_pipeline_params(bool producer,
                                                                         std::uint32_t bytes,
                                                                         int consumers) {
  typename Pipeline::Params params;
  params.transaction_bytes = bytes;
  params.role = producer ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  params.is_leader = threadIdx.x == 0;
  params.num_consumers = consumers;
  return params;
}

// One TMA load of a [rows, kPanels x 64] tile of a {D, T, H} map (128-byte swizzle panels of 64
// columns, each one box of {64, rows, 1}) at token row0 of head `head`, onto `bar`.
template <int kPanels, int kRows, class Element>
__device__ __forceinline__ void load_tile(const CUtensorMap* map, std::uint64_t* bar, Element* dst,
                                          int row0, int head) {
  constexpr auto kHint = static_cast<std::uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);
  CUTLASS_PRAGMA_UNROLL
  for (int c = 0; c < kPanels; ++c)
    cute::SM90_TMA_LOAD_3D::copy(map, bar, kHint, dst + c * kRows * 64, c * 64, row0, head);
}

// stmatrix of four 8x8 matrices of 16-bit pairs to a shared-space address (lane l gives row l % 8
// of matrix l / 8), for callers that compute the addresses themselves: CuTe's atom takes a
// reference and converts each one from a generic pointer.
__device__ __forceinline__ void stmatrix_x4(std::uint32_t smem_addr, std::uint32_t m0,
                                            std::uint32_t m1, std::uint32_t m2, std::uint32_t m3) {
  asm volatile(
      "stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr),
      "r"(m0), "r"(m1), "r"(m2), "r"(m3));
}

// This thread's place in the accumulator of a 64xN wgmma (one warp group's): rows `row` and
// row + 8 of the group's 64, columns col_base + 8 j + {0, 1}; element c + 2 h + 4 j of the
// fragment is row + 8 h, column col_base + 8 j + c.
struct FragmentCoords {
  int row, col_base;
};
__device__ __forceinline__ FragmentCoords fragment_coords() {
  const int lane = threadIdx.x % 32;
  return {int(threadIdx.x / 32 % 4) * 16 + lane / 4, 2 * (lane % 4)};
}

// The in-tile mask applied to a block: sets to -inf the elements of the fragment's rows h = 0, 1
// (kCols columns) outside columns [lo[h], hi[h]), given relative to the thread's col_base. Most
// edge blocks are cut on one side only (a causal diagonal, a window's far edge, an entry's last
// block): each side is tested only where a row of the warp is cut there.
template <int kCols, class Frag>
__device__ __forceinline__ void mask_outside(Frag& s, const int (&lo)[2], const int (&hi)[2],
                                             int col_base) {
  if (__any_sync(0xffffffffu, lo[0] > -col_base || lo[1] > -col_base)) {
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kCols / 8; ++j) CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < 2; ++c)
      if (8 * j + c < lo[h]) s(c + 2 * h + 4 * j) = -INFINITY;
  }
  if (__any_sync(0xffffffffu, hi[0] < kCols - col_base || hi[1] < kCols - col_base)) {
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kCols / 8; ++j) CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < 2; ++c)
      if (8 * j + c >= hi[h]) s(c + 2 * h + 4 * j) = -INFINITY;
  }
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
