// make_plan: the dispatch and everyone's attended K/V columns (repeated identically on every rank),
// then one rank's own receive pieces, stages, sends, local work and kernel plans.
#include "flexcp/plan.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "core/parallel.h"
#include "flexcp/status.h"
#include "kernels/plan/attention_plan_impl.h"
#include "plan/plan_internal.h"

namespace flexcp {
namespace {

using namespace plan_detail;

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
  if (o.chunks_per_rank < 0)
    fail("chunks_per_rank is " + std::to_string(o.chunks_per_rank) +
         ", expected >= 0 (0: automatic)");
  if (o.chunk_size > 0 && o.chunks_per_rank > 0)
    fail("chunk_size " + std::to_string(o.chunk_size) + " and chunks_per_rank " +
         std::to_string(o.chunks_per_rank) + " are both set, expected one of them");
  if (o.gpus_per_node < 0)
    fail("gpus_per_node is " + std::to_string(o.gpus_per_node) + ", expected >= 0");
  if (o.num_stages < 0 || o.num_stages > 64)
    fail("num_stages is " + std::to_string(o.num_stages) + ", expected 0 (automatic) to 64");
  if (o.heads_q < 1 || o.heads_kv < 1 || o.head_dim < 1)
    fail("heads_q, heads_kv and head_dim must be >= 1");
  if (o.heads_q % o.heads_kv != 0)
    fail("heads_q " + std::to_string(o.heads_q) + " and heads_kv " + std::to_string(o.heads_kv) +
         ", expected heads_q a multiple of heads_kv");
  if (o.dtype == DType::kFloat64) fail("dtype is fp64, expected fp32, bf16 or fp16");
  if (!(o.cost.kernel_tflops > 0 && o.cost.intra_node_gbps > 0 && o.cost.inter_node_gbps > 0 &&
        o.cost.stage_overhead_us >= 0))
    fail("cost model rates must be > 0 and the stage overhead >= 0");
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

namespace plan_detail {

Planner::Layout Planner::lay_out(const Mask& mask, std::vector<Range> chunks) const {
  const int world = options_.world_size;
  const std::int64_t tq = mask.seqlen_q(), tk = mask.seqlen_k();
  Layout l;
  l.q_index = index_bands(bands_, std::move(chunks));
  Dispatch& d = l.dispatch;
  d.world_size = world;
  d.chunks = l.q_index.chunks;
  d.chunks_per_rank = static_cast<std::int64_t>(d.chunks.size()) / world;
  for (const Range& c : d.chunks) d.chunk_size = std::max(d.chunk_size, c.size());
  d.chunk_area = chunk_costs(bands_, l.q_index);
  d.chunk_owner = assign_chunks(d.chunk_area, world);
  // K/V live with the q chunk of the same tokens (self-attention) or, for cross-attention, in W
  // equal contiguous parts.
  if (tq == tk) {
    l.kv.chunks = d.chunks;
    l.kv.owner = d.chunk_owner;
  } else {
    l.kv.chunks = equal_chunks(tk, world);
    for (int r = 0; r < world; ++r) l.kv.owner.push_back(r);
  }
  d.kv_chunks = l.kv.chunks;
  d.kv_owner = l.kv.owner;
  d.rank_area.assign(world, 0);
  l.q_chunks_of.resize(world);
  l.kv_chunks_of.resize(world);
  for (std::size_t c = 0; c < d.chunks.size(); ++c) {
    l.q_chunks_of[d.chunk_owner[c]].push_back(static_cast<std::int64_t>(c));
    d.rank_area[d.chunk_owner[c]] += d.chunk_area[c];
  }
  for (std::size_t c = 0; c < l.kv.chunks.size(); ++c)
    l.kv_chunks_of[l.kv.owner[c]].push_back(static_cast<std::int64_t>(c));
  std::int64_t total = 0, worst = 0;
  for (std::int64_t a : d.rank_area) total += a, worst = std::max(worst, a);
  d.imbalance = total > 0 ? static_cast<double>(worst) / (static_cast<double>(total) / world) : 1.0;
  // Every rank's attended columns: what it receives is cut from its own, what it sends from the
  // others'. What it receives is what it attends outside its own K/V.
  l.spans.resize(world);
  for (int r = 0; r < world; ++r) {
    l.spans[r] = attended_spans(bands_, l.q_index, l.q_chunks_of[r]);
    for (const Range& span : l.spans[r]) l.recv_tokens += span.size();
    for (const Piece& own : pieces_in(l.spans[r], l.kv, l.kv_chunks_of[r]))
      l.recv_tokens -= own.tokens.size();
  }
  return l;
}

Planner::Planner(const Mask& mask, const PlanOptions& options)
    : options_(options), bands_(mask_bands(mask)) {
  check_options(mask, options);
  const int world = options.world_size;
  const std::int64_t tq = mask.seqlen_q();
  if (options.chunk_size > 0 || options.chunks_per_rank > 0) {
    l_ = lay_out(mask, cut_chunks(tq, options));
    return;
  }
  // The count that moves the fewest bytes among the balanced ones (kChunksPerRankChoices).
  bool have = false, have_balanced = false;
  for (std::int64_t per_rank : chunks_per_rank_choices(tq, world)) {
    Layout l = lay_out(mask, equal_chunks(tq, per_rank * world));
    const bool balanced = l.dispatch.imbalance <= kChosenImbalance;
    const bool better =
        !have || (balanced && !have_balanced) ||
        (balanced == have_balanced && (balanced ? l.recv_tokens < l_.recv_tokens
                                                : l.dispatch.imbalance < l_.dispatch.imbalance));
    if (better) {
      l_ = std::move(l);
      have = true;
      have_balanced = balanced;
    }
  }
}

RankPlan Planner::plan_rank(int rank, bool kernel_plans) const {
  const PlanOptions& o = options_;
  const Dispatch& d = l_.dispatch;
  if (rank < 0 || rank >= o.world_size)
    fail("rank " + std::to_string(rank) + " is outside [0, " + std::to_string(o.world_size) + ")");
  RankPlan rp;
  rp.rank = rank;
  rp.chunks = l_.q_chunks_of[rank];
  for (std::int64_t c : rp.chunks) {
    rp.q_tokens.push_back(d.chunks[c]);
    rp.num_q_tokens += d.chunks[c].size();
  }
  for (std::int64_t c : l_.kv_chunks_of[rank]) {
    rp.k_tokens.push_back(l_.kv.chunks[c]);
    rp.num_k_tokens += l_.kv.chunks[c].size();
  }
  // Receives: this rank's columns outside its own K/V, priced and cut into stages.
  std::vector<Piece> pieces = remote_pieces(l_.spans[rank], l_.kv, rank);
  const std::int64_t local_area = piece_areas(bands_, l_.q_index, rp.chunks, pieces);
  const Staging staging = price_pieces(local_area, pieces, rank, o);
  rp.num_stages = choose_stages(staging, o);
  const std::vector<int> stage = stage_pieces(staging, std::max(rp.num_stages, 1));
  std::vector<int> from_owner(o.world_size, 0);
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    rp.recv.push_back({pieces[i].owner, pieces[i].tokens, stage[i], from_owner[pieces[i].owner]++});
    rp.recv_tokens += pieces[i].tokens.size();
  }
  std::stable_sort(rp.recv.begin(), rp.recv.end(), [](const RemoteRange& a, const RemoteRange& b) {
    return a.stage != b.stage   ? a.stage < b.stage
           : a.owner != b.owner ? a.owner < b.owner
                                : a.tokens.begin < b.tokens.begin;
  });
  // Sends: each other rank's columns inside this rank's K/V, cut the way that rank cuts them.
  for (int dest = 0; dest < o.world_size; ++dest) {
    if (dest == rank) continue;
    const std::vector<Piece> to = pieces_in(l_.spans[dest], l_.kv, l_.kv_chunks_of[rank]);
    for (std::size_t i = 0; i < to.size(); ++i) {
      rp.sends.push_back({dest, to[i].tokens, static_cast<int>(i)});
      rp.send_tokens += to[i].tokens.size();
    }
  }
  build_local_work(bands_, l_.q_index, rp);
  for (std::int64_t a : rp.stage_area) rp.area += a;
  if (kernel_plans) {
    AttentionShape shape{rp.num_q_tokens, rp.num_columns(), o.heads_q, o.heads_kv,
                         o.head_dim,      o.dtype,          o.device,  o.device_index};
    for (const auto& work : rp.stage_work)
      rp.stage_plans.push_back(make_attention_plan(work, shape, "flexcp::make_plan"));
  }
  const Timeline t = simulate(staging, std::max(rp.num_stages, 1), o);
  rp.predicted_us = t.total_us;
  rp.exposed_comm_us = t.exposed_us;
  return rp;
}

std::int64_t Planner::recv_tokens(int rank) const {
  std::int64_t tokens = 0;
  for (const Piece& p : remote_pieces(l_.spans[rank], l_.kv, rank)) tokens += p.tokens.size();
  return tokens;
}

}  // namespace plan_detail

Dispatch make_dispatch(const Mask& mask, const PlanOptions& options) {
  return Planner(mask, options).dispatch();
}

Plan make_plan(const Mask& mask, const PlanOptions& options, int rank) {
  const auto t0 = std::chrono::steady_clock::now();
  const Planner planner(mask, options);
  const double dispatch_ms = ms_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  Plan plan;
  plan.rank = planner.plan_rank(rank);
  plan.rank_ms = ms_since(t1);
  plan.dispatch_ms = dispatch_ms;
  plan.options = options;
  plan.dispatch = planner.dispatch();
  return plan;
}

PlanReport make_plan_report(const Mask& mask, const PlanOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const Planner planner(mask, options);
  PlanReport report;
  report.dispatch_ms = ms_since(t0);
  report.options = options;
  report.dispatch = planner.dispatch();
  // Ranks plan independently (each one single-threaded, as in training), so the report plans
  // them in parallel and keeps only their figures.
  const int world = options.world_size;
  report.ranks.resize(world);
  std::vector<LinkBytes> links(world);
  FirstError errors;
#pragma omp parallel for schedule(dynamic, 1)
  for (int r = 0; r < world; ++r)
    errors.run([&, r] {
      const auto t_rank = std::chrono::steady_clock::now();
      const RankPlan rp = planner.plan_rank(r);
      RankSummary& s = report.ranks[r];
      s.rank_ms = ms_since(t_rank);
      s.q_tokens = rp.num_q_tokens;
      s.area = rp.area;
      s.recv_tokens = rp.recv_tokens;
      s.send_tokens = rp.send_tokens;
      s.num_stages = rp.num_stages;
      s.stage_area = rp.stage_area;
      s.predicted_us = rp.predicted_us;
      s.exposed_comm_us = rp.exposed_comm_us;
      links[r] = hierarchical_bytes(rp.sends, r, options);
    });
  errors.rethrow();
  const std::int64_t bpt = kv_bytes_per_token(options);
  for (int r = 0; r < world; ++r) {
    const RankSummary& s = report.ranks[r];
    report.comm_bytes_fwd += s.recv_tokens * bpt;
    report.comm_bytes_intra += links[r].intra;
    report.comm_bytes_inter += links[r].inter;
    report.predicted_us = std::max(report.predicted_us, s.predicted_us);
    report.slowest_rank_ms = std::max(report.slowest_rank_ms, s.rank_ms);
  }
  report.ring = ring_baseline(planner.bands(), mask, options);
  report.ulysses = ulysses_baseline(mask, options);
  report.allgather = allgather_baseline(mask, report);
  report.magi = magi_baseline(planner.bands(), mask, options);
  return report;
}

std::vector<std::int64_t> Dispatch::position_ids(int rank) const {
  if (rank < 0 || rank >= world_size)
    throw Error(Status::kInvalidArgument, "Dispatch::position_ids: rank " + std::to_string(rank) +
                                              " is outside [0, " + std::to_string(world_size) +
                                              ")");
  std::vector<std::int64_t> ids;
  for (std::size_t c = 0; c < chunks.size(); ++c)
    if (chunk_owner[c] == rank)
      for (std::int64_t t = chunks[c].begin; t < chunks[c].end; ++t) ids.push_back(t);
  return ids;
}

std::int64_t Dispatch::num_q_tokens(int rank) const {
  std::int64_t n = 0;
  for (std::size_t c = 0; c < chunks.size(); ++c)
    if (chunk_owner[c] == rank) n += chunks[c].size();
  return n;
}

std::int64_t Dispatch::num_k_tokens(int rank) const {
  std::int64_t n = 0;
  for (std::size_t c = 0; c < kv_chunks.size(); ++c)
    if (kv_owner[c] == rank) n += kv_chunks[c].size();
  return n;
}

std::vector<int> Dispatch::global_to_rank_q() const {
  std::vector<int> out(chunks.empty() ? 0 : chunks.back().end);
  for (std::size_t c = 0; c < chunks.size(); ++c)
    std::fill(out.begin() + chunks[c].begin, out.begin() + chunks[c].end, chunk_owner[c]);
  return out;
}

std::vector<std::int64_t> Dispatch::global_to_local_q() const {
  std::vector<std::int64_t> out(chunks.empty() ? 0 : chunks.back().end);
  std::vector<std::int64_t> next(world_size, 0);
  for (std::size_t c = 0; c < chunks.size(); ++c)
    for (std::int64_t t = chunks[c].begin; t < chunks[c].end; ++t) out[t] = next[chunk_owner[c]]++;
  return out;
}

}  // namespace flexcp
