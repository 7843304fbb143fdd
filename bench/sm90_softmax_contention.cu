// How long the sm90 forward's online softmax of one block takes, per consumer warp group, when
// it runs alone and beside the kinds of work it meets in the kernel: the other group's products
// (S-like, both operands in shared memory; P V-like, P from registers), its own P V-like product
// in flight (the kernel's intra-group overlap), and the other group's softmax. The forward's
// timeline (bench/results/h200-timeline-2026-12-04.md) shows the softmax at ~1565 cycles where
// its 64 exponentials a thread need 512 on the special-function unit, with the schedulers to
// itself: this says which neighbour, if any, slows it, and (the other group's cycles a product,
// beside the softmax and with the softmax group idle) whether the neighbour slows in turn. Its
// own S-like product in flight is the backward's case (the exponentials of P beside dP's product).
// A developer's measurement on a GPU host:
//   build/gpu/bench/sm90_softmax_contention
// The softmax is the kernel's own (fwd_softmax.cuh, an unmasked block); the products are the
// kernel's own MMA types on shared-memory tiles of zeros. Every SM runs one CTA, as the kernel
// does, so the chip's clock and power are as in a real launch; cycles are per SM, so they do not
// depend on the clock.
#include <cuda_runtime.h>
#include <cutlass/arch/reg_reconfig.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/sm90/fwd_config.cuh"
#include "kernels/sm90/fwd_softmax.cuh"
#include "kernels/sm90/kernel_common.cuh"

namespace {

using namespace flexcp::sm90;
namespace kd = flexcp::sm90::detail;  // (cute has a detail namespace too)
using Cfg = FwdConfig<cutlass::bfloat16_t, 128>;
constexpr int kBlockN = Cfg::kBlockN;
using Element = Cfg::Element;

// What runs beside the measured group's softmax; the last two leave that group idle, for the
// other group's products alone.
enum class Beside : int {
  kNothing,
  kSsProducts,
  kRsProducts,
  kOwnRsProduct,
  kOwnSsProduct,
  kSoftmax,
  kSsProductsOnly,
  kRsProductsOnly,
  kCount
};
constexpr const char* kBesideNames[] = {
    "alone",
    "beside the other group's S-like products (shared-memory operands)",
    "beside the other group's P V-like products (P from registers)",
    "with its own P V-like product in flight",
    "with its own S-like product in flight",
    "beside the other group's softmax",
    "no softmax: the other group's S-like products alone",
    "no softmax: the other group's P V-like products alone"};
static_assert(sizeof(kBesideNames) / sizeof(kBesideNames[0]) == int(Beside::kCount));
constexpr bool other_group_issues_products(Beside b) {
  return b == Beside::kSsProducts || b == Beside::kRsProducts || b == Beside::kSsProductsOnly ||
         b == Beside::kRsProductsOnly;
}
constexpr bool other_group_issues_ss(Beside b) {
  return b == Beside::kSsProducts || b == Beside::kSsProductsOnly;
}
// Per CTA: the softmax's cycles, then the other group's cycles and products.
constexpr int kFields = 3;
constexpr int kIterations = 4096;
constexpr int kThreads = 384;  // as the kernel: a (here idle) producer group and two consumers

// P in the A-operand register layout of P V, as the forward keeps it.
using PLayout = cute::Layout<
    cute::Shape<cute::Shape<cute::_2, cute::_2, cute::_2>, cute::_1, cute::Int<kBlockN / 16>>>;

template <Beside kBeside>
__global__ void __launch_bounds__(kThreads, 1)
    softmax_beside(const __grid_constant__ FwdParams p, unsigned long long* out, float* sink) {
  using namespace cute;
  extern __shared__ char smem_raw[];
  auto& ss = kd::shared_storage<Cfg::SharedStorage>(smem_raw);
  __shared__ volatile int measured_done;
  __shared__ volatile int group_stop;  // measured_done as the other group last read it
  for (int i = threadIdx.x; i < int(ss.q.size()); i += kThreads) ss.q[i] = Element(0.f);
  for (int i = threadIdx.x; i < int(ss.k.size()); i += kThreads) ss.k[i] = Element(0.f);
  for (int i = threadIdx.x; i < int(ss.v.size()); i += kThreads) ss.v[i] = Element(0.f);
  if (threadIdx.x == 0) measured_done = 0;
  cutlass::arch::fence_view_async_shared();  // the tiles, visible to the tensor cores
  __syncthreads();
  const int wg = threadIdx.x / 128;
  // The kernel's register split: at the launch bound's 168 a thread, ptxas serialises the P V-like
  // products (C7511), which would run them at a fraction of the kernel's rate.
  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegs>();

  Cfg::MmaQK mma_qk;
  Cfg::MmaPV mma_pv;
  Tensor tSrS = partition_fragment_C(mma_qk, select<0, 1>(Cfg::TileQK{}));
  Tensor tOrO = partition_fragment_C(mma_pv, select<0, 1>(Cfg::TilePV{}));
  Tensor tOrP = make_tensor<Element>(PLayout{});
  clear(tSrS);
  clear(tOrO);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(tOrP); ++i) tOrP(i) = Element(0.f);
  const int first = (wg - 1) * 128;
  Tensor q = mma_qk.get_thread_slice(first).partition_fragment_A(
      make_tensor(make_smem_ptr(ss.q.data()), Cfg::SmemLayoutQ{}));
  Tensor k = mma_qk.get_thread_slice(first).partition_fragment_B(
      make_tensor(make_smem_ptr(ss.k.data()), Cfg::SmemLayoutKV{}));
  Tensor v = mma_pv.get_thread_slice(first).partition_fragment_B(
      make_tensor(make_smem_ptr(ss.v.data()), Cfg::SmemLayoutVt{}));
  // An S-like product, accumulating (so that back-to-back products are all live) into `acc`: S's
  // registers, or O's (the same 64x128 fp32 layout) for the measured group's own product, since
  // its softmax rewrites S's in place.
  auto issue_s = [&](auto& acc) {
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    kd::issue_gemm<false>(mma_qk, q(_, _, _, 0), k(_, _, _, 0), acc);
    warpgroup_commit_batch();
  };
  auto issue_pv = [&] {
    warpgroup_fence_operand(tOrO);
    warpgroup_fence_operand(tOrP);
    warpgroup_arrive();
    kd::issue_gemm<false>(mma_pv, tOrP, v(_, _, _, 0), tOrO);
    warpgroup_commit_batch();
  };

