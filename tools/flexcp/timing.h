// Wall-clock timing for the tool's benchmarks: warm-up runs, then the median of repeats.
#pragma once

#include <time.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace flexcp::tools {

// Seconds on CLOCK_MONOTONIC, the clock Python's time.monotonic() reads on Linux: a sampler in
// another process (bench/gpu_clocks.py) picks out of its samples those taken while the tool's
// timed calls ran, and leaves out the process's start, its uploads and the warm-up.
inline double monotonic_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
// When the timed calls of a measurement ran (monotonic_seconds), warm-up excluded.
struct TimedWindow {
  double from_s = 0, to_s = 0;
};

// Warm-up is `warmup` runs, then more until `warmup_ms` milliseconds have passed: a GPU meets its
// power limit after about a second of sustained work and lowers its clock, so a kernel timed
// before runs at a clock that training does not see (bench/results/h200-peers-2026-12-04.md).
// `window`, where given, receives when the timed runs ran.
inline double median_seconds(const std::function<void()>& fn, int warmup, int repeat,
                             int warmup_ms = 0, TimedWindow* window = nullptr) {
  for (int i = 0; i < warmup; ++i) fn();
  const auto warm_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(warmup_ms);
  while (std::chrono::steady_clock::now() < warm_until) fn();
  const double from_s = monotonic_seconds();
  std::vector<double> times;
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  if (window != nullptr) *window = {from_s, monotonic_seconds()};
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Floating-point operations counted on attended pairs only (DESIGN §6).
inline double forward_flops(std::int64_t area, std::int64_t head_dim, std::int64_t heads_q) {
  return 4.0 * static_cast<double>(area) * static_cast<double>(head_dim) *
         static_cast<double>(heads_q);
}
inline constexpr double kBackwardFlopsRatio = 2.5;

}  // namespace flexcp::tools
