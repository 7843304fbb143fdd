// The Hopper backward kernel: one persistent CTA per SM walks (key tile, kv head) items busiest
// first. Warp group 0 is the producer (one thread issues every TMA load: the item's K and V once,
// then Q with lse2 and dO with delta per q block, for every q head of the group). Warp groups 1 and
// 2 each own 64 of the tile's 128 keys. Per q block (64 rows; 128 at head dim 64), each computes
//   S^T = K Q^T and dP^T = V dO^T           (wgmma, both operands in shared memory)
//   P^T = 2^(S^T log2(e) - lse2), masked    (registers; rows are keys, columns q rows)
//   dS^T = P^T (dP^T - delta) [(1 - t^2)]    (registers)
//   dV += P^T dO, dK += dS^T Q              (wgmma, P^T and dS^T from registers)
//   dQ = dS K                                (wgmma from shared memory: both groups' dS, each
//                                             group half of the head dimension, or at 128
//                                             rows half of the rows)
// stages its half of dQ in shared memory, from where the producer group's dQ writer warp adds it
// to the fp32 accumulator with TMA reductions (bwd_dq_writer.cuh). dK and dV are written once, at
// the end of the item (bwd_epilogue.cuh, with the partials of split items). This file assigns the
// roles and runs the item loop; the producer's loads and a group's products of one q block are
// the mainloop (bwd_mainloop.cuh). The preprocessing (delta, lse2) and postprocessing (dQ in the
// input dtype, the sink's gradient) are in bwd_rowstats.cu.
#pragma once

#include <cutlass/arch/reg_reconfig.h>
#include <cute/tensor.hpp>

#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/bwd_dq_writer.cuh"
#include "kernels/sm90/bwd_epilogue.cuh"
#include "kernels/sm90/bwd_items.cuh"
#include "kernels/sm90/bwd_mainloop.cuh"
#include "kernels/sm90/bwd_params.h"
#include "kernels/sm90/kernel_common.cuh"
#include "kernels/worklist/worklist.h"

namespace flexcp::sm90 {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    bwd_kernel(const __grid_constant__ BwdParams p) {
  using namespace cute;
  using PipelineQ = typename Cfg::PipelineQ;
  using PipelineKV = typename Cfg::PipelineKV;
  using PipelineItem = typename Cfg::PipelineItem;

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
    detail::load_bwd_items<Cfg>(p, ss, pipe_q, pipe_do, pipe_kv, pipe_item);
    return;
  }

  // ---- consumers ----
  cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
  const int ctid = threadIdx.x - 128;  // 0..255 over both consumer warp groups
  const int half = wg - 1;             // which 64 keys of the tile (and half of dQ)
  detail::BwdBlockMma<Cfg> mainloop(ctid, half);
  mainloop.clock.start();
  Tensor tdVrdV = mainloop.key_accumulator();
  Tensor tdKrdK = mainloop.key_accumulator();
  static_assert(size(tdVrdV) == Cfg::kHeadDim / 2);
  typename PipelineKV::PipelineState kv_state;
  typename PipelineItem::PipelineState item_state;

  using detail::BwdOutsidePhase;
  for (;;) {
    const int i = Cfg::Items::take(pipe_item, item_state, ss.items);
    mainloop.clock.mark_outside(int(BwdOutsidePhase::kTakeItem));
    if (i >= p.items) break;
    clear(tdKrdK);
    clear(tdVrdV);
    if (const detail::BwdItem it = detail::decode_bwd_item(p, i); it.e_begin != it.e_end) {
      const int key0 = it.tile * Cfg::kBlockN;
      pipe_kv.consumer_wait(kv_state);
      mainloop.clock.mark_outside(int(BwdOutsidePhase::kWaitKv));
      detail::walk_unit<Cfg::kBlockM>(p, it, [&](int hq, int c0, const WorkEntry& entry) {
        mainloop.block(p, ss, pipe_q, pipe_do, hq, c0, entry, key0, tdVrdV, tdKrdK);
      });
      pipe_kv.consumer_release(kv_state);
      ++kv_state;
    }
    // Read again rather than kept across the walk, where its fields would take registers.
    const BwdUnit unit = p.units[i];
    bool writes = unit.splits == 1;
    if (!writes)
      writes = unit.partials == BwdPartials::kChain
                   ? detail::chain_split_partials<Cfg>(p, unit, tdKrdK, tdVrdV, ctid)
                   : detail::sum_split_partials<Cfg>(p, unit, tdKrdK, tdVrdV, ctid, ss.last_unit);
    if (writes) detail::write_dk_dv<Cfg>(p, unit, tdKrdK, tdVrdV, half);
    mainloop.clock.mark_outside(int(BwdOutsidePhase::kWriteKv));
  }
  if constexpr (Cfg::kAccumulateDq) {
    // The writer's release of this group's last tile: every barrier arrival has its sync.
    detail::wait_dq_tile_free<Cfg>(half);
  }
  mainloop.clock.report(half);
}

}  // namespace flexcp::sm90
