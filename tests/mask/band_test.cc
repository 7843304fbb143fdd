#include <gtest/gtest.h>

#include <random>

#include "flexcp/band.h"
#include "test_util.h"

namespace flexcp {
namespace {

Slice random_slice(std::mt19937_64& rng, std::int64_t n) {
  std::uniform_int_distribution<std::int64_t> pos(0, n);
  std::int64_t a = pos(rng), b = pos(rng), c = pos(rng), d = pos(rng);
  if (a > b) std::swap(a, b);
  if (c > d) std::swap(c, d);
  return {{a, b}, {c, d}, static_cast<MaskType>(std::uniform_int_distribution<int>(0, 3)(rng))};
}

constexpr std::int64_t kN = 24;  // every cell of a kN x kN grid is enumerated

TEST(Band, SliceBandMatchesDefinitionForEveryShape) {
  // Every slice of every type with ranges inside a small grid: sq > sk, sq < sk, empty, length 1.
  for (int type = 0; type < 4; ++type)
    for (std::int64_t qb = 0; qb <= 6; ++qb)
      for (std::int64_t qe = qb; qe <= 7; ++qe)
        for (std::int64_t kb = 0; kb <= 6; ++kb)
          for (std::int64_t ke = kb; ke <= 7; ++ke) {
            const Slice s{{qb, qe}, {kb, ke}, static_cast<MaskType>(type)};
            const Band b = slice_band(s);
            const Band t = trim_band(b);
            std::int64_t count = 0;
            for (std::int64_t q = 0; q < 8; ++q)
              for (std::int64_t k = 0; k < 8; ++k) {
                const bool want = slice_attends(s, q, k);
                count += want;
                ASSERT_EQ(b.contains(q, k), want)
                    << mask_type_name(s.type) << " q" << qb << "-" << qe << " k" << kb << "-" << ke;
                ASSERT_EQ(t.contains(q, k), want);
              }
            ASSERT_EQ(slice_area(s), count);
            if (count > 0) {
              ASSERT_LT(t.begin(t.row_begin), t.end(t.row_begin));
              ASSERT_LT(t.begin(t.row_end - 1), t.end(t.row_end - 1));
            } else {
              ASSERT_EQ(t.row_begin, t.row_end);
            }
          }
}

TEST(Band, AreaOfRandomRectanglesMatchesEnumeration) {
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<std::int64_t> pos(0, kN);
  for (int iter = 0; iter < 3000; ++iter) {
    const Slice s = random_slice(rng, kN);
    std::int64_t q0 = pos(rng), q1 = pos(rng), k0 = pos(rng), k1 = pos(rng);
    if (q0 > q1) std::swap(q0, q1);
    if (k0 > k1) std::swap(k0, k1);
    std::int64_t want = 0;
    for (std::int64_t q = q0; q < q1; ++q)
      for (std::int64_t k = k0; k < k1; ++k) want += slice_attends(s, q, k);
    ASSERT_EQ(band_area(slice_band(s), q0, q1, k0, k1), want);
    const Mask m(kN, kN, {s});
    ASSERT_EQ(m.area({q0, q1}, {k0, k1}), want);
  }
}

TEST(Band, TransposeAndIntersectKeepTheCells) {
  std::mt19937_64 rng(2);
  for (int iter = 0; iter < 2000; ++iter) {
    const Slice a = random_slice(rng, kN), b = random_slice(rng, kN);
    const Band ba = trim_band(slice_band(a)), bb = trim_band(slice_band(b));
    const Band t = transpose_band(ba);
    const Band both = intersect_bands(ba, bb);
    const Band tt = transpose_band(t);
    std::int64_t t_area = 0;
    for (std::int64_t q = 0; q < kN; ++q)
      for (std::int64_t k = 0; k < kN; ++k) {
        ASSERT_EQ(t.contains(k, q), slice_attends(a, q, k));
        ASSERT_EQ(tt.contains(q, k), slice_attends(a, q, k));
        ASSERT_EQ(both.contains(q, k), slice_attends(a, q, k) && slice_attends(b, q, k));
        t_area += t.contains(k, q);
      }
    ASSERT_EQ(band_area(t, 0, kN, 0, kN), t_area);
  }
}

TEST(Band, TileSpanMatchesBruteForce) {
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<std::int64_t> pos(0, kN);
  for (int iter = 0; iter < 3000; ++iter) {
    const Slice s = random_slice(rng, kN);
    const bool transposed = iter % 2;
    Band b = trim_band(slice_band(s));
    if (transposed) b = transpose_band(b);
    std::int64_t r0 = pos(rng), r1 = pos(rng);
    if (r0 > r1) std::swap(r0, r1);
    const TileSpan span = band_tile_span(b, r0, r1);
    std::int64_t lo = kN, hi = 0, rows_lo = kN, rows_hi = -1;
    for (std::int64_t x = r0; x < r1; ++x)
      for (std::int64_t y = 0; y < kN; ++y)
        if (b.contains(x, y))
          lo = std::min(lo, y), hi = std::max(hi, y + 1), rows_lo = std::min(rows_lo, x),
          rows_hi = std::max(rows_hi, x);
    if (rows_hi < 0) {
      ASSERT_EQ(span.rows_begin, span.rows_end);
      continue;
    }
    ASSERT_EQ(span.rows_begin, rows_lo);
    ASSERT_EQ(span.rows_end, rows_hi + 1);
    ASSERT_EQ(span.span_begin, lo);
    ASSERT_EQ(span.span_end, hi);
    for (std::int64_t y = 0; y < kN; ++y) {
      bool all = true;
      for (std::int64_t x = rows_lo; x <= rows_hi; ++x) all = all && b.contains(x, y);
      ASSERT_EQ(all, y >= span.inner_begin && y < span.inner_end) << "column " << y;
    }
  }
}

}  // namespace
}  // namespace flexcp
