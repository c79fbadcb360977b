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

// ---------------------------------------------------------------------------------------------------------------
// fp16 (IEEE-754 binary16), fp8 e4m3 (OCP "FN") and fp8 e5m2 (OCP, IEEE-like): bit patterns, rounding, specials.
// Every expected value below is derived from the format definitions (sign, exponent bias, mantissa bits), not
// from the code under test.
// ---------------------------------------------------------------------------------------------------------------

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/types.h"

namespace {

// A small binary floating-point format as its specification defines it.
struct Format {
  const char* name;
  int exp_bits;
  int man_bits;
  bool ieee;  // IEEE specials (all-ones exponent = inf/NaN); false = e4m3 "FN" (only S.1111.111 is NaN)
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  uint32_t count() const { return 1u << (1 + exp_bits + man_bits); }
  uint32_t sign_bit() const { return 1u << (exp_bits + man_bits); }
  uint32_t exp_field(uint32_t b) const { return (b >> man_bits) & ((1u << exp_bits) - 1); }
  uint32_t man_field(uint32_t b) const { return b & ((1u << man_bits) - 1); }
  bool is_nan(uint32_t b) const {
    const uint32_t emax = (1u << exp_bits) - 1, mmax = (1u << man_bits) - 1;
    return ieee ? exp_field(b) == emax && man_field(b) != 0 : exp_field(b) == emax && man_field(b) == mmax;
  }
  bool is_inf(uint32_t b) const { return ieee && exp_field(b) == (1u << exp_bits) - 1 && man_field(b) == 0; }
  // The value an encoding stands for: (-1)^s * 2^(1-bias) * m/2^M (subnormal) or 2^(e-bias) * (1 + m/2^M).
  double value(uint32_t b) const {
    const double s = (b & sign_bit()) ? -1.0 : 1.0;
    if (is_nan(b)) return std::numeric_limits<double>::quiet_NaN();
    if (is_inf(b)) return s * std::numeric_limits<double>::infinity();
    const uint32_t e = exp_field(b), m = man_field(b);
    if (e == 0) return s * std::ldexp(double(m), 1 - bias() - man_bits);
    return s * std::ldexp(double((1u << man_bits) + m), int(e) - bias() - man_bits);
  }
};

constexpr Format kF16{"fp16", 5, 10, true};
constexpr Format kE4M3{"e4m3", 4, 3, false};
constexpr Format kE5M2{"e5m2", 5, 2, true};

// Uniform access to the library's converters.
uint32_t enc(const Format& f, float x) {
  if (f.exp_bits == 5 && f.man_bits == 10) return float_to_fp16(x);
  if (f.exp_bits == 4) return float_to_e4m3(x);
  return float_to_e5m2(x);
}
float dec(const Format& f, uint32_t b) {
  if (f.exp_bits == 5 && f.man_bits == 10) return fp16_to_float(static_cast<uint16_t>(b));
  if (f.exp_bits == 4) return e4m3_to_float(static_cast<uint8_t>(b));
  return e5m2_to_float(static_cast<uint8_t>(b));
}

std::string hex(uint32_t b) {
  char s[16];
  std::snprintf(s, sizeof s, "0x%04X", b);
  return s;
}

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

}  // namespace

TEST(FP16, KnownBitPatterns) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(float_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_fp16(0.5f), 0x3800);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7BFF);                  // largest finite: 2^15 * (2 - 2^-10)
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -14)), 0x0400);     // smallest normal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)), 0x0001);     // smallest subnormal
  EXPECT_EQ(float_to_fp16(1023 * std::ldexp(1.0f, -24)), 0x03FF);  // largest subnormal
  EXPECT_EQ(float_to_fp16(0.0f), 0x0000);
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_fp16(kInf), 0x7C00);
  EXPECT_EQ(float_to_fp16(-kInf), 0xFC00);
  const uint16_t n = float_to_fp16(kNaN);
  EXPECT_EQ(n & 0x7C00, 0x7C00);
  EXPECT_NE(n & 0x03FF, 0) << "NaN must keep a nonzero mantissa";
  // 1/3 = 1.0101...b x 2^-2: mantissa 0101010101|0101... rounds down; exponent field -2 + 15 = 13.
  EXPECT_EQ(float_to_fp16(1.0f / 3.0f), 0x3555);

  EXPECT_EQ(fp16_to_float(0x3C00), 1.0f);
  EXPECT_EQ(fp16_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(fp16_to_float(0xFC00), -kInf);
  EXPECT_TRUE(std::signbit(fp16_to_float(0x8000)));
  EXPECT_TRUE(std::isnan(fp16_to_float(0x7E00)));
  EXPECT_TRUE(std::isnan(fp16_to_float(0xFC01)));
}

TEST(FP16, RoundsToNearestEvenAndOverflowsToInfinity) {
  // 1 + 2^-11 is halfway between 1 (mantissa 0, even) and 1 + 2^-10 (odd): down.
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  // 1 + 3*2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even): up.
  EXPECT_EQ(float_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(float_to_fp16(2049.0f), 0x6800);  // halfway between 2048 (even) and 2050
  EXPECT_EQ(float_to_fp16(2051.0f), 0x6802);  // halfway between 2050 (odd) and 2052 (even)
  EXPECT_EQ(float_to_fp16(-2051.0f), 0xE802);
  // Subnormals: 2^-25 is halfway between 0 and 2^-24: ties to 0 (even); 3*2^-25 goes to 2*2^-24.
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(float_to_fp16(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(float_to_fp16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(float_to_fp16(3 * std::ldexp(1.0f, -25)), 0x0002);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -30)), 0x0000);
  // Largest subnormal + half an ulp rounds up into the smallest normal (mantissa 0 is even).
  EXPECT_EQ(float_to_fp16(1023.5f * std::ldexp(1.0f, -24)), 0x0400);
  // Overflow: 65520 is halfway between 65504 (odd mantissa) and 2^16 -> rounds up -> infinity.
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7C00);
  EXPECT_EQ(float_to_fp16(-65520.0f), 0xFC00);
  EXPECT_EQ(float_to_fp16(1e10f), 0x7C00);
  EXPECT_EQ(float_to_fp16(std::numeric_limits<float>::max()), 0x7C00);
}

