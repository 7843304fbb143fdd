// Launches one instantiation of an sm90 kernel (included by the generated instance files): its
// shared memory is opted into first, and a failure says which kernel and how much it asked for.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flexcp/status.h"

namespace flexcp::sm90 {

template <class Params>
void launch_kernel(void (*kernel)(Params), const Params& params, int grid, int threads,
                   int smem_bytes, cudaStream_t stream, const char* fn, int head_dim) {
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err == cudaSuccess) {
    kernel<<<grid, threads, smem_bytes, stream>>>(params);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess)
    throw Error(Status::kCudaError, std::string(fn) + ": sm90 kernel launch (head dim " +
                                        std::to_string(head_dim) + ", " +
                                        std::to_string(smem_bytes) +
                                        " bytes of shared memory): " + cudaGetErrorString(err));
}

}  // namespace flexcp::sm90
