// The backward's dQ writer (BwdConfig::kDqWriterWarp): the producer warp group's second warp adds
// each consumer group's staged part of a block's dQ to the fp32 accumulator with TMA reductions,
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
// Each side passes each barrier once per block, and kDqEmpty once more: the writer frees both
// tiles at the start of each block and once after its items, which the groups' last sync, after
// their items, matches.
//
// A block's reductions are issued one group after the other as each tile is staged, and both
// are in flight together: the writer waits for their reads only at the next block, freeing each
// tile as soon as its own reductions have read it (bulk groups complete in order). Waiting for
// group 0's reads before taking group 1's tile held group 1's reductions back by group 0's.
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

// Frees each group's tile once the copy engine has read it for the block before: the tiles'
// bulk groups were committed in group order, so tile g is read when at most kConsumers - 1 - g
// groups are pending. The whole writer warp arrives (named barriers count warps).
template <class Cfg, int g = 0>
__device__ __forceinline__ void release_dq_tiles(bool issuer) {
  if constexpr (g < Cfg::kConsumers) {
    if (issuer) cute::tma_store_wait<Cfg::kConsumers - 1 - g>();
    __syncwarp();
    cutlass::arch::NamedBarrier::arrive(Cfg::kDqHandoffThreads,
                                        dq_barrier(BwdBarrier::kDqEmpty, g));
    release_dq_tiles<Cfg, g + 1>(issuer);
  }
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
  typename Pipeline::PipelineState item_state;
  for (;;) {
    const int i = Cfg::Items::take(pipe_item, item_state, ss.items);
    if (i >= p.items) break;
    const BwdItem it = decode_bwd_item(p, i);
    if (it.e_begin == it.e_end) continue;
    walk_unit<Cfg::kBlockM>(p, it, [&](int hq, int c0, const WorkEntry&) {
      release_dq_tiles<Cfg>(issuer);  // the last block's (none pending before the first)
      for (int g = 0; g < Cfg::kConsumers; ++g) {
        NamedBarrier::sync(kThreads, dq_barrier(BwdBarrier::kDqStaged, g));
        if (issuer) {
          const float* tile = ss.dq.data() + g * Cfg::kDqRows * Cfg::kDqCols;
          const int col0 = Cfg::dq_first_col(g), row0 = c0 + Cfg::dq_row_offset(g);
          CUTLASS_PRAGMA_UNROLL
          for (int panel = 0; panel < Cfg::kDqPanels; ++panel)
            SM90_TMA_REDUCE_ADD_3D::copy(&p.tma_dq, tile + panel * Cfg::kDqRows * kBwdDqBoxCols,
                                         col0 + panel * kBwdDqBoxCols, row0, hq);
          tma_store_arrive();  // one bulk group per tile
        }
      }
    });
  }
  release_dq_tiles<Cfg>(issuer);  // matches the groups' sync after their items
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
