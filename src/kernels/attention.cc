// Public entry points: check the arguments, then dispatch on the device.
#include "flexcp/attention.h"

#include "core/checks.h"
#include "flexcp/status.h"
#include "kernels/cpu/cpu_attention.h"
#if defined(FLEXCP_WITH_CUDA)
#include "kernels/sm90/sm90_forward.h"
#endif

namespace flexcp {
namespace {

std::vector<Band> mask_work(const Mask& mask) {
  std::vector<Band> work;
  work.reserve(mask.slices().size());
  for (const Slice& s : mask.slices()) work.push_back(slice_band(s));
  return work;
}

[[noreturn]] void no_device_kernel(const char* fn, const char* why) {
  throw Error(Status::kNotCompiled,
              std::string(fn) + ": " + why + "; pass tensors in host memory (device cpu)");
}

}  // namespace

void forward(const TensorView& q, const TensorView& k, const TensorView& v, const Mask& mask,
             const TensorView& out, const TensorView& lse, const AttentionOptions& options) {
  const AttentionShape s =
      check_forward_args("flexcp::forward", q, k, v, mask, out, lse, options, false);
  if (s.device == Device::kCuda) {
#if defined(FLEXCP_WITH_CUDA)
    if (s.dtype == DType::kFloat32)
      throw Error(Status::kNotCompiled,
                  "flexcp::forward: q has dtype fp32; the CUDA kernel takes bf16 or fp16");
    sm90::forward(s, q, k, v, mask_work(mask), out, lse, options);
    return;
#else
    no_device_kernel("flexcp::forward", "this build has no CUDA kernels (configured without CUDA)");
#endif
  }
  cpu::forward(s, q, k, v, mask_work(mask), out, lse, options);
}

void backward(const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
              const TensorView& out, const TensorView& lse, const Mask& mask, const TensorView& dq,
              const TensorView& dk, const TensorView& dv, const AttentionOptions& options,
              const TensorView& dsink) {
  const AttentionShape s = check_backward_args("flexcp::backward", dout, q, k, v, out, lse, mask,
                                               dq, dk, dv, options, dsink, false);
  if (s.device != Device::kCpu)
    no_device_kernel("flexcp::backward", "the CUDA backward is not written yet");
  cpu::backward(s, dout, q, k, v, out, lse, mask_work(mask), dq, dk, dv, options, dsink);
}

}  // namespace flexcp
