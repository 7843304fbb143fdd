// The backward's mainloop, both sides of it; bwd_kernel.cuh assigns the warp-group roles and runs
// the item loop:
// - load_bwd_items: the producer (one thread) takes items from the scheduler, publishes them to
//   the other roles and loads each: K and V once, then per q block Q with lse2 and dO with
//   delta, for every q head of the group, in the walk order all roles share (bwd_items.cuh);
// - BwdBlockMma: a consumer warp group's products of one q block against its 64 keys (the
//   kernel file's header lists them), with the softmax part (bwd_softmax.cuh), dS^T to shared
//   memory for dQ, and this group's half of dQ staged for the dQ writer (bwd_dq_writer.cuh).
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_conversion.h>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/bwd_dq_writer.cuh"
#include "kernels/sm90/bwd_items.cuh"
#include "kernels/sm90/bwd_params.h"
#include "kernels/sm90/bwd_softmax.cuh"
#include "kernels/sm90/kernel_common.cuh"
#include "kernels/sm90/phase_clock.cuh"
#include "kernels/sm90/tile_scheduler.cuh"
#include "kernels/worklist/worklist.h"

namespace flexcp::sm90::detail {

template <class Cfg>
__device__ __forceinline__ void load_bwd_items(const BwdParams& p, typename Cfg::SharedStorage& ss,
                                               typename Cfg::PipelineQ& pipe_q,
                                               typename Cfg::PipelineQ& pipe_do,
                                               typename Cfg::PipelineKV& pipe_kv,
                                               typename Cfg::PipelineItem& pipe_item) {
  using namespace cute;
  using Element = typename Cfg::Element;
  using PipelineQ = typename Cfg::PipelineQ;
  using PipelineKV = typename Cfg::PipelineKV;
  constexpr int kHeadDim = Cfg::kHeadDim;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  if (p.seqlen_q > 0) {  // without rows the q-side maps are left empty
    prefetch_tma_descriptor(&p.tma_q);
    prefetch_tma_descriptor(&p.tma_do);
  }
  prefetch_tma_descriptor(&p.tma_k);
  prefetch_tma_descriptor(&p.tma_v);
  auto q_state = cutlass::make_producer_start_state<PipelineQ>();
  auto do_state = cutlass::make_producer_start_state<PipelineQ>();
  auto kv_state = cutlass::make_producer_start_state<PipelineKV>();
  Cfg::Items::produce(pipe_item, ss.items, p.work.scheduler, p.items, [&](int i) {
    const BwdItem it = decode_bwd_item(p, i);
    if (it.e_begin == it.e_end) return;
    pipe_kv.producer_acquire(kv_state);
    auto* bar_kv = pipe_kv.producer_get_barrier(kv_state);
    load_tile<Cfg::kPanels, kBlockN>(&p.tma_k, bar_kv, ss.k.data(), it.tile * kBlockN, it.kv_head);
    load_tile<Cfg::kPanels, kBlockN>(&p.tma_v, bar_kv, ss.v.data(), it.tile * kBlockN, it.kv_head);
    ++kv_state;
    walk_unit<kBlockM>(p, it, [&](int hq, int c0, const WorkEntry&) {
      pipe_q.producer_acquire(q_state);
      auto* bar_q = pipe_q.producer_get_barrier(q_state);
      Element* q_dst = ss.q.data() + q_state.index() * kBlockM * kHeadDim;
      load_tile<Cfg::kPanels, kBlockM>(&p.tma_q, bar_q, q_dst, c0, hq);
      const std::int64_t stats = hq * p.stats_stride + (c0 & ~3);
      SM90_BULK_COPY_G2S::copy(p.lse2 + stats, bar_q,
                               ss.lse2.data() + q_state.index() * Cfg::kStatsLoad,
                               Cfg::kStatsBytes);
      ++q_state;
      pipe_do.producer_acquire(do_state);
      auto* bar_do = pipe_do.producer_get_barrier(do_state);
      Element* do_dst = ss.dout.data() + do_state.index() * kBlockM * kHeadDim;
      load_tile<Cfg::kPanels, kBlockM>(&p.tma_do, bar_do, do_dst, c0, hq);
      SM90_BULK_COPY_G2S::copy(p.delta + stats, bar_do,
                               ss.delta.data() + do_state.index() * Cfg::kStatsLoad,
                               Cfg::kStatsBytes);
      ++do_state;
    });
  });
  allow_next_kernel_to_launch();  // the dq conversion, queued behind
}

// The phases of a consumer group's q block, for the phase clocks (phase_clock.cuh).
enum class BwdPhase : int {
  kWaitQ,     // wait for Q (and lse2): the producer's load
  kWaitDo,    // issue S^T, wait for dO (and delta)
  kScores,    // issue dP^T, wait for S^T
  kProbs,     // P^T: mask, exponentiate
  kGrads,     // wait for dP^T, dS^T, both converted to the input dtype
  kDsShared,  // issue dV, dS^T to shared memory, the dS barrier of both groups
  kDqDk,      // issue dQ and dK, wait for dV and dQ
  kDqFree,    // wait until the dQ writer has read this group's last staged tile
  kDqStage,   // stage dQ, hand it over
  kDkWait,    // wait for dK, release Q
  kCount
};
inline constexpr const char* kBwdPhaseNames[] = {"wait-q",   "wait-do",   "scores", "probs",
                                                 "grads",    "ds-shared", "dq-dk",  "dq-free",
                                                 "dq-stage", "dk-wait"};
static_assert(sizeof(kBwdPhaseNames) / sizeof(kBwdPhaseNames[0]) == int(BwdPhase::kCount));
// And of its item loop, between the blocks (PhaseClock::mark_outside).
enum class BwdOutsidePhase : int {
  kTakeItem,  // from the last mark to the next item taken from the producer's queue
  kWaitKv,    // the item's K and V
  kWriteKv,   // after the item's last block: its dK and dV partials summed or stored, written
  kCount
};
inline constexpr const char* kBwdOutsidePhaseNames[] = {"out-take", "out-wait-kv", "out-write-kv"};
static_assert(sizeof(kBwdOutsidePhaseNames) / sizeof(kBwdOutsidePhaseNames[0]) ==
              int(BwdOutsidePhase::kCount));

template <class Cfg>
struct BwdBlockMma {
  using Element = typename Cfg::Element;
  using PipelineQ = typename Cfg::PipelineQ;
  static constexpr int kHeadDim = Cfg::kHeadDim;
  static constexpr int kBlockM = Cfg::kBlockM;
  static constexpr int kBlockN = Cfg::kBlockN;
  // P^T and dS^T in the A-operand register layout of dV and dK: ((2,2,2), 1, kBlockM/16). As in
  // the forward, element i of the S^T accumulator is element i of this layout.
  using ALayout = cute::Layout<
      cute::Shape<cute::Shape<cute::_2, cute::_2, cute::_2>, cute::_1, cute::Int<kBlockM / 16>>>;
  using RegsA = decltype(cute::make_tensor<Element>(ALayout{}));
  // dS^T to shared memory with transposing stmatrix, for the dQ product.
  using StoreDs = decltype(cute::make_tiled_copy_C(
      cute::Copy_Atom<cute::SM90_U16x8_STSM_T, Element>{}, typename Cfg::MmaSdP{}));

