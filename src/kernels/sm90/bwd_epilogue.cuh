// The backward kernel's epilogue, run by both consumer warp groups at the end of each unit: dK
// (scaled) and dV of the unit's keys from the accumulators, and, for a unit of a split item
// (kernels/worklist/bwd_units.h), storing its partials, counting it in, and in the last unit to
// arrive summing every unit's partials first.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>
#include <cute/tensor.hpp>

#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/bwd_params.h"
#include "kernels/sm90/kernel_common.cuh"

namespace flexcp::sm90::detail {

// dK (times the scale) and dV of the unit's keys, from this thread's accumulator fragments (its
// warp group owns keys [64 half, 64 half + 64) of the tile), as OutT, or with Add (fp32) added to
// what dk and dv hold; rows past the keys are not written.
template <class Cfg, class OutT, bool Add, class Frag>
__device__ __forceinline__ void store_dk_dv(const BwdParams& p, const BwdUnit& it,
                                            const Frag& dk_acc, const Frag& dv_acc, int half) {
  using Pair = cutlass::Array<OutT, 2>;
  const auto [row_in_group, col_base] = fragment_coords();
  CUTLASS_PRAGMA_UNROLL
  for (int h = 0; h < 2; ++h) {
    const int key = it.tile * Cfg::kBlockN + 64 * half + row_in_group + 8 * h;
    if (key >= p.seqlen_k) continue;
    OutT* dk = static_cast<OutT*>(p.dk) + std::int64_t(key) * p.dk_stride_t +
               std::int64_t(it.kv_head) * p.dk_stride_h + col_base;
    OutT* dv = static_cast<OutT*>(p.dv) + std::int64_t(key) * p.dv_stride_t +
               std::int64_t(it.kv_head) * p.dv_stride_h + col_base;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < Cfg::kHeadDim / 8; ++j) {
      Pair k2, v2;
      k2[0] = OutT(dk_acc(2 * h + 4 * j) * p.scale);
      k2[1] = OutT(dk_acc(1 + 2 * h + 4 * j) * p.scale);
      v2[0] = OutT(dv_acc(2 * h + 4 * j));
      v2[1] = OutT(dv_acc(1 + 2 * h + 4 * j));
      if constexpr (Add) {
        const Pair k_had = *reinterpret_cast<const Pair*>(dk + 8 * j);
        const Pair v_had = *reinterpret_cast<const Pair*>(dv + 8 * j);
        k2[0] += k_had[0], k2[1] += k_had[1], v2[0] += v_had[0], v2[1] += v_had[1];
      }
      *reinterpret_cast<Pair*>(dk + 8 * j) = k2;
      *reinterpret_cast<Pair*>(dv + 8 * j) = v2;
    }
  }
}

// dK and dV of the unit in the output's dtype (a uniform branch, once per unit).
template <class Cfg, class Frag>
__device__ __forceinline__ void write_dk_dv(const BwdParams& p, const BwdUnit& it,
                                            const Frag& dk_acc, const Frag& dv_acc, int half) {
  if (p.dkv_add)
    store_dk_dv<Cfg, float, true>(p, it, dk_acc, dv_acc, half);
  else if (p.dkv_fp32)
    store_dk_dv<Cfg, float, false>(p, it, dk_acc, dv_acc, half);
  else
    store_dk_dv<Cfg, typename Cfg::Element, false>(p, it, dk_acc, dv_acc, half);
}

// A unit of a split item stores its dK and dV partials (unscaled) in its slot and counts itself
// in; the last to arrive sums every unit's partials in unit order into dk_acc and dv_acc (the same
// bits whichever unit finishes last) and returns true: it writes the item's dK and dV. `ctid` is
// the thread's index over both consumer groups; `last_unit` a shared flag.
template <class Cfg, class Frag>
__device__ __forceinline__ bool sum_split_partials(const BwdParams& p, const BwdUnit& it,
                                                   Frag& dk_acc, Frag& dv_acc, int ctid,
                                                   int& last_unit) {
  constexpr int kThreads = 128 * Cfg::kConsumers;
  constexpr int kVectors = Cfg::kPartialVectors;
  constexpr std::int64_t kSlot = 2 * kVectors * 4 * kThreads;
  auto at = [&](int slot, int kind, int v) {
    return reinterpret_cast<float4*>(p.partials + slot * kSlot +
                                     ((kind * kVectors + v) * kThreads + ctid) * 4);
  };
  auto vec = [](auto const& frag, int v) {
    return make_float4(frag(4 * v), frag(4 * v + 1), frag(4 * v + 2), frag(4 * v + 3));
  };
  auto add = [](auto& frag, int v, float4 x) {
    frag(4 * v) += x.x, frag(4 * v + 1) += x.y, frag(4 * v + 2) += x.z, frag(4 * v + 3) += x.w;
  };
  CUTLASS_PRAGMA_UNROLL
  for (int v = 0; v < kVectors; ++v) {
    __stcg(at(it.slot + it.split, 0, v), vec(dk_acc, v));
    __stcg(at(it.slot + it.split, 1, v), vec(dv_acc, v));
  }
  __threadfence();  // the partials, visible on every SM before the unit counts itself in
  const auto stored = static_cast<std::uint32_t>(BwdBarrier::kPartialStored);
  cutlass::arch::NamedBarrier::sync(kThreads, stored);
  if (ctid == 0) {
    const bool last = atomicAdd(p.split_counters + it.counter, 1) == it.splits - 1;
    if (last)
      p.split_counters[it.counter] = 0;  // every unit has counted: ready for the next launch
    last_unit = last;
  }
  cutlass::arch::NamedBarrier::sync(kThreads, stored);
  if (!last_unit) return false;
  __threadfence();  // the other units' partials are read after their counts
  cute::clear(dk_acc);
  cute::clear(dv_acc);
  for (int s = 0; s < it.splits; ++s) {
    CUTLASS_PRAGMA_UNROLL
    for (int v = 0; v < kVectors; ++v) {
      add(dk_acc, v, __ldcg(at(it.slot + s, 0, v)));
      add(dv_acc, v, __ldcg(at(it.slot + s, 1, v)));
    }
  }
  return true;
}

}  // namespace flexcp::sm90::detail
