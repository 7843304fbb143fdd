#include "runtime/dist_device_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "flexcp/status.h"
#include "kernels/lse_merge.h"

namespace flexcp::runtime {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;  // grid-stride beyond: enough to fill the GPU several times

int blocks_for(std::int64_t n) {
  return static_cast<int>(std::clamp<std::int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

__global__ void add_kernel(float* dst, const float* src, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    dst[i] += src[i];
}

__device__ __forceinline__ void store(__nv_bfloat16* d, float x) {
  *d = __float2bfloat16_rn(x);
}
__device__ __forceinline__ void store(__half* d, float x) {
  *d = __float2half_rn(x);
}
__device__ __forceinline__ void store(float* d, float x) {
  *d = x;
}

template <class T>
__global__ void store_kernel(T* dst, const float* src, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    store(dst + i, src[i]);
}

// One warp per row (grid-stride): the lanes walk the row's columns, then lane 0 writes its lse,
// after every lane has read the old one.
constexpr int kWarpsPerBlock = kThreads / 32;

int row_blocks(std::int64_t rows) {
  return static_cast<int>(
      std::clamp<std::int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, 1, kMaxBlocks));
}

__device__ __forceinline__ std::int64_t first_row() {
  return blockIdx.x * std::int64_t(kWarpsPerBlock) + threadIdx.x / 32;
}
__device__ __forceinline__ std::int64_t row_step() {
  return std::int64_t(gridDim.x) * kWarpsPerBlock;
}

__global__ void merge_kernel(float* acc, float* acc_lse, const float* part, const float* part_lse,
                             std::int64_t rows, std::int64_t dim) {
  const int lane = threadIdx.x % 32;
  for (std::int64_t r = first_row(); r < rows; r += row_step()) {
    const float b = part_lse[r];
    if (b == -INFINITY) continue;  // the part attended nothing in this row
    const LseMerge m = merge_lse(acc_lse[r], b);
    float* o = acc + r * dim;
    const float* po = part + r * dim;
    for (std::int64_t d = lane; d < dim; d += 32) o[d] = m.weight_a * o[d] + m.weight_b * po[d];
    __syncwarp();
    if (lane == 0) acc_lse[r] = m.lse;
  }
}

template <class T>
__global__ void finish_kernel(const float* acc, const float* acc_lse, const float* sink,
                              std::int64_t heads, T* out, float* lse, std::int64_t rows,
                              std::int64_t dim) {
  const int lane = threadIdx.x % 32;
  for (std::int64_t r = first_row(); r < rows; r += row_step()) {
    float l = acc_lse[r], weight = 1.f;
    if (sink != nullptr && l != -INFINITY) {
      const LseMerge m = merge_lse(l, sink[r % heads]);
      weight = m.weight_a;
      l = m.lse;
    }
    for (std::int64_t d = lane; d < dim; d += 32)
      store(out + r * dim + d, acc[r * dim + d] * weight);
    if (lane == 0) lse[r] = l;
  }
}

__global__ void fill_kernel(float* dst, float value, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    dst[i] = value;
}

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw Error(Status::kCudaError,
                std::string("flexcp::DistAttention: ") + what + ": " + cudaGetErrorString(err));
}

}  // namespace

void add_f32(float* dst, const float* src, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dst, src, n);
  check_launch("adding received dK/dV partials");
}

void merge_partial(float* acc, float* acc_lse, const float* part, const float* part_lse,
                   std::int64_t rows, std::int64_t dim, cudaStream_t stream) {
  if (rows == 0) return;
  merge_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(acc, acc_lse, part, part_lse, rows, dim);
  check_launch("merging a stage's partial output");
}

void finish_output(const float* acc, const float* acc_lse, const float* sink, std::int64_t heads,
                   void* out, DType dtype, float* lse, std::int64_t rows, std::int64_t dim,
                   cudaStream_t stream) {
  if (rows == 0) return;
  const int blocks = row_blocks(rows);
  switch (dtype) {
    case DType::kBFloat16:
      finish_kernel<<<blocks, kThreads, 0, stream>>>(
          acc, acc_lse, sink, heads, static_cast<__nv_bfloat16*>(out), lse, rows, dim);
      break;
    case DType::kFloat16:
      finish_kernel<<<blocks, kThreads, 0, stream>>>(acc, acc_lse, sink, heads,
                                                     static_cast<__half*>(out), lse, rows, dim);
      break;
    case DType::kFloat32:
      finish_kernel<<<blocks, kThreads, 0, stream>>>(acc, acc_lse, sink, heads,
                                                     static_cast<float*>(out), lse, rows, dim);
      break;
    default:
      throw Error(Status::kInternal, "flexcp::DistAttention: no device store for this dtype");
  }
  check_launch("writing the merged output");
}

void fill_empty_lse(float* lse, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<<<blocks_for(n), kThreads, 0, stream>>>(lse, -INFINITY, n);
  check_launch("marking rows no stage reached");
}

void store_as(void* dst, DType dtype, const float* src, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const int blocks = blocks_for(n);
  switch (dtype) {
    case DType::kBFloat16:
      store_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(dst), src, n);
      break;
    case DType::kFloat16:
      store_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<__half*>(dst), src, n);
      break;
    case DType::kFloat32:
      store_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<float*>(dst), src, n);
      break;
    default:
      throw Error(Status::kInternal, "flexcp::DistAttention: no device store for this dtype");
  }
  check_launch("rounding dK/dV to the input dtype");
}

}  // namespace flexcp::runtime