TEST(E4M3, KnownBitPatternsAndSaturation) {
  EXPECT_EQ(float_to_e4m3(1.0f), 0x38);    // exponent 0 + bias 7 = 0111, mantissa 000
  EXPECT_EQ(float_to_e4m3(-1.0f), 0xB8);
  EXPECT_EQ(float_to_e4m3(1.5f), 0x3C);
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7E);  // S.1111.110 = 2^8 * 1.75
  EXPECT_EQ(float_to_e4m3(256.0f), 0x78);  // S.1111.000 is an ordinary number in the FN format
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -6)), 0x08);  // smallest normal
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -9)), 0x01);  // smallest subnormal: 2^(1-7) * 1/8
  EXPECT_EQ(float_to_e4m3(7 * std::ldexp(1.0f, -9)), 0x07);
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);  // -0, not NaN (that is the FNUZ variant)
  EXPECT_EQ(float_to_e4m3(kNaN) & 0x7F, 0x7F);
  EXPECT_EQ(float_to_e4m3(-kNaN) & 0x7F, 0x7F);
  // No infinities: finite overflow saturates to +-448 (SATFINITE); an infinity is not finite and gives NaN.
  EXPECT_EQ(float_to_e4m3(449.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7E);  // halfway to the (non-existent) 480
  EXPECT_EQ(float_to_e4m3(480.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(1e6f), 0x7E);
  EXPECT_EQ(float_to_e4m3(kInf), 0x7F);
  EXPECT_EQ(float_to_e4m3(-1e6f), 0xFE);
  EXPECT_EQ(float_to_e4m3(-kInf), 0xFF);
  // 1/3 = 1.0101..b x 2^-2: 3 mantissa bits 010|101.. round up to 011 -> 1.375/4; exponent -2 + 7 = 5.
  EXPECT_EQ(float_to_e4m3(1.0f / 3.0f), 0x2B);

  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x78), 256.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x2B), 0.34375f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
  EXPECT_EQ(e4m3_to_float(0x80), 0.0f);
  int nans = 0;
  for (uint32_t b = 0; b < 256; ++b) nans += std::isnan(e4m3_to_float(uint8_t(b))) ? 1 : 0;
  EXPECT_EQ(nans, 2) << "only S.1111.111 is NaN; there are no infinities";
  for (uint32_t b = 0; b < 256; ++b) EXPECT_FALSE(std::isinf(e4m3_to_float(uint8_t(b)))) << hex(b);
}

TEST(E4M3, RoundsToNearestEven) {
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);  // halfway between 1 (even) and 1.125: down
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3A);  // halfway between 1.125 (odd) and 1.25 (even): up
  EXPECT_EQ(float_to_e4m3(std::nextafter(1.0625f, 2.0f)), 0x39);
  EXPECT_EQ(float_to_e4m3(17.0f), 0x58);    // halfway between 16 (0x58: exponent 4 + 7 = 11) and 18 (0x59): even
  EXPECT_EQ(float_to_e4m3(19.0f), 0x5A);    // halfway between 18 (odd) and 20 (even)
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);       // half the smallest subnormal: to 0
  EXPECT_EQ(float_to_e4m3(3 * std::ldexp(1.0f, -10)), 0x02);   // 1.5 subnormal ulps: to 2 (even)
  EXPECT_EQ(float_to_e4m3(7.5f * std::ldexp(1.0f, -9)), 0x08);  // largest subnormal + 1/2 ulp: smallest normal
  EXPECT_EQ(float_to_e4m3(432.0f), 0x7E);   // halfway between 416 (odd) and 448 (even)
  EXPECT_EQ(float_to_e4m3(400.0f), 0x7C);   // halfway between 384 (even) and 416
}

