// DistAttention on device tensors (plan.device cuda, a communicator on device memory: nccl or
// staged). The rank's work of every stage runs as one kernel plan over its K/V columns (own rows,
// then the received pieces), bound once to a workspace the DistAttention owns:
//   forward:  own rows into the context's column buffers; every stage's K/V exchange started on
//             the caller's stream, each waited on in stream order; one forward over all columns
//             straight into out and lse (so its rounding is the single-GPU kernel's);
//   backward: one backward over all columns with dK and dV in fp32; each stage's received
//             columns' partials returned to their owners; each owner adds the partials it gets to
//             its own rows in a fixed order (pieces in plan order) and rounds once; dsink summed
//             over ranks in rank order.
// Nothing waits on the host but the dsink sum. Not yet: the per-stage overlap of the forward (the
// kernel would need fp32 partial outputs to merge stages without rounding between them) and the
// per-stage timings (DistStats has the bytes).
#pragma once

#include <cstdint>
#include <memory>

#include "flexcp/attention.h"
#include "flexcp/dist_attention.h"
#include "flexcp/plan.h"

namespace flexcp::runtime {

struct DistCore;

// A context's device memory: the K/V columns and a copy of the sink, each freed in stream order
// on the stream of the forward that allocated it (which must outlive the context). Its backward
// runs on that stream too.
struct DeviceColumns {
  std::shared_ptr<void> k, v, sink;
  void* stream = nullptr;
  std::int64_t heads_q = 0;
  int device_index = 0;
  TensorView sink_view() const;
};

struct DeviceRun;  // the kernel plan over all columns and its workspace
struct DeviceRunDeleter {
  void operator()(DeviceRun* run) const;
};
using DeviceRunPtr = std::unique_ptr<DeviceRun, DeviceRunDeleter>;

// Checks that `comm` moves device memory and builds the plan (Error kNotCompiled in builds
// without CUDA).
DeviceRunPtr make_device_run(const DistCore& m);

void device_forward(DistCore& m, DistContext::State& ctx, const TensorView& q, const TensorView& k,
                    const TensorView& v, const TensorView& out, const TensorView& lse,
                    const AttentionOptions& options);
void device_backward(DistCore& m, DistContext::State& ctx, const TensorView& dout,
                     const TensorView& q, const TensorView& out, const TensorView& lse,
                     const TensorView& dq, const TensorView& dk, const TensorView& dv,
                     const TensorView& dsink);
// gather_kv on device tensors: on the default stream, finished when it returns.
void device_gather_kv(DistCore& m, const TensorView& k, const TensorView& v,
                      const TensorView& k_buffer, const TensorView& v_buffer);

}  // namespace flexcp::runtime
