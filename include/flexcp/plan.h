// The context-parallel plan (DESIGN §3). Planning has two parts:
//   - the dispatch, identical on every rank (a pure function of the mask and the options, no
//     communication): the chunks of the sequence and which rank owns each;
//   - one rank's own plan: the K/V it receives from whom and in which stage, what it sends to
//     whom, and its local work per stage as bands and as kernel plans (AttentionPlan).
// make_plan(mask, options, rank) is what a rank runs in training; make_plan_report plans every
// rank and prices the baselines, for `flexcp plan`.
#pragma once

#include <cstdint>
#include <vector>

#include "flexcp/attention_plan.h"
#include "flexcp/band.h"
#include "flexcp/export.h"
#include "flexcp/mask.h"

namespace flexcp {

// What the planner assumes about the hardware; stage counts and predictions follow from it.
struct CostModel {
  double kernel_tflops = 450.0;     // forward attention rate of one GPU on attended pairs
  double intra_node_gbps = 150.0;   // bytes/s (1e9) one GPU receives over NVLink
  double inter_node_gbps = 25.0;    // bytes/s (1e9) one GPU receives across nodes
  double stage_overhead_us = 20.0;  // fixed cost of one more stage (launches, synchronisation)
};

struct PlanOptions {
  int world_size = 1;
  // Tokens per chunk, exactly: chunks of chunk_size tokens, the last one shorter when the length
  // is not a multiple; their count must then be a multiple of world_size (every rank holds as many
  // chunks). 0: chunks_per_rank decides.
  std::int64_t chunk_size = 0;
  // With chunk_size 0: chunks per rank, the chunks then equal to within one token. 0: chosen
  // among kChunksPerRankChoices (see there).
  std::int64_t chunks_per_rank = 0;
  int gpus_per_node = 0;  // 0: every rank on one node
  int num_stages = 0;     // remote stages of every rank that receives; 0: each rank's own choice
  std::int64_t heads_q = 64;  // for compute time, Ulysses and the stage kernel plans
  std::int64_t heads_kv = 8;  // K and V bytes per token: 2 * heads_kv * head_dim * dtype size
  std::int64_t head_dim = 128;
  DType dtype = DType::kBFloat16;
  Device device = Device::kCpu;  // where the stage kernels run (their plans' tile sizes)
  int device_index = 0;
  CostModel cost;
};

// The chosen chunk count: of these counts per rank (multiples of 4, so that runs of 4 neighbouring
// chunks, which attend mostly the same keys, are always placed together), the one whose dispatch
// moves the fewest K/V bytes with an imbalance of at most kChosenImbalance (the most balanced one
// when none is), among those whose chunks keep kMinChunkTokens tokens. Where none does (short
// sequences on many ranks), the largest of 4, 2 and 1 that does, or 1.
inline constexpr std::int64_t kChunksPerRankChoices[] = {8, 12, 16, 24, 32};
inline constexpr double kChosenImbalance = 1.01;
inline constexpr std::int64_t kMinChunkTokens = 128;

// The global part: identical on every rank.
struct FLEXCP_API Dispatch {
  int world_size = 1;
  std::vector<Range> chunks;             // q chunks, in global order
  std::vector<int> chunk_owner;          // rank of each q chunk
  std::vector<std::int64_t> chunk_area;  // attended pairs whose query lies in each chunk
  std::vector<Range> kv_chunks;          // K/V chunks (the q chunks for self-attention)
  std::vector<int> kv_owner;
  std::vector<std::int64_t> rank_area;  // attended pairs whose query each rank owns
  std::int64_t chunk_size = 0;          // the largest chunk
  std::int64_t chunks_per_rank = 0;
  double imbalance = 1.0;  // max rank area / mean

