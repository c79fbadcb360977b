#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "runtime/tensor.h"

using namespace shardsim::runtime;

TEST(BF16, ExactValuesRoundTrip) {
  for (float f : {0.0f, 1.0f, -2.0f, 0.5f, 3.0f, 256.0f, -1.0f / 1024})
    EXPECT_EQ(bf16_to_float(float_to_bf16(f)), f) << f;
}

TEST(BF16, RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even mantissa (1).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): goes up.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  // Just above halfway rounds up.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20))),
            1.0f + std::ldexp(1.0f, -7));
}

TEST(BF16, SpecialValues) {
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_float(float_to_bf16(std::numeric_limits<float>::infinity())),
            std::numeric_limits<float>::infinity());
  // The largest float rounds to infinity in bf16 (it is above bf16's max + half an ulp).
  EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(std::numeric_limits<float>::max()))));
}

TEST(Tensor, ShapeBytesAndConversion) {
  Tensor t(DType::bf16, {3, 5});
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.nbytes(), 30u);
  t.set(4, 1.5f);
  EXPECT_EQ(t.get(4), 1.5f);
  EXPECT_THROW(t.f32(), std::logic_error);
  auto u = Tensor::from_float(t.to_float(), DType::bf16, {3, 5});
  EXPECT_TRUE(u.bit_equal(t));
  EXPECT_THROW(Tensor::from_float({1, 2}, DType::fp32, {3}), std::invalid_argument);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_THROW(parse_dtype("fp7"), std::invalid_argument);
}
