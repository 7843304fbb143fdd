// Dispatch: cutting the sequence into chunks and giving every rank the same number of chunks with
// as equal a share of the attention cost as the solver finds.
#include <algorithm>
#include <initializer_list>
#include <numeric>
#include <queue>
#include <set>
#include <string>
#include <tuple>

#include "flexcp/status.h"
#include "plan/plan_internal.h"

namespace flexcp::plan_detail {
namespace {

constexpr std::int64_t kRunLength = 4;  // chunks placed together before single chunks are balanced
constexpr double kBalanceTolerance = 0.002;  // refinement stops at max rank cost <= mean * 1.002
// Lightest ranks a refinement round offers the heaviest one a swap with: the largest gaps are
// there, and past them a failed round (no rank can take a swap) would cost O(W m^2 log m).
constexpr int kMaxLightTries = 32;

[[noreturn]] void fail(const std::string& message) {
  throw Error(Status::kInvalidArgument, "flexcp::make_plan: " + message);
}

}  // namespace

std::int64_t ChunkIndex::chunk_of(std::int64_t row) const {
  const auto it = std::upper_bound(chunks.begin(), chunks.end(), row,
                                   [](std::int64_t r, const Range& c) { return r < c.begin; });
  return static_cast<std::int64_t>(it - chunks.begin()) - 1;
}

ChunkIndex index_bands(const std::vector<Band>& bands, std::vector<Range> chunks) {
  ChunkIndex index;
  index.chunks = std::move(chunks);
  const std::int64_t n = static_cast<std::int64_t>(index.chunks.size());
  index.offsets.assign(n + 1, 0);
  auto each_chunk = [&](const Band& b, auto&& fn) {
    if (b.row_begin >= b.row_end) return;
    for (std::int64_t c = index.chunk_of(b.row_begin); c < n && index.chunks[c].begin < b.row_end;
         ++c)
      if (!index.chunks[c].empty()) fn(c);
  };
  for (const Band& b : bands) each_chunk(b, [&](std::int64_t c) { ++index.offsets[c + 1]; });
  std::partial_sum(index.offsets.begin(), index.offsets.end(), index.offsets.begin());
  index.band_ids.resize(index.offsets.back());
  std::vector<std::int64_t> fill(index.offsets.begin(), index.offsets.end() - 1);
  for (std::size_t i = 0; i < bands.size(); ++i)
    each_chunk(bands[i],
               [&](std::int64_t c) { index.band_ids[fill[c]++] = static_cast<std::int32_t>(i); });
  return index;
}

std::vector<Range> equal_chunks(std::int64_t length, std::int64_t n) {
  std::vector<Range> chunks(n);
  for (std::int64_t i = 0; i < n; ++i) chunks[i] = {i * length / n, (i + 1) * length / n};
  return chunks;
}

std::vector<Range> cut_chunks(std::int64_t seqlen, const PlanOptions& o) {
  const int world = o.world_size;
  if (o.chunk_size > 0) {
    const std::int64_t c = o.chunk_size, n = (seqlen + c - 1) / c;
    if (n % world != 0) {
      std::string near;
      for (std::int64_t m : {n / world * world, (n / world + 1) * world}) {
        if (m < world || m > seqlen) continue;
        const std::int64_t size = (seqlen + m - 1) / m;
        if ((seqlen + size - 1) / size == m)
          near += (near.empty() ? "" : " or ") + std::to_string(size) + " (" + std::to_string(m) +
                  " chunks)";
      }
      fail("chunk_size " + std::to_string(c) + " cuts " + std::to_string(seqlen) + " tokens into " +
           std::to_string(n) + " chunks, not a multiple of world_size " + std::to_string(world) +
           " (every rank holds as many chunks); " +
           (near.empty() ? "" : "chunk_size " + near + " would, as would ") +
           "chunks_per_rank instead");
    }
    std::vector<Range> chunks(n);
    for (std::int64_t i = 0; i < n; ++i) chunks[i] = {i * c, std::min((i + 1) * c, seqlen)};
    return chunks;
  }
  const std::int64_t per_rank = o.chunks_per_rank;
  if (per_rank * world > seqlen)
    fail("chunks_per_rank " + std::to_string(per_rank) + " on " + std::to_string(world) +
         " ranks is " + std::to_string(per_rank * world) + " chunks for " + std::to_string(seqlen) +
         " tokens, expected at most one chunk per token");
  return equal_chunks(seqlen, per_rank * world);
}

std::vector<std::int64_t> chunks_per_rank_choices(std::int64_t seqlen, int world) {
  std::vector<std::int64_t> choices;
  for (std::int64_t p : kChunksPerRankChoices)
    if (seqlen / (world * p) >= kMinChunkTokens) choices.push_back(p);
  if (!choices.empty()) return choices;
  for (std::int64_t p : {4, 2})
    if (seqlen / (world * p) >= kMinChunkTokens) return {p};
  return {1};
}

std::vector<std::int64_t> chunk_costs(const std::vector<Band>& bands, const ChunkIndex& index) {
  std::vector<std::int64_t> cost(index.chunks.size(), 0);
  for (std::size_t c = 0; c < index.chunks.size(); ++c)
    for (std::int64_t i = index.offsets[c]; i < index.offsets[c + 1]; ++i) {
      const Band& b = bands[index.band_ids[i]];
      cost[c] += band_area(b, index.chunks[c].begin, index.chunks[c].end, b.begin_min, b.end_max);
    }
  return cost;
}

namespace {

// Longest first into the least-loaded rank that still has room for another of its
// ceil(n / world) chunks.
std::vector<int> greedy(const std::vector<std::int64_t>& costs, int world) {
  const std::int64_t n = static_cast<std::int64_t>(costs.size());
  const std::int64_t per_rank = (n + world - 1) / world;
  std::vector<int> owner(n, -1);
  std::vector<std::int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return costs[a] > costs[b]; });
  using Slot = std::tuple<std::int64_t, int, std::int64_t>;  // (load, rank, count)
  std::priority_queue<Slot, std::vector<Slot>, std::greater<>> open;
  for (int r = 0; r < world; ++r) open.push({0, r, 0});
  for (std::int64_t c : order) {
    auto [load, r, count] = open.top();
    open.pop();
    owner[c] = r;
    if (count + 1 < per_rank) open.push({load + costs[c], r, count + 1});
  }
  return owner;
}

