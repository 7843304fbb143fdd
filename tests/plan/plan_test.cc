// The plan against brute force: every attended pair computed by exactly one rank in exactly one
// stage, from columns that arrived in that stage; every needed K/V token received exactly once,
// and sent by its owner in the same pieces; areas, permutations, determinism, chunking, errors.
#include <gtest/gtest.h>

#include <random>
#include <tuple>

#include "kernels/worklist/worklist.h"
#include "plan/plan_internal.h"
#include "test_util.h"

namespace flexcp {
namespace {

using plan_detail::Planner;

// Global K/V token of each column of a rank's local buffer, and the stage it arrives in.
struct Columns {
  std::vector<std::int64_t> token;
  std::vector<int> stage;
};

Columns local_columns(const RankPlan& rp) {
  Columns c;
  for (const Range& r : rp.k_tokens)
    for (std::int64_t t = r.begin; t < r.end; ++t) c.token.push_back(t), c.stage.push_back(0);
  for (const RemoteRange& r : rp.recv)
    for (std::int64_t t = r.tokens.begin; t < r.tokens.end; ++t)
      c.token.push_back(t), c.stage.push_back(r.stage);
  return c;
}

void check_plan(const Mask& mask, const PlanOptions& options) {
  SCOPED_TRACE("world " + std::to_string(options.world_size) + " chunk " +
               std::to_string(options.chunk_size) + " per rank " +
               std::to_string(options.chunks_per_rank) + " tq " + std::to_string(mask.seqlen_q()) +
               " tk " + std::to_string(mask.seqlen_k()));
  const Planner planner(mask, options);
  const Dispatch& d = planner.dispatch();
  const std::int64_t tq = mask.seqlen_q(), tk = mask.seqlen_k();
  const int world = options.world_size;
  const auto want = test::enumerate_pairs(mask.slices(), tq, tk);
  std::vector<int> seen(want.size(), 0);
  const std::vector<int> rank_of = d.global_to_rank_q();
  const std::vector<std::int64_t> local_of = d.global_to_local_q();
  std::vector<int> kv_owner(tk, -1);
  for (std::size_t c = 0; c < d.kv_chunks.size(); ++c)
    for (std::int64_t t = d.kv_chunks[c].begin; t < d.kv_chunks[c].end; ++t) {
      ASSERT_EQ(kv_owner[t], -1) << "K/V token " << t << " held twice";
      kv_owner[t] = d.kv_owner[c];
    }
  for (std::int64_t t = 0; t < tk; ++t)
    ASSERT_GE(kv_owner[t], 0) << "K/V token " << t << " held by nobody";
  ASSERT_EQ(static_cast<std::int64_t>(d.chunks.size()), d.chunks_per_rank * world);

  std::vector<RankPlan> plans;
  std::int64_t area = 0;
  for (int r = 0; r < world; ++r) plans.push_back(planner.plan_rank(r));
  for (int r = 0; r < world; ++r) {
    const RankPlan& rp = plans[r];
    ASSERT_EQ(static_cast<std::int64_t>(rp.chunks.size()), d.chunks_per_rank);
    const std::vector<std::int64_t> rows = d.position_ids(r);
    ASSERT_EQ(static_cast<std::int64_t>(rows.size()), rp.num_q_tokens);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      ASSERT_EQ(rank_of[rows[i]], r);
      ASSERT_EQ(local_of[rows[i]], static_cast<std::int64_t>(i));
    }
    ASSERT_EQ(planner.recv_tokens(r), rp.recv_tokens);
    const Columns cols = local_columns(rp);
    ASSERT_EQ(static_cast<std::int64_t>(cols.token.size()), rp.num_columns());
    // Replay the local work of every stage: each cell once, and only from columns that are in by
    // then (stage s computes on its own received columns and on the own rows, stage 0).
    ASSERT_EQ(static_cast<int>(rp.stage_work.size()), rp.num_stages + 1);
    for (std::size_t s = 0; s < rp.stage_work.size(); ++s) {
      std::int64_t stage_area = 0;
      for (const Band& b : rp.stage_work[s]) {
        for (std::int64_t x = b.row_begin; x < b.row_end; ++x)
          for (std::int64_t y = b.begin(x); y < b.end(x); ++y) {
            ASSERT_LT(x, rp.num_q_tokens);
            ASSERT_LT(y, rp.num_columns());
            ASSERT_EQ(cols.stage[y], static_cast<int>(s))
                << "rank " << r << " computes column " << y << " (token " << cols.token[y]
                << ", arriving in stage " << cols.stage[y] << ") in stage " << s;
            ++seen[rows[x] * tk + cols.token[y]];
          }
        stage_area += band_area(b, b.row_begin, b.row_end, b.begin_min, b.end_max);
      }
      ASSERT_EQ(stage_area, rp.stage_area[s]);
      // The stage's kernel plan covers the same work over the rank's local tensors.
      const AttentionPlan& plan = rp.stage_plans[s];
      ASSERT_EQ(plan.area(), stage_area);
      ASSERT_EQ(plan.shape().seqlen_q, rp.num_q_tokens);
      ASSERT_EQ(plan.shape().seqlen_k, rp.num_columns());
      area += stage_area;
    }
    // K/V received: exactly the remote tokens this rank's rows attend, each once, from its owner,
    // numbered per owner in token order.
    std::vector<char> needed(tk, 0), got(tk, 0);
    for (std::int64_t q : rows)
      for (std::int64_t k = 0; k < tk; ++k)
        if (want[q * tk + k] && kv_owner[k] != r) needed[k] = 1;
    std::vector<std::vector<std::pair<std::int64_t, int>>> from(world);  // (begin, index)
    for (const RemoteRange& rr : rp.recv) {
      ASSERT_GE(rr.stage, 1);
      ASSERT_LE(rr.stage, rp.num_stages);
      from[rr.owner].push_back({rr.tokens.begin, rr.index});
      for (std::int64_t t = rr.tokens.begin; t < rr.tokens.end; ++t) {
        ASSERT_EQ(kv_owner[t], rr.owner);
        ASSERT_EQ(got[t], 0) << "token " << t << " received twice by rank " << r;
        got[t] = 1;
      }
    }
    ASSERT_EQ(needed, got) << "rank " << r;
    for (auto& f : from) {
      std::sort(f.begin(), f.end());
      for (std::size_t i = 0; i < f.size(); ++i) ASSERT_EQ(f[i].second, static_cast<int>(i));
    }
  }
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(seen[i], want[i]) << "pair q=" << i / tk << " k=" << i % tk;
  EXPECT_EQ(area, mask.area());
  // Sends: what owner r sends to d is what d receives from r, piece for piece, same numbering.
  for (int r = 0; r < world; ++r) {
    std::int64_t sent = 0;
    for (int dest = 0; dest < world; ++dest) {
      std::vector<std::tuple<std::int64_t, std::int64_t, int>> out, in;
      for (const SendRange& s : plans[r].sends)
        if (s.dest == dest) out.push_back({s.tokens.begin, s.tokens.end, s.index});
      for (const RemoteRange& rr : plans[dest].recv)
        if (rr.owner == r) in.push_back({rr.tokens.begin, rr.tokens.end, rr.index});
      std::sort(in.begin(), in.end());
      ASSERT_EQ(out, in) << "rank " << r << " to rank " << dest;
      for (auto [b, e, i] : out) sent += e - b;
    }
    EXPECT_EQ(sent, plans[r].send_tokens);
  }
  // The one-rank entry gives the same plan as the planner.
  const int some = static_cast<int>(mask.area() % world);
  const Plan one = make_plan(mask, options, some);
  EXPECT_EQ(one.dispatch.chunk_owner, d.chunk_owner);
  ASSERT_EQ(one.rank.recv.size(), plans[some].recv.size());
  for (std::size_t i = 0; i < one.rank.recv.size(); ++i)
    EXPECT_EQ(one.rank.recv[i].tokens, plans[some].recv[i].tokens);
  // The report sums the same figures.
  const PlanReport report = make_plan_report(mask, options);
  std::int64_t bytes = 0;
  for (const RankPlan& rp : plans)
    bytes += rp.recv_tokens * 2 * options.heads_kv * options.head_dim *
             static_cast<std::int64_t>(dtype_size(options.dtype));
  EXPECT_EQ(report.comm_bytes_fwd, bytes);
  EXPECT_EQ(report.comm_bytes_intra + report.comm_bytes_inter, bytes);
}

TEST(Plan, RandomMasksAndWorldSizes) {
  std::mt19937_64 rng(81);
  for (int iter = 0; iter < 500; ++iter) {
    const std::int64_t tq = std::uniform_int_distribution<std::int64_t>(9, 90)(rng);
    const std::int64_t tk =
        iter % 3 == 0 ? std::uniform_int_distribution<std::int64_t>(8, 90)(rng) : tq;
    const Mask mask = test::random_mask(rng, tq, tk);
    PlanOptions o;
    o.world_size = std::uniform_int_distribution<int>(1, 5)(rng);
    // Chunks given three ways: chosen, per rank, or exact sizes (kept to ones that divide).
    switch (iter % 3) {
      case 1:
        o.chunks_per_rank = std::uniform_int_distribution<std::int64_t>(1, tq / o.world_size)(rng);
        break;
      case 2: {
        const std::int64_t per_rank = std::uniform_int_distribution<std::int64_t>(1, 3)(rng);
        o.chunk_size = (tq + per_rank * o.world_size - 1) / (per_rank * o.world_size);
        if ((tq + o.chunk_size - 1) / o.chunk_size % o.world_size != 0) o.chunk_size = 0;
        break;
      }
    }
    o.num_stages = std::uniform_int_distribution<int>(0, 3)(rng);
    o.gpus_per_node = std::uniform_int_distribution<int>(0, 2)(rng);
    o.heads_kv = 2;
    o.head_dim = 4;
    check_plan(mask, o);
  }
}

TEST(Plan, DocumentMasksAtScale) {
  std::mt19937_64 rng(82);
  masks::Lengths docs;
  for (int i = 0; i < 40; ++i)
    docs.push_back(std::uniform_int_distribution<std::int64_t>(1, 120)(rng));
  for (int world : {3, 8}) {
    PlanOptions o;
    o.world_size = world;
    o.chunks_per_rank = 8;
    check_plan(masks::varlen_causal(docs), o);
    check_plan(masks::sliding_window(docs, 17, masks::WindowKind::kSymmetric), o);
    check_plan(masks::block_causal(docs, 24), o);
  }
}

// The kernels' work list (sm90 forward tiles) of a rank's whole local work, as its intervals.
std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, int>> intervals(
    const std::vector<Band>& work, std::int64_t rows, std::int64_t cols) {
  const WorkList w = build_work_list(work, rows, cols, {.tile_rows = 16, .block_cols = 128});
  std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, int>> out;
  for (std::int64_t t = 0; t < w.num_tiles(); ++t)
    for (std::int64_t e = w.tile_offsets[t]; e < w.tile_offsets[t + 1]; ++e)
      out.push_back({t, w.entries[e].begin, w.entries[e].end, static_cast<int>(w.entries[e].mask)});
  return out;
}

// Bands are cut only where their local image breaks: on one rank (its chunks all neighbours, its
// K/V one range) the local work gives the kernels the mask's own work list, interval for interval
// (a cut at every chunk boundary cost the world-size-1 forward 5% on windows: an interval more per
// tile and a masked block where the cut fell inside one).
TEST(Plan, OneRankRunsTheMasksOwnWorkList) {
  std::mt19937_64 rng(83);
  const std::int64_t t = 4096;
  const Mask masks_[] = {
      masks::causal(t, t),
      masks::sliding_window({1000, 2500, 596}, 300, masks::WindowKind::kCausal),
      masks::prefix_lm({3000, 1096}, {700, 96}),
      masks::block_causal({2048, 2048}, 200),
      test::random_mask(rng, t, t),
  };
  for (const Mask& mask : masks_)
    for (std::int64_t per_rank : {0, 8, 24}) {
      PlanOptions o;
      o.chunks_per_rank = per_rank;
      const Plan p = make_plan(mask, o, 0);
      SCOPED_TRACE(std::to_string(p.dispatch.chunks.size()) + " chunks");
      ASSERT_EQ(p.rank.stage_work.size(), 1u);
      EXPECT_EQ(intervals(p.rank.stage_work[0], t, t), intervals(mask_bands(mask), t, t));
    }
}

TEST(Plan, RepeatedRunsGiveTheSamePlan) {
  const Mask mask = masks::sliding_window(masks::pack_lengths({700, 3000, 90, 1500}, 20000, 5000),
                                          512, masks::WindowKind::kCausal);
  PlanOptions o;
  o.world_size = 7;
  for (int r = 0; r < o.world_size; ++r) {
    const Plan a = make_plan(mask, o, r), b = make_plan(mask, o, r);
    EXPECT_EQ(a.dispatch.chunk_owner, b.dispatch.chunk_owner);
    EXPECT_EQ(a.rank.num_stages, b.rank.num_stages);
    EXPECT_EQ(a.rank.area, b.rank.area);
    ASSERT_EQ(a.rank.recv.size(), b.rank.recv.size());
    for (std::size_t i = 0; i < a.rank.recv.size(); ++i) {
      EXPECT_EQ(a.rank.recv[i].tokens, b.rank.recv[i].tokens);
      EXPECT_EQ(a.rank.recv[i].stage, b.rank.recv[i].stage);
    }
    ASSERT_EQ(a.rank.sends.size(), b.rank.sends.size());
  }
}

TEST(Plan, BalancesBetterThanContiguousSplitsAndMovesLessThanRing) {
  const Mask causal = masks::causal(1 << 15, 1 << 15);
  PlanOptions o;
  o.world_size = 8;
  // A contiguous split of a causal mask gives the last rank 15/8 of the mean.
  EXPECT_LT(make_dispatch(causal, o).imbalance, 1.01);
  const Mask docs =
      masks::varlen_causal(masks::pack_lengths({700, 3000, 90, 1500, 6000, 40}, 1 << 16, 1 << 14));
  const PlanReport report = make_plan_report(docs, o);
  EXPECT_LT(report.dispatch.imbalance, 1.02);
  EXPECT_LT(report.comm_bytes_fwd, report.ring.comm_bytes_fwd / 2);
  EXPECT_LE(report.comm_bytes_fwd, report.magi.comm_bytes_fwd);
}

TEST(Plan, ChunkSizeIsExactAndChunksPerRankEqual) {
  const Mask mask = masks::causal(95, 95);
  PlanOptions o;
  o.world_size = 5;
  o.chunk_size = 19;
  Dispatch d = make_dispatch(mask, o);
  ASSERT_EQ(d.chunks.size(), 5u);
  for (const Range& c : d.chunks) EXPECT_EQ(c.size(), 19);
  o.world_size = 2;
  o.chunk_size = 12;  // 8 chunks: seven of 12 tokens and the last of 11
  d = make_dispatch(mask, o);
  ASSERT_EQ(d.chunks.size(), 8u);
  for (std::size_t i = 0; i < 7; ++i) EXPECT_EQ(d.chunks[i].size(), 12);
  EXPECT_EQ(d.chunks.back().size(), 11);
  EXPECT_EQ(d.chunk_size, 12);
  o.chunk_size = 0;
  o.chunks_per_rank = 3;
  d = make_dispatch(mask, o);
  ASSERT_EQ(d.chunks.size(), 6u);
  for (const Range& c : d.chunks) EXPECT_TRUE(c.size() == 15 || c.size() == 16);
  EXPECT_EQ(d.chunks_per_rank, 3);
}

// The chosen count is one of kChunksPerRankChoices (multiples of 4: runs of 4 neighbours always
// apply), never a count like 11 or 13 that switches the runs off; chunks keep kMinChunkTokens where
// the sequence allows; and of the choices it moves the fewest bytes among the balanced ones.
TEST(Plan, TheChosenChunkCountKeepsRunsAndMovesTheFewestBytes) {
  const Mask causal = masks::causal(std::int64_t{1} << 20, std::int64_t{1} << 20);
  for (int world = 2; world <= 1024; world += world < 64 ? 7 : 97) {
    PlanOptions o;
    o.world_size = world;
    const std::int64_t p = make_dispatch(causal, o).chunks_per_rank;
    EXPECT_EQ(p % 4, 0) << world << ": " << p;
    EXPECT_GE(causal.seqlen_q() / (world * p), kMinChunkTokens) << world << ": " << p;
  }
  PlanOptions o;
  o.world_size = 1024;  // 4096 tokens: 4 per rank keep 128-token chunks, 8 would not
  EXPECT_EQ(make_dispatch(masks::causal(4096, 4096), o).chunks_per_rank, 1);
  o.world_size = 8;
  EXPECT_EQ(make_dispatch(masks::causal(4096, 4096), o).chunks_per_rank, 4);
  const Mask docs = masks::varlen_causal(
      masks::pack_lengths({700, 3000, 90, 1500, 6000, 40, 11000}, 1 << 17, 1 << 15));
  for (int world : {3, 11, 13, 40}) {
    o.world_size = world;
    const Planner chosen(docs, o);
    std::int64_t chosen_bytes = 0;
    for (int r = 0; r < world; ++r) chosen_bytes += chosen.recv_tokens(r);
    EXPECT_LE(chosen.dispatch().imbalance, kChosenImbalance) << world;
    for (std::int64_t p : kChunksPerRankChoices) {
      PlanOptions fixed = o;
      fixed.chunks_per_rank = p;
      const Planner other(docs, fixed);
      if (other.dispatch().imbalance > kChosenImbalance ||
          docs.seqlen_q() / (world * p) < kMinChunkTokens)
        continue;
      std::int64_t bytes = 0;
      for (int r = 0; r < world; ++r) bytes += other.recv_tokens(r);
      EXPECT_LE(chosen_bytes, bytes) << world << " ranks, " << p << " chunks per rank";
    }
  }
}

TEST(Plan, BadOptionsAreNamed) {
  const Mask mask = masks::causal(100, 100);
  auto message = [&](PlanOptions o, int rank = 0) {
    try {
      make_plan(mask, o, rank);
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  PlanOptions o;
  o.world_size = 0;
  EXPECT_EQ(message(o), "flexcp::make_plan: world_size is 0, expected >= 1");
  o.world_size = 101;
  EXPECT_EQ(message(o),
            "flexcp::make_plan: world_size 101 is larger than seqlen_q 100: every rank needs at "
            "least one token");
  o.world_size = 2;
  o.chunk_size = 101;
  EXPECT_EQ(message(o),
            "flexcp::make_plan: chunk_size 101 is larger than the sequence (100 tokens)");
  o.world_size = 3;
  o.chunk_size = 25;  // 4 chunks on 3 ranks
  EXPECT_EQ(message(o),
            "flexcp::make_plan: chunk_size 25 cuts 100 tokens into 4 chunks, not a multiple of "
            "world_size 3 (every rank holds as many chunks); chunk_size 34 (3 chunks) or 17 (6 "
            "chunks) would, as would chunks_per_rank instead");
  o.chunk_size = 10;
  o.chunks_per_rank = 2;
  EXPECT_EQ(message(o),
            "flexcp::make_plan: chunk_size 10 and chunks_per_rank 2 are both set, expected one of "
            "them");
  o.chunk_size = 0;
  o.chunks_per_rank = 40;
  EXPECT_EQ(message(o),
            "flexcp::make_plan: chunks_per_rank 40 on 3 ranks is 120 chunks for 100 tokens, "
            "expected at most one chunk per token");
  o.chunks_per_rank = 0;
  EXPECT_EQ(message(o, 3), "flexcp::make_plan: rank 3 is outside [0, 3)");
  o.cost.kernel_tflops = 0;
  EXPECT_EQ(message(o),
            "flexcp::make_plan: cost model rates must be > 0 and the stage overhead >= 0");
}

}  // namespace
}  // namespace flexcp
