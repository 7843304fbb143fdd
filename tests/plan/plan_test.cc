// The plan against brute force: every attended pair computed by exactly one rank in exactly one
// stage, every needed K/V token received exactly once, areas, permutations, determinism, errors.
#include <gtest/gtest.h>

#include <random>

#include "kernels/worklist/worklist.h"
#include "test_util.h"

namespace flexcp {
namespace {

// Global K/V token of each column of rank r's local buffer.
std::vector<std::int64_t> local_columns(const RankPlan& rp) {
  std::vector<std::int64_t> cols;
  for (const Range& r : rp.k_tokens)
    for (std::int64_t t = r.begin; t < r.end; ++t) cols.push_back(t);
  for (const RemoteRange& r : rp.recv)
    for (std::int64_t t = r.tokens.begin; t < r.tokens.end; ++t) cols.push_back(t);
  return cols;
}

void check_plan(const Mask& mask, const PlanOptions& options) {
  SCOPED_TRACE("world " + std::to_string(options.world_size) + " chunk " +
               std::to_string(options.chunk_size) + " tq " + std::to_string(mask.seqlen_q()) +
               " tk " + std::to_string(mask.seqlen_k()));
  const Plan plan = make_plan(mask, options);
  const std::int64_t tq = mask.seqlen_q(), tk = mask.seqlen_k();
  const int world = options.world_size;
  const auto want = test::enumerate_pairs(mask.slices(), tq, tk);
  std::vector<int> seen(want.size(), 0);
  std::int64_t area = 0;
  const std::vector<int> rank_of = plan.global_to_rank_q();
  const std::vector<std::int64_t> local_of = plan.global_to_local_q();
  std::vector<int> kv_owner(tk, -1);
  for (int r = 0; r < world; ++r)
    for (const Range& k : plan.ranks[r].k_tokens)
      for (std::int64_t t = k.begin; t < k.end; ++t) {
        ASSERT_EQ(kv_owner[t], -1) << "K/V token " << t << " held twice";
        kv_owner[t] = r;
      }
  for (std::int64_t t = 0; t < tk; ++t)
    ASSERT_GE(kv_owner[t], 0) << "K/V token " << t << " held by nobody";

  for (int r = 0; r < world; ++r) {
    const RankPlan& rp = plan.ranks[r];
    ASSERT_EQ(rp.chunks.size(), plan.chunks.size() / world);  // same number of chunks everywhere
    const std::vector<std::int64_t> rows = plan.position_ids(r);
    ASSERT_EQ(static_cast<std::int64_t>(rows.size()), rp.num_q_tokens);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      ASSERT_EQ(rank_of[rows[i]], r);
      ASSERT_EQ(local_of[rows[i]], static_cast<std::int64_t>(i));
    }
    const std::vector<std::int64_t> cols = local_columns(rp);
    // Replay the local work of every stage.
    ASSERT_EQ(static_cast<int>(rp.stage_work.size()), plan.num_stages + 1);
    for (std::size_t s = 0; s < rp.stage_work.size(); ++s)
      for (const Band& b : rp.stage_work[s]) {
        for (std::int64_t x = b.row_begin; x < b.row_end; ++x)
          for (std::int64_t y = b.begin(x); y < b.end(x); ++y) {
            ASSERT_LT(x, rp.num_q_tokens);
            ASSERT_LT(y, static_cast<std::int64_t>(cols.size()));
            // Columns of stage s come from stage s's buffers only.
            ++seen[rows[x] * tk + cols[y]];
          }
        area += band_area(b, b.row_begin, b.row_end, b.begin_min, b.end_max);
      }
    // K/V received: exactly the remote tokens this rank's rows attend, each once, from its owner.
    std::vector<char> needed(tk, 0), got(tk, 0);
    for (std::int64_t q : rows)
      for (std::int64_t k = 0; k < tk; ++k)
        if (want[q * tk + k] && kv_owner[k] != r) needed[k] = 1;
    for (const RemoteRange& rr : rp.recv) {
      ASSERT_GE(rr.stage, 1);
      ASSERT_LE(rr.stage, plan.num_stages);
      for (std::int64_t t = rr.tokens.begin; t < rr.tokens.end; ++t) {
        ASSERT_EQ(kv_owner[t], rr.owner);
        ASSERT_EQ(got[t], 0) << "token " << t << " received twice by rank " << r;
        got[t] = 1;
      }
    }
    ASSERT_EQ(needed, got) << "rank " << r;
  }
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(seen[i], want[i]) << "pair q=" << i / tk << " k=" << i % tk;
  EXPECT_EQ(area, mask.area());
  // Group-cast items: each (token, destination) of the receive lists exactly once, from its owner.
  std::vector<std::vector<int>> cast(world, std::vector<int>(tk, 0));
  for (const CastItem& item : plan.casts)
    for (int d : item.dests)
      for (std::int64_t t = item.tokens.begin; t < item.tokens.end; ++t) {
        ASSERT_EQ(kv_owner[t], item.owner);
        ++cast[d][t];
      }
  std::int64_t bytes = 0;
  for (int r = 0; r < world; ++r) {
    std::vector<int> got(tk, 0);
    for (const RemoteRange& rr : plan.ranks[r].recv)
      for (std::int64_t t = rr.tokens.begin; t < rr.tokens.end; ++t) got[t] = 1;
    ASSERT_EQ(cast[r], got);
    bytes +=
        plan.ranks[r].recv_tokens * 2 * options.heads_kv * options.head_dim * options.element_bytes;
  }
  EXPECT_EQ(plan.comm_bytes_fwd, bytes);
  EXPECT_EQ(plan.comm_bytes_intra + plan.comm_bytes_inter, bytes);
  // The local work turns into valid kernel work lists.
  for (const RankPlan& rp : plan.ranks)
    for (const auto& work : rp.stage_work) {
      const WorkList list = build_work_list(work, rp.num_q_tokens, rp.num_k_tokens + rp.recv_tokens,
                                            {WorkListOrder::kRowMajor, 16, 8});
      std::int64_t a = 0;
      for (auto t : list.tile_area) a += t;
      std::int64_t b = 0;
      for (const Band& band : work)
        b += band_area(band, band.row_begin, band.row_end, band.begin_min, band.end_max);
      ASSERT_EQ(a, b);
    }
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
    o.chunk_size = std::uniform_int_distribution<std::int64_t>(0, 9)(rng);  // <= tq
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
    o.chunk_size = 16;
    check_plan(masks::varlen_causal(docs), o);
    check_plan(masks::sliding_window(docs, 17, masks::WindowKind::kSymmetric), o);
    check_plan(masks::block_causal(docs, 24), o);
  }
}

