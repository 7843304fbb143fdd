// The Hopper (sm_90a) forward on device tensors. Arguments are checked by flexcp::forward first,
// the kernel's availability and limits when the plan was built; this layer checks what only the
// launch needs (layouts TMA can read, a bound workspace, an sm_90 device) and only launches: no
// allocation, no copy, no synchronisation.
#pragma once

#include <string>

#include "core/checks.h"
#include "flexcp/attention.h"
#include "kernels/plan/attention_plan_impl.h"

namespace flexcp::sm90 {

// Whether an instantiation for this dtype and head dim is compiled into the build, and the list
// ("bf16/64, bf16/128, ...").
bool compiled(DType dtype, std::int64_t head_dim);
std::string compiled_list();

// Attention over the plan's work list (in its bound workspace) on options.cuda_stream.
void forward(const CallShape& s, const AttentionPlan::Impl& plan, const TensorView& q,
             const TensorView& k, const TensorView& v, const TensorView& out, const TensorView& lse,
             const AttentionOptions& options);

}  // namespace flexcp::sm90
