// Untrusted text on the command line and in request traces (issue 46, kinds 3 and 8): numbers are decimal only,
// list items are there and distinct, a config key given without a value is an error, every figure has a bound.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/error.h"
#include "common/number.h"
#include "common/text.h"

using shardsim::ConfigError;
using shardsim::ConfigNode;

TEST(DecimalNumbers, OnlyDecimalTextIsANumber) {
  using shardsim::decimal_double;
  using shardsim::decimal_int;
  EXPECT_EQ(decimal_int("42"), 42);
  EXPECT_EQ(decimal_int("-9223372036854775808"), INT64_MIN);
  EXPECT_EQ(decimal_int("9223372036854775807"), INT64_MAX);
  EXPECT_EQ(decimal_int("0009223372036854775807"), INT64_MAX);  // leading zeros do not count as digits of range
  for (const char* bad : {"", "+", "-", "9223372036854775808", "-9223372036854775809", "0x10", " 1", "1 ", "1e3",
                          "1.0", "１", "99999999999999999999", "+7", "+0"})
    EXPECT_FALSE(decimal_int(bad)) << bad;
  EXPECT_EQ(decimal_double("2.5"), 2.5);
  EXPECT_EQ(decimal_double(".5"), 0.5);
  EXPECT_EQ(decimal_double("5."), 5.0);
  EXPECT_EQ(decimal_double("-1e-3"), -1e-3);
  EXPECT_EQ(decimal_double("1E+2"), 100.0);
  EXPECT_EQ(decimal_double("1e-400"), 0.0);  // below the smallest subnormal: zero, a finite value
  for (const char* bad : {"", ".", "e5", "1e", "1e+", "0x10", "0x1p4", "inf", "nan", "infinity", " 1", "1 ", "1,5",
                          "1e400", "--1", "+-1", "1.2.3", "+2", "+.5"})
    EXPECT_FALSE(decimal_double(bad)) << bad;
  for (const char* v : {".nan", ".NaN", ".inf", "-.inf", "+.Inf", ".INF"}) EXPECT_TRUE(shardsim::yaml_nonfinite(v)) << v;
  for (const char* v : {"nan", "inf", "1", ".in", "..inf"}) EXPECT_FALSE(shardsim::yaml_nonfinite(v)) << v;
}

TEST(SplitItems, EmptyAndRepeatedItemsAreRefused) {
  using shardsim::split_items;
  EXPECT_EQ(split_items("ep=2,tp=2"), (std::vector<std::string>{"ep=2", "tp=2"}));
  EXPECT_EQ(split_items("pp=2,pp_layers=[3,1]"), (std::vector<std::string>{"pp=2", "pp_layers=[3,1]"}));
  EXPECT_EQ(split_items("device={preset: h100, hbm_gib: 8},x=1"),
            (std::vector<std::string>{"device={preset: h100, hbm_gib: 8}", "x=1"}));
  for (const char* bad : {"", ",", "ep=2,", ",ep=2", "a,,b", "0,0", "a,b,a"}) {
    try {
      (void)split_items(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_TRUE(m.find("empty") != std::string::npos || m.find("given twice") != std::string::npos) << m;
    }
  }
  try {
    (void)split_items("\x1b]0;x,\x1b]0;x");  // an item given twice is echoed in the message
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).find('\x1b'), std::string::npos) << "the item is echoed escaped";
  }
}

// `key:` / `key: ~` / `--set key=` read as absent (the default ran silently); now an error naming FILE:LINE.
TEST(Config, AKeyWithoutAValueIsAnError) {
  const auto root = ConfigNode::load_string("d:\n  fusion:\n  mode: ~\n  ok: fused\n", "f.yaml");
  const ConfigNode d = root.child("d");
  EXPECT_TRUE(d.has("ok"));
  EXPECT_FALSE(d.has("absent"));
  for (const char* key : {"fusion", "mode"}) {
    try {
      (void)d.get_string(key, "eager");
      ADD_FAILURE() << key << ": no error";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("d.") + key + ": no value"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("f.yaml:"), std::string::npos) << e.what();
    }
  }
}

// Every figure a config gives has an upper bound: its own range (get_double_in) or kMaxFigure.
TEST(Config, FiguresAreBoundedAbove) {
  const auto root = ConfigNode::load_string("a: 1e300\nb: 0.5\nc: -1\nd: .nan\ne: 1e12\n", "f.yaml");
  EXPECT_EQ(root.get_double_in("b", 0, 1), 0.5);
  EXPECT_EQ(root.get_double_in("absent", 0, 1, 0.25), 0.25);
  try {
    (void)root.get_double_in("a", 0, 1e6);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "f.yaml:1: a: must be between 0 and 1e+06 (got 1e300)");
  }
  EXPECT_THROW((void)root.get_double_in("c", 0, 1), ConfigError);
  EXPECT_THROW((void)root.get_double_in("d", 0, 1), ConfigError);
  EXPECT_THROW((void)root.get_positive_double("a"), ConfigError);
  EXPECT_THROW((void)root.get_nonnegative_double("a", 0), ConfigError);
  EXPECT_EQ(root.get_positive_double("e"), ConfigNode::kMaxFigure);
}
