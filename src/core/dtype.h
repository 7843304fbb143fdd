// Conversions between the storage dtypes and fp32 (round to nearest even), for CPU code.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "flexcp/tensor.h"

namespace flexcp {

inline float bf16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

inline std::uint16_t float_to_bf16(float x) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

inline float fp16_to_float(std::uint16_t bits) {
  return static_cast<float>(std::bit_cast<_Float16>(bits));
}

inline std::uint16_t float_to_fp16(float x) {
  return std::bit_cast<std::uint16_t>(static_cast<_Float16>(x));
}

// Reads element `offset` (in elements) of a buffer of `dtype` as float / double.
inline float load_float(const void* base, DType dtype, std::int64_t offset) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(base)[offset];
    case DType::kBFloat16:
      return bf16_to_float(static_cast<const std::uint16_t*>(base)[offset]);
    case DType::kFloat16:
      return fp16_to_float(static_cast<const std::uint16_t*>(base)[offset]);
    case DType::kFloat64:
      return static_cast<float>(static_cast<const double*>(base)[offset]);
  }
  return 0.0f;
}

inline double load_double(const void* base, DType dtype, std::int64_t offset) {
  if (dtype == DType::kFloat64) return static_cast<const double*>(base)[offset];
  return load_float(base, dtype, offset);
}

inline void store_float(void* base, DType dtype, std::int64_t offset, float x) {
  switch (dtype) {
    case DType::kFloat32:
      static_cast<float*>(base)[offset] = x;
      break;
    case DType::kBFloat16:
      static_cast<std::uint16_t*>(base)[offset] = float_to_bf16(x);
      break;
    case DType::kFloat16:
      static_cast<std::uint16_t*>(base)[offset] = float_to_fp16(x);
      break;
    case DType::kFloat64:
      static_cast<double*>(base)[offset] = x;
      break;
  }
}

// Rounds x to the precision of `dtype` (identity for fp32 and fp64).
inline float round_to(DType dtype, float x) {
  switch (dtype) {
    case DType::kBFloat16:
      return bf16_to_float(float_to_bf16(x));
    case DType::kFloat16:
      return fp16_to_float(float_to_fp16(x));
    default:
      return x;
  }
}

}  // namespace flexcp
