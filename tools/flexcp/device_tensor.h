// GPU copies of the tool's host tensors, for --device cuda. Only in builds with CUDA; elsewhere
// the commands answer "not compiled".
#pragma once

#include <functional>
#include <vector>

#include "flexcp/attention_plan.h"
#include "host_tensor.h"
#include "timing.h"

namespace flexcp::tools {

class DeviceTensor {
 public:
  explicit DeviceTensor(const HostTensor& host);  // same dtype, shape and values
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor();
  const TensorView& view() const { return view_; }
  void copy_to(HostTensor& host) const;  // waits for the device first

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  TensorView view_;
};

// A plan's device workspace, bound on construction (the default stream) and freed with it.
class DeviceWorkspace {
 public:
  explicit DeviceWorkspace(AttentionPlan& plan);
  DeviceWorkspace(const DeviceWorkspace&) = delete;
  DeviceWorkspace& operator=(const DeviceWorkspace&) = delete;
  ~DeviceWorkspace();

 private:
  void* data_ = nullptr;
};

// `flexcp run --device cuda`: makes GPU (rank mod the GPUs here) current for this process and
// returns its index; Error(kCudaError) where there is none.
int use_rank_gpu(int rank);
// Waits for all work on the current device.
void device_synchronize();

// Median time of one call of `fn` on the device's default stream: events around batches of
// back-to-back calls, after `warmup` calls and then batches for at least `warmup_ms` (timing.h
// says why). `window`, where given, receives when the timed batches ran (each batch is waited
// for, so the host's clock brackets the device's work).
double median_device_seconds(const std::function<void()>& fn, int warmup, int repeat,
                             int warmup_ms = 0, TimedWindow* window = nullptr);
// The same for several ways of doing one thing, their samples taken in turn (a batch of the
// first, one of the second, ..., `repeat` times), so that clock drift and heat reach all alike and
// their ratios are fair; one median per function, in order, and one window for all.
std::vector<double> alternating_median_device_seconds(const std::vector<std::function<void()>>& fns,
                                                      int warmup, int repeat, int warmup_ms = 0,
                                                      TimedWindow* window = nullptr);

}  // namespace flexcp::tools
