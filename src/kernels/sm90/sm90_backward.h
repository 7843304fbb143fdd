// The Hopper (sm_90a) backward on device tensors. Arguments are checked by flexcp::backward
// first, the kernel's availability and limits when the plan was built; this layer checks what only
// the launch needs (layouts TMA can read, a bound backward plan, an sm_90 device) and only
// launches, in order on the stream: row statistics, the main kernel, dq and dsink.
#pragma once

#include "core/checks.h"
#include "flexcp/attention.h"
#include "kernels/plan/attention_plan_impl.h"

namespace flexcp::sm90 {

void backward(const CallShape& s, const AttentionPlan::Impl& plan, const TensorView& dout,
              const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
              const TensorView& lse, const TensorView& dq, const TensorView& dk,
              const TensorView& dv, const AttentionOptions& options, const TensorView& dsink);

}  // namespace flexcp::sm90
