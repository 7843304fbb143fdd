// The backward's dQ writer: one warp of the producer warp group that adds each consumer group's
// staged half of a block's dQ to the fp32 accumulator with TMA reductions. The hand-over is a pair
// of named barriers per group (BwdBarrier::kDqFull, kDqEmpty): the group stages its tile, fences
// it for the copy engine and arrives without waiting; the writer issues the reductions and
// releases the tile once the copy engine has read it. Both groups stage every block in the same
// order (they meet at kDsReady each block), so the writer takes group 0, then group 1, block by
// block, until both say they have no more (a head < 0).
#pragma once

#include <cutlass/arch/barrier.h>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>

#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/bwd_params.h"

namespace flexcp::sm90::detail {

__device__ __forceinline__ std::uint32_t dq_barrier(BwdBarrier b, int group) {
  return static_cast<std::uint32_t>(b) + static_cast<std::uint32_t>(group);
}

// The whole writer warp runs this (named barriers count warps); lane 0 issues the copies.
template <class Cfg, class Storage>
__device__ __forceinline__ void write_dq_blocks(const BwdParams& p, Storage& ss) {
  using cutlass::arch::NamedBarrier;
  using namespace cute;
  constexpr std::uint32_t kThreads = Cfg::kDqHandoffThreads;
  const bool issuer = threadIdx.x % 32 == 0;
  if (issuer && p.seqlen_q > 0) prefetch_tma_descriptor(&p.tma_dq);
  for (int g = 0; g < Cfg::kConsumers; ++g)  // both staging tiles start free
    NamedBarrier::arrive(kThreads, dq_barrier(BwdBarrier::kDqEmpty, g));
  const volatile BwdDqBlock* blocks = ss.dq_blocks;
  for (bool done = false; !done;) {
    for (int g = 0; g < Cfg::kConsumers; ++g) {
      NamedBarrier::sync(kThreads, dq_barrier(BwdBarrier::kDqFull, g));
      const int row = blocks[g].row, head = blocks[g].head;
      if (head < 0) {
        done = true;
        continue;
      }
      if (issuer) {
        const float* tile = ss.dq.data() + g * Cfg::kBlockM * Cfg::kDqCols;
        CUTLASS_PRAGMA_UNROLL
        for (int panel = 0; panel < Cfg::kDqPanels; ++panel)
          SM90_TMA_REDUCE_ADD_3D::copy(&p.tma_dq, tile + panel * Cfg::kBlockM * kBwdDqBoxCols,
                                       g * Cfg::kDqCols + panel * kBwdDqBoxCols, row, head);
        tma_store_arrive();
      }
    }
    if (done) break;
    static_assert(Cfg::kConsumers == 2, "the waits below release group 0, then group 1");
    if (issuer) tma_store_wait<1>();  // group 0's reductions have read its tile
    __syncwarp();
    NamedBarrier::arrive(kThreads, dq_barrier(BwdBarrier::kDqEmpty, 0));
    if (issuer) tma_store_wait<0>();
    __syncwarp();
    NamedBarrier::arrive(kThreads, dq_barrier(BwdBarrier::kDqEmpty, 1));
  }
}

// A consumer group's side: wait for its staging tile (before writing it), then hand it over.
template <class Cfg>
__device__ __forceinline__ void wait_dq_tile_free(int group) {
  cutlass::arch::NamedBarrier::sync(Cfg::kDqHandoffThreads,
                                    dq_barrier(BwdBarrier::kDqEmpty, group));
}
template <class Cfg, class Storage>
__device__ __forceinline__ void hand_over_dq_tile(Storage& ss, int group, bool leader, int row,
                                                  int head) {
  if (leader) {
    volatile BwdDqBlock* b = ss.dq_blocks + group;
    b->row = row;
    b->head = head;
  }
  cutlass::arch::fence_view_async_shared();  // the staged values, visible to the copy engine
  cutlass::arch::NamedBarrier::arrive(Cfg::kDqHandoffThreads,
                                      dq_barrier(BwdBarrier::kDqFull, group));
}

}  // namespace flexcp::sm90::detail
