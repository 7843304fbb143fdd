#include "kernels/worklist/bwd_units.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/worklist/bwd_l2.h"

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
// A head unit also waits for its turn, reads the slot and stores it again (2 x 128 KB at head dim
// 128 through L2): about one block more than a split unit's store. Measured against item units
// where L2 gains nothing (full documents, sliding window 1024): ~1.8 blocks a unit.
constexpr double kChainOverhead = 2.0;
// Head units where the walks of the tiles that share q blocks differ in length by at least
// kMinDrift (bwd_walk_drift: causal and causal documents 0.30, block-causal 2048 at 32K 0.29,
// prefix-LM 0.27, full documents 0.11-0.16, full 0), where the plan has more than kInnerWalkWaves
// waves of items (or fewer on slow memory), and where one head's walk averages at least
// kMinHeadUnitBlocks. Measured on the H200 (GQA 64:8, the protocol masks at 8K-32K,
// bench/results/h200-backward-2026-12-04.md section 14), head units against item units: causal,
// causal documents and window 4096 over documents shorter than the window (drift 0.30) +6% to +10%;
// block-causal +3% at 0.29, -4% at 0.26; prefix-LM (0.27) -5% to +1%; shared question (0.6-0.9) -3%
// at 8K, +21% at 32K; under 0.2, -1% to -11%, tracking the unit's own cost against its length (full
// documents -6% at 32 blocks a head, -1.6% at 110; window 1024 -9% to -11% at 13-17 blocks). Causal
// documents at 17 blocks a head still gained 6%: the floor below is a guess past that. Plans of
// fewer items: see kShortPlanHeadsBandwidth.
constexpr double kMinDrift = 0.28;
constexpr double kMinHeadUnitBlocks = 16;
// Head units also where side-by-side tiles' walks start apart (bwd_walk_shift at least
// kMinShift: sliding windows, causal), whatever their drift, in units of as few q heads (2, 4, ...,
// fewer than the group) as walk kMinShiftedUnitBlocks. Such tiles each read a different q block at
// a time, so a block waits in L2 through ~2 x 132 other blocks' reads before the neighbouring tile
// reads it again: items walking 8 heads each drift apart by a head or so, the blocks of two heads
// no longer fit, and the reads go to HBM. Measured on the H100 (GQA 64:8, protocol windows over
// documents, bench/results/h100-2026-12-05.md section 7), head units against item units: window
// 4096 at 32K (45 blocks a head, drift 0.18; units of 2 heads, 90 blocks) +16% to +20%, L2 hits
// 68% -> 90%; window 2048 at 16K and 32K (24 and 28 blocks a head; 48 and 56 a unit) +19% and
// +6-7.5%; window 1024 (13-17 blocks a head) in units of 2 heads (33 blocks at 32K) -4.7%, of 4
// heads (54-67 blocks) +4.5% at 8K, +6.4% at 16K, level at 32K. Units of 4 against 2 on windows
// 2048 and 4096: level (-0.8% to +1.7%). Prefix-LM (shift 0.52) stays below kMinShift: head units
// measured -5% to +1% there (H200). On the H200 (HBM 1.4x the H100's), window 4096 at 32K
// measured -1% in section 14 of h200-backward-2026-12-04.md, with an older kernel. Causal masks
// start apart too (shift 1): those under kMinHeadUnitBlocks (documents of ~1000 tokens) now take
// units of four by this rule, not measured.
constexpr double kMinShift = 0.9;
constexpr double kMinShiftedUnitBlocks = 40;
// Busiest first across kv heads balances the SMs better than kv head by kv head, but the units
// running together may then read so many q blocks that L2 loses them between one tile's visit and
// the next's. So where the simulation finds across sooner, the plan costs in each order's misses
// (bwd_l2.h): its finish time times (1 + kMissCost x the model's miss rate), a miss costing about
// two visits' time on an H100 (25 GB/s of HBM per SM; a device with more pays less per miss), and
// keeps across unless that makes it kMaxAcrossLoss later than kv head by kv head: the simulation
// sees neither L2 nor all a split costs (GQA 64:8 at 1K, kv head by kv head cut into 384 units
// and across into 160, both predicted to finish together, measured across 15% faster). Fitted to
// 35 A/B runs of the two orders, forced, on an H100 (bench/results/h100-2026-12-06.md sections 18
// and 20): it picks the faster of each but MHA 16 causal documents 4K (misses 22% against 38%,
// kv head by kv head 1.09x faster, taken across), among them MHA 16 causal documents at 32K (4%
// against 46%, kv head by kv head 1.69x), at 16K (7% against 46%, 1.38x), GQA 64:8 prefix-LM 32K
// (11% against 20%, 1.11x), GQA 64:8 item units at 2K-4K (the H200's kind there; 1.02-1.31x) and,
// the other way, MHA 16 causal 4K and 8K (6% against 10%, 3% against 12%: across 1.14x and
// 1.03x), MHA 16 full documents and block-causal at 8K-16K (across 1.02-1.05x) and GQA 64:8 full
// documents 32K (10% against 5%, across 1.05x). The nearest to the line: GQA 64:8 at 1K and
// prefix-LM 32K, within 1%.
constexpr double kMissCost = 2.0;
constexpr double kMissCostMemoryGbsPerSm = 25;
constexpr double kMaxAcrossLoss = 1.08;
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

