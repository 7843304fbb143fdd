// The deterministic backward's dQ pass: q-tile-major, so that one CTA owns the dQ rows of a (q
// tile, q head) item, sums them over the key blocks of its row-major work list in one fixed order
// and writes them once: the same bits on every run. (The default mode sums dQ in the main kernel
// with TMA reductions, in arrival order.) One persistent CTA per SM takes items busiest first.
// Warp group 0 is the producer (one thread: Q, dO and their row statistics once per item, two
// stages; K and V per block of keys, two stages). Warp groups 1 and 2 each own 64 of the tile's
// 128 rows and run, per block of 64 keys,
//   S = Q K^T and dP = dO V^T          (wgmma, both operands in shared memory)
//   P = 2^(S log2(e) - lse2), masked   (registers, the one in-tile rule on the row-major bands)
//   dS = P (dP - delta) [(1 - t^2)]    (registers)
//   dQ += dS K                         (wgmma, dS from registers, as the forward's P V)
// independently of each other (no barrier between the groups), and write dQ scaled, in the input
// dtype. The main kernel then skips its dQ product; the statistics come from the same
// preprocessing.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/numeric_conversion.h>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include "kernels/sm90/bwd_common.cuh"
#include "kernels/sm90/bwd_dq_config.cuh"
#include "kernels/sm90/bwd_params.h"
#include "kernels/sm90/kernel_common.cuh"
#include "kernels/sm90/tile_scheduler.cuh"
#include "kernels/worklist/worklist.h"

namespace flexcp::sm90 {

namespace detail {

struct BwdDqItem {
  int tile, head, kv_head;
  int e_begin, e_end;
};

// Items run q head by q head (busiest tiles first within each), so that the CTAs running at one
// time read one kv head's K and V through L2.
__device__ __forceinline__ BwdDqItem decode_bwd_dq_item(const BwdDqParams& p, int i) {
  BwdDqItem it;
  it.head = i / p.num_tiles;
  it.kv_head = it.head / p.group;
  it.tile = p.work.tile_order[i % p.num_tiles];
  it.e_begin = int(p.work.tile_offsets[it.tile]);
  it.e_end = int(p.work.tile_offsets[it.tile + 1]);
  return it;
}

}  // namespace detail

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    bwd_dq_kernel(const __grid_constant__ BwdDqParams p) {
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
  PipelineQ pipe_q(ss.pipe_q,
                   detail::tma_pipeline_params<PipelineQ>(
                       producer, 2 * (Cfg::kQBytes + Cfg::kStatsBytes), kConsumerThreads),
                   Shape<_1, _1, _1>{});
  PipelineKV pipe_kv(
      ss.pipe_kv,
      detail::tma_pipeline_params<PipelineKV>(producer, 2 * Cfg::kKVBytes, kConsumerThreads),
      Shape<_1, _1, _1>{});
  PipelineItem pipe_item(ss.items.pipe, Cfg::Items::params(producer, kConsumerThreads));
  __syncthreads();  // barriers initialised before anyone waits on them

  if (producer) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (threadIdx.x != 0) return;
    prefetch_tma_descriptor(&p.tma_q);
    prefetch_tma_descriptor(&p.tma_do);
    prefetch_tma_descriptor(&p.tma_k);
    prefetch_tma_descriptor(&p.tma_v);
    auto q_state = cutlass::make_producer_start_state<PipelineQ>();
    auto kv_state = cutlass::make_producer_start_state<PipelineKV>();
    Cfg::Items::produce(pipe_item, ss.items, p.work.scheduler, p.items, [&](int i) {
      const detail::BwdDqItem it = detail::decode_bwd_dq_item(p, i);
      if (it.e_begin == it.e_end) return;
      const int row0 = it.tile * kBlockM;
      pipe_q.producer_acquire(q_state);
      auto* bar_q = pipe_q.producer_get_barrier(q_state);
      const int qs = q_state.index();
      using detail::load_tile;
      load_tile<Cfg::kPanels, kBlockM>(&p.tma_q, bar_q, ss.q.data() + qs * kBlockM * kHeadDim, row0,
                                       it.head);
      load_tile<Cfg::kPanels, kBlockM>(&p.tma_do, bar_q, ss.dout.data() + qs * kBlockM * kHeadDim,
                                       row0, it.head);
      const std::int64_t stats = it.head * p.stats_stride + row0;
      SM90_BULK_COPY_G2S::copy(p.lse2 + stats, bar_q, ss.lse2.data() + qs * kBlockM,
                               Cfg::kStatsBytes);
      SM90_BULK_COPY_G2S::copy(p.delta + stats, bar_q, ss.delta.data() + qs * kBlockM,
                               Cfg::kStatsBytes);
      ++q_state;
      for (int e = it.e_begin; e < it.e_end; ++e) {
        const WorkEntry entry = p.work.entries[e];
        for (int k0 = int(entry.begin); k0 < int(entry.end); k0 += kBlockN) {
          pipe_kv.producer_acquire(kv_state);
          auto* bar_kv = pipe_kv.producer_get_barrier(kv_state);
          const int ks = kv_state.index();
          load_tile<Cfg::kPanels, kBlockN>(&p.tma_k, bar_kv, ss.k.data() + ks * kBlockN * kHeadDim,
                                           k0, it.kv_head);
          load_tile<Cfg::kPanels, kBlockN>(&p.tma_v, bar_kv, ss.v.data() + ks * kBlockN * kHeadDim,
                                           k0, it.kv_head);
          ++kv_state;
        }
      }
    });
    return;
  }

