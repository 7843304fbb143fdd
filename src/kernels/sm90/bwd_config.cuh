// The backward kernel's constants in one place: tile sizes, stages, register budgets and shared
// memory (each with its reason), the MMA and shared-memory layouts, and its named barriers.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include "kernels/sm90/bwd_params.h"
#include "kernels/sm90/kernel_common.cuh"
#include "kernels/sm90/tile_scheduler.cuh"

namespace flexcp::sm90 {

// The backward's named barriers (ids above CUTLASS's reserved ones).
enum class BwdBarrier : std::uint32_t {
  kDsReady = 0,        // both consumer groups have written their dS^T of the block to shared memory
  kDqStaged = 1,       // a group has staged its dQ of a block for the dQ writer's reductions
                       // (ids 1 and 2: one per group)
  kPartialStored = 3,  // a split item's unit: both groups have stored their dK/dV partials (and,
                       // the second time, thread 0 has said whether this unit is the last); a
                       // chained unit: its turn has come, and then its sum is stored
  kDqEmpty = 4,        // the dQ writer's reductions have read a group's tile (ids 4 and 5)
};

template <class Element_, int kHeadDim_, bool kAccumulateDq_ = true>
struct BwdConfig {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  // false in the deterministic mode: dQ is left to the q-tile-major pass (bwd_dq_kernel.cuh). A
  // template parameter, not a flag: tested at run time in the block loop it cost the default
  // mode 1-3% (measured, bench/results/h200-backward-2026-12-01.md).
  static constexpr bool kAccumulateDq = kAccumulateDq_;
  static constexpr int kBlockM = tiles::sm90_bwd_block_m(kHeadDim);  // q rows per block
  static constexpr int kBlockN = kBwdBlockN;                         // keys per CTA
  static constexpr int kStages = 2;    // Q and dO buffers: the next block loads meanwhile
  static constexpr int kDsStages = 2;  // dS buffers: one group may write the next block's dS
                                       // while the other still reads this one's for dQ
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kConsumerThreads = 128 * kConsumers;  // what the groups' barriers count
  // The producer warp group's second warp adds the consumers' staged dQ to the accumulator
  // (bwd_dq_writer.cuh), so that a group hands its tile over with an arrive (measured against
  // each group's leader issuing the reductions after a barrier of its group: 1.7-3.5% faster,
  // bench/results/h200-backward-2026-12-03.md). The first warp's first thread loads. The
  // deterministic mode has no dQ reductions, and no writer.
  static constexpr int kDqWriterWarp = 1;
  static constexpr int kDqWriterThreads = kAccumulateDq ? 32 : 0;
  static constexpr std::uint32_t kDqHandoffThreads = 128 + 32;  // a consumer group and the writer
  static constexpr int kPanels = kHeadDim / 64;  // 128-byte swizzle panels along D (one TMA box)
  // Register budgets: the consumers hold dK and dV (kHeadDim fp32 each), S^T, dP^T and dQ; the
  // producer (one thread) takes the rest. The pool is fixed at launch (the launch bound's share
  // of the 64K-register file, 168 per thread): 24 + 2 x 240 = 3 x 168 exactly. A larger producer
  // budget leaves the consumers' setmaxnreg waiting forever.
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(kProducerRegs + kConsumers * kConsumerRegs <= (kConsumers + 1) * kLaunchRegs);
  static_assert(kHeadDim % 64 == 0 && kBlockN == 64 * kConsumers);
  static_assert(kBlockM == 64 || (kBlockM == 128 && kHeadDim == 64));
  // The statistics a block reads (bwd_scratch.h).
  static constexpr int kStatsLoad = bwd_stats_span(kBlockM);
  static_assert(kStatsLoad <= kBwdStatsPad);
  // dQ's product and staging: each group takes a 64 x 64 part of the block's dQ, its rows when
  // the block has 128 (head dim 64), else half its columns, so that the accumulator and the
  // staged tile (kDqRows x kDqCols fp32 in panels one TMA box wide) are alike at both head dims.
  static constexpr bool kDqSplitRows = kBlockM == 2 * 64;
  static constexpr int kDqRows = kDqSplitRows ? kBlockM / 2 : kBlockM;
  static constexpr int kDqCols = kDqSplitRows ? kHeadDim : kHeadDim / 2;
  static constexpr int kDqPanels = kDqCols / kBwdDqBoxCols;
  static_assert(kDqRows == kBwdDqBoxRows && kDqCols % kBwdDqBoxCols == 0 &&
                kBwdDqBoxCols * sizeof(float) == 128);
  // Where group g's part starts in the block's dQ: its first row (from the block's) and column.
  __host__ __device__ static constexpr int dq_row_offset(int g) {
    return kDqSplitRows ? g * kDqRows : 0;
  }
  __host__ __device__ static constexpr int dq_first_col(int g) {
    return kDqSplitRows ? 0 : g * kDqCols;
  }