TEST(E5M2, KnownBitPatternsRoundingAndOverflow) {
  EXPECT_EQ(float_to_e5m2(1.0f), 0x3C);      // exponent 0 + bias 15 = 01111, mantissa 00
  EXPECT_EQ(float_to_e5m2(-1.0f), 0xBC);
  EXPECT_EQ(float_to_e5m2(57344.0f), 0x7B);  // 2^15 * 1.75
  EXPECT_EQ(float_to_e5m2(std::ldexp(1.0f, -14)), 0x04);  // smallest normal
  EXPECT_EQ(float_to_e5m2(std::ldexp(1.0f, -16)), 0x01);  // smallest subnormal
  EXPECT_EQ(float_to_e5m2(-0.0f), 0x80);
  EXPECT_EQ(float_to_e5m2(kInf), 0x7C);
  EXPECT_EQ(float_to_e5m2(-kInf), 0xFC);
  const uint8_t n = float_to_e5m2(kNaN);
  EXPECT_EQ(n & 0x7C, 0x7C);
  EXPECT_NE(n & 0x03, 0);
  // Rounding: 1.125 is halfway between 1 (even) and 1.25; 1.375 between 1.25 (odd) and 1.5 (even).
  EXPECT_EQ(float_to_e5m2(1.125f), 0x3C);
  EXPECT_EQ(float_to_e5m2(1.375f), 0x3E);
  EXPECT_EQ(float_to_e5m2(std::ldexp(1.0f, -17)), 0x00);
  EXPECT_EQ(float_to_e5m2(3 * std::ldexp(1.0f, -17)), 0x02);
  // Finite overflow saturates (SATFINITE, as e4m3): 61440 is halfway between 57344 (odd mantissa) and 2^16,
  // which IEEE rounding would take to infinity; here it clamps to 57344. Only infinite inputs give infinity.
  EXPECT_EQ(float_to_e5m2(61439.0f), 0x7B);
  EXPECT_EQ(float_to_e5m2(61440.0f), 0x7B);
  EXPECT_EQ(float_to_e5m2(-1e9f), 0xFB);
  EXPECT_EQ(float_to_e5m2(std::numeric_limits<float>::max()), 0x7B);

  EXPECT_EQ(e5m2_to_float(0x3C), 1.0f);
  EXPECT_EQ(e5m2_to_float(0x7B), 57344.0f);
  EXPECT_EQ(e5m2_to_float(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(e5m2_to_float(0x7C), kInf);
  EXPECT_EQ(e5m2_to_float(0xFC), -kInf);
  for (uint32_t b : {0x7Du, 0x7Eu, 0x7Fu, 0xFDu, 0xFEu, 0xFFu}) EXPECT_TRUE(std::isnan(e5m2_to_float(uint8_t(b))));
}

// Every encoding decodes to the value the format defines, and encoding that value gives the same bits back
// (NaNs: any NaN). Exhaustive: 65536 fp16 and 256 + 256 fp8 encodings.
TEST(MiniFloats, EveryEncodingDecodesToItsValueAndRoundTrips) {
  for (const Format* f : {&kF16, &kE4M3, &kE5M2}) {
    int failures = 0;
    for (uint32_t b = 0; b < f->count() && failures < 10; ++b) {
      const double want = f->value(b);
      const float got = dec(*f, b);
      if (std::isnan(want)) {
        if (!std::isnan(got)) ++failures;
        EXPECT_TRUE(std::isnan(got)) << f->name << " " << hex(b);
        const uint32_t back = enc(*f, got);
        EXPECT_TRUE(f->is_nan(back)) << f->name << " " << hex(b) << " NaN re-encodes as " << hex(back);
        continue;
      }
      if (double(got) != want || std::signbit(got) != std::signbit(want)) ++failures;
      EXPECT_EQ(double(got), want) << f->name << " " << hex(b);
      EXPECT_EQ(std::signbit(got), std::signbit(want)) << f->name << " " << hex(b);
      const uint32_t back = enc(*f, got);
      if (back != b) ++failures;
      EXPECT_EQ(back, b) << f->name << " " << hex(b) << " (" << want << ")";
    }
  }
}

// Round to nearest, ties to even, on every pair of adjacent finite encodings: the exact midpoint goes to the
// encoding with an even last bit, anything just below/above goes to the lower/upper neighbour. The midpoints of
// these narrow formats are exact in float. Both signs.
TEST(MiniFloats, EveryMidpointTiesToEven) {
  for (const Format* f : {&kF16, &kE4M3, &kE5M2}) {
    int failures = 0;
    for (uint32_t b = 0; b + 1 < f->sign_bit() && failures < 10; ++b) {
      const double lo = f->value(b), hi = f->value(b + 1);
      if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
      const float mid = static_cast<float>((lo + hi) / 2);
      ASSERT_EQ(double(mid), (lo + hi) / 2) << "midpoint not exact in float";
      const uint32_t even = (b % 2 == 0) ? b : b + 1;
      for (float sgn : {1.0f, -1.0f}) {
        const uint32_t s = sgn < 0 ? f->sign_bit() : 0;
        const uint32_t got_mid = enc(*f, sgn * mid);
        const uint32_t got_below = enc(*f, sgn * std::nextafter(mid, 0.0f));
        const uint32_t got_above = enc(*f, sgn * std::nextafter(mid, kInf));
        failures += (got_mid != (s | even)) + (got_below != (s | b)) + (got_above != (s | (b + 1)));
        EXPECT_EQ(got_mid, s | even) << f->name << " midpoint of " << hex(b) << "/" << hex(b + 1) << " sign " << sgn;
        EXPECT_EQ(got_below, s | b) << f->name << " just below midpoint of " << hex(b) << "/" << hex(b + 1);
        EXPECT_EQ(got_above, s | (b + 1)) << f->name << " just above midpoint of " << hex(b) << "/" << hex(b + 1);
      }
    }
  }
}

// The same from doubles, as validate and the reference paths store them (store_from_double encodes the double
// once): the exact midpoint ties to even, one double ulp below / above it goes down / up, and a double just under
// half the smallest subnormal is zero; bf16 too. Both signs.
TEST(MiniFloats, EveryDoubleMidpointTiesToEven) {
  constexpr Format kBF16{"bf16", 8, 7, true};
  const std::pair<const Format*, DType> formats[] = {
      {&kF16, DType::fp16}, {&kBF16, DType::bf16}, {&kE4M3, DType::fp8_e4m3}, {&kE5M2, DType::fp8_e5m2}};
  for (const auto& [f, t] : formats) {
    auto enc_d = [t = t](double x) {
      uint32_t out = 0;  // little-endian: the low bytes hold the encoding
      store_from_double(&out, 0, t, x);
      return dtype_size(t) == 1 ? out & 0xFFu : out & 0xFFFFu;
    };
    int failures = 0;
    for (uint32_t b = 0; b + 1 < f->sign_bit() && failures < 10; ++b) {
      const double lo = f->value(b), hi = f->value(b + 1);
      if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
      const double mid = (lo + hi) / 2;
      const uint32_t even = (b % 2 == 0) ? b : b + 1;
      for (double sgn : {1.0, -1.0}) {
        const uint32_t s = sgn < 0 ? f->sign_bit() : 0;
        const uint32_t got[3] = {enc_d(sgn * mid), enc_d(sgn * std::nextafter(mid, 0.0)),
                                 enc_d(sgn * std::nextafter(mid, 1e300))};
        const uint32_t want[3] = {s | even, s | b, s | (b + 1)};
        for (int i = 0; i < 3; ++i) {
          failures += got[i] != want[i];
          EXPECT_EQ(got[i], want[i]) << f->name << " " << (i == 0 ? "midpoint" : i == 1 ? "below" : "above")
                                     << " of " << hex(b) << "/" << hex(b + 1) << " sign " << sgn;
        }
      }
    }
    EXPECT_EQ(enc_d(std::nextafter(f->value(1) / 2, 0.0)), 0u) << f->name;
    EXPECT_EQ(enc_d(-std::numeric_limits<double>::denorm_min()), f->sign_bit()) << f->name;
    uint32_t max_finite = f->sign_bit() - 1;
    while (!std::isfinite(f->value(max_finite))) --max_finite;
    const bool saturates = f == &kE4M3 || f == &kE5M2;
    EXPECT_EQ(enc_d(1e300), saturates ? max_finite : ((1u << f->exp_bits) - 1) << f->man_bits)
        << f->name << " overflow: infinity (fp16, bf16) or the largest finite value (fp8)";
  }
}

// Positive finite encodings are strictly increasing in value (no gaps or duplicates in the decode table).
TEST(MiniFloats, PositiveEncodingsAreStrictlyIncreasing) {
  for (const Format* f : {&kF16, &kE4M3, &kE5M2}) {
    float prev = dec(*f, 0);
    for (uint32_t b = 1; b < f->sign_bit(); ++b) {
      const float v = dec(*f, b);
      if (std::isnan(v) || std::isinf(v)) break;
      ASSERT_GT(v, prev) << f->name << " " << hex(b);
      prev = v;
    }
  }
}

#if defined(__FLT16_MAX__)
// An independent oracle for fp16: the compiler's _Float16 (IEEE binary16, round to nearest even).
TEST(FP16, MatchesCompilerFloat16OnManyFloats) {
  std::mt19937 rng(12345);
  std::uniform_int_distribution<uint32_t> any;
  int failures = 0;
  for (int i = 0; i < 400000 && failures < 10; ++i) {
    uint32_t bits = any(rng);
    // Half of the samples concentrated on fp16's exponent range (float exponents 100..150).
    if (i % 2) bits = (bits & 0x807FFFFFu) | ((100u + bits % 51u) << 23);
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) continue;
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    const uint16_t got = float_to_fp16(f);
    if (got != want) ++failures;
    EXPECT_EQ(got, want) << "float bits " << std::hex << bits << " = " << f;
  }
}
#endif

TEST(DType, ParseEveryNameAndAlias) {
  const auto& all = all_dtypes();
  EXPECT_EQ(all.size(), 12u);
  std::set<std::string> names;
  for (DType t : all) {
    EXPECT_EQ(parse_dtype(dtype_name(t)), t) << dtype_name(t);
    names.insert(dtype_name(t));
  }
  EXPECT_EQ(names.size(), all.size()) << "dtype names must be distinct";
  const std::vector<std::pair<std::string, DType>> aliases = {
      {"float32", DType::fp32},        {"float", DType::fp32},       {"f32", DType::fp32},
      {"float16", DType::fp16},        {"half", DType::fp16},        {"bfloat16", DType::bf16},
      {"float64", DType::fp64},        {"double", DType::fp64},      {"e4m3", DType::fp8_e4m3},
      {"float8_e4m3", DType::fp8_e4m3}, {"e5m2", DType::fp8_e5m2},   {"float8_e5m2", DType::fp8_e5m2},
      {"char", DType::int8},           {"int8_t", DType::int8},      {"int8", DType::int8},
      {"uint8", DType::uint8},         {"int32", DType::int32},      {"uint32", DType::uint32},
      {"int64", DType::int64},         {"uint64", DType::uint64},    {"fp8_e4m3", DType::fp8_e4m3},
      {"fp8_e5m2", DType::fp8_e5m2}};
  for (const auto& [name, t] : aliases) EXPECT_EQ(parse_dtype(name), t) << name;

  const std::vector<std::pair<DType, size_t>> sizes = {
      {DType::int8, 1}, {DType::uint8, 1}, {DType::int32, 4}, {DType::uint32, 4}, {DType::int64, 8},
      {DType::uint64, 8}, {DType::fp16, 2}, {DType::bf16, 2}, {DType::fp32, 4}, {DType::fp64, 8},
      {DType::fp8_e4m3, 1}, {DType::fp8_e5m2, 1}};
  for (const auto& [t, s] : sizes) EXPECT_EQ(dtype_size(t), s) << dtype_name(t);
}

TEST(DType, UnknownNameListsTheKnownNames) {
  for (const std::string bad : {"fp7", "", "FP32x", "float128"}) {
    try {
      parse_dtype(bad);
      ADD_FAILURE() << "parse_dtype('" << bad << "') did not throw";
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'" + bad + "'"), std::string::npos) << msg;
      for (DType t : all_dtypes()) EXPECT_NE(msg.find(dtype_name(t)), std::string::npos) << msg;
    }
  }
}

// ---- reduction arithmetic (collectives::reduce_into / finish_avg) ----

namespace {
using shardsim::collectives::finish_avg;
using shardsim::collectives::reduce_into;
using shardsim::collectives::ReduceOp;

template <class T>
std::vector<T> reduced(std::vector<T> acc, const std::vector<T>& in, DType t, ReduceOp op) {
  reduce_into(acc.data(), in.data(), acc.size(), t, op);
  return acc;
}
}  // namespace

TEST(ReduceInto, IntegersWrapAround) {
  EXPECT_EQ(reduced<int8_t>({100, -128, 127, 16}, {100, -1, 1, 16}, DType::int8, ReduceOp::sum),
            (std::vector<int8_t>{-56, 127, -128, 32}));
  EXPECT_EQ(reduced<int8_t>({16, -128, 3}, {16, -1, -3}, DType::int8, ReduceOp::prod),
            (std::vector<int8_t>{0, -128, -9}));  // 256 -> 0; 128 -> -128
  EXPECT_EQ(reduced<uint8_t>({200, 255}, {2, 255}, DType::uint8, ReduceOp::prod),
            (std::vector<uint8_t>{144, 1}));  // 400 mod 256; 65025 mod 256
  EXPECT_EQ(reduced<uint8_t>({200, 255}, {100, 1}, DType::uint8, ReduceOp::sum), (std::vector<uint8_t>{44, 0}));
  EXPECT_EQ(reduced<uint8_t>({200, 255}, {100, 1}, DType::uint8, ReduceOp::avg), (std::vector<uint8_t>{44, 0}))
      << "avg reduces as sum";
  EXPECT_EQ(reduced<uint32_t>({0xFFFFFFFFu}, {2u}, DType::uint32, ReduceOp::sum), (std::vector<uint32_t>{1u}));
  EXPECT_EQ(reduced<int32_t>({INT32_MAX, 65536}, {1, 65536}, DType::int32, ReduceOp::sum),
            (std::vector<int32_t>{INT32_MIN, 131072}));
  EXPECT_EQ(reduced<int32_t>({65536}, {65536}, DType::int32, ReduceOp::prod), (std::vector<int32_t>{0}));
  EXPECT_EQ(reduced<int64_t>({INT64_MAX}, {1}, DType::int64, ReduceOp::sum), (std::vector<int64_t>{INT64_MIN}));
  EXPECT_EQ(reduced<uint64_t>({~uint64_t{0}}, {~uint64_t{0}}, DType::uint64, ReduceOp::prod),
            (std::vector<uint64_t>{1}));
}

TEST(ReduceInto, MinMaxCompareInTheElementType) {
  // Unsigned compare: 200 > 3 (a signed reinterpretation would say -56 < 3).
  EXPECT_EQ(reduced<uint8_t>({200, 0}, {3, 255}, DType::uint8, ReduceOp::min), (std::vector<uint8_t>{3, 0}));
  EXPECT_EQ(reduced<uint8_t>({200, 0}, {3, 255}, DType::uint8, ReduceOp::max), (std::vector<uint8_t>{200, 255}));
  EXPECT_EQ(reduced<int8_t>({-1, 5}, {1, -128}, DType::int8, ReduceOp::max), (std::vector<int8_t>{1, 5}));
  EXPECT_EQ(reduced<int8_t>({-1, 5}, {1, -128}, DType::int8, ReduceOp::min), (std::vector<int8_t>{-1, -128}));
  EXPECT_EQ(reduced<uint64_t>({1ull << 63}, {1}, DType::uint64, ReduceOp::max), (std::vector<uint64_t>{1ull << 63}));
  EXPECT_EQ(reduced<float>({-0.5f, 2.0f}, {0.25f, -3.0f}, DType::fp32, ReduceOp::min),
            (std::vector<float>{-0.5f, -3.0f}));
  EXPECT_EQ(reduced<double>({-0.5, 2.0}, {0.25, -3.0}, DType::fp64, ReduceOp::max), (std::vector<double>{0.25, 2.0}));
}

TEST(ReduceInto, NarrowFloatsComputeInFp32AndRoundOnce) {
  // fp16: 2048 + 1 = 2049 is a tie between 2048 and 2050 -> 2048; 2048 + 3 = 2051 -> 2052.
  EXPECT_EQ(reduced<uint16_t>({0x6800, 0x6800}, {0x3C00, 0x4200}, DType::fp16, ReduceOp::sum),
            (std::vector<uint16_t>{0x6800, 0x6802}));
  // fp16 overflow -> infinity: 65504 + 65504.
  EXPECT_EQ(reduced<uint16_t>({0x7BFF}, {0x7BFF}, DType::fp16, ReduceOp::sum), (std::vector<uint16_t>{0x7C00}));
  // e4m3 saturates: 448 + 448 -> 448, 448 * 2 -> 448, -448 - 448 -> -448 (never NaN).
  EXPECT_EQ(reduced<uint8_t>({0x7E, 0x7E, 0xFE}, {0x7E, 0x40, 0xFE}, DType::fp8_e4m3, ReduceOp::sum),
            (std::vector<uint8_t>{0x7E, 0x7E, 0xFE}));
  EXPECT_EQ(reduced<uint8_t>({0x7E}, {0x40}, DType::fp8_e4m3, ReduceOp::prod), (std::vector<uint8_t>{0x7E}));
  // e4m3: 1 + 1/16 (1/16 = 0x18: exponent -4 + 7 = 3) is a tie between 1 and 1.125 -> 1; 1 + 3/16 (0x24) is a
  // tie between 1.125 (odd) and 1.25 -> 1.25.
  EXPECT_EQ(reduced<uint8_t>({0x38, 0x38}, {0x18, 0x24}, DType::fp8_e4m3, ReduceOp::sum),
            (std::vector<uint8_t>{0x38, 0x3A}));
  // e5m2 saturates like e4m3 (SATFINITE): 57344 + 57344 -> 57344; an infinite operand stays infinite.
  EXPECT_EQ(reduced<uint8_t>({0x7B, 0x7C}, {0x7B, 0x7B}, DType::fp8_e5m2, ReduceOp::sum),
            (std::vector<uint8_t>{0x7B, 0x7C}));
  // e5m2 min/max of 1 and -2.
  EXPECT_EQ(reduced<uint8_t>({0x3C}, {0xC0}, DType::fp8_e5m2, ReduceOp::min), (std::vector<uint8_t>{0xC0}));
  EXPECT_EQ(reduced<uint8_t>({0x3C}, {0xC0}, DType::fp8_e5m2, ReduceOp::max), (std::vector<uint8_t>{0x3C}));
  // bf16: 256 + 1 is a tie between 256 and 258 -> 256 (0x4380).
  EXPECT_EQ(reduced<uint16_t>({0x4380}, {0x3F80}, DType::bf16, ReduceOp::sum), (std::vector<uint16_t>{0x4380}));
}

TEST(FinishAvg, IntegersTruncateTowardZero) {
  std::vector<int32_t> a = {7, -7, 5, -1, 0, INT32_MIN};
  finish_avg(a.data(), a.size(), DType::int32, 2);
  EXPECT_EQ(a, (std::vector<int32_t>{3, -3, 2, 0, 0, INT32_MIN / 2}));
  std::vector<int8_t> b = {-56, 127, -128, -7};  // e.g. the wrapped sum 100 + 100 = -56 over 2 ranks
  finish_avg(b.data(), b.size(), DType::int8, 2);
  EXPECT_EQ(b, (std::vector<int8_t>{-28, 63, -64, -3}));
  std::vector<uint8_t> c = {255, 10};
  finish_avg(c.data(), c.size(), DType::uint8, 4);
  EXPECT_EQ(c, (std::vector<uint8_t>{63, 2}));
  std::vector<uint64_t> d = {~uint64_t{0}};
  finish_avg(d.data(), d.size(), DType::uint64, 3);
  EXPECT_EQ(d, (std::vector<uint64_t>{0x5555555555555555ull}));
  std::vector<int64_t> e = {-10, 10};
  finish_avg(e.data(), e.size(), DType::int64, 3);
  EXPECT_EQ(e, (std::vector<int64_t>{-3, 3}));
}

TEST(FinishAvg, FloatsRoundOnce) {
  std::vector<float> f = {1.0f, 7.0f, -1.0f};
  finish_avg(f.data(), f.size(), DType::fp32, 3);
  EXPECT_EQ(f, (std::vector<float>{1.0f / 3.0f, 7.0f / 3.0f, -1.0f / 3.0f}));  // IEEE division: one rounding
  std::vector<double> g = {1.0, 2.0};
  finish_avg(g.data(), g.size(), DType::fp64, 3);
  EXPECT_EQ(g, (std::vector<double>{1.0 / 3.0, 2.0 / 3.0}));
  std::vector<uint16_t> h = {0x3C00, 0x4700, 0xBC00};  // fp16 1, 7, -1 over 2 and 3 ranks
  std::vector<uint16_t> h3 = h;
  finish_avg(h.data(), h.size(), DType::fp16, 2);
  EXPECT_EQ(h, (std::vector<uint16_t>{0x3800, 0x4300, 0xB800}));  // 0.5, 3.5, -0.5 exactly
  finish_avg(h3.data(), 1, DType::fp16, 3);
  EXPECT_EQ(h3[0], 0x3555);  // 1/3 rounded once to fp16
  std::vector<uint16_t> bf = {0x3F80};
  finish_avg(bf.data(), 1, DType::bf16, 3);
  EXPECT_EQ(bf[0], 0x3EAB);  // 1/3 = 1.0101010|1010..b x 2^-2: rounds up in the 7-bit mantissa
  std::vector<uint8_t> e4 = {0x38, 0x7E};
  finish_avg(e4.data(), 2, DType::fp8_e4m3, 3);
  EXPECT_EQ(e4, (std::vector<uint8_t>{0x2B, 0x71}));  // 1/3 -> 0.34375; 448/3 = 149.33 -> 144 (1.125 x 2^7)
  std::vector<uint8_t> e5 = {0x3C};
  finish_avg(e5.data(), 1, DType::fp8_e5m2, 3);
  EXPECT_EQ(e5[0], 0x35);  // 1/3 = 1.0101..b x 2^-2: mantissa 01|01.. rounds down; exponent 13 -> 0x34 | 1
}

// ---- store_from_double: "stores V with T's rounding (floats) or conversion (integers: truncation toward zero,
// then wrap-around)" (dtype.h) ----

TEST(StoreFromDouble, IntegersTruncateTowardZeroThenWrap) {
  int8_t i8[4];
  store_from_double(i8, 0, DType::int8, 300.7);   // 300 mod 256 = 44
  store_from_double(i8, 1, DType::int8, -129.5);  // -129 -> 127
  store_from_double(i8, 2, DType::int8, -0.9);    // toward zero: 0
  store_from_double(i8, 3, DType::int8, 127.99);
  EXPECT_EQ(std::vector<int8_t>(i8, i8 + 4), (std::vector<int8_t>{44, 127, 0, 127}));
  uint8_t u8[2];
  store_from_double(u8, 0, DType::uint8, -1.0);   // 2^8 - 1
  store_from_double(u8, 1, DType::uint8, 511.5);  // 511 mod 256
  EXPECT_EQ(std::vector<uint8_t>(u8, u8 + 2), (std::vector<uint8_t>{255, 255}));
  uint32_t u32;
  store_from_double(&u32, 0, DType::uint32, 4294967296.0 + 5.9);
  EXPECT_EQ(u32, 5u);
  int32_t i32;
  store_from_double(&i32, 0, DType::int32, -2147483649.0);
  EXPECT_EQ(i32, INT32_MAX);
  int64_t i64;
  store_from_double(&i64, 0, DType::int64, -9007199254740993.0 /* rounds to -2^53 as a double */);
  EXPECT_EQ(i64, -9007199254740992ll);
  store_from_double(&i64, 0, DType::int64, std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(i64, 0);
}

// BUG (see report): values within 64 bits are not all wrapped: a negative double below INT64_MIN goes through an
// out-of-range (undefined) double -> int64_t conversion (x86 gives INT64_MIN), and the "beyond 64 bits" cut-off
// is 1.8e19 instead of 2^64 = 1.8446744e19.
TEST(StoreFromDouble, WrapsEveryValueWithin64Bits) {
  int64_t i64 = 0;
  store_from_double(&i64, 0, DType::int64, -1e19);  // -1e19 + 2^64 = 8446744073709551616
  EXPECT_EQ(i64, 8446744073709551616ll);
  uint64_t u64 = 0;
  store_from_double(&u64, 0, DType::uint64, 1.81e19);  // < 2^64: representable as it is
  EXPECT_EQ(u64, 18100000000000000000ull);
  store_from_double(&u64, 0, DType::uint64, -1e19);  // wraps to 2^64 - 1e19
  EXPECT_EQ(u64, 8446744073709551616ull);
}

// BUG (see report): narrow floats are rounded twice, double -> float -> fp16/bf16/fp8. A double just above a
// midpoint of the narrow format first rounds onto the midpoint in float, which then ties to even: the wrong way.
TEST(StoreFromDouble, NarrowFloatsRoundOnceFromDouble) {
  uint16_t h = 0;
  store_from_double(&h, 0, DType::fp16, 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40));
  EXPECT_EQ(h, 0x3C01) << "1 + 2^-11 + 2^-40 is above the midpoint of 1 and 1 + 2^-10";
  store_from_double(&h, 0, DType::fp16, 1.0 + std::ldexp(1.0, -11) - std::ldexp(1.0, -40));
  EXPECT_EQ(h, 0x3C00);
  uint16_t b = 0;
  store_from_double(&b, 0, DType::bf16, 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30));
  EXPECT_EQ(b, 0x3F81) << "1 + 2^-8 + 2^-30 is above the midpoint of 1 and 1 + 2^-7";
  uint8_t e = 0;
  store_from_double(&e, 0, DType::fp8_e4m3, 1.0 + std::ldexp(1.0, -4) + std::ldexp(1.0, -30));
  EXPECT_EQ(e, 0x39) << "1 + 2^-4 + 2^-30 is above the midpoint of 1 and 1.125";
  store_from_double(&e, 0, DType::fp8_e5m2, 1.0 + std::ldexp(1.0, -3) + std::ldexp(1.0, -30));
  EXPECT_EQ(e, 0x3D) << "1 + 2^-3 + 2^-30 is above the midpoint of 1 and 1.25";
}

