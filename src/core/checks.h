// The one place where attention arguments are checked. Messages read
// "flexcp::forward: q has 2 dims, expected [T, H, D]".
#pragma once

#include <cstdint>

#include "flexcp/attention.h"

namespace flexcp {

struct AttentionShape {
  std::int64_t seqlen_q = 0, seqlen_k = 0;
  std::int64_t heads_q = 0, heads_kv = 0, head_dim = 0;
  DType dtype = DType::kFloat32;
  Device device = Device::kCpu;
  double scale = 0.0;  // resolved: 1/sqrt(D) when the options say 0
  std::int64_t group() const { return heads_q / heads_kv; }
};

// Outputs of `out_dtype` (the input dtype for kernels, fp64 for references).
AttentionShape check_forward_args(const char* fn, const TensorView& q, const TensorView& k,
                                  const TensorView& v, const Mask& mask, const TensorView& out,
                                  const TensorView& lse, const AttentionOptions& options,
                                  bool reference);

AttentionShape check_backward_args(const char* fn, const TensorView& dout, const TensorView& q,
                                   const TensorView& k, const TensorView& v, const TensorView& out,
                                   const TensorView& lse, const Mask& mask, const TensorView& dq,
                                   const TensorView& dk, const TensorView& dv,
                                   const AttentionOptions& options, const TensorView& dsink,
                                   bool reference);

}  // namespace flexcp
