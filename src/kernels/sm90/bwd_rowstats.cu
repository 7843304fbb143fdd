// The sm90 backward's small kernels around the main one (bwd_kernel.cuh):
//   before: per (row, q head) delta = <dout, out> and lse2 = lse log2(e) (+inf for a row that
//           attends nothing), the dQ accumulator zeroed, and the sink gradient's partial sums;
//   after:  dq = scale * accumulator in the input dtype, and dsink summed in a fixed order.
// In the deterministic mode dq comes from its own pass (bwd_dq_kernel.cuh): the accumulator is
// neither zeroed nor read (its pointer and dq are null here).
// Memory-bound and simple: one warp per row, so that the reads of a row's D elements coalesce.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/lse_merge.h"
#include "kernels/sm90/bwd_rowstats.h"

namespace flexcp::sm90 {
namespace {

constexpr int kRowsPerBlock = tiles::kSm90BwdBlockM;  // one partial sink sum per block
constexpr int kWarps = 8;
constexpr int kRowsPerWarp = kRowsPerBlock / kWarps;

__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float(float x) {
  return __float2half_rn(x);
}

// Block (x, h) handles rows [64 x, 64 x + 64) of q head h.
template <class T>
__global__ void __launch_bounds__(32 * kWarps) bwd_preprocess(const RowStatsParams p) {
  const int h = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float sink = p.sink != nullptr ? p.sink[h] : 0.f;
  float sink_part = 0.f;  // this warp's rows, in order (lane 0's copy is the one kept)
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const std::int64_t t = std::int64_t(blockIdx.x) * kRowsPerBlock + warp * kRowsPerWarp + r;
    if (t >= p.scratch.stats_stride) break;
    float lse2 = INFINITY, delta = 0.f;
    if (t < p.seqlen_q) {
      const T* o = static_cast<const T*>(p.out) + t * p.out_stride_t + h * p.out_stride_h;
      const T* d = static_cast<const T*>(p.dout) + t * p.dout_stride_t + h * p.dout_stride_h;
      float dot = 0.f;
      for (int c = lane; c < p.head_dim; c += 32) dot += to_float(o[c]) * to_float(d[c]);
      if (p.scratch.dq_accum != nullptr)  // null when dq comes from the deterministic pass
        for (int c = lane; c < p.head_dim; c += 32)
          p.scratch.dq_accum[(t * p.heads_q + h) * p.head_dim + c] = 0.f;
      for (int s = 16; s > 0; s /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, s);
      delta = dot;
      const float lse = p.lse[t * p.lse_stride_t + h * p.lse_stride_h];
      if (lse != -INFINITY) {
        lse2 = lse * kLog2e;
        if (p.sink != nullptr) sink_part -= expf(sink - lse) * delta;
      }
    }
    if (lane == 0) {
      p.scratch.lse2[h * p.scratch.stats_stride + t] = lse2;
      p.scratch.delta[h * p.scratch.stats_stride + t] = delta;
    }
  }
  // Blocks past the rows (statistics padding) have no partial.
  if (p.sink == nullptr || blockIdx.x >= p.scratch.stats_blocks) return;
  __shared__ float parts[kWarps];
  if (lane == 0) parts[warp] = sink_part;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.f;
    for (int w = 0; w < kWarps; ++w) sum += parts[w];
    p.scratch.dsink_partial[h * p.scratch.stats_blocks + blockIdx.x] = sum;
  }
}

// dq = scale * accumulator: one thread per 4 elements (D is a multiple of 4).
template <class T>
__global__ void bwd_postprocess(const RowStatsParams p) {
  const std::int64_t quads = p.seqlen_q * p.heads_q * (p.head_dim / 4);
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < quads;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t row = i / (p.head_dim / 4);
    const int c = int(i % (p.head_dim / 4)) * 4;
    const std::int64_t t = row / p.heads_q, h = row % p.heads_q;
    const float4 a = reinterpret_cast<const float4*>(p.scratch.dq_accum)[i];
    T* out = static_cast<T*>(p.dq) + t * p.dq_stride_t + h * p.dq_stride_h + c;
    out[0] = from_float<T>(a.x * p.scale);
    out[1] = from_float<T>(a.y * p.scale);
    out[2] = from_float<T>(a.z * p.scale);
    out[3] = from_float<T>(a.w * p.scale);
  }
}

// dsink[h]: the partial sums of head h, one warp, in a fixed order (deterministic).
__global__ void bwd_sink_sum(const RowStatsParams p) {
  const int h = blockIdx.x, lane = threadIdx.x;
  float sum = 0.f;
  for (std::int64_t b = lane; b < p.scratch.stats_blocks; b += 32)
    sum += p.scratch.dsink_partial[h * p.scratch.stats_blocks + b];
  for (int s = 16; s > 0; s /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, s);
  if (lane == 0) p.dsink[h * p.dsink_stride] = sum;
}

template <class T>
cudaError_t launch_all_before(const RowStatsParams& p, cudaStream_t stream) {
  const dim3 grid(
      static_cast<unsigned>((p.scratch.stats_stride + kRowsPerBlock - 1) / kRowsPerBlock),
      static_cast<unsigned>(p.heads_q));
  bwd_preprocess<T><<<grid, 32 * kWarps, 0, stream>>>(p);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_all_after(const RowStatsParams& p, int sms, cudaStream_t stream) {
  if (p.seqlen_q > 0 && p.dq != nullptr) {
    const std::int64_t quads = p.seqlen_q * p.heads_q * (p.head_dim / 4);
    const std::int64_t blocks = std::min<std::int64_t>((quads + 255) / 256, 8LL * sms);
    bwd_postprocess<T><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p);
    if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  }
  if (p.sink != nullptr && p.dsink != nullptr) {
    bwd_sink_sum<<<static_cast<unsigned>(p.heads_q), 32, 0, stream>>>(p);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t launch_bwd_preprocess(const RowStatsParams& p, bool bf16, cudaStream_t stream) {
  if (p.scratch.stats_stride == 0) return cudaSuccess;
  return bf16 ? launch_all_before<__nv_bfloat16>(p, stream) : launch_all_before<__half>(p, stream);
}

cudaError_t launch_bwd_postprocess(const RowStatsParams& p, bool bf16, int sms,
                                   cudaStream_t stream) {
  return bf16 ? launch_all_after<__nv_bfloat16>(p, sms, stream)
              : launch_all_after<__half>(p, sms, stream);
}

}  // namespace flexcp::sm90
