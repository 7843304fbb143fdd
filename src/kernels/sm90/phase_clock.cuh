// A developer's diagnostic for the kernels' block loops: the SM cycles each consumer warp group
// spends in each phase of a block, summed over a launch by the first CTAs' groups and printed
// after the launch (`<kernel>-phases ...` lines, scripts/phases.py). Compiled in only with
// -DFLEXCP_SM90_PHASE_CLOCKS (e.g. CMAKE_CUDA_FLAGS; the run script is scripts/gpu-phases.sh);
// otherwise every call is empty and the kernels' code is unchanged. Nsight Compute's stall
// samples say which instructions wait; this says how long a block's phases take, in order.
// The same build records a timeline too: when each phase of kTimelineBlocks steady blocks ended
// in CTA 0's two consumer groups, on the SM's one clock (`<kernel>-timeline` lines), which shows
// how the groups' phases interleave, what sums cannot. Between blocks, a kernel may mark up to
// kOutsidePhases phases of its item loop (mark_outside: the backward's taking an item, waiting for
// its keys, writing its gradients; the forward's passage from one item to the next), summed the
// same way and printed after the block phases.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

namespace flexcp::sm90::detail {

enum class ClockedKernel : int { kForward, kBackward };

#ifdef FLEXCP_SM90_PHASE_CLOCKS
constexpr int kClockCtas = 2;      // the CTAs whose groups report
constexpr int kClockFields = 16;   // blocks, total, outside, the phases, the outside phases
constexpr int kOutsidePhases = 3;  // the last fields
// Written by the groups at their end, read after the launch: a printf in the kernel would be a
// call, across which ptxas serialises every wgmma (C7510).
static __device__ unsigned g_phase_sums[2][kClockCtas][2][kClockFields];
// The timeline's window: blocks [kTimelineFirst, kTimelineFirst + kTimelineBlocks) of each group
// of CTA 0 (past the first item's start); per block its start, then each phase's end.
constexpr int kTimelineFirst = 64;
constexpr int kTimelineBlocks = 16;
static __device__ unsigned g_timeline[2][2][kTimelineBlocks][kClockFields];
#endif

// Phase: an enum class whose last enumerator is kCount. A block's phases are marked in order;
// marks outside a block (between end_block() and the next block()) count as outside blocks.
template <class Phase, ClockedKernel kKernel>
struct PhaseClock {
#ifdef FLEXCP_SM90_PHASE_CLOCKS
  static_assert(3 + int(Phase::kCount) + kOutsidePhases <= kClockFields);
  unsigned sum[int(Phase::kCount)] = {};
  unsigned outside_sum[kOutsidePhases] = {};
  unsigned last = 0, begin = 0, blocks = 0;
  bool in_block = false;
  unsigned* timeline_row = nullptr;  // this block's row of the timeline, where it is recorded
  __device__ static unsigned now() {
    unsigned t;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(t)::"memory");
    return t;
  }
  __device__ void start() {
    begin = last = now();
  }
  __device__ void block() {  // what passed since the last block's end is the item loop's
    last = now();
    in_block = true;
    ++blocks;
    // The group's first thread of CTA 0 (consumers are warp groups 1 and 2 in both kernels)
    // records the window's blocks; the test is made once a block, so that a mark costs one
    // predicated store (testing at every mark slowed the traced backward by ~10%, 2026-12-04).
    const int b = int(blocks) - 1 - kTimelineFirst;
    timeline_row = blockIdx.x == 0 && threadIdx.x % 128 == 0 && b >= 0 && b < kTimelineBlocks
                       ? g_timeline[int(kKernel)][threadIdx.x / 128 - 1][b]
                       : nullptr;
    if (timeline_row) timeline_row[0] = last;
  }
  __device__ void end_block() {
    in_block = false;
    timeline_row = nullptr;
  }
  __device__ void mark(Phase phase) {
    const unsigned t = now();
    if (in_block) {
      sum[int(phase)] += t - last;
      if (timeline_row) timeline_row[1 + int(phase)] = t;
    }
    last = t;
  }
  // Between blocks: what passed since the last mark (of either kind) is outside phase i's.
  __device__ void mark_outside(int i) {
    const unsigned t = now();
    outside_sum[i] += t - last;
    last = t;
  }
  __device__ void report(int group) const {
    if (blockIdx.x >= kClockCtas || threadIdx.x % 128 != 0) return;
    unsigned in_blocks = 0;
    for (unsigned s : sum) in_blocks += s;
    const unsigned total = now() - begin;
    unsigned* out = g_phase_sums[int(kKernel)][blockIdx.x][group];
    out[0] = blocks;
    out[1] = total;
    out[2] = total - in_blocks;
    for (int i = 0; i < int(Phase::kCount); ++i) out[3 + i] = sum[i];
    for (int i = 0; i < kOutsidePhases; ++i)
      out[kClockFields - kOutsidePhases + i] = outside_sum[i];
  }
#else
  __device__ __forceinline__ void start() {}
  __device__ __forceinline__ void block() {}
  __device__ __forceinline__ void end_block() {}
  __device__ __forceinline__ void mark(Phase) {}
  __device__ __forceinline__ void mark_outside(int) {}
  __device__ __forceinline__ void report(int) const {}
#endif
};

