// The CPU kernels. Arguments are already checked (core/checks.h); the tensors are in host memory.
// They walk the plan's work lists (kernels/plan/): the mask's slices, or one stage of a rank's
// local work in a distributed plan. Outputs may be of any dtype (the runtime accumulates stages in
// fp32).
#pragma once

#include "core/checks.h"
#include "flexcp/attention.h"
#include "kernels/plan/attention_plan_impl.h"

namespace flexcp::cpu {

void forward(const CallShape& shape, const AttentionPlan::Impl& plan, const TensorView& q,
             const TensorView& k, const TensorView& v, const TensorView& out, const TensorView& lse,
             const AttentionOptions& options);

void backward(const CallShape& shape, const AttentionPlan::Impl& plan, const TensorView& dout,
              const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
              const TensorView& lse, const TensorView& dq, const TensorView& dk,
              const TensorView& dv, const AttentionOptions& options, const TensorView& dsink);

// Gradient of the per-head sink logits over these q rows (fp32 [Hq] into dsink); needs a sink.
void sink_gradient(const CallShape& shape, const TensorView& dout, const TensorView& out,
                   const TensorView& lse, const AttentionOptions& options, const TensorView& dsink);

}  // namespace flexcp::cpu
