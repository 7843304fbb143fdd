// The sm90 backward's small kernels around the main one (bwd_kernel.cuh):
//   before: per (row, q head) delta = <dout, out> and lse2 = lse log2(e) (+inf for a row that
//           attends nothing), the dQ accumulator zeroed, and the sink gradient's partial sums;
//   after:  dq = scale * accumulator in the input dtype, and dsink summed in a fixed order.
// In the deterministic mode dq comes from its own pass (bwd_dq_kernel.cuh): the accumulator is
// neither zeroed nor read (its pointer and dq are null here).
// Memory-bound: 16-byte accesses, several rows per warp in flight. The main kernel overlaps the
// first's tail and the conversion the main kernel's (launch.cuh, programmatic dependent launch).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <limits>

#include "kernels/lse_merge.h"
#include "kernels/sm90/bwd_rowstats.h"
#include "kernels/sm90/grid_dependency.cuh"
#include "kernels/sm90/launch.cuh"

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

// Reads and writes move 16 bytes per lane (check_layout asked for 16-byte aligned rows and
// strides; the head dims are multiples of 8): kLanes lanes per row, 32 / kLanes rows per warp at
// once, so that a warp keeps several rows' loads in flight.
constexpr int kVec = 8;  // elements of a 16-byte load

template <class T>
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b) {
  const T* x = reinterpret_cast<const T*>(&a);
  const T* y = reinterpret_cast<const T*>(&b);
  float dot = 0.f;
#pragma unroll
  for (int i = 0; i < kVec; ++i) dot += to_float(x[i]) * to_float(y[i]);
  return dot;
}

