// Pieces of the planner shared between its files. The order of make_plan: cut and assign chunks
// (dispatch.cc), find each rank's K/V needs (needs.cc), choose stages and casts (stages.cc),
// rewrite each rank's work in local coordinates (local_work.cc), price the baselines
// (baselines.cc).
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

// dispatch.cc: number of chunks for the options, and the balanced assignment.
std::int64_t choose_num_chunks(std::int64_t seqlen, const PlanOptions& options);
// owner[c] for each chunk, each rank getting costs.size() / world chunks, minimising the largest
// total cost (longest-first greedy, then swap refinement between heavy and light ranks).
std::vector<int> assign_chunks(const std::vector<std::int64_t>& costs, int world);

// needs.cc: the remote K/V pieces one rank needs, by owner, merged; `area` per piece is the
// attended pairs of the rank's rows in those columns.
struct Piece {
  int owner;
  Range tokens;
  std::int64_t area;
};
struct KvLayout {
  std::vector<Range> chunks;  // K/V token chunks in global order
  std::vector<int> owner;
};
std::vector<Piece> remote_needs(const std::vector<Band>& bands, const ChunkIndex& q_index,
                                const std::vector<std::int64_t>& own_q_chunks, const KvLayout& kv,
                                int rank, std::int64_t* local_area);

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
std::vector<CastItem> group_casts(const std::vector<std::vector<Piece>>& needs, int world);

// local_work.cc: rank's work per stage as bands in local coordinates.
void build_local_work(const std::vector<Band>& bands, const ChunkIndex& q_index, RankPlan& rp,
                      int num_stages);

// baselines.cc
void price_baselines(const Mask& mask, const std::vector<Band>& bands, Plan& plan);
Band clip_and_shift(Band b, Range rows, Range cols, std::int64_t dr, std::int64_t dc);

}  // namespace flexcp::plan_detail
