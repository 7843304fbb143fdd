// Masks given row by row (masks::from_row_runs, masks::from_dense) against the pairs they were
// given: exact on random bitmaps and random slice unions, the builders' masks found again in no
// more slices than the builders use, long masks in linear time, and every bad run named.
#include <gtest/gtest.h>

#include <random>

#include "test_util.h"

namespace flexcp {
namespace {

// The mask as a dense byte matrix, from the definition of each slice.
std::vector<std::uint8_t> dense_of(const Mask& m) {
  const auto pairs = test::enumerate_pairs(m.slices(), m.seqlen_q(), m.seqlen_k());
  return {pairs.begin(), pairs.end()};
}

// from_dense(bits) attends exactly the nonzero entries of `bits`.
Mask expect_round_trip(std::int64_t tq, std::int64_t tk, const std::vector<std::uint8_t>& bits) {
  const Mask m = masks::from_dense(tq, tk, bits.data());
  const auto pairs = test::enumerate_pairs(m.slices(), tq, tk);
  std::int64_t area = 0;
  for (std::int64_t i = 0; i < tq * tk; ++i) {
    EXPECT_EQ(pairs[i], bits[i] ? 1 : 0) << "q=" << i / tk << " k=" << i % tk;
    area += bits[i] ? 1 : 0;
  }
  EXPECT_EQ(m.area(), area);
  return m;
}

TEST(FromRuns, RandomBitmapsAtEveryDensity) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const std::int64_t tq = std::uniform_int_distribution<std::int64_t>(0, 17)(rng);
    const std::int64_t tk = std::uniform_int_distribution<std::int64_t>(0, 17)(rng);
    const double density = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    std::bernoulli_distribution bit(density);
    std::vector<std::uint8_t> bits(static_cast<std::size_t>(tq * tk));
    for (auto& b : bits) b = bit(rng) ? static_cast<std::uint8_t>(1 + rng() % 255) : 0;
    SCOPED_TRACE("trial " + std::to_string(trial));
    expect_round_trip(tq, tk, bits);
  }
}

TEST(FromRuns, RandomSliceUnions) {
  std::mt19937_64 rng(6);
  for (int trial = 0; trial < 300; ++trial) {
    const std::int64_t tq = std::uniform_int_distribution<std::int64_t>(1, 40)(rng);
    const std::int64_t tk = std::uniform_int_distribution<std::int64_t>(1, 40)(rng);
    const Mask given = test::random_mask(rng, tq, tk);
    SCOPED_TRACE("trial " + std::to_string(trial));
    expect_round_trip(tq, tk, dense_of(given));
  }
}

// The pass finds the builders' shapes: no more slices than the builder made, and one slice per
// document where one shape covers it.
TEST(FromRuns, BuildersComeBackInNoMoreSlices) {
  const masks::Lengths docs = {7, 1, 13, 4, 30, 2};
  const std::vector<std::pair<const char*, Mask>> cases = {
      {"causal 9x14", masks::causal(9, 14)},
      {"causal 14x9", masks::causal(14, 9)},
      {"varlen causal", masks::varlen_causal(docs)},
      {"varlen full", masks::varlen_full(docs)},
      {"inv_causal documents", masks::varlen(docs, MaskType::kInvCausal)},
      {"bi_causal", Mask(10, 16, {{{0, 10}, {0, 16}, MaskType::kBiCausal}})},
      {"window 3", masks::sliding_window(docs, 3, masks::WindowKind::kCausal)},
      {"symmetric window 4", masks::sliding_window(docs, 4, masks::WindowKind::kSymmetric)},
      {"block causal 5", masks::block_causal(docs, 5)},
      {"prefix lm", masks::prefix_lm(docs, {3, 0, 5, 4, 1, 2})},
      {"shared question", masks::shared_question(6, {5, 1, 8})},
      {"cross documents", masks::from_cu_seqlens({0, 3, 3, 9}, {0, 5, 8, 10}, MaskType::kCausal)},
  };
  for (const auto& [name, built] : cases) {
    SCOPED_TRACE(name);
    const Mask found = expect_round_trip(built.seqlen_q(), built.seqlen_k(), dense_of(built));
    EXPECT_LE(found.slices().size(), built.slices().size());
  }
  // One slice per document, a one-token document included (it chains into the next document's
  // first row, which stays with its own document): the builder's ranges. The one-token slice may
  // be full where the builder says causal; over one pair they are the same.
  const Mask docs_built = masks::varlen_causal({7, 1, 13, 4, 30});
  const Mask docs_found = masks::from_dense(55, 55, dense_of(docs_built).data());
  ASSERT_EQ(docs_found.slices().size(), docs_built.slices().size());
  for (std::size_t i = 0; i < docs_built.slices().size(); ++i) {
    EXPECT_EQ(docs_found.slices()[i].q, docs_built.slices()[i].q) << "slice " << i;
    EXPECT_EQ(docs_found.slices()[i].k, docs_built.slices()[i].k) << "slice " << i;
  }
}

