// Non-owning tensor views (DLPack-compatible fields): flexcp never allocates or frees user memory.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "flexcp/export.h"

namespace flexcp {

// kFloat64 is for references and tests; the kernels take fp32, bf16 and fp16.
enum class DType { kFloat32, kBFloat16, kFloat16, kFloat64 };
enum class Device { kCpu, kCuda };

FLEXCP_API const char* dtype_name(DType dtype);         // "fp32", "bf16", "fp16", "fp64"
FLEXCP_API std::size_t dtype_size(DType dtype);         // bytes per element
FLEXCP_API DType parse_dtype(const std::string& name);  // inverse of dtype_name; throws Error

inline constexpr int kMaxTensorDims = 4;

// A strided view: element (i0, i1, ...) lives at data + sum(i_d * strides[d]) elements.
struct FLEXCP_API TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Device device = Device::kCpu;
  int device_index = 0;
  int ndim = 0;
  std::int64_t shape[kMaxTensorDims] = {};
  std::int64_t strides[kMaxTensorDims] = {};  // in elements, not bytes

  bool empty() const { return data == nullptr; }
  std::int64_t numel() const;
  bool is_contiguous() const;
  std::string shape_string() const;  // "[4, 8, 128]"
};

// A contiguous (row-major) view of `data` with the given shape.
FLEXCP_API TensorView make_view(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                                Device device = Device::kCpu);

}  // namespace flexcp
