// The sm90 backward's kernels before and after the main one (bwd_rowstats.cu): row statistics,
// the zeroed dQ accumulator and the sink gradient's partials before; dq in the input dtype and
// dsink after.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/sm90/bwd_scratch.h"

namespace flexcp::sm90 {

struct RowStatsParams {
  BwdScratch scratch;
  const void* out = nullptr;   // [Tq, Hq, D], unit stride along D
  const void* dout = nullptr;  // [Tq, Hq, D], unit stride along D
  std::int64_t out_stride_t = 0, out_stride_h = 0;
  std::int64_t dout_stride_t = 0, dout_stride_h = 0;
  const float* lse = nullptr;  // [Tq, Hq]
  std::int64_t lse_stride_t = 0, lse_stride_h = 0;
  void* dq = nullptr;  // [Tq, Hq, D], unit stride along D, 16-byte aligned rows; null: not written
  std::int64_t dq_stride_t = 0, dq_stride_h = 0;
  const float* sink = nullptr;  // [Hq], or null
  float* dsink = nullptr;       // [Hq] with dsink_stride, or null
  std::int64_t dsink_stride = 1;
  std::int64_t seqlen_q = 0;
  std::int64_t heads_q = 0;
  int head_dim = 0;
  float scale = 0.f;  // dq = scale * accumulator
};

cudaError_t launch_bwd_preprocess(const RowStatsParams& p, bool bf16, cudaStream_t stream);
cudaError_t launch_bwd_postprocess(const RowStatsParams& p, bool bf16, int sms,
                                   cudaStream_t stream);

}  // namespace flexcp::sm90