// BUG (see report): finish_avg converts the rank count to the element type before dividing, so int8 averages
// over more than 127 ranks divide by a wrapped (negative) count, and uint8 over 256 ranks divides by zero.
TEST(FinishAvg, DividesByTheRankCountItself) {
  std::vector<int8_t> a = {-128, 100, 127};
  finish_avg(a.data(), a.size(), DType::int8, 200);  // |sum| < 200: every quotient truncates to 0
  EXPECT_EQ(a, (std::vector<int8_t>{0, 0, 0}));
  std::vector<uint8_t> b = {255};
  finish_avg(b.data(), b.size(), DType::uint8, 300);
  EXPECT_EQ(b, (std::vector<uint8_t>{0}));
  std::vector<int32_t> c = {1000, -1000};
  finish_avg(c.data(), c.size(), DType::int32, 300);
  EXPECT_EQ(c, (std::vector<int32_t>{3, -3}));
  // uint8 over 256 ranks: run in a child process, since a division by zero would kill this test binary.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        uint8_t v = 255;
        finish_avg(&v, 1, DType::uint8, 256);
        std::exit(v == 0 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "")
      << "finish_avg(uint8, ranks = 256) must give 255 / 256 = 0 (and not crash)";
}

// ---- special values (issue 14): one fp8 overflow convention; NaN, +-Inf, -0 through every op ----

