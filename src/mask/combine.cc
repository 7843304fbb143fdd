// Masks combined pair by pair: the union and the intersection of masks over the same lengths,
// as the fewest slices (from_row_runs). Row by row: every mask's key intervals of the row come
// from its bands that cover it (a sweep keeps those bands), and are merged or intersected into
// runs. Cost: the rows the masks' slices cover, times the slices a row meets; never the pairs.
#include <algorithm>
#include <string>

#include "flexcp/band.h"
#include "flexcp/masks.h"
#include "flexcp/status.h"

namespace flexcp::masks {
namespace {

struct OwnedBand {
  Band band;
  std::size_t mask = 0;
};

void check_lengths(const char* fn, const std::vector<Mask>& masks) {
  if (masks.empty())
    throw Error(Status::kInvalidArgument,
                std::string("flexcp::masks::") + fn + ": no masks, expected at least one");
  for (std::size_t i = 1; i < masks.size(); ++i)
    if (masks[i].seqlen_q() != masks[0].seqlen_q() || masks[i].seqlen_k() != masks[0].seqlen_k())
      throw Error(Status::kInvalidArgument,
                  std::string("flexcp::masks::") + fn + ": masks[" + std::to_string(i) + "] is " +
                      std::to_string(masks[i].seqlen_q()) + " x " +
                      std::to_string(masks[i].seqlen_k()) + " and masks[0] " +
                      std::to_string(masks[0].seqlen_q()) + " x " +
                      std::to_string(masks[0].seqlen_k()) + ", expected the same lengths");
}

// Sorted, touching intervals joined (a valid mask's intervals of a row never overlap).
void join(std::vector<Range>& row) {
  std::sort(row.begin(), row.end(), [](Range a, Range b) { return a.begin < b.begin; });
  std::size_t kept = 0;
  for (const Range& r : row) {
    if (kept > 0 && r.begin <= row[kept - 1].end)
      row[kept - 1].end = std::max(row[kept - 1].end, r.end);
    else
      row[kept++] = r;
  }
  row.resize(kept);
}

// Calls f(x, rows) for every row x that a band of some mask covers, in order; rows[m] holds mask
// m's key intervals of row x, sorted and joined.
template <class F>
void for_each_row(const std::vector<Mask>& masks, F&& f) {
  std::vector<OwnedBand> bands;
  for (std::size_t m = 0; m < masks.size(); ++m)
    for (const Band& b : mask_bands(masks[m])) bands.push_back({b, m});
  std::sort(bands.begin(), bands.end(), [](const OwnedBand& a, const OwnedBand& b) {
    return a.band.row_begin < b.band.row_begin;
  });
  std::vector<OwnedBand> active;
  std::vector<std::vector<Range>> rows(masks.size());
  std::size_t next = 0;
  std::int64_t x = 0;
  while (next < bands.size() || !active.empty()) {
    if (active.empty()) x = std::max(x, bands[next].band.row_begin);  // skip rows nothing covers
    for (; next < bands.size() && bands[next].band.row_begin <= x; ++next)
      active.push_back(bands[next]);
    for (auto& r : rows) r.clear();
    for (const OwnedBand& b : active) rows[b.mask].push_back({b.band.begin(x), b.band.end(x)});
    for (auto& r : rows) join(r);
    f(x, rows);
    ++x;
    std::erase_if(active, [x](const OwnedBand& b) { return b.band.row_end <= x; });
  }
}

// Every row's runs of the keys any mask attends: sorted by row, then by key, maximal.
std::vector<RowRun> united_runs(const std::vector<Mask>& masks) {
  std::vector<RowRun> runs;
  std::vector<Range> all;
  for_each_row(masks, [&](std::int64_t x, const std::vector<std::vector<Range>>& rows) {
    all.clear();
    for (const auto& r : rows) all.insert(all.end(), r.begin(), r.end());
    join(all);
    for (const Range& r : all) runs.push_back({x, r.begin, r.end});
  });
  return runs;
}

}  // namespace

std::vector<RowRun> row_runs(const Mask& mask) {
  return united_runs({mask});
}

Mask unite(const std::vector<Mask>& masks) {
  check_lengths("unite", masks);
  return from_row_runs(masks[0].seqlen_q(), masks[0].seqlen_k(), united_runs(masks));
}

Mask intersect(const std::vector<Mask>& masks) {
  check_lengths("intersect", masks);
  std::vector<RowRun> runs;
  std::vector<Range> common, next;
  for_each_row(masks, [&](std::int64_t x, const std::vector<std::vector<Range>>& rows) {
    common = rows[0];
    for (std::size_t m = 1; m < rows.size() && !common.empty(); ++m) {
      next.clear();
      std::size_t i = 0, j = 0;
      while (i < common.size() && j < rows[m].size()) {
        const std::int64_t begin = std::max(common[i].begin, rows[m][j].begin);
        const std::int64_t end = std::min(common[i].end, rows[m][j].end);
        if (begin < end) next.push_back({begin, end});
        (common[i].end < rows[m][j].end ? i : j) += 1;
      }
      std::swap(common, next);
    }
    for (const Range& r : common) runs.push_back({x, r.begin, r.end});
  });
  return from_row_runs(masks[0].seqlen_q(), masks[0].seqlen_k(), runs);
}

}  // namespace flexcp::masks