// Swap one chunk of the heaviest rank with a lighter chunk of a lighter rank (among the
// kMaxLightTries lightest, lightest first), the swap whose cost difference is closest to half the
// gap, until no swap lowers the heaviest rank. Loads live in an ordered set, so a round costs
// O(log W + m^2 log m) for m chunks per rank.
void refine(const std::vector<std::int64_t>& costs, int world, std::vector<int>& owner) {
  std::vector<std::int64_t> load(world, 0);
  std::vector<std::vector<std::int64_t>> mine(world);
  for (std::size_t c = 0; c < owner.size(); ++c) {
    load[owner[c]] += costs[c];
    mine[owner[c]].push_back(static_cast<std::int64_t>(c));
  }
  // Each rank's chunks stay sorted by cost (re-sorted after a swap), so a round searches them
  // without sorting.
  auto by_cost = [&](std::int64_t a, std::int64_t b) {
    return costs[a] < costs[b] || (costs[a] == costs[b] && a < b);
  };
  for (auto& m : mine) std::sort(m.begin(), m.end(), by_cost);
  std::set<std::pair<std::int64_t, int>> by_load;
  for (int r = 0; r < world; ++r) by_load.insert({load[r], r});
  // Exchanges chunks heavy[ai...] with light[bi...] (indices into mine[]), moving d of cost.
  auto move = [&](int heavy, int light, std::initializer_list<std::int64_t> ai,
                  std::initializer_list<std::int64_t> bi, std::int64_t d) {
    by_load.erase({load[heavy], heavy});
    by_load.erase({load[light], light});
    auto b = bi.begin();
    for (std::int64_t a : ai) {
      std::swap(mine[heavy][a], mine[light][*b]);
      owner[mine[heavy][a]] = heavy;
      owner[mine[light][*b]] = light;
      ++b;
    }
    load[heavy] -= d;
    load[light] += d;
    by_load.insert({load[heavy], heavy});
    by_load.insert({load[light], light});
    std::sort(mine[heavy].begin(), mine[heavy].end(), by_cost);
    std::sort(mine[light].begin(), mine[light].end(), by_cost);
  };
  // When no single chunk fits the gap (say, the heavy rank holds a few huge chunks and many tiny
  // ones), two for two: the pair sums whose difference is closest to half the gap.
  std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>> sums;  // (sum, i, j) of light
  auto swap_pairs = [&](int heavy, int light, std::int64_t gap) {
    const auto& hc = mine[heavy];
    const auto& lc = mine[light];
    sums.clear();
    for (std::size_t i = 0; i < lc.size(); ++i)
      for (std::size_t j = i + 1; j < lc.size(); ++j)
        sums.push_back({costs[lc[i]] + costs[lc[j]], i, j});
    std::sort(sums.begin(), sums.end());
    std::int64_t best_d = 0, a1 = -1, a2 = -1, b1 = -1, b2 = -1;
    for (std::size_t i = 0; i < hc.size(); ++i)
      for (std::size_t j = i + 1; j < hc.size(); ++j) {
        const std::int64_t sum = costs[hc[i]] + costs[hc[j]];
        auto pos = std::lower_bound(sums.begin(), sums.end(),
                                    std::tuple{sum - gap / 2, std::int64_t{-1}, std::int64_t{-1}});
        for (auto cand : {pos, pos == sums.begin() ? sums.end() : std::prev(pos)}) {
          if (cand == sums.end()) continue;
          const std::int64_t d = sum - std::get<0>(*cand);
          if (d <= 0 || d >= gap) continue;
          if (a1 < 0 || std::min(d, gap - d) > std::min(best_d, gap - best_d))
            best_d = d, a1 = i, a2 = j, b1 = std::get<1>(*cand), b2 = std::get<2>(*cand);
        }
      }
    if (a1 < 0) return false;
    move(heavy, light, {a1, a2}, {b1, b2}, best_d);
    return true;
  };
  const std::int64_t max_rounds = 4 * static_cast<std::int64_t>(owner.size()) + 64;
  std::int64_t total = 0;
  for (std::int64_t c : costs) total += c;
  // Every swap splits runs of neighbouring chunks (more K/V ranges to move), so stop once the
  // heaviest rank is within kBalanceTolerance of the mean.
  const double good_enough = static_cast<double>(total) / world * (1.0 + kBalanceTolerance);
  for (std::int64_t round = 0; round < max_rounds; ++round) {
    const int heavy = std::prev(by_load.end())->second;
    if (static_cast<double>(load[heavy]) <= good_enough) break;
    bool swapped = false;
    int tries = 0;
    for (auto it = by_load.begin(); it->second != heavy && tries < kMaxLightTries; ++it, ++tries) {
      const int light = it->second;
      const std::int64_t gap = load[heavy] - load[light];
      if (gap <= 0) break;
      const std::vector<std::int64_t>& lc = mine[light];
      std::int64_t best_d = 0, best_a = -1, best_b = -1;
      for (std::size_t ai = 0; ai < mine[heavy].size(); ++ai) {
        const std::int64_t a = mine[heavy][ai];
        // Want costs[b] near costs[a] - gap / 2, with 0 < costs[a] - costs[b] < gap.
        const std::int64_t target = costs[a] - gap / 2;
        auto pos = std::lower_bound(lc.begin(), lc.end(), target,
                                    [&](std::int64_t b, std::int64_t t) { return costs[b] < t; });
        for (auto cand : {pos, pos == lc.begin() ? lc.end() : std::prev(pos)}) {
          if (cand == lc.end()) continue;
          const std::int64_t d = costs[a] - costs[*cand];
          if (d <= 0 || d >= gap) continue;
          if (best_a < 0 || std::min(d, gap - d) > std::min(best_d, gap - best_d))
            best_d = d, best_a = static_cast<std::int64_t>(ai), best_b = cand - lc.begin();
        }
      }
      if (best_a >= 0) {
        move(heavy, light, {best_a}, {best_b}, best_d);
      } else if (!swap_pairs(heavy, light, gap)) {
        continue;
      }
      swapped = true;
      break;
    }
    if (!swapped) break;
  }
}

}  // namespace

std::vector<int> assign_longest_first(const std::vector<std::int64_t>& costs, int world) {
  return greedy(costs, world);
}

std::vector<int> assign_chunks(const std::vector<std::int64_t>& costs, int world) {
  const std::int64_t n = static_cast<std::int64_t>(costs.size());
  const std::int64_t per_rank = n / world;
  // Runs of kRunLength neighbouring chunks are placed together first: neighbours attend mostly the
  // same keys, so a rank holding runs receives fewer, longer K/V ranges. Single chunks then move
  // between ranks to even out what the runs left.
  std::int64_t run = 1;
  for (std::int64_t g = kRunLength; g > 1; --g)
    if (per_rank % g == 0) {
      run = g;
      break;
    }
  std::vector<std::int64_t> run_costs(n / run, 0);
  for (std::int64_t c = 0; c < n; ++c) run_costs[c / run] += costs[c];
  std::vector<int> run_owner = greedy(run_costs, world);
  refine(run_costs, world, run_owner);
  std::vector<int> owner(n);
  for (std::int64_t c = 0; c < n; ++c) owner[c] = run_owner[c / run];
  refine(costs, world, owner);
  return owner;
}

}  // namespace flexcp::plan_detail
