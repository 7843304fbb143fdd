// The Hopper forward kernel: one persistent CTA per SM walks (q tile, kv head) items busiest first.
// Warp group 0 is the producer (one thread issues every TMA load); warp groups 1 and 2 each own 64
// of the tile's 128 rows and run S = Q K^T (wgmma, both operands in shared memory), the masked
// online softmax in registers, and O += P V (wgmma, P from registers). K and V flow through their
// own pipelines of kStages buffers. The two consumer groups take turns on the tensor cores (S of a
// block with P V of the one before), so that one group's softmax runs under the other's products;
// within a group, the softmax of S also runs while its P V product of the previous block finishes.
// Items follow one another without a gap: an item's last P V shares its turn with the next item's
// first S, and Q is double-buffered so that the next item's Q is already there.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/numeric_conversion.h>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include "kernels/lse_merge.h"
#include "kernels/sm90/fwd_config.cuh"
#include "kernels/sm90/fwd_epilogue.cuh"
#include "kernels/sm90/fwd_params.h"
#include "kernels/sm90/fwd_softmax.cuh"
#include "kernels/sm90/kernel_common.cuh"
#include "kernels/sm90/tile_scheduler.cuh"

namespace flexcp::sm90 {

namespace detail {

// Items run kv head by kv head (busiest tiles first within each), so that the CTAs running at one
// time stream the K/V of one head and share it through L2. CTAs take the next item when they are
// ready for it (a global counter), which keeps them balanced whatever the tiles' sizes.
__device__ __forceinline__ Item decode_item(const FwdParams& p, int i) {
  const int per_head = p.num_tiles * p.head_blocks;
  Item it;
  it.kv_head = i / per_head;
  const int rest = i % per_head;
  it.tile = p.work.tile_order[rest / p.head_blocks];
  it.head0 = it.kv_head * p.group + (rest % p.head_blocks) * p.pack;
  it.e_begin = int(p.work.tile_offsets[it.tile]);
  it.e_end = int(p.work.tile_offsets[it.tile + 1]);
  return it;
}

}  // namespace detail

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fwd_kernel(const __grid_constant__ FwdParams p) {
  using namespace cute;
  using Element = typename Cfg::Element;
  using PipelineQ = typename Cfg::PipelineQ;
  using PipelineKV = typename Cfg::PipelineKV;
  constexpr int kHeadDim = Cfg::kHeadDim;

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
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x != 0) return;
    prefetch_tma_descriptor(&p.tma_q);
    if (p.seqlen_k > 0) {  // without keys the K/V maps are left empty
      prefetch_tma_descriptor(&p.tma_k);
      prefetch_tma_descriptor(&p.tma_v);
    }
    constexpr std::uint64_t kHint = static_cast<std::uint64_t>(TMA::CacheHintSm90::EVICT_NORMAL);
    auto q_state = cutlass::make_producer_start_state<PipelineQ>();
    auto k_state = cutlass::make_producer_start_state<PipelineKV>();
    auto v_state = cutlass::make_producer_start_state<PipelineKV>();
    auto item_state = cutlass::make_producer_start_state<PipelineItem>();
    using Items = typename Cfg::Items;
    for (int i = blockIdx.x;; i = Items::next(p.work.scheduler)) {
      Items::publish(pipe_item, item_state, ss.items, i);
      if (i >= p.items) {
        Items::retire(p.work.scheduler);
        break;
      }
      const detail::Item it = detail::decode_item(p, i);
      if (it.e_begin == it.e_end) continue;
      pipe_q.producer_acquire(q_state);
      Element* q_dst = ss.q.data() + q_state.index() * kBlockM * kHeadDim;
      for (int c = 0; c < Cfg::kPanels; ++c)
        SM90_TMA_LOAD_3D::copy(&p.tma_q, pipe_q.producer_get_barrier(q_state), kHint,
                               q_dst + c * kBlockM * 64, c * 64, it.tile << p.rows_log2, it.head0);
      ++q_state;
      for (int e = it.e_begin; e < it.e_end; ++e) {
        const WorkEntry entry = p.work.entries[e];
        for (std::int64_t c0 = entry.begin; c0 < entry.end; c0 += kBlockN) {
          pipe_k.producer_acquire(k_state);
          Element* k_dst = ss.k.data() + k_state.index() * kBlockN * kHeadDim;
          for (int c = 0; c < Cfg::kPanels; ++c)
            SM90_TMA_LOAD_3D::copy(&p.tma_k, pipe_k.producer_get_barrier(k_state), kHint,
                                   k_dst + c * kBlockN * 64, c * 64, int(c0), it.kv_head);
          ++k_state;
          pipe_v.producer_acquire(v_state);
          Element* v_dst = ss.v.data() + v_state.index() * kBlockN * kHeadDim;
          for (int c = 0; c < Cfg::kPanels; ++c)
            SM90_TMA_LOAD_3D::copy(&p.tma_v, pipe_v.producer_get_barrier(v_state), kHint,
                                   v_dst + c * kBlockN * 64, c * 64, int(c0), it.kv_head);
          ++v_state;
        }
      }
    }
    return;
  }

  // ---- consumers ----
  cutlass::arch::warpgroup_reg_alloc<232>();
  const int ctid = threadIdx.x - 128;  // 0..255 over both consumer warp groups
  typename Cfg::MmaQK mma_qk;
  typename Cfg::MmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(ctid);
  auto thr_pv = mma_pv.get_thread_slice(ctid);
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Cfg::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Cfg::SmemLayoutKV{});
  Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename Cfg::SmemLayoutVt{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);
  Tensor tSrK = thr_qk.partition_fragment_B(sK);
  Tensor tOrV = thr_pv.partition_fragment_B(sVt);
  Tensor tSrS = partition_fragment_C(mma_qk, select<0, 1>(typename Cfg::TileQK{}));
  Tensor tOrO = partition_fragment_C(mma_pv, select<0, 1>(typename Cfg::TilePV{}));
  Tensor sO = make_tensor(make_smem_ptr(ss.o.data()), typename Cfg::SmemLayoutO{});
  // O goes to shared memory with stmatrix (16 bytes per instruction, shared-space addresses).
  auto store_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_pv);
  auto thr_store_o = store_o.get_thread_slice(ctid);
  Tensor tOsO = thr_store_o.partition_D(sO);
  // P in the A-operand register layout of P V: ((2,2,2), 1, kBlockN/16). Element i of the
  // accumulator S, i = c + 2*half + 4*j (column pair c, row half, column group j), is element i
  // of this layout, so the conversion is a plain element-wise copy.
  Tensor tOrP = make_tensor<Element>(Layout<Shape<Shape<_2, _2, _2>, _1, Int<kBlockN / 16>>>{});
  static_assert(size(tSrS) == kBlockN / 2 && size(tOrO) == kHeadDim / 2);

  // This thread's two rows of the tile (the accumulator layout of a 64xN wgmma) and column base.
  const int lane = threadIdx.x % 32;
  const int row_in_tile = (wg - 1) * 64 + ((threadIdx.x / 32) % 4) * 16 + lane / 4;
  const int col_base = 2 * (lane % 4);
  const int rows_mask = (1 << p.rows_log2) - 1;
  constexpr float kNegInf = -INFINITY;

  // Turn-taking on the tensor cores: named barrier c is consumer warp group c's turn; the second
  // group's first arrival lets the first one start.
  constexpr auto kTurn = static_cast<std::uint32_t>(FwdBarrier::kTurn);
  const std::uint32_t my_turn = kTurn + wg - 1, other_turn = kTurn + 2 - wg;
  if (wg == 2) cutlass::arch::NamedBarrier::arrive(256, kTurn);

  typename PipelineQ::PipelineState q_state;
  typename PipelineKV::PipelineState k_state;
  typename PipelineKV::PipelineState v_state;
  typename PipelineItem::PipelineState item_state;
  auto take_item = [&]() { return Cfg::Items::take(pipe_item, item_state, ss.items); };

  detail::Rows rows{};
  auto start_item = [&](const detail::Item& next) {
    rows.it = next;
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int m = row_in_tile + 8 * h;
      rows.token[h] = (next.tile << p.rows_log2) + (m & rows_mask);
      rows.head[h] = next.head0 + (m >> p.rows_log2);
      rows.max[h] = kNegInf;
      rows.sum[h] = 0.f;
    }
  };

  // The block cursor: entry e and the first column c0 of the next block to issue. Kept in 32 bits
  // (the host checks the sizes); the band is read only for blocks that need masking.
  int e = 0, c0 = 0, end = 0;
  WorkEntry entry{};
  auto start_cursor = [&]() {
    e = rows.it.e_begin;
    entry = p.work.entries[e];
    c0 = int(entry.begin);
    end = int(entry.end);
  };
  // The block whose S was just computed; moves the cursor on. Returns whether it was the item's
  // last (and then lets Q go).
  int blk_c0 = 0, blk_end = 0, blk_band = 0;
  EntryMask blk_mask = EntryMask::kNone;
  auto take_block = [&]() {
    blk_c0 = c0;
    blk_end = end;
    blk_band = entry.band;
    blk_mask = entry.mask;
    c0 += kBlockN;
    if (c0 < end) return false;
    if (++e == rows.it.e_end) {  // Q is no longer read: the producer may load a later item's
      pipe_q.consumer_release(q_state);
      ++q_state;
      return true;
    }
    entry = p.work.entries[e];
    c0 = int(entry.begin);
    end = int(entry.end);
    return false;
  };
  // Softcap, mask and online softmax of S in place (S becomes P in fp32, fwd_softmax.cuh);
  // `correction` rescales what O accumulated before.
  float correction[2];
  auto softmax = [&]() {
    detail::online_softmax<kBlockN>(p, tSrS, {blk_c0, blk_end, blk_band, blk_mask}, rows, col_base,
                                    correction);
  };
  auto convert_p = [&]() {
    cutlass::NumericArrayConverter<Element, float, decltype(size(tSrS))::value> convert;
    using From = cutlass::Array<float, decltype(size(tSrS))::value>;
    using To = cutlass::Array<Element, decltype(size(tSrS))::value>;
    *reinterpret_cast<To*>(tOrP.data()) = convert(*reinterpret_cast<const From*>(tSrS.data()));
  };

  // One committed group each: S = Q K^T of the current K stage, O += P V of the current V.
  auto issue_s = [&]() {
    warpgroup_fence_operand(tSrS);
    warpgroup_arrive();
    detail::issue_gemm<true>(mma_qk, tSrQ(_, _, _, q_state.index()), tSrK(_, _, _, k_state.index()),
                             tSrS);
    warpgroup_commit_batch();
  };
  auto issue_pv = [&]() {
    warpgroup_fence_operand(tOrO);
    warpgroup_fence_operand(tOrP);
    warpgroup_arrive();
    detail::issue_gemm<false>(mma_pv, tOrP, tOrV(_, _, _, v_state.index()), tOrO);
    warpgroup_commit_batch();
  };
  // One turn on the tensor cores: issue this group's products, then hand the turn over.
  auto turn = [&](auto&... issue) {
    cutlass::arch::NamedBarrier::sync(256, my_turn);
    (issue(), ...);
    cutlass::arch::NamedBarrier::arrive(256, other_turn);
  };
  auto wait_pv = [&]() {
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
    warpgroup_fence_operand(tOrP);
  };
  auto release_k = [&]() {
    pipe_k.consumer_release(k_state);
    ++k_state;
  };
  auto release_v = [&]() {
    pipe_v.consumer_release(v_state);
    ++v_state;
  };

  // Epilogue (fwd_epilogue.cuh): normalise and fold in the sink; lse straight from registers,
  // out through shared memory and this group's own TMA store, which runs on while the next item
  // starts.
  auto epilogue = [&](const detail::Rows& r) {
    detail::write_out_lse<Cfg>(p, r, tOrO, store_o, thr_store_o, tOsO, ss.o.data(), wg - 1, ctid);
  };

  // Items follow one another on the tensor cores without a gap: the turn that runs an item's last
  // P V also runs the next item's first S, and this group's epilogue then overlaps the other
  // group's turn. Only the first item, and one after an item without blocks, starts with a turn
  // of its own for its first S.
  bool last = false;  // the block whose P is ready was its item's last
  for (int i = take_item(); i < p.items;) {
    start_item(detail::decode_item(p, i));
    clear(tOrO);
    if (rows.it.e_begin == rows.it.e_end) {
      i = take_item();
      epilogue(rows);
      continue;
    }
    start_cursor();
    pipe_q.consumer_wait(q_state);
    pipe_k.consumer_wait(k_state);
    turn(issue_s);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    release_k();
    last = take_block();
    softmax();
    convert_p();
    // A chain of items with blocks: the turn that runs an item's last P V also runs the next
    // item's first S.
    for (;;) {
      // Each further block: one turn on the tensor cores issues its S and the previous block's
      // P V (the other group runs its softmax meanwhile); this group's softmax of S then
      // overlaps its own P V, and O is rescaled once that product has landed.
      while (!last) {
        pipe_k.consumer_wait(k_state);
        pipe_v.consumer_wait(v_state);
        turn(issue_s, issue_pv);
        warpgroup_wait<1>();
        warpgroup_fence_operand(tSrS);
        release_k();
        last = take_block();
        softmax();
        // Once the row maxima settle, most blocks leave them unchanged: skip the rescale when no
        // row of the warp moved (a warp-uniform test). The wait for P V sits in both arms on
        // purpose: ptxas hoists a wgmma wait to the top of its basic block, so the wait must
        // start a block that follows the whole softmax, or the softmax would not overlap the
        // product. The row-sum term (never true: sums are >= 0, NaN aside) makes the branch read
        // every exponential, so that none of them is sunk below it.
        if (__any_sync(0xffffffffu, correction[0] != 1.f || correction[1] != 1.f ||
                                        !(rows.sum[0] + rows.sum[1] >= 0.f))) {
          wait_pv();
          CUTLASS_PRAGMA_UNROLL
          for (int h = 0; h < 2; ++h) CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < kHeadDim / 8; ++j) {
            tOrO(2 * h + 4 * j) *= correction[h];
            tOrO(1 + 2 * h + 4 * j) *= correction[h];
          }
        } else {
          wait_pv();
        }
        release_v();
        convert_p();
      }
      // The last block's P V, with the next item's first S when it has blocks.
      i = take_item();
      detail::Item next_item{};
      if (i < p.items) next_item = detail::decode_item(p, i);
      if (i >= p.items || next_item.e_begin == next_item.e_end) {
        pipe_v.consumer_wait(v_state);
        turn(issue_pv);
        wait_pv();
        release_v();
        epilogue(rows);
        break;
      }
      pipe_q.consumer_wait(q_state);
      pipe_k.consumer_wait(k_state);
      pipe_v.consumer_wait(v_state);
      turn(issue_s, issue_pv);
      wait_pv();
      warpgroup_fence_operand(tSrS);
      release_k();
      release_v();
      // The next item's first softmax before this item's epilogue: S is then free, which leaves
      // the registers for the epilogue.
      const detail::Rows done = rows;
      start_item(next_item);
      start_cursor();
      last = take_block();
      softmax();
      convert_p();
      epilogue(done);
      clear(tOrO);
    }
  }
  if (ctid % 128 == 0) tma_store_wait<0>();
}

}  // namespace flexcp::sm90