// One run per row, walking by random steps of 0 or 1 (sometimes more): the slice count against
// the plain quadratic search over every way to cut the rows into stretches of equal steps.
TEST(FromRuns, FewestSlicesOnRandomWalks) {
  std::mt19937_64 rng(8);
  for (int trial = 0; trial < 500; ++trial) {
    const std::int64_t tq = std::uniform_int_distribution<std::int64_t>(1, 24)(rng);
    const std::int64_t tk = 64;
    std::vector<masks::RowRun> runs;
    std::int64_t begin = std::uniform_int_distribution<std::int64_t>(0, 5)(rng), end = begin + 1;
    std::uniform_int_distribution<int> step(0, 9);  // 0-1 by far most often, 2 now and then
    for (std::int64_t q = 0; q < tq; ++q) {
      runs.push_back({q, begin, end});
      const int a = step(rng), b = step(rng);
      begin += a < 5 ? 0 : (a < 9 ? 1 : 2);
      end = std::max(begin + 1, end + (b < 5 ? 0 : (b < 9 ? 1 : 2)));
    }
    // fewest[i]: fewest stretches over rows [0, i); a stretch [j, i) needs equal steps inside.
    auto steps_equal = [&](std::size_t j, std::size_t i) {
      for (std::size_t x = j + 2; x < i; ++x)
        if (runs[x].begin - runs[x - 1].begin != runs[j + 1].begin - runs[j].begin ||
            runs[x].end - runs[x - 1].end != runs[j + 1].end - runs[j].end)
          return false;
      return i - j < 2 ||
             (runs[j + 1].begin - runs[j].begin <= 1 && runs[j + 1].end - runs[j].end <= 1);
    };
    std::vector<std::size_t> fewest(tq + 1, 0);
    for (std::size_t i = 1; i <= static_cast<std::size_t>(tq); ++i) {
      fewest[i] = i;
      for (std::size_t j = 0; j < i; ++j)
        if (steps_equal(j, i)) fewest[i] = std::min(fewest[i], fewest[j] + 1);
    }
    const Mask m = masks::from_row_runs(tq, tk, runs);
    EXPECT_EQ(m.slices().size(), fewest[tq]) << "trial " << trial;
  }
}

// A million rows of documents given as runs, never as a matrix: the builder's slices, in time
// linear in the runs.
TEST(FromRuns, AMillionRowsOfDocuments) {
  std::mt19937_64 rng(7);
  masks::Lengths docs;
  std::int64_t total = 0;
  while (total < (1 << 20)) {
    docs.push_back(std::min<std::int64_t>(std::uniform_int_distribution<std::int64_t>(1, 9000)(rng),
                                          (1 << 20) - total));
    total += docs.back();
  }
  std::vector<masks::RowRun> runs;
  std::int64_t start = 0;
  for (std::int64_t n : docs) {
    for (std::int64_t q = start; q < start + n; ++q) runs.push_back({q, start, q + 1});
    start += n;
  }
  const Mask found = masks::from_row_runs(total, total, runs);
  EXPECT_EQ(found.slices(), masks::varlen_causal(docs).slices());
}

TEST(FromRuns, TouchingRunsAreJoinedAndGapsBetweenRowsClose) {
  // Row 0 in two touching pieces, row 1 absent, rows 2-3 a causal pair.
  const Mask m = masks::from_row_runs(4, 6, {{0, 0, 2}, {0, 2, 5}, {2, 1, 3}, {3, 1, 4}});
  EXPECT_EQ(m.slices(), (std::vector<Slice>{{{0, 1}, {0, 5}, MaskType::kFull},
                                            {{2, 4}, {1, 4}, MaskType::kCausal}}));
  EXPECT_EQ(masks::from_row_runs(0, 0, {}).slices().size(), 0u);
}

void expect_error(const std::vector<masks::RowRun>& runs, const std::string& part) {
  try {
    masks::from_row_runs(4, 6, runs);
    ADD_FAILURE() << "no error; expected one containing: " << part;
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(FromRuns, EveryBadRunIsNamed) {
  expect_error({{0, 0, 2}, {4, 0, 1}},
               "run 1 (row 4, keys [0, 1)): the row is outside [0, 4) (seqlen_q)");
  expect_error({{-1, 0, 2}}, "run 0 (row -1, keys [0, 2)): the row is outside");
  expect_error({{1, 0, 2}, {0, 0, 1}}, "run 1 (row 0, keys [0, 1)) comes after row 1");
  expect_error({{1, 3, 3}}, "run 0 (row 1, keys [3, 3)): expected 0 <= begin < end <= 6");
  expect_error({{1, -2, 3}}, "expected 0 <= begin < end <= 6 (seqlen_k)");
  expect_error({{1, 2, 7}}, "expected 0 <= begin < end <= 6 (seqlen_k)");
  expect_error({{2, 0, 4}, {2, 3, 5}},
               "run 1 (row 2, keys [3, 5)) begins before the row's previous keys end (at 4)");
  expect_error({{2, 3, 5}, {2, 0, 1}}, "must be sorted by key and must not overlap");
  for (const std::int64_t bad : {std::int64_t{-1}, kMaxSeqlen + 1}) {
    EXPECT_THROW(masks::from_row_runs(bad, 4, {}), Error);
    EXPECT_THROW(masks::from_row_runs(4, bad, {}), Error);
    EXPECT_THROW(masks::from_dense(bad, 4, nullptr), Error);
  }
  EXPECT_THROW(masks::from_dense(2, 2, nullptr), Error);
  EXPECT_EQ(masks::from_dense(0, 5, nullptr).area(), 0);
}

}  // namespace
}  // namespace flexcp
