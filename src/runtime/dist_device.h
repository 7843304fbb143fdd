// DistAttention on device tensors (plan.device cuda, a communicator on device memory: nccl or
// staged), bound once to kernel plans and a workspace the DistAttention owns:
//   forward:  every stage's K/V exchange started on the caller's stream (sends read the caller's
//             shards; the communicator's own stream carries them); stage 0 runs on the caller's
//             shards at once while the own rows are copied into the context's columns on a side
//             stream, and each later stage's kernel waits in stream order for that stage's K/V
//             only. With remote stages, each stage's plan writes an fp32 partial out and lse,
//             merged on the GPU through their lse, the sink folded in once and out rounded once;
//             without, one kernel writes out and lse directly (the bare kernel's bits);
//   backward: stage by stage, the last-received stage first and stage 0 last, each a keys-only
//             plan adding its fp32 dK/dV into the columns (the row statistics and the dQ
//             accumulator are the plan over all columns'); a stage's exchange returns its
//             columns' partials to their owners while the stages after it compute; each owner
//             adds the partials it gets to its own rows in a fixed order (pieces in plan order)
//             and rounds once; dsink summed over ranks in rank order. A rank that received
//             nothing and whose rows nobody read gets dK/dV from one kernel in its dtype.
// Scratch memory (the forward's fp32 partials, the backward's fp32 columns and partials) is sized
// once per plan and reused by every call; each call waits for the previous one to end, on any
// stream (all share the workspace). Events on the stream time each stage (the forward's exposed
// wait for data and its kernel; the backward's kernels and its wait for the partials); the
// context reads them when its stats are asked for. Nothing waits on the host but the dsink sum
// (and the staged communicator, by design).
#pragma once

#include <cstdint>
#include <memory>

#include "flexcp/attention.h"
#include "flexcp/dist_attention.h"
#include "flexcp/plan.h"

namespace flexcp::runtime {

struct DistCore;

struct DeviceTimeline;  // the events of one forward and its backward
struct DeviceTimelineDeleter {
  void operator()(DeviceTimeline* t) const;
};

// A context's device memory: the K/V columns and a copy of the sink, from the DistAttention's
// memory pool (which keeps them for the next step's contexts), each freed in stream order on the
// stream of the forward that allocated it (which must outlive the context). Its backward
// runs on that stream too.
struct DeviceColumns {
  std::shared_ptr<void> k, v, sink;
  void* stream = nullptr;
  std::int64_t heads_q = 0;
  int device_index = 0;
  std::unique_ptr<DeviceTimeline, DeviceTimelineDeleter> timeline;
  TensorView sink_view() const;
};

struct DeviceRun;  // the kernel plans over the columns and their workspace
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
// Fills the stats' stage timings, forward_ms and backward_ms from the context's events (waiting
// for them on the host), once per direction; nothing for host contexts.
void read_device_timings(DistContext::State& ctx);
// gather_kv on device tensors: on the default stream, finished when it returns.
void device_gather_kv(DistCore& m, const TensorView& k, const TensorView& v,
                      const TensorView& k_buffer, const TensorView& v_buffer);

}  // namespace flexcp::runtime
