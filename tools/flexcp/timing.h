// Wall-clock timing for the tool's benchmarks: warm-up runs, then the median of repeats.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace flexcp::tools {

// Warm-up is `warmup` runs, then more until `warmup_ms` milliseconds have passed: a GPU meets its
// power limit after about a second of sustained work and lowers its clock, so a kernel timed
// before runs at a clock that training does not see (bench/results/h200-peers-2026-12-04.md).
inline double median_seconds(const std::function<void()>& fn, int warmup, int repeat,
                             int warmup_ms = 0) {
  for (int i = 0; i < warmup; ++i) fn();
  const auto warm_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(warmup_ms);
  while (std::chrono::steady_clock::now() < warm_until) fn();
  std::vector<double> times;
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
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
