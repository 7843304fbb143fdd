// The kernel work list (DESIGN §3): where the planner and every kernel meet.
//
// Rows are split into tiles of `tile_rows`. For each tile, a CSR list of column intervals, each
// tagged with the band (mask rule) it comes from and how much masking it needs. One worker owns a
// tile and walks all its intervals, so outputs are written once, without atomics. The forward
// uses the row-major list (rows = q, columns = k); the backward's dK/dV pass uses the column-major
// list (rows = k, columns = q), built from the transposed bands.
#pragma once

#include <cstdint>
#include <vector>

#include "flexcp/band.h"
#include "flexcp/mask.h"
#include "kernels/worklist/tile_mask.h"

namespace flexcp {

struct WorkEntry {
  std::int64_t begin = 0;  // column interval [begin, end)
  std::int64_t end = 0;
  std::int32_t band = 0;  // index into WorkList::bands
  EntryMask mask = EntryMask::kNone;
};

enum class WorkListOrder { kRowMajor, kColumnMajor };

struct WorkListOptions {
  WorkListOrder order = WorkListOrder::kRowMajor;
  std::int64_t tile_rows = 128;
  // Unmasked intervals are cut to a multiple of this; the rest joins the masked edge.
  std::int64_t block_cols = 64;
};

struct WorkList {
  std::int64_t num_rows = 0;
  std::int64_t num_cols = 0;
  std::int64_t tile_rows = 0;
  std::vector<Band> bands;  // trimmed; in the list's row/column orientation
  std::vector<std::int64_t>
      tile_offsets;  // tile t owns entries [tile_offsets[t], tile_offsets[t+1])
  std::vector<WorkEntry> entries;
  std::vector<std::int64_t> tile_area;   // attended cells per tile
  std::vector<std::int32_t> tile_order;  // every tile, largest area first (ties: lower index)

  std::int64_t num_tiles() const { return static_cast<std::int64_t>(tile_area.size()); }
};

// From bands over (rows, columns) in row-major orientation (a mask's, or a plan's local work).
WorkList build_work_list(const std::vector<Band>& bands, std::int64_t num_rows,
                         std::int64_t num_cols, const WorkListOptions& options);

}  // namespace flexcp
