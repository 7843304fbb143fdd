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

// fp16 conversions in integer arithmetic, round to nearest even: what compilers without _Float16
// on this target use (clang 14 on x86 without AVX512-FP16, the fuzz build); tested against
// _Float16 where both exist.
inline float fp16_to_float_soft(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa x 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(magnitude));
  }
  if (exponent == 0x1f)  // infinity, or NaN (made quiet, payload kept)
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13) | (mantissa ? 0x400000u : 0));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline std::uint16_t float_to_fp16_soft(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u | static_cast<std::uint16_t>((a >> 13) & 0x3ffu);
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and up round to infinity
  if (a < 0x38800000u) {  // below 2^-14: a subnormal half, |x| 2^24 rounded to nearest even
    const float scaled = std::bit_cast<float>(a) * 0x1p24f;
    auto m = static_cast<std::uint32_t>(scaled);
    const float rest = scaled - static_cast<float>(m);
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;
    return sign | static_cast<std::uint16_t>(m);
  }
  const std::uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
  return sign | static_cast<std::uint16_t>((rounded >> 13) - (112u << 10));
}

#if defined(__FLT16_MANT_DIG__)
inline float fp16_to_float(std::uint16_t bits) {
  return static_cast<float>(std::bit_cast<_Float16>(bits));
}

inline std::uint16_t float_to_fp16(float x) {
  return std::bit_cast<std::uint16_t>(static_cast<_Float16>(x));
}
#else
inline float fp16_to_float(std::uint16_t bits) {
  return fp16_to_float_soft(bits);
}
inline std::uint16_t float_to_fp16(float x) {
  return float_to_fp16_soft(x);
}
#endif

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
