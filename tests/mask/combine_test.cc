// masks::unite and masks::intersect against the pair-by-pair definition, on random masks and
// on the combinations users write.
#include <gtest/gtest.h>

#include <random>

#include "test_util.h"

namespace flexcp {
namespace {

void expect_combined(const std::vector<Mask>& parts, bool any) {
  const std::int64_t tq = parts[0].seqlen_q(), tk = parts[0].seqlen_k();
  const Mask m = any ? masks::unite(parts) : masks::intersect(parts);
  const auto pairs = test::enumerate_pairs(m.slices(), tq, tk);
  for (std::int64_t q = 0; q < tq; ++q)
    for (std::int64_t k = 0; k < tk; ++k) {
      bool want = !any;
      for (const Mask& p : parts)
        want = any ? (want || p.attends(q, k)) : (want && p.attends(q, k));
      ASSERT_EQ(pairs[q * tk + k], want ? 1 : 0) << "q=" << q << " k=" << k;
    }
}

TEST(Combine, RandomMasksPairByPair) {
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 200; ++trial) {
    const std::int64_t tq = std::uniform_int_distribution<std::int64_t>(0, 30)(rng);
    const std::int64_t tk = std::uniform_int_distribution<std::int64_t>(0, 30)(rng);
    std::vector<Mask> parts;
    for (int i = std::uniform_int_distribution<int>(1, 3)(rng); i > 0; --i)
      parts.push_back(test::random_mask(rng, tq, tk));
    SCOPED_TRACE("trial " + std::to_string(trial));
    expect_combined(parts, true);
    expect_combined(parts, false);
  }
}

TEST(Combine, TheCombinationsUsersWrite) {
  // Causal text with a bidirectional image block inside: one causal slice, and the block's part
  // above the diagonal added.
  const Mask image(100, 100, {{{40, 70}, {40, 70}, MaskType::kFull}});
  const Mask text_and_image = masks::unite({masks::causal(100, 100), image});
  expect_combined({masks::causal(100, 100), image}, true);
  EXPECT_EQ(text_and_image.area(), masks::causal(100, 100).area() + 29 * 30 / 2);
  // A window inside documents equals the window builder.
  const masks::Lengths docs = {30, 1, 45, 24};
  const Mask window = masks::intersect(
      {masks::varlen_causal(docs), masks::sliding_window({100}, 8, masks::WindowKind::kCausal)});
  EXPECT_EQ(test::enumerate_pairs(window.slices(), 100, 100),
            test::enumerate_pairs(
                masks::sliding_window(docs, 8, masks::WindowKind::kCausal).slices(), 100, 100));
  EXPECT_LE(window.slices().size(),
            masks::sliding_window(docs, 8, masks::WindowKind::kCausal).slices().size());
  // One mask: itself (without one-token documents, whose 1 x 1 slice may come back full).
  EXPECT_EQ(masks::unite({masks::varlen_causal({30, 45, 25})}).slices(),
            masks::varlen_causal({30, 45, 25}).slices());
}

// row_runs: sorted, maximal, and exactly the mask's pairs; from_row_runs reads them back.
TEST(Combine, RowRunsAreTheMasksRows) {
  std::mt19937_64 rng(32);
  for (int trial = 0; trial < 200; ++trial) {
    const std::int64_t tq = std::uniform_int_distribution<std::int64_t>(0, 30)(rng);
    const std::int64_t tk = std::uniform_int_distribution<std::int64_t>(0, 30)(rng);
    const Mask m = test::random_mask(rng, tq, tk);
    const auto runs = masks::row_runs(m);
    std::vector<char> pairs(static_cast<std::size_t>(tq * tk), 0);
    for (std::size_t i = 0; i < runs.size(); ++i) {
      ASSERT_LT(runs[i].begin, runs[i].end);
      if (i > 0 && runs[i].row == runs[i - 1].row)
        ASSERT_GT(runs[i].begin, runs[i - 1].end) << "not sorted, or touching";
      if (i > 0) ASSERT_GE(runs[i].row, runs[i - 1].row);
      for (std::int64_t k = runs[i].begin; k < runs[i].end; ++k) pairs[runs[i].row * tk + k] = 1;
    }
    ASSERT_EQ(pairs, test::enumerate_pairs(m.slices(), tq, tk)) << "trial " << trial;
    EXPECT_EQ(masks::from_row_runs(tq, tk, runs).area(), m.area());
  }
}

TEST(Combine, LengthsMustAgree) {
  try {
    masks::unite({masks::causal(4, 4), masks::causal(4, 5)});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "unite: masks[1] is 4 x 5 and masks[0] 4 x 4, expected the same lengths"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(masks::intersect({}), Error);
}

}  // namespace
}  // namespace flexcp
