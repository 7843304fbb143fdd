#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "kernels/worklist/worklist.h"
#include "test_util.h"

namespace flexcp {
namespace {

WorkList list_of(const Mask& mask, const WorkListOptions& options) {
  return build_work_list(mask_bands(mask), mask.seqlen_q(), mask.seqlen_k(), options);
}

std::vector<int> replay(const WorkList& list, const Mask& mask, bool row_major,
                        std::int64_t block) {
  bool outside = false;
  std::vector<int> seen = test::replay_work_list(list, mask, row_major, block, &outside);
  // Outside kElements the rule tests no column: every one it keeps must be attended.
  EXPECT_FALSE(outside) << "the work list computes a pair its band does not attend";
  return seen;
}

// The rule against the band's own definition, cell by cell, on random bands and blocks.
TEST(WorkList, InTileRuleMatchesTheBand) {
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<std::int64_t> pos(0, 300);
  for (int iter = 0; iter < 3000; ++iter) {
    std::int64_t a = pos(rng), b = pos(rng), c = pos(rng), d = pos(rng);
    if (a > b) std::swap(a, b);
    if (c > d) std::swap(c, d);
    Band band = trim_band(slice_band({{a, b}, {c, d}, static_cast<MaskType>(iter % 4)}));
    if (iter % 3 == 0) band = transpose_band(band);
    const std::int64_t c0 = pos(rng), width = 1 + pos(rng) % 80, end = c0 + 1 + pos(rng) % 200;
    for (std::int64_t x = band.row_begin - 2; x < band.row_end + 2; ++x) {
      const BlockColumns got = attended_columns(band, EntryMask::kElements, x, c0, end, width);
      ASSERT_LE(0, got.lo);
      ASSERT_LE(got.lo, got.hi);
      ASSERT_LE(got.hi, std::min(width, end - c0));
      for (std::int64_t y = c0; y < c0 + std::min(width, end - c0); ++y)
        ASSERT_EQ(band.contains(x, y), y >= c0 + got.lo && y < c0 + got.hi)
            << "row " << x << " column " << y << " block " << c0;
      const BlockColumns rows = attended_columns(band, EntryMask::kRows, x, c0, end, width);
      const bool in = x >= band.row_begin && x < band.row_end;
      ASSERT_EQ(rows.lo, 0);
      ASSERT_EQ(rows.hi, in ? std::min(width, end - c0) : 0);
      const BlockColumns none = attended_columns(band, EntryMask::kNone, x, c0, end, width);
      ASSERT_EQ(none.hi - none.lo, std::min(width, end - c0));
    }
  }
}

TEST(WorkList, EveryAttendedPairIsComputedExactlyOnce) {
  std::mt19937_64 rng(41);
  for (int iter = 0; iter < 300; ++iter) {
    const std::int64_t tq = std::uniform_int_distribution<std::int64_t>(0, 70)(rng);
    const std::int64_t tk = std::uniform_int_distribution<std::int64_t>(0, 70)(rng);
    const Mask mask = test::random_mask(rng, tq, tk);
    const auto pairs = test::enumerate_pairs(mask.slices(), tq, tk);
    for (bool row_major : {true, false}) {
      const WorkListOptions opt{row_major ? WorkListOrder::kRowMajor : WorkListOrder::kColumnMajor,
                                std::uniform_int_distribution<std::int64_t>(1, 17)(rng),
                                std::uniform_int_distribution<std::int64_t>(1, 9)(rng)};
      const WorkList list = list_of(mask, opt);
      const auto seen = replay(list, mask, row_major, opt.block_cols);
      for (std::size_t i = 0; i < pairs.size(); ++i) ASSERT_EQ(seen[i], pairs[i]) << "pair " << i;
      std::int64_t area = 0;
      for (auto a : list.tile_area) area += a;
      ASSERT_EQ(area, mask.area());
      // Every tile once, busiest first.
      std::vector<std::int32_t> order = list.tile_order;
      ASSERT_TRUE(std::is_sorted(order.begin(), order.end(), [&](auto a, auto b) {
        return list.tile_area[a] > list.tile_area[b];
      }));
      std::sort(order.begin(), order.end());
      for (std::int64_t t = 0; t < list.num_tiles(); ++t) ASSERT_EQ(order[t], t);
      // Unmasked intervals are whole blocks.
      for (const WorkEntry& w : list.entries)
        if (w.mask != EntryMask::kElements) {
          ASSERT_EQ((w.end - w.begin) % opt.block_cols, 0);
        }
    }
  }
}

TEST(WorkList, FullTilesOfDocumentMasksNeedNoMasking) {
  // Documents aligned to tiles: every interval but the causal diagonal blocks is unmasked.
  const Mask mask = masks::varlen_causal({256, 512, 128});
  const WorkList list = list_of(mask, {WorkListOrder::kRowMajor, 64, 64});
  std::int64_t masked_cells = 0;
  for (std::int64_t t = 0; t < list.num_tiles(); ++t)
    for (std::int64_t e = list.tile_offsets[t]; e < list.tile_offsets[t + 1]; ++e)
      if (list.entries[e].mask != EntryMask::kNone)
        masked_cells += (list.entries[e].end - list.entries[e].begin) * list.tile_rows;
  EXPECT_EQ(masked_cells, list.num_tiles() * 64 * 64);  // one diagonal block per tile
}

// The backward's view of a causal mask (key tiles of 128, q blocks of 64): a tile's keys attend
// q from their own row on, so every key of tile j attends q >= 128 j + 127. Its blocks start on
// multiples of 64: the diagonal's two masked blocks [128 j, 128 j + 128), then whole unmasked
// blocks to the end, no one-column block after them (the layout from the first attended column,
// [128 j, 128 j + 127) then [128 j + 127, T - 1) then [T - 1, T), took one block more a tile and
// started every unmasked block one column off).
TEST(WorkList, CausalKeyTilesStartTheirBlocksOnBlockBoundaries) {
  const std::int64_t t = 1024, tile = 128, block = 64;
  const WorkList list = list_of(masks::causal(t, t), {WorkListOrder::kColumnMajor, tile, block});
  for (std::int64_t j = 0; j < list.num_tiles(); ++j) {
    std::int64_t blocks = 0;
    for (std::int64_t e = list.tile_offsets[j]; e < list.tile_offsets[j + 1]; ++e) {
      const WorkEntry& w = list.entries[e];
      ASSERT_EQ(w.begin % block, 0) << "tile " << j << " entry " << e;
      blocks += (w.end - w.begin + block - 1) / block;
    }
    EXPECT_EQ(blocks, (t - tile * j) / block) << "tile " << j;
  }
}

// Where the first whole block of attended columns does not start on a multiple of the block, the
// unmasked run starts at the next multiple only if that costs no block and no masked block (random
// masks, tiles and blocks: never more of either than the layout from the first attended column).
TEST(WorkList, AlignedRunsNeverCostBlocks) {
  std::mt19937_64 rng(52);
  for (int iter = 0; iter < 300; ++iter) {
    const std::int64_t tq = std::uniform_int_distribution<std::int64_t>(1, 300)(rng);
    const std::int64_t tk = std::uniform_int_distribution<std::int64_t>(1, 300)(rng);
    const Mask mask = test::random_mask(rng, tq, tk);
    const std::int64_t tile = std::uniform_int_distribution<std::int64_t>(1, 40)(rng);
    const std::int64_t block = std::uniform_int_distribution<std::int64_t>(1, 20)(rng);
    const WorkList list = list_of(mask, {WorkListOrder::kColumnMajor, tile, block});
    const auto blocks = [block](std::int64_t b, std::int64_t e) {
      return e > b ? (e - b + block - 1) / block : 0;
    };
    for (std::int64_t j = 0; j < list.num_tiles(); ++j) {
      const std::int64_t row0 = j * tile, row1 = std::min(row0 + tile, list.num_rows);
      // Blocks and masked blocks of the tile as listed, against the layout from the first
      // attended column of each band (unmasked run [inner_begin, + whole blocks)).
      std::int64_t listed = 0, listed_masked = 0, first = 0, first_masked = 0;
      for (std::int64_t e = list.tile_offsets[j]; e < list.tile_offsets[j + 1]; ++e) {
        const WorkEntry& w = list.entries[e];
        listed += blocks(w.begin, w.end);
        if (w.mask == EntryMask::kElements) listed_masked += blocks(w.begin, w.end);
      }
      for (const Band& b : list.bands) {
        const TileSpan s = band_tile_span(b, row0, row1);
        if (s.rows_begin >= s.rows_end || s.span_begin >= s.span_end) continue;
        const std::int64_t run = (s.inner_end - s.inner_begin) / block * block;
        const std::int64_t masked = run == 0 ? blocks(s.span_begin, s.span_end)
                                             : blocks(s.span_begin, s.inner_begin) +
                                                   blocks(s.inner_begin + run, s.span_end);
        first += masked + run / block;
        first_masked += masked;
      }
      ASSERT_LE(listed, first) << "tile " << j;
      if (listed == first) {
        ASSERT_LE(listed_masked, first_masked) << "tile " << j;
      }
    }
  }
}

TEST(WorkList, RejectsNonPositiveSizes) {
  EXPECT_THROW(list_of(masks::causal(8, 8), {WorkListOrder::kRowMajor, 0, 64}), Error);
  EXPECT_THROW(list_of(masks::causal(8, 8), {WorkListOrder::kRowMajor, 64, 0}), Error);
}

}  // namespace
}  // namespace flexcp
