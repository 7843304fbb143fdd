// Portable SIMD for the CPU kernels through GCC/Clang vector extensions: one code path that the
// compiler lowers to AVX-512, AVX2 or SSE depending on the target flags.
#pragma once

#include <cstdint>
#include <cstring>

namespace flexcp::cpu {

#if defined(__AVX512F__)
inline constexpr int kLanes = 16;
#elif defined(__AVX__)
inline constexpr int kLanes = 8;
#else
inline constexpr int kLanes = 4;
#endif

typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));
typedef std::int32_t IVec __attribute__((vector_size(kLanes * sizeof(float))));

inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, Vec v) {
  std::memcpy(p, &v, sizeof v);
}
inline Vec splat(float x) {
  return Vec{} + x;
}

inline float reduce_max(Vec v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}
inline float reduce_sum(Vec v) {
  float s = 0.0f;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

// 2^x, relative error about 1e-7 (float rounding); exactly 0 for x < -126 (so -inf gives 0).
// Range reduction x = n + f with |f| <= 1/2 by the 1.5 * 2^23 rounding trick; 2^f by its Taylor
// series to degree 7 (remainder below 1e-8 on |f| <= 1/2); 2^n built in the exponent bits.
inline Vec exp2(Vec x) {
  constexpr float kMin = -126.0f, kMax = 126.0f;
  constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23
  constexpr std::int32_t kRoundMagicBits = 0x4b400000;
  constexpr std::int32_t kExponentBias = 127;
  constexpr int kMantissaBits = 23;
  constexpr float c1 = 0.6931471805599453f, c2 = 0.2402265069591007f, c3 = 0.05550410866482158f,
                  c4 = 0.009618129107628477f, c5 = 0.0013333558146428443f,
                  c6 = 0.00015403530393381606f, c7 = 1.525273380405984e-05f;
  Vec xc = x < kMin ? splat(kMin) : x;
  xc = xc > kMax ? splat(kMax) : xc;
  const Vec t = xc + kRoundMagic;
  const Vec n = t - kRoundMagic;
  const Vec f = xc - n;
  Vec p = c7 * f + c6;
  p = p * f + c5;
  p = p * f + c4;
  p = p * f + c3;
  p = p * f + c2;
  p = p * f + c1;
  p = p * f + 1.0f;
  const IVec bits = (((IVec)t - kRoundMagicBits) + kExponentBias) << kMantissaBits;
  const Vec r = p * (Vec)bits;
  return x < kMin ? splat(0.0f) : r;
}

// Scalar 2^x with the same conventions, for row tails.
inline float exp2(float x) {
  Vec v = splat(x);
  return exp2(v)[0];
}

}  // namespace flexcp::cpu