  // Global positions of rank r's q tokens, in its local order (for RoPE).
  std::vector<std::int64_t> position_ids(int rank) const;
  std::int64_t num_q_tokens(int rank) const;
  std::int64_t num_k_tokens(int rank) const;
  // Global token -> owning rank, and -> index among that rank's local tokens.
  std::vector<int> global_to_rank_q() const;
  std::vector<std::int64_t> global_to_local_q() const;
};

// K/V tokens [tokens) that `owner` holds and this rank needs, delivered in `stage` (>= 1).
// `index`: its position among the pieces this rank receives from `owner`, in token order; the
// sender's SendRange of the same piece carries the same index (messages are matched by it).
struct RemoteRange {
  int owner = 0;
  Range tokens;
  int stage = 1;
  int index = 0;
};

// K/V tokens [tokens) of this rank that `dest` needs: one message, read straight from the local
// K/V rows (a piece lies in neighbouring local rows), the same rows going to every rank that
// needs them (group-cast). The backward returns dK/dV partials of the same pieces.
struct SendRange {
  int dest = 0;
  Range tokens;
  int index = 0;
};

struct FLEXCP_API RankPlan {
  int rank = 0;
  std::vector<std::int64_t> chunks;  // owned chunk indices, ascending: the local token order
  std::vector<Range> q_tokens;       // their global q token ranges, in local order
  std::vector<Range> k_tokens;       // global K/V token ranges held locally, in local order
  std::int64_t num_q_tokens = 0;
  std::int64_t num_k_tokens = 0;
  std::int64_t area = 0;          // attended pairs whose query this rank owns
  std::vector<RemoteRange> recv;  // sorted by stage, then owner, then position
  std::vector<SendRange> sends;   // sorted by destination, then position
  std::int64_t recv_tokens = 0;
  std::int64_t send_tokens = 0;  // counted once per destination
  int num_stages = 0;            // remote stages (0 when nothing is received)
  // stage_work[s]: local work of stage s as bands in local coordinates: rows are local q tokens,
  // columns are the local K/V buffer (own tokens, then stage 1's received ranges, then stage
  // 2's...). stage_plans[s]: the same as a kernel plan over [num_q_tokens, num_columns()).
  std::vector<std::vector<Band>> stage_work;
  std::vector<std::int64_t> stage_area;
  std::vector<AttentionPlan> stage_plans;
  double predicted_us = 0;     // forward time of this rank under the cost model
  double exposed_comm_us = 0;  // of which waiting for K/V
  std::int64_t num_columns() const { return num_k_tokens + recv_tokens; }
};

// What one rank holds.
struct FLEXCP_API Plan {
  PlanOptions options;
  Dispatch dispatch;
  RankPlan rank;
  // Planning time, single-threaded: the dispatch (which every rank repeats) and this rank's own
  // part (its receive and send lists, stages, local work and kernel plans).
  double dispatch_ms = 0;
  double rank_ms = 0;
  double plan_ms() const { return dispatch_ms + rank_ms; }
};

// The dispatch alone (what `flexcp mask --world` draws, or a data loader needs to shard).
FLEXCP_API Dispatch make_dispatch(const Mask& mask, const PlanOptions& options);

// Throws Error(kInvalidArgument) for a world size < 1, a chunk size that does not divide into an
// equal number of chunks per rank, a world larger than the sequence, a rank outside the world, and
// the like.
FLEXCP_API Plan make_plan(const Mask& mask, const PlanOptions& options, int rank);

// The figures of a baseline (or of flexcp's own plan) on the same mask and cost model.
struct BaselineFigures {
  std::int64_t comm_bytes_fwd = 0;  // K and V received, summed over ranks
  double imbalance = 1.0;           // max rank compute / mean
  double predicted_us = 0;          // forward time under the same cost model
  double idle_fraction = 0;         // share of rank-time spent waiting
  bool applicable = true;           // Ulysses needs heads divisible by the world size
};

struct RankSummary {
  std::int64_t q_tokens = 0;
  std::int64_t area = 0;
  std::int64_t recv_tokens = 0;
  std::int64_t send_tokens = 0;
  int num_stages = 0;
  std::vector<std::int64_t> stage_area;
  double predicted_us = 0;
  double exposed_comm_us = 0;
  double rank_ms = 0;
};

// Every rank planned (in parallel over OpenMP threads, each rank's plan single-threaded; keeping
// only its figures, so memory follows a few ranks' plans, not the world's),
// beside ring attention (zigzag), Ulysses, all-gather and MagiAttention's default dispatch.
struct FLEXCP_API PlanReport {
  PlanOptions options;
  Dispatch dispatch;
  std::vector<RankSummary> ranks;
  std::int64_t comm_bytes_fwd = 0;    // K and V received, summed over ranks
  std::int64_t comm_bytes_intra = 0;  // of which over intra-node links (hierarchical casts)
  std::int64_t comm_bytes_inter = 0;  // of which across nodes
  double predicted_us = 0;            // slowest rank
  double dispatch_ms = 0;
  double slowest_rank_ms = 0;
  double plan_ms() const { return dispatch_ms + slowest_rank_ms; }  // the slowest rank's
  BaselineFigures ring, ulysses, allgather, magi;
};

FLEXCP_API PlanReport make_plan_report(const Mask& mask, const PlanOptions& options);

}  // namespace flexcp
