#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "kernels/worklist/worklist.h"
#include "test_util.h"

namespace flexcp {
namespace {

// Replays a work list the way a kernel does and counts how often each (q, k) pair is computed.
std::vector<int> replay(const WorkList& list, const Mask& mask, bool row_major) {
  const std::int64_t tk = mask.seqlen_k();
  std::vector<int> seen(static_cast<std::size_t>(mask.seqlen_q() * tk), 0);
  for (std::int64_t t = 0; t < list.num_tiles(); ++t) {
    const std::int64_t r0 = t * list.tile_rows, r1 = std::min(r0 + list.tile_rows, list.num_rows);
    for (std::int64_t e = list.tile_offsets[t]; e < list.tile_offsets[t + 1]; ++e) {
      const WorkEntry& w = list.entries[e];
      const Band& b = list.bands[w.band];
      for (std::int64_t x = r0; x < r1; ++x)
        for (std::int64_t y = w.begin; y < w.end; ++y) {
          bool on = true;
          if (w.mask == EntryMask::kRows) on = x >= b.row_begin && x < b.row_end;
          if (w.mask == EntryMask::kElements) on = b.contains(x, y);
          // An unmasked cell must really be attended: kernels skip the test there.
          if (w.mask != EntryMask::kElements && on) {
            EXPECT_TRUE(b.contains(x, y)) << x << "," << y;
          }
          if (on) ++seen[row_major ? x * tk + y : y * tk + x];
        }
    }
  }
  return seen;
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
      const WorkList list = build_work_list(mask, opt);
      const auto seen = replay(list, mask, row_major);
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
  const WorkList list = build_work_list(mask, {WorkListOrder::kRowMajor, 64, 64});
  std::int64_t masked_cells = 0;
  for (std::int64_t t = 0; t < list.num_tiles(); ++t)
    for (std::int64_t e = list.tile_offsets[t]; e < list.tile_offsets[t + 1]; ++e)
      if (list.entries[e].mask != EntryMask::kNone)
        masked_cells += (list.entries[e].end - list.entries[e].begin) * list.tile_rows;
  EXPECT_EQ(masked_cells, list.num_tiles() * 64 * 64);  // one diagonal block per tile
}

TEST(WorkList, RejectsNonPositiveSizes) {
  EXPECT_THROW(build_work_list(masks::causal(8, 8), {WorkListOrder::kRowMajor, 0, 64}), Error);
  EXPECT_THROW(build_work_list(masks::causal(8, 8), {WorkListOrder::kRowMajor, 64, 0}), Error);
}

}  // namespace
}  // namespace flexcp
