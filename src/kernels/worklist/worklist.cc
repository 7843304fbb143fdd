#include "kernels/worklist/worklist.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include "flexcp/status.h"

namespace flexcp {
namespace {

// Blocks of block_cols columns that cover [begin, end) from begin.
std::int64_t blocks_of(std::int64_t begin, std::int64_t end, std::int64_t block_cols) {
  return end > begin ? (end - begin + block_cols - 1) / block_cols : 0;
}

// The unmasked interval of a tile's span: whole blocks of columns every row attends, [begin, end).
// Two choices: from the first such column (`inner_begin`), or from the first multiple of
// block_cols at or after it. The second starts every block, unmasked and after, on a multiple of
// block_cols where the first would start them one column off (a causal tile's diagonal ends one
// column short of a block, then a one-column masked block trails the unmasked run); it is taken
// unless it costs blocks or masked blocks. Aligned blocks also let the backward load their row
// statistics as pairs (bwd_softmax.cuh).
struct Unmasked {
  std::int64_t begin, end;
};
Unmasked unmasked_interval(const TileSpan& s, std::int64_t block_cols) {
  const auto at = [&](std::int64_t begin) {
    const std::int64_t len =
        std::max<std::int64_t>(0, s.inner_end - begin) / block_cols * block_cols;
    return Unmasked{begin, begin + len};
  };
  // (blocks, masked blocks) of the span with `u` unmasked; an empty `u` leaves one masked entry.
  const auto cost = [&](Unmasked u) {
    const std::int64_t masked = u.begin == u.end ? blocks_of(s.span_begin, s.span_end, block_cols)
                                                 : blocks_of(s.span_begin, u.begin, block_cols) +
                                                       blocks_of(u.end, s.span_end, block_cols);
    return std::pair{masked + (u.end - u.begin) / block_cols, masked};
  };
  const Unmasked first = at(s.inner_begin);
  const Unmasked aligned = at((s.inner_begin + block_cols - 1) / block_cols * block_cols);
  return cost(aligned) <= cost(first) ? aligned : first;
}

// The entries of one (band, tile) pair: at most three (a masked edge, the unmasked interval, the
// other masked edge), written from `out` on. Returns how many it wrote.
int tile_entries(const Band& band, std::int32_t band_idx, std::int64_t row0, std::int64_t row1,
                 std::int64_t block_cols, WorkEntry* out) {
  const TileSpan s = band_tile_span(band, row0, row1);
  if (s.rows_begin >= s.rows_end || s.span_begin >= s.span_end) return 0;
  const bool whole_tile = s.rows_begin == row0 && s.rows_end == row1;
  const Unmasked u = unmasked_interval(s, block_cols);
  if (u.begin == u.end) {
    out[0] = {s.span_begin, s.span_end, band_idx, EntryMask::kElements};
    return 1;
  }
  int n = 0;
  if (s.span_begin < u.begin) out[n++] = {s.span_begin, u.begin, band_idx, EntryMask::kElements};
  out[n++] = {u.begin, u.end, band_idx, whole_tile ? EntryMask::kNone : EntryMask::kRows};
  if (u.end < s.span_end) out[n++] = {u.end, s.span_end, band_idx, EntryMask::kElements};
  return n;
}

}  // namespace

WorkList build_work_list(const std::vector<Band>& row_bands, std::int64_t num_rows,
                         std::int64_t num_cols, const WorkListOptions& options) {
  if (options.tile_rows < 1)
    throw Error(
        Status::kInvalidArgument,
        "build_work_list: tile_rows is " + std::to_string(options.tile_rows) + ", expected >= 1");
  if (options.block_cols < 1)
    throw Error(
        Status::kInvalidArgument,
        "build_work_list: block_cols is " + std::to_string(options.block_cols) + ", expected >= 1");
  const bool row_major = options.order == WorkListOrder::kRowMajor;
  WorkList list;
  list.num_rows = row_major ? num_rows : num_cols;
  list.num_cols = row_major ? num_cols : num_rows;
  list.tile_rows = options.tile_rows;
  for (const Band& b : row_bands) {
    const Band band = row_major ? trim_band(b) : transpose_band(trim_band(b));
    if (band.row_begin < band.row_end) list.bands.push_back(band);
  }
  const std::int64_t num_tiles = (list.num_rows + options.tile_rows - 1) / options.tile_rows;

  // Per tile, the bands touching it, counted first so that the CSR arrays are filled in one pass.
  std::vector<std::int64_t> count(num_tiles + 1, 0);
  for (const Band& b : list.bands)
    for (std::int64_t t = b.row_begin / options.tile_rows; t * options.tile_rows < b.row_end; ++t)
      ++count[t + 1];
  std::partial_sum(count.begin(), count.end(), count.begin());
  std::vector<std::int32_t> tile_bands(count.back());
  {
    std::vector<std::int64_t> fill(count.begin(), count.end() - 1);
    for (std::size_t i = 0; i < list.bands.size(); ++i) {
      const Band& b = list.bands[i];
      for (std::int64_t t = b.row_begin / options.tile_rows; t * options.tile_rows < b.row_end; ++t)
        tile_bands[fill[t]++] = static_cast<std::int32_t>(i);
    }
  }

  // The entries counted first, then written once: growing the list copied it into fresh pages
  // each time (a third of a million-token plan's time).
  list.tile_offsets.assign(num_tiles + 1, 0);
  list.tile_area.assign(num_tiles, 0);
  WorkEntry scratch[3];
  for (std::int64_t t = 0; t < num_tiles; ++t) {
    const std::int64_t row0 = t * options.tile_rows;
    const std::int64_t row1 = std::min(row0 + options.tile_rows, list.num_rows);
    std::int64_t n = 0;
    for (std::int64_t i = count[t]; i < count[t + 1]; ++i)
      n += tile_entries(list.bands[tile_bands[i]], tile_bands[i], row0, row1, options.block_cols,
                        scratch);
    list.tile_offsets[t + 1] = list.tile_offsets[t] + n;
  }
  // Written in place: the pass above counted exactly what this one writes.
  list.entries.resize(static_cast<std::size_t>(list.tile_offsets[num_tiles]));
  WorkEntry* out = list.entries.data();
  for (std::int64_t t = 0; t < num_tiles; ++t) {
    const std::int64_t row0 = t * options.tile_rows;
    const std::int64_t row1 = std::min(row0 + options.tile_rows, list.num_rows);
    for (std::int64_t i = count[t]; i < count[t + 1]; ++i) {
      const Band& b = list.bands[tile_bands[i]];
      out += tile_entries(b, tile_bands[i], row0, row1, options.block_cols, out);
      list.tile_area[t] += band_area(b, row0, row1, b.begin_min, b.end_max);
    }
  }
  // Every tile is listed (an empty one still writes out = 0 and lse = -inf), busiest first.
  list.tile_order.resize(num_tiles);
  std::iota(list.tile_order.begin(), list.tile_order.end(), 0);
  std::stable_sort(
      list.tile_order.begin(), list.tile_order.end(),
      [&](std::int32_t a, std::int32_t b) { return list.tile_area[a] > list.tile_area[b]; });
  return list;
}

}  // namespace flexcp
