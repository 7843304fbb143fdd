// The Hopper backward kernel: one persistent CTA per SM walks (key tile, kv head) items busiest
// first. Warp group 0 is the producer (one thread issues every TMA load: the item's K and V once,
// then Q with lse2 and dO with delta per q block, for every q head of the group). Warp groups 1 and
// 2 each own 64 of the tile's 128 keys. Per q block of 64 rows, each computes
//   S^T = K Q^T and dP^T = V dO^T           (wgmma, both operands in shared memory)
//   P^T = 2^(S^T log2(e) - lse2), masked    (registers; rows are keys, columns q rows)
//   dS^T = P^T (dP^T - delta) [(1 - t^2)]    (registers)
//   dV += P^T dO, dK += dS^T Q              (wgmma, P^T and dS^T from registers)
//   dQ = dS K                                (wgmma from shared memory: both groups' dS, each
//                                             group half of the head dimension)
// stages its half of dQ in shared memory, from where the producer group's dQ writer warp adds it
// to the fp32 accumulator with TMA reductions (bwd_dq_writer.cuh). dK and dV are written once, at
// the end of the item (bwd_epilogue.cuh, with the partials of split items). The preprocessing
// (delta, lse2) and postprocessing (dQ in the input dtype, the sink's gradient) are in
// bwd_rowstats.cu.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/numeric_conversion.h>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include "kernels/lse_merge.h"
#include "kernels/sm90/bwd_common.cuh"
#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/bwd_dq_writer.cuh"
#include "kernels/sm90/bwd_epilogue.cuh"
#include "kernels/sm90/bwd_items.cuh"
#include "kernels/sm90/bwd_params.h"
#include "kernels/sm90/bwd_softmax.cuh"
#include "kernels/sm90/kernel_common.cuh"
#include "kernels/sm90/tile_scheduler.cuh"
#include "kernels/worklist/worklist.h"

namespace flexcp::sm90 {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    bwd_kernel(const __grid_constant__ BwdParams p) {
  using namespace cute;
  using Element = typename Cfg::Element;
  using PipelineQ = typename Cfg::PipelineQ;
  using PipelineKV = typename Cfg::PipelineKV;
  using PipelineItem = typename Cfg::PipelineItem;
  constexpr int kHeadDim = Cfg::kHeadDim;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;

  extern __shared__ char smem_raw[];
  auto& ss = detail::shared_storage<typename Cfg::SharedStorage>(smem_raw);
  const int wg = threadIdx.x / 128;
  const bool producer = wg == 0;
  constexpr int kConsumerThreads = 128 * Cfg::kConsumers;
  // Q and dO each with its row statistics (one pipeline each, the same parameters).
  const auto qp = detail::tma_pipeline_params<PipelineQ>(producer, Cfg::kQBytes + Cfg::kStatsBytes,
                                                         kConsumerThreads);
  PipelineQ pipe_q(ss.pipe_q, qp, Shape<_1, _1, _1>{});
  PipelineQ pipe_do(ss.pipe_do, qp, Shape<_1, _1, _1>{});
  PipelineKV pipe_kv(
      ss.pipe_kv,
      detail::tma_pipeline_params<PipelineKV>(producer, 2 * Cfg::kKVBytes, kConsumerThreads),
      Shape<_1, _1, _1>{});
  // The consumers and the dQ writer take every item.
  const bool dq_writer = Cfg::kAccumulateDq && threadIdx.x / 32 == Cfg::kDqWriterWarp;
  PipelineItem pipe_item(
      ss.items.pipe,
      Cfg::Items::params(producer && !dq_writer, kConsumerThreads + Cfg::kDqWriterThreads));
  __syncthreads();  // barriers initialised before anyone waits on them
  // Launched to overlap the row statistics (launch.cuh): they write the statistics the producer
  // loads and zero the accumulator the consumers add into.
  detail::wait_for_previous_kernel();

