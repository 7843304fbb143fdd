// Host-side helpers over the CUDA runtime, for CUDA builds: errors as flexcp::Error(kCudaError)
// naming the entry and the step, and a scoped current device.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flexcp/status.h"

namespace flexcp::cuda {

inline void check(cudaError_t err, const std::string& fn, const char* what) {
  if (err != cudaSuccess)
    throw Error(Status::kCudaError, fn + ": " + what + ": " + cudaGetErrorString(err));
}

// Makes `device` current for its lifetime (a CUDA call acts on the current device).
class DeviceGuard {
 public:
  DeviceGuard(int device, const std::string& fn) {
    check(cudaGetDevice(&previous_), fn, "cudaGetDevice");
    if (previous_ != device) check(cudaSetDevice(device), fn, "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace flexcp::cuda
