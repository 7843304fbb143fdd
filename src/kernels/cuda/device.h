// The CUDA side of the build that exists before the Hopper kernels: device discovery, and the
// device twin of the work-list geometry, so tests can check that host and device agree bit for bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flexcp/band.h"

namespace flexcp::cuda {

// Number of usable CUDA devices; 0 (and `why` filled) when there is no driver or no GPU.
int device_count(std::string* why = nullptr);

// Evaluates band_tile_span(bands[i], rows[2i], rows[2i+1]) on device 0, for each i.
std::vector<TileSpan> tile_spans_on_device(const std::vector<Band>& bands,
                                           const std::vector<std::int64_t>& rows);

}  // namespace flexcp::cuda