// Block b handles rows [64 x, 64 x + 64) of q head h, where x = b / Hq and h = b % Hq: the q heads
// vary fastest, so that the blocks running together read and write one contiguous stretch of
// tokens (out, dout and the accumulator are [token, head, dim]) rather than one head's rows a
// head's stride apart. Measured 10% less time than rows-fastest, at 86% of DRAM's peak rather
// than 81%, and 7% fewer DRAM bytes read (bench/results/h100-2026-12-06.md section 14).
template <class T, int kLanes>
__global__ void __launch_bounds__(32 * kWarps) bwd_preprocess(const RowStatsParams p) {
  constexpr int kRowsAtOnce = 32 / kLanes;
  static_assert(kRowsPerWarp % kRowsAtOnce == 0);
  const std::int64_t x = std::int64_t(blockIdx.x) / p.heads_q;
  const int h = int(std::int64_t(blockIdx.x) % p.heads_q);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int c = lane % kLanes * kVec;
  const bool leader = lane % kLanes == 0;  // writes its row's statistics
  const float sink = p.sink != nullptr ? p.sink[h] : 0.f;
  float sink_part = 0.f;  // this leader's rows, in order
  for (int r = lane / kLanes; r < kRowsPerWarp; r += kRowsAtOnce) {
    const std::int64_t t = x * kRowsPerBlock + warp * kRowsPerWarp + r;
    float dot = 0.f;
    if (t < p.seqlen_q) {
      const T* o = static_cast<const T*>(p.out) + t * p.out_stride_t + h * p.out_stride_h;
      const T* d = static_cast<const T*>(p.dout) + t * p.dout_stride_t + h * p.dout_stride_h;
      dot = dot8<T>(*reinterpret_cast<const uint4*>(o + c), *reinterpret_cast<const uint4*>(d + c));
      if (p.scratch.dq_accum != nullptr) {  // null when dq comes from the deterministic pass
        float4* a =
            reinterpret_cast<float4*>(p.scratch.dq_accum + (t * p.heads_q + h) * p.head_dim + c);
        a[0] = a[1] = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    // Every lane shuffles (rows past the end included, with zeros), so the mask stays full.
    for (int s = kLanes / 2; s > 0; s /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, s);
    if (!leader || t >= p.scratch.stats_stride) continue;
    float lse2 = INFINITY;  // rows past seqlen_q: statistics padding
    if (t < p.seqlen_q) {
      const float lse = p.lse[t * p.lse_stride_t + h * p.lse_stride_h];
      if (lse != -INFINITY) {
        lse2 = lse * kLog2e;
        if (p.sink != nullptr) sink_part -= expf(sink - lse) * dot;
      }
    }
    p.scratch.lse2[h * p.scratch.stats_stride + t] = lse2;
    p.scratch.delta[h * p.scratch.stats_stride + t] = dot;
  }
  detail::allow_next_kernel_to_launch();  // the main kernel, queued behind (it waits for these)
  // Blocks past the rows (statistics padding) have no partial.
  if (p.sink == nullptr || x >= p.scratch.stats_blocks) return;
  // The warp's leaders' parts in a fixed order (non-leaders hold zero), then the warps'.
  for (int s = kLanes; s < 32; s *= 2) sink_part += __shfl_xor_sync(0xffffffffu, sink_part, s);
  __shared__ float parts[kWarps];
  if (lane == 0) parts[warp] = sink_part;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.f;
    for (int w = 0; w < kWarps; ++w) sum += parts[w];
    p.scratch.dsink_partial[h * p.scratch.stats_blocks + x] = sum;
  }
}

// dq = scale * accumulator: one thread per 8 elements. Launched to overlap the main kernel's tail
// (launch.cuh), so it waits for it first.
template <class T>
__global__ void bwd_postprocess(const RowStatsParams p) {
  detail::wait_for_previous_kernel();
  const int per_row = p.head_dim / kVec;
  const std::int64_t octs = p.seqlen_q * p.heads_q * per_row;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < octs;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t row = i / per_row;
    const int c = int(i % per_row) * kVec;
    const std::int64_t t = row / p.heads_q, h = row % p.heads_q;
    const float4* a = reinterpret_cast<const float4*>(p.scratch.dq_accum) + 2 * i;
    const float4 lo = __ldcs(a), hi = __ldcs(a + 1);  // read once: stream past the caches
    // Each 8-column group in the order 0 2 4 6 1 3 5 7, as the main kernel stages and adds it
    // (bwd_mainloop.cuh): column 2 i is lo's i-th value, column 2 i + 1 hi's.
    static_assert(kVec == 8);
    const float f[kVec] = {lo.x, hi.x, lo.y, hi.y, lo.z, hi.z, lo.w, hi.w};
    uint4 packed;
    T* out = reinterpret_cast<T*>(&packed);
#pragma unroll
    for (int j = 0; j < kVec; ++j) out[j] = from_float<T>(f[j] * p.scale);
    *reinterpret_cast<uint4*>(static_cast<T*>(p.dq) + t * p.dq_stride_t + h * p.dq_stride_h + c) =
        packed;
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
  // One dimension of up to 2^31 - 1 blocks: 2^37 (row, q head) pairs, whose fp32 accumulator
  // (2^39 D bytes) no device holds, so the scratch's allocation fails long before this does.
  const std::int64_t blocks =
      (p.scratch.stats_stride + kRowsPerBlock - 1) / kRowsPerBlock * p.heads_q;
  if (blocks > std::numeric_limits<std::int32_t>::max()) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(blocks));
  switch (p.head_dim) {  // the head dims the kernels are built for (the plan checked)
    case 64:
      bwd_preprocess<T, 64 / kVec><<<grid, 32 * kWarps, 0, stream>>>(p);
      break;
    case 128:
      bwd_preprocess<T, 128 / kVec><<<grid, 32 * kWarps, 0, stream>>>(p);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_all_after(const RowStatsParams& p, int sms, cudaStream_t stream) {
  if (p.seqlen_q > 0 && p.dq != nullptr) {
    const std::int64_t octs = p.seqlen_q * p.heads_q * (p.head_dim / kVec);
    const std::int64_t blocks = std::min<std::int64_t>((octs + 255) / 256, 8LL * sms);
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(blocks));
    config.blockDim = dim3(256);
    config.stream = stream;
    cudaLaunchAttribute overlap = overlap_previous_attribute();
    config.attrs = &overlap;
    config.numAttrs = 1;
    if (const cudaError_t err = cudaLaunchKernelEx(&config, bwd_postprocess<T>, p);
        err != cudaSuccess)
      return err;
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