namespace {
using shardsim::collectives::reduce_to;

// Folds VALUE into itself N times the way an all_reduce over N ranks does (rank order).
uint8_t fold_fp8(uint8_t value, int n, DType t, ReduceOp op) {
  uint8_t acc = value;
  for (int r = 1; r < n; ++r) reduce_into(&acc, &value, 1, t, op);
  return acc;
}

// Bit pattern of one value of type T (in a uint64 for comparison).
uint64_t bits_of(const void* p, DType t) {
  uint64_t b = 0;
  std::memcpy(&b, p, dtype_size(t));
  return b;
}
}  // namespace

TEST(Fp8Convention, OverflowSaturatesInBothFormats) {
  // The input: the largest finite value summed on 4 ranks. Before: e4m3 448, e5m2 +Inf.
  EXPECT_EQ(fold_fp8(0x7E, 4, DType::fp8_e4m3, ReduceOp::sum), 0x7E);  // 448
  EXPECT_EQ(fold_fp8(0x7B, 4, DType::fp8_e5m2, ReduceOp::sum), 0x7B);  // 57344
  EXPECT_EQ(fold_fp8(0xFE, 4, DType::fp8_e4m3, ReduceOp::sum), 0xFE);  // -448
  EXPECT_EQ(fold_fp8(0xFB, 4, DType::fp8_e5m2, ReduceOp::sum), 0xFB);  // -57344
  EXPECT_EQ(fold_fp8(0x7E, 4, DType::fp8_e4m3, ReduceOp::prod), 0x7E);
  EXPECT_EQ(fold_fp8(0x7B, 4, DType::fp8_e5m2, ReduceOp::prod), 0x7B);
  // avg = saturated sum / ranks, the same in both formats: 448 / 4 = 112, 57344 / 4 = 14336.
  for (auto [t, mx] : {std::pair{DType::fp8_e4m3, uint8_t{0x7E}}, std::pair{DType::fp8_e5m2, uint8_t{0x7B}}}) {
    uint8_t acc = fold_fp8(mx, 4, t, ReduceOp::avg);
    finish_avg(&acc, 1, t, 4);
    EXPECT_EQ(load_as_double(&acc, 0, t), max_finite(t) / 4) << dtype_name(t);
  }
  // Every finite fp8 pair: a sum or product of finite values is finite (never Inf, never NaN), and it is the
  // largest finite value of its sign exactly when the exact result is beyond it.
  for (DType t : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    const double mx = max_finite(t);
    for (uint32_t a = 0; a < 256; ++a)
      for (uint32_t b = 0; b < 256; ++b) {
        const uint8_t x = uint8_t(a), y = uint8_t(b);
        const double fx = load_as_double(&x, 0, t), fy = load_as_double(&y, 0, t);
        if (!std::isfinite(fx) || !std::isfinite(fy)) continue;
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod}) {
          uint8_t out = 0;
          reduce_to(&out, &x, &y, 1, t, op);
          const double got = load_as_double(&out, 0, t);
          const double exact = op == ReduceOp::sum ? double(float(fx) + float(fy)) : double(float(fx) * float(fy));
          ASSERT_TRUE(std::isfinite(got)) << dtype_name(t) << " " << hex(a) << " op " << hex(b);
          if (std::fabs(exact) > mx) {
            ASSERT_EQ(got, std::copysign(mx, exact)) << dtype_name(t) << " " << hex(a) << " " << hex(b);
          }
        }
      }
  }
}

