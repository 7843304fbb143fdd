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

// The same in steps, for a problem whose keys run as several plans (DistAttention's stages: each
// stage's keys while the dK/dV partials of the stage before travel). `rows` is a backward plan over
// all of the problem's work (`s` its shape): its scratch holds the row statistics and the fp32 dQ
// accumulator that every step shares. Each `keys` plan (a keys-only plan, or `rows` itself) covers
// part of the work, over the first keys.shape.seqlen_k columns of k and v (views of that many
// rows). In order on options.cuda_stream:
//   backward_rows_begin  the row statistics and the sink's partial sums; the accumulator zeroed.
//   backward_keys        one keys plan: dK and dV of its key tiles (every tile of its columns,
//                        zeros where it has no work), stored, or with add_dkv (fp32 dk and dv)
//                        added to what they hold; dQ summed into the accumulator (deterministic
//                        mode: left to the dQ pass). Kernels of different keys plans add to the
//                        same dK/dV rows only one after another (one stream).
//   backward_rows_end    dq (the deterministic mode's own pass over all of k and v, or the
//                        accumulator scaled and rounded) and dsink.
void backward_rows_begin(const CallShape& s, const AttentionPlan::Impl& rows,
                         const TensorView& dout, const TensorView& out, const TensorView& lse,
                         const AttentionOptions& options, const TensorView& dsink);
void backward_keys(const CallShape& s, const AttentionPlan::Impl& rows,
                   const AttentionPlan::Impl& keys, const TensorView& dout, const TensorView& q,
                   const TensorView& k, const TensorView& v, const TensorView& dk,
                   const TensorView& dv, const AttentionOptions& options, bool add_dkv);
void backward_rows_end(const CallShape& s, const AttentionPlan::Impl& rows, const TensorView& dout,
                       const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const TensorView& lse, const TensorView& dq,
                       const AttentionOptions& options, const TensorView& dsink);

}  // namespace flexcp::sm90
