// The forward kernel's constants in one place: tile sizes, stages, register budgets and shared
// memory (each with its reason), the MMA and shared-memory layouts, and its named barriers.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include "kernels/sm90/fwd_params.h"
#include "kernels/sm90/kernel_common.cuh"
#include "kernels/sm90/tile_scheduler.cuh"

namespace flexcp::sm90 {

// The forward's named barriers (ids above CUTLASS's reserved ones), one per consumer group each.
enum class FwdBarrier : std::uint32_t {
  kTurn = 0,     // ids 0 and 1: consumer group g's turn on the tensor cores
  kOStaged = 2,  // ids 2 and 3: group g's O staging tile is free, then written
};

template <class Element_, int kHeadDim_>
struct FwdConfig {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = tiles::sm90_fwd_block_n(kHeadDim);
  static constexpr int kStages = kHeadDim <= 64 ? 3 : 2;
  // Two Q buffers: the next item's Q loads while this one's last blocks run.
  static constexpr int kQStages = 2;
  static constexpr int kConsumers = 2;  // warp groups of 64 rows each
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kConsumerThreads = 128 * kConsumers;  // what the groups' barriers count
  // Register budgets: the consumers hold O (kHeadDim / 2 fp32 a thread), S (kBlockN / 2), P in
  // the input dtype and the softmax's state; the producer (one thread issuing loads) takes the
  // rest. The pool is fixed at launch (the launch bound's share of the 64K-register file, 168 a
  // thread): 40 + 2 x 232 <= 3 x 168. FlashAttention-3's and -4's split, 24 + 2 x 240, spills the
  // producer's walk over entries and blocks (56-byte stack, 91 local loads and stores, 2026-12-04)
  // and leaves the consumers' code as it is.
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static_assert(kProducerRegs + kConsumers * kConsumerRegs <= (kConsumers + 1) * kLaunchRegs);
  static constexpr int kPanels = kHeadDim / 64;  // 128-byte swizzle panels along D (one TMA box)
  static_assert(kHeadDim % 64 == 0 && kBlockM == 64 * kConsumers);

  using TileQK = cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>, cute::Int<kHeadDim>>;
  using TilePV = cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>, cute::Int<kBlockN>>;
  using AtomLayout = cute::Layout<cute::Shape<cute::Int<kConsumers>, cute::_1, cute::_1>>;
  using MmaQK = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, TileQK>(), AtomLayout{}));
  using MmaPV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, TilePV, cute::GMMA::Major::K,
                                 cute::GMMA::Major::MN>(),
      AtomLayout{}));

  using SwizzleAtom = decltype(cute::GMMA::Layout_K_SW128_Atom<Element>{});
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SwizzleAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>, cute::Int<kQStages>>{}));
  using SmemLayoutO = decltype(cute::tile_to_shape(
      SwizzleAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SwizzleAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>, cute::Int<kStages>>{}));
  // V read as the B operand of P V: (D, keys, stage), keys being the reduction (MN-major) mode.
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutKV{},
      cute::make_layout(
          cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>, cute::Int<kStages>>{},
          cute::Stride<cute::Int<kBlockN>, cute::_1, cute::Int<kBlockN * kHeadDim>>{})));

  using PipelineQ = cutlass::PipelineTmaAsync<kQStages>;
  using PipelineKV = cutlass::PipelineTmaAsync<kStages>;
  // Item indices, handed from the producer thread (which takes them from the global counter) to
  // the consumers.
  using Items = ItemQueue<2>;  // item slots between the producer and the consumers
  using PipelineItem = typename Items::Pipeline;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutO>, 1024> o;  // staged for the TMA store
    typename PipelineQ::SharedStorage pipe_q;
    typename PipelineKV::SharedStorage pipe_k;
    typename PipelineKV::SharedStorage pipe_v;
    typename Items::SharedStorage items;
  };
  // The dynamic shared memory base is only 16-byte aligned; the kernel rounds it up.
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm_90 CTA may have");

  static constexpr std::uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr std::uint32_t kKVBytes = kBlockN * kHeadDim * sizeof(Element);
};

}  // namespace flexcp::sm90
