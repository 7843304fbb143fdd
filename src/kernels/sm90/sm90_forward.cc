#include "kernels/sm90/sm90_forward.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "flexcp/status.h"
#include "kernels/cuda/runtime.h"
#include "kernels/lse_merge.h"
#include "kernels/plan/attention_plan_impl.h"
#include "kernels/sm90/fwd_params.h"

namespace flexcp::sm90 {

// One declaration per generated instance file (src/CMakeLists.txt writes the list).
#define FLEXCP_SM90_INSTANCE(dt, dtype_enum, hd) \
  void launch_forward_##dt##_hd##hd(const FwdParams&, int, cudaStream_t);
#include "kernels/sm90/fwd_instances.inc"
#undef FLEXCP_SM90_INSTANCE

namespace {

using Launcher = void (*)(const FwdParams&, int, cudaStream_t);

Launcher find_launcher(DType dtype, std::int64_t head_dim) {
#define FLEXCP_SM90_INSTANCE(dt, dtype_enum, hd) \
  if (dtype == DType::dtype_enum && head_dim == hd) return &launch_forward_##dt##_hd##hd;
#include "kernels/sm90/fwd_instances.inc"
#undef FLEXCP_SM90_INSTANCE
  return nullptr;
}

}  // namespace

std::string compiled_list() {
  std::string s;
#define FLEXCP_SM90_INSTANCE(dt, dtype_enum, hd) \
  s += std::string(s.empty() ? "" : ", ") + #dt "/" #hd;
#include "kernels/sm90/fwd_instances.inc"
#undef FLEXCP_SM90_INSTANCE
  return s.empty() ? "none" : s;
}

namespace {

constexpr const char* kFn = "flexcp::forward";

void check_cuda(cudaError_t err, const char* what) {
  cuda::check(err, kFn, what);
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found{};
    check_cuda(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000,
                                                cudaEnableDefault, &found),
               "looking up cuTensorMapEncodeTiled in the driver");
    if (found != cudaDriverEntryPointSuccess || ptr == nullptr)
      throw Error(
          Status::kCudaError,
          "flexcp::forward: the CUDA driver has no cuTensorMapEncodeTiled (needs CUDA 12+)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

// t viewed as {D, T, H} (innermost first), read in boxes of {64, box_rows, box_heads}.
CUtensorMap make_tensor_map(const char* name, const TensorView& t, std::uint32_t box_rows,
                            std::uint32_t box_heads) {
  const std::size_t esize = dtype_size(t.dtype);
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(t.shape[2]),
                              static_cast<cuuint64_t>(t.shape[0]),
                              static_cast<cuuint64_t>(t.shape[1])};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(t.strides[0]) * esize,
                                 static_cast<cuuint64_t>(t.strides[1]) * esize};
  const cuuint32_t box[3] = {64, box_rows, box_heads};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  CUtensorMap map;
  const CUresult res =
      tensor_map_encoder()(&map,
                           t.dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                       : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                           3, t.data, dims, strides, box, element_strides,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS)
    throw Error(Status::kCudaError, std::string("flexcp::forward: describing ") + name +
                                        " (shape " + t.shape_string() +
                                        ") for the tensor memory accelerator failed, CUresult " +
                                        std::to_string(static_cast<int>(res)));
  return map;
}

// What TMA and the 4-byte output stores need: a unit stride along D, 16-byte aligned rows.
void check_layout(const char* name, const TensorView& t) {
  const std::size_t esize = dtype_size(t.dtype);
  const bool aligned = reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0 &&
                       (t.strides[0] * esize) % 16 == 0 && (t.strides[1] * esize) % 16 == 0;
  if (t.strides[2] != 1 || !aligned)
    throw Error(Status::kInvalidArgument,
                std::string("flexcp::forward: ") + name + " has strides [" +
                    std::to_string(t.strides[0]) + ", " + std::to_string(t.strides[1]) + ", " +
                    std::to_string(t.strides[2]) +
                    "]; the CUDA kernel expects a unit stride along D, a 16-byte aligned data "
                    "pointer and token/head strides that are multiples of 16 bytes");
}

}  // namespace