  using Atom2M = cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>;
  using Atom2N = cute::Layout<cute::Shape<cute::_1, cute::_2, cute::_1>>;
  // S^T and dP^T: M = keys (64 per group), N = q rows, K = head dim.
  using TileSdP = cute::Shape<cute::Int<kBlockN>, cute::Int<kBlockM>, cute::Int<kHeadDim>>;
  using MmaSdP = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, TileSdP>(), Atom2M{}));
  // dV and dK: M = keys, N = head dim, K = q rows; A (P^T, dS^T) from registers.
  using TileKV = cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>, cute::Int<kBlockM>>;
  using MmaKV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, TileKV, cute::GMMA::Major::K,
                                 cute::GMMA::Major::MN>(),
      Atom2M{}));
  // dQ: M = q rows, N = head dim, K = keys; per group kDqRows x kDqCols.
  using TileDQ = cute::Shape<cute::Int<kDqRows>, cute::Int<kDqCols>, cute::Int<kBlockN>>;
  using MmaDQ = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, TileDQ, cute::GMMA::Major::K,
                                 cute::GMMA::Major::MN>(),
      std::conditional_t<kDqSplitRows, Atom2M, Atom2N>{}));

  using SwizzleAtom = decltype(cute::GMMA::Layout_K_SW128_Atom<Element>{});
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SwizzleAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>, cute::Int<kStages>>{}));
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SwizzleAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{}));
  using SmemLayoutDs = decltype(cute::tile_to_shape(
      SwizzleAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>, cute::Int<kDsStages>>{}));
  // Transposed views (of the view, not of memory): Q and dO as (D, q rows) for the B operand of
  // dK and dV, K as (D, keys) for the B operand of dQ, dS as (keys, q rows) for its writers.
  using SmemLayoutQt = decltype(cute::composition(
      SmemLayoutQ{},
      cute::make_layout(
          cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockM>, cute::Int<kStages>>{},
          cute::Stride<cute::Int<kBlockM>, cute::_1, cute::Int<kBlockM * kHeadDim>>{})));
  using SmemLayoutKt = decltype(cute::composition(
      SmemLayoutKV{}, cute::make_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>>{},
                                        cute::Stride<cute::Int<kBlockN>, cute::_1>{})));
  using SmemLayoutDst = decltype(cute::composition(
      SmemLayoutDs{},
      cute::make_layout(
          cute::Shape<cute::Int<kBlockN>, cute::Int<kBlockM>, cute::Int<kDsStages>>{},
          cute::Stride<cute::Int<kBlockM>, cute::_1, cute::Int<kBlockM * kBlockN>>{})));

  using PipelineQ = cutlass::PipelineTmaAsync<kStages>;
  using PipelineKV = cutlass::PipelineTmaAsync<1>;
  using Items = ItemQueue<2>;  // item slots between the producer and the consumers
  using PipelineItem = typename Items::Pipeline;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutDs>, 1024> ds;
    cute::array_aligned<float, kBlockM * kHeadDim, 1024> dq;  // [group][panel][row][32], swizzled
    cute::array_aligned<float, kStatsLoad * kStages, 128> lse2;
    cute::array_aligned<float, kStatsLoad * kStages, 128> delta;
    typename PipelineQ::SharedStorage pipe_q;
    typename PipelineQ::SharedStorage pipe_do;
    typename PipelineKV::SharedStorage pipe_kv;
    typename Items::SharedStorage items;
    int last_unit;  // a split item's unit: whether it finished last (it writes dK and dV)
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm_90 CTA may have");

  static constexpr std::uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr std::uint32_t kStatsBytes = kStatsLoad * sizeof(float);
  static_assert(kStatsBytes % 16 == 0, "bulk copies move multiples of 16 bytes");
  static constexpr std::uint32_t kKVBytes = kBlockN * kHeadDim * sizeof(Element);
  // A split item's partials: each consumer thread's dK and dV fragments as float4s, thread-minor
  // ([kind][vector][thread]): every CTA holds the same fragments in the same threads, so a slot
  // is stored and read back in coalesced 512-byte rows per warp.
  static constexpr int kPartialVectors = kHeadDim / 8;  // float4s of one fragment (dK or dV)
  static_assert(2 * kPartialVectors * 4 * 128 * kConsumers == 2 * kBlockN * kHeadDim);
};

}  // namespace flexcp::sm90
