// The device path's element-wise steps (runtime/dist_device.cc): an owner adds the dK/dV
// partials it received to its own fp32 rows, then rounds them once into the caller's tensors.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flexcp/tensor.h"

namespace flexcp::runtime {

// dst[i] += src[i] for i < n, on `stream`.
void add_f32(float* dst, const float* src, std::int64_t n, cudaStream_t stream);
// dst[i] = src[i] rounded to `dtype` (bf16, fp16 or fp32; to nearest even) for i < n.
void store_as(void* dst, DType dtype, const float* src, std::int64_t n, cudaStream_t stream);

}  // namespace flexcp::runtime
