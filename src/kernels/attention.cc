// Public entry points: check the arguments against the plan, then dispatch on the device. The
// mask entries plan first (and, on the GPU, bind a workspace for the one call).
#include "flexcp/attention.h"

#include "core/checks.h"
#include "flexcp/status.h"
#include "kernels/cpu/cpu_attention.h"
#include "kernels/plan/attention_plan_impl.h"
#if defined(FLEXCP_WITH_CUDA)
#include "kernels/cuda/runtime.h"
#include "kernels/sm90/sm90_backward.h"
#include "kernels/sm90/sm90_forward.h"
#endif

namespace flexcp {
namespace {

const AttentionPlan::Impl& plan_of(const std::string& fn, const AttentionPlan& plan) {
  if (plan.empty())
    throw Error(Status::kInvalidUsage,
                fn + ": the plan is empty (default-constructed or moved from)");
  return plan.impl();
}

// Runs `run` with a workspace for `plan` that lives for this call only, allocated and released in
// order on the stream (the mask entries' convenience; plans that are reused bind once).
template <class Run>
void with_call_workspace(const std::string& fn, AttentionPlan& plan, void* stream, Run&& run) {
#if defined(FLEXCP_WITH_CUDA)
  const cuda::DeviceGuard guard(plan.shape().device_index, fn);
  auto st = static_cast<cudaStream_t>(stream);
  // A graph would keep this call's workspace address and replay a copy of work lists that are
  // gone by then; refused before anything is enqueued, so that the capture stays usable.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cuda::check(cudaStreamIsCapturing(st, &capture), fn, "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone)
    throw Error(Status::kInvalidUsage,
                fn + ": the stream is capturing a CUDA graph, and a call with a mask plans and "
                     "copies its work lists each time; build an AttentionPlan once (in Python "
                     "flexcp.AttentionPlan), bind its workspace, and pass the plan instead");
  void* workspace = nullptr;
  cuda::check(cudaMallocAsync(&workspace, plan.workspace_bytes(), st), fn,
              "cudaMallocAsync (the call's workspace)");
  try {
    plan.bind_workspace(workspace, plan.workspace_bytes(), stream);
    run();
  } catch (...) {
    cudaFreeAsync(workspace, st);
    throw;
  }
  cuda::check(cudaFreeAsync(workspace, st), fn, "cudaFreeAsync (the call's workspace)");
#else
  (void)fn, (void)plan, (void)stream, (void)run;
#endif
}

}  // namespace

void forward(const AttentionPlan& plan, const TensorView& q, const TensorView& k,
             const TensorView& v, const TensorView& out, const TensorView& lse,
             const AttentionOptions& options) {
  const ArgChecker c("flexcp::forward");
  const AttentionPlan::Impl& p = plan_of(c.fn(), plan);
  const CallShape s = check_forward(c, p.shape, q, k, v, out, lse, options);
#if defined(FLEXCP_WITH_CUDA)
  if (s.device == Device::kCuda) return sm90::forward(s, p, q, k, v, out, lse, options);
#endif
  // A CUDA plan cannot exist in a build without CUDA kernels (the plan refused it).
  cpu::forward(s, p, q, k, v, out, lse, options);
}

void backward(const AttentionPlan& plan, const TensorView& dout, const TensorView& q,
              const TensorView& k, const TensorView& v, const TensorView& out,
              const TensorView& lse, const TensorView& dq, const TensorView& dk,
              const TensorView& dv, const AttentionOptions& options, const TensorView& dsink) {
  const ArgChecker c("flexcp::backward");
  const AttentionPlan::Impl& p = plan_of(c.fn(), plan);
  const CallShape s =
      check_backward(c, p.shape, dout, q, k, v, out, lse, dq, dk, dv, options, dsink);
  if (!p.backward)
    throw Error(
        Status::kInvalidUsage,
        c.fn() +
            ": the plan was built for the forward only (AttentionPlanOptions::backward = false); "
            "build it with backward = true");
#if defined(FLEXCP_WITH_CUDA)
  if (s.device == Device::kCuda)
    return sm90::backward(s, p, dout, q, k, v, out, lse, dq, dk, dv, options, dsink);
#endif
  cpu::backward(s, p, dout, q, k, v, out, lse, dq, dk, dv, options, dsink);
}

void forward(const TensorView& q, const TensorView& k, const TensorView& v, const Mask& mask,
             const TensorView& out, const TensorView& lse, const AttentionOptions& options) {
  const ArgChecker c("flexcp::forward");
  const AttentionShape shape = read_shape(c, q, k, v);
  check_mask(c, shape, mask);
  check_forward(c, shape, q, k, v, out, lse, options);  // every argument named before planning
  AttentionPlan plan =
      make_attention_plan(mask_bands(mask), shape, "flexcp::forward", {.backward = false});
  if (shape.device == Device::kCuda)
    with_call_workspace(c.fn(), plan, options.cuda_stream,
                        [&] { forward(plan, q, k, v, out, lse, options); });
  else
    forward(plan, q, k, v, out, lse, options);
}

void backward(const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
              const TensorView& out, const TensorView& lse, const Mask& mask, const TensorView& dq,
              const TensorView& dk, const TensorView& dv, const AttentionOptions& options,
              const TensorView& dsink) {
  const ArgChecker c("flexcp::backward");
  const AttentionShape shape = read_shape(c, q, k, v);
  check_mask(c, shape, mask);
  check_backward(c, shape, dout, q, k, v, out, lse, dq, dk, dv, options, dsink);
  AttentionPlan plan = make_attention_plan(mask_bands(mask), shape, "flexcp::backward");
  if (shape.device == Device::kCuda)
    with_call_workspace(c.fn(), plan, options.cuda_stream, [&] {
      backward(plan, dout, q, k, v, out, lse, dq, dk, dv, options, dsink);
    });
  else
    backward(plan, dout, q, k, v, out, lse, dq, dk, dv, options, dsink);
}

}  // namespace flexcp
