// The device path's element-wise steps (runtime/dist_device.cc): the forward merges its stages'
// fp32 partial outputs through their lse and rounds once; an owner adds the dK/dV partials it
// received to its own fp32 rows, then rounds them once into the caller's tensors.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flexcp/tensor.h"

namespace flexcp::runtime {

// dst[i] += src[i] for i < n, on `stream`.
void add_f32(float* dst, const float* src, std::int64_t n, cudaStream_t stream);
// dst[i] = src[i] rounded to `dtype` (bf16, fp16 or fp32; to nearest even) for i < n.
void store_as(void* dst, DType dtype, const float* src, std::int64_t n, cudaStream_t stream);

// Rows of [rows, dim] fp32 outputs with their lse ([rows]): acc merged in place with a stage's
// partial (part, part_lse) by the one merge rule (kernels/lse_merge.h); rows the part does not
// reach (lse -inf) are left as they are.
void merge_partial(float* acc, float* acc_lse, const float* part, const float* part_lse,
                   std::int64_t rows, std::int64_t dim, cudaStream_t stream);
// The merged rows to the caller's tensors: the sink (fp32 per head, row i's head is i % heads;
// null: none) joins each attended row's denominator, out is rounded once to `dtype`, lse written.
// A row that attended nothing keeps out = 0 and lse = -inf.
void finish_output(const float* acc, const float* acc_lse, const float* sink, std::int64_t heads,
                   void* out, DType dtype, float* lse, std::int64_t rows, std::int64_t dim,
                   cudaStream_t stream);
// lse[i] = -inf for i < n: rows that no stage reached.
void fill_empty_lse(float* lse, std::int64_t n, cudaStream_t stream);

}  // namespace flexcp::runtime
