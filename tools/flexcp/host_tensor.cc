#include "host_tensor.h"

#include <limits>

#include "core/dtype.h"
#include "flexcp/status.h"

namespace flexcp::tools {

HostTensor::HostTensor(DType dtype, std::vector<std::int64_t> shape) : shape_(std::move(shape)) {
  std::int64_t n = 1;
  for (std::int64_t s : shape_) n *= s;
  bytes_.resize(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * dtype_size(dtype));
  view_.data = bytes_.data();
  view_.dtype = dtype;
  view_.ndim = static_cast<int>(shape_.size());
  std::int64_t stride = 1;
  for (int d = view_.ndim - 1; d >= 0; --d) {
    view_.shape[d] = shape_[d];
    view_.strides[d] = stride;
    stride *= shape_[d];
  }
}

void HostTensor::assign(const std::vector<float>& values) {
  if (static_cast<std::int64_t>(values.size()) != numel())
    throw Error(Status::kInternal, "HostTensor::assign: size mismatch");
  for (std::size_t i = 0; i < values.size(); ++i)
    store_float(view_.data, view_.dtype, i, values[i]);
}

void HostTensor::fill_uniform(std::mt19937_64& rng, float amplitude) {
  std::uniform_real_distribution<float> u(-amplitude, amplitude);
  for (std::int64_t i = 0; i < numel(); ++i) store_float(view_.data, view_.dtype, i, u(rng));
}

void HostTensor::poison() {
  for (std::int64_t i = 0; i < numel(); ++i)
    store_float(view_.data, view_.dtype, i, std::numeric_limits<float>::quiet_NaN());
}

std::vector<float> HostTensor::to_float() const {
  std::vector<float> out(static_cast<std::size_t>(numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = load_float(view_.data, view_.dtype, i);
  return out;
}

}  // namespace flexcp::tools