TEST(Fp8Convention, InfinityOnlyFromInfinityAndNaNFromNaN) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  uint8_t b = 0;
  // e5m2 keeps infinities; e4m3 has none and gives NaN (an infinity never becomes a finite value).
  store_from_double(&b, 0, DType::fp8_e5m2, inf);
  EXPECT_EQ(b, 0x7C);
  store_from_double(&b, 0, DType::fp8_e5m2, -inf);
  EXPECT_EQ(b, 0xFC);
  store_from_double(&b, 0, DType::fp8_e4m3, inf);
  EXPECT_TRUE(std::isnan(e4m3_to_float(b)));
  store_from_double(&b, 0, DType::fp8_e4m3, -inf);
  EXPECT_TRUE(std::isnan(e4m3_to_float(b)));
  for (DType t : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    store_from_double(&b, 0, t, nan);
    EXPECT_TRUE(std::isnan(load_as_double(&b, 0, t))) << dtype_name(t);
  }
  // Inf + finite = Inf, Inf + -Inf = NaN, 0 * Inf = NaN (e5m2).
  EXPECT_EQ(reduced<uint8_t>({0x7C, 0x7C, 0x7C, 0x00}, {0x7B, 0xFC, 0x3C, 0x7C}, DType::fp8_e5m2, ReduceOp::sum)[0],
            0x7C);
  const auto r = reduced<uint8_t>({0x7C, 0x00}, {0xFC, 0x7C}, DType::fp8_e5m2, ReduceOp::sum);
  EXPECT_TRUE(std::isnan(e5m2_to_float(r[0])));
  EXPECT_EQ(r[1], 0x7C);
  EXPECT_TRUE(std::isnan(e5m2_to_float(reduced<uint8_t>({0x00}, {0x7C}, DType::fp8_e5m2, ReduceOp::prod)[0])));
  // fp16 and bf16 keep IEEE overflow to infinity (what NCCL's half and bfloat16 sums give).
  EXPECT_EQ(reduced<uint16_t>({0x7BFF}, {0x7BFF}, DType::fp16, ReduceOp::sum)[0], 0x7C00);
  EXPECT_EQ(reduced<uint16_t>({0x7F7F}, {0x7F7F}, DType::bf16, ReduceOp::sum)[0], 0x7F80);
  EXPECT_FALSE(has_infinity(DType::fp8_e4m3));
  EXPECT_TRUE(has_infinity(DType::fp8_e5m2));
  EXPECT_EQ(max_finite(DType::fp8_e4m3), 448.0);
  EXPECT_EQ(max_finite(DType::fp8_e5m2), 57344.0);
  EXPECT_EQ(max_finite(DType::fp16), 65504.0);
  EXPECT_EQ(min_subnormal(DType::fp8_e4m3), std::ldexp(1.0, -9));
  EXPECT_EQ(min_subnormal(DType::fp8_e5m2), std::ldexp(1.0, -16));
  EXPECT_EQ(min_subnormal(DType::bf16), std::ldexp(1.0, -133));
}

