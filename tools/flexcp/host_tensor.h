// An owned host tensor of any flexcp dtype, for the tool's inputs and outputs.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "flexcp/tensor.h"

namespace flexcp::tools {

class HostTensor {
 public:
  HostTensor(DType dtype, std::vector<std::int64_t> shape);
  const TensorView& view() const { return view_; }
  std::int64_t numel() const { return view_.numel(); }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  // Values rounded to the dtype.
  void assign(const std::vector<float>& values);
  void fill_uniform(std::mt19937_64& rng, float amplitude);
  // NaN everywhere: an output the kernel does not write shows as NaN instead of a plausible 0.
  void poison();
  std::vector<float> to_float() const;

 private:
  std::vector<std::int64_t> shape_;
  std::vector<unsigned char> bytes_;
  TensorView view_;
};

}  // namespace flexcp::tools
