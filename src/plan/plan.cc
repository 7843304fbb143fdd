// make_plan: dispatch, everyone's K/V needs and the stage count (repeated identically on every
// rank), then each rank's own receive list, local work and work lists.
#include "flexcp/plan.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "flexcp/status.h"
#include "kernels/worklist/worklist.h"
#include "plan/plan_internal.h"

namespace flexcp {
namespace {

using namespace plan_detail;

// Stage counts the cost model chooses among.
constexpr int kMaxAutoStages = 8;
// Tiles of the work lists built with the plan (the GPU kernel's q tile and k block).
constexpr std::int64_t kPlanTileRows = 128;
constexpr std::int64_t kPlanBlockCols = 64;

[[noreturn]] void fail(const std::string& message) {
  throw Error(Status::kInvalidArgument, "flexcp::make_plan: " + message);
}

void check_options(const Mask& mask, const PlanOptions& o) {
  const std::int64_t tq = mask.seqlen_q();
  if (o.world_size < 1) fail("world_size is " + std::to_string(o.world_size) + ", expected >= 1");
  if (o.world_size > tq)
    fail("world_size " + std::to_string(o.world_size) + " is larger than seqlen_q " +
         std::to_string(tq) + ": every rank needs at least one token");
  if (o.chunk_size < 0)
    fail("chunk_size is " + std::to_string(o.chunk_size) + ", expected >= 0 (0: automatic)");
  if (o.chunk_size > tq)
    fail("chunk_size " + std::to_string(o.chunk_size) + " is larger than the sequence (" +
         std::to_string(tq) + " tokens)");
  if (o.gpus_per_node < 0)
    fail("gpus_per_node is " + std::to_string(o.gpus_per_node) + ", expected >= 0");
  if (o.num_stages < 0 || o.num_stages > 64)
    fail("num_stages is " + std::to_string(o.num_stages) + ", expected 0 (automatic) to 64");
  if (o.heads_q < 1 || o.heads_kv < 1 || o.head_dim < 1 || o.element_bytes < 1)
    fail("heads_q, heads_kv, head_dim and element_bytes must be >= 1");
  if (!(o.cost.kernel_tflops > 0 && o.cost.intra_node_gbps > 0 && o.cost.inter_node_gbps > 0 &&
        o.cost.stage_overhead_us >= 0))
    fail("cost model rates must be > 0 and the stage overhead >= 0");
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Plan make_plan(const Mask& mask, const PlanOptions& options) {
  check_options(mask, options);
  const auto t_global = std::chrono::steady_clock::now();
  Plan plan;
  plan.options = options;
  const int world = options.world_size;
  const std::int64_t tq = mask.seqlen_q(), tk = mask.seqlen_k();

  std::vector<Band> bands;
  bands.reserve(mask.slices().size());
  for (const Slice& s : mask.slices()) {
    const Band b = trim_band(slice_band(s));
    if (b.row_begin < b.row_end) bands.push_back(b);
  }
  const std::int64_t num_chunks = choose_num_chunks(tq, options);
  const ChunkIndex q_index = index_bands(bands, equal_chunks(tq, num_chunks));
  plan.chunks = q_index.chunks;
  plan.chunk_size = (tq + num_chunks - 1) / num_chunks;
  std::vector<std::int64_t> cost(num_chunks, 0);
  for (std::int64_t c = 0; c < num_chunks; ++c)
    for (std::int64_t i = q_index.offsets[c]; i < q_index.offsets[c + 1]; ++i) {
      const Band& b = bands[q_index.band_ids[i]];
      cost[c] += band_area(b, plan.chunks[c].begin, plan.chunks[c].end, b.begin_min, b.end_max);
    }
  plan.chunk_owner = assign_chunks(cost, world);

  // K/V live with the q chunk of the same tokens (self-attention) or, for cross-attention, in W
  // equal contiguous parts.
  KvLayout kv;
  if (tq == tk) {
    kv.chunks = plan.chunks;
    kv.owner = plan.chunk_owner;
  } else {
    kv.chunks = equal_chunks(tk, world);
    for (int r = 0; r < world; ++r) kv.owner.push_back(r);
  }
  plan.ranks.resize(world);
  for (std::int64_t c = 0; c < num_chunks; ++c) plan.ranks[plan.chunk_owner[c]].chunks.push_back(c);
  std::vector<std::vector<Piece>> needs(world);
  std::vector<std::int64_t> local_area(world, 0);
  for (int r = 0; r < world; ++r)
    needs[r] = remote_needs(bands, q_index, plan.ranks[r].chunks, kv, r, &local_area[r]);

  // Stage count: the one whose slowest rank finishes first under the cost model.
  bool any_remote = false;
  for (const auto& n : needs) any_remote = any_remote || !n.empty();
  std::vector<Staging> staging(world);
  for (int r = 0; r < world; ++r) staging[r] = price_pieces(local_area[r], needs[r], r, options);
  int stages = options.num_stages;
  if (!any_remote) {
    stages = 0;
  } else if (stages == 0) {
    double best = 0;
    for (int s = 1; s <= kMaxAutoStages; ++s) {
      double slowest = 0;
      for (int r = 0; r < world; ++r)
        slowest = std::max(slowest, simulate(staging[r], s, options).total_us);
      if (s == 1 || slowest < best) best = slowest, stages = s;
    }
  }
  std::vector<std::vector<int>> stage_of(world);
  for (int r = 0; r < world; ++r) stage_of[r] = stage_pieces(staging[r], std::max(stages, 1));
  plan.num_stages = stages;
  // Every rank needs the items it sends (as owner), which depend on everyone's needs.
  plan.casts = group_casts(needs, world);
  plan.global_ms = ms_since(t_global);

  const std::int64_t bpt = kv_bytes_per_token(options);
  for (int r = 0; r < world; ++r) {
    const auto t_rank = std::chrono::steady_clock::now();
    RankPlan& rp = plan.ranks[r];
    for (std::int64_t c : rp.chunks) {
      rp.q_tokens.push_back(plan.chunks[c]);
      rp.num_q_tokens += plan.chunks[c].size();
    }
    for (std::size_t c = 0; c < kv.chunks.size(); ++c)
      if (kv.owner[c] == r)
        rp.k_tokens.push_back(kv.chunks[c]), rp.num_k_tokens += kv.chunks[c].size();
    for (std::size_t i = 0; i < needs[r].size(); ++i) {
      rp.recv.push_back({needs[r][i].owner, needs[r][i].tokens, stage_of[r][i]});
      rp.recv_tokens += needs[r][i].tokens.size();
    }
    std::stable_sort(rp.recv.begin(), rp.recv.end(),
                     [](const RemoteRange& a, const RemoteRange& b) {
                       return a.stage != b.stage   ? a.stage < b.stage
                              : a.owner != b.owner ? a.owner < b.owner
                                                   : a.tokens.begin < b.tokens.begin;
                     });
    build_local_work(bands, q_index, rp, stages);
    for (std::int64_t a : rp.stage_area) rp.area += a;
    const std::int64_t num_cols = rp.num_k_tokens + rp.recv_tokens;
    // NOTE: built here so that plan_ms counts a rank's whole planning cost (DESIGN §4); the
    // kernels build their own lists with their tile sizes from stage_work.
    for (const auto& work : rp.stage_work)
      build_work_list(work, rp.num_q_tokens, num_cols,
                      {WorkListOrder::kRowMajor, kPlanTileRows, kPlanBlockCols});
    const Timeline t = simulate(staging[r], std::max(stages, 1), options);
    rp.predicted_us = t.total_us;
    rp.exposed_comm_us = t.exposed_us;
    plan.slowest_rank_ms = std::max(plan.slowest_rank_ms, ms_since(t_rank));
  }

  for (const CastItem& item : plan.casts) {
    const std::int64_t bytes = item.tokens.size() * bpt;
    plan.ranks[item.owner].send_tokens +=
        item.tokens.size() * static_cast<std::int64_t>(item.dests.size());
    // Hierarchical: one crossing per remote node, then a fan-out inside that node.
    const int home = node_of(item.owner, options);
    std::vector<int> nodes;
    for (int d : item.dests) nodes.push_back(node_of(d, options));
    std::sort(nodes.begin(), nodes.end());
    nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
    const std::int64_t remote_nodes =
        static_cast<std::int64_t>(nodes.size()) -
        (std::binary_search(nodes.begin(), nodes.end(), home) ? 1 : 0);
    plan.comm_bytes_inter += remote_nodes * bytes;
    plan.comm_bytes_intra += (static_cast<std::int64_t>(item.dests.size()) - remote_nodes) * bytes;
  }
  std::int64_t total_area = 0, max_area = 0;
  for (const RankPlan& rp : plan.ranks) {
    plan.comm_bytes_fwd += rp.recv_tokens * bpt;
    total_area += rp.area;
    max_area = std::max(max_area, rp.area);
    plan.predicted_us = std::max(plan.predicted_us, rp.predicted_us);
  }
  plan.imbalance = total_area > 0
                       ? static_cast<double>(max_area) / (static_cast<double>(total_area) / world)
                       : 1.0;
  price_baselines(mask, bands, plan);
  return plan;
}

std::vector<std::int64_t> Plan::position_ids(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(ranks.size()))
    throw Error(Status::kInvalidArgument, "Plan::position_ids: rank " + std::to_string(rank) +
                                              " is outside [0, " + std::to_string(ranks.size()) +
                                              ")");
  std::vector<std::int64_t> ids;
  for (const Range& r : ranks[rank].q_tokens)
    for (std::int64_t t = r.begin; t < r.end; ++t) ids.push_back(t);
  return ids;
}

std::vector<int> Plan::global_to_rank_q() const {
  std::vector<int> out(chunks.empty() ? 0 : chunks.back().end);
  for (std::size_t c = 0; c < chunks.size(); ++c)
    std::fill(out.begin() + chunks[c].begin, out.begin() + chunks[c].end, chunk_owner[c]);
  return out;
}

std::vector<std::int64_t> Plan::global_to_local_q() const {
  std::vector<std::int64_t> out(chunks.empty() ? 0 : chunks.back().end);
  for (const RankPlan& rp : ranks) {
    std::int64_t local = 0;
    for (const Range& r : rp.q_tokens)
      for (std::int64_t t = r.begin; t < r.end; ++t) out[t] = local++;
  }
  return out;
}

}  // namespace flexcp
