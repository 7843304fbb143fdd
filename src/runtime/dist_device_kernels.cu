#include "runtime/dist_device_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "flexcp/status.h"

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
