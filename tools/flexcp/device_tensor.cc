#include "device_tensor.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "flexcp/status.h"

namespace flexcp::tools {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw Error(Status::kCudaError,
                std::string("flexcp: ") + what + ": " + cudaGetErrorString(err));
}

int usable_devices() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0)
    throw Error(Status::kCudaError,
                std::string("flexcp: --device cuda: no usable CUDA device (") +
                    (err != cudaSuccess ? cudaGetErrorString(err) : "no device") + ")");
  return count;
}

}  // namespace

DeviceTensor::DeviceTensor(const HostTensor& host) : view_(host.view()) {
  usable_devices();
  bytes_ = static_cast<std::size_t>(host.numel()) * dtype_size(host.view().dtype);
  check(cudaMalloc(&data_, std::max<std::size_t>(bytes_, 16)), "cudaMalloc");
  check(cudaMemcpy(data_, host.view().data, bytes_, cudaMemcpyHostToDevice), "copy to device");
  view_.data = data_;
  view_.device = Device::kCuda;
  check(cudaGetDevice(&view_.device_index), "cudaGetDevice");
}

int use_rank_gpu(int rank) {
  const int device = rank % usable_devices();
  check(cudaSetDevice(device), "cudaSetDevice");
  return device;
}

void device_synchronize() {
  check(cudaDeviceSynchronize(), "running on the device");
}

DeviceTensor::~DeviceTensor() {
  cudaFree(data_);
}

void DeviceTensor::copy_to(HostTensor& host) const {
  check(cudaDeviceSynchronize(), "running on the device");
  check(cudaMemcpy(host.view().data, data_, bytes_, cudaMemcpyDeviceToHost), "copy to host");
}

DeviceWorkspace::DeviceWorkspace(AttentionPlan& plan) {
  check(cudaMalloc(&data_, std::max<std::size_t>(plan.workspace_bytes(), 16)),
        "cudaMalloc (plan workspace)");
  plan.bind_workspace(data_, plan.workspace_bytes());
}

DeviceWorkspace::~DeviceWorkspace() {
  cudaFree(data_);
}

double median_device_seconds(const std::function<void()>& fn, int warmup, int repeat, int warmup_ms,
                             TimedWindow* window) {
  return alternating_median_device_seconds({fn}, warmup, repeat, warmup_ms, window).front();
}

std::vector<double> alternating_median_device_seconds(const std::vector<std::function<void()>>& fns,
                                                      int warmup, int repeat, int warmup_ms,
                                                      TimedWindow* window) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  auto batch_ms = [&](const std::function<void()>& fn, int calls) {
    check(cudaEventRecord(start), "cudaEventRecord");
    for (int j = 0; j < calls; ++j) fn();
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "running on the device");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    return ms;
  };
  // Back-to-back calls per sample, enough for about 20 ms, so that short kernels are timed without
  // gaps (the host's per-call work overlaps the previous kernel).
  std::vector<int> calls;
  for (const std::function<void()>& fn : fns) {
    for (int i = 0; i < warmup; ++i) fn();
    const float first_ms = batch_ms(fn, 1);
    calls.push_back(std::clamp(static_cast<int>(20.0f / std::max(first_ms, 1e-3f)), 1, 200));
  }
  // Warm by time too, in turn as the samples are taken.
  for (float warmed_ms = 0; warmed_ms < static_cast<float>(warmup_ms);)
    for (std::size_t f = 0; f < fns.size(); ++f) warmed_ms += batch_ms(fns[f], calls[f]);
  // The device is idle here (every batch above was waited for), so the window opens with the
  // first timed batch and closes when the last has finished.
  const double from_s = monotonic_seconds();
  std::vector<std::vector<double>> times(fns.size());
  for (int i = 0; i < repeat; ++i)
    for (std::size_t f = 0; f < fns.size(); ++f)
      times[f].push_back(batch_ms(fns[f], calls[f]) * 1e-3 / calls[f]);
  if (window != nullptr) *window = {from_s, monotonic_seconds()};
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::vector<double> medians;
  for (std::vector<double>& t : times) {
    std::sort(t.begin(), t.end());
    medians.push_back(t[t.size() / 2]);
  }
  return medians;
}

}  // namespace flexcp::tools
