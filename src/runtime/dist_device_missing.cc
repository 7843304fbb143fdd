// Builds without CUDA: DistAttention runs on host tensors only.
#include "flexcp/status.h"
#include "runtime/dist_device.h"

namespace flexcp::runtime {

struct DeviceRun {};
struct DeviceTimeline {};

void DeviceTimelineDeleter::operator()(DeviceTimeline* t) const {
  delete t;
}

void DeviceRunDeleter::operator()(DeviceRun* run) const {
  delete run;
}

TensorView DeviceColumns::sink_view() const {
  return {};
}

DeviceRunPtr make_device_run(const DistCore&) {
  throw Error(Status::kNotCompiled,
              "flexcp::DistAttention: plan.device is cuda but this build of flexcp has no CUDA "
              "kernels (configure with CUDA to run on device tensors)");
}

void device_forward(DistCore&, DistContext::State&, const TensorView&, const TensorView&,
                    const TensorView&, const TensorView&, const TensorView&,
                    const AttentionOptions&) {}
void device_backward(DistCore&, DistContext::State&, const TensorView&, const TensorView&,
                     const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                     const TensorView&, const TensorView&) {}
void read_device_timings(DistContext::State&) {}
void device_gather_kv(DistCore&, const TensorView&, const TensorView&, const TensorView&,
                      const TensorView&) {}

}  // namespace flexcp::runtime
