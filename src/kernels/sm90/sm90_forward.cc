#include "kernels/sm90/sm90_forward.h"

#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "flexcp/status.h"
#include "kernels/cuda/runtime.h"
#include "kernels/lse_merge.h"
#include "kernels/plan/attention_plan_impl.h"
#include "kernels/sm90/fwd_params.h"
#include "kernels/sm90/sm90_host.h"

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
    check_layout(kFn, name, *t);
  if (s.seqlen_q == 0) return;

  const cuda::DeviceGuard guard(s.device_index, kFn);
  const int sms = check_device(kFn, s.device_index);

  const int pack = plan.pack;
  FwdParams p{};
  const int rows = kBlockM / pack;
  p.tma_q = tensor_map(kFn, "q", q, rows, pack);
  if (s.seqlen_k > 0) {
    const int block_n = tiles::sm90_fwd_block_n(s.head_dim);
    p.tma_k = tensor_map(kFn, "k", k, block_n, 1);
    p.tma_v = tensor_map(kFn, "v", v, block_n, 1);
  }
  // Each consumer warp group stores its own 64 rows: half the tile's tokens of one head, or
  // half of its packed heads.
  // An fp32 out (a partial output to be merged) is stored from registers instead.
  if (out.dtype == DType::kFloat32) {
    p.out_f32 = static_cast<float*>(out.data);
    p.out_stride_t = out.strides[0];
    p.out_stride_h = out.strides[1];
  } else {
    p.tma_o = pack == 1 ? tensor_map(kFn, "out", out, kBlockM / 2, 1)
                        : tensor_map(kFn, "out", out, rows, pack / 2);
  }
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