  if (wg == 2 && other_group_issues_products(kBeside)) {
    // The other group: products back to back until the first is done.
    // A product is the whole warp group's instruction: every warp must leave the loop after the
    // same product, so one thread reads the flag and the group reads its copy between barriers
    // (warps that each read the flag could part ways, and a product issued by fewer than four
    // warps is an illegal instruction).
    constexpr int kOtherGroupBarrier = 1;  // 0 is __syncthreads'
    constexpr int kBatch = 4;
    bool stop = false;
    unsigned long long products = 0;
    const unsigned long long t0 = clock64();
    while (!stop) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kBatch; ++i) {
        if constexpr (other_group_issues_ss(kBeside))
          issue_s(tSrS);
        else
          issue_pv();
      }
      products += kBatch;
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      warpgroup_fence_operand(tOrO);
      cutlass::arch::NamedBarrier::sync(128, kOtherGroupBarrier);
      if (threadIdx.x == 256) group_stop = measured_done;
      cutlass::arch::NamedBarrier::sync(128, kOtherGroupBarrier);
      stop = group_stop;
    }
    if (threadIdx.x == 256) {
      out[kFields * blockIdx.x + 1] = clock64() - t0;
      out[kFields * blockIdx.x + 2] = products;
    }
    sink[blockIdx.x * kThreads + threadIdx.x] = tSrS(0) + tOrO(0);
    return;
  }
  if (wg == 2 && kBeside != Beside::kSoftmax) return;
  if constexpr (kBeside == Beside::kSsProductsOnly || kBeside == Beside::kRsProductsOnly) {
    // The measured group idles for about as long as its softmaxes would take.
    constexpr unsigned long long kIdleCycles = kIterations * 1000ull;
    const unsigned long long t0 = clock64();
    while (clock64() - t0 < kIdleCycles) __nanosleep(1000);
    if (threadIdx.x == 128) measured_done = 1;
    return;
  }

  // The softmax's state as the kernel keeps it; an unmasked block.
  const kd::FwdBlock blk{0, 1 << 30, 0, flexcp::EntryMask::kNone};
  kd::Rows rows{};
  for (int h = 0; h < 2; ++h) rows.max[h] = -INFINITY;
  const int col_base = 2 * (threadIdx.x % 4);
  float correction[2];
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(tSrS); ++i) tSrS(i) = 0.01f * float((threadIdx.x * 7 + i * 13) % 97);
  const unsigned long long t0 = clock64();
  for (int it = 0; it < kIterations; ++it) {
    if constexpr (kBeside == Beside::kOwnRsProduct) issue_pv();
    if constexpr (kBeside == Beside::kOwnSsProduct) issue_s(tOrO);
    kd::online_softmax<kBlockN>(p, tSrS, blk, rows, col_base, correction);
    if constexpr (kBeside == Beside::kOwnRsProduct || kBeside == Beside::kOwnSsProduct) {
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      warpgroup_fence_operand(tOrP);
    }
    // The next block's scores, from this one's (so that no iteration can be skipped or merged).
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(tSrS); ++i) tSrS(i) = fmaf(tSrS(i), 0.5f, correction[i % 2]);
  }
  const unsigned long long t1 = clock64();
  if (wg == 1) {
    if (threadIdx.x == 128) out[kFields * blockIdx.x] = t1 - t0;
    __syncwarp();
    if (threadIdx.x == 128) measured_done = 1;
  }
  sink[blockIdx.x * kThreads + threadIdx.x] = rows.sum[0] + rows.sum[1] + tOrO(0);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "sm90_softmax_contention: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Means over the SMs: SM cycles per softmax (0 where none ran) and per product of the other group