  if (producer) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if constexpr (Cfg::kAccumulateDq) {
      if (dq_writer) {
        detail::write_dq_blocks<Cfg>(p, ss, pipe_item);
        return;
      }
    }
    if (threadIdx.x != 0) return;
    if (p.seqlen_q > 0) {  // without rows the q-side maps are left empty
      prefetch_tma_descriptor(&p.tma_q);
      prefetch_tma_descriptor(&p.tma_do);
    }
    prefetch_tma_descriptor(&p.tma_k);
    prefetch_tma_descriptor(&p.tma_v);
    auto q_state = cutlass::make_producer_start_state<PipelineQ>();
    auto do_state = cutlass::make_producer_start_state<PipelineQ>();
    auto kv_state = cutlass::make_producer_start_state<PipelineKV>();
    auto item_state = cutlass::make_producer_start_state<PipelineItem>();
    using Items = typename Cfg::Items;
    for (int i = blockIdx.x;; i = Items::next(p.work.scheduler)) {
      Items::publish(pipe_item, item_state, ss.items, i);
      if (i >= p.items) {
        Items::retire(p.work.scheduler);
        detail::allow_next_kernel_to_launch();  // the dq conversion, queued behind
        break;
      }
      const detail::BwdItem it = detail::decode_bwd_item(p, i);
      if (it.e_begin == it.e_end) continue;
      pipe_kv.producer_acquire(kv_state);
      using detail::load_tile;
      auto* bar_kv = pipe_kv.producer_get_barrier(kv_state);
      load_tile<Cfg::kPanels, kBlockN>(&p.tma_k, bar_kv, ss.k.data(), it.tile * kBlockN,
                                       it.kv_head);
      load_tile<Cfg::kPanels, kBlockN>(&p.tma_v, bar_kv, ss.v.data(), it.tile * kBlockN,
                                       it.kv_head);
      ++kv_state;
      detail::walk_unit(p, it, [&](int hq, int c0, const WorkEntry&) {
        pipe_q.producer_acquire(q_state);
        auto* bar_q = pipe_q.producer_get_barrier(q_state);
        Element* q_dst = ss.q.data() + q_state.index() * kBlockM * kHeadDim;
        load_tile<Cfg::kPanels, kBlockM>(&p.tma_q, bar_q, q_dst, c0, hq);
        const std::int64_t stats = hq * p.stats_stride + (c0 & ~3);
        SM90_BULK_COPY_G2S::copy(p.lse2 + stats, bar_q,
                                 ss.lse2.data() + q_state.index() * kBwdStatsLoad,
                                 Cfg::kStatsBytes);
        ++q_state;
        pipe_do.producer_acquire(do_state);
        auto* bar_do = pipe_do.producer_get_barrier(do_state);
        Element* do_dst = ss.dout.data() + do_state.index() * kBlockM * kHeadDim;
        load_tile<Cfg::kPanels, kBlockM>(&p.tma_do, bar_do, do_dst, c0, hq);
        SM90_BULK_COPY_G2S::copy(p.delta + stats, bar_do,
                                 ss.delta.data() + do_state.index() * kBwdStatsLoad,
                                 Cfg::kStatsBytes);
        ++do_state;
      });
    }
    return;
  }

  // ---- consumers ----
  cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
  const int ctid = threadIdx.x - 128;  // 0..255 over both consumer warp groups
  const int half = wg - 1;             // which 64 keys of the tile (and half of D for dQ)
  typename Cfg::MmaSdP mma_sdp;
  typename Cfg::MmaKV mma_kv;
  typename Cfg::MmaDQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(ctid);
  auto thr_kv = mma_kv.get_thread_slice(ctid);
  auto thr_dq = mma_dq.get_thread_slice(ctid);

  Tensor tdVrdV = partition_fragment_C(mma_kv, select<0, 1>(typename Cfg::TileKV{}));
  Tensor tdKrdK = partition_fragment_C(mma_kv, select<0, 1>(typename Cfg::TileKV{}));
  // P^T and dS^T in the A-operand register layout of dV and dK: ((2,2,2), 1, kBlockM/16). As in
  // the forward, element i of the S^T accumulator is element i of this layout.
  using ALayout = Layout<Shape<Shape<_2, _2, _2>, _1, Int<kBlockM / 16>>>;
  Tensor tKVrP = make_tensor<Element>(ALayout{});
  Tensor tKVrdS = make_tensor<Element>(ALayout{});
  static_assert(size(tdVrdV) == kHeadDim / 2);

