#include "kernels/worklist/bwd_units.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <queue>
#include <stdexcept>
#include <string>

namespace flexcp {
namespace {

// Costs in q blocks. A unit also loads its K and V and writes (or stores) its dK and dV: about one
// block's time. A unit of a split item stores 2 x 128 keys x D fp32 partials, and the last one
// reads them all back, at the end of the item, when the SMs are short of work: measured on the
// H200 (bench/results/h200-backward-2026-12-01.md) as 4 blocks per unit, the best of 1.5, 4, 8
// and 16 on causal 1K (+15% over 1.5; full 1K -3%, 4K level).
constexpr double kUnitOverhead = 1.0;
constexpr double kSplitOverhead = 4.0;
// Units shorter than this would spend more on their partials than they save.
constexpr std::int64_t kMinUnitBlocks = 4;
// A split (or the order across kv heads, which gives up L2 reuse of Q and dO) must be predicted
// to finish sooner by this much: the simulation does not see memory traffic.
constexpr double kMinGain = 0.03;
// Partial slots per SM at most (128 KB each at head dim 128): bounds the scratch.
constexpr std::int64_t kMaxSlotsPerSm = 4;
// Splits tried: the items cut to at most avg / d blocks, avg = the work per SM.
constexpr double kTargetDivisors[] = {1, 2, 3, 4, 6, 8};

struct Item {
  std::int32_t tile;
  std::int32_t kv_head;
  std::int64_t blocks;
  BwdWalk walk;
};

// The persistent scheduler: the next unit goes to the SM that is free first.
double simulate(const std::vector<double>& costs, int sms) {
  std::priority_queue<double, std::vector<double>, std::greater<>> free_at;
  for (int i = 0; i < sms; ++i) free_at.push(0.0);
  double end = 0;
  for (const double c : costs) {
    const double t = free_at.top() + c;
    free_at.pop();
    free_at.push(t);
    end = std::max(end, t);
  }
  return end;
}

std::int64_t splits_for(std::int64_t blocks, double target) {
  if (double(blocks) <= target) return 1;
  const auto want = static_cast<std::int64_t>(std::ceil(double(blocks) / target));
  return std::max<std::int64_t>(1, std::min(want, blocks / kMinUnitBlocks));
}

// The units of `items` (in order) with every item cut to at most `target` blocks.
BwdUnits cut(const std::vector<Item>& items, double target, int sms) {
  BwdUnits u;
  std::vector<double> costs;
  for (const Item& it : items) {
    const std::int64_t splits = splits_for(it.blocks, target);
    for (std::int64_t s = 0; s < splits; ++s) {
      BwdUnit unit;
      unit.tile = it.tile;
      unit.kv_head = it.kv_head;
      unit.walk = it.walk;
      unit.block_begin = static_cast<std::int32_t>(it.blocks * s / splits);
      unit.block_end = static_cast<std::int32_t>(it.blocks * (s + 1) / splits);
      unit.splits = static_cast<std::int32_t>(splits);
      unit.split = static_cast<std::int32_t>(s);
      if (splits > 1) {
        unit.slot = static_cast<std::int32_t>(u.slots);
        unit.counter = static_cast<std::int32_t>(u.counters);
      }
      u.units.push_back(unit);
      costs.push_back(double(unit.block_end - unit.block_begin) + kUnitOverhead +
                      (splits > 1 ? kSplitOverhead : 0.0));
    }
    if (splits > 1) {
      u.slots += splits;
      u.counters += 1;
    }
  }
  u.predicted = simulate(costs, sms);
  return u;
}

}  // namespace

std::int64_t bwd_item_blocks(const WorkList& cols, std::int64_t tile, const BwdUnitOptions& o) {
  std::int64_t blocks = 0;
  for (std::int64_t e = cols.tile_offsets[tile]; e < cols.tile_offsets[tile + 1]; ++e) {
    const WorkEntry& entry = cols.entries[e];
    blocks += (entry.end - entry.begin + o.block_rows - 1) / o.block_rows;
  }
  return blocks * o.group;
}

BwdWalk bwd_tile_walk(const WorkList& cols, std::int64_t tile) {
  const auto last_row = [&cols](std::int64_t t) {
    std::int64_t end = -1;  // no entries: shares nothing
    for (std::int64_t e = cols.tile_offsets[t]; e < cols.tile_offsets[t + 1]; ++e)
      end = std::max(end, cols.entries[e].end);
    return end;
  };
  const std::int64_t end = last_row(tile);
  const bool shared = end >= 0 && ((tile > 0 && last_row(tile - 1) == end) ||
                                   (tile + 1 < cols.num_tiles() && last_row(tile + 1) == end));
  return shared ? BwdWalk::kHeadsInnerFromLast : BwdWalk::kHeadsOuter;
}

BwdUnits plan_bwd_units(const WorkList& cols, const BwdUnitOptions& o) {
  std::vector<Item> items;  // kv head by kv head, busiest tile first
  items.reserve(static_cast<std::size_t>(cols.num_tiles() * o.heads_kv));
  std::vector<std::int64_t> blocks(cols.tile_order.size());
  std::vector<BwdWalk> walks(cols.tile_order.size());
  double work = 0;
  for (std::size_t t = 0; t < blocks.size(); ++t) {
    blocks[t] = bwd_item_blocks(cols, static_cast<std::int64_t>(t), o);
    walks[t] = bwd_tile_walk(cols, static_cast<std::int64_t>(t));
    if (blocks[t] > std::numeric_limits<std::int32_t>::max())
      throw std::length_error("key tile " + std::to_string(t) + " has " +
                              std::to_string(blocks[t]) +
                              " q blocks over its group's heads; the CUDA backward takes at most "
                              "2^31 - 1 per (key tile, kv head)");
  }
  for (std::int64_t h = 0; h < o.heads_kv; ++h)
    for (const std::int32_t t : cols.tile_order) {
      items.push_back({t, static_cast<std::int32_t>(h), blocks[t], walks[t]});
      work += double(blocks[t]) + kUnitOverhead;
    }
  constexpr double kNoSplit = std::numeric_limits<double>::infinity();
  BwdUnits best = cut(items, kNoSplit, o.sms);
  const double unsplit = best.predicted;
  if (o.sms > 1 && !items.empty()) {
    std::vector<Item> busiest_first = items;
    std::stable_sort(busiest_first.begin(), busiest_first.end(),
                     [](const Item& a, const Item& b) { return a.blocks > b.blocks; });
    const double per_sm = work / o.sms;
    double best_predicted = unsplit;
    BwdUnits chosen;
    auto consider = [&](BwdUnits u) {
      if (u.slots > kMaxSlotsPerSm * o.sms || u.predicted >= best_predicted) return;
      best_predicted = u.predicted;
      chosen = std::move(u);
    };
    consider(cut(busiest_first, kNoSplit, o.sms));
    for (const std::vector<Item>* order : {&items, &busiest_first})
      for (const double d : kTargetDivisors) consider(cut(*order, per_sm / d, o.sms));
    if (best_predicted < unsplit * (1 - kMinGain)) best = std::move(chosen);
  }
  best.predicted_unsplit = unsplit;
  // Past the first waves, units start one by one as SMs free up, out of step (BwdWalk).
  if (o.walk || best.units.size() > static_cast<std::size_t>(kInnerWalkWaves) * o.sms)
    for (BwdUnit& unit : best.units) unit.walk = o.walk.value_or(BwdWalk::kHeadsOuter);
  return best;
}

}  // namespace flexcp