  typename Cfg::MmaSdP mma_sdp;
  typename Cfg::MmaKV mma_kv;
  typename Cfg::MmaDQ mma_dq;
  decltype(mma_sdp.get_thread_slice(0)) thr_sdp;
  decltype(mma_kv.get_thread_slice(0)) thr_kv;
  decltype(mma_dq.get_thread_slice(0)) thr_dq;
  RegsA tKVrP, tKVrdS;
  StoreDs store_ds;
  decltype(store_ds.get_thread_slice(0)) thr_store_ds;
  int half;  // which 64 keys of the tile (and half of dQ: of D, or of the rows at 128)
  // This thread's rows (keys of S^T, dK, dV; q rows of dQ) and columns in the accumulators.
  int row_in_group, col_base;
  typename PipelineQ::PipelineState q_state, do_state;
  int ds_stage = 0;
  PhaseClock<BwdPhase, ClockedKernel::kBackward> clock;  // empty unless FLEXCP_SM90_PHASE_CLOCKS

  // ctid: 0..255 over both consumer warp groups. The products' slices only partition shared-
  // memory operands, which depend on the warp group alone: sliced at the group's first thread,
  // from the warp-uniform group index, their descriptors are built in uniform registers (as
  // FlashAttention-4's are) instead of per thread and moved across before every wgmma.
  __device__ __forceinline__ BwdBlockMma(int ctid, int half_)
      : thr_sdp(mma_sdp.get_thread_slice(group_first_thread())),
        thr_kv(mma_kv.get_thread_slice(group_first_thread())),
        thr_dq(mma_dq.get_thread_slice(group_first_thread())),
        thr_store_ds(store_ds.get_thread_slice(ctid)),
        half(half_) {
    const FragmentCoords coords = fragment_coords();
    row_in_group = coords.row;
    col_base = coords.col_base;
  }

