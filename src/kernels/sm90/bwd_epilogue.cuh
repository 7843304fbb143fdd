// The backward kernel's epilogue, run by both consumer warp groups at the end of each unit: dK
// (scaled) and dV of the unit's keys from the accumulators, and, for a unit of a split item
// (kernels/worklist/bwd_units.h), combining the units' partials first: storing its own, counting
// it in, and in the last unit to arrive summing every unit's (BwdPartials::kLastSums), or waiting
// for its turn and adding the sum so far to its own (BwdPartials::kChain).
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>
#include <cute/tensor.hpp>

#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/bwd_params.h"
#include "kernels/sm90/kernel_common.cuh"

namespace flexcp::sm90::detail {

// dK (times the scale) and dV of the unit's keys, from this thread's accumulator fragments (its
// warp group owns keys [64 half, 64 half + 64) of the tile), in fp32 (partial sums for the
// distributed runtime), stored or with Add added to what dk and dv hold, in pairs; rows past the
// keys are not written. The input dtype goes through store_dk_dv_pieces below.
template <class Cfg, bool Add, class Frag>
__device__ __forceinline__ void store_dk_dv_f32(const BwdParams& p, const BwdUnit& it,
                                                const Frag& dk_acc, const Frag& dv_acc, int half) {
  using OutT = float;
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

// Transposes the 4 x 4 words a quad of lanes holds (lane q: row q) so that lane q holds column q:
// two butterfly steps over the lane's bits, each swapping the off-diagonal 2 x 2 blocks.
__device__ __forceinline__ void transpose_in_quad(std::uint32_t (&w)[4]) {
  const int q = threadIdx.x % 4;
  CUTLASS_PRAGMA_UNROLL
  for (int bit = 2; bit >= 1; bit /= 2) {
    const bool high = q & bit;
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < 4; ++k) {
      if (k & bit) continue;
      const std::uint32_t lo = w[k], hi = w[k | bit];  // selects: no indexing by lane
      const std::uint32_t got = __shfl_xor_sync(0xffffffffu, high ? lo : hi, bit);
      w[k] = high ? got : lo;
      w[k | bit] = high ? hi : got;
    }
  }
}

// dK and dV in the 16-bit input dtype, in 16-byte pieces. A fragment's row holds one pair of
// each 8-column piece per lane of a quad; a store of pairs touches 8 rows for 16 bytes each, and
// a unit's 4096 such pieces took ~8000 cycles at its end (the phase clocks' out-write-kv,
// bench/results/h200-backward-2026-12-04.md section 24). Transposed within the quad, lane q holds
// whole pieces 4 m + q: a quarter of the stores, each 64 contiguous bytes of a row per quad.
template <class Cfg, class Frag>
__device__ __forceinline__ void store_dk_dv_pieces(const BwdParams& p, const BwdUnit& it,
                                                   const Frag& dk_acc, const Frag& dv_acc,
                                                   int half) {
  using OutT = typename Cfg::Element;
  using Pair = cutlass::Array<OutT, 2>;
  static_assert(Cfg::kHeadDim % 32 == 0, "whole groups of four 8-column pieces");
  const int row_in_group = fragment_coords().row;
  const int q = threadIdx.x % 4;
  auto pack = [](float a, float b) {
    Pair pair;
    pair[0] = OutT(a), pair[1] = OutT(b);
    return reinterpret_cast<const std::uint32_t&>(pair);
  };
  CUTLASS_PRAGMA_UNROLL
  for (int h = 0; h < 2; ++h) {
    const int key = it.tile * Cfg::kBlockN + 64 * half + row_in_group + 8 * h;
    const bool in = key < p.seqlen_k;  // the shuffles run in every lane; only the stores wait
    OutT* dk = static_cast<OutT*>(p.dk) + std::int64_t(key) * p.dk_stride_t +
               std::int64_t(it.kv_head) * p.dk_stride_h;
    OutT* dv = static_cast<OutT*>(p.dv) + std::int64_t(key) * p.dv_stride_t +
               std::int64_t(it.kv_head) * p.dv_stride_h;
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < Cfg::kHeadDim / 32; ++m) {
      std::uint32_t k4[4], v4[4];
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < 4; ++r) {  // piece j = 4 m + r, this lane's pair of it
        const int e = 2 * h + 4 * (4 * m + r);
        k4[r] = pack(dk_acc(e) * p.scale, dk_acc(e + 1) * p.scale);
        v4[r] = pack(dv_acc(e), dv_acc(e + 1));
      }
      transpose_in_quad(k4);
      transpose_in_quad(v4);
      if (!in) continue;
      const int col = 8 * (4 * m + q);
      *reinterpret_cast<uint4*>(dk + col) = make_uint4(k4[0], k4[1], k4[2], k4[3]);
      *reinterpret_cast<uint4*>(dv + col) = make_uint4(v4[0], v4[1], v4[2], v4[3]);
    }
  }
}

// dK and dV of the unit in the output's dtype (a uniform branch, once per unit).
template <class Cfg, class Frag>
__device__ __forceinline__ void write_dk_dv(const BwdParams& p, const BwdUnit& it,
                                            const Frag& dk_acc, const Frag& dv_acc, int half) {
  if (p.dkv_add)
    store_dk_dv_f32<Cfg, true>(p, it, dk_acc, dv_acc, half);
  else if (p.dkv_fp32)
    store_dk_dv_f32<Cfg, false>(p, it, dk_acc, dv_acc, half);
  else
    store_dk_dv_pieces<Cfg>(p, it, dk_acc, dv_acc, half);
}

