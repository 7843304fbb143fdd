// The sm90 backward's units: every q block of every (key tile, kv head) item walked by exactly one
// unit, the units of a split item in order (consecutive, with distinct slots and counters; or, for
// head units, chained on a counter whose turns follow the order); items split where the
// simulation says the GPU would wait on one of them, and left whole where it would not; head
// units where items drift apart. The walks (bwd_walk.h, the kernel's own function) against their
// definition, written out as nested loops, split anywhere.
#include "kernels/worklist/bwd_units.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <queue>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bwd_plan_test_util.h"
#include "kernels/tiles.h"
#include "kernels/worklist/bwd_l2.h"
#include "kernels/worklist/bwd_walk.h"
#include "test_util.h"

namespace flexcp {
namespace {

using test::bwd_options;
using test::key_tiles;

// Chained units (BwdPartials::kChain) on each counter, in the scheduler's order: the first waits
// for 0 (the counter at launch), each next for what the one before left, and the last leaves 0
// for the next launch. So every unit's turn comes after units earlier in the order only.
void check_chains(const BwdUnits& u) {
  std::map<int, std::vector<const BwdUnit*>> by_counter;
  for (const BwdUnit& unit : u.units)
    if (unit.partials == BwdPartials::kChain) by_counter[unit.counter].push_back(&unit);
  for (const auto& [counter, units] : by_counter) {
    SCOPED_TRACE("counter " + std::to_string(counter));
    ASSERT_GE(counter, 0);
    ASSERT_LT(counter, u.counters);
    std::int32_t value = 0;
    for (std::size_t i = 0; i < units.size(); ++i) {
      EXPECT_EQ(units[i]->wait_for, value) << "unit " << i << " of the counter";
      value = units[i]->then_set;
      EXPECT_EQ(value, i + 1 == units.size() ? 0 : static_cast<std::int32_t>(i + 1));
      EXPECT_EQ(units[i]->slot, counter);
    }
  }
}

void check_units(const WorkList& cols, const BwdUnitOptions& o, const BwdUnits& u) {
  std::map<std::pair<int, int>, std::vector<const BwdUnit*>> by_item;
  for (const BwdUnit& unit : u.units) by_item[{unit.tile, unit.kv_head}].push_back(&unit);
  ASSERT_EQ(static_cast<std::int64_t>(by_item.size()), cols.num_tiles() * o.heads_kv);
  std::set<std::int64_t> slots, counters;
  std::int64_t split_items = 0;
  for (const auto& [item, units] : by_item) {
    const std::int64_t blocks = bwd_item_blocks(cols, item.first, o);
    const int splits = units.front()->splits;
    const bool chained = units.front()->partials == BwdPartials::kChain;
    ASSERT_EQ(static_cast<int>(units.size()), splits) << "tile " << item.first;
    std::int64_t next = 0;
    for (int s = 0; s < splits; ++s) {
      const BwdUnit& unit = *units[s];
      // In split order (consecutive in the order unless chained), covering the walk once.
      if (!chained) {
        EXPECT_EQ(&unit, units.front() + s);
      }
      EXPECT_EQ(unit.partials, units.front()->partials);
      EXPECT_EQ(unit.split, s);
      EXPECT_EQ(unit.splits, splits);
      EXPECT_EQ(unit.block_begin, next);
      EXPECT_LE(unit.block_begin, unit.block_end);
      if (splits > 1) {
        EXPECT_LT(unit.block_begin, unit.block_end) << "an empty unit of a split item";
        EXPECT_EQ(unit.slot, units.front()->slot);
        EXPECT_EQ(unit.counter, units.front()->counter);
        if (!chained) {
          EXPECT_TRUE(slots.insert(unit.slot + s).second) << "slot used twice";
        }
      }
      next = unit.block_end;
    }
    EXPECT_EQ(next, blocks) << "tile " << item.first << " kv head " << item.second;
    if (splits > 1 && !chained) {
      ++split_items;
      EXPECT_TRUE(counters.insert(units.front()->counter).second) << "counter used twice";
    }
  }
  if (u.kind == BwdUnitKind::kHeads) {
    // Chained slots are shared in turns; the chains say whether the turns are right.
    EXPECT_TRUE(slots.empty()) << "head units and split items in one plan";
    EXPECT_EQ(u.slots, u.counters);
    EXPECT_LE(u.slots, 2 * kHeadSweepTiles);
    check_chains(u);
    return;
  }
  EXPECT_EQ(static_cast<std::int64_t>(slots.size()), u.slots);
  EXPECT_EQ(split_items, u.counters);
  if (!slots.empty()) {
    EXPECT_EQ(*slots.rbegin(), u.slots - 1);
  }
  EXPECT_LE(u.predicted, u.predicted_unsplit);
}

// Whether the units run kv head by kv head (BwdOrder::kKvHeads).
void expect_kv_head_by_kv_head(const BwdUnits& u) {
  for (std::size_t i = 1; i < u.units.size(); ++i)
    ASSERT_LE(u.units[i - 1].kv_head, u.units[i].kv_head) << "unit " << i;
}

// The units for GQA 64:8 on 132 SMs (an H200), checked as above.
struct Planned {
  WorkList cols;
  BwdUnits u;
};
Planned planned_on_h200(const Mask& mask) {
  Planned p{key_tiles(mask), {}};
  const BwdUnitOptions o = bwd_options(132, 8, 8);
  p.u = plan_bwd_units(p.cols, o);
  check_units(p.cols, o, p.u);
  return p;
}

// Random masks and GPU sizes, the plan's own units and head units of one, two and three q heads
// forced on every plan (FLEXCP_SM90_BWD_UNITS=heads, FLEXCP_SM90_BWD_UNIT_HEADS): the items'
// blocks once each, the chains' turns in order; with one q head per kv head, item units.
TEST(BwdUnits, EveryBlockOnceOnRandomMasksAndGpuSizes) {
  std::mt19937_64 rng(31);
  for (int iter = 0; iter < 60; ++iter) {
    const std::int64_t t = 1 + static_cast<std::int64_t>(rng() % 3000);
    const Mask mask = test::random_mask(rng, t, t);
    const WorkList cols = key_tiles(mask);
    for (const int sms : {1, 7, 132, 1000})
      for (const auto& [hk, group] : {std::pair{1, 1}, {2, 3}, {8, 8}})
        for (const int heads : {0, 1, 2, 3}) {  // q heads per head unit; 0: the plan's units
          SCOPED_TRACE("t=" + std::to_string(t) + " sms=" + std::to_string(sms) +
                       " hk=" + std::to_string(hk) + " group=" + std::to_string(group) +
                       " head units of " + std::to_string(heads));
          BwdUnitOptions o = bwd_options(sms, hk, group);
          if (heads) o.kind = BwdUnitKind::kHeads, o.unit_heads = heads;
          const BwdUnits u = plan_bwd_units(cols, o);
          if (heads) {
            EXPECT_EQ(u.kind, group > 1 ? BwdUnitKind::kHeads : BwdUnitKind::kItems);
          }
          check_units(cols, o, u);
          if (heads == 0) {  // item units kv head by kv head, asked for (FLEXCP_SM90_BWD_ORDER)
            o.kind = BwdUnitKind::kItems;
            o.order = BwdOrder::kKvHeads;
            const BwdUnits kv = plan_bwd_units(cols, o);
            check_units(cols, o, kv);
            EXPECT_EQ(kv.order, BwdOrder::kKvHeads);
            expect_kv_head_by_kv_head(kv);
          }
        }
  }
}

// Causal 32K, GQA 64:8 on 132 SMs: 2048 items whose walks range from 2 to 512 blocks a head.
// Head units, in sweeps: each pair of q heads (kHeadsPerUnit) over all 256 tiles, busiest first,
// kv head by kv head; every unit its heads' run of blocks; two sets of 256 slots.
TEST(BwdUnits, LongCausalGetsHeadUnitsInSweeps) {
  const auto [cols, u] = planned_on_h200(masks::causal(32768, 32768));
  ASSERT_EQ(u.kind, BwdUnitKind::kHeads);
  const std::int64_t splits = 8 / kHeadsPerUnit;
  ASSERT_EQ(static_cast<std::int64_t>(u.units.size()), 8 * splits * cols.num_tiles());
  EXPECT_EQ(u.slots, 2 * cols.num_tiles());
  const auto n = static_cast<std::size_t>(cols.num_tiles());
  for (std::size_t i = 0; i < u.units.size(); ++i) {
    const BwdUnit& unit = u.units[i];
    const std::size_t sweep = i / n;  // kv_head * splits + split
    ASSERT_EQ(unit.kv_head * splits + unit.split, static_cast<std::int64_t>(sweep)) << "unit " << i;
    ASSERT_EQ(unit.splits, splits) << "unit " << i;
    ASSERT_EQ(unit.tile, cols.tile_order[i % n]) << "unit " << i;
    const std::int64_t per_head = bwd_item_blocks(cols, unit.tile, bwd_options(132, 8, 8)) / 8;
    ASSERT_EQ(unit.block_begin, unit.split * kHeadsPerUnit * per_head) << "unit " << i;
    ASSERT_EQ(unit.block_end - unit.block_begin, kHeadsPerUnit * per_head) << "unit " << i;
    ASSERT_EQ(unit.walk, BwdWalk::kHeadsOuter);
  }
}

// Head units of one q head (of 8): eight units an item, each one head's run of the walk, chained
// in order; of the whole group: the items in sweeps, nothing chained.
TEST(BwdUnits, HeadUnitsTakeTheQHeadsAskedFor) {
  const WorkList cols = key_tiles(masks::causal(32768, 32768));
  BwdUnitOptions o = bwd_options(132, 8, 8);
  o.kind = BwdUnitKind::kHeads;
  o.unit_heads = 1;
  const BwdUnits singles = plan_bwd_units(cols, o);
  check_units(cols, o, singles);
  ASSERT_EQ(static_cast<std::int64_t>(singles.units.size()), 8 * 8 * cols.num_tiles());
  for (const BwdUnit& unit : singles.units) {
    const std::int64_t per_head = bwd_item_blocks(cols, unit.tile, o) / 8;
    ASSERT_EQ(unit.splits, 8);
    ASSERT_EQ(unit.block_begin, unit.split * per_head);
    ASSERT_EQ(unit.block_end - unit.block_begin, per_head);
    ASSERT_EQ(unit.partials, BwdPartials::kChain);
  }
  o.unit_heads = 8;
  const BwdUnits whole = plan_bwd_units(cols, o);
  check_units(cols, o, whole);
  EXPECT_EQ(whole.slots, 0);
  EXPECT_EQ(static_cast<std::int64_t>(whole.units.size()), 8 * cols.num_tiles());
  for (const BwdUnit& unit : whole.units) ASSERT_EQ(unit.splits, 1);
}

// The scheduler run on the plan's units with each unit's blocks as its time (one unit per SM at a
// time, the next to the first SM free), and a chained unit's turn (add, store, pass on: two
// blocks' time) taken no sooner than the unit before it on its counter has passed it on. On causal
// 8K-64K (64:8, 132 SMs) the waits for turns are under 0.5% of the work and the plan ends within
// 1% of its prediction: the sweeps put an item's units far enough apart that each finds its turn
// come. (An item's units one after the other in the order, run side by side, would queue for
// their turns: 2.4% of the work waited at causal 32K, 9.5% at 8K.)
TEST(BwdUnits, HeadUnitsRarelyWaitForTheirTurn) {
  for (const std::int64_t t : {8192, 32768, 65536}) {
    SCOPED_TRACE("t=" + std::to_string(t));
    const auto [cols, u] = planned_on_h200(masks::causal(t, t));
    ASSERT_EQ(u.kind, BwdUnitKind::kHeads);
    std::priority_queue<double, std::vector<double>, std::greater<>> free_at;
    for (int i = 0; i < 132; ++i) free_at.push(0.0);
    std::map<std::pair<int, int>, double> done;  // (counter, value it left) -> when
    double work = 0, waited = 0, end = 0;
    for (const BwdUnit& unit : u.units) {
      const double start = free_at.top();
      free_at.pop();
      const double blocks = unit.block_end - unit.block_begin;
      constexpr double kTurn = 2;
      double finish = start + blocks;
      if (unit.partials == BwdPartials::kChain) {
        if (unit.wait_for > 0) {
          const auto before = done.find({unit.counter, unit.wait_for});
          ASSERT_NE(before, done.end()) << "a turn no earlier unit gives";
          waited += std::max(0.0, before->second - finish);
          finish = std::max(finish, before->second);
        }
        finish += kTurn;
      }
      if (unit.partials == BwdPartials::kChain && unit.then_set > 0)
        done[{unit.counter, unit.then_set}] = finish;
      work += blocks;
      end = std::max(end, finish);
      free_at.push(finish);
    }
    EXPECT_LT(waited, 0.005 * work);
    EXPECT_LT(end, 1.01 * u.predicted);  // the prediction counts the turns as kChainOverhead
  }
}

// Documents of unequal length packed into 32K, each causal: head units (measured +10% over item
// units on the H200); each attending in full: item units (-1.6%), their tiles' walks as long as
// the walks of the tiles they share q blocks with.
TEST(BwdUnits, CausalDocumentsGetHeadUnitsFullOnesItemUnits) {
  const std::vector<std::int64_t> docs = {8192, 4096, 2048, 8192, 4096, 3000, 3000, 144};
  EXPECT_EQ(planned_on_h200(masks::varlen_causal(docs)).u.kind, BwdUnitKind::kHeads);
  EXPECT_EQ(planned_on_h200(masks::varlen_full(docs)).u.kind, BwdUnitKind::kItems);
}

// Where items keep in step and start together (full attention, full documents), are few (causal
// 4K: two waves) or short (a window of 512, 9 blocks a head: a unit of four would walk 36), or the
// group has one q head: item units.
TEST(BwdUnits, ItemUnitsWhereItemsKeepInStepOrAreFewOrShort) {
  for (const Mask& mask : {masks::full(32768, 32768), masks::causal(4096, 4096),
                           masks::sliding_window({32768}, 512, masks::WindowKind::kCausal),
                           masks::varlen_full(std::vector<std::int64_t>(16, 2048))}) {
    const auto [cols, u] = planned_on_h200(mask);
    EXPECT_EQ(u.kind, BwdUnitKind::kItems) << cols.num_tiles() << " tiles";
  }
  const WorkList cols = key_tiles(masks::causal(32768, 32768));
  EXPECT_EQ(plan_bwd_units(cols, bwd_options(132, 64, 1)).kind, BwdUnitKind::kItems);
}

// The q heads of each of `u`'s head units: the group over the units of its first item.
std::int64_t heads_per_unit(const BwdUnits& u, std::int64_t group) {
  std::int64_t units = 0;
  for (const BwdUnit& unit : u.units)
    units += unit.tile == u.units.front().tile && unit.kv_head == u.units.front().kv_head;
  return group / units;
}

// Few items (one or two waves on 132 SMs) whose walks drift apart take head units of two q heads
// where the memory is slow (an H100: 25 GB/s per SM) and they fill most of a wave: causal 2K and
// 4K, causal documents of 5-9 blocks a head and a shared question at 2K (+27%, +7.5%, +7-11% and
// +4.5% there). They stay items where the memory is fast (an H200: 37; level there) or not known,
// where they are fewer (causal 1K: 64 items, 10% slower in head units) and where they keep in
// step (full 4K).
TEST(BwdUnits, FewItemsTakeHeadUnitsOnlyOnSlowMemory) {
  const auto planned = [](const Mask& mask, double gbs) {
    const WorkList cols = key_tiles(mask);
    BwdUnitOptions o = bwd_options(132, 8, 8);
    o.memory_gbs_per_sm = gbs;
    BwdUnits u = plan_bwd_units(cols, o);
    check_units(cols, o, u);
    EXPECT_LE(cols.num_tiles() * 8, 2 * 132);
    return u;
  };
  const Mask documents = masks::varlen_causal({700, 1300, 500, 1100, 300, 196});  // 4K
  const Mask question = masks::shared_question(512, {400, 300, 500, 336});        // 2K
  for (const Mask& mask :
       {masks::causal(2048, 2048), masks::causal(4096, 4096), documents, question}) {
    SCOPED_TRACE(std::to_string(mask.seqlen_q()) + " tokens");
    const BwdUnits slow = planned(mask, 25.4);
    ASSERT_EQ(slow.kind, BwdUnitKind::kHeads);
    EXPECT_EQ(heads_per_unit(slow, 8), 2);
    EXPECT_EQ(planned(mask, 37.2).kind, BwdUnitKind::kItems);
    EXPECT_EQ(planned(mask, 0).kind, BwdUnitKind::kItems);
  }
  EXPECT_EQ(planned(masks::causal(1024, 1024), 25.4).kind, BwdUnitKind::kItems);
  EXPECT_EQ(planned(masks::full(4096, 4096), 25.4).kind, BwdUnitKind::kItems);
}

// Sliding windows over 32K (tiles that start their walks a block or two apart, walks of equal
// length): head units, of two q heads where one head walks 20 blocks or more (windows of 2048 and
// 4096, 33 and 65 blocks: +7% and +17% on the H100), of four where it walks 10 to 20 (window 1024,
// 17: level to +6%), so that a unit walks at least 40 blocks. The same over documents, and on 16K
// windows of 2048 over documents (24 blocks a head: +19%). Prefix-LM over documents, each half
// prefix (half its tiles start at their document's first row): item units.
TEST(BwdUnits, ShiftedWalksGetHeadUnitsLongEnoughForTheirTurns) {
  const std::vector<std::int64_t> docs = {8192, 4096, 2048, 8192, 4096, 3000, 3000, 144};
  for (const auto& [window, heads] : {std::pair{4096, 2}, {2048, 2}, {1024, 4}}) {
    SCOPED_TRACE("window " + std::to_string(window));
    const auto [cols, u] =
        planned_on_h200(masks::sliding_window({32768}, window, masks::WindowKind::kCausal));
    ASSERT_EQ(u.kind, BwdUnitKind::kHeads);
    EXPECT_EQ(heads_per_unit(u, 8), heads);
    EXPECT_EQ(
        planned_on_h200(masks::sliding_window(docs, window, masks::WindowKind::kCausal)).u.kind,
        BwdUnitKind::kHeads);
  }
  const std::vector<std::int64_t> half(docs.begin(), docs.begin() + 4);  // 16K
  const auto [cols16, u16] =
      planned_on_h200(masks::sliding_window(half, 2048, masks::WindowKind::kCausal));
  ASSERT_EQ(u16.kind, BwdUnitKind::kHeads);
  EXPECT_EQ(heads_per_unit(u16, 8), 2);
  std::vector<std::int64_t> prefixes;
  for (const std::int64_t n : docs) prefixes.push_back(n / 2);  // the protocol's prefix-LM
  EXPECT_EQ(planned_on_h200(masks::prefix_lm(docs, prefixes)).u.kind, BwdUnitKind::kItems);
}

// bwd_walk_shift by its definition: the tiles with work in tile order, in waves of `sms`, each
// wave's distinct first q blocks (a set), over the tiles; on random masks and GPU sizes. And its
// values at the ends: every tile of a window starts apart (1), every tile of full attention
// together (one start in each of its two waves: 2 / 256).
TEST(BwdUnits, WalkShiftCountsEachWavesDistinctStarts) {
  std::mt19937_64 rng(57);
  for (int iter = 0; iter < 40; ++iter) {
    const std::int64_t t = 1 + static_cast<std::int64_t>(rng() % 5000);
    const WorkList cols = key_tiles(test::random_mask(rng, t, t));
    for (const int sms : {1, 3, 132}) {
      const BwdUnitOptions o = bwd_options(sms, 2, 4);
      std::vector<std::int64_t> firsts;
      for (const std::int32_t tile : cols.tile_order) {
        std::set<std::int64_t> blocks;
        for (std::int64_t e = cols.tile_offsets[tile]; e < cols.tile_offsets[tile + 1]; ++e)
          for (std::int64_t r = cols.entries[e].begin; r < cols.entries[e].end; ++r)
            blocks.insert(r / o.block_rows);
        if (!blocks.empty()) firsts.push_back(*blocks.begin());
      }
      std::size_t distinct = 0;
      for (std::size_t w = 0; w < firsts.size(); w += static_cast<std::size_t>(sms))
        distinct +=
            std::set<std::int64_t>(firsts.begin() + static_cast<std::ptrdiff_t>(w),
                                   firsts.begin() + static_cast<std::ptrdiff_t>(std::min(
                                                        firsts.size(), w + std::size_t(sms))))
                .size();
      const double expected = firsts.empty() ? 0.0 : double(distinct) / double(firsts.size());
      EXPECT_DOUBLE_EQ(bwd_walk_shift(cols, o), expected) << "t=" << t << " sms=" << sms;
    }
  }
  EXPECT_EQ(
      bwd_walk_shift(key_tiles(masks::sliding_window({32768}, 2048, masks::WindowKind::kCausal)),
                     bwd_options(132, 8, 8)),
      1.0);
  EXPECT_DOUBLE_EQ(bwd_walk_shift(key_tiles(masks::full(32768, 32768)), bwd_options(132, 8, 8)),
                   2.0 / 256);
}

// Item units busiest first across the kv heads balance the SMs better, but may have the units
// running together read too many q blocks for L2 (bwd_l2.h); the plan weighs both. MHA 16 over
// causal documents at 32K (the benchmark's real lengths, packed): across would finish ~4% sooner
// in the simulation but miss 46% of its q blocks against 4% kv head by kv head (measured 1.69x
// faster on an H100, bench/results/h100-2026-12-06.md section 18); at 8K, 48% against 12% (1.24x,
// section 20), which the rule before the model left across. Causal 4K (10% against 6%, across
// measured 1.14x faster) and GQA 64:8 full documents at 32K (5.5% against 10%, 1.05x) keep
// across. Either order is taken when asked for.
TEST(BwdUnits, ItemUnitsCrossKvHeadsOnlyWhereL2KeepsTheirBlocks) {
  const masks::Lengths docs = {8192, 5336, 1846, 8004, 7799, 1497, 94};
  BwdUnitOptions o = bwd_options(132, 16, 1);
  for (const auto& [name, lengths] :
       {std::pair{"32K", docs}, {"8K", {2048, 2048, 1846, 2048, 202}}}) {
    SCOPED_TRACE(std::string("causal documents ") + name);
    const WorkList documents = key_tiles(masks::varlen_causal(lengths));
    o.order.reset();
    const BwdUnits kv = plan_bwd_units(documents, o);
    check_units(documents, o, kv);
    EXPECT_EQ(kv.kind, BwdUnitKind::kItems);
    EXPECT_EQ(kv.order, BwdOrder::kKvHeads);
    expect_kv_head_by_kv_head(kv);
    o.order = BwdOrder::kAcrossKvHeads;
    const BwdUnits across = plan_bwd_units(documents, o);
    check_units(documents, o, across);
    EXPECT_EQ(across.order, BwdOrder::kAcrossKvHeads);
    EXPECT_LT(across.predicted, kv.predicted);  // what across would have been taken for
    EXPECT_NE(across.units[0].kv_head, across.units[1].kv_head);
    EXPECT_GT(bwd_l2_miss_rate(documents, across.units, o),
              3 * bwd_l2_miss_rate(documents, kv.units, o));
  }

  const WorkList causal = key_tiles(masks::causal(4096, 4096));
  o.order.reset();
  const BwdUnits short_causal = plan_bwd_units(causal, o);
  check_units(causal, o, short_causal);
  EXPECT_EQ(short_causal.order, BwdOrder::kAcrossKvHeads);
  o.order = BwdOrder::kKvHeads;
  expect_kv_head_by_kv_head(plan_bwd_units(causal, o));

  const WorkList full_documents = key_tiles(masks::varlen_full(docs));
  const BwdUnitOptions gqa = bwd_options(132, 8, 8);
  const BwdUnits balanced = plan_bwd_units(full_documents, gqa);
  check_units(full_documents, gqa, balanced);
  EXPECT_EQ(balanced.kind, BwdUnitKind::kItems);
  EXPECT_EQ(balanced.order, BwdOrder::kAcrossKvHeads);
}

// Causal 1K with GQA 64:8: 64 items for 132 SMs, the heaviest 8x the average share. Split, and
// predicted at least 1.5x sooner.
TEST(BwdUnits, ShortCausalIsSplit) {
  const auto [cols, u] = planned_on_h200(masks::causal(1024, 1024));
  EXPECT_GT(u.counters, 0);
  EXPECT_GT(static_cast<std::int64_t>(u.units.size()), 132);
  EXPECT_LT(u.predicted * 1.5, u.predicted_unsplit);
}

// Full attention at 32K: 2048 equal items on 132 SMs, nothing to gain: the items as they are,
// kv head by kv head and busiest tile first.
TEST(BwdUnits, LongFullIsLeftWhole) {
  const auto [cols, u] = planned_on_h200(masks::full(32768, 32768));
  EXPECT_EQ(u.counters, 0);
  EXPECT_EQ(u.slots, 0);
  ASSERT_EQ(static_cast<std::int64_t>(u.units.size()), 8 * cols.num_tiles());
  for (std::size_t i = 0; i < u.units.size(); ++i) {
    EXPECT_EQ(u.units[i].kv_head, static_cast<int>(i / cols.tile_order.size()));
    EXPECT_EQ(u.units[i].tile, cols.tile_order[i % cols.tile_order.size()]);
  }
  EXPECT_EQ(u.predicted, u.predicted_unsplit);
}

// bwd_walk_drift by its definition: for every q block, the lengths (distinct q blocks) of the
// tiles that visit it, their squared deviations from their mean and their squared mean, summed
// over the blocks; the root of the ratio.
double drift_by_definition(const WorkList& cols, std::int64_t block_rows) {
  const std::int64_t blocks = (cols.num_cols + block_rows - 1) / block_rows;
  std::vector<std::vector<char>> visits(static_cast<std::size_t>(cols.num_tiles()),
                                        std::vector<char>(static_cast<std::size_t>(blocks), 0));
  std::vector<double> length(visits.size(), 0);
  for (std::size_t t = 0; t < visits.size(); ++t) {
    for (std::int64_t e = cols.tile_offsets[t]; e < cols.tile_offsets[t + 1]; ++e)
      for (std::int64_t b = cols.entries[e].begin / block_rows;
           b * block_rows < cols.entries[e].end; ++b)
        visits[t][b] = 1;
    for (const char v : visits[t]) length[t] += v;
  }
  double deviation = 0, mean2 = 0;
  for (std::int64_t b = 0; b < blocks; ++b) {
    std::vector<double> lengths;
    for (std::size_t t = 0; t < visits.size(); ++t)
      if (visits[t][b]) lengths.push_back(length[t]);
    if (lengths.empty()) continue;
    double mean = 0;
    for (const double l : lengths) mean += l / double(lengths.size());
    for (const double l : lengths) deviation += (l - mean) * (l - mean), mean2 += mean * mean;
  }
  return mean2 > 0 ? std::sqrt(deviation / mean2) : 0.0;
}

TEST(BwdWalkDrift, MatchesItsDefinitionOnRandomMasks) {
  std::mt19937_64 rng(47);
  for (int iter = 0; iter < 80; ++iter) {
    const std::int64_t t = 1 + static_cast<std::int64_t>(rng() % 2500);
    const WorkList cols = key_tiles(test::random_mask(rng, t, t));
    const double expected = drift_by_definition(cols, tiles::kSm90BwdBlockM);
    EXPECT_NEAR(bwd_walk_drift(cols, bwd_options(132, 2, 3)), expected, 1e-9 * (1 + expected))
        << "t=" << t << " iteration " << iter;
  }
}

// Causal: the block at x (of 1) is visited by the tiles from 0 to x, of lengths 1 - y: a spread of
// x / sqrt(12) about 1 - x / 2, so drift^2 = (1/48) / (11/48) = 1/11. Walks as long as every
// walk they share blocks with: none (full; documents aligned to the tiles).
TEST(BwdWalkDrift, CausalDriftsOneInSqrtElevenFullNot) {
  EXPECT_NEAR(bwd_walk_drift(key_tiles(masks::causal(32768, 32768)), bwd_options(132, 8, 8)),
              1 / std::sqrt(11.0), 0.005);
  EXPECT_EQ(bwd_walk_drift(key_tiles(masks::full(4096, 4096)), bwd_options(132, 8, 8)), 0.0);
  EXPECT_EQ(
      bwd_walk_drift(key_tiles(masks::varlen_full({1024, 256, 4096, 128})), bwd_options(132, 8, 8)),
      0.0);
}

// A visit of the walk: q head, first row, and the entry's interval.
using Visit = std::tuple<int, std::int64_t, std::int64_t, std::int64_t>;

// The walks as BwdWalk defines them, one item whole: nested loops.
std::vector<Visit> defined_walk(const WorkList& cols, std::int64_t tile, int kv_head, int group,
                                BwdWalk walk) {
  const std::int64_t rows = tiles::kSm90BwdBlockM;
  std::vector<Visit> v;
  const std::int64_t e0 = cols.tile_offsets[tile], e1 = cols.tile_offsets[tile + 1];
  const auto blocks = [&](const WorkEntry& en) { return (en.end - en.begin + rows - 1) / rows; };
  if (walk == BwdWalk::kHeadsOuter) {
    for (int j = 0; j < group; ++j)
      for (std::int64_t e = e0; e < e1; ++e)
        for (std::int64_t b = 0; b < blocks(cols.entries[e]); ++b) {
          const WorkEntry& en = cols.entries[e];
          v.emplace_back(kv_head * group + j, en.begin + b * rows, en.begin, en.end);
        }
  } else {
    for (std::int64_t e = e1 - 1; e >= e0; --e)
      for (std::int64_t b = blocks(cols.entries[e]) - 1; b >= 0; --b)
        for (int j = 0; j < group; ++j) {
          const WorkEntry& en = cols.entries[e];
          v.emplace_back(kv_head * group + j, en.begin + b * rows, en.begin, en.end);
        }
  }
  return v;
}

std::vector<Visit> walked(const WorkList& cols, const BwdUnit& unit, int group) {
  std::vector<Visit> v;
  walk_bwd_unit(
      unit, cols.entries.data(), static_cast<int>(cols.tile_offsets[unit.tile]),
      static_cast<int>(cols.tile_offsets[unit.tile + 1]), group, tiles::kSm90BwdBlockM,
      [&](int hq, int c0, const WorkEntry& en) { v.emplace_back(hq, c0, en.begin, en.end); });
  return v;
}

// Both walks, the planner's units of every item (split or not, head units or not) and the item cut
// at random points, on random masks (empty entries and tiles among them): the units' walks, one
// after the other, are the item's walk as defined.
TEST(BwdWalk, UnitsWalkTheirPartOfTheDefinedOrder) {
  std::mt19937_64 rng(47);
  for (int iter = 0; iter < 40; ++iter) {
    const std::int64_t t = 1 + static_cast<std::int64_t>(rng() % 2000);
    const Mask mask = test::random_mask(rng, t, t);
    const WorkList cols = key_tiles(mask);
    for (const int group : {1, 3, 8}) {
      BwdUnitOptions o = bwd_options(static_cast<int>(1 + rng() % 200), 2, group);
      if (iter % 2) o.kind = BwdUnitKind::kHeads;  // an item's head units in split order too
      const BwdUnits u = plan_bwd_units(cols, o);
      for (const BwdWalk walk : {BwdWalk::kHeadsOuter, BwdWalk::kHeadsInnerFromLast}) {
        std::map<std::pair<int, int>, std::vector<Visit>> by_item;
        for (BwdUnit unit : u.units) {
          unit.walk = walk;
          const std::vector<Visit> v = walked(cols, unit, group);
          EXPECT_EQ(static_cast<std::int64_t>(v.size()), unit.block_end - unit.block_begin);
          auto& all = by_item[{unit.tile, unit.kv_head}];
          all.insert(all.end(), v.begin(), v.end());
        }
        for (const auto& [item, v] : by_item) {
          SCOPED_TRACE("t=" + std::to_string(t) + " group=" + std::to_string(group) + " tile " +
                       std::to_string(item.first) + " walk " + std::to_string(int(walk)));
          const std::vector<Visit> want = defined_walk(cols, item.first, item.second, group, walk);
          ASSERT_EQ(v, want);
          // Cut anywhere: two units of the whole.
          const auto cut = static_cast<std::int32_t>(want.empty() ? 0 : rng() % want.size());
          BwdUnit a{.tile = item.first,
                    .kv_head = item.second,
                    .block_begin = 0,
                    .block_end = cut,
                    .walk = walk};
          BwdUnit b = a;
          b.block_begin = cut;
          b.block_end = static_cast<std::int32_t>(want.size());
          std::vector<Visit> both = walked(cols, a, group);
          const std::vector<Visit> rest = walked(cols, b, group);
          both.insert(both.end(), rest.begin(), rest.end());
          ASSERT_EQ(both, want) << "cut at " << cut;
        }
      }
    }
  }
}

// Tiles whose walks end on the same row walk from the last block, every head on a block before
// the next: causal and document masks, full attention. A sliding window's tiles end a tile apart
// and walk head by head, except the last ones of a document, which end with it.
TEST(BwdWalk, TilesThatEndTogetherWalkFromTheLast) {
  for (const Mask& mask : {masks::causal(4096, 4096), masks::full(4096, 4096),
                           masks::varlen_causal({3000, 1100, 5000})}) {
    const WorkList cols = key_tiles(mask);
    for (std::int64_t t = 0; t < cols.num_tiles(); ++t)
      EXPECT_EQ(bwd_tile_walk(cols, t), BwdWalk::kHeadsInnerFromLast) << "tile " << t;
  }
  const WorkList window =
      key_tiles(masks::sliding_window({32768}, 1024, masks::WindowKind::kCausal));
  const std::int64_t n = window.num_tiles();
  for (std::int64_t t = 0; t < n; ++t)
    EXPECT_EQ(bwd_tile_walk(window, t),
              t < n - 8 ? BwdWalk::kHeadsOuter : BwdWalk::kHeadsInnerFromLast)
        << "tile " << t;
}

// The plans walk from the last block where their units fit in two waves on the SMs (full 4K:
// 256 units on 132 SMs), and head by head where they do not (full 32K: 2048).
TEST(BwdWalk, OnlyPlansOfTwoWavesWalkFromTheLast) {
  for (const auto& [t, want] :
       {std::pair{4096, BwdWalk::kHeadsInnerFromLast}, {32768, BwdWalk::kHeadsOuter}}) {
    const auto [cols, u] = planned_on_h200(masks::full(t, t));
    EXPECT_EQ(u.units.size() <= 2 * 132, want == BwdWalk::kHeadsInnerFromLast);
    for (const BwdUnit& unit : u.units) EXPECT_EQ(unit.walk, want) << "t=" << t;
  }
}

// A walk in the options is every unit's, whatever the plan's size (FLEXCP_SM90_BWD_WALK).
TEST(BwdWalk, AWalkInTheOptionsIsEveryUnits) {
  for (const std::int64_t t : {1024, 32768})
    for (const BwdWalk walk : {BwdWalk::kHeadsOuter, BwdWalk::kHeadsInnerFromLast}) {
      const WorkList cols = key_tiles(masks::causal(t, t));
      BwdUnitOptions o = bwd_options(132, 8, 8);
      o.walk = walk;
      const BwdUnits u = plan_bwd_units(cols, o);
      check_units(cols, o, u);
      for (const BwdUnit& unit : u.units) ASSERT_EQ(unit.walk, walk) << "t=" << t;
    }
}

// One item of 2^31 blocks: the kernel's 32-bit block indices cannot walk it.
TEST(BwdUnits, AnItemTooLongForTheKernelIsAnError) {
  WorkList cols;
  cols.tile_offsets = {0, 1};
  cols.entries = {{0, std::int64_t{1} << 37, 0, EntryMask::kNone}};
  cols.tile_area = {1};
  cols.tile_order = {0};
  EXPECT_THROW(plan_bwd_units(cols, bwd_options(132, 1, 1)), std::length_error);
}

}  // namespace
}  // namespace flexcp
