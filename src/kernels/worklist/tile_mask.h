// The in-tile mask rule (DESIGN §3): which columns of a key block one row attends, under one work
// entry. The one definition used by the CPU kernels, the sm90 kernel and the tests; header-only
// so that device code calls the same function.
#pragma once

#include <cstdint>

#include "flexcp/band.h"

namespace flexcp {

// How much masking a work entry needs (worklist.h), shared with device code.
enum class EntryMask : std::int32_t {
  kNone = 0,      // every row of the tile attends every column of the interval
  kRows = 1,      // rows of the tile outside [band.row_begin, band.row_end) attend none of it
  kElements = 2,  // test each (row, column) against the band
};

// Columns [lo, hi) attended, relative to the block's first column c0.
struct BlockColumns {
  std::int64_t lo = 0;
  std::int64_t hi = 0;
};

// Row `x` against the key block [c0, c0 + width) of an entry whose interval ends at `end` and
// whose columns come from `band` with masking `mask`: the columns it attends, clamped to the
// block and the interval (0 <= lo <= hi <= min(width, end - c0)).
FLEXCP_HOST_DEVICE inline BlockColumns attended_columns(const Band& band, EntryMask mask,
                                                        std::int64_t x, std::int64_t c0,
                                                        std::int64_t end, std::int64_t width) {
  const std::int64_t limit = end - c0 < width ? end - c0 : width;
  BlockColumns c{0, limit};
  if (mask == EntryMask::kNone) return c;
  if (x < band.row_begin || x >= band.row_end) return {0, 0};
  if (mask == EntryMask::kElements) {
    const std::int64_t lo = band.begin(x) - c0, hi = band.end(x) - c0;
    c.lo = lo < 0 ? 0 : (lo > limit ? limit : lo);
    c.hi = hi < c.lo ? c.lo : (hi > limit ? limit : hi);
  }
  return c;
}

}  // namespace flexcp