// The persistent scheduler: the next unit goes to the SM that is free first. Returns when the
// last unit ends, or infinity as soon as that passes `bound` (a search for the shortest needs no
// more); `free_at` is scratch, kept as a min-heap.
double simulate(const std::vector<double>& costs, int sms, std::vector<double>& free_at,
                double bound = std::numeric_limits<double>::infinity()) {
  constexpr double kPast = std::numeric_limits<double>::infinity();
  // The first `sms` units start at once, each on an SM of its own (all are free at 0): their
  // ends are their costs, heaped in one pass rather than popped and pushed one by one. A short
  // plan (fewer units than SMs) ends with its longest unit, and needs no heap at all.
  const auto first = static_cast<std::ptrdiff_t>(std::min(costs.size(), std::size_t(sms)));
  double end = first > 0 ? *std::max_element(costs.begin(), costs.begin() + first) : 0.0;
  if (end >= bound) return kPast;
  if (first == static_cast<std::ptrdiff_t>(costs.size())) return end;
  free_at.assign(costs.begin(), costs.begin() + first);
  std::make_heap(free_at.begin(), free_at.end(), std::greater<>());
  for (auto c = costs.begin() + first; c != costs.end(); ++c) {
    std::pop_heap(free_at.begin(), free_at.end(), std::greater<>());
    free_at.back() += *c;
    end = std::max(end, free_at.back());
    if (end >= bound) return kPast;
    std::push_heap(free_at.begin(), free_at.end(), std::greater<>());
  }
  return end;
}

double simulate(const std::vector<double>& costs, int sms) {
  std::vector<double> free_at;
  return simulate(costs, sms, free_at);
}

std::int64_t splits_for(std::int64_t blocks, double target) {
  if (double(blocks) <= target) return 1;
  const auto want = static_cast<std::int64_t>(std::ceil(double(blocks) / target));
  return std::max<std::int64_t>(1, std::min(want, blocks / kMinUnitBlocks));
}

// A unit of `blocks` q blocks of an item cut into `splits`, in blocks' time.
double unit_cost(std::int64_t blocks, std::int64_t splits) {
  return double(blocks) + kUnitOverhead + (splits > 1 ? kSplitOverhead : 0.0);
}

