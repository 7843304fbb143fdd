// The backward's L2 model (bwd_l2.h): against its definition written out plainly (the kernel's own
// walk, a lockstep of the SMs, an LRU list), exactly where it models every visit and within a few
// hundredths where it samples; the LRU's textbook cases; and, on the masks that decided the
// plan's order, the misses the plan's choice rests on.
#include "kernels/worklist/bwd_l2.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <queue>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bwd_plan_test_util.h"
#include "flexcp/masks.h"
#include "kernels/tiles.h"
#include "kernels/worklist/bwd_walk.h"
#include "test_util.h"

namespace flexcp {
namespace {

using test::bwd_options;
using test::key_tiles;

// Every visit exactly (no sampling).
constexpr BwdL2Model kExact{.max_visits = std::int64_t{1} << 40};

// The model by its definition: each unit starts on the SM that frees first (the lowest numbered
// of those that free together), at the step it frees; it visits one q block of one q head per
// step, in walk_bwd_unit's order; the visits of a step are taken in the units' order; L2 is an
// LRU list of `capacity` (q head, q block) entries.
double misses_by_definition(const WorkList& cols, const std::vector<BwdUnit>& units,
                            const BwdUnitOptions& o, std::size_t capacity) {
  using Free = std::pair<std::int64_t, int>;
  std::priority_queue<Free, std::vector<Free>, std::greater<>> free_at;
  for (int s = 0; s < o.sms; ++s) free_at.push({0, s});
  std::map<std::pair<std::int64_t, std::size_t>, std::pair<int, std::int64_t>> visits;
  for (std::size_t k = 0; k < units.size(); ++k) {
    const auto [at, sm] = free_at.top();
    free_at.pop();
    const BwdUnit& u = units[k];
    std::int64_t step = at;
    walk_bwd_unit(u, cols.entries.data(), static_cast<int>(cols.tile_offsets[u.tile]),
                  static_cast<int>(cols.tile_offsets[u.tile + 1]), static_cast<int>(o.group),
                  o.block_rows, [&](int head, int row, const WorkEntry&) {
                    visits[{step++, k}] = {head, row / o.block_rows};
                  });
    free_at.push({step, sm});
  }
  std::list<std::pair<int, std::int64_t>> lru;  // most recent first
  std::int64_t misses = 0;
  for (const auto& [when, entry] : visits) {
    const auto it = std::find(lru.begin(), lru.end(), entry);
    if (it == lru.end()) {
      ++misses;
    } else {
      lru.erase(it);
    }
    lru.push_front(entry);
    if (lru.size() > capacity) lru.pop_back();
  }
  return visits.empty() ? 0.0 : double(misses) / double(visits.size());
}

// Item units of `cols`, kv head by kv head or cut anywhere, in a shuffled order, each with the
// given walk: any plan the model may be asked about.
std::vector<BwdUnit> some_units(const WorkList& cols, const BwdUnitOptions& o, BwdWalk walk,
                                std::mt19937_64& rng) {
  std::vector<BwdUnit> units;
  for (std::int32_t h = 0; h < o.heads_kv; ++h)
    for (std::int32_t t = 0; t < static_cast<std::int32_t>(cols.num_tiles()); ++t) {
      const auto blocks = static_cast<std::int32_t>(bwd_item_blocks(cols, t, o));
      for (std::int32_t begin = 0; begin < blocks;) {
        const auto end = std::min<std::int32_t>(
            blocks, begin + 1 + static_cast<std::int32_t>(rng() % std::uint64_t(blocks)));
        BwdUnit u;
        u.tile = t, u.kv_head = h, u.block_begin = begin, u.block_end = end, u.walk = walk;
        units.push_back(u);
        begin = end;
      }
    }
  std::shuffle(units.begin(), units.end(), rng);
  return units;
}

TEST(BwdL2Model, MatchesItsDefinitionOnRandomMasksWalksAndGpuSizes) {
  std::mt19937_64 rng(53);
  for (int iter = 0; iter < 24; ++iter) {
    const std::int64_t t = 1 + static_cast<std::int64_t>(rng() % 1500);
    const Mask mask = test::random_mask(rng, t, t);
    const WorkList cols = key_tiles(mask);
    const int sms = std::vector<int>{1, 3, 16}[rng() % 3];
    const auto [hk, group] = std::vector<std::pair<int, int>>{{1, 1}, {2, 3}, {3, 2}}[rng() % 3];
    const BwdUnitOptions o = bwd_options(sms, hk, group);
    for (const BwdWalk walk : {BwdWalk::kHeadsOuter, BwdWalk::kHeadsInnerFromLast}) {
      const std::vector<BwdUnit> units = some_units(cols, o, walk, rng);
      // A cache of 1 to 64 entries of 64 KB (64 rows at head dim 128).
      const std::size_t capacity = 1 + rng() % 64;
      BwdL2Model model = kExact;
      model.cache_bytes = double(capacity) * 64 * 1024;
      SCOPED_TRACE("t=" + std::to_string(t) + " sms=" + std::to_string(sms) + " " +
                   std::to_string(hk * group) + ":" + std::to_string(hk) + " walk " +
                   std::to_string(int(walk)) + " capacity " + std::to_string(capacity));
      EXPECT_DOUBLE_EQ(bwd_l2_miss_rate(cols, units, o, model),
                       misses_by_definition(cols, units, o, capacity));
    }
  }
}

// One SM walking one tile's n blocks twice: the second walk hits every block where the cache
// holds all n, and misses every one where it holds n - 1 (LRU on a loop: each block is evicted
// just before its turn comes again).
TEST(BwdL2Model, ALoopOverTheCacheHitsOneOverItMisses) {
  const WorkList cols = key_tiles(masks::full(64 * 10, 128));
  const BwdUnitOptions o = bwd_options(1, 1, 1);
  ASSERT_EQ(bwd_item_blocks(cols, 0, o), 10);
  BwdUnit u;
  u.block_end = 10;
  const std::vector<BwdUnit> twice = {u, u};
  BwdL2Model model = kExact;
  model.cache_bytes = 10.0 * 64 * 1024;
  EXPECT_DOUBLE_EQ(bwd_l2_miss_rate(cols, twice, o, model), 0.5);
  model.cache_bytes = 9.0 * 64 * 1024;
  EXPECT_DOUBLE_EQ(bwd_l2_miss_rate(cols, twice, o, model), 1.0);
  // Head dim 64: the entries are half the size, so the same bytes hold 18 of them.
  model.head_dim = 64;
  EXPECT_DOUBLE_EQ(bwd_l2_miss_rate(cols, twice, o, model), 0.5);
  EXPECT_DOUBLE_EQ(bwd_l2_miss_rate(cols, {}, o, model), 0.0);
}

// Sampling (the plan's default: at most 2^14 visits modelled) against every visit, on the
// benchmark's masks and shapes whose orders were measured on the GPU: within 0.02.
TEST(BwdL2Model, SamplingStaysNearEveryVisit) {
  const masks::Lengths docs = {8192, 5336, 1846, 8004, 7799, 1497, 94};
  const std::vector<std::pair<std::string, Mask>> cases = {
      {"causal documents 32K", masks::varlen_causal(docs)},
      {"prefix-LM 16K", masks::prefix_lm({16384}, {8192})},
      {"causal 8K", masks::causal(8192, 8192)}};
  for (const auto& [name, mask] : cases)
    for (const auto& [hk, group] : {std::pair{16, 1}, {8, 8}})
      for (const BwdOrder order : {BwdOrder::kKvHeads, BwdOrder::kAcrossKvHeads}) {
        SCOPED_TRACE(name + " " + std::to_string(hk * group) + ":" + std::to_string(hk) +
                     " order " + std::to_string(int(order)));
        const WorkList cols = key_tiles(mask);
        BwdUnitOptions o = bwd_options(132, hk, group);
        o.kind = BwdUnitKind::kItems, o.order = order;
        const BwdUnits u = plan_bwd_units(cols, o);
        const double exact = bwd_l2_miss_rate(cols, u.units, o, kExact);
        EXPECT_NEAR(bwd_l2_miss_rate(cols, u.units, o), exact, 0.02);
        EXPECT_GT(exact, 0.0);
      }
}

}  // namespace
}  // namespace flexcp
