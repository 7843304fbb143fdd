// What the GPU kernel tests share: a skip where no GPU is present, and device copies of host
// tensors (or poisoned device storage of their shape).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

#include "kernels/cuda/device.h"
#include "test_util.h"

namespace flexcp::test {

#define SKIP_WITHOUT_GPU()                                                                    \
  do {                                                                                        \
    std::string why;                                                                          \
    if (cuda::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device here (" << why << ")"; \
  } while (0)

inline void cuda_ok(cudaError_t err) {
  ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
}

struct DeviceCopy {
  void* ptr = nullptr;
  TensorView view;
  explicit DeviceCopy(const Tensor& host, bool poison = false) : view(host.view) {
    const std::size_t bytes = host.bytes.size();
    cuda_ok(cudaMalloc(&ptr, bytes + 16));
    if (poison)
      cuda_ok(cudaMemset(ptr, 0xff, bytes));  // all-ones bits: NaN in fp32, bf16 and fp16
    else
      cuda_ok(cudaMemcpy(ptr, host.bytes.data(), bytes, cudaMemcpyHostToDevice));
    view.data = ptr;
    view.device = Device::kCuda;
  }
  void copy_to(Tensor& host) const {
    cuda_ok(cudaDeviceSynchronize());
    cuda_ok(cudaMemcpy(host.bytes.data(), ptr, host.bytes.size(), cudaMemcpyDeviceToHost));
  }
  ~DeviceCopy() { cudaFree(ptr); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
};

}  // namespace flexcp::test
