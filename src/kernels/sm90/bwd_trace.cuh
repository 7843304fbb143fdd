// A developer's diagnostic for the backward's block loop: the SM cycles each consumer warp group
// spends in each phase of a q block, summed over a launch and printed by the first CTAs' groups
// when they finish (through device memory, after the launch). Compiled in only with
// -DFLEXCP_SM90_BWD_TRACE (e.g. CMAKE_CUDA_FLAGS; the run script is scripts/gpu-bwd-phases.sh);
// otherwise every call is empty and the kernels' code is unchanged. Nsight Compute's stall samples
// say which instructions wait; this says how long a block's phases take, in order, which is what
// decides how often the tensor pipe has nothing queued (both groups pass the dS barrier together
// every block).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

namespace flexcp::sm90::detail {

enum class BwdPhase : int {
  kScores,    // wait for Q and dO, issue S^T and dP^T, wait for S^T
  kProbs,     // P^T: mask, exponentiate
  kGrads,     // wait for dP^T, dS^T, both converted to the input dtype
  kDsShared,  // issue dV, dS^T to shared memory, the dS barrier of both groups
  kDqDk,      // issue dQ and dK, wait for dV and dQ
  kDqFree,    // wait until the dQ writer has read this group's last staged tile
  kDqStage,   // stage dQ, hand it over
  kDkWait,    // wait for dK, release Q
  kCount
};

#ifdef FLEXCP_SM90_BWD_TRACE
// Written by the first CTAs' groups at their end, read by print_bwd_phases() after the launch (a
// printf in the kernel would be a call, across which ptxas serialises every wgmma: C7510).
constexpr int kTraceCtas = 2;
constexpr int kTraceFields = 3 + int(BwdPhase::kCount);  // blocks, total, outside, phases
static __device__ unsigned g_bwd_phases[kTraceCtas][2][kTraceFields];
#endif

struct PhaseClock {
#ifdef FLEXCP_SM90_BWD_TRACE
  unsigned sum[int(BwdPhase::kCount)] = {};
  unsigned last = 0, begin = 0, blocks = 0;
  __device__ static unsigned now() {
    unsigned t;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(t)::"memory");
    return t;
  }
  __device__ void start() {
    begin = last = now();
  }
  __device__ void block() {  // a block begins: what passed since the last block is the item loop's
    last = now();
    ++blocks;
  }
  __device__ void mark(BwdPhase phase) {
    const unsigned t = now();
    sum[int(phase)] += t - last;
    last = t;
  }
  __device__ void report(int group) const {
    if (blockIdx.x >= kTraceCtas || threadIdx.x % 128 != 0) return;
    unsigned in_blocks = 0;
    for (unsigned s : sum) in_blocks += s;
    const unsigned total = now() - begin;
    unsigned* out = g_bwd_phases[blockIdx.x][group];
    out[0] = blocks;
    out[1] = total;
    out[2] = total - in_blocks;
    for (int i = 0; i < int(BwdPhase::kCount); ++i) out[3 + i] = sum[i];
  }
#else
  __device__ __forceinline__ void start() {}
  __device__ __forceinline__ void block() {}
  __device__ __forceinline__ void mark(BwdPhase) {}
  __device__ __forceinline__ void report(int) const {}
#endif
};

#ifdef FLEXCP_SM90_BWD_TRACE
// After a launch (synchronises): one line per traced group, for scripts/bwd-phases.py.
inline void print_bwd_phases() {
  unsigned v[kTraceCtas][2][kTraceFields];
  if (cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemcpyFromSymbol(v, g_bwd_phases, sizeof v) != cudaSuccess)
    return;
  const char* names[kTraceFields] = {"blocks",  "total",    "outside-blocks", "scores",
                                     "probs",   "grads",    "ds-shared",      "dq-dk",
                                     "dq-free", "dq-stage", "dk-wait"};
  for (int c = 0; c < kTraceCtas; ++c)
    for (int g = 0; g < 2; ++g) {
      std::printf("bwd-phases cta %d group %d", c, g);
      for (int f = 0; f < kTraceFields; ++f) std::printf(" %s %u", names[f], v[c][g][f]);
      std::printf("\n");
    }
}
#endif

}  // namespace flexcp::sm90::detail
