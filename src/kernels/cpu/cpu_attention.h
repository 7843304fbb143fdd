// The CPU kernels. Arguments are already checked (core/checks.h); the tensors are in host memory.
// The work is a set of bands over (q row, k column) of these tensors: a mask's slices, or one
// stage of a rank's local work in a distributed plan. Outputs may be of any dtype (the runtime
// accumulates stages in fp32).
#pragma once

#include <vector>

#include "core/checks.h"
#include "flexcp/attention.h"
#include "flexcp/band.h"

namespace flexcp::cpu {

void forward(const AttentionShape& shape, const TensorView& q, const TensorView& k,
             const TensorView& v, const std::vector<Band>& work, const TensorView& out,
             const TensorView& lse, const AttentionOptions& options);

void backward(const AttentionShape& shape, const TensorView& dout, const TensorView& q,
              const TensorView& k, const TensorView& v, const TensorView& out,
              const TensorView& lse, const std::vector<Band>& work, const TensorView& dq,
              const TensorView& dk, const TensorView& dv, const AttentionOptions& options,
              const TensorView& dsink);

// Gradient of the per-head sink logits over these q rows (fp32 [Hq] into dsink); needs a sink.
void sink_gradient(const AttentionShape& shape, const TensorView& dout, const TensorView& out,
                   const TensorView& lse, const AttentionOptions& options, const TensorView& dsink);

// Tile sizes, shared by both directions: a q tile holds about kTileRowsTarget (token, head) rows,
// so the Q, O and S buffers of one worker (about 200 KiB at D = 128) stay in its L2 cache.
inline constexpr int kTileRowsTarget = 128;
inline constexpr int kMinTileTokens = 16;
inline constexpr int kBlockCols = 64;  // columns of S per step: one micro-kernel width on AVX-512
inline int q_tile_tokens(int group) {
  const int t = kTileRowsTarget / group;
  return t < kMinTileTokens ? kMinTileTokens : t;
}

}  // namespace flexcp::cpu
