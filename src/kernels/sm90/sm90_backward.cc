#include "kernels/sm90/sm90_backward.h"

#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "flexcp/status.h"
#include "kernels/cuda/runtime.h"
#include "kernels/lse_merge.h"
#include "kernels/sm90/bwd_params.h"
#include "kernels/sm90/bwd_rowstats.h"
#include "kernels/sm90/sm90_host.h"

namespace flexcp::sm90 {

// One declaration per generated instance file (src/CMakeLists.txt writes the list).
#define FLEXCP_SM90_INSTANCE(dt, dtype_enum, hd)                           \
  void launch_backward_##dt##_hd##hd(const BwdParams&, int, cudaStream_t); \
  void launch_backward_dq_##dt##_hd##hd(const BwdDqParams&, int, cudaStream_t);
#include "kernels/sm90/bwd_instances.inc"
#undef FLEXCP_SM90_INSTANCE

namespace {

constexpr const char* kFn = "flexcp::backward";

struct Launchers {
  void (*main)(const BwdParams&, int, cudaStream_t) = nullptr;
  void (*dq)(const BwdDqParams&, int, cudaStream_t) = nullptr;
};

Launchers find_launchers(DType dtype, std::int64_t head_dim) {
#define FLEXCP_SM90_INSTANCE(dt, dtype_enum, hd)    \
  if (dtype == DType::dtype_enum && head_dim == hd) \
    return {&launch_backward_##dt##_hd##hd, &launch_backward_dq_##dt##_hd##hd};
#include "kernels/sm90/bwd_instances.inc"
#undef FLEXCP_SM90_INSTANCE
  return {};
}

// The deterministic mode's dQ pass on the plan's q-tile-major list in its tiles.
void launch_dq_pass(const CallShape& s, const AttentionPlan::Impl& plan, const TensorView& dout,
                    const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& dq, const BwdParams& main, const Launchers& launch, int sms,
                    cudaStream_t stream) {
  BwdDqParams p{};
  const WorkList& list = plan.dq_rows;
  p.num_tiles = static_cast<int>(list.num_tiles());
  p.items = p.num_tiles * static_cast<int>(s.heads_q);  // checked when the plan was built
  if (p.items == 0) return;
  p.tma_q = tensor_map(kFn, "q", q, kBwdDqBlockM, 1);
  p.tma_do = tensor_map(kFn, "dout", dout, kBwdDqBlockM, 1);
  p.tma_k = tensor_map(kFn, "k", k, kBwdDqBlockN, 1);
  p.tma_v = tensor_map(kFn, "v", v, kBwdDqBlockN, 1);
  p.lse2 = plan.scratch.lse2;
  p.delta = plan.scratch.delta;
  p.stats_stride = plan.scratch.stats_stride;
  p.dq = dq.data;
  p.dq_stride_t = dq.strides[0];
  p.dq_stride_h = dq.strides[1];
  p.work = plan.device_dq_rows;
  p.seqlen_q = static_cast<int>(s.seqlen_q);
  p.seqlen_k = static_cast<int>(s.seqlen_k);
  p.group = static_cast<int>(s.group());
  p.scale = main.scale;
  p.scale_log2 = main.scale_log2;
  p.softcap = main.softcap;
  p.softcap_scale = main.softcap_scale;
  p.softcap_t = main.softcap_t;
  launch.dq(p, std::min(sms, p.items), stream);
}

}  // namespace

namespace {

void check_bound(const AttentionPlan::Impl& plan) {
  if (!plan.backward)
    throw Error(
        Status::kInvalidUsage,
        std::string(kFn) +
            ": the plan was built for the forward only (AttentionPlanOptions::backward = false)");
  if (plan.workspace == nullptr)
    throw Error(Status::kInvalidUsage,
                std::string(kFn) +
                    ": the plan has no device workspace; bind one first "
                    "(AttentionPlan::bind_workspace with workspace_bytes() = " +
                    std::to_string(plan.workspace_bytes) + " bytes of device memory)");
}

// The rows' plan of a stepped backward: its own scratch, over all of the problem's rows.
void check_rows(const AttentionPlan::Impl& rows) {
  check_bound(rows);
  if (rows.keys_only)
    throw Error(Status::kInternal,
                std::string(kFn) + ": a keys-only plan cannot hold the rows' scratch");
}

Launchers launchers(const CallShape& s) {
  const Launchers launch = find_launchers(s.dtype, s.head_dim);
  if (launch.main == nullptr)  // the plan checked this when it was built
    throw Error(Status::kInternal, std::string(kFn) + ": a CUDA plan without its kernel");
  return launch;
}

// The deterministic mode writes dq in its own pass over all keys: the keys' kernels leave the
// accumulator alone. (Without keys there is nothing to sum, and the postprocessing writes zeros.)
bool dq_in_own_pass(const AttentionPlan::Impl& rows, const AttentionOptions& options) {
  return options.deterministic && !rows.bwd_units.units.empty();
}

RowStatsParams row_stats_params(const CallShape& s, const AttentionPlan::Impl& rows,
                                const TensorView& dout, const TensorView& out,
                                const TensorView& lse, const TensorView& dq,
                                const AttentionOptions& options, const TensorView& dsink) {
  RowStatsParams rs;
  rs.scratch = rows.scratch;
  rs.out = out.data;
  rs.dout = dout.data;
  rs.out_stride_t = out.strides[0];
  rs.out_stride_h = out.strides[1];
  rs.dout_stride_t = dout.strides[0];
  rs.dout_stride_h = dout.strides[1];
  rs.lse = static_cast<const float*>(lse.data);
  rs.lse_stride_t = lse.strides[0];
  rs.lse_stride_h = lse.strides[1];
  const bool dq_pass = dq_in_own_pass(rows, options);
  if (dq_pass) rs.scratch.dq_accum = nullptr;
  rs.dq = dq_pass ? nullptr : dq.data;
  rs.dq_stride_t = dq.strides[0];
  rs.dq_stride_h = dq.strides[1];
  if (!options.sink.empty() && !dsink.empty()) {
    rs.sink = static_cast<const float*>(options.sink.data);
    rs.dsink = static_cast<float*>(dsink.data);
    rs.dsink_stride = dsink.strides[0];
  }
  rs.seqlen_q = s.seqlen_q;
  rs.heads_q = s.heads_q;
  rs.head_dim = static_cast<int>(s.head_dim);
  rs.scale = static_cast<float>(s.scale);
  return rs;
}

void main_params_softmax(const CallShape& s, const AttentionOptions& options, BwdParams& p) {
  p.scale = static_cast<float>(s.scale);
  if (options.softcap > 0) {
    p.softcap = static_cast<float>(options.softcap);
    p.softcap_scale = static_cast<float>(2 * kLog2e * s.scale / options.softcap);
    p.softcap_t = static_cast<float>(kLn2 / options.softcap);
  }
  p.scale_log2 = static_cast<float>(s.scale * kLog2e);
}

}  // namespace

void backward_rows_begin(const CallShape& s, const AttentionPlan::Impl& rows,
                         const TensorView& dout, const TensorView& out, const TensorView& lse,
                         const AttentionOptions& options, const TensorView& dsink) {
  check_rows(rows);
  for (auto [name, t] : {std::pair{"dout", &dout}, {"out", &out}}) check_layout(kFn, name, *t);
  const cuda::DeviceGuard guard(s.device_index, kFn);
  check_device(kFn, s.device_index);
  const RowStatsParams rs = row_stats_params(s, rows, dout, out, lse, TensorView{}, options, dsink);
  cuda::check(launch_bwd_preprocess(rs, s.dtype == DType::kBFloat16,
                                    static_cast<cudaStream_t>(options.cuda_stream)),
              kFn, "launching the row statistics");
}

void backward_keys(const CallShape& s, const AttentionPlan::Impl& rows,
                   const AttentionPlan::Impl& keys, const TensorView& dout, const TensorView& q,
                   const TensorView& k, const TensorView& v, const TensorView& dk,
                   const TensorView& dv, const AttentionOptions& options, bool add_dkv) {
  const Launchers launch = launchers(s);
  check_rows(rows);
  check_bound(keys);
  if (keys.shape.seqlen_q != s.seqlen_q || keys.shape.seqlen_k > s.seqlen_k ||
      keys.shape.heads_q != s.heads_q || keys.shape.heads_kv != s.heads_kv ||
      keys.shape.head_dim != s.head_dim || keys.shape.dtype != s.dtype ||
      (add_dkv && dk.dtype != DType::kFloat32))
    throw Error(Status::kInternal,
                std::string(kFn) + ": a keys plan that is not a part of its rows' problem");
  for (auto [name, t] :
       {std::pair{"dout", &dout}, {"q", &q}, {"k", &k}, {"v", &v}, {"dk", &dk}, {"dv", &dv}})
    check_layout(kFn, name, *t);
  const cuda::DeviceGuard guard(s.device_index, kFn);
  const int sms = check_device(kFn, s.device_index);
  BwdParams p{};
  // Fits in 32 bits: the plan checked the unit count when it was built.
  p.items = static_cast<int>(keys.bwd_units.units.size());
  if (p.items == 0) return;
  const BwdScratch& scratch = rows.scratch;
  if (s.seqlen_q > 0) {
    const int block_m = tiles::sm90_bwd_block_m(s.head_dim);
    p.tma_q = tensor_map(kFn, "q", q, block_m, 1);
    p.tma_do = tensor_map(kFn, "dout", dout, block_m, 1);
    p.tma_dq = accumulator_map(kFn, "the dQ accumulator", scratch.dq_accum, s.seqlen_q, s.heads_q,
                               s.head_dim, kBwdDqBoxCols, kBwdDqBoxRows);
  }
  p.tma_k = tensor_map(kFn, "k", k, kBwdBlockN, 1);
  p.tma_v = tensor_map(kFn, "v", v, kBwdBlockN, 1);
  p.dk = dk.data;
  p.dv = dv.data;
  p.dkv_fp32 = dk.dtype == DType::kFloat32;
  p.dkv_add = add_dkv;
  p.dk_stride_t = dk.strides[0];
  p.dk_stride_h = dk.strides[1];
  p.dv_stride_t = dv.strides[0];
  p.dv_stride_h = dv.strides[1];
  p.lse2 = scratch.lse2;
  p.delta = scratch.delta;
  p.stats_stride = scratch.stats_stride;
  p.work = keys.device_cols;
  p.units = keys.device_units;
  p.partials = keys.scratch.partials;
  p.split_counters = keys.device_split_counters;
  p.seqlen_q = static_cast<int>(s.seqlen_q);
  p.seqlen_k = static_cast<int>(keys.shape.seqlen_k);
  p.heads_q = static_cast<int>(s.heads_q);
  p.group = static_cast<int>(s.group());
  main_params_softmax(s, options, p);
  p.accumulate_dq = !dq_in_own_pass(rows, options);
  launch.main(p, std::min(sms, p.items), static_cast<cudaStream_t>(options.cuda_stream));
}

void backward_rows_end(const CallShape& s, const AttentionPlan::Impl& rows, const TensorView& dout,
                       const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const TensorView& lse, const TensorView& dq,
                       const AttentionOptions& options, const TensorView& dsink) {
  const Launchers launch = launchers(s);
  check_rows(rows);
  check_layout(kFn, "dq", dq);
  const cuda::DeviceGuard guard(s.device_index, kFn);
  const int sms = check_device(kFn, s.device_index);
  const auto stream = static_cast<cudaStream_t>(options.cuda_stream);
  if (dq_in_own_pass(rows, options)) {
    BwdParams p{};
    main_params_softmax(s, options, p);
    launch_dq_pass(s, rows, dout, q, k, v, dq, p, launch, sms, stream);
  }
  const RowStatsParams rs = row_stats_params(s, rows, dout, out, lse, dq, options, dsink);
  cuda::check(launch_bwd_postprocess(rs, s.dtype == DType::kBFloat16, sms, stream), kFn,
              "launching dq and dsink");
}

void backward(const CallShape& s, const AttentionPlan::Impl& plan, const TensorView& dout,
              const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
              const TensorView& lse, const TensorView& dq, const TensorView& dk,
              const TensorView& dv, const AttentionOptions& options, const TensorView& dsink) {
  backward_rows_begin(s, plan, dout, out, lse, options, dsink);
  backward_keys(s, plan, plan, dout, q, k, v, dk, dv, options, false);
  backward_rows_end(s, plan, dout, q, k, v, out, lse, dq, options, dsink);
}

}  // namespace flexcp::sm90