TEST(Plan, RepeatedRunsGiveTheSamePlan) {
  const Mask mask = masks::sliding_window(masks::pack_lengths({700, 3000, 90, 1500}, 20000, 5000),
                                          512, masks::WindowKind::kCausal);
  PlanOptions o;
  o.world_size = 7;
  const Plan a = make_plan(mask, o), b = make_plan(mask, o);
  EXPECT_EQ(a.chunk_owner, b.chunk_owner);
  EXPECT_EQ(a.num_stages, b.num_stages);
  ASSERT_EQ(a.casts.size(), b.casts.size());
  for (int r = 0; r < o.world_size; ++r) {
    EXPECT_EQ(a.ranks[r].area, b.ranks[r].area);
    ASSERT_EQ(a.ranks[r].recv.size(), b.ranks[r].recv.size());
    for (std::size_t i = 0; i < a.ranks[r].recv.size(); ++i) {
      EXPECT_EQ(a.ranks[r].recv[i].tokens, b.ranks[r].recv[i].tokens);
      EXPECT_EQ(a.ranks[r].recv[i].stage, b.ranks[r].recv[i].stage);
    }
  }
}

TEST(Plan, BalancesBetterThanContiguousSplitsAndMovesLessThanRing) {
  const Mask causal = masks::causal(1 << 15, 1 << 15);
  PlanOptions o;
  o.world_size = 8;
  const Plan plan = make_plan(causal, o);
  // A contiguous split of a causal mask gives the last rank 15/8 of the mean.
  EXPECT_LT(plan.imbalance, 1.01);
  const Mask docs =
      masks::varlen_causal(masks::pack_lengths({700, 3000, 90, 1500, 6000, 40}, 1 << 16, 1 << 14));
  const Plan doc_plan = make_plan(docs, o);
  EXPECT_LT(doc_plan.imbalance, 1.02);
  EXPECT_LT(doc_plan.comm_bytes_fwd, doc_plan.ring.comm_bytes_fwd / 2);
}

TEST(Plan, BadOptionsAreNamed) {
  const Mask mask = masks::causal(100, 100);
  auto message = [&](PlanOptions o) {
    try {
      make_plan(mask, o);
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
  o.chunk_size = 0;
  o.cost.kernel_tflops = 0;
  EXPECT_EQ(message(o),
            "flexcp::make_plan: cost model rates must be > 0 and the stage overhead >= 0");
}

}  // namespace
}  // namespace flexcp