// A unit of a split item stores its dK and dV partials (unscaled) in its slot and counts itself
// in; the last to arrive sums every unit's partials in unit order into dk_acc and dv_acc (the same
// bits whichever unit finishes last) and returns true: it writes the item's dK and dV. `ctid` is
// the thread's index over both consumer groups; `last_unit` a shared flag.
// This thread's float4s of the dK and dV partials in one slot, each read or written through L2
// (another SM's unit reads them): v-th vector of dK (kind 0) or dV (kind 1).
template <class Cfg>
struct PartialSlot {
  static constexpr int kThreads = 128 * Cfg::kConsumers;
  static constexpr int kVectors = Cfg::kPartialVectors;
  float* base;  // the slot's first float4 of this thread
  __device__ __forceinline__ PartialSlot(const BwdParams& p, int slot, int ctid)
      : base(p.partials + std::int64_t(slot) * (2 * kVectors * 4 * kThreads) + ctid * 4) {}
  __device__ __forceinline__ float4* at(int kind, int v) const {
    return reinterpret_cast<float4*>(base + (kind * kVectors + v) * kThreads * 4);
  }
  template <class Frag>
  __device__ __forceinline__ void store(const Frag& dk_acc, const Frag& dv_acc) const {
    CUTLASS_PRAGMA_UNROLL
    for (int v = 0; v < kVectors; ++v) {
      __stcg(at(0, v),
             make_float4(dk_acc(4 * v), dk_acc(4 * v + 1), dk_acc(4 * v + 2), dk_acc(4 * v + 3)));
      __stcg(at(1, v),
             make_float4(dv_acc(4 * v), dv_acc(4 * v + 1), dv_acc(4 * v + 2), dv_acc(4 * v + 3)));
    }
  }
  template <class Frag>
  __device__ __forceinline__ void add_to(Frag& dk_acc, Frag& dv_acc) const {
    auto add = [](Frag& frag, int v, float4 x) {
      frag(4 * v) += x.x, frag(4 * v + 1) += x.y, frag(4 * v + 2) += x.z, frag(4 * v + 3) += x.w;
    };
    CUTLASS_PRAGMA_UNROLL
    for (int v = 0; v < kVectors; ++v) {
      add(dk_acc, v, __ldcg(at(0, v)));
      add(dv_acc, v, __ldcg(at(1, v)));
    }
  }
};

template <class Cfg, class Frag>
__device__ __forceinline__ bool sum_split_partials(const BwdParams& p, const BwdUnit& it,
                                                   Frag& dk_acc, Frag& dv_acc, int ctid,
                                                   int& last_unit) {
  constexpr int kThreads = 128 * Cfg::kConsumers;
  PartialSlot<Cfg>(p, it.slot + it.split, ctid).store(dk_acc, dv_acc);
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
  for (int s = 0; s < it.splits; ++s) PartialSlot<Cfg>(p, it.slot + s, ctid).add_to(dk_acc, dv_acc);
  return true;
}

// A unit of a chained item (BwdPartials::kChain): waits until the item's counter reads its turn,
// adds the slot (the sum of the units before it) to its own partials, stores the sum for the next
// unless it is the last, and passes the counter on. The sum runs in split order whichever SM
// finishes first, so dK and dV are the same bits on every run. Returns true in the last unit: it
// writes dK and dV.
template <class Cfg, class Frag>
__device__ __forceinline__ bool chain_split_partials(const BwdParams& p, const BwdUnit& it,
                                                     Frag& dk_acc, Frag& dv_acc, int ctid) {
  constexpr int kThreads = 128 * Cfg::kConsumers;
  const auto turn = static_cast<std::uint32_t>(BwdBarrier::kPartialStored);
  int* counter = p.split_counters + it.counter;
  if (ctid == 0) {
    // The unit before is earlier in the scheduler's order, on a running CTA (the launch's CTAs
    // are all resident, one per SM): it arrives, within one unit's time. (Unbounded, like the
    // pipelines' waits; bounded with a trap, ptxas serialises the products, C7512.)
    for (;;) {
      int seen;
      asm volatile("ld.global.acquire.gpu.b32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
      if (seen == it.wait_for) break;
      __nanosleep(128);
    }
  }
  cutlass::arch::NamedBarrier::sync(kThreads, turn);
  const PartialSlot<Cfg> slot(p, it.slot, ctid);
  if (it.split > 0) {
    __threadfence();  // the units before's sum is read after their turn passed
    slot.add_to(dk_acc, dv_acc);
  }
  const bool last = it.split == it.splits - 1;
  if (!last) slot.store(dk_acc, dv_acc);
  __threadfence();  // the sum stored (and the slot read) before the next unit's turn
  cutlass::arch::NamedBarrier::sync(kThreads, turn);
  if (ctid == 0)
    asm volatile("st.global.release.gpu.b32 [%0], %1;" ::"l"(counter), "r"(it.then_set) : "memory");
  return last;
}

}  // namespace flexcp::sm90::detail