#ifdef FLEXCP_SM90_PHASE_CLOCKS
// After a launch (synchronises): one line per reporting group, `prefix` and the phases' names,
// then the outside phases' (`outside` of them, named in `outside_names`).
inline void print_phases(ClockedKernel kernel, const char* prefix, const char* const* phase_names,
                         int phases, const char* const* outside_names = nullptr, int outside = 0) {
  unsigned v[kClockCtas][2][kClockFields];
  if (cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemcpyFromSymbol(v, g_phase_sums, sizeof v, sizeof v * int(kernel)) != cudaSuccess)
    return;
  for (int c = 0; c < kClockCtas; ++c)
    for (int g = 0; g < 2; ++g) {
      std::printf("%s cta %d group %d blocks %u total %u outside-blocks %u", prefix, c, g,
                  v[c][g][0], v[c][g][1], v[c][g][2]);
      for (int f = 0; f < phases; ++f) std::printf(" %s %u", phase_names[f], v[c][g][3 + f]);
      for (int f = 0; f < outside && f < kOutsidePhases; ++f)
        std::printf(" %s %u", outside_names[f], v[c][g][kClockFields - kOutsidePhases + f]);
      std::printf("\n");
    }
  // The timeline, relative to group 0's first block start (the SM clock wraps; differences don't).
  unsigned t[2][kTimelineBlocks][kClockFields];
  if (cudaMemcpyFromSymbol(t, g_timeline, sizeof t, sizeof t * int(kernel)) != cudaSuccess) return;
  const unsigned zeros[2][kTimelineBlocks][kClockFields] = {};  // the next launch's window anew
  if (cudaMemcpyToSymbol(g_timeline, zeros, sizeof zeros, sizeof zeros * int(kernel)) !=
      cudaSuccess)
    return;
  const char* kernel_name = kernel == ClockedKernel::kForward ? "fwd" : "bwd";
  for (int b = 0; b < kTimelineBlocks; ++b)
    for (int g = 0; g < 2; ++g) {
      std::printf("%s-timeline block %d group %d start %d", kernel_name, kTimelineFirst + b, g,
                  int(t[g][b][0] - t[0][0][0]));
      for (int f = 0; f < phases; ++f) {  // "none": a phase this block did not reach
        if (t[g][b][1 + f] == 0)
          std::printf(" %s none", phase_names[f]);
        else
          std::printf(" %s %d", phase_names[f], int(t[g][b][1 + f] - t[0][0][0]));
      }
      std::printf("\n");
    }
}
#endif

}  // namespace flexcp::sm90::detail
