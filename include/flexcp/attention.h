// Attention over a flexible mask on one device (DESIGN §2's numerical contract).
//
// Shapes (packed THD layout): q [Tq, Hq, D], k and v [Tk, Hk, D], out [Tq, Hq, D], lse [Tq, Hq]
// (fp32, natural log). Hq % Hk == 0 (grouped-query attention). q, k, v, out, dout, dq, dk, dv
// share one dtype (fp32, bf16 or fp16); accumulation is fp32. Outputs are written, never read.
// Every tensor lives on one device: host memory, or one CUDA device (the sink too).
#pragma once

#include "flexcp/attention_plan.h"
#include "flexcp/export.h"
#include "flexcp/mask.h"
#include "flexcp/tensor.h"

namespace flexcp {

struct AttentionOptions {
  // Multiplies q.k; 0 means 1/sqrt(D).
  double scale = 0.0;
  // When > 0, logits become softcap * tanh(logit / softcap).
  double softcap = 0.0;
  // Optional per-head sink logits, fp32 [Hq] on the device of q: exp(sink[h]) joins each row's
  // denominator only.
  TensorView sink;
  // For device tensors: the cudaStream_t the kernel runs on (null: the legacy default stream).
  // The call returns once the work is queued; results are ready when the stream reaches it.
  void* cuda_stream = nullptr;
  // Backward on the GPU: dQ in a fixed order, the same bits on every run (a q-tile-major pass
  // recomputes S and dP: about 1.4x the work of the default, which sums dQ in arrival order).
  // The CPU backward, and dK, dV and dsink on the GPU, are deterministic either way.
  bool deterministic = false;
};

// out[q] = sum_k softmax_k(s(q, k)) v[k] over the keys q attends; lse[q] = log sum_k exp(s(q, k))
// (plus exp(sink) when given). A row that attends no key gets out = 0 and lse = -inf. out has the
// input dtype, or is fp32: then it receives the normalised fp32 sums unrounded (for a caller that
// merges partial outputs through their lse; rounded they are the bits the input dtype receives).
// The tensors must match the plan's shape. Device plans need a bound workspace.
FLEXCP_API void forward(const AttentionPlan& plan, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& out, const TensorView& lse,
                        const AttentionOptions& options = {});

// Gradients of forward. out and lse are forward's outputs. dq has the input dtype; dk and dv
// have it too, or are both fp32: then they receive the kernels' fp32 sums unrounded (for a caller
// that adds them to other partial gradients; rounded to the input dtype they are the bits the
// input dtype would have received). dsink (fp32 [Hq], on q's device) is
// written when the options carry a sink and dsink is not empty. The plan must have been built for
// the backward (AttentionPlanOptions). On the CPU the same inputs give the same bits; on the GPU
// dK, dV and dsink do, and dQ is summed in fp32 in the order its parts arrive (within the
// tolerance, not bit for bit) unless options.deterministic asks for a fixed order.
FLEXCP_API void backward(const AttentionPlan& plan, const TensorView& dout, const TensorView& q,
                         const TensorView& k, const TensorView& v, const TensorView& out,
                         const TensorView& lse, const TensorView& dq, const TensorView& dk,
                         const TensorView& dv, const AttentionOptions& options = {},
                         const TensorView& dsink = {});

// The same on a mask, planning on every call (and, for device tensors, with a workspace
// allocated and copied in stream order per call). Repeated calls over one mask, every layer of a
// model, should plan once instead.
FLEXCP_API void forward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const Mask& mask, const TensorView& out, const TensorView& lse,
                        const AttentionOptions& options = {});
FLEXCP_API void backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                         const TensorView& v, const TensorView& out, const TensorView& lse,
                         const Mask& mask, const TensorView& dq, const TensorView& dk,
                         const TensorView& dv, const AttentionOptions& options = {},
                         const TensorView& dsink = {});

// Float64 references: the plain definition, pair by pair, for tests. Inputs of any dtype are
// read as given; outputs are float64 views ([Tq, Hq, D], [Tq, Hq], ... as above).
FLEXCP_API void reference_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const Mask& mask, const TensorView& out, const TensorView& lse,
                                  const AttentionOptions& options = {});
FLEXCP_API void reference_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                                   const TensorView& v, const Mask& mask, const TensorView& dq,
                                   const TensorView& dk, const TensorView& dv,
                                   const AttentionOptions& options = {},
                                   const TensorView& dsink = {});

}  // namespace flexcp