  // dS^T to shared memory with transposing stmatrix, for the dQ product.
  auto store_ds = make_tiled_copy_C(Copy_Atom<SM90_U16x8_STSM_T, Element>{}, mma_sdp);
  auto thr_store_ds = store_ds.get_thread_slice(ctid);

  // This thread's rows (keys of S^T, dK, dV; q rows of dQ) and columns in the accumulators.
  const auto [row_in_group, col_base] = detail::fragment_coords();

  typename PipelineQ::PipelineState q_state, do_state;
  typename PipelineKV::PipelineState kv_state;
  typename PipelineItem::PipelineState item_state;
  int ds_stage = 0;

  auto convert = [](auto const& from, auto& to) {
    constexpr int n = decltype(size(from))::value;
    cutlass::NumericArrayConverter<Element, float, n> conv;
    *reinterpret_cast<cutlass::Array<Element, n>*>(to.data()) =
        conv(*reinterpret_cast<const cutlass::Array<float, n>*>(from.data()));
  };
  auto issue_ss = [](auto& mma, auto const& a, auto const& b, auto& c) {
    warpgroup_fence_operand(c);
    warpgroup_arrive();
    detail::issue_gemm<true>(mma, a, b, c);
    warpgroup_commit_batch();
  };
  auto issue_rs = [](auto& mma, auto& a, auto const& b, auto& c) {
    warpgroup_fence_operand(c);
    warpgroup_fence_operand(a);
    warpgroup_arrive();
    detail::issue_gemm<false>(mma, a, b, c);
    warpgroup_commit_batch();
  };

  // One q block [c0, c0 + kBlockM) of q head hq against this group's 64 keys.
  auto block = [&](int hq, int c0, const WorkEntry& entry, int key0) {
    // Accumulators of this block only, declared here so that they are dead between blocks (the
    // wgmma operands read them even when they overwrite them).
    Tensor tSrS = partition_fragment_C(mma_sdp, select<0, 1>(typename Cfg::TileSdP{}));
    Tensor tSrdP = partition_fragment_C(mma_sdp, select<0, 1>(typename Cfg::TileSdP{}));
    Tensor tdQrdQ = partition_fragment_C(mma_dq, select<0, 1>(typename Cfg::TileDQ{}));
    static_assert(size(tSrS) == kBlockM / 2 && size(tdQrdQ) == kHeadDim / 4);
    // The shared-memory operands, described here rather than once per kernel: hoisted out of
    // the loop, their wgmma descriptors (eight operands, one 64-bit descriptor per k step) would
    // not fit in registers beside the accumulators and would be spilled. The opaque zero keeps
    // the compiler from hoisting them.
    const int z = detail::opaque_zero();
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
    pipe_q.consumer_wait(q_state);
    issue_ss(mma_sdp, tSrK, tSrQ(_, _, _, q_state.index()), tSrS);
    pipe_do.consumer_wait(do_state);
    issue_ss(mma_sdp, tSrV, tSrdO(_, _, _, do_state.index()), tSrdP);
    warpgroup_wait<1>();
    warpgroup_fence_operand(tSrS);

    // This thread's columns of the statistics (the copies started up to 3 rows early).
    const float* lse2 = ss.lse2.data() + q_state.index() * kBwdStatsLoad + (c0 & 3) + col_base;
    const float* delta = ss.delta.data() + do_state.index() * kBwdStatsLoad + (c0 & 3) + col_base;
    detail::probabilities_t<kBlockM, kBlockN>(p, tSrS, entry, c0, key0,
                                              key0 + 64 * half + row_in_group, col_base, lse2);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrdP);
    detail::logit_gradients_t<kBlockM>(p, tSrS, tSrdP, lse2, delta);
    convert(tSrS, tKVrP);
    convert(tSrdP, tKVrdS);

