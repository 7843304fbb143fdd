// The work-list geometry on the GPU must agree with the host bit for bit (the Hopper kernels call
// the same band_tile_span). Skips, saying why, where no GPU is present.
#include <gtest/gtest.h>

#include <random>

#include "flexcp/band.h"
#include "kernels/cuda/device.h"

namespace flexcp {
namespace {

TEST(CudaDevice, TileSpansAgreeWithHost) {
  std::string why;
  if (cuda::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device here (" << why << ")";
  std::mt19937_64 rng(61);
  std::uniform_int_distribution<std::int64_t> pos(0, 5000);
  std::vector<Band> bands;
  std::vector<std::int64_t> rows;
  for (int i = 0; i < 20000; ++i) {
    std::int64_t a = pos(rng), b = pos(rng), c = pos(rng), d = pos(rng);
    if (a > b) std::swap(a, b);
    if (c > d) std::swap(c, d);
    Band band = trim_band(slice_band({{a, b}, {c, d}, static_cast<MaskType>(i % 4)}));
    if (i % 3 == 0) band = transpose_band(band);
    const std::int64_t r0 = pos(rng);
    bands.push_back(band);
    rows.push_back(r0);
    rows.push_back(r0 + 1 + pos(rng) % 256);
  }
  const std::vector<TileSpan> dev = cuda::tile_spans_on_device(bands, rows);
  for (std::size_t i = 0; i < bands.size(); ++i) {
    const TileSpan h = band_tile_span(bands[i], rows[2 * i], rows[2 * i + 1]);
    ASSERT_EQ(h.rows_begin, dev[i].rows_begin) << i;
    ASSERT_EQ(h.rows_end, dev[i].rows_end) << i;
    ASSERT_EQ(h.span_begin, dev[i].span_begin) << i;
    ASSERT_EQ(h.span_end, dev[i].span_end) << i;
    ASSERT_EQ(h.inner_begin, dev[i].inner_begin) << i;
    ASSERT_EQ(h.inner_end, dev[i].inner_end) << i;
  }
}

TEST(CudaDevice, InTileMaskRuleAgreesWithHost) {
  std::string why;
  if (cuda::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device here (" << why << ")";
  std::mt19937_64 rng(62);
  std::uniform_int_distribution<std::int64_t> pos(0, 5000);
  std::vector<cuda::ColumnQuery> queries;
  for (int i = 0; i < 20000; ++i) {
    std::int64_t a = pos(rng), b = pos(rng), c = pos(rng), d = pos(rng);
    if (a > b) std::swap(a, b);
    if (c > d) std::swap(c, d);
    cuda::ColumnQuery q;
    q.band = trim_band(slice_band({{a, b}, {c, d}, static_cast<MaskType>(i % 4)}));
    if (i % 3 == 0) q.band = transpose_band(q.band);
    q.mask = static_cast<EntryMask>(i % 3);
    q.row = a + pos(rng) % 300 - 20;
    q.c0 = pos(rng);
    q.end = q.c0 + 1 + pos(rng) % 400;
    q.width = i % 2 ? 128 : 64;
    queries.push_back(q);
  }
  const std::vector<BlockColumns> dev = cuda::attended_columns_on_device(queries);
  for (std::size_t i = 0; i < queries.size(); ++i) {
    const cuda::ColumnQuery& q = queries[i];
    const BlockColumns h = attended_columns(q.band, q.mask, q.row, q.c0, q.end, q.width);
    ASSERT_EQ(h.lo, dev[i].lo) << i;
    ASSERT_EQ(h.hi, dev[i].hi) << i;
  }
}

}  // namespace
}  // namespace flexcp
