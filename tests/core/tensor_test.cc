#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "core/dtype.h"
#include "flexcp/flexcp.h"

namespace flexcp {
namespace {

TEST(Tensor, ContiguousViewsAndNames) {
  float buf[24];
  const TensorView v = make_view(buf, DType::kFloat32, {2, 3, 4});
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.strides[0], 12);
  EXPECT_EQ(v.strides[2], 1);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.shape_string(), "[2, 3, 4]");
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64})
    EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  EXPECT_THROW(parse_dtype("int8"), Error);
  EXPECT_STREQ(status_string(Status::kNotCompiled), "not compiled");
  EXPECT_STREQ(version(), FLEXCP_VERSION_STRING);
}

TEST(Tensor, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is half-way between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_float(float_to_bf16(-INFINITY)), -INFINITY);
}

// IEEE binary16 from its fields, written from the format's definition (not from a cast), so the
// conversions below are checked against something they are not built from.
double fp16_value(std::uint16_t bits) {
  const int sign = bits >> 15, exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
  return sign ? -magnitude : magnitude;
}

TEST(Tensor, Fp16DecodesEveryPatternAndRoundTrips) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const bool special = ((bits >> 10) & 0x1f) == 0x1f;
    if (special) {
      const bool nan = (bits & 0x3ff) != 0;
      EXPECT_EQ(std::isnan(fp16_to_float(bits)), nan) << std::hex << b;
      if (!nan) {
        EXPECT_EQ(fp16_to_float(bits), (bits >> 15) ? -INFINITY : INFINITY);
      }
      continue;
    }
    const double want = fp16_value(bits);
    ASSERT_EQ(static_cast<double>(fp16_to_float(bits)), want) << std::hex << b;
    ASSERT_EQ(float_to_fp16(static_cast<float>(want)), bits) << std::hex << b;
  }
}

// The integer-arithmetic conversions (what compilers without _Float16 use) agree with the default
// ones (tested above) bit for bit: every half pattern, and floats around every half and at random.
TEST(Tensor, Fp16SoftwareConversionsAgreeWithTheDefault) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float d = fp16_to_float(bits), s = fp16_to_float_soft(bits);
    ASSERT_TRUE(std::isnan(d) ? std::isnan(s)
                              : std::bit_cast<std::uint32_t>(d) == std::bit_cast<std::uint32_t>(s))
        << std::hex << b;
    if (std::isnan(d)) continue;
    for (const float x : {d, std::nextafter(d, INFINITY), std::nextafter(d, -INFINITY)})
      ASSERT_EQ(float_to_fp16_soft(x), float_to_fp16(x)) << x;
    if (b + 1 < 0x7c00) {
      const float mid = (d + fp16_to_float(static_cast<std::uint16_t>(b + 1))) / 2;
      ASSERT_EQ(float_to_fp16_soft(mid), float_to_fp16(mid)) << "midpoint above " << std::hex << b;
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    if (std::isnan(x)) continue;
    ASSERT_EQ(float_to_fp16_soft(x), float_to_fp16(x)) << x;
  }
}

TEST(Tensor, Fp16RoundsToNearestEvenAndOverflowsToInfinity) {
  // Between neighbours a < b (positive, finite): the midpoint goes to the even mantissa, anything
  // nearer to one side goes there. Midpoints and their float neighbours are exact in fp32.
  for (std::uint16_t a = 0; a < 0x7bff; ++a) {
    const auto b = static_cast<std::uint16_t>(a + 1);
    const float lo = static_cast<float>(fp16_value(a)), hi = static_cast<float>(fp16_value(b));
    const float mid = (lo + hi) / 2;
    ASSERT_EQ(float_to_fp16(mid), (a & 1) ? b : a) << "midpoint of " << std::hex << a;
    ASSERT_EQ(float_to_fp16(std::nextafter(mid, 0.0f)), a) << std::hex << a;
    ASSERT_EQ(float_to_fp16(std::nextafter(mid, INFINITY)), b) << std::hex << a;
    ASSERT_EQ(float_to_fp16(-mid), ((a & 1) ? b : a) | 0x8000) << std::hex << a;
  }
  // 65504 is the largest finite value; 65520 (half-way to the next binade) and above overflow.
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_fp16(-1e30f), 0xfc00);
  // Below half the smallest subnormal (2^-25), values flush to signed zero.
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(float_to_fp16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(float_to_fp16(-std::ldexp(1.0f, -26)), 0x8000);
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(NAN))));
}

}  // namespace
}  // namespace flexcp
