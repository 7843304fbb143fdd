// The sm90 backward's units of work, cut from its column-major work list: where an item (key
// tile, kv head) would hold the GPU up, because the items are fewer than the SMs (short sequences)
// or one of them outweighs an SM's share (the first key tiles of a causal mask), it is split into
// units that walk consecutive parts of its q blocks. Each unit of a split item stores its fp32 dK
// and dV partials; the last to finish sums them in unit order (so the result does not depend on
// which one finished last) and writes dK and dV. Plain C++: the plan builds the units on the host
// and copies them to its workspace; the kernel reads BwdUnit.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/worklist/worklist.h"

namespace flexcp {

// How an item walks its q blocks (one block: `block_rows` rows of one q head; bwd_walk.h). The
// units of one kv head run side by side on the SMs, one per key tile; the walk keeps them reading
// the same Q and dO blocks, and adding into the same rows of dQ, at about the same time, so that
// L2 serves each block once instead of HBM once per tile. Which walk does that depends on the
// mask:
enum class BwdWalk : std::int32_t {
  // The q heads of the group in turn, each through the tile's entries from the first and each
  // entry from its first row: tiles whose walks are as long as their neighbours' but shifted
  // (sliding windows) stay a block or two apart, head after head.
  kHeadsOuter = 0,
  // The entries from the last, each entry from its last block, every q head of the group on a
  // block before the next: tiles whose walks end at the same row (causal and document masks,
  // full attention) and start together stay on the same block, however long each walk is. Taken
  // head by head, walks of unequal length drift apart by whole heads, and Q, dO and dQ of every
  // head in flight stop fitting in L2 (measured: a causal 4K block waited ~1000 cycles for its Q
  // and dO; this walk halves the wait, bench/results/h200-backward-2026-12-03.md section 8).
  // Only the first wave of units starts together: plans of more than kInnerWalkWaves waves walk
  // head by head throughout (with 15 waves, varlen causal 32K measured 8% slower this way).
  kHeadsInnerFromLast = 1,
};

// How the units of a split item combine their dK and dV partials (fp32, in partial slots).
enum class BwdPartials : std::int32_t {
  // Each unit stores its partials in its own slot (`slot + split`) and counts itself in on
  // `counter`; the last to arrive sums every slot in unit order and writes dK and dV. No unit
  // waits for another. The units of an item are consecutive in the order.
  kLastSums = 0,
  // The units add up in split order in one slot (`slot`): each waits until `counter` reads
  // `wait_for`, adds the slot (the sum of the units before it) to its own partials, stores the sum
  // (all but the last) and sets the counter to `then_set`; the last writes dK and dV. The slot and
  // its counter pass from item to item (the first unit of the next item waits for the last of
  // the one before), so a few slots serve a whole plan. A unit's predecessor on its counter is
  // earlier in the order, so it has been taken by a running CTA and does not wait on this one:
  // the wait ends while every CTA of the launch is resident (one per SM, as the scheduler needs).
  kChain = 1,
};

// How the plan cuts the items into units.
enum class BwdUnitKind : std::int32_t {
  // (key tile, kv head) items, kv head by kv head, busiest first; split (kLastSums) where the
  // scheduler would otherwise wait on the heaviest ones.
  kItems = 0,
  // One q head of an item per unit (or a few: BwdUnitOptions::unit_heads), its partials chained
  // (kChain), in sweeps: every key tile of a chunk for one q head, then the next head. Side-by-side
  // units then stay on one head and sweep
  // its rows together, so L2 serves Q, dO and dQ once per sweep; items of one kv head walk their
  // heads one after the other, and on masks whose tiles' walks differ in length (causal) they
  // drift apart by whole heads, and most of their blocks come from HBM
  // (bench/results/h200-backward-2026-12-04.md section 13).
  kHeads = 1,
};

// The order of the item units across kv heads.
enum class BwdOrder : std::int32_t {
  // Kv head by kv head, busiest tile first within each: the units running together share one kv
  // head's Q, dO and dQ in L2.
  kKvHeads = 0,
  // Busiest item first across the kv heads too, where the simulation says that finishes sooner
  // (kMinGain), unless the misses of an L2 model, costed in, say it does not (bwd_l2.h): better
  // balanced, but the units running together read every kv head's q blocks (MHA over causal
  // documents at 32K: misses 4% -> 46%, and 0.6x the speed).
  kAcrossKvHeads = 1,
};

// One unit: the q blocks [block_begin, block_end) of its item's walk.
struct BwdUnit {
  std::int32_t tile = 0;
  std::int32_t kv_head = 0;
  std::int32_t block_begin = 0;
  std::int32_t block_end = 0;
  BwdWalk walk = BwdWalk::kHeadsOuter;
  std::int32_t splits = 1;   // units of this unit's item (1: it writes dK and dV itself)
  std::int32_t split = 0;    // which of them
  std::int32_t slot = 0;     // the item's first partial slot (split items only)
  std::int32_t counter = 0;  // the item's counter (split items only)
  BwdPartials partials = BwdPartials::kLastSums;
  std::int32_t wait_for = 0;  // kChain: the counter's value when this unit's turn comes
  std::int32_t then_set = 0;  // kChain: the value it leaves for the next (0 by the slot's last)
};

struct BwdUnits {
  std::vector<BwdUnit> units;  // in the order the kernel's scheduler hands them out
  BwdUnitKind kind = BwdUnitKind::kItems;
  BwdOrder order = BwdOrder::kKvHeads;  // item units: the order they were put in
  std::int64_t slots = 0;               // partial slots: fp32 dK and dV of one key tile each
  std::int64_t counters = 0;  // kItems: split items, one arrival counter each; kHeads: slots
  // The scheduler's makespan in q blocks (one block of one head against one key tile), as
  // simulated on the SMs for the chosen units and for the unsplit items in their first order.
  double predicted = 0;
  double predicted_unsplit = 0;
};

struct BwdUnitOptions {
  int sms = 132;        // persistent CTAs (one per SM)
  int block_rows = 64;  // q rows per block of the kernel
  std::int64_t heads_kv = 1;
  std::int64_t group = 1;       // q heads per kv head
  std::int64_t head_dim = 128;  // the L2 model's block size (bwd_l2.h)
  std::optional<BwdWalk> walk;  // every item unit's walk; empty: bwd_tile_walk's, within two waves
  std::optional<BwdOrder> order;    // item units; empty: the plan's rule (plan_bwd_units)
  std::optional<BwdUnitKind> kind;  // empty: the plan's rule (plan_bwd_units)
  // Head units: q heads of the group per unit (the last unit of an item takes what is left);
  // empty: the plan's (kHeadsPerUnit, or more where one head's walk is short: plan_bwd_units).
  std::optional<std::int64_t> unit_heads;
  // The device memory's peak bandwidth per SM in GB/s (0: not known): where it is under
  // kShortPlanHeadsBandwidth, plans of few items take head units too (plan_bwd_units).
  double memory_gbs_per_sm = 0;
};

// Plans of at most kInnerWalkWaves waves of items walk from the last block and keep in step;
// they take head units (of two q heads) only where the device memory serves under this many GB/s
// per SM (an H100 SXM's 3.35 TB/s on 132 SMs: 25; an H200's 4.8-4.9 TB/s: 37), their walks drift
// apart (bwd_walk_drift at least the rule's 0.28, however short a head's walk) and their items
// fill at least kShortPlanHeadsMinWave of a wave. Measured on an H100 (GQA 64:8,
// bench/results/h100-2026-12-06.md section 7), head units of two q heads against item units:
// causal 2K and 4K +27% and +7.5%, causal documents +11% and +7% (5 and 9 blocks a head), a shared
// question +4.5% and +12%; at 1K (64 items on 132 SMs) every mask 2-30% slower; prefix-LM (drift
// 0.27) -18% at 2K, +7% at 4K. On an H200: causal 2K and 4K level, the shared question 4K -3%.
inline constexpr double kShortPlanHeadsBandwidth = 30;
// Items per SM at least, for those head units: between the 1K plans' 64 items on 132 SMs (every
// mask slower) and the 2K plans' 128 (causal, causal documents and a shared question faster).
inline constexpr double kShortPlanHeadsMinWave = 0.75;

// Head units' q heads each, unless the options ask otherwise or the walks are short: two. Each unit
// reads and stores its item's 128 KB slot, so fewer units mean less slot traffic, but side-by-side
// units then drift apart by up to that many heads. Measured on the H200 (GQA 64:8, bench/results/
// h200-backward-2026-12-04.md section 16): two heads against one +0.5% (causal 32K) to +3.5%
// (causal documents 16K), nowhere slower; four against two -3% (causal) to +0.5%.
inline constexpr std::int64_t kHeadsPerUnit = 2;

// Blocks of one item's walk: group x the tile's blocks (an entry of n rows has ceil(n /
// block_rows)).
std::int64_t bwd_item_blocks(const WorkList& cols, std::int64_t tile, const BwdUnitOptions& o);

// How far apart the tiles' walks drift: over the q blocks, the spread of the lengths (blocks of one
// q head) of the tiles whose walks visit each block, relative to their mean (the root of the
// summed squared deviations over the summed squared means). Tiles that share q blocks and walk
// them head by head stay in step where their walks are equally long (full, full documents,
// sliding windows: 0 to ~0.16) and drift apart by whole heads where they are not (causal: 0.30),
// so that more q heads' blocks are in L2 at once.
double bwd_walk_drift(const WorkList& cols, const BwdUnitOptions& o);

// How far apart side-by-side tiles' walks start: over the tiles with work in tile order, cut into
// waves of `sms` (the tiles that run together), the distinct q blocks a wave's walks start at, per
// tile. Tiles that start together (full attention, full documents, block-causal chunks: a few
// percent) read each q block at about the same time; tiles that start a block or two apart
// (sliding windows, causal: ~1) read a different block each, so that a block read by one waits in
// L2 through every other tile's reads until its neighbour gets there.
double bwd_walk_shift(const WorkList& cols, const BwdUnitOptions& o);

// Plans with more units than this many per SM walk head by head (BwdWalk).
inline constexpr int kInnerWalkWaves = 2;

// The walk of tile `tile`'s items in a plan of at most kInnerWalkWaves waves: kHeadsInnerFromLast
// where its last q row is a neighbouring tile's last too, else kHeadsOuter.
BwdWalk bwd_tile_walk(const WorkList& cols, std::int64_t tile);

// Head units' sweeps take at most this many key tiles (with work) at a time: their chained slots
// are twice that (the next chunk's first units may start before the last ones of this chunk end),
// 64 MB at head dim 128.
inline constexpr int kHeadSweepTiles = 256;

// The units for `cols` (tiles of keys, intervals of q rows): the items as they are, kv head by kv
// head and busiest tile first (each kv head's Q and dO stay in L2 while its tiles run), unless a
// split, or the busiest-first order across kv heads (BwdOrder, where its units keep their q
// blocks few), is predicted to finish sooner by more than the split's own cost (its partials'
// traffic, counted in the simulation). Plans of many waves (or of
// few on slow memory: kShortPlanHeadsBandwidth) whose items' walks drift apart (bwd_walk_drift) or
// start apart (bwd_walk_shift), and are long enough to pay for one slot's traffic per unit, get
// head units (BwdUnitKind::kHeads) instead, when the group has more than one q head. Throws
// std::length_error if one item has 2^31 blocks or more.
BwdUnits plan_bwd_units(const WorkList& cols, const BwdUnitOptions& o);

}  // namespace flexcp
