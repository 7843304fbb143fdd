// The CUDA side of the build beside the Hopper kernels: device discovery, and device twins of the
// work-list geometry and the in-tile mask rule, so tests can check that host and device agree bit
// for bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flexcp/band.h"
#include "kernels/worklist/tile_mask.h"

namespace flexcp::cuda {

// Number of usable CUDA devices; 0 (and `why` filled) when there is no driver or no GPU.
int device_count(std::string* why = nullptr);

// Evaluates band_tile_span(bands[i], rows[2i], rows[2i+1]) on device 0, for each i.
std::vector<TileSpan> tile_spans_on_device(const std::vector<Band>& bands,
                                           const std::vector<std::int64_t>& rows);

// One row against one key block under one work entry: what attended_columns answers.
struct ColumnQuery {
  Band band;
  EntryMask mask = EntryMask::kNone;
  std::int64_t row = 0, c0 = 0, end = 0, width = 0;
};

// Evaluates attended_columns for each query on device 0 (the in-tile mask rule the kernels use).
std::vector<BlockColumns> attended_columns_on_device(const std::vector<ColumnQuery>& queries);

}  // namespace flexcp::cuda