// Every op on every pair of special and ordinary values, both argument orders, every floating dtype: the result
// does not depend on the order (NaN counts as one value), NaN in gives NaN out, and max/min order -0 < +0.
// This is what makes every algorithm (any fold order) agree with the single-device reference.
TEST(ReduceOps, SpecialValuesAreOrderIndependentAndNaNPropagates) {
  for (DType t : {DType::fp16, DType::bf16, DType::fp32, DType::fp64, DType::fp8_e4m3, DType::fp8_e5m2}) {
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<double> vals = {std::numeric_limits<double>::quiet_NaN(), -std::numeric_limits<double>::quiet_NaN(),
                                0.0, -0.0, 1.0, -1.0, 2.0, min_subnormal(t), -min_subnormal(t),
                                max_finite(t), -max_finite(t)};
    if (has_infinity(t)) {
      vals.push_back(inf);
      vals.push_back(-inf);
    }
    const size_t es = dtype_size(t);
    std::vector<unsigned char> enc(vals.size() * es);
    for (size_t i = 0; i < vals.size(); ++i) store_from_double(enc.data(), i, t, vals[i]);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg})
      for (size_t i = 0; i < vals.size(); ++i)
        for (size_t j = 0; j < vals.size(); ++j) {
          unsigned char ab[8], ba[8];
          reduce_to(ab, enc.data() + i * es, enc.data() + j * es, 1, t, op);
          reduce_to(ba, enc.data() + j * es, enc.data() + i * es, 1, t, op);
          const double x = load_as_double(ab, 0, t), y = load_as_double(ba, 0, t);
          const std::string what = dtype_name(t) + " op " + std::to_string(int(op)) + " on " +
                                   std::to_string(vals[i]) + ", " + std::to_string(vals[j]);
          if (std::isnan(vals[i]) || std::isnan(vals[j])) {
            EXPECT_TRUE(std::isnan(x) && std::isnan(y)) << what << ": NaN dropped: " << x << " / " << y;
          } else if (std::isnan(x) || std::isnan(y)) {
            EXPECT_TRUE(std::isnan(x) && std::isnan(y)) << what;
          } else {
            EXPECT_EQ(bits_of(ab, t), bits_of(ba, t)) << what << ": " << x << " vs " << y;
          }
        }
    // IEEE 754-2019 maximum/minimum on zeros: max(-0, +0) = +0, min(+0, -0) = -0, in both orders.
    unsigned char out[8];
    for (int order = 0; order < 2; ++order) {
      const unsigned char* pz = enc.data() + 2 * es;  // +0
      const unsigned char* nz = enc.data() + 3 * es;  // -0
      reduce_to(out, order ? pz : nz, order ? nz : pz, 1, t, ReduceOp::max);
      EXPECT_FALSE(std::signbit(load_as_double(out, 0, t))) << dtype_name(t) << " max(+-0)";
      reduce_to(out, order ? pz : nz, order ? nz : pz, 1, t, ReduceOp::min);
      EXPECT_TRUE(std::signbit(load_as_double(out, 0, t))) << dtype_name(t) << " min(+-0)";
    }
  }
}
