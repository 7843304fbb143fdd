// The deterministic dQ pass's constants in one place: tile sizes, stages, register budgets and
// shared memory (each with its reason), the MMA and shared-memory layouts.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include "kernels/sm90/bwd_params.h"
#include "kernels/sm90/kernel_common.cuh"
#include "kernels/sm90/tile_scheduler.cuh"

namespace flexcp::sm90 {

template <class Element_, int kHeadDim_>
struct BwdDqConfig {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBwdDqBlockM;  // q rows per CTA (64 per consumer group)
  static constexpr int kBlockN = kBwdDqBlockN;  // keys per block
  static constexpr int kQStages = 2;  // the next item's Q and dO load during this one's last blocks
  static constexpr int kKVStages = 2;  // the next block's K and V load during this one
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kPanels = kHeadDim / 64;  // 128-byte swizzle panels along D (one TMA box)
  // Register budgets as in the main kernel (24 + 2 x 240 = 3 x 168, the pool fixed at launch):
  // the consumers hold dQ (kHeadDim / 2 fp32), S and dP (kBlockN / 2 each) and dS in bf16.
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(kProducerRegs + kConsumers * kConsumerRegs <= (kConsumers + 1) * kLaunchRegs);
  static_assert(kHeadDim % 64 == 0 && kBlockM == 64 * kConsumers && kBlockN % 16 == 0);

  using AtomLayout = cute::Layout<cute::Shape<cute::Int<kConsumers>, cute::_1, cute::_1>>;
  // S and dP: M = q rows, N = keys, K = head dim.
  using TileS = cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>, cute::Int<kHeadDim>>;
  using MmaS = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, TileS>(), AtomLayout{}));
  // dQ: M = q rows, N = head dim, K = keys; A (dS) from registers, B (K) keys-major.
  using TileDQ = cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>, cute::Int<kBlockN>>;
  using MmaDQ = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, TileDQ, cute::GMMA::Major::K,
                                 cute::GMMA::Major::MN>(),
      AtomLayout{}));

  using SwizzleAtom = decltype(cute::GMMA::Layout_K_SW128_Atom<Element>{});
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SwizzleAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>, cute::Int<kQStages>>{}));
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SwizzleAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>, cute::Int<kKVStages>>{}));
  // K read as the B operand of dQ: (D, keys, stage), keys being the reduction (MN-major) mode.
  using SmemLayoutKt = decltype(cute::composition(
      SmemLayoutKV{},
      cute::make_layout(
          cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>, cute::Int<kKVStages>>{},
          cute::Stride<cute::Int<kBlockN>, cute::_1, cute::Int<kBlockN * kHeadDim>>{})));

  using PipelineQ = cutlass::PipelineTmaAsync<kQStages>;  // Q, dO, lse2 and delta together
  using PipelineKV = cutlass::PipelineTmaAsync<kKVStages>;
  using Items = ItemQueue<2>;
  using PipelineItem = typename Items::Pipeline;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> v;
    cute::array_aligned<float, kBlockM * kQStages, 128> lse2;
    cute::array_aligned<float, kBlockM * kQStages, 128> delta;
    typename PipelineQ::SharedStorage pipe_q;
    typename PipelineKV::SharedStorage pipe_kv;
    typename Items::SharedStorage items;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm_90 CTA may have");

  static constexpr std::uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr std::uint32_t kStatsBytes = kBlockM * sizeof(float);
  static_assert(kStatsBytes % 16 == 0, "bulk copies move multiples of 16 bytes");
  static constexpr std::uint32_t kKVBytes = kBlockN * kHeadDim * sizeof(Element);
};

}  // namespace flexcp::sm90
