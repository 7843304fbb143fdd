// Launches one instantiation of an sm90 kernel (included by the generated instance files): its
// shared memory is opted into first, and a failure says which kernel and how much it asked for.
// kOverlapPrevious lets the kernel start (launch, set up its barriers) while the kernel ahead of it
// on the stream finishes; such a kernel calls detail::wait_for_previous_kernel() before it touches
// that kernel's data (kernel_common.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "flexcp/status.h"

namespace flexcp::sm90 {

enum class LaunchOrder { kAfterPrevious, kOverlapPrevious };

// The launch attribute behind kOverlapPrevious (programmatic stream serialization).
inline cudaLaunchAttribute overlap_previous_attribute() {
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  return overlap;
}

template <class Params>
void launch_kernel(void (*kernel)(Params), const Params& params, int grid, int threads,
                   int smem_bytes, cudaStream_t stream, const char* fn, int head_dim,
                   LaunchOrder order = LaunchOrder::kAfterPrevious) {
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err == cudaSuccess) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(grid));
    config.blockDim = dim3(static_cast<unsigned>(threads));
    config.dynamicSmemBytes = static_cast<std::size_t>(smem_bytes);
    config.stream = stream;
    cudaLaunchAttribute overlap = overlap_previous_attribute();
    if (order == LaunchOrder::kOverlapPrevious) {
      config.attrs = &overlap;
      config.numAttrs = 1;
    }
    err = cudaLaunchKernelEx(&config, kernel, params);
  }
  if (err != cudaSuccess)
    throw Error(Status::kCudaError, std::string(fn) + ": sm90 kernel launch (head dim " +
                                        std::to_string(head_dim) + ", " +
                                        std::to_string(smem_bytes) +
                                        " bytes of shared memory): " + cudaGetErrorString(err));
}

}  // namespace flexcp::sm90
