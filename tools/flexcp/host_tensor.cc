#include "host_tensor.h"

#include <unistd.h>

#include <limits>
#include <new>
#include <string>

#include "core/dtype.h"
#include "flexcp/status.h"

namespace flexcp::tools {

namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

}  // namespace

HostTensor::HostTensor(DType dtype, std::vector<std::int64_t> shape) : shape_(std::move(shape)) {
  // The size, exact (the shape's dims are token and head counts within flexcp's limits), checked
  // against the machine's memory before asking for it: a tensor that cannot fit is an error that
  // says how much it needs, not an abort in the allocator.
  long double bytes = dtype_size(dtype);
  for (std::int64_t s : shape_) bytes *= static_cast<long double>(s < 1 ? 1 : s);
  const long double memory = static_cast<long double>(sysconf(_SC_PHYS_PAGES)) *
                             static_cast<long double>(sysconf(_SC_PAGESIZE));
  const std::string what = "a " + std::string(dtype_name(dtype)) + " tensor " + shape_text(shape_) +
                           " needs " + std::to_string(static_cast<double>(bytes) / (1ull << 30)) +
                           " GiB of host memory";
  if (memory > 0 && bytes > memory)
    throw Error(Status::kInvalidArgument,
                what + ", more than this machine has (" +
                    std::to_string(static_cast<double>(memory) / (1ull << 30)) +
                    " GiB); lower --seqlen or the heads");
  std::int64_t n = 1;
  for (std::int64_t s : shape_) n *= s;
  try {
    bytes_.resize(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * dtype_size(dtype));
  } catch (const std::bad_alloc&) {
    throw Error(Status::kInvalidArgument, what + ": the allocation failed");
  }
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

namespace {
// SplitMix64's output function: a bijective mix of 64 bits, good enough for test inputs.
std::uint64_t mix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

void HostTensor::fill_uniform(std::uint64_t seed, float amplitude) {
  // Each seed starts its counter at a hashed offset, so that nearby seeds give unrelated streams.
  const std::uint64_t base = mix64(seed);
  const std::int64_t n = numel();
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const float u = static_cast<float>(mix64(base + static_cast<std::uint64_t>(i)) >> 40) *
                    0x1p-24f;  // [0, 1) in 24 bits: exact in fp32
    store_float(view_.data, view_.dtype, i, amplitude * (2.f * u - 1.f));
  }
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