  __device__ __forceinline__ static int group_first_thread() {
    return (cutlass::canonical_warp_group_idx() - 1) * 128;  // consumers are warp groups 1 and 2
  }

  // The dK and dV accumulators (the kernel keeps them across an item's blocks).
  __device__ __forceinline__ auto key_accumulator() const {
    return cute::partition_fragment_C(mma_kv, cute::select<0, 1>(typename Cfg::TileKV{}));
  }

  template <class From, class To>
  __device__ __forceinline__ static void convert(From const& from, To& to) {
    constexpr int n = decltype(cute::size(from))::value;
    cutlass::NumericArrayConverter<Element, float, n> conv;
    *reinterpret_cast<cutlass::Array<Element, n>*>(to.data()) =
        conv(*reinterpret_cast<const cutlass::Array<float, n>*>(from.data()));
  }
  template <class Mma, class A, class B, class C>
  __device__ __forceinline__ static void issue_ss(Mma& mma, A const& a, B const& b, C& c) {
    cute::warpgroup_fence_operand(c);
    cute::warpgroup_arrive();
    issue_gemm<true>(mma, a, b, c);
    cute::warpgroup_commit_batch();
  }
  template <class Mma, class A, class B, class C>
  __device__ __forceinline__ static void issue_rs(Mma& mma, A& a, B const& b, C& c) {
    cute::warpgroup_fence_operand(c);
    cute::warpgroup_fence_operand(a);
    cute::warpgroup_arrive();
    issue_gemm<false>(mma, a, b, c);
    cute::warpgroup_commit_batch();
  }

