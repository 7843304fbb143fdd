// The forward kernel's epilogue, run by each consumer warp group at the end of an item: the
// rows' lse (with the sink folded in) straight from registers, and out normalised, staged in shared
// memory with stmatrix and stored by the group's own TMA store, which runs on while the next item
// starts (or, for an fp32 out, stored from registers). Each group stores its own 64 rows, so that
// neither waits for the other: one group's epilogue runs while the other's last product is still on
// the tensor cores.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>

#include "kernels/lse_merge.h"
#include "kernels/sm90/fwd_config.cuh"
#include "kernels/sm90/fwd_params.h"
#include "kernels/sm90/fwd_softmax.cuh"
#include "kernels/sm90/kernel_common.cuh"

namespace flexcp::sm90::detail {

// Stores {a, b} at `ptr` where `keep` holds, without a branch: a predicated store, so that the
// accumulator registers it reads are not read on a divergent path (ptxas would then serialise
// every wgmma of the kernel, C7520).
__device__ __forceinline__ void store_f32x2_if(float* ptr, float a, float b, bool keep) {
  const int pred = keep;
  asm volatile(
      "{\n"
      " .reg .pred p;\n"
      " setp.ne.b32 p, %3, 0;\n"
      " @p st.global.v2.f32 [%0], {%1, %2};\n"
      "}\n" ::"l"(ptr),
      "f"(a), "f"(b), "r"(pred)
      : "memory");
}

// out in fp32 (a partial output): this thread's two rows of the group's normalised O (`o`, in the
// accumulator's layout) as float pairs at columns col_base + 8 j; rows past seqlen_q are not
// written.
template <class Frag>
__device__ __forceinline__ void store_out_f32(const FwdParams& p, const Rows& r, const Frag& o) {
  const int col_base = fragment_coords().col_base;
  CUTLASS_PRAGMA_UNROLL
  for (int h = 0; h < 2; ++h) {
    const bool inside = r.token[h] < p.seqlen_q;
    float* row = p.out_f32 + std::int64_t(r.token[h]) * p.out_stride_t +
                 std::int64_t(r.head[h]) * p.out_stride_h + col_base;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < cute::size(o) / 4; ++j)
      store_f32x2_if(row + 8 * j, o(2 * h + 4 * j), o(1 + 2 * h + 4 * j), inside);
  }
}

// `o` is the O accumulator of the group's rows `r`, `store_o` / `thr_store_o` / `tOsO` its copy to
// the staging tile `o_stage`, `half` the group (0 or 1), `ctid` the thread over both groups.
template <class Cfg, class Acc, class StoreO, class ThrStoreO, class StageO>
__device__ __forceinline__ void write_out_lse(const FwdParams& p, const Rows& r, const Acc& tOrO,
                                              const StoreO& store_o, const ThrStoreO& thr_store_o,
                                              StageO& tOsO, typename Cfg::Element* o_stage,
                                              int half, int ctid) {
  using namespace cute;
  using Element = typename Cfg::Element;
  const int lane = threadIdx.x % 32;
  float mul[2];
  CUTLASS_PRAGMA_UNROLL
  for (int h = 0; h < 2; ++h) {
    float l = r.sum[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    mul[h] = 0.f;
    float lse = -INFINITY;
    // A row with no attended key (l = 0) keeps out = 0, lse = -inf and no sink. A NaN sum
    // (a non-finite logit: every one of them NaN leaves the row maximum at -inf, as if the
    // row were empty) goes through and makes out and lse NaN.
    if (l != 0.f) {
      lse = (r.max[h] + __log2f(l)) * kLn2;
      mul[h] = 1.f / l;
      if (p.sink != nullptr) {
        const LseMerge with_sink = merge_lse(lse, p.sink[r.head[h]]);
        mul[h] *= with_sink.weight_a;
        lse = with_sink.lse;
      }
    }
    if (r.token[h] < p.seqlen_q && lane % 4 == 0)
      p.lse[std::int64_t(r.token[h]) * p.lse_stride_t + std::int64_t(r.head[h]) * p.lse_stride_h] =
          lse;
  }
  // O normalised, on the path every thread takes: read on a branch (even a uniform one), the
  // accumulator makes ptxas insert a warp-group arrive there and serialise every wgmma of the
  // kernel (C7520). The fence keeps the products here.
  Tensor o = make_tensor_like<float>(tOrO);
  CUTLASS_PRAGMA_UNROLL
  for (int x = 0; x < size(tOrO); ++x) o(x) = tOrO(x) * mul[(x >> 1) & 1];
  warpgroup_fence_operand(o);
  if (p.out_f32 != nullptr) {  // a uniform branch: fp32 pairs straight from registers
    store_out_f32(p, r, o);
    return;
  }
  // The previous item's store must have read this group's staging rows before they are
  // written again.
  const bool store_leader = ctid % 128 == 0;
  if (store_leader) tma_store_wait<0>();
  cutlass::arch::NamedBarrier::sync(128, static_cast<std::uint32_t>(FwdBarrier::kOStaged) + half);
  {
    Tensor out = make_tensor_like<Element>(o);
    CUTLASS_PRAGMA_UNROLL
    for (int x = 0; x < size(o); ++x) out(x) = Element(o(x));
    copy(store_o, thr_store_o.retile_S(out), tOsO);
  }
  cutlass::arch::fence_view_async_shared();  // make the writes visible to the copy engine
  cutlass::arch::NamedBarrier::sync(128, static_cast<std::uint32_t>(FwdBarrier::kOStaged) + half);
  if (store_leader) {
    // The group's rows: the second 64 tokens of one head, or the second half of the packed
    // heads (the O map's box is one half: {64, 64, 1} or {64, rows, pack / 2}).
    const int token0 = (r.it.tile << p.rows_log2) + (p.pack == 1 ? 64 * half : 0);
    const int head0 = r.it.head0 + half * (p.pack / 2);
    for (int c = 0; c < Cfg::kPanels; ++c)
      SM90_TMA_STORE_3D::copy(&p.tma_o, o_stage + c * kBlockM * 64 + half * 64 * 64, c * 64, token0,
                              head0);
    tma_store_arrive();
  }
}

}  // namespace flexcp::sm90::detail