// The units of `items` (in order) with every item cut to at most `target` blocks.
BwdUnits cut(const std::vector<Item>& items, double target, int sms) {
  BwdUnits u;
  std::size_t units = 0;  // reserved, as in head_units
  for (const Item& it : items) units += static_cast<std::size_t>(splits_for(it.blocks, target));
  u.units.reserve(units);
  std::vector<double> costs;
  costs.reserve(units);
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
      costs.push_back(unit_cost(unit.block_end - unit.block_begin, splits));
    }
    if (splits > 1) {
      u.slots += splits;
      u.counters += 1;
    }
  }
  u.predicted = simulate(costs, sms);
  return u;
}

// What cut() would predict, without making the units: its finish time (infinity past `bound`)
// and its slots. The search over splits tries 14 cuts; only the one it keeps is made.
struct CutCost {
  double predicted = 0;
  std::int64_t slots = 0;
};
struct CutScratch {
  std::vector<double> costs, free_at;
};
CutCost cut_cost(const std::vector<Item>& items, double target, int sms, double bound,
                 CutScratch& scratch) {
  CutCost c;
  // No schedule ends before its longest unit, nor before the average SM's share: a cut that
  // cannot beat `bound` even so is not made into units' costs nor simulated (simulate would
  // refuse it all the same: every cost is a whole number of blocks, so is the end). An item of
  // b blocks in s units has units of ceil(b / s) blocks at most.
  double total = 0, longest = 0;
  for (const Item& it : items) {
    const std::int64_t splits = splits_for(it.blocks, target);
    total += double(it.blocks) + double(splits) * unit_cost(0, splits);
    longest = std::max(longest, unit_cost((it.blocks + splits - 1) / splits, splits));
    if (splits > 1) c.slots += splits;
  }
  if (std::max(longest, total / sms) >= bound) {
    c.predicted = std::numeric_limits<double>::infinity();
    return c;
  }
  scratch.costs.clear();
  for (const Item& it : items) {  // (splits found again: cheaper than storing them, at 1M items)
    const std::int64_t splits = splits_for(it.blocks, target);
    for (std::int64_t s = 0; s < splits; ++s)
      scratch.costs.push_back(
          unit_cost(it.blocks * (s + 1) / splits - it.blocks * s / splits, splits));
  }
  c.predicted = simulate(scratch.costs, sms, scratch.free_at, bound);
  return c;
}

// The q heads of each head unit where the plan's items would drift apart on the SMs, or walk
// shifted so that drifting apart would cost them L2, and head units are long enough to pay for
// their turns; 0 where item units are better.
std::int64_t head_unit_heads(const WorkList& cols, const std::vector<std::int64_t>& blocks,
                             const BwdUnitOptions& o) {
  if (o.group < 2) return 0;
  double n = 0, sum = 0;
  for (const std::int64_t b : blocks)
    if (b > 0) n += 1, sum += double(b);
  const double items = n * double(o.heads_kv);
  if (items <= double(kInnerWalkWaves) * o.sms) {
    // Few items: L2 misses of their walks cost only where the memory is slow
    // (kShortPlanHeadsBandwidth), and head units pay only where the items fill most of a wave
    // (kShortPlanHeadsMinWave). The shift test's units of four (a shared question 2K) lost 21% on
    // an H200: not taken here.
    const bool slow_memory =
        o.memory_gbs_per_sm > 0 && o.memory_gbs_per_sm < kShortPlanHeadsBandwidth;
    return slow_memory && items >= kShortPlanHeadsMinWave * o.sms &&
                   bwd_walk_drift(cols, o) >= kMinDrift
               ? kHeadsPerUnit
               : 0;
  }
  const double per_head = sum / n / double(o.group);  // blocks of one q head's walk
  if (per_head >= kMinHeadUnitBlocks && bwd_walk_drift(cols, o) >= kMinDrift) return kHeadsPerUnit;
  if (bwd_walk_shift(cols, o) < kMinShift) return 0;
  for (std::int64_t heads = kHeadsPerUnit; heads < o.group; heads *= 2)
    if (per_head * double(heads) >= kMinShiftedUnitBlocks) return heads;
  return 0;
}

