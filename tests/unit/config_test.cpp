#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "common/checked.h"
#include "common/config.h"
#include "common/config_rules.h"
#include "common/byte_size.h"
#include "common/error.h"
#include "experiments/sweep.h"
#include "topology/topology_yaml.h"
#include "sharding/engine_config.h"
#include "sharding/model_spec.h"
#include "sim/device_spec.h"
#include "topology/topology.h"

using shardsim::ConfigError;
using shardsim::ConfigNode;
using shardsim::UsageError;
namespace sharding = shardsim::sharding;

namespace {

// A `run` config through the parsers the one executor's loader calls (apps/train_setup.cpp's load; the tests
// link no apps/): the topology, the device, the model by its kind's key rules and the plan in the forward mode.
struct RunParse {
  shardsim::topology::Topology topology;
  shardsim::sim::DeviceSpec device;
  sharding::ModelSpec model;
  sharding::ParallelPlan plan;
};
RunParse parse_root(const ConfigNode& root) {
  RunParse p;
  p.topology = sharding::load_workload_topology(root);
  p.device = sharding::load_workload_device(root);
  p.model = sharding::parse_model_spec(root.child("workload"), sharding::spec_use_of(root.child("workload")));
  p.plan = sharding::parse_parallel_plan(root, p.model, sharding::SpecUse::train, p.topology.num_chips(), false, true);
  return p;
}
RunParse parse_run_config(const std::string& text, const std::string& file) {
  return parse_root(sharding::workload_config_from_text(text, file));
}
RunParse load_run_config(const std::string& file) { return parse_root(sharding::load_workload_config(file)); }

const char* kGood = R"(name: t
topology:
  kind: ring
  chips: 4
  bandwidth_gbps: 100
  latency_ns: 500
device:
  preset: generic
workload:
  kind: mlp
  hidden: 8
  ffn: 12
  tokens: 2
)";

