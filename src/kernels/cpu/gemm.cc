#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <array>
#include <utility>

namespace flexcp::cpu {
namespace {

using MicroKernel = void (*)(int, const float*, std::int64_t, const float*, std::int64_t, float*,
                             std::int64_t);

template <int R, int NV>
void micro_kernel(int k, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                  float* c, std::int64_t ldc) {
  Vec acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = load(c + r * ldc + v * kLanes);
  for (int p = 0; p < k; ++p) {
    Vec bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = load(b + p * ldb + v * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const Vec av = splat(a[r * lda + p]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) store(c + r * ldc + v * kLanes, acc[r][v]);
}

template <int R, int... NV>
constexpr auto row_of_kernels(std::integer_sequence<int, NV...>) {
  return std::array<MicroKernel, sizeof...(NV)>{&micro_kernel<R, NV + 1>...};
}

template <int... R>
constexpr auto table_of_kernels(std::integer_sequence<int, R...>) {
  return std::array{row_of_kernels<R + 1>(std::make_integer_sequence<int, kMicroVecs>())...};
}

// kKernels[r - 1][v - 1] handles r rows and v vectors of columns.
constexpr auto kKernels = table_of_kernels(std::make_integer_sequence<int, kMicroRows>());

}  // namespace

void gemm_acc(int m, int n, int k, const float* a, std::int64_t lda, const float* b,
              std::int64_t ldb, float* c, std::int64_t ldc) {
  constexpr int kCols = kMicroVecs * kLanes;
  for (int j0 = 0; j0 < n; j0 += kCols) {
    const int nv = std::min(kMicroVecs, (n - j0) / kLanes);
    for (int i0 = 0; i0 < m; i0 += kMicroRows) {
      const int r = std::min(kMicroRows, m - i0);
      kKernels[r - 1][nv - 1](k, a + i0 * lda, lda, b + j0, ldb, c + i0 * ldc + j0, ldc);
    }
  }
}

}  // namespace flexcp::cpu