// Head units (BwdUnitKind::kHeads): per kv head, per chunk of at most kHeadSweepTiles tiles with
// work (busiest first), one sweep per unit's q heads (unit_heads of them) over the chunk's tiles;
// the chunks take turns on two sets of slots. Items without work stay whole, last (they write
// zeros).
BwdUnits head_units(const WorkList& cols, const std::vector<std::int64_t>& blocks,
                    const BwdUnitOptions& o) {
  std::vector<std::int32_t> busy, idle;
  for (const std::int32_t t : cols.tile_order) (blocks[t] > 0 ? busy : idle).push_back(t);
  const auto n = static_cast<std::int64_t>(busy.size());
  const std::int64_t chunks = (n + kHeadSweepTiles - 1) / kHeadSweepTiles;
  const std::int64_t per_chunk = chunks > 0 ? (n + chunks - 1) / chunks : 0;
  const std::int64_t unit_heads =
      std::clamp<std::int64_t>(o.unit_heads.value_or(kHeadsPerUnit), 1, o.group);
  const std::int64_t splits = (o.group + unit_heads - 1) / unit_heads;
  BwdUnits u;
  u.kind = BwdUnitKind::kHeads;
  // Units of the whole group are items in sweeps: nothing to chain.
  if (splits > 1) u.slots = u.counters = std::min<std::int64_t>(2, chunks * o.heads_kv) * per_chunk;
  // Reserved, so that a million-token plan's units (a quarter of a million) are written once,
  // not copied as the vector grows: half of such a plan's time went to fresh pages.
  u.units.reserve(static_cast<std::size_t>(o.heads_kv * (splits * n + std::int64_t(idle.size()))));
  std::vector<double> costs;
  costs.reserve(u.units.capacity());
  std::vector<std::int32_t> count(static_cast<std::size_t>(u.slots), 0);
  std::vector<std::size_t> last_on(static_cast<std::size_t>(u.slots), 0);
  std::int64_t sweep_set = 0;
  for (std::int64_t h = 0; h < o.heads_kv; ++h)
    for (std::int64_t c = 0; c < chunks; ++c, sweep_set ^= 1)
      for (std::int64_t j = 0; j < splits; ++j)
        for (std::int64_t i = c * per_chunk; i < std::min(n, (c + 1) * per_chunk); ++i) {
          const std::int32_t t = busy[static_cast<std::size_t>(i)];
          const std::int64_t per_head = blocks[t] / o.group;
          const std::int64_t head_end = std::min(o.group, (j + 1) * unit_heads);
          const auto slot = static_cast<std::int32_t>(sweep_set * per_chunk + i - c * per_chunk);
          BwdUnit unit;
          unit.tile = t;
          unit.kv_head = static_cast<std::int32_t>(h);
          unit.block_begin = static_cast<std::int32_t>(j * unit_heads * per_head);
          unit.block_end = static_cast<std::int32_t>(head_end * per_head);
          unit.walk = BwdWalk::kHeadsOuter;  // a head's blocks are one run of this walk
          unit.splits = static_cast<std::int32_t>(splits);
          unit.split = static_cast<std::int32_t>(j);
          if (splits > 1) {
            unit.slot = unit.counter = slot;
            unit.partials = BwdPartials::kChain;
            unit.wait_for = count[slot];
            unit.then_set = ++count[slot];
            last_on[slot] = u.units.size();
          }
          u.units.push_back(unit);
          costs.push_back(double(unit.block_end - unit.block_begin) + kUnitOverhead +
                          (splits > 1 ? kChainOverhead : 0.0));
        }
  for (std::int64_t s = 0; s < u.slots; ++s)
    if (count[s] > 0) u.units[last_on[s]].then_set = 0;  // ready for the next launch
  for (std::int64_t h = 0; h < o.heads_kv; ++h)
    for (const std::int32_t t : idle) {
      BwdUnit unit;
      unit.tile = t;
      unit.kv_head = static_cast<std::int32_t>(h);
      u.units.push_back(unit);
      costs.push_back(kUnitOverhead);
    }
  u.predicted = simulate(costs, o.sms);
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

double bwd_walk_drift(const WorkList& cols, const BwdUnitOptions& o) {
  // Each tile adds its length L (and L^2, and 1) to the q blocks it visits; a sweep over the
  // first and end blocks of its runs of blocks sums, for every q block, the squared deviations of
  // its tiles' lengths from their mean and the squared means, in O(entries log entries) time and
  // memory (a 2^31-row mask has 2^25 q blocks; its entries are far fewer).
  struct Edge {
    std::int64_t block;
    double length;  // negative at an entry's end
  };
  std::vector<Edge> edges;
  edges.reserve(2 * cols.entries.size());
  std::vector<std::pair<std::int64_t, std::int64_t>> runs;  // one tile's [first, end) blocks
  for (std::int64_t t = 0; t < cols.num_tiles(); ++t) {
    // The tile's q blocks, each once (two entries may end and start in one block): runs of
    // blocks, merged where they touch; its length, the blocks in them.
    runs.clear();
    for (std::int64_t e = cols.tile_offsets[t]; e < cols.tile_offsets[t + 1]; ++e) {
      const WorkEntry& entry = cols.entries[e];
      if (entry.end > entry.begin)
        runs.emplace_back(entry.begin / o.block_rows,
                          (entry.end + o.block_rows - 1) / o.block_rows);
    }
    std::sort(runs.begin(), runs.end());
    std::size_t merged = 0;
    for (std::size_t r = 0; r < runs.size(); ++r) {
      if (merged > 0 && runs[r].first <= runs[merged - 1].second)
        runs[merged - 1].second = std::max(runs[merged - 1].second, runs[r].second);
      else
        runs[merged++] = runs[r];
    }
    runs.resize(merged);
    double length = 0;
    for (const auto& [first, end] : runs) length += double(end - first);
    for (const auto& [first, end] : runs) {
      edges.push_back({first, length});
      edges.push_back({end, -length});
    }
  }
  std::sort(edges.begin(), edges.end(),
            [](const Edge& a, const Edge& b) { return a.block < b.block; });
  double count = 0, sum = 0, sum2 = 0, deviation = 0, mean2 = 0;
  for (std::size_t i = 0; i < edges.size(); ++i) {
    const double sign = edges[i].length < 0 ? -1 : 1;
    count += sign, sum += edges[i].length, sum2 += sign * edges[i].length * edges[i].length;
    const std::int64_t next = i + 1 < edges.size() ? edges[i + 1].block : edges[i].block;
    if (count < 0.5 || next == edges[i].block) continue;
    const double run = double(next - edges[i].block);  // blocks with these tiles
    deviation += run * std::max(0.0, sum2 - sum * sum / count);
    mean2 += run * sum * sum / count;
  }
  return mean2 > 0 ? std::sqrt(deviation / mean2) : 0.0;
}

double bwd_walk_shift(const WorkList& cols, const BwdUnitOptions& o) {
  std::vector<std::int64_t> firsts;  // each tile's first q block, tiles with work in tile order
  firsts.reserve(cols.tile_order.size());
  for (const std::int32_t t : cols.tile_order) {
    std::int64_t first = std::numeric_limits<std::int64_t>::max();
    for (std::int64_t e = cols.tile_offsets[t]; e < cols.tile_offsets[t + 1]; ++e)
      if (cols.entries[e].end > cols.entries[e].begin)
        first = std::min(first, cols.entries[e].begin / o.block_rows);
    if (first != std::numeric_limits<std::int64_t>::max()) firsts.push_back(first);
  }
  const auto wave = static_cast<std::ptrdiff_t>(std::max(o.sms, 1));
  std::int64_t distinct = 0;
  for (auto begin = firsts.begin(); begin != firsts.end();) {
    const auto end = firsts.end() - begin > wave ? begin + wave : firsts.end();
    std::sort(begin, end);
    distinct += std::unique(begin, end) - begin;
    begin = end;
  }
  return firsts.empty() ? 0.0 : double(distinct) / double(firsts.size());
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
  CutScratch scratch;
  const double unsplit = cut_cost(items, kNoSplit, o.sms, kNoSplit, scratch).predicted;
  // A forced walk asks for item units (it compares the walks), unless head units are asked too.
  // Decided before the item units' splits are searched, which head units would not use.
  const std::int64_t unit_heads = o.kind || o.walk ? 0 : head_unit_heads(cols, blocks, o);
  const bool heads = o.kind ? *o.kind == BwdUnitKind::kHeads : unit_heads > 0;
  if (heads && o.group > 1) {
    BwdUnitOptions ho = o;
    ho.unit_heads = o.unit_heads.value_or(unit_heads > 0 ? unit_heads : kHeadsPerUnit);
    BwdUnits h = head_units(cols, blocks, ho);
    h.predicted_unsplit = unsplit;
    return h;
  }
  // The best cut of each order: kv head by kv head (unsplit unless a split is predicted
  // kMinGain sooner), and busiest first across the kv heads where it is predicted sooner still.
  struct Choice {
    const std::vector<Item>* order;
    double target, predicted;
  };
  Choice kv{&items, kNoSplit, unsplit};
  std::optional<Choice> across;
  std::vector<Item> busiest_first;
  if (o.sms > 1 && !items.empty()) {
    const double per_sm = work / o.sms;
    const auto consider = [&](const std::vector<Item>& order, double target, double bound,
                              std::optional<Choice>& best) {
      const CutCost c = cut_cost(order, target, o.sms, best ? best->predicted : bound, scratch);
      if (c.slots <= kMaxSlotsPerSm * o.sms && c.predicted < (best ? best->predicted : bound))
        best = Choice{&order, target, c.predicted};
    };
    std::optional<Choice> split;
    for (const double d : kTargetDivisors) consider(items, per_sm / d, unsplit, split);
    if (split && split->predicted < unsplit * (1 - kMinGain)) kv = *split;
    if (o.order != BwdOrder::kKvHeads) {
      busiest_first = items;
      std::stable_sort(busiest_first.begin(), busiest_first.end(),
                       [](const Item& a, const Item& b) { return a.blocks > b.blocks; });
      const double bound = std::min(kv.predicted, unsplit * (1 - kMinGain));
      consider(busiest_first, kNoSplit, bound, across);
      for (const double d : kTargetDivisors) consider(busiest_first, per_sm / d, bound, across);
    }
  }
  const auto make = [&](const Choice& c) {
    BwdUnits u = cut(*c.order, c.target, o.sms);
    u.predicted_unsplit = unsplit;
    u.order = c.order == &items ? BwdOrder::kKvHeads : BwdOrder::kAcrossKvHeads;
    // Past the first waves, units start one by one as SMs free up, out of step (BwdWalk).
    if (o.walk || u.units.size() > static_cast<std::size_t>(kInnerWalkWaves) * o.sms)
      for (BwdUnit& unit : u.units) unit.walk = o.walk.value_or(BwdWalk::kHeadsOuter);
    return u;
  };
  BwdUnits best = make(kv);
  if (across) {
    BwdUnits a = make(*across);
    // Asked for, the order across is taken where it is predicted sooner; else unless the L2
    // model's misses of each order's q blocks, costed in, make it kMaxAcrossLoss later.
    const double cost =
        kMissCost * (o.memory_gbs_per_sm > 0 ? kMissCostMemoryGbsPerSm / o.memory_gbs_per_sm : 1.0);
    const BwdL2Model model{.head_dim = o.head_dim};
    if (o.order == BwdOrder::kAcrossKvHeads ||
        a.predicted * (1 + cost * bwd_l2_miss_rate(cols, a.units, o, model)) <
            kMaxAcrossLoss * best.predicted *
                (1 + cost * bwd_l2_miss_rate(cols, best.units, o, model)))
      best = std::move(a);
  }
  return best;
}

}  // namespace flexcp