  // ---- consumers ----
  cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
  const int ctid = threadIdx.x - 128;  // 0..255 over both consumer warp groups
  const int half = wg - 1;             // which 64 rows of the tile
  typename Cfg::MmaS mma_s;
  typename Cfg::MmaDQ mma_dq;
  auto thr_s = mma_s.get_thread_slice(ctid);
  auto thr_dq = mma_dq.get_thread_slice(ctid);

  Tensor tdQrdQ = partition_fragment_C(mma_dq, select<0, 1>(typename Cfg::TileDQ{}));
  static_assert(size(tdQrdQ) == kHeadDim / 2);
  // dS in the A-operand register layout of dQ: element i of the S accumulator is element i here.
  using ALayout = Layout<Shape<Shape<_2, _2, _2>, _1, Int<kBlockN / 16>>>;
  Tensor tDQrdS = make_tensor<Element>(ALayout{});

  // This thread's rows (of its group's 64) and columns in the accumulators.
  const auto [row_in_group, col_base] = detail::fragment_coords();

  typename PipelineQ::PipelineState q_state;
  typename PipelineKV::PipelineState kv_state;
  typename PipelineItem::PipelineState item_state;

  auto issue_ss = [](auto& mma, auto const& a, auto const& b, auto& c) {
    warpgroup_fence_operand(c);
    warpgroup_arrive();
    detail::issue_gemm<true>(mma, a, b, c);
    warpgroup_commit_batch();
  };

