// The backward's dQ writer (BwdConfig::kDqWriterWarp): the producer warp group's second warp adds
// each consumer group's staged half of a block's dQ to the fp32 accumulator with TMA reductions,
// so that a group hands its tile over with a fence and a non-blocking arrive instead of waiting
// for all its threads and then, a block later, for the copy engine.
//
// Only the tile passes between them. The writer takes the same items from the item queue as the
// consumers and walks the same blocks in the same order (detail::walk_unit), so it knows each
// block's q head and first row itself: an earlier version had the group's leader write them to
// shared memory before its arrive, which compute-sanitizer's racecheck reported as a hazard
// against the writer's reads after its sync (bench/results/h200-backward-2026-12-02.md).
//
// Per group g, two named barriers of the group's 128 threads and the writer's 32:
//   kDqEmpty + g  the writer's reductions have read the tile (the group syncs before staging)
//   kDqStaged + g the group has staged and fenced the tile (the writer syncs before reducing)
// Each side passes each barrier once per block, and kDqEmpty once more: the writer's first
// arrive frees both tiles, and the groups' last sync, after their items, matches the writer's
// last release.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>

#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/bwd_items.cuh"
#include "kernels/sm90/bwd_params.h"

namespace flexcp::sm90::detail {

__device__ __forceinline__ std::uint32_t dq_barrier(BwdBarrier b, int group) {
  return static_cast<std::uint32_t>(b) + static_cast<std::uint32_t>(group);
}

// The whole writer warp runs this (named barriers count warps); lane 0 issues the copies.
template <class Cfg, class Storage, class Pipeline>
__device__ __forceinline__ void write_dq_blocks(const BwdParams& p, Storage& ss,
                                                Pipeline& pipe_item) {
  using cutlass::arch::NamedBarrier;
  using namespace cute;
  constexpr std::uint32_t kThreads = Cfg::kDqHandoffThreads;
  const bool issuer = threadIdx.x % 32 == 0;
  if (issuer && p.seqlen_q > 0) prefetch_tma_descriptor(&p.tma_dq);
  for (int g = 0; g < Cfg::kConsumers; ++g)  // both staging tiles start free
    NamedBarrier::arrive(kThreads, dq_barrier(BwdBarrier::kDqEmpty, g));
  typename Pipeline::PipelineState item_state;
  for (;;) {
    const int i = Cfg::Items::take(pipe_item, item_state, ss.items);
    if (i >= p.items) break;
    const BwdItem it = decode_bwd_item(p, i);
    if (it.e_begin == it.e_end) continue;
    walk_unit(p, it, [&](int hq, int c0, const WorkEntry&) {
      for (int g = 0; g < Cfg::kConsumers; ++g) {
        NamedBarrier::sync(kThreads, dq_barrier(BwdBarrier::kDqStaged, g));
        if (issuer) {
          const float* tile = ss.dq.data() + g * Cfg::kBlockM * Cfg::kDqCols;
          CUTLASS_PRAGMA_UNROLL
          for (int panel = 0; panel < Cfg::kDqPanels; ++panel)
            SM90_TMA_REDUCE_ADD_3D::copy(&p.tma_dq, tile + panel * Cfg::kBlockM * kBwdDqBoxCols,
                                         g * Cfg::kDqCols + panel * kBwdDqBoxCols, c0, hq);
          tma_store_arrive();
          tma_store_wait<0>();  // the copy engine has read the tile
        }
        __syncwarp();
        NamedBarrier::arrive(kThreads, dq_barrier(BwdBarrier::kDqEmpty, g));
      }
    });
  }
}

// A consumer group's side: wait until its staging tile is free (before writing it, and once after
// the last item), then hand it over.
template <class Cfg>
__device__ __forceinline__ void wait_dq_tile_free(int group) {
  cutlass::arch::NamedBarrier::sync(Cfg::kDqHandoffThreads,
                                    dq_barrier(BwdBarrier::kDqEmpty, group));
}
template <class Cfg>
__device__ __forceinline__ void hand_over_dq_tile(int group) {
  cutlass::arch::fence_view_async_shared();  // the staged values, visible to the copy engine
  cutlass::arch::NamedBarrier::arrive(Cfg::kDqHandoffThreads,
                                      dq_barrier(BwdBarrier::kDqStaged, group));
}

}  // namespace flexcp::sm90::detail
