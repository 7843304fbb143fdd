// What an AttentionPlan holds: the work lists of its kernels, in their tile sizes
// (kernels/tiles.h), and for device plans the bound workspace they were copied to.
#pragma once

#include <cstddef>

#include "flexcp/attention_plan.h"
#include "kernels/plan/workspace.h"
#include "kernels/sm90/bwd_scratch.h"
#include "kernels/worklist/bwd_units.h"
#include "kernels/worklist/worklist.h"

namespace flexcp {

struct AttentionPlan::Impl {
  AttentionShape shape;
  std::int64_t area = 0;
  // q-tile-major: the forward, and the CPU backward's dQ pass (same tiles).
  WorkList rows;
  // k-tile-major: the backward's dK/dV pass (CPU), or the whole backward (sm90). Empty in a
  // forward-only plan.
  WorkList cols;
  // q-tile-major in the sm90 dQ pass's tiles: the deterministic backward's dQ (sm90 backward
  // plans only).
  WorkList dq_rows;
  // The sm90 backward's units, cut from `cols` for the device's SMs (sm90 backward plans only).
  BwdUnits bwd_units;
  bool backward = true;
  bool keys_only = false;  // AttentionPlanBuild::keys_only
  int pack = 1;            // sm90: q heads packed into one tile's rows (tiles::sm90_pack)

  std::size_t workspace_bytes = 0;
  std::string workspace_regions;          // for the message of a too-small workspace
  void* workspace = nullptr;              // bound device memory, or null
  DeviceWorkList device_rows;             // views of `rows` in the workspace, once bound
  DeviceWorkList device_cols;             // and of `cols` (backward plans)
  DeviceWorkList device_dq_rows;          // and of `dq_rows` (sm90 backward plans)
  const BwdUnit* device_units = nullptr;  // `bwd_units` in the workspace, and their counters
  int* device_split_counters = nullptr;
  sm90::BwdScratch scratch;  // the backward's scratch (backward plans)
};

// How a plan is built: `fn` names the public entry that asked for it in the errors. A keys-only
// plan (a CUDA backward plan) is one part of a larger problem whose keys run as several plans
// (DistAttention's stages): it leaves out the row statistics, the dQ accumulator and the
// deterministic dQ pass's list, which another plan over all of the problem's rows holds
// (sm90::backward_keys).
struct AttentionPlanBuild {
  const char* fn = "flexcp::AttentionPlan";
  AttentionPlanOptions options;
  bool keys_only = false;
};

AttentionPlan make_attention_plan(const std::vector<Band>& work, const AttentionShape& shape,
                                  const AttentionPlanBuild& build);
inline AttentionPlan make_attention_plan(const std::vector<Band>& work, const AttentionShape& shape,
                                         const char* fn, const AttentionPlanOptions& options = {}) {
  return make_attention_plan(work, shape, AttentionPlanBuild{fn, options});
}

}  // namespace flexcp
