// The Hopper forward kernel: one persistent CTA per SM walks (q tile, kv head) items busiest first.
// Warp group 0 is the producer (one thread issues every TMA load); warp groups 1 and 2 each own 64
// of the tile's 128 rows and run S = Q K^T (wgmma, both operands in shared memory), the masked
// online softmax in registers, and O += P V (wgmma, P from registers). K and V flow through their
// own pipelines of kStages buffers. The two consumer groups take turns on the tensor cores (S of a
// block with P V of the one before), so that one group's softmax runs under the other's products;
// within a group, the softmax of S also runs while its P V product of the previous block finishes.
// Items follow one another without a gap: an item's last P V shares its turn with the next item's
// first S, and Q is double-buffered so that the next item's Q is already there. This file assigns
// the roles and runs the item loop; the producer's loads and a consumer group's steps are the
// mainloop (fwd_mainloop.cuh).
#pragma once

#include <cutlass/arch/reg_reconfig.h>
#include <cute/tensor.hpp>

#include "kernels/sm90/fwd_config.cuh"
#include "kernels/sm90/fwd_mainloop.cuh"
#include "kernels/sm90/fwd_params.h"
#include "kernels/sm90/kernel_common.cuh"

namespace flexcp::sm90 {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fwd_kernel(const __grid_constant__ FwdParams p) {
  using namespace cute;
  using PipelineQ = typename Cfg::PipelineQ;
  using PipelineKV = typename Cfg::PipelineKV;

  extern __shared__ char smem_raw[];
  auto& ss = *reinterpret_cast<typename Cfg::SharedStorage*>(
      (reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) & ~std::uintptr_t(1023));

  const int wg = threadIdx.x / 128;
  const bool producer = wg == 0;
  using Role = typename PipelineKV::ThreadCategory;
  const Role role = producer ? Role::Producer : Role::Consumer;
  const bool leader = threadIdx.x == 0;

  typename PipelineQ::Params qp;
  qp.transaction_bytes = Cfg::kQBytes;
  qp.role = static_cast<typename PipelineQ::ThreadCategory>(role);
  qp.is_leader = leader;
  qp.num_consumers = 128 * Cfg::kConsumers;
  typename PipelineKV::Params kvp;
  kvp.transaction_bytes = Cfg::kKVBytes;
  kvp.role = role;
  kvp.is_leader = leader;
  kvp.num_consumers = 128 * Cfg::kConsumers;
  PipelineQ pipe_q(ss.pipe_q, qp, Shape<_1, _1, _1>{});
  PipelineKV pipe_k(ss.pipe_k, kvp, Shape<_1, _1, _1>{});
  PipelineKV pipe_v(ss.pipe_v, kvp, Shape<_1, _1, _1>{});
  using PipelineItem = typename Cfg::PipelineItem;
  typename PipelineItem::Params ip;
  ip.role =
      producer ? PipelineItem::ThreadCategory::Producer : PipelineItem::ThreadCategory::Consumer;
  ip.producer_arv_count = 1;
  ip.consumer_arv_count = 128 * Cfg::kConsumers;
  PipelineItem pipe_item(ss.items.pipe, ip);
  __syncthreads();  // barriers initialised before anyone waits on them

  if (producer) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (threadIdx.x != 0) return;
    detail::load_fwd_items<Cfg>(p, ss, pipe_q, pipe_k, pipe_v, pipe_item);
    return;
  }

  // ---- consumers ----
  cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
  detail::FwdMainloop<Cfg> ml(p, ss, pipe_q, pipe_k, pipe_v, wg, threadIdx.x - 128);
  typename PipelineItem::PipelineState item_state;
  auto take_item = [&]() { return Cfg::Items::take(pipe_item, item_state, ss.items); };
  ml.clock.start();

  // Items follow one another on the tensor cores without a gap: the turn that runs an item's last
  // P V also runs the next item's first S, and this group's epilogue then overlaps the other
  // group's turn. Only the first item, and one after an item without blocks, starts with a turn
  // of its own for its first S.
  bool last = false;  // the block whose P is ready was its item's last
  for (int i = take_item(); i < p.items;) {
    ml.start_item(detail::decode_item(p, i));
    clear(ml.tOrO);
    if (ml.rows.it.e_begin == ml.rows.it.e_end) {
      i = take_item();
      ml.epilogue(ml.rows);
      continue;
    }
    ml.start_cursor();
    ml.wait_q();
    ml.wait_k();
    ml.turn_s();
    ml.template wait_s<0>();
    ml.release_k();
    last = ml.take_block();
    ml.softmax();
    ml.convert_p();
    // A chain of items with blocks: the turn that runs an item's last P V also runs the next
    // item's first S.
    for (;;) {
      // Each further block: one turn on the tensor cores issues its S and the previous block's
      // P V (the other group runs its softmax meanwhile). This group finds S's row maxima while
      // its own P V runs, waits for that product and rescales O, then exponentiates beside the
      // other group's products (wait_pv_and_rescale says why in that order).
      while (!last) {
        ml.clock.block();
        ml.wait_k();
        ml.clock.mark(detail::FwdPhase::kLoads);
        ml.turn_s_pv();
        ml.clock.mark(detail::FwdPhase::kTurn);
        ml.template wait_s<1>();
        ml.clock.mark(detail::FwdPhase::kWaitS);
        ml.release_k();
        last = ml.take_block();
        ml.clock.mark(detail::FwdPhase::kCursor);
        ml.softmax_max();
        ml.clock.mark(detail::FwdPhase::kMax);
        ml.wait_pv_and_rescale();
        ml.clock.mark(detail::FwdPhase::kWaitPv);
        ml.softmax_exp(0);
        ml.softmax_exp(1);
        ml.clock.mark(detail::FwdPhase::kExp);
        ml.release_v();
        ml.convert_p();
        ml.clock.mark(detail::FwdPhase::kConvert);
        ml.clock.end_block();
      }
      // The last block's P V, with the next item's first S when it has blocks.
      i = take_item();
      detail::Item next_item{};
      if (i < p.items) next_item = detail::decode_item(p, i);
      if (i >= p.items || next_item.e_begin == next_item.e_end) {
        ml.wait_v();
        ml.turn_pv();
        ml.wait_pv();
        ml.release_v();
        ml.epilogue(ml.rows);
        break;
      }
      ml.wait_q();
      ml.wait_k();
      ml.turn_s_pv();
      ml.template wait_s<1>();
      ml.release_k();
      ml.clock.mark_outside(int(detail::FwdOutsidePhase::kLastTurn));
      // The next item's first softmax runs while this item's last P V does (it reads P and
      // writes O, neither of which the softmax touches: S turns into P in fp32, in place); then
      // P is converted, which frees S's registers for this item's epilogue.
      const detail::Rows done = ml.rows;
      ml.start_item(next_item);
      ml.start_cursor();
      last = ml.take_block();
      ml.softmax();
      ml.wait_pv();
      ml.release_v();
      ml.convert_p();
      ml.clock.mark_outside(int(detail::FwdOutsidePhase::kFirstSoftmax));
      ml.epilogue(done);
      ml.clock.mark_outside(int(detail::FwdOutsidePhase::kEpilogue));
      clear(ml.tOrO);
    }
  }
  if (threadIdx.x % 128 == 0) tma_store_wait<0>();
  ml.clock.report(wg - 1);
}

}  // namespace flexcp::sm90
