#include "own_work.h"

#include <optional>
#include <vector>

#include "flexcp/flexcp.h"
#include "host_tensor.h"
#include "timing.h"
#if defined(FLEXCP_TOOLS_CUDA)
#include "device_tensor.h"
#endif

namespace flexcp::tools {

OwnWorkTimes time_own_work(const RankPlan& rank, const ShapeArgs& s, DType dtype, bool on_gpu,
                           int device_index, int repeat) {
  std::vector<Band> work;
  for (const std::vector<Band>& stage : rank.stage_work)
    work.insert(work.end(), stage.begin(), stage.end());
  const std::int64_t tq = rank.num_q_tokens, tk = rank.num_columns();
  const AttentionShape shape{tq,
                             tk,
                             s.heads,
                             s.heads_kv,
                             s.head_dim,
                             dtype,
                             on_gpu ? Device::kCuda : Device::kCpu,
                             device_index};
  AttentionPlan plan(work, shape);
  std::uint64_t seed = 1234 + 4 * static_cast<std::uint64_t>(rank.rank);
  HostTensor q(dtype, {tq, s.heads, s.head_dim}), k(dtype, {tk, s.heads_kv, s.head_dim}),
      v(dtype, {tk, s.heads_kv, s.head_dim}), dout(dtype, {tq, s.heads, s.head_dim}),
      out(dtype, {tq, s.heads, s.head_dim}), lse(DType::kFloat32, {tq, s.heads});
  for (HostTensor* t : {&q, &k, &v, &dout}) t->fill_uniform(seed++, 1.0f);
  OwnWorkTimes t;
  if (on_gpu) {
#if defined(FLEXCP_TOOLS_CUDA)
    const DeviceWorkspace workspace(plan);
    const DeviceTensor gpu_q(q), gpu_k(k), gpu_v(v), gpu_dout(dout), gpu_out(out), gpu_lse(lse),
        grad_q(q), grad_k(k), grad_v(v);
    auto fwd = [&] {
      forward(plan, gpu_q.view(), gpu_k.view(), gpu_v.view(), gpu_out.view(), gpu_lse.view());
    };
    t.fwd_ms = 1e3 * median_device_seconds(fwd, 1, repeat);
    t.bwd_ms = 1e3 * median_device_seconds(
                         [&] {
                           backward(plan, gpu_dout.view(), gpu_q.view(), gpu_k.view(), gpu_v.view(),
                                    gpu_out.view(), gpu_lse.view(), grad_q.view(), grad_k.view(),
                                    grad_v.view());
                         },
                         1, repeat);
#endif
    return t;
  }
  HostTensor dq(dtype, q.shape()), dk(dtype, k.shape()), dv(dtype, v.shape());
  auto fwd = [&] { forward(plan, q.view(), k.view(), v.view(), out.view(), lse.view()); };
  t.fwd_ms = 1e3 * median_seconds(fwd, 1, repeat);
  t.bwd_ms = 1e3 * median_seconds(
                       [&] {
                         backward(plan, dout.view(), q.view(), k.view(), v.view(), out.view(),
                                  lse.view(), dq.view(), dk.view(), dv.view());
                       },
                       1, repeat);
  return t;
}

}  // namespace flexcp::tools
