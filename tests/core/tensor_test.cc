#include <gtest/gtest.h>

#include <cmath>

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
  EXPECT_EQ(fp16_to_float(float_to_fp16(0.1f)), static_cast<float>(static_cast<_Float16>(0.1f)));
}

}  // namespace
}  // namespace flexcp