  // One q block [c0, c0 + kBlockM) of q head hq against this group's 64 keys of the tile whose
  // first key is key0; adds to dV and dK.
  template <class Acc>
  __device__ __forceinline__ void block(const BwdParams& p, typename Cfg::SharedStorage& ss,
                                        PipelineQ& pipe_q, PipelineQ& pipe_do, int hq, int c0,
                                        const WorkEntry& entry, int key0, Acc& tdVrdV,
                                        Acc& tdKrdK) {
    using namespace cute;
    // Accumulators of this block only, declared here so that they are dead between blocks (the
    // wgmma operands read them even when they overwrite them).
    Tensor tSrS = partition_fragment_C(mma_sdp, select<0, 1>(typename Cfg::TileSdP{}));
    Tensor tSrdP = partition_fragment_C(mma_sdp, select<0, 1>(typename Cfg::TileSdP{}));
    Tensor tdQrdQ = partition_fragment_C(mma_dq, select<0, 1>(typename Cfg::TileDQ{}));
    static_assert(size(tSrS) == kBlockM / 2 && size(tdQrdQ) == Cfg::kDqRows * Cfg::kDqCols / 128);
    // The shared-memory operands, described here rather than once per kernel: hoisted out of
    // the loop, their wgmma descriptors (eight operands, one 64-bit descriptor per k step) would
    // not fit in registers beside the accumulators and would be spilled. The opaque zero keeps
    // the compiler from hoisting them.
    const int z = opaque_zero();
    auto smem = [z](auto* data, auto layout) {
      return make_tensor(make_smem_ptr(data + z), layout);
    };
    Tensor tSrK = thr_sdp.partition_fragment_A(smem(ss.k.data(), typename Cfg::SmemLayoutKV{}));
    Tensor tSrQ = thr_sdp.partition_fragment_B(smem(ss.q.data(), typename Cfg::SmemLayoutQ{}));
    Tensor tSrV = thr_sdp.partition_fragment_A(smem(ss.v.data(), typename Cfg::SmemLayoutKV{}));
    Tensor tSrdO = thr_sdp.partition_fragment_B(smem(ss.dout.data(), typename Cfg::SmemLayoutQ{}));
    Tensor tKVrdO = thr_kv.partition_fragment_B(smem(ss.dout.data(), typename Cfg::SmemLayoutQt{}));
    Tensor tKVrQ = thr_kv.partition_fragment_B(smem(ss.q.data(), typename Cfg::SmemLayoutQt{}));
    Tensor tDQrdS = thr_dq.partition_fragment_A(smem(ss.ds.data(), typename Cfg::SmemLayoutDs{}));
    Tensor tDQrK = thr_dq.partition_fragment_B(smem(ss.k.data(), typename Cfg::SmemLayoutKt{}));
    Tensor tDSsdS = thr_store_ds.partition_D(
        as_position_independent_swizzle_tensor(smem(ss.ds.data(), typename Cfg::SmemLayoutDst{})));
    // The stages as warp-uniform values (a shuffle from lane 0, which the compiler knows to be
    // uniform), so that the descriptors built from them stay in uniform registers.
    const int qs = __shfl_sync(0xffffffffu, int(q_state.index()), 0);
    const int dos = __shfl_sync(0xffffffffu, int(do_state.index()), 0);
    const int dss = __shfl_sync(0xffffffffu, ds_stage, 0);
    clock.block();
    pipe_q.consumer_wait(q_state);
    clock.mark(BwdPhase::kWaitQ);
    // This thread's columns of the statistics (the copies started up to 3 rows early), read
    // while the products run: a wgmma wait orders memory for the compiler, so a load placed after
    // one waits its latency on the group's chain. lse2's loads go before S^T's issue: behind its
    // wgmmas they waited in the same queue until the tensor cores took them, and the register
    // they address from, reused right after, held the group ~11% of its time before dP^T's
    // issue (bench/results/h100-2026-12-05.md).
    // 128-row blocks read them where they are used (bwd_softmax.cuh says why).
    const bool pairs_aligned = c0 % 2 == 0;
    auto lse2_at = [&] {
      return ss.lse2.data() + q_state.index() * Cfg::kStatsLoad + (c0 & 3) + col_base;
    };
    auto delta_at = [&] {
      return ss.delta.data() + do_state.index() * Cfg::kStatsLoad + (c0 & 3) + col_base;
    };
    constexpr bool kStatsInRegs = kBlockM == 64;
    std::conditional_t<kStatsInRegs, RegStats<kBlockM>, SmemStats> lse2, delta;
    if constexpr (kStatsInRegs) {
      load_stats<kBlockM>(lse2_at(), pairs_aligned, lse2);
    } else {
      lse2.at = lse2_at();
      delta.at = delta_at();
    }
    issue_ss(mma_sdp, tSrK, tSrQ(_, _, _, qs), tSrS);
    pipe_do.consumer_wait(do_state);
    clock.mark(BwdPhase::kWaitDo);
    issue_ss(mma_sdp, tSrV, tSrdO(_, _, _, dos), tSrdP);
    warpgroup_wait<1>();
    warpgroup_fence_operand(tSrS);
    clock.mark(BwdPhase::kScores);

    probabilities_t<kBlockM, kBlockN>(p, tSrS, entry, c0, key0, key0 + 64 * half + row_in_group,
                                      col_base, lse2);
    if constexpr (kStatsInRegs) load_stats<kBlockM>(delta_at(), pairs_aligned, delta);
    clock.mark(BwdPhase::kProbs);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrdP);
    logit_gradients_t<kBlockM>(p, tSrS, tSrdP, lse2, delta);
    convert(tSrS, tKVrP);
    convert(tSrdP, tKVrdS);
    clock.mark(BwdPhase::kGrads);

    // dV += P^T dO while dS^T goes to shared memory for dQ.
    issue_rs(mma_kv, tKVrP, tKVrdO(_, _, _, dos), tdVrdV);
    if constexpr (Cfg::kAccumulateDq) {
      {
        Tensor rdS = make_tensor(tKVrdS.data(), tSrdP.layout());  // the accumulator's shape
        copy(store_ds, thr_store_ds.retile_S(rdS), tDSsdS(_, _, _, ds_stage));
      }
      cutlass::arch::fence_view_async_shared();  // the writes, visible to the tensor cores
      cutlass::arch::NamedBarrier::sync(Cfg::kConsumerThreads,
                                        static_cast<std::uint32_t>(BwdBarrier::kDsReady));
      clock.mark(BwdPhase::kDsShared);
      issue_ss(mma_dq, tDQrdS(_, _, _, dss), tDQrK, tdQrdQ);
    }
    issue_rs(mma_kv, tKVrdS, tKVrQ(_, _, _, qs), tdKrdK);
    warpgroup_wait<1>();  // dV (and dQ) done (groups complete in order)
    if constexpr (Cfg::kAccumulateDq) warpgroup_fence_operand(tdQrdQ);
    pipe_do.consumer_release(do_state);
    ++do_state;
    clock.mark(BwdPhase::kDqDk);

