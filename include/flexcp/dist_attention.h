// Distributed attention over a communicator (DESIGN §3): each rank holds its chunks of q, k and v
// (the plan's dispatch), receives exactly the remote K/V its work needs in stages that overlap with
// compute, and merges partial results through their LSE. The backward returns dK/dV partials of
// received K/V to their owners (group-reduce).
//
// One DistAttention per mask serves any number of layers: each forward returns a DistContext that
// owns what its backward needs (the K/V columns it gathered), so backwards may run in any order:
//
//   DistContext c1 = attn.forward(q1, k1, v1, out1, lse1);
//   DistContext c2 = attn.forward(q2, k2, v2, out2, lse2);
//   attn.backward(c2, dout2, q2, out2, lse2, dq2, dk2, dv2);
//   attn.backward(c1, dout1, q1, out1, lse1, dq1, dk1, dv1);
//
// Tensors live where options.plan.device says, and the communicator must move that memory: host
// tensors over `local` or `mpi` (the CPU kernels, stage by stage), device tensors over `nccl` or
// `staged` (flexcp/comm.h; CUDA builds). On device tensors every call is stream-ordered on the
// forward's options.cuda_stream (its backward runs there too): the forward's stage 0 runs on the
// own K/V while the later stages' K/V arrive on the communicator's stream, each stage's kernel
// waiting only for its own data, and the stages' fp32 partials merge on the GPU; the backward runs
// one kernel over all columns, dK/dV partials travel in fp32 and each owner adds them in a fixed
// order and rounds once (deterministic). Their DistStats are timed by events on the stream.
// dispatch_* and undispatch_* take host tensors in both cases.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "flexcp/attention.h"
#include "flexcp/comm.h"
#include "flexcp/export.h"
#include "flexcp/mask.h"
#include "flexcp/plan.h"

namespace flexcp {

struct DistAttentionOptions {
  // world_size, heads, head_dim and dtype come from the communicator and the arguments; the rest
  // is used.
  PlanOptions plan;
};

struct StageTiming {
  // Forward: waiting for this stage's K/V. Backward: stage 0 only (on device tensors), waiting for
  // the dK/dV partials of this rank's rows after every stage's kernel.
  double wait_ms = 0;
  double compute_ms = 0;  // the kernel on this stage's work
};

// What one forward (and the backward that took its context) moved and how long it took. On host
// tensors, host time. On device tensors, device time read from events on the stream: a forward
// stage's wait_ms is how long the stream stood still waiting for that stage's K/V (the exposed
// communication), its compute_ms its kernel and merge; the backward runs its stages the last
// first and stage 0 last (the first to run also computes the row statistics), each stage's
// partials travelling while the next computes; backward[0].wait_ms is what stayed exposed, and
// backward_ms adds dq and the owner's sum. Reading them waits on the host for the timed work.
struct DistStats {
  std::int64_t fwd_bytes_received = 0;  // K and V, in the input dtype, as the transport counted
  std::int64_t fwd_bytes_sent = 0;
  std::int64_t bwd_bytes_received = 0;  // dK and dV partials, fp32
  std::int64_t bwd_bytes_sent = 0;
  std::vector<StageTiming> forward;  // stage 0 (local) first
  std::vector<StageTiming> backward;
  double forward_ms = 0, backward_ms = 0;
};

// What a forward hands its backward. Movable, not copyable; empty when default-constructed or
// moved from. It belongs to the DistAttention that made it.
class FLEXCP_API DistContext {
 public:
  DistContext();
  DistContext(DistContext&&) noexcept;
  DistContext& operator=(DistContext&&) noexcept;
  ~DistContext();
  bool empty() const;
  const DistStats& stats() const;  // the forward's, and the backward's once it ran

  struct State;

 private:
  explicit DistContext(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
  friend class DistAttention;
};

class FLEXCP_API DistAttention {
 public:
  // Plans for `mask` on comm.size() ranks: the dispatch, then this rank's own plan. Every rank
  // must pass the same mask, shapes and options: this is checked (an all-gather of a fingerprint)
  // before any data moves. `comm` must outlive this object.
  DistAttention(const Mask& mask, Communicator& comm, std::int64_t heads_q, std::int64_t heads_kv,
                std::int64_t head_dim, DType dtype, const DistAttentionOptions& options = {});
  ~DistAttention();
  DistAttention(const DistAttention&) = delete;
  DistAttention& operator=(const DistAttention&) = delete;

  // This rank's plan (and the dispatch every rank shares).
  const Plan& plan() const;
  int rank() const;
  std::int64_t local_q_tokens() const;
  std::int64_t local_k_tokens() const;
  // Global positions of this rank's q tokens, in local order (for RoPE).
  std::vector<std::int64_t> position_ids() const;

  // Global [T, H, D] tensors (the same on every rank) to this rank's rows, no communication.
  void dispatch_q(const TensorView& global, const TensorView& local) const;
  void dispatch_kv(const TensorView& global, const TensorView& local) const;
  // Every rank's local rows back into the global tensor on every rank (collective).
  void undispatch_q(const TensorView& local, const TensorView& global);
  void undispatch_kv(const TensorView& local, const TensorView& global);

  // Local shards: q [Tq_local, Hq, D], k and v [Tk_local, Hk, D], out [Tq_local, Hq, D] (input
  // dtype), lse [Tq_local, Hq] fp32. Collective. The context keeps the K/V columns this rank's
  // work read (its own and the received ones) and the options (scale, softcap, a copy of the
  // sink: fp32 [Hq] in host memory), so k, v and the sink may change once it returns. Every rank
  // must pass the same options (not checked per call).
  DistContext forward(const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& out, const TensorView& lse,
                      const AttentionOptions& options = {});
  // Gradients of the forward that returned `context`: q, out and lse are that forward's; dk and
  // dv are this rank's own K/V rows, with every rank's partials summed. dsink (fp32 [Hq]) receives
  // the sink gradient summed over all ranks when the forward had a sink and dsink is given.
  // Collective. A context from another DistAttention, or an empty one, is an error.
  void backward(DistContext& context, const TensorView& dout, const TensorView& q,
                const TensorView& out, const TensorView& lse, const TensorView& dq,
                const TensorView& dk, const TensorView& dv, const TensorView& dsink = {});

  // The K/V columns this rank's work reads, [own rows, then received ranges in stage order]:
  // k_buffer and v_buffer are [Tk_local + received, Hk, D] in the input dtype. Collective. On
  // CUDA tensors it runs on the legacy default stream and has finished when it returns; k and v
  // written on a non-blocking stream must be finished first (that stream synchronized).
  void gather_kv(const TensorView& k, const TensorView& v, const TensorView& k_buffer,
                 const TensorView& v_buffer);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flexcp
