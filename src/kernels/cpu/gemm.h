// The inner products of the CPU kernels: C[m x n] += A[m x k] * B[k x n], fp32, row-major, with
// n a multiple of kLanes (callers pad their buffers). Register-blocked micro-kernels of
// kMicroRows x (kMicroVecs * kLanes) keep C in registers while k runs.
#pragma once

#include <cstdint>

#include "kernels/cpu/simd.h"

namespace flexcp::cpu {

#if defined(__AVX512F__)
// 6 x 4 accumulators + 4 B vectors + 1 broadcast fit the 32 vector registers.
inline constexpr int kMicroRows = 6;
inline constexpr int kMicroVecs = 4;
#else
// 16 registers (AVX2/SSE): 6 x 2 accumulators + 2 B vectors + 1 broadcast.
inline constexpr int kMicroRows = 6;
inline constexpr int kMicroVecs = 2;
#endif

void gemm_acc(int m, int n, int k, const float* a, std::int64_t lda, const float* b,
              std::int64_t ldb, float* c, std::int64_t ldc);

inline constexpr int round_up(int x, int multiple) {
  return (x + multiple - 1) / multiple * multiple;
}

}  // namespace flexcp::cpu
