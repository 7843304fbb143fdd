#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "test_util.h"

namespace flexcp {
namespace {

using ::testing::HasSubstr;

std::string error_of(std::int64_t tq, std::int64_t tk, const std::vector<Slice>& slices) {
  try {
    Mask m(tq, tk, slices);
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(Mask, ValidationFindsExactlyTheOverlappingSets) {
  // Random slices, overlapping or not: validation must agree with brute-force enumeration, and
  // when it rejects, the pair it names must be covered by both slices it names.
  std::mt19937_64 rng(11);
  int rejected = 0, accepted = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    const std::int64_t tq = std::uniform_int_distribution<std::int64_t>(1, 20)(rng);
    const std::int64_t tk = std::uniform_int_distribution<std::int64_t>(1, 20)(rng);
    std::vector<Slice> slices;
    const int n = std::uniform_int_distribution<int>(1, 5)(rng);
    for (int i = 0; i < n; ++i) {
      std::int64_t a = std::uniform_int_distribution<std::int64_t>(0, tq)(rng);
      std::int64_t b = std::uniform_int_distribution<std::int64_t>(0, tq)(rng);
      std::int64_t c = std::uniform_int_distribution<std::int64_t>(0, tk)(rng);
      std::int64_t d = std::uniform_int_distribution<std::int64_t>(0, tk)(rng);
      if (a > b) std::swap(a, b);
      if (c > d) std::swap(c, d);
      slices.push_back(
          {{a, b}, {c, d}, static_cast<MaskType>(std::uniform_int_distribution<int>(0, 3)(rng))});
    }
    const auto pairs = test::enumerate_pairs(slices, tq, tk);
    const bool overlap = std::any_of(pairs.begin(), pairs.end(), [](char c) { return c > 1; });
    const std::string err = error_of(tq, tk, slices);
    ASSERT_EQ(!err.empty(), overlap) << err;
    if (!overlap) {
      ++accepted;
      continue;
    }
    ++rejected;
    std::size_t i = 0, j = 0;
    long long q = 0, k = 0;
    ASSERT_EQ(std::sscanf(err.c_str(), "slices %zu and %zu both cover the pair (q=%lld, k=%lld)",
                          &i, &j, &q, &k),
              4)
        << err;
    ASSERT_LT(i, j);
    ASSERT_TRUE(slice_attends(slices[i], q, k)) << err;
    ASSERT_TRUE(slice_attends(slices[j], q, k)) << err;
  }
  EXPECT_GT(rejected, 500);
  EXPECT_GT(accepted, 500);
}

TEST(Mask, DisjointCellsWithOverlappingBoxesAreAccepted) {
  // Causal and the strict upper band of one square share a bounding box but no pair.
  const Mask m(8, 8, {{{0, 8}, {0, 8}, MaskType::kCausal}, {{0, 7}, {1, 8}, MaskType::kInvCausal}});
  EXPECT_EQ(m.area(), 64);
  EXPECT_THAT(
      error_of(8, 8, {{{0, 8}, {0, 8}, MaskType::kCausal}, {{0, 8}, {0, 8}, MaskType::kInvCausal}}),
      HasSubstr("slices 0 and 1 both cover the pair (q=0, k=0)"));
}

TEST(Mask, RangeErrorsNameSliceAndBound) {
  EXPECT_EQ(
      error_of(1024, 1024,
               {{{0, 10}, {0, 10}, MaskType::kFull}, {{0, 10}, {900, 1200}, MaskType::kFull}}),
      "slice 1: k_range [900, 1200) ends past seqlen_k 1024");
  EXPECT_EQ(error_of(16, 16, {{{-1, 3}, {0, 4}, MaskType::kFull}}),
            "slice 0: q_range [-1, 3) starts before 0");
  EXPECT_EQ(error_of(16, 16, {{{5, 3}, {0, 4}, MaskType::kFull}}),
            "slice 0: q_range [5, 3) ends before it begins");
  EXPECT_EQ(error_of(-2, 16, {}),
            "seqlen_q is -2, expected 0 to 2147483648 (kMaxSeqlen, 2^31 tokens)");
  EXPECT_EQ(error_of(16, kMaxSeqlen + 1, {}),
            "seqlen_k is 2147483649, expected 0 to 2147483648 (kMaxSeqlen, 2^31 tokens)");
  // At the limit a full mask's area, 2^62, is exact.
  EXPECT_EQ(masks::full(kMaxSeqlen, kMaxSeqlen).area(), std::int64_t{1} << 62);
}

TEST(Mask, AreaAndAttendsMatchEnumerationOnRandomMasks) {
  std::mt19937_64 rng(12);
  for (int iter = 0; iter < 300; ++iter) {
    const std::int64_t tq = std::uniform_int_distribution<std::int64_t>(0, 40)(rng);
    const std::int64_t tk = std::uniform_int_distribution<std::int64_t>(0, 40)(rng);
    const Mask m = test::random_mask(rng, tq, tk);
    const auto pairs = test::enumerate_pairs(m.slices(), tq, tk);
    std::int64_t total = 0;
    for (std::int64_t q = 0; q < tq; ++q)
      for (std::int64_t k = 0; k < tk; ++k) {
        total += pairs[q * tk + k];
        ASSERT_EQ(m.attends(q, k), pairs[q * tk + k] == 1);
      }
    ASSERT_EQ(m.area(), total);
    for (int r = 0; r < 20; ++r) {
      std::int64_t q0 = std::uniform_int_distribution<std::int64_t>(0, tq)(rng),
                   q1 = std::uniform_int_distribution<std::int64_t>(0, tq)(rng);
      std::int64_t k0 = std::uniform_int_distribution<std::int64_t>(0, tk)(rng),
                   k1 = std::uniform_int_distribution<std::int64_t>(0, tk)(rng);
      if (q0 > q1) std::swap(q0, q1);
      if (k0 > k1) std::swap(k0, k1);
      std::int64_t want = 0;
      for (std::int64_t q = q0; q < q1; ++q)
        for (std::int64_t k = k0; k < k1; ++k) want += pairs[q * tk + k];
      ASSERT_EQ(m.area({q0, q1}, {k0, k1}), want);
    }
  }
}

TEST(Mask, ValidatesManySlicesAndCatchesOneOverlapAmongThem) {
  // 200k document slices: validation is O(n log n), so this is quick; one shifted slice at the
  // end overlaps its neighbour and must be named.
  std::vector<Slice> slices;
  const std::int64_t n = 200000, len = 8;
  for (std::int64_t d = 0; d < n; ++d)
    slices.push_back({{d * len, (d + 1) * len}, {d * len, (d + 1) * len}, MaskType::kCausal});
  EXPECT_EQ(Mask(n * len, n * len, slices).area(), n * len * (len + 1) / 2);
  slices.push_back({{len * 77, len * 77 + 1}, {len * 77, len * 77 + 1}, MaskType::kFull});
  EXPECT_THAT(error_of(n * len, n * len, slices),
              HasSubstr("slices 77 and 200000 both cover the pair (q=616, k=616)"));
}

TEST(Mask, TypeNamesRoundTrip) {
  for (MaskType t : {MaskType::kFull, MaskType::kCausal, MaskType::kInvCausal, MaskType::kBiCausal})
    EXPECT_EQ(parse_mask_type(mask_type_name(t)), t);
  EXPECT_THROW(parse_mask_type("diagonal"), Error);
}

}  // namespace
}  // namespace flexcp
