// NumPy .npy files (format 1.0, little-endian float32, C order): what `flexcp attn` reads and
// writes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flexcp::tools {

struct NpyArray {
  std::vector<std::int64_t> shape;
  std::vector<float> data;
};

// Throws flexcp::Error naming the file and what is wrong (dtype, order, truncation).
NpyArray read_npy(const std::string& path);
void write_npy(const std::string& path, const std::vector<std::int64_t>& shape, const float* data);

}  // namespace flexcp::tools
