// An owned host tensor of any flexcp dtype, for the tool's inputs and outputs.
#pragma once

#include <cstdint>
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
  // Uniform values in [-amplitude, amplitude), element i's from (seed, i) alone: the tensor fills
  // on every core (a 32K-token bench's inputs took seconds on one), and its values do not depend
  // on how many there are.
  void fill_uniform(std::uint64_t seed, float amplitude);
  // NaN everywhere: an output the kernel does not write shows as NaN instead of a plausible 0.
  void poison();
  std::vector<float> to_float() const;

 private:
  std::vector<std::int64_t> shape_;
  std::vector<unsigned char> bytes_;
  TensorView view_;
};

}  // namespace flexcp::tools
