// What the GPU kernel tests share: a skip where no GPU is present, and device copies of host
// tensors (or poisoned device storage of their shape).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
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
    // Both may return before the bytes land (a memset of device memory, and a copy from pageable
    // memory once it is staged), and they run on the legacy default stream, which work on a
    // non-blocking stream does not wait for: a kernel launched there next could read the input
    // before it arrives, or have its output poisoned after it wrote it (seen once: the dist
    // device test's lse on another stream, 2026-12-05).
    cuda_ok(cudaDeviceSynchronize());
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

// One kernel test case: sizes, dtype, options.
struct KernelCase {
  std::string name;
  std::int64_t tq, tk, hq, hk, d;
  DType dtype = DType::kBFloat16;
  double softcap = 0.0;
  bool sink = false;
  double scale = 0.0;
};

// The cases both directions run, in groups (one test each); check(case, mask, rng).
template <class Check>
void standard_masks(Check&& check, std::mt19937_64& rng) {
  check({"causal", 1024, 1024, 2, 2, 128}, masks::causal(1024, 1024), rng);
  check({"full-cross", 113, 1023, 8, 2, 64, DType::kFloat16}, masks::full(113, 1023), rng);
  check({"varlen-causal", 777, 777, 8, 1, 128}, masks::varlen_causal({300, 1, 129, 200, 147}), rng);
  check({"sliding-window", 1000, 1000, 6, 2, 128, DType::kFloat16},
        masks::sliding_window({1000}, 100, masks::WindowKind::kCausal), rng);
  check({"block-causal", 900, 900, 4, 4, 64}, masks::block_causal({500, 400}, 128), rng);
  check({"prefix-lm", 600, 600, 2, 1, 128}, masks::prefix_lm({350, 250}, {100, 7}), rng);
}

template <class Check>
void random_slice_sets(Check&& check, std::mt19937_64& rng) {
  const std::int64_t sizes[][2] = {{1, 1}, {113, 239}, {239, 113}, {1023, 300}, {65, 1}, {1, 130}};
  const std::int64_t heads[][2] = {{1, 1}, {2, 1}, {8, 1}, {12, 4}, {16, 2}};
  int i = 0;
  for (const auto& size : sizes)
    for (const auto& head : heads) {
      const std::int64_t tq = size[0], tk = size[1], hq = head[0], hk = head[1];
      const DType dtype = (i % 3 == 0) ? DType::kFloat16 : DType::kBFloat16;
      check({"random", tq, tk, hq, hk, (i++ % 2) ? 64 : 128, dtype}, random_mask(rng, tq, tk), rng);
    }
}

template <class Check>
void softcap_sink_and_scale(Check&& check, std::mt19937_64& rng) {
  check({"softcap", 300, 300, 2, 1, 128, DType::kBFloat16, 5.0}, masks::causal(300, 300), rng);
  check({"sink", 200, 170, 4, 2, 64, DType::kFloat16, 0.0, true}, random_mask(rng, 200, 170), rng);
  check({"negative-scale", 257, 257, 4, 1, 128, DType::kBFloat16, 0.0, false, -0.1},
        masks::causal(257, 257), rng);
  check({"all", 150, 150, 4, 1, 64, DType::kBFloat16, 3.0, true, 0.3},
        masks::sliding_window({150}, 17, masks::WindowKind::kCausal), rng);
}

template <class Check>
void fully_masked_rows_and_empty_masks(Check&& check, std::mt19937_64& rng) {
  const Mask holes(
      330, 350, {{{0, 40}, {0, 60}, MaskType::kCausal}, {{190, 330}, {10, 320}, MaskType::kFull}});
  check({"holes", 330, 350, 2, 1, 128}, holes, rng);
  check({"holes-sink", 330, 350, 2, 1, 64, DType::kBFloat16, 0.0, true}, holes, rng);
  check({"empty", 50, 60, 2, 2, 64}, Mask(50, 60, {}), rng);
  check({"causal-tall", 290, 30, 2, 1, 128}, masks::causal(290, 30), rng);
}

}  // namespace flexcp::test