  // One block of keys [k0, k0 + kBlockN) of an entry, for this group's rows (tokens row[h]).
  auto block = [&](const WorkEntry& entry, int k0, const int(&row)[2], const float(&lse2)[2],
                   const float(&delta)[2], int qs) {
    Tensor tSrS = partition_fragment_C(mma_s, select<0, 1>(typename Cfg::TileS{}));
    Tensor tSrdP = partition_fragment_C(mma_s, select<0, 1>(typename Cfg::TileS{}));
    static_assert(size(tSrS) == kBlockN / 2);
    // Shared-memory operands described here, not hoisted (see bwd_kernel.cuh).
    const int z = detail::opaque_zero();
    auto smem = [z](auto* data, auto layout) {
      return make_tensor(make_smem_ptr(data + z), layout);
    };
    Tensor tSrQ = thr_s.partition_fragment_A(smem(ss.q.data(), typename Cfg::SmemLayoutQ{}));
    Tensor tSrdO = thr_s.partition_fragment_A(smem(ss.dout.data(), typename Cfg::SmemLayoutQ{}));
    Tensor tSrK = thr_s.partition_fragment_B(smem(ss.k.data(), typename Cfg::SmemLayoutKV{}));
    Tensor tSrV = thr_s.partition_fragment_B(smem(ss.v.data(), typename Cfg::SmemLayoutKV{}));
    Tensor tDQrK = thr_dq.partition_fragment_B(smem(ss.k.data(), typename Cfg::SmemLayoutKt{}));

    pipe_kv.consumer_wait(kv_state);
    const int ks = kv_state.index();
    issue_ss(mma_s, tSrQ(_, _, _, qs), tSrK(_, _, _, ks), tSrS);
    issue_ss(mma_s, tSrdO(_, _, _, qs), tSrV(_, _, _, ks), tSrdP);
    warpgroup_wait<1>();
    warpgroup_fence_operand(tSrS);

    detail::logits_log2(p, tSrS);
    const int end = int(entry.end);
    if (entry.mask != EntryMask::kNone || k0 + kBlockN > end) {
      const Band band = p.work.bands[entry.band];
      int lo32[2], hi32[2];  // relative to this thread's first column, col_base
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        const BlockColumns cols = attended_columns(band, entry.mask, row[h], k0, end, kBlockN);
        lo32[h] = int(cols.lo) - col_base;
        hi32[h] = int(cols.hi) - col_base;
      }
      detail::mask_outside<kBlockN>(tSrS, lo32, hi32, col_base);
    }
    CUTLASS_PRAGMA_UNROLL
    for (int x = 0; x < size(tSrS); ++x)
      tSrS(x) = detail::exp2_approx(tSrS(x) - lse2[(x >> 1) & 1]);

    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrdP);
    auto grad_s = [&](auto softcapped) {
      CUTLASS_PRAGMA_UNROLL
      for (int x = 0; x < size(tSrS); ++x) {
        const int h = (x >> 1) & 1;
        tSrdP(x) = detail::grad_logit<decltype(softcapped)::value>(tSrS(x), tSrdP(x), delta[h],
                                                                   lse2[h], p.softcap_t);
      }
    };
    if (p.softcap > 0.f)
      grad_s(std::true_type{});
    else
      grad_s(std::false_type{});
    {
      constexpr int n = decltype(size(tSrdP))::value;
      cutlass::NumericArrayConverter<Element, float, n> conv;
      *reinterpret_cast<cutlass::Array<Element, n>*>(tDQrdS.data()) =
          conv(*reinterpret_cast<const cutlass::Array<float, n>*>(tSrdP.data()));
    }

    warpgroup_fence_operand(tdQrdQ);
    warpgroup_fence_operand(tDQrdS);
    warpgroup_arrive();
    detail::issue_gemm<false>(mma_dq, tDQrdS, tDQrK(_, _, _, ks), tdQrdQ);
    warpgroup_commit_batch();
    warpgroup_wait<0>();  // K and V are no longer read
    warpgroup_fence_operand(tdQrdQ);
    pipe_kv.consumer_release(kv_state);
    ++kv_state;
  };

  // dq = scale * dQ of the item's rows, from registers; rows past the end are not written.
  auto epilogue = [&](const detail::BwdDqItem& it, const int(&row)[2]) {
    using Pair = cutlass::Array<Element, 2>;
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      if (row[h] >= p.seqlen_q) continue;
      Element* dq = static_cast<Element*>(p.dq) + std::int64_t(row[h]) * p.dq_stride_t +
                    std::int64_t(it.head) * p.dq_stride_h + col_base;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kHeadDim / 8; ++j) {
        Pair d2;
        d2[0] = Element(tdQrdQ(2 * h + 4 * j) * p.scale);
        d2[1] = Element(tdQrdQ(1 + 2 * h + 4 * j) * p.scale);
        *reinterpret_cast<Pair*>(dq + 8 * j) = d2;
      }
    }
  };

  for (;;) {
    const int i = Cfg::Items::take(pipe_item, item_state, ss.items);
    if (i >= p.items) break;
    const detail::BwdDqItem it = detail::decode_bwd_dq_item(p, i);
    const int local0 = 64 * half + row_in_group;  // this thread's first row within the tile
    const int row[2] = {it.tile * kBlockM + local0, it.tile * kBlockM + local0 + 8};
    clear(tdQrdQ);
    if (it.e_begin != it.e_end) {
      pipe_q.consumer_wait(q_state);
      const int qs = q_state.index();
      const float lse2[2] = {ss.lse2[qs * kBlockM + local0], ss.lse2[qs * kBlockM + local0 + 8]};
      const float delta[2] = {ss.delta[qs * kBlockM + local0], ss.delta[qs * kBlockM + local0 + 8]};
      for (int e = it.e_begin; e < it.e_end; ++e) {
        const WorkEntry entry = p.work.entries[e];
        for (int k0 = int(entry.begin); k0 < int(entry.end); k0 += kBlockN)
          block(entry, k0, row, lse2, delta, qs);
      }
      pipe_q.consumer_release(q_state);
      ++q_state;
    }
    epilogue(it, row);
  }
}

}  // namespace flexcp::sm90
