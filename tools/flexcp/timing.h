// Wall-clock timing for the tool's benchmarks: warm-up runs, then the median of repeats.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace flexcp::tools {

inline double median_seconds(const std::function<void()>& fn, int warmup, int repeat) {
  for (int i = 0; i < warmup; ++i) fn();
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
