// Pieces of the planner shared between its files. What every rank runs (Planner's constructor):
// cut and assign chunks (dispatch.cc), the K/V columns each rank's rows attend (needs.cc). What a
// rank runs for itself (Planner::plan_rank): its receive pieces and stages (needs.cc, stages.cc),
// its sends (needs.cc), its work in local coordinates (local_work.cc) and kernel plans. The report
// adds the baselines (baselines.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "flexcp/plan.h"

namespace flexcp::plan_detail {

// Row ranges cut into consecutive chunks, with the bands touching each chunk (CSR).
struct ChunkIndex {
  std::vector<Range> chunks;
  std::vector<std::int64_t> offsets;  // chunk c: band_ids[offsets[c], offsets[c+1])
  std::vector<std::int32_t> band_ids;
  std::int64_t chunk_of(std::int64_t row) const;  // chunks must cover the row
};
ChunkIndex index_bands(const std::vector<Band>& bands, std::vector<Range> chunks);

// n chunks of [0, length) whose sizes differ by at most one token.
std::vector<Range> equal_chunks(std::int64_t length, std::int64_t n);

// dispatch.cc: the q chunks the options ask for (checked; chunk_size or chunks_per_rank given),
// the counts per rank the planner chooses among otherwise (kChunksPerRankChoices that fit), and
// the balanced assignment: owner[c]
// for each chunk, each rank getting costs.size() / world chunks, minimising the largest total
// cost (runs of neighbours placed longest first, then swap refinement between heavy and light
// ranks).
std::vector<Range> cut_chunks(std::int64_t seqlen, const PlanOptions& options);
std::vector<std::int64_t> chunks_per_rank_choices(std::int64_t seqlen, int world);
std::vector<int> assign_chunks(const std::vector<std::int64_t>& costs, int world);
// Longest first into the least-loaded rank that still has room for another of its
// ceil(n / world) chunks; no refinement (MagiAttention's default dispatch).
std::vector<int> assign_longest_first(const std::vector<std::int64_t>& costs, int world);

// Attended pairs of each chunk.
std::vector<std::int64_t> chunk_costs(const std::vector<Band>& bands, const ChunkIndex& index);

struct KvLayout {
  std::vector<Range> chunks;  // K/V token chunks in global order
  std::vector<int> owner;
};

// needs.cc. The K/V columns the rows of `q_chunks` attend: each band's span over each chunk,
// merged (sorted, disjoint).
std::vector<Range> attended_spans(const std::vector<Band>& bands, const ChunkIndex& q_index,
                                  const std::vector<std::int64_t>& q_chunks);

// A K/V range of one owner that one rank needs; `area` is the attended pairs of that rank's rows
// in it (set by piece_areas).
struct Piece {
  int owner;
  Range tokens;
  std::int64_t area = 0;
};
// The parts of `spans` inside K/V chunks, in token order, parts of one owner that touch joined:
// in the chunks `kv_chunk_ids` (ascending: a sender's own, for one destination's spans), or in
// every chunk `rank` does not hold (the receiver's). Both see the same pieces in the same order.
std::vector<Piece> pieces_in(const std::vector<Range>& spans, const KvLayout& kv,
                             const std::vector<std::int64_t>& kv_chunk_ids);
std::vector<Piece> remote_pieces(const std::vector<Range>& spans, const KvLayout& kv, int rank);
// Sets each piece's area for the rows of `q_chunks`, and returns the area in columns outside
// every piece (the rank's own K/V).
std::int64_t piece_areas(const std::vector<Band>& bands, const ChunkIndex& q_index,
                         const std::vector<std::int64_t>& q_chunks, std::vector<Piece>& pieces);

// stages.cc
int node_of(int rank, const PlanOptions& options);
double compute_us(std::int64_t area, const PlanOptions& options);
double transfer_us(std::int64_t tokens, bool same_node, const PlanOptions& options);
std::int64_t kv_bytes_per_token(const PlanOptions& options);
// One rank's pieces priced once (nearest owners first), so that trying stage counts is linear.
struct Staging {
  std::vector<std::size_t> order;    // pieces by ring distance of their owner, then position
  std::vector<double> comm_us;       // per piece, in `order`
  std::vector<double> compute_us;    // per piece, in `order`
  std::vector<std::int64_t> tokens;  // per piece, in `order`
  double local_us = 0;
};
Staging price_pieces(std::int64_t local_area, const std::vector<Piece>& pieces, int rank,
                     const PlanOptions& options);
// Stage (1..num_stages) of each piece: `order` cut into num_stages groups of about equal tokens.
std::vector<int> stage_pieces(const Staging& staging, int num_stages);
struct Timeline {
  double total_us = 0;
  double exposed_us = 0;
};
Timeline simulate(const Staging& staging, int num_stages, const PlanOptions& options);
// The stage count the options ask for, or the one under which this rank finishes first.
int choose_stages(const Staging& staging, const PlanOptions& options);
// Bytes of one owner's sends over intra- and inter-node links when every token crosses to each
// remote node once and fans out inside it (hierarchical group-cast).
struct LinkBytes {
  std::int64_t intra = 0, inter = 0;
};
LinkBytes hierarchical_bytes(const std::vector<SendRange>& sends, int owner,
                             const PlanOptions& options);

// local_work.cc: a rank's work per stage as bands in local coordinates.
void build_local_work(const std::vector<Band>& bands, const ChunkIndex& q_index, RankPlan& rp);
Band clip_and_shift(Band b, Range rows, Range cols, std::int64_t dr, std::int64_t dc);

// What every rank computes once (the dispatch and everyone's attended K/V columns), and from it
// any one rank's own plan.
class Planner {
 public:
  Planner(const Mask& mask, const PlanOptions& options);
  const PlanOptions& options() const { return options_; }
  const Dispatch& dispatch() const { return l_.dispatch; }
  const std::vector<Band>& bands() const { return bands_; }
  // `kernel_plans`: build the stage AttentionPlans too (what a rank runs in training).
  RankPlan plan_rank(int rank, bool kernel_plans = true) const;
  // The K/V tokens `rank` receives (its plan's recv_tokens), without the rest of its plan.
  std::int64_t recv_tokens(int rank) const;

 private:
  // One way of cutting the sequence, assigned and with everyone's attended columns.
  struct Layout {
    ChunkIndex q_index;
    KvLayout kv;
    Dispatch dispatch;
    std::vector<std::vector<std::int64_t>> q_chunks_of;   // per rank, ascending
    std::vector<std::vector<std::int64_t>> kv_chunks_of;  // per rank, ascending
    std::vector<std::vector<Range>> spans;                // per rank: the K/V columns it attends
    std::int64_t recv_tokens = 0;                         // summed over ranks
  };
  Layout lay_out(const Mask& mask, std::vector<Range> chunks) const;

  PlanOptions options_;
  std::vector<Band> bands_;
  Layout l_;
};

// baselines.cc: the peers on the same mask and cost model.
BaselineFigures ring_baseline(const std::vector<Band>& bands, const Mask& mask,
                              const PlanOptions& options);
BaselineFigures ulysses_baseline(const Mask& mask, const PlanOptions& options);
BaselineFigures allgather_baseline(const Mask& mask, const PlanReport& report);
BaselineFigures magi_baseline(const std::vector<Band>& bands, const Mask& mask,
                              const PlanOptions& options);

}  // namespace flexcp::plan_detail
