// Launches one instantiation of the backward kernel; included by the generated instance files.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flexcp/status.h"
#include "kernels/sm90/bwd_kernel.cuh"

namespace flexcp::sm90 {

template <class Element, int kHeadDim>
void launch_backward(const BwdParams& params, int grid, cudaStream_t stream) {
  using Cfg = BwdConfig<Element, kHeadDim>;
  auto* kernel = &bwd_kernel<Cfg>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err == cudaSuccess) {
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess)
    throw Error(Status::kCudaError, std::string("flexcp::backward: sm90 kernel launch (head dim ") +
                                        std::to_string(kHeadDim) + ", " +
                                        std::to_string(Cfg::kSmemBytes) +
                                        " bytes of shared memory): " + cudaGetErrorString(err));
}

}  // namespace flexcp::sm90
