// The tool's random inputs (HostTensor::fill_uniform): in range, centred, spread as a uniform
// distribution, the same whatever the number of threads, and different per seed.
#include "host_tensor.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace flexcp::tools {
namespace {

std::vector<float> filled(DType dtype, std::int64_t n, std::uint64_t seed, float amplitude) {
  HostTensor t(dtype, {n});
  t.fill_uniform(seed, amplitude);
  return t.to_float();
}

TEST(HostTensorFill, UniformInRangeCentredAndSpread) {
  constexpr std::int64_t kN = 1 << 20;
  const std::vector<float> v = filled(DType::kFloat32, kN, 7, 2.5f);
  double sum = 0, sq = 0;
  for (float x : v) sum += x, sq += double(x) * x;
  EXPECT_GE(*std::min_element(v.begin(), v.end()), -2.5f);
  EXPECT_LT(*std::max_element(v.begin(), v.end()), 2.5f);
  const double mean = sum / kN, var = sq / kN - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.01);             // ~5 standard errors (1.44 / 1024)
  EXPECT_NEAR(var, 2.5 * 2.5 / 3.0, 0.02);  // a uniform's a^2 / 3
  // The lowest and highest tenths hold a tenth each (no clumping at the ends).
  const auto low = std::count_if(v.begin(), v.end(), [](float x) { return x < -2.0f; });
  const auto high = std::count_if(v.begin(), v.end(), [](float x) { return x >= 2.0f; });
  EXPECT_NEAR(double(low) / kN, 0.1, 0.003);
  EXPECT_NEAR(double(high) / kN, 0.1, 0.003);
}

TEST(HostTensorFill, SameValuesWhateverTheThreadsAndNewOnesPerSeed) {
  constexpr std::int64_t kN = 100003;  // not a multiple of any thread count's chunk
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = filled(DType::kBFloat16, kN, 42, 1.f);
  omp_set_num_threads(std::max(threads, 3));
  const std::vector<float> many = filled(DType::kBFloat16, kN, 42, 1.f);
  omp_set_num_threads(threads);
  EXPECT_EQ(one, many);
  const std::vector<float> next = filled(DType::kBFloat16, kN, 43, 1.f);
  std::int64_t same = 0;
  for (std::int64_t i = 0; i < kN; ++i) same += one[i] == next[i];
  EXPECT_LT(same, kN / 50) << "seeds 42 and 43 agree in " << same << " of " << kN;
}

}  // namespace
}  // namespace flexcp::tools
