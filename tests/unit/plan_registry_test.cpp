// sharding/plans/registry.h: every registered plan, enumerated (a new registration is tested without editing this
// file): its example sets every key of its own and parses with the unit active, each of its bad cases is refused
// naming its key, `help plans` (catalogue_text) lists it and its keys, docs/CONFIG.md has a row per key, and --plan,
// the sweeps' plan entries and the device mesh take what the registry says.
#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "tests/unit/config_doc.h"
#include "experiments/sweep.h"
#include "sharding/device_mesh.h"
#include "sharding/engine_config.h"
#include "sharding/model_spec.h"
#include "sharding/plans/registry.h"

namespace shardsim::sharding::plans {
namespace {

// The plan of CASE, or the ConfigError's message in *ERROR.
ParallelPlan parse(const PlanCase& c, std::string* error) {
  try {
    const ConfigNode root = ConfigNode::load_string(c.yaml, "t.yaml");
    const ModelSpec m = parse_model_spec(root.child("model"), c.use);
    return parse_parallel_plan(root, m, c.use, c.chips);
  } catch (const ConfigError& e) {
    *error = e.what();
  }
  return {};
}

class PlanRegistry : public ::testing::TestWithParam<std::string> {
 protected:
  const PlanDescriptor& plan() const { return *find_plan(GetParam()); }
};

std::vector<std::string> plan_names() {
  std::vector<std::string> v;
  for (const auto& d : registered_plans()) v.push_back(d.name);
  return v;
}

TEST_P(PlanRegistry, ExampleSetsEveryKeyAndParses) {
  const auto& d = plan();
  ASSERT_FALSE(d.keys.empty());
  ASSERT_FALSE(d.example.yaml.empty()) << d.name << " has no example";
  const std::string par = d.example.yaml.substr(d.example.yaml.find("parallel:"));
  for (const auto& k : d.keys)
    EXPECT_TRUE(par.find(" " + k.name + ": ") != std::string::npos || par.find("{" + k.name + ": ") != std::string::npos)
        << d.name << ": example lacks " << k.name;
  std::string error;
  const ParallelPlan p = parse(d.example, &error);
  ASSERT_EQ(error, "") << d.name;
  if (d.unit) {
    EXPECT_TRUE(d.is_active(p)) << d.name;
    const ModelSpec m = parse_model_spec(ConfigNode::load_string(d.example.yaml, "t.yaml").child("model"), d.example.use);
    const bool train = d.example.use == SpecUse::train;
    EXPECT_NE(plan_text(m, p, train).find(d.text(m, p, train)), std::string::npos)
        << d.name << ": the plan line carries the unit's text";
  }
  EXPECT_EQ(p.chips(), d.example.chips) << d.name;
}

TEST_P(PlanRegistry, BadCasesAreRefusedNamingTheirKey) {
  const auto& d = plan();
  ASSERT_FALSE(d.bad_cases.empty()) << d.name << " has no bad case";
  for (const auto& c : d.bad_cases) {
    ASSERT_NE(d.key(c.key), nullptr) << d.name << ": bad case names " << c.key << ", not one of its keys";
    std::string error;
    (void)parse(c, &error);
    EXPECT_NE(error.find("t.yaml:"), std::string::npos) << d.name << ": " << c.yaml << " -> '" << error << "'";
    EXPECT_NE(error.find("parallel." + c.key), std::string::npos) << d.name << ": " << error;
  }
}

// The divisibility rules the trainer used to repeat with its own throws (models/lm_tp.cpp takes a parsed plan now):
// each is refused once, by the registry, at parse time, naming the config's FILE:LINE and the key.
TEST(PlanRegistryRules, TrainerRefusalsAreTheRegistrys) {
  // A small language model (4 heads, 2 KV heads, ffn 32, vocab 32, seq 8, batch 2) with the keys of MODEL_EXTRA
  // (", key: value, ...") set, and PLAN.
  const auto yaml = [](const std::string& model_extra, const std::string& plan) {
    std::vector<std::pair<std::string, std::string>> keys = {
        {"vocab", "32"}, {"hidden", "16"}, {"layers", "2"}, {"heads", "4"}, {"kv_heads", "2"},
        {"head_dim", "4"}, {"ffn", "32"},  {"seq", "8"},    {"batch", "2"}};
    std::stringstream in(model_extra);
    for (std::string item; std::getline(in, item, ',');) {
      const size_t colon = item.find(':');
      if (colon == std::string::npos) continue;
      std::string k = item.substr(0, colon), v = item.substr(colon + 1);
      k.erase(0, k.find_first_not_of(' '));
      v.erase(0, v.find_first_not_of(' '));
      bool set = false;
      for (auto& kv : keys)
        if (kv.first == k) kv.second = v, set = true;
      if (!set) keys.emplace_back(k, v);
    }
    std::string m;
    for (const auto& [k, v] : keys) m += (m.empty() ? "" : ", ") + k + ": " + v;
    return "model: {" + m + "}\nparallel: {" + plan + "}\n";
  };
  struct Rule {
    std::string yaml;
    int64_t chips;
    std::string needle;
  };
  const Rule rules[] = {
      {yaml("", "tp: 8"), 8, "query heads are not divisible by tp 8"},
      {yaml(", heads: 6, kv_heads: 3", "tp: 2"), 2, "3 KV heads and tp 2: one must divide the other"},
      {yaml(", kv_heads: 4, ffn: 30", "tp: 4"), 4, "model.ffn 30 is not a multiple of tp 4"},
      {yaml(", kv_heads: 4, vocab: 30", "tp: 4"), 4, "model.vocab 30 is not a multiple of tp 4"},
      {yaml(", tied_embeddings: true", "pp: 2"), 2, "pp with model.tied_embeddings"},
      {yaml(", batch: 3", "dp: 2"), 2, "must be a multiple of dp (2)"},
      {yaml(", batch: 6, micro_batch: 2", "dp: 2"), 2, "micro_batch: 2 sequences per micro-batch must divide"},
      {yaml(", seq: 6", "cp: 2"), 2, "seq 6 is not divisible by 2*cp = 4"},
      {yaml(", causal: false", "cp: 2"), 2, "ring attention runs the causal mask only"},
      {yaml(", kv_heads: 4, seq: 6", "tp: 4, sp: true"), 4, "tokens per context shard are not divisible by tp 4"},
      {yaml(", heads: 12, kv_heads: 6", "ulysses: 4"), 4, "neither a multiple nor a divisor of 4"},
      {yaml(", heads: 6, kv_heads: 2", "ulysses: 4"), 4, "6 query heads are not divisible by 4"},
  };
  for (const auto& r : rules) {
    std::string error;
    (void)parse({r.yaml, SpecUse::train, r.chips, ""}, &error);
    EXPECT_NE(error.find("t.yaml:"), std::string::npos) << r.yaml << " -> '" << error << "'";
    EXPECT_NE(error.find(r.needle), std::string::npos) << r.yaml << " -> '" << error << "'";
  }
}

TEST_P(PlanRegistry, HelpPlansListsItAndItsKeys) {
  const auto& d = plan();
  const std::string help = catalogue_text();
  EXPECT_TRUE(help.rfind(d.name + "  ", 0) == 0 || help.find("\n" + d.name + "  ") != std::string::npos) << d.name;
  for (const auto& k : d.keys) EXPECT_NE(help.find("  " + k.name + ": "), std::string::npos) << k.name;
}

TEST_P(PlanRegistry, ConfigDocHasARowPerKey) {
  const std::string section = test::config_doc_section(test::read_config_doc(), "parallel");
  ASSERT_FALSE(section.empty()) << "docs/CONFIG.md has no ### `parallel` section";
  for (const auto& k : plan().keys) EXPECT_NE(section.find("| `" + k.name + "` |"), std::string::npos) << k.name;
}

TEST_P(PlanRegistry, PlanFlagAndSweepsTakeItsKeys) {
  for (const auto& k : plan().keys) {
    // --plan accepts the key (its value is checked by the parser).
    ConfigOverrides o;
    o.plan = k.name + "=1";
    EXPECT_NO_THROW((void)workload_config_from_text("parallel: {}\n", "t.yaml", o)) << k.name;
    const auto sweep = sweep_plan_keys();
    EXPECT_EQ(std::find(sweep.begin(), sweep.end(), k.name) != sweep.end(), k.swept) << k.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Registered, PlanRegistry, ::testing::ValuesIn(plan_names()),
                         [](const auto& info) { return info.param; });

TEST(PlanRegistryKeys, EveryKeyHasOneOwner) {
  std::set<std::string> seen;
  for (const auto& d : registered_plans())
    for (const auto& k : d.keys) EXPECT_TRUE(seen.insert(k.name).second) << k.name << " registered twice";
  EXPECT_EQ(seen.size(), plan_keys().size());
  EXPECT_EQ(parallel_keys().size(), plan_keys().size());
}

TEST(PlanRegistryKeys, RelationsNameRegisteredUnits) {
  for (const auto& d : registered_plans())
    for (const auto* list : {&d.needs, &d.excludes})
      for (const auto& n : *list) EXPECT_NE(find_plan(n), nullptr) << d.name << " -> " << n;
}

TEST(PlanFlag, UnknownDuplicateAndEmptyItemsAreOneLine) {
  auto error = [](const std::string& plan) {
    ConfigOverrides o;
    o.plan = plan;
    try {
      (void)workload_config_from_text("parallel: {tp: 2}\n", "t.yaml", o);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error("tp=2,bogus=1").find("--plan tp=2,bogus=1: unknown plan key 'bogus' (known: tp,"),
            std::string::npos);
  EXPECT_NE(error("tp=2,tp=4").find("--plan tp=2,tp=4: tp given twice"), std::string::npos);
  EXPECT_NE(error("tp=,cp=2").find("--plan tp=,cp=2: tp has an empty value"), std::string::npos);
  EXPECT_NE(error("tp").find("expected key=value items"), std::string::npos);
  EXPECT_EQ(error("tp=4,zero=1"), "");
  for (const std::string& e : {error("tp=2,tp=4"), error("bogus=1")}) EXPECT_EQ(e.find('\n'), std::string::npos);
}

TEST(PlanText, OneLineForRunAndTrain) {
  ModelSpec mlp;
  mlp.attention = false;
  ParallelPlan p;
  p.tp = 8;
  // The default `run` job's line (README) is unchanged.
  EXPECT_EQ(plan_text(mlp, p, false), "tensor parallel tp=8 (Megatron MLP: gate/up column-parallel Shard(1), down "
                                      "row-parallel Shard(0), all_reduce(sum) of the output)");
  EXPECT_EQ(plan_text(mlp, ParallelPlan{}, false), "single device");
  ModelSpec lm;
  lm.heads = lm.kv_heads = 4;
  lm.vocab = 32;
  lm.layers = 4;
  lm.batch = 4;
  ParallelPlan q;
  q.tp = 2;
  q.sp = true;
  q.cp = 2;
  q.dp = 2;
  q.pp = 2;
  const std::string t = plan_text(lm, q, true);
  for (const char* part : {"tensor parallel tp=2", "vocab-parallel embedding", "sequence parallel", "context parallel cp=2",
                           "pipeline pp=2 (1f1b", "layers per stage 2/2", "data parallel dp=2",
                           "over dp x cp = 4"})
    EXPECT_NE(t.find(part), std::string::npos) << part << " in " << t;
  // The units in registration order.
  EXPECT_LT(t.find("tensor parallel"), t.find("context parallel"));
  EXPECT_LT(t.find("pipeline"), t.find("data parallel"));
}

TEST(PlanText, LongRunsOfEqualStagesAreWrittenOnce) {
  ModelSpec lm;
  lm.heads = lm.kv_heads = 4;
  lm.vocab = 32;
  lm.layers = 105;
  lm.batch = 8;
  ParallelPlan p;
  p.pp = 35;
  p.virtual_stages = 3;
  p.schedule = "interleaved";
  const std::string t = plan_text(lm, p, true);
  EXPECT_NE(t.find("layers per stage 1 (x105)"), std::string::npos) << t;
  EXPECT_EQ(t.find("1/1"), std::string::npos) << t;
  // Uneven stages keep each count where the run is short: 10 layers over 4 stages.
  lm.layers = 10;
  p.pp = 4;
  p.virtual_stages = 1;
  p.schedule = "1f1b";
  const std::string u = plan_text(lm, p, true);
  EXPECT_EQ(u.find("(x"), std::string::npos) << u;
  EXPECT_NE(u.find("layers per stage "), std::string::npos) << u;
}

TEST(PlanMesh, AxisSizesComeFromTheUnits) {
  ParallelPlan p;
  p.tp = 2;
  p.ulysses = 3;
  p.dp = 5;
  p.pp = 7;
  const auto sizes = mesh_axis_sizes(p);
  EXPECT_EQ(sizes.at("tp"), 2);
  EXPECT_EQ(sizes.at("cp"), 3);  // Ulysses lies on the cp axis
  EXPECT_EQ(sizes.at("dp"), 5);
  EXPECT_EQ(sizes.at("pp"), 7);
  EXPECT_EQ(p.chips(), 2 * 3 * 5 * 7);
  EXPECT_EQ(size_product_text(p), "tp 2 x cp 1 x ulysses 3 x pp 7 x dp 5");
}

// One builder for run and train: the default placement is the DeviceMesh default; mesh_dims is honoured or
// refused naming the key (train once accepted [5, 7] and ignored it).
TEST(PlanMesh, BuildMeshHonoursMeshDims) {
  const auto torus = topology::Topology::torus({2, 4}, {topology::LinkSpec{100, 1000}, topology::LinkSpec{100, 1000}});
  ParallelPlan p;
  p.tp = 2;
  p.dp = 4;
  const DeviceMesh plain = build_mesh(p, torus);
  const DeviceMesh direct({{"tp", 2}, {"dp", 4}}, torus);
  EXPECT_EQ(plain.placement(), direct.placement());
  p.mesh_dims = {1, 0};
  const DeviceMesh ordered = build_mesh(p, torus);
  EXPECT_EQ(ordered.dim_order(), (std::vector<int>{1, 0}));
  EXPECT_NE(ordered.placement(), plain.placement());
  p.mesh_dims = {5, 7};
  try {
    (void)build_mesh(p, torus);
    ADD_FAILURE() << "mesh_dims [5, 7] on a 2-dimensional torus accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.mesh_dims: dimension 5 is not one of the topology's 2 dimensions"),
              std::string::npos)
        << e.what();
  }
  // Through a config: the error names the mesh_dims line.
  const ConfigNode root = ConfigNode::load_string("parallel:\n  tp: 2\n  mesh_dims: [5, 7]\n", "t.yaml");
  try {
    (void)checked_mesh(root, p, torus);
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("t.yaml:3: parallel.mesh_dims: dimension 5"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardsim::sharding::plans
