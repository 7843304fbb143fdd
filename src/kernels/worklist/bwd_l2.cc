#include "kernels/worklist/bwd_l2.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <queue>
#include <utility>
#include <vector>

namespace flexcp {
namespace {

// One modelled visit: the lockstep step it happens at and its entry's index.
struct Visit {
  std::int64_t step;
  std::int64_t entry;
};

// Counts over positions, for the LRU's stack distance: how many entries were visited last
// between two positions (a Fenwick tree).
class PrefixCounts {
 public:
  explicit PrefixCounts(std::size_t n) : tree_(n + 1, 0) {}
  void add(std::size_t i, int v) {
    for (++i; i < tree_.size(); i += i & (~i + 1)) tree_[i] += v;
  }
  std::int64_t sum(std::size_t i) const {  // positions [0, i]
    std::int64_t s = 0;
    for (++i; i > 0; i -= i & (~i + 1)) s += tree_[i];
    return s;
  }

 private:
  std::vector<std::int32_t> tree_;
};

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// The scheduler: each unit starts on the SM that frees first, at the step it frees.
std::vector<std::int64_t> start_steps(const std::vector<BwdUnit>& units, int sms) {
  std::vector<std::int64_t> start(units.size());
  using Free = std::pair<std::int64_t, int>;  // (step, SM)
  std::priority_queue<Free, std::vector<Free>, std::greater<>> free_at;
  for (int s = 0; s < std::max(sms, 1); ++s) free_at.push({0, s});
  for (std::size_t k = 0; k < units.size(); ++k) {
    const auto [at, sm] = free_at.top();
    free_at.pop();
    start[k] = at;
    free_at.push({at + std::max(0, units[k].block_end - units[k].block_begin), sm});
  }
  return start;
}

// In step order, stable (within a step, in the order of the units): a radix sort on the step's
// 16-bit digits.
void in_step_order(std::vector<Visit>& trace) {
  std::int64_t last_step = 0;
  for (const Visit& v : trace) last_step = std::max(last_step, v.step);
  std::vector<Visit> sorted(trace.size());
  std::vector<std::size_t> counts(std::size_t{1} << 16);
  for (int shift = 0; shift == 0 || (last_step >> shift) > 0; shift += 16) {
    std::fill(counts.begin(), counts.end(), 0);
    for (const Visit& v : trace) ++counts[static_cast<std::size_t>((v.step >> shift) & 0xFFFF)];
    std::size_t at = 0;
    for (std::size_t& c : counts) at += std::exchange(c, at);
    for (const Visit& v : trace)
      sorted[counts[static_cast<std::size_t>((v.step >> shift) & 0xFFFF)]++] = v;
    trace.swap(sorted);
  }
}

}  // namespace

double bwd_l2_miss_rate(const WorkList& cols, const std::vector<BwdUnit>& units,
                        const BwdUnitOptions& o, const BwdL2Model& model) {
  if (units.empty()) return 0.0;
  const std::int64_t rows = o.block_rows, group = o.group;
  // Per entry of the list: its blocks (walk_bwd_unit's: from its begin, the last maybe short)
  // and its first block's index.
  const std::size_t num_entries = cols.entries.size();
  std::vector<std::int64_t> blocks(num_entries), first(num_entries);
  std::int64_t q_blocks = 1;
  for (std::size_t e = 0; e < num_entries; ++e) {
    const WorkEntry& en = cols.entries[e];
    blocks[e] = en.end > en.begin ? ceil_div(en.end - en.begin, rows) : 0;
    first[e] = en.begin / rows;
    q_blocks = std::max(q_blocks, first[e] + blocks[e]);
  }
  std::int64_t visits = 0;
  for (const BwdUnit& u : units) visits += std::max(0, u.block_end - u.block_begin);
  if (visits == 0) return 0.0;
  // Sampled entries: (head h, block b) with (b + offset(h)) % every == 0; offsets spread by a
  // multiplicative hash, so that no head's sample lines up with another's.
  const std::int64_t every = std::max<std::int64_t>(1, ceil_div(visits, model.max_visits));
  const auto offset = [every](std::int64_t h) {
    return static_cast<std::int64_t>((static_cast<std::uint64_t>(h) * 0x9E3779B97F4A7C15ULL) >>
                                     33) %
           every;
  };
  const std::int64_t per_head = q_blocks / every + 2;  // sampled entries of a head, at most
  const auto entry_id = [&](std::int64_t h, std::int64_t b) {
    return h * per_head + (b + offset(h)) / every;
  };
  // Steps i of entry e (of head h) in [lo, hi) whose block is sampled, from the first.
  const auto sampled_steps = [&](std::int64_t e, std::int64_t h, std::int64_t lo, std::int64_t hi,
                                 auto&& f) {
    const std::int64_t r = (first[e] + lo + offset(h)) % every;
    for (std::int64_t i = lo + (r == 0 ? 0 : every - r); i < hi; i += every) f(i);
  };

  const std::vector<std::int64_t> start = start_steps(units, o.sms);

  // The sampled visits of each unit, in its walk's order (walk_bwd_unit), at their steps.
  std::vector<Visit> trace;
  trace.reserve(static_cast<std::size_t>(visits / every + 16));
  for (std::size_t k = 0; k < units.size(); ++k) {
    const BwdUnit& u = units[k];
    const std::int64_t e_begin = cols.tile_offsets[u.tile], e_end = cols.tile_offsets[u.tile + 1];
    const std::int64_t lo = u.block_begin, hi = u.block_end, h0 = u.kv_head * group;
    const auto visit = [&](std::int64_t pos, std::int64_t h, std::int64_t b) {
      trace.push_back({start[k] + pos - lo, entry_id(h, b)});
    };
    if (u.walk == BwdWalk::kHeadsInnerFromLast) {
      // From the last entry, each from its last block, every head on a block before the next.
      std::int64_t base = 0;  // the entry's first position
      for (std::int64_t e = e_end - 1; e >= e_begin && base < hi; --e) {
        const std::int64_t n = blocks[e];
        for (std::int64_t j = 0; j < group && base + n * group > lo; ++j) {
          // Position base + m * group + j is step n - 1 - m of the entry.
          const std::int64_t m_lo = std::max<std::int64_t>(0, ceil_div(lo - base - j, group));
          if (hi - 1 - base - j < 0) continue;
          const std::int64_t m_hi = std::min(n - 1, (hi - 1 - base - j) / group);
          if (m_lo > m_hi) continue;
          sampled_steps(e, h0 + j, n - 1 - m_hi, n - m_lo, [&](std::int64_t i) {
            visit(base + (n - 1 - i) * group + j, h0 + j, first[e] + i);
          });
        }
        base += n * group;
      }
    } else {
      // Head by head, each through the entries from the first.
      std::int64_t tile_blocks = 0;
      for (std::int64_t e = e_begin; e < e_end; ++e) tile_blocks += blocks[e];
      if (tile_blocks == 0) continue;
      for (std::int64_t j = lo / tile_blocks; j <= (hi - 1) / tile_blocks && j < group; ++j) {
        std::int64_t base = j * tile_blocks;
        for (std::int64_t e = e_begin; e < e_end; ++e) {
          const std::int64_t a = std::max<std::int64_t>(0, lo - base);
          const std::int64_t b = std::min(blocks[e], hi - base);
          if (a < b) {
            sampled_steps(e, h0 + j, a, b,
                          [&](std::int64_t i) { visit(base + i, h0 + j, first[e] + i); });
          }
          base += blocks[e];
        }
      }
    }
  }
  in_step_order(trace);

  // LRU: a visit hits where fewer entries than the cache holds were visited since its entry's
  // last visit (each counted at its own last visit).
  const double capacity =
      model.cache_bytes / double(rows * model.head_dim * (2 + 2 + 4)) / double(every);
  // Each entry's last visit, by the entry's rank among those visited (not by its id: a sparse
  // mask over a long sequence visits few of them).
  std::vector<std::int64_t> ids(trace.size());
  for (std::size_t i = 0; i < trace.size(); ++i) ids[i] = trace[i].entry;
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (Visit& v : trace) v.entry = std::lower_bound(ids.begin(), ids.end(), v.entry) - ids.begin();
  std::vector<std::int64_t> last(ids.size(), -1);
  PrefixCounts marks(trace.size());
  std::int64_t misses = 0, seen = 0;  // entries visited so far: one mark each
  for (std::size_t now = 0; now < trace.size(); ++now) {
    std::int64_t& prev = last[static_cast<std::size_t>(trace[now].entry)];
    if (prev < 0) {
      ++misses, ++seen;
    } else {
      // Fewer visits than the cache holds since: a hit without counting the entries.
      const auto since = static_cast<std::int64_t>(now) - prev - 1;
      if (double(since) >= capacity &&
          double(seen - marks.sum(static_cast<std::size_t>(prev))) >= capacity)
        ++misses;
      marks.add(static_cast<std::size_t>(prev), -1);
    }
    marks.add(now, 1);
    prev = static_cast<std::int64_t>(now);
  }
  return trace.empty() ? 0.0 : double(misses) / double(trace.size());
}

}  // namespace flexcp