    // dV += P^T dO while dS^T goes to shared memory for dQ.
    issue_rs(mma_kv, tKVrP, tKVrdO(_, _, _, do_state.index()), tdVrdV);
    if constexpr (Cfg::kAccumulateDq) {
      {
        Tensor rdS = make_tensor(tKVrdS.data(), tSrdP.layout());  // the accumulator's shape
        copy(store_ds, thr_store_ds.retile_S(rdS), tDSsdS(_, _, _, ds_stage));
      }
      cutlass::arch::fence_view_async_shared();  // the writes, visible to the tensor cores
      cutlass::arch::NamedBarrier::sync(256, static_cast<std::uint32_t>(BwdBarrier::kDsReady));
      issue_ss(mma_dq, tDQrdS(_, _, _, ds_stage), tDQrK, tdQrdQ);
    }
    issue_rs(mma_kv, tKVrdS, tKVrQ(_, _, _, q_state.index()), tdKrdK);
    warpgroup_wait<1>();  // dV (and dQ) done (groups complete in order)
    if constexpr (Cfg::kAccumulateDq) warpgroup_fence_operand(tdQrdQ);
    pipe_do.consumer_release(do_state);
    ++do_state;

    // This group's half of dQ into its staging tile, in the 128-byte swizzle of the TMA map (the
    // 16-byte chunk index XOR the row mod 8), once the writer's reductions have read the last
    // block's. A half-warp's 64-bit stores meet 2-way bank conflicts there (its 4 rows XOR onto
    // the same chunk pairs): staged in slabs of 8 columns instead, conflict-free, the reductions'
    // 32-byte rows cost more than the conflicts (bench/results/h200-backward-2026-12-03.md).
    // Rows past the entry are staged as zeros: the reduction adds the whole box, and those rows
    // may belong to another entry (or attend keys whose values are not finite).
    if constexpr (Cfg::kAccumulateDq) {
      detail::wait_dq_tile_free<Cfg>(half);
      float* dq_stage = ss.dq.data() + half * kBlockM * Cfg::kDqCols;
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int r = row_in_group + 8 * h;
        const bool live = c0 + r < int(entry.end);
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < Cfg::kDqCols / 8; ++j) {
          const int col = 8 * (j % 4) + col_base;  // within the panel
          const int chunk = (col / 4) ^ (r % 8);
          float* at = dq_stage + (j / 4) * kBlockM * kBwdDqBoxCols + r * kBwdDqBoxCols + chunk * 4 +
                      col % 4;
          *reinterpret_cast<float2*>(at) =
              live ? make_float2(tdQrdQ(2 * h + 4 * j), tdQrdQ(1 + 2 * h + 4 * j))
                   : make_float2(0.f, 0.f);
        }
      }
      detail::hand_over_dq_tile<Cfg>(half);
    }
    warpgroup_wait<0>();  // dK done: Q is no longer read
    warpgroup_fence_operand(tdKrdK);
    pipe_q.consumer_release(q_state);
    ++q_state;
    ds_stage ^= 1;
  };

  for (;;) {
    const int i = Cfg::Items::take(pipe_item, item_state, ss.items);
    if (i >= p.items) break;
    clear(tdKrdK);
    clear(tdVrdV);
    if (const detail::BwdItem it = detail::decode_bwd_item(p, i); it.e_begin != it.e_end) {
      const int key0 = it.tile * kBlockN;
      pipe_kv.consumer_wait(kv_state);
      detail::walk_unit(
          p, it, [&](int hq, int c0, const WorkEntry& entry) { block(hq, c0, entry, key0); });
      pipe_kv.consumer_release(kv_state);
      ++kv_state;
    }
    // Read again rather than kept across the walk, where its fields would take registers.
    const BwdUnit unit = p.units[i];
    if (unit.splits == 1 ||
        detail::sum_split_partials<Cfg>(p, unit, tdKrdK, tdVrdV, ctid, ss.last_unit))
      detail::write_dk_dv<Cfg>(p, unit, tdKrdK, tdVrdV, half);
  }
  if constexpr (Cfg::kAccumulateDq) {
    // The writer's release of this group's last tile: every barrier arrival has its sync.
    detail::wait_dq_tile_free<Cfg>(half);
  }
}

}  // namespace flexcp::sm90
