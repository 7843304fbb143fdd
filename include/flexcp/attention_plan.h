// Plan once, run many times (DESIGN §3 "Who owns what"): an attention plan holds the kernels'
// work lists for one problem (a mask, or one stage of a rank's distributed work) in the tile sizes
// of the kernels that will run it. Running a plan only launches: no allocation, no host-to-device
// copy and no host synchronisation, so a step can be captured in a CUDA graph.
//
//   flexcp::AttentionShape shape{.seqlen_q = T, .seqlen_k = T, .heads_q = 64, .heads_kv = 8,
//                                .head_dim = 128, .dtype = DType::kBFloat16,
//                                .device = Device::kCuda};
//   flexcp::AttentionPlan plan(mask, shape);
//   plan.bind_workspace(workspace, plan.workspace_bytes(), stream);  // device plans, once
//   for (...) flexcp::forward(plan, q, k, v, out, lse, {.cuda_stream = stream});
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "flexcp/band.h"
#include "flexcp/export.h"
#include "flexcp/mask.h"
#include "flexcp/tensor.h"

namespace flexcp {

// The tensors an attention call takes: q [seqlen_q, heads_q, head_dim], k and v [seqlen_k,
// heads_kv, head_dim], all of `dtype` on `device` (device_index for CUDA).
struct AttentionShape {
  std::int64_t seqlen_q = 0;
  std::int64_t seqlen_k = 0;
  std::int64_t heads_q = 1;
  std::int64_t heads_kv = 1;
  std::int64_t head_dim = 0;
  DType dtype = DType::kBFloat16;
  Device device = Device::kCpu;
  int device_index = 0;
  std::int64_t group() const { return heads_q / heads_kv; }
};

// What a plan will run. A plan for the backward also holds the k-tile-major work lists, and on
// the GPU its workspace holds the backward's scratch: an fp32 dQ accumulator (seqlen_q x heads_q x
// head_dim x 4 bytes) and per-row statistics. A forward-only plan (inference) says backward =
// false and needs a workspace of a few kilobytes.
struct AttentionPlanOptions {
  bool backward = true;
};

struct AttentionPlanBuild;  // how flexcp builds one (kernels/plan/attention_plan_impl.h)

class FLEXCP_API AttentionPlan {
 public:
  // An empty plan; running it is an error.
  AttentionPlan();
  // Attention over `mask` (its seqlens must be the shape's).
  AttentionPlan(const Mask& mask, const AttentionShape& shape,
                const AttentionPlanOptions& options = {});
  // Attention over `work`: bands over (q row, k column) inside [0, seqlen_q) x [0, seqlen_k)
  // that cover no pair twice (a mask's slices as bands, or one stage of a rank's local work).
  AttentionPlan(const std::vector<Band>& work, const AttentionShape& shape,
                const AttentionPlanOptions& options = {});
  AttentionPlan(AttentionPlan&&) noexcept;
  AttentionPlan& operator=(AttentionPlan&&) noexcept;
  ~AttentionPlan();

  bool empty() const;
  const AttentionShape& shape() const;
  // Whether the plan can run the backward (AttentionPlanOptions::backward).
  bool has_backward() const;
  // Attended pairs.
  std::int64_t area() const;

  // Device memory the work lists (and, for the backward, its scratch) need on the GPU (0 for host
  // plans). One function lays out both this size and what bind_workspace writes, so the two
  // cannot disagree.
  std::size_t workspace_bytes() const;
  // Writes the work lists into `workspace` (device memory of the plan's device, at least
  // workspace_bytes() bytes, 256-byte aligned), in order on `cuda_stream`, and keeps the pointer:
  // from then on the plan runs from that memory, which must outlive its use. One launch at a
  // time per workspace (stream order); bind another plan for another stream. Returns without
  // waiting for the stream's earlier work (the lists go through pinned memory). Refused while the
  // stream captures a CUDA graph: bind first, then capture the calls. Needs a CUDA build.
  void bind_workspace(void* workspace, std::size_t bytes, void* cuda_stream = nullptr);
  bool has_workspace() const;

  struct Impl;
  const Impl& impl() const;  // flexcp's kernels read the lists through it

 private:
  explicit AttentionPlan(std::unique_ptr<Impl> impl);
  friend AttentionPlan make_attention_plan(const std::vector<Band>& work,
                                           const AttentionShape& shape,
                                           const AttentionPlanBuild& build);
  std::unique_ptr<Impl> impl_;
};

}  // namespace flexcp
