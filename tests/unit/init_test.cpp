#include <gtest/gtest.h>

#include <Random123/philox.h>

#include "models/init.h"

using namespace shardsim;
using runtime::DType;
using runtime::Tensor;

TEST(Init, AnyBlockEqualsTheSameBlockOfTheWholeTensor) {
  const models::InitSpec spec{12345, 3, -0.5f, 0.5f};
  Tensor full(DType::fp32, {9, 23});
  models::fill_uniform_block(full, spec, 23, 0, 0);
  Tensor block(DType::fp32, {4, 7});
  models::fill_uniform_block(block, spec, 23, 5, 11);
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 7; ++j) EXPECT_EQ(block.get(i * 7 + j), full.get((5 + i) * 23 + 11 + j));
}

TEST(Init, ValuesInRangeAndStreamsDiffer) {
  Tensor a(DType::fp32, {16, 16}), b(DType::fp32, {16, 16}), c(DType::fp32, {16, 16});
  models::fill_uniform_block(a, {1, 1, -0.25f, 0.25f}, 16, 0, 0);
  models::fill_uniform_block(b, {1, 2, -0.25f, 0.25f}, 16, 0, 0);  // other tensor id
  models::fill_uniform_block(c, {2, 1, -0.25f, 0.25f}, 16, 0, 0);  // other seed
  int same_b = 0, same_c = 0;
  double mean = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    EXPECT_GE(a.get(i), -0.25f);
    EXPECT_LT(a.get(i), 0.25f);
    same_b += a.get(i) == b.get(i);
    same_c += a.get(i) == c.get(i);
    mean += a.get(i);
  }
  EXPECT_LT(same_b, 3);
  EXPECT_LT(same_c, 3);
  EXPECT_NEAR(mean / double(a.numel()), 0.0, 0.05);
}

TEST(Init, PhiloxKnownAnswer) {
  // Known-answer vector published with Random123 (kat_vectors: philox4x32 10 rounds, zero counter and key).
  r123::Philox4x32 g;
  auto r = g(r123::Philox4x32::ctr_type{{0, 0, 0, 0}}, r123::Philox4x32::key_type{{0, 0}});
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[1], 0xe169c58du);
  EXPECT_EQ(r[2], 0xbc57ac4cu);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
}