// (0 where it issued none).
struct Cycles {
  double softmax, product;
};

template <Beside kBeside>
Cycles measure(int sms, unsigned long long* out, float* sink) {
  FwdParams p{};
  p.scale_log2 = float(M_LOG2E / std::sqrt(128.0));
  auto kernel = softmax_beside<kBeside>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes),
        "shared memory");
  check(cudaMemset(out, 0, sms * kFields * sizeof(*out)), "cudaMemset");
  for (int run = 0; run < 2; ++run)  // the first run warms the clock and caches
    kernel<<<sms, kThreads, Cfg::kSmemBytes>>>(p, out, sink);
  check(cudaDeviceSynchronize(), "running the kernel");
  std::vector<unsigned long long> c(sms * kFields);
  check(cudaMemcpy(c.data(), out, c.size() * sizeof(c[0]), cudaMemcpyDeviceToHost), "copy back");
  Cycles r{0, 0};
  for (int i = 0; i < sms; ++i) {
    r.softmax += double(c[kFields * i]) / kIterations / sms;
    if (c[kFields * i + 2] > 0) r.product += double(c[kFields * i + 1]) / c[kFields * i + 2] / sms;
  }
  return r;
}

}  // namespace

int main() {
  int device = 0, sms = 0, major = 0;
  check(cudaGetDevice(&device), "device");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "capability");
  if (major != 9) {
    std::printf("sm90_softmax_contention: needs an sm_90 GPU (this one is sm_%d x)\n", major);
    return 0;
  }
  unsigned long long* out = nullptr;
  float* sink = nullptr;
  check(cudaMalloc(&out, sms * kFields * sizeof(*out)), "cudaMalloc");
  check(cudaMalloc(&sink, sms * kThreads * sizeof(*sink)), "cudaMalloc");
  const Cycles per[] = {measure<Beside::kNothing>(sms, out, sink),
                        measure<Beside::kSsProducts>(sms, out, sink),
                        measure<Beside::kRsProducts>(sms, out, sink),
                        measure<Beside::kOwnRsProduct>(sms, out, sink),
                        measure<Beside::kOwnSsProduct>(sms, out, sink),
                        measure<Beside::kSoftmax>(sms, out, sink),
                        measure<Beside::kSsProductsOnly>(sms, out, sink),
                        measure<Beside::kRsProductsOnly>(sms, out, sink)};
  std::printf(
      "one consumer group's online softmax of a %dx%d block (64 exponentials a thread; "
      "512 cycles on the special-function unit; with 64 FMAs making the next block's scores), SM "
      "cycles per block, and the other group's cycles per 64x128x128 product (512 at the tensor "
      "pipe's peak), means of %d SMs:\n",
      kBlockM / 2, kBlockN, sms);
  for (int b = 0; b < int(Beside::kCount); ++b) {
    std::printf("  %-68s", kBesideNames[b]);
    if (per[b].softmax > 0)
      std::printf(" softmax %6.0f (%.2fx alone)", per[b].softmax, per[b].softmax / per[0].softmax);
    else
      std::printf(" %27s", "");
    if (per[b].product > 0) std::printf("   product %5.0f", per[b].product);
    std::printf("\n");
  }
  cudaFree(out);
  cudaFree(sink);
  return 0;
}
