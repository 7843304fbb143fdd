// The Hopper (sm_90a) forward on device tensors. Arguments are checked by flexcp::forward first;
// this layer checks what only the GPU path needs (layout for TMA, compiled instantiation, device).
#pragma once

#include <vector>

#include "core/checks.h"
#include "flexcp/attention.h"
#include "flexcp/band.h"

namespace flexcp::sm90 {

// Whether an instantiation for this dtype and head dim is compiled into the build.
bool compiled(DType dtype, std::int64_t head_dim);

// Attention over `work` (bands in (q, k) coordinates) on options.cuda_stream. The device work list
// is built once per (mask, device, packing) and kept in a small cache, so repeated calls over one
// mask (every layer of a model) cost only the launch.
void forward(const AttentionShape& s, const TensorView& q, const TensorView& k, const TensorView& v,
             const std::vector<Band>& work, const TensorView& out, const TensorView& lse,
             const AttentionOptions& options);

}  // namespace flexcp::sm90