    // This group's part of dQ (kDqRows x kDqCols) into its staging tile, in the 128-byte swizzle
    // of the TMA map (the 16-byte unit index XOR the row mod 8), once the writer's reductions have
    // read the last block's: 8 stmatrix of 4 matrices a thread, conflict-free (the 8 rows of a
    // matrix fall on 8 different units). stmatrix moves 16-bit pairs; an fp32 value rides as one
    // pair, so a matrix row (16 bytes) holds the four lanes' values of one column parity, and each
    // 8-column group of the tile is staged, added and kept in the accumulator in the order 0 2 4 6
    // 1 3 5 7 (bwd_postprocess reads it back). 64-bit stores in the columns' own order met 2-way
    // bank conflicts (a half-warp's 4 rows XOR onto the same unit pairs); slabs of 8 columns were
    // conflict-free but their 32-byte rows cost the reductions more than the conflicts
    // (bench/results/h200-backward-2026-12-03.md section 3).
    // Rows past the entry are staged as zeros: the reduction adds the whole box, and those rows
    // may belong to another entry (or attend keys whose values are not finite).
    if constexpr (Cfg::kAccumulateDq) {
      wait_dq_tile_free<Cfg>(half);
      clock.mark(BwdPhase::kDqFree);
      const float* dq_stage = ss.dq.data() + half * Cfg::kDqRows * Cfg::kDqCols;
      // Matrix i of an stmatrix is (column parity i % 2, row half i / 2) of one 8-column group,
      // its register this thread's value c + 2 h + 4 j of the accumulator; lane l gives the
      // address of row l % 8 of matrix l / 8: row r of the tile, 16-byte unit
      // (2 (j % 4) + parity) ^ (r % 8) of the panel's 128-byte row. A row starts on a 128-byte
      // boundary and 2 (j % 4) fills the unit index's upper two bits, so group j's address is
      // group 0's XOR 32 (j % 4), plus its panel's offset: three XORs a block, where the swizzle
      // written per store was recomputed by ptxas every block (~30 instructions).
      const int lane = threadIdx.x % 32;
      const int parity = lane / 8 % 2;
      const int r = row_in_group - lane / 4 + 8 * (lane / 16) + lane % 8;
      const std::uint32_t at0 =
          cute::cast_smem_ptr_to_uint(dq_stage + r * kBwdDqBoxCols) + 16 * (parity ^ (r % 8));
      auto stage = [&](auto bits) {
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < Cfg::kDqCols / 8; ++j) {
          constexpr std::uint32_t kPanelBytes = Cfg::kDqRows * kBwdDqBoxCols * sizeof(float);
          stmatrix_x4((at0 ^ (32u * (j % 4))) + (j / 4) * kPanelBytes, bits(4 * j), bits(4 * j + 1),
                      bits(4 * j + 2), bits(4 * j + 3));
        }
      };
      // Only an entry's last block can have rows past it; the others stage the accumulator as
      // it is, without a select a value (32 instructions a block). The test is uniform over the
      // block, taken from lane 0 so that the compiler knows it.
      if (__shfl_sync(0xffffffffu, c0 + kBlockM <= int(entry.end), 0)) {
        stage([&](int i) { return __float_as_uint(tdQrdQ(i)); });
      } else {
        const int row = c0 + Cfg::dq_row_offset(half) + row_in_group;
        const bool live[2] = {row < int(entry.end), row + 8 < int(entry.end)};
        stage([&](int i) { return live[i / 2 % 2] ? __float_as_uint(tdQrdQ(i)) : 0u; });
      }
      hand_over_dq_tile<Cfg>(half);
      clock.mark(BwdPhase::kDqStage);
    }
    warpgroup_wait<0>();  // dK done: Q is no longer read
    warpgroup_fence_operand(tdKrdK);
    pipe_q.consumer_release(q_state);
    ++q_state;
    ds_stage ^= 1;
    clock.mark(BwdPhase::kDkWait);
  }
};

}  // namespace flexcp::sm90::detail