// Returns the ConfigError message of parsing TEXT, or "" if it parsed.
std::string error_of(const std::string& text) {
  try {
    parse_run_config(text, "cfg.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  const auto pos = s.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  return s.replace(pos, from.size(), to);
}

}  // namespace

TEST(Config, GoodConfigParses) {
  auto c = parse_run_config(kGood, "cfg.yaml");
  EXPECT_EQ(c.topology.num_chips(), 4);
  EXPECT_EQ(c.plan.dp, 4);  // no parallel: section: data parallelism over every chip (run and train)
  EXPECT_EQ(c.plan.tp, 1);
  EXPECT_EQ(c.model.ffn, 12);
  EXPECT_FALSE(c.model.has_attention());
  EXPECT_EQ(c.device.name, "generic");
}

TEST(Config, MalformedYamlNamesFileAndLine) {
  // yaml-cpp notices the unclosed '[' only on a later line; the message must point at the bracket's line (4).
  auto msg = error_of(replace(kGood, "chips: 4", "chips: [4"));
  EXPECT_NE(msg.find("cfg.yaml:4:"), std::string::npos) << msg;
  // A '[' inside a quoted string or a comment does not count.
  msg = error_of(replace(replace(kGood, "name: t", "name: \"a[b\"  # [x"), "chips: 4", "chips: [4"));
  EXPECT_NE(msg.find("cfg.yaml:4:"), std::string::npos) << msg;
  // Other syntax errors keep yaml-cpp's position.
  msg = error_of(replace(kGood, "  chips: 4", "  chips: 4\n - x"));
  EXPECT_NE(msg.find("cfg.yaml:5:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("malformed YAML"), std::string::npos) << msg;
}

TEST(Config, UnknownKeyNamesKeyAndLine) {
  auto msg = error_of(replace(kGood, "bandwidth_gbps: 100", "bandwith_gbps: 100"));
  EXPECT_NE(msg.find("cfg.yaml:5:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("topology.bandwith_gbps"), std::string::npos) << msg;
}

// A repeated key would otherwise be silently ignored (yaml-cpp lookups see only the first one).
TEST(Config, DuplicateKeyNamesBothLines) {
  auto msg = error_of(replace(kGood, "latency_ns: 500", "latency_ns: 500\n  chips: 8"));
  EXPECT_NE(msg.find("cfg.yaml:7:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("duplicate key 'topology.chips'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("first at cfg.yaml:4"), std::string::npos) << msg;
}

TEST(Config, NegativeBandwidth) {
  auto msg = error_of(replace(kGood, "bandwidth_gbps: 100", "bandwidth_gbps: -3"));
  EXPECT_NE(msg.find("cfg.yaml:5:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("must be a finite number > 0 within 0.001..1e+06 GB/s"), std::string::npos) << msg;
}

TEST(Config, WrongTypes) {
  EXPECT_NE(error_of(replace(kGood, "chips: 4", "chips: four")).find("expected an integer"), std::string::npos);
  EXPECT_NE(error_of(replace(kGood, "kind: ring", "kind: hypercube")).find("unknown kind"), std::string::npos);
  EXPECT_NE(error_of(replace(kGood, "preset: generic", "preset: tpu9")).find("unknown device preset"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kGood, "tokens: 2", "tokens: 2\n  dtype: fp7")).find("unknown dtype"), std::string::npos);
}

TEST(Config, MissingKeyAndMissingFile) {
  EXPECT_NE(error_of(replace(kGood, "  hidden: 8\n", "")).find("missing required key 'workload.hidden'"),
            std::string::npos);
  // A config written with model: (the section's current name) hears about model.KEY, not workload.KEY.
  const std::string as_model = replace(kGood, "workload:", "model:");
  EXPECT_NE(error_of(replace(as_model, "  hidden: 8\n", "")).find("missing required key 'model.hidden'"),
            std::string::npos);
  EXPECT_NE(error_of(replace(as_model, "tokens: 2", "tokens: -2")).find("model.tokens: must be between 1 and 16777216 (got -2)"),
            std::string::npos)
      << error_of(replace(as_model, "tokens: 2", "tokens: -2"));
  EXPECT_NE(error_of(replace(as_model, "tokens: 2", "tokens: 2\n  seed: -1")).find("model.seed: must be between 0 and"),
            std::string::npos);
  try {
    load_run_config("/nonexistent/x.yaml");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/x.yaml"), std::string::npos);
  }
}

TEST(Config, TorusDimsAndPlan) {
  std::string torus = replace(kGood, "kind: ring\n  chips: 4", "kind: torus\n  dims: [2, 2]");
  auto c = parse_run_config(torus, "cfg.yaml");
  EXPECT_EQ(c.topology.num_chips(), 4);
  EXPECT_NE(error_of(replace(torus, "dims: [2, 2]", "dims: [2, 2]\n  chips: 5")).find("but dims 2x2 make 4"),
            std::string::npos);
  EXPECT_EQ(parse_run_config(std::string(kGood) + "parallel:\n  tp: 2\n", "cfg.yaml").plan.dp, 2);  // dp fills
  EXPECT_NE(error_of(std::string(kGood) + "parallel:\n  tp: 2\n  dp: 1\n").find("cfg.yaml:15: parallel: tp 2 x cp 1 x ulysses 1 = 2 does not match"),
            std::string::npos)
      << error_of(std::string(kGood) + "parallel:\n  tp: 2\n  dp: 1\n");
}

TEST(Config, ShippedConfigsParse) {
  for (auto name : {"llama2_7b_mlp_tp8.yaml", "llama2_7b_mlp_tp8_bf16.yaml", "small_mlp.yaml"}) {
    auto c = load_run_config(std::string(SHARDSIM_CONFIG_DIR) + "/workloads/" + name);
    EXPECT_GT(c.topology.num_chips(), 0) << name;
  }
  auto llama = load_run_config(std::string(SHARDSIM_CONFIG_DIR) + "/workloads/llama2_7b_mlp_tp8.yaml");
  EXPECT_EQ(llama.model.hidden, 4096);
  EXPECT_EQ(llama.model.ffn, 11008);
  EXPECT_EQ(llama.topology.num_chips(), 8);
}

// NaN and infinities (YAML .nan, .inf, -.inf) are never valid numbers: every validator rejects them naming the key
// (a NaN would pass a `v <= 0` check and poison every simulated time).
TEST(Config, NanAndInfinityAreRejectedNamingTheKey) {
  for (std::string v : {".nan", ".NaN", ".inf", "-.inf", ".Inf"}) {
    const auto node =
        shardsim::ConfigNode::load_string("device:\n  hbm_gbps: " + v + "\n", "c.yaml").child("device");
    for (int which = 0; which < 3; ++which) {
      try {
        if (which == 0) node.get_positive_double("hbm_gbps");
        if (which == 1) node.get_nonnegative_double("hbm_gbps", 1.0);
        if (which == 2) node.get_double("hbm_gbps");
        ADD_FAILURE() << v << " accepted by validator " << which;
      } catch (const ConfigError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("c.yaml:2: device.hbm_gbps: must be a finite number (got " + v + ")"), std::string::npos)
            << msg;
      }
    }
  }
  // Through the whole workload parser: the device and the topology numbers.
  auto msg = error_of(replace(kGood, "preset: generic", "preset: generic\n  peak_tflops_fp8: .nan"));
  EXPECT_NE(msg.find("cfg.yaml:9: device.peak_tflops_fp8: must be a finite number"), std::string::npos) << msg;
  msg = error_of(replace(kGood, "preset: generic", "preset: generic\n  launch_overhead_ns: .inf"));
  EXPECT_NE(msg.find("cfg.yaml:9: device.launch_overhead_ns: must be a finite number"), std::string::npos) << msg;
  msg = error_of(replace(kGood, "latency_ns: 500", "latency_ns: .nan"));
  EXPECT_NE(msg.find("cfg.yaml:6: topology.latency_ns"), std::string::npos) << msg;
}

// ---- issue 14: YAML that yaml-cpp accepts but that would not mean what it says; control characters ----

namespace {
std::string load_error(const std::string& text) {
  try {
    (void)shardsim::ConfigNode::load_string(text, "c.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(ConfigText, SecondDocumentIsAnErrorAtItsMarker) {
  EXPECT_EQ(load_error("a: 1\n---\nb: 2\n"),
            "c.yaml:2: a second YAML document ('---'): a config file holds exactly one document (2 found)");
  EXPECT_NE(load_error("---\na: 1\n---\n").find("c.yaml:3: a second YAML document"), std::string::npos)
      << load_error("---\na: 1\n---\n");
  EXPECT_EQ(load_error("---\na: 1\n...\n"), "") << "a leading '---' and a closing '...' are one document";
  EXPECT_EQ(load_error("a: 1\n# ---\nb: '---'\n"), "") << "--- in a comment or a string is no marker";
}

TEST(ConfigText, UnterminatedQuoteIsReportedAtTheQuote) {
  // yaml-cpp folds the following lines into the string and parses without complaint.
  EXPECT_EQ(load_error("a: 1\nb: \"abc\nc: 2\nd: 3\n"),
            "c.yaml:2:4: unterminated quote: the quoted string starting here is not closed on its line");
  // A later quote closes it and yaml-cpp fails further down: the message still names the open quote.
  const std::string e = load_error("a: 1\nb: 'abc\nc: 2\nd: 'x'\ne: 4\n");
  EXPECT_EQ(e.rfind("c.yaml:2:4: unterminated quote", 0), 0u) << e;
  // Not quotes that open a scalar: apostrophes inside plain text, quotes in comments, closed quotes, flow lists.
  EXPECT_EQ(load_error("name: it's fine\n# don't \"worry\nb: \"x # y\"\nc: ['a', \"b\"]\nd: 'it''s'\n"), "");
  // Quotes inside a block scalar are text.
  EXPECT_EQ(load_error("a: |\n  he said \"hi\n  it's\nb: 1\n"), "");
}

TEST(ConfigText, ControlCharactersInStringsAreRefusedWithFileLineAndKey) {
  const auto root = shardsim::ConfigNode::load_string("a: ok\nlabel: \"x\\ny\"\nt: \"tab\\there\"\n", "c.yaml");
  EXPECT_EQ(root.get_string("a"), "ok");
  try {
    (void)root.get_string("label");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "c.yaml:2: label: contains a control character U+000A at position 2 (names and labels must be "
              "printable text on one line)");
  }
  EXPECT_THROW((void)root.get_string("t"), ConfigError);
  EXPECT_EQ(shardsim::ConfigNode::control_character("plain text `with` @quotes' \"and\" ;"), "");
  EXPECT_EQ(shardsim::ConfigNode::control_character("a\x7f"), "control character U+007F at position 2");
  EXPECT_EQ(shardsim::ConfigNode::control_character("\x1b[31m"), "control character U+001B at position 1");
}

TEST(ConfigText, DirectoryIsNamedAsSuch) {
  try {
    (void)shardsim::ConfigNode::load_file(SHARDSIM_CONFIG_DIR);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "config file '" SHARDSIM_CONFIG_DIR "' is a directory (expected a YAML file)");
  }
}

// The one byte-size parser (common/byte_size.h): the CLI's flags and the sweep's sizes accept the same texts.
TEST(ByteSize, OneParserForFlagsAndSweeps) {
  using shardsim::parse_byte_size;
  EXPECT_EQ(parse_byte_size("1024"), 1024u);
  EXPECT_EQ(parse_byte_size("8K"), 8192u);
  EXPECT_EQ(parse_byte_size("8k"), 8192u);
  EXPECT_EQ(parse_byte_size("4KiB"), 4096u);
  EXPECT_EQ(parse_byte_size("4m"), 4u << 20);
  EXPECT_EQ(parse_byte_size("1.5K"), 1536u);
  EXPECT_EQ(parse_byte_size("1G"), size_t{1} << 30);
  EXPECT_EQ(parse_byte_size("512B"), 512u);
  EXPECT_EQ(parse_byte_size("0"), 0u);
  EXPECT_THROW(parse_byte_size("0", 1), std::invalid_argument);
  EXPECT_THROW(parse_byte_size("4X"), std::invalid_argument);
  EXPECT_THROW(parse_byte_size("4abc"), std::invalid_argument);
  EXPECT_THROW(parse_byte_size("0.3"), std::invalid_argument);
  EXPECT_THROW(parse_byte_size("-1K"), std::invalid_argument);
  EXPECT_THROW(parse_byte_size("nan"), std::invalid_argument);
  EXPECT_THROW(parse_byte_size("1e300"), std::invalid_argument);
  EXPECT_THROW(parse_byte_size(""), std::invalid_argument);
  EXPECT_EQ(shardsim::experiments::parse_size("4KiB"), parse_byte_size("4K"));
}

// The one topology loader (topology_yaml.h): a topology: section, a bare map and an ASTRA-sim file all load.
TEST(TopologyDocument, SectionBareAndAstra) {
  using shardsim::ConfigNode;
  const auto a = shardsim::topology::load_topology_document(
      ConfigNode::load_string("topology:\n  kind: ring\n  chips: 4\n  bandwidth_gbps: 10\n", "a.yaml"));
  const auto b = shardsim::topology::load_topology_document(
      ConfigNode::load_string("kind: ring\nchips: 4\nbandwidth_gbps: 10\n", "b.yaml"));
  EXPECT_EQ(a.describe(), b.describe());
  const auto c = shardsim::topology::load_topology_document(ConfigNode::load_string(
      "topology: [ Ring ]\nnpus_count: [ 4 ]\nbandwidth: [ 10 ]\nlatency: [ 500 ]\n", "c.yml"));
  EXPECT_EQ(c.num_chips(), 4);
  try {
    shardsim::topology::load_topology_document(ConfigNode::load_string("devices: 3\n", "d.yaml"));
    ADD_FAILURE() << "no error";
  } catch (const shardsim::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("d.yaml:1: no 'topology:' section"), std::string::npos) << e.what();
  }
}

// Byte sizes in configs (parallel.bucket_bytes): an integer or the CLI's suffixes, bounds and bad text naming
// FILE:LINE and the key.
TEST(Config, ByteSizesTakeSuffixesAndNameTheKeyWhenWrong) {
  auto bytes = [](const std::string& v) {
    return shardsim::config_bytes_in(
        shardsim::ConfigNode::load_string("parallel:\n  bucket_bytes: " + v + "\n", "c.yaml").child("parallel"),
        "bucket_bytes", 0, int64_t{1} << 50, 7);
  };
  EXPECT_EQ(bytes("26214400"), 26214400);
  EXPECT_EQ(bytes("25M"), 25 * 1048576);
  EXPECT_EQ(bytes("1GiB"), 1073741824);
  EXPECT_EQ(bytes("0"), 0);
  EXPECT_EQ(shardsim::config_bytes_in(shardsim::ConfigNode::load_string("parallel:\n  tp: 2\n", "c.yaml").child("parallel"),
                                      "bucket_bytes", 0, 10, 7),
            7);
  for (const auto& [v, needle] : std::vector<std::pair<std::string, std::string>>{
           {"25X", "unknown size suffix"}, {"-1", "bucket_bytes"}, {"4P", "bucket_bytes"}, {"[1]", "bucket_bytes"}}) {
    try {
      bytes(v);
      ADD_FAILURE() << v << " was accepted";
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("c.yaml:2"), std::string::npos) << m;
      EXPECT_NE(m.find(needle), std::string::npos) << m;
    }
  }
}

// Issue 46 (kind 2): every list of sizes is checked entry by entry, each bad entry named with its own line and
// index, before any sum or product is formed; the sums use checked arithmetic.
TEST(Config, IntListEntriesAreBoundedOneByOne) {
  const auto root = ConfigNode::load_string("p:\n  l:\n    - 3\n    - 9223372036854775807\n  e: []\n  n: null\n"
                                            "  ok: [1, 2]\n",
                                            "f.yaml");
  const ConfigNode p = root.child("p");
  try {
    (void)p.get_int_list_in("l", 1, 4096);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "f.yaml:4: p.l[1]: must be between 1 and 4096 (got 9223372036854775807)");
  }
  EXPECT_THROW((void)p.get_int_list_in("e", 1, 4096), ConfigError);
  try {
    (void)p.get_int_list_in("n", 1, 4096);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("f.yaml:6: p.n: null"), std::string::npos) << e.what();
  }
  EXPECT_EQ(p.get_int_list_in("ok", 1, 2), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(shardsim::checked_sum(std::vector<int64_t>{INT64_MAX, INT64_MAX, 3, 3}), std::nullopt);
  EXPECT_EQ(shardsim::checked_sum(std::vector<int64_t>{1, 2, 3}), 6);
}

// Issue 46 (kind 15): a config edited by --set keeps its own line numbers in errors; the values an override
// made are named by the file and their key.
TEST(Config, OverriddenConfigKeepsTheFileLines) {
  const std::string text = "topology: {kind: ring, chips: 2, bandwidth_gbps: 100}\nmodel:\n  kind: mlp\n"
                           "  hidden: 64\n  ffn: 128\n  tokens: 8\nparallel:\n  tp: 2\n  bogus: 1\n";
  sharding::ConfigOverrides o;
  o.set = {"model.tokens=16", "device=h100"};
  const ConfigNode root = sharding::workload_config_from_text(text, "c.yaml", o);
  try {
    root.child("parallel").expect_keys({"tp"});
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(":9: unknown key 'parallel.bogus'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(root.child("workload").get_int("tokens"), 16);
  EXPECT_EQ(root.child("workload").child("tokens").where(), "c.yaml (with command-line overrides), --set model.tokens=16");
  // A node the file gave keeps its line; one below an overridden section names the override that made it.
  EXPECT_EQ(root.child("workload").child("hidden").where(), "c.yaml (with command-line overrides):4");
  // --set reaches a list's entry: topology.dims[1].KEY on a stacked topology.
  const std::string stacked = "topology:\n  kind: stacked\n  dims:\n    - {kind: switch, size: 2, bandwidth_gbps: 50}\n"
                              "    - {kind: ring, size: 4, bandwidth_gbps: 400}\n";
  o.set = {"topology.dims[1].bandwidth_gbps=800"};
  const ConfigNode s = sharding::workload_config_from_text(stacked, "s.yaml", o);
  EXPECT_EQ(s.yaml()["topology"]["dims"][1]["bandwidth_gbps"].as<double>(), 800);
  EXPECT_EQ(s.yaml()["topology"]["dims"][0]["bandwidth_gbps"].as<double>(), 50);
  o.set = {"topology.dims[2].bandwidth_gbps=800"};
  EXPECT_THROW(sharding::workload_config_from_text(stacked, "s.yaml", o), UsageError);
  o.set = {"topology.dims[x].bandwidth_gbps=800"};
  EXPECT_THROW(sharding::workload_config_from_text(stacked, "s.yaml", o), UsageError);
}

// --plan/--set values and config numbers are decimal text only (common/number.h): yaml-cpp's own conversion read
// '0x2' as 2, '010' as 8 and took '+2', so `--plan ep=0x2` ran as ep=2 (issue 46, kind 8).
TEST(Config, FlagAndFileNumbersAreDecimalOnly) {
  const std::string text = "topology: {kind: ring, chips: 2, bandwidth_gbps: 100}\nmodel:\n  kind: mlp\n"
                           "  hidden: 64\n  ffn: 128\n  tokens: 8\n";
  const auto tokens_error = [&](const std::string& set) {
    sharding::ConfigOverrides o;
    o.set = {set};
    try {
      const ConfigNode root = sharding::workload_config_from_text(text, "c.yaml", o);
      (void)root.child("workload").get_int("tokens");
      (void)root.child("workload").get_double("tokens");
    } catch (const shardsim::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (const std::string v : {"0x10", "+16", "1e1", "0o20", "16.0"})
    EXPECT_NE(tokens_error("model.tokens=" + v).find("--set model.tokens=" + v + ": model.tokens: expected an integer"),
              std::string::npos)
        << v << ": " << tokens_error("model.tokens=" + v);
  for (const std::string v : {" 16", "16 ", "\t16", " "})
    EXPECT_NE(tokens_error("model.tokens=" + v).find("starts or ends with a blank"), std::string::npos) << v;
  EXPECT_EQ(tokens_error("model.tokens=016"), "");  // leading zeros are decimal, not octal
  sharding::ConfigOverrides o;
  o.set = {"model.tokens=010"};
  EXPECT_EQ(sharding::workload_config_from_text(text, "c.yaml", o).child("workload").get_int("tokens"), 10);
  // The same rule for a file's own numbers, quoted or not, and in lists.
  for (const std::string v : {"0x10", "+16", "\"16 \"", "\" 16\"", "'0x10'"}) {
    const ConfigNode n = ConfigNode::load_string("a: " + v + "\nl: [1, " + v + "]\n", "f.yaml");
    EXPECT_THROW(n.get_int("a"), ConfigError) << v;
    EXPECT_THROW(n.get_double("a"), ConfigError) << v;
    EXPECT_THROW(n.get_int_list("l"), ConfigError) << v;
    EXPECT_THROW(n.get_int_list_in("l", 0, 100), ConfigError) << v;
  }
  const ConfigNode n = ConfigNode::load_string("a: -2.5e+1\nb: .5\nc: '7'\n", "f.yaml");
  EXPECT_EQ(n.get_double("a"), -25.0);
  EXPECT_EQ(n.get_double("b"), 0.5);
  EXPECT_EQ(n.get_int("c"), 7);
  // --plan: the same, and a blank-padded item is refused rather than trimmed.
  for (const std::string plan : {"tp=0x2", "tp=+2", "tp= 2", "tp=2 "}) {
    sharding::ConfigOverrides p;
    p.plan = plan;
    std::string err;
    try {
      const ConfigNode root = sharding::workload_config_from_text(text, "c.yaml", p);
      (void)root.child("parallel").get_int("tp");
    } catch (const shardsim::Error& e) {
      err = e.what();
    }
    EXPECT_NE(err.find("--plan"), std::string::npos) << plan << ": " << err;
  }
}

// Topology figures: decimal only too ('0x10' GB/s was 16).
TEST(Config, TopologyFiguresAreDecimalOnly) {
  for (const std::string v : {"0x64", "+100", "'100 '"}) {
    const std::string t = "topology:\n  kind: ring\n  chips: 4\n  bandwidth_gbps: " + v + "\n";
    try {
      (void)shardsim::topology::load_topology(ConfigNode::load_string(t, "t.yaml").child("topology"));
      ADD_FAILURE() << v << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("t.yaml:4: topology.bandwidth_gbps: expected a number"), std::string::npos)
          << e.what();
    }
  }
}

// A flag is true or false (yaml-cpp also took yes/on/y); a file's key that an override made unknown names the
// override; keys that exclude each other are named together (two flags setting one key: apps/main.cpp,
// scripts/hostile/surfaces.sh).
TEST(Config, BooleansAndConflictsNameBothSides) {
  const std::string text = "topology: {kind: ring, chips: 2, bandwidth_gbps: 100, latency_ns: 10}\nmodel:\n  kind: mlp\n"
                           "  hidden: 64\n  ffn: 128\n  tokens: 8\nparallel:\n  tp: 2\n";
  // Booleans: YAML 1.2's only.
  const ConfigNode b = ConfigNode::load_string("a: true\nb: False\nc: yes\nd: on\ne: 1\n", "b.yaml");
  EXPECT_TRUE(b.get_bool("a", false));
  EXPECT_FALSE(b.get_bool("b", true));
  for (const char* k : {"c", "d", "e"}) EXPECT_THROW((void)b.get_bool(k, false), ConfigError) << k;
  // A key of the file that a --set made unknown: the --set is named.
  sharding::ConfigOverrides o;
  o.set = {"topology.kind=stacked"};
  const ConfigNode root = sharding::workload_config_from_text(text, "c.yaml", o);
  try {
    root.child("topology").expect_keys({"kind", "chips", "dims"});
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("c.yaml (with command-line overrides):1: unknown key 'topology.bandwidth_gbps'"),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("; --set topology.kind=stacked changed this section"), std::string::npos)
        << e.what();
  }
  // refuse_together: both keys and where each came from.
  o.set = {"parallel.bogus=1"};
  const ConfigNode t = sharding::workload_config_from_text(text, "c.yaml", o);
  try {
    refuse_together(t.child("parallel"), {"tp"}, {"bogus"}, "they cannot meet");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "c.yaml (with command-line overrides), --set parallel.bogus=1: parallel.bogus and "
                                     "parallel.tp (c.yaml (with command-line overrides):8) exclude each other: they "
                                     "cannot meet");
  }
}
