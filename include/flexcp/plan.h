// The context-parallel plan (DESIGN §3): which rank owns which tokens, which K/V each rank receives
// from whom and in which stage, and each rank's local work as bands. A pure function of the mask
// and the options: every rank computes the same plan with no communication.
#pragma once

#include <cstdint>
#include <vector>

#include "flexcp/band.h"
#include "flexcp/export.h"
#include "flexcp/mask.h"

namespace flexcp {

// What the planner assumes about the hardware; the stage count and the predictions follow from it.
struct CostModel {
  double kernel_tflops = 450.0;     // forward attention rate of one GPU on attended pairs
  double intra_node_gbps = 150.0;   // bytes/s (1e9) one GPU receives over NVLink
  double inter_node_gbps = 25.0;    // bytes/s (1e9) one GPU receives across nodes
  double stage_overhead_us = 20.0;  // fixed cost of one more stage (launches, synchronisation)
};

struct PlanOptions {
  int world_size = 1;
  std::int64_t chunk_size = 0;  // tokens per chunk; 0 chooses from the mask and world size
  int gpus_per_node = 0;        // 0: every rank on one node
  int num_stages = 0;           // remote stages; 0 chooses from the cost model
  std::int64_t heads_q = 64;    // for compute time and Ulysses
  std::int64_t heads_kv = 8;    // K and V bytes per token: 2 * heads_kv * head_dim * element_bytes
  std::int64_t head_dim = 128;
  std::int64_t element_bytes = 2;  // bf16
  CostModel cost;
};

// K/V tokens [tokens) that `owner` holds and the receiving rank needs, delivered in `stage` (>= 1).
struct RemoteRange {
  int owner = 0;
  Range tokens;
  int stage = 1;
};

// One group-cast item: `tokens` of `owner`, packed once and sent to each of `dests`. The backward
// group-reduces dK/dV partials of the same items back to the owner.
struct CastItem {
  int owner = 0;
  Range tokens;
  std::vector<int> dests;
};

struct RankPlan {
  std::vector<std::int64_t> chunks;  // owned chunk indices, ascending: the local token order
  std::vector<Range> q_tokens;       // their global q token ranges, in local order
  std::vector<Range> k_tokens;       // global K/V token ranges held locally, in local order
  std::int64_t num_q_tokens = 0;
  std::int64_t num_k_tokens = 0;
  std::int64_t area = 0;          // attended pairs whose query this rank owns
  std::vector<RemoteRange> recv;  // sorted by stage, then owner, then position
  std::int64_t recv_tokens = 0;
  std::int64_t send_tokens = 0;  // counted once per destination
  // stage_work[s]: local work of stage s as bands in local coordinates: rows are local q tokens,
  // columns are the local K/V buffer (own tokens, then stage 1's received ranges, then stage
  // 2's...).
  std::vector<std::vector<Band>> stage_work;
  std::vector<std::int64_t> stage_area;
  double predicted_us = 0;     // forward time of this rank under the cost model
  double exposed_comm_us = 0;  // of which waiting for K/V
};

struct BaselineFigures {
  std::int64_t comm_bytes_fwd = 0;
  double imbalance = 1.0;    // max rank compute / mean
  double predicted_us = 0;   // forward time under the same cost model
  double idle_fraction = 0;  // share of rank-time spent waiting
  bool applicable = true;    // Ulysses needs heads divisible by the world size
};

struct FLEXCP_API Plan {
  PlanOptions options;
  std::int64_t chunk_size = 0;   // the effective (largest) chunk, in q tokens
  std::vector<Range> chunks;     // q chunks, in global order
  std::vector<int> chunk_owner;  // rank of each chunk
  std::vector<RankPlan> ranks;
  std::vector<CastItem> casts;        // forward group-cast (backward group-reduce) items
  int num_stages = 0;                 // remote stages (stage 0, local work, comes first)
  double imbalance = 1.0;             // max rank area / mean
  std::int64_t comm_bytes_fwd = 0;    // K and V received, summed over ranks
  std::int64_t comm_bytes_intra = 0;  // of which over intra-node links (hierarchical casts)
  std::int64_t comm_bytes_inter = 0;  // of which across nodes
  double predicted_us = 0;            // slowest rank
  BaselineFigures ring, ulysses, allgather;
  // Planning time, single-threaded: the part every rank repeats (dispatch, everyone's K/V needs,
  // the stage count) and the slowest rank's own part (its local work and work lists).
  double global_ms = 0;
  double slowest_rank_ms = 0;
  double plan_ms() const { return global_ms + slowest_rank_ms; }

  // Position of every local q token in the global sequence (for RoPE), rank r.
  std::vector<std::int64_t> position_ids(int rank) const;
  // dispatch: global token -> (rank, local index); undispatch is its inverse.
  std::vector<std::int64_t> global_to_local_q() const;  // local index within its rank
  std::vector<int> global_to_rank_q() const;
};

// Throws Error(kInvalidArgument) for a world size < 1, a chunk larger than the sequence, a world
// larger than the sequence, and the like.
FLEXCP_API Plan make_plan(const Mask& mask, const PlanOptions& options);

}  // namespace flexcp
