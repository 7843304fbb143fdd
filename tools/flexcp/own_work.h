// The weak-scaling baseline of `flexcp run --timing`: one rank's own work of a DistAttention plan
// (every stage's bands over its q rows and all the K/V columns it reads, own and received, in the
// plan's column order) as one bare kernel call with everything already in place, on random
// inputs: what the rank would take with no communication, merge or imbalance.
#pragma once

#include <cstdint>

#include "cli_options.h"
#include "flexcp/plan.h"

namespace flexcp::tools {

struct OwnWorkTimes {
  double fwd_ms = 0, bwd_ms = 0;  // median of `repeat` calls after one untimed
};

// On the GPU (device time, this rank's current device) or the CPU (wall time).
OwnWorkTimes time_own_work(const RankPlan& rank, const ShapeArgs& shape, DType dtype, bool on_gpu,
                           int device_index, int repeat);

}  // namespace flexcp::tools
