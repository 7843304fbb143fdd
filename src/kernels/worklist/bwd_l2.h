// A model of how often the sm90 backward's q blocks would miss L2 under a plan's units, for the
// plan's choice of their order (BwdOrder): busiest first across the kv heads balances the SMs
// better, but can have the units running together read so many q blocks that L2 no longer holds
// them between one tile's visit and the next's (MHA over causal documents at 32K: 1.69x slower).
// The SMs step in lockstep, one q block of one q head per step each, each walking its unit
// (walk_bwd_unit's order) and taking the next unit as it frees (the kernel's persistent
// scheduler); L2 is one LRU cache of (q head, q block) entries: Q and dO in bf16 and the fp32 dQ
// accumulator, 64 KB at 64 rows of head dim 128. A visit that finds its entry gone is a miss.
// Left out: K and V, the two L2 partitions, HBM's order, and time (a step is a step). Its Python
// twin, for the masks it knows by name: bench/bwd_l2_model.py.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/worklist/bwd_units.h"
#include "kernels/worklist/worklist.h"

namespace flexcp {

struct BwdL2Model {
  // The cache the q blocks may have: 40 MB of the 50 MB of an H100's or H200's L2 (K, V, dK and
  // dV partials and the lists take the rest).
  double cache_bytes = 40.0 * 1024 * 1024;
  std::int64_t head_dim = 128;
  // Visits modelled at most: above, a sample of the (q head, q block) entries (every s-th block
  // of each head, from an offset of its own) in a cache s times smaller, so that the model costs
  // the plan about a millisecond whatever the sequence's length.
  std::int64_t max_visits = std::int64_t{1} << 14;
};

// The share of the visits (q block of one q head, against one key tile) that miss, in [0, 1];
// 0 for no units.
double bwd_l2_miss_rate(const WorkList& cols, const std::vector<BwdUnit>& units,
                        const BwdUnitOptions& o, const BwdL2Model& model = {});

}  // namespace flexcp
