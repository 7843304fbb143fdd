// Band: the one geometric primitive under masks, plans, work lists and kernels. Public because
// plans hand each rank its local work as bands.
//
// A band is the set of cells (x, y) with x in [row_begin, row_end) and y in [begin(x), end(x)):
//   begin(x) = max(begin_min, begin_off + begin_slope * x)
//   end(x)   = min(end_max,   end_off   + end_slope   * x)
// with slopes 0 or 1. Every slice type of DESIGN §2 is a band over (q, k); a band transposed,
// clipped or intersected with another is again a band, so the backward's column-major view and the
// overlap check reuse the same code.
//
// NOTE: begin(x) and end(x) never decrease and grow by at most 1 per row. Validation and the tile
// spans below rely on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "flexcp/export.h"
#include "flexcp/mask.h"

#if defined(__CUDACC__)
#define FLEXCP_HOST_DEVICE __host__ __device__
#else
#define FLEXCP_HOST_DEVICE
#endif

namespace flexcp {

struct Band {
  std::int64_t row_begin = 0;
  std::int64_t row_end = 0;
  std::int64_t begin_min = 0;
  std::int64_t begin_off = 0;
  std::int64_t begin_slope = 0;
  std::int64_t end_max = 0;
  std::int64_t end_off = 0;
  std::int64_t end_slope = 0;

  FLEXCP_HOST_DEVICE std::int64_t begin(std::int64_t x) const {
    const std::int64_t linear = begin_off + begin_slope * x;
    return linear > begin_min ? linear : begin_min;
  }
  FLEXCP_HOST_DEVICE std::int64_t end(std::int64_t x) const {
    const std::int64_t linear = end_off + end_slope * x;
    return linear < end_max ? linear : end_max;
  }
  FLEXCP_HOST_DEVICE bool contains(std::int64_t x, std::int64_t y) const {
    return x >= row_begin && x < row_end && y >= begin(x) && y < end(x);
  }
};

// What a tile of rows [row0, row1) needs from a band: the tile's rows inside the band, the union
// `span` of their columns, and the columns `inner` that every one of those rows attends. Columns in
// span but outside inner need element masking; inside inner only rows outside [rows_begin,
// rows_end) are masked (none when the whole tile lies in the band).
struct TileSpan {
  std::int64_t rows_begin = 0;
  std::int64_t rows_end = 0;
  std::int64_t span_begin = 0;
  std::int64_t span_end = 0;
  std::int64_t inner_begin = 0;
  std::int64_t inner_end = 0;
};

// `band` must be trimmed (see trim_band): then every row between its first and last is non-empty.
// Shared by the host work-list builder and device code.
FLEXCP_HOST_DEVICE inline TileSpan band_tile_span(const Band& band, std::int64_t row0,
                                                  std::int64_t row1) {
  TileSpan s;
  s.rows_begin = row0 > band.row_begin ? row0 : band.row_begin;
  s.rows_end = row1 < band.row_end ? row1 : band.row_end;
  if (s.rows_begin >= s.rows_end) {
    s.rows_begin = s.rows_end = row0;
    return s;
  }
  // begin and end never decrease with the row, so the extremes sit at the first and last rows.
  s.span_begin = band.begin(s.rows_begin);
  s.span_end = band.end(s.rows_end - 1);
  s.inner_begin = band.begin(s.rows_end - 1);
  s.inner_end = band.end(s.rows_begin);
  if (s.inner_end < s.inner_begin) s.inner_end = s.inner_begin;
  return s;
}

// The band of one slice over global (q, k) coordinates.
FLEXCP_API Band slice_band(const Slice& slice);

// Slices as trimmed bands, empty ones left out, in slice order: how every consumer of a mask
// (validation, plans, work lists, kernels) sees it. `source`, when given, receives the index of
// each band's slice.
FLEXCP_API std::vector<Band> slice_bands(const std::vector<Slice>& slices,
                                         std::vector<std::size_t>* source = nullptr);
inline std::vector<Band> mask_bands(const Mask& mask) {
  return slice_bands(mask.slices());
}

// The band with its rows cut to the non-empty ones (row_begin == row_end when it has none).
FLEXCP_API Band trim_band(const Band& band);

// The same cells seen column-major: rows are the old columns. Columns outside
// [0, num_cols) are never part of a trimmed band, so the result is exact.
FLEXCP_API Band transpose_band(const Band& band);

// Cells in both bands.
FLEXCP_API Band intersect_bands(const Band& a, const Band& b);

// The first pair of bands found to share a cell (bands trimmed), and the cells they share.
struct BandOverlap {
  bool found = false;
  std::size_t first = 0, second = 0;  // indices into the bands, first < second
  Band cells;                         // trimmed: cells.row_begin is a shared row
};
FLEXCP_API BandOverlap find_overlap(const std::vector<Band>& bands);

// Number of cells of `band` in rows [x0, x1) and columns [y0, y1).
FLEXCP_API std::int64_t band_area(const Band& band, std::int64_t x0, std::int64_t x1,
                                  std::int64_t y0, std::int64_t y1);

}  // namespace flexcp