bool compiled(DType dtype, std::int64_t head_dim) {
  return find_launcher(dtype, head_dim) != nullptr;
}

void forward(const CallShape& s, const AttentionPlan::Impl& plan, const TensorView& q,
             const TensorView& k, const TensorView& v, const TensorView& out, const TensorView& lse,
             const AttentionOptions& options) {
  const Launcher launch = find_launcher(s.dtype, s.head_dim);
  if (launch == nullptr)  // the plan checked this when it was built
    throw Error(Status::kInternal, std::string(kFn) + ": a CUDA plan without its kernel");
  if (plan.workspace == nullptr)
    throw Error(Status::kInvalidUsage,
                std::string(kFn) +
                    ": the plan has no device workspace; bind one first "
                    "(AttentionPlan::bind_workspace with workspace_bytes() = " +
                    std::to_string(plan.workspace_bytes) + " bytes of device memory)");
  for (auto [name, t] : {std::pair{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}})
    check_layout(name, *t);
  if (s.seqlen_q == 0) return;

  const cuda::DeviceGuard guard(s.device_index, kFn);
  int major = 0, minor = 0, sms = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, s.device_index),
             "reading the compute capability");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, s.device_index),
             "reading the compute capability");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, s.device_index),
             "reading the multiprocessor count");
  if (major != 9 || minor != 0)
    throw Error(Status::kNotCompiled,
                std::string(kFn) + ": the CUDA kernel is built for sm_90a (Hopper); device " +
                    std::to_string(s.device_index) + " has compute capability " +
                    std::to_string(major) + "." + std::to_string(minor));

  const int pack = plan.pack;
  FwdParams p{};
  const int rows = kBlockM / pack;
  p.tma_q = make_tensor_map("q", q, rows, pack);
  if (s.seqlen_k > 0) {
    p.tma_k = make_tensor_map("k", k, kBlockN, 1);
    p.tma_v = make_tensor_map("v", v, kBlockN, 1);
  }
  // Each consumer warp group stores its own 64 rows: half the tile's tokens of one head, or
  // half of its packed heads.
  p.tma_o = pack == 1 ? make_tensor_map("out", out, kBlockM / 2, 1)
                      : make_tensor_map("out", out, rows, pack / 2);
  p.lse = static_cast<float*>(lse.data);
  p.lse_stride_t = lse.strides[0];
  p.lse_stride_h = lse.strides[1];
  p.sink = static_cast<const float*>(options.sink.data);
  p.work = plan.device_rows;
  p.num_tiles = static_cast<int>(plan.device_rows.num_tiles);
  p.seqlen_q = static_cast<int>(s.seqlen_q);
  p.seqlen_k = static_cast<int>(s.seqlen_k);
  p.heads_q = static_cast<int>(s.heads_q);
  p.group = static_cast<int>(s.group());
  p.pack = pack;
  p.rows_log2 = 0;
  while ((1 << p.rows_log2) < rows) ++p.rows_log2;
  p.head_blocks = p.group / pack;
  // Fits in 32 bits: the plan checked the item count when it was built.
  p.items = p.num_tiles * static_cast<int>(s.heads_kv) * p.head_blocks;
  if (options.softcap > 0) {
    p.softcap = static_cast<float>(options.softcap);
    p.softcap_scale = static_cast<float>(2 * kLog2e * s.scale / options.softcap);
    p.scale_log2 = static_cast<float>(kLog2e);
  } else {
    p.scale_log2 = static_cast<float>(std::abs(s.scale) * kLog2e);
    p.negate = s.scale < 0;
  }
  launch(p, static_cast<int>(std::min<std::int64_t>(sms, p.items)),
         static_cast<cudaStream_t>(options.cuda_stream));
}

}  // namespace flexcp::sm90
