// The model.moe section (sharding/plans/expert_parallel_config.h): defaults, every key read, per-expert sizes,
// shared experts, and bad values refused naming FILE:LINE and the key; parameter counts and load statistics.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "common/error.h"
#include "kernels/moe_mlp.h"
#include "sharding/plans/expert_parallel_config.h"

using namespace shardsim;
using sharding::plans::parse_moe_config;

namespace {

sharding::ModelSpec model() {
  sharding::ModelSpec m;
  m.hidden = 64;
  m.layers = 4;
  m.seed = 9;
  return m;
}

kernels::MoeConfig parse(const std::string& yaml) {
  const ConfigNode root = ConfigNode::load_string(yaml, "moe.yaml");
  return parse_moe_config(root.child("model").child("moe"), model());
}

std::string error_of(const std::string& yaml) {
  try {
    parse(yaml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(MoeConfig, DefaultsAndEveryKey) {
  auto c = parse("model:\n  moe: {experts: 8, top_k: 2, expert_ffn: 32}\n");
  EXPECT_EQ(c.spec.experts(), 8);
  EXPECT_EQ(c.spec.expert_ffn, std::vector<int64_t>(8, 32));
  EXPECT_EQ(c.spec.shared_ffn, 0);
  EXPECT_EQ(c.spec.router.score, kernels::RouterScore::softmax);
  EXPECT_TRUE(c.spec.router.normalize);
  EXPECT_EQ(c.spec.capacity.factor, 0);
  EXPECT_EQ(c.spec.capacity.policy, kernels::DropPolicy::probs);
  EXPECT_EQ(c.routing.skew, 0);
  EXPECT_EQ(c.routing.seed, 9u);
  EXPECT_TRUE(c.spec.router.bias.empty());
  c = parse("model:\n  moe: {experts: 4, top_k: 1, expert_ffn: [8, 16, 8, 4], shared_experts: 2, router: sigmoid,\n"
            "    normalize: false, scale: 2.5, bias_update: 0.001, capacity_factor: 1.25, drop_policy: position,\n"
            "    aux_loss_coef: 0.01, dense_layers: 1, layer_step: 2, routing: zipf, skew: 1.2, routing_seed: 3}\n");
  EXPECT_EQ(c.spec.expert_ffn, (std::vector<int64_t>{8, 16, 8, 4}));
  EXPECT_EQ(c.spec.router.groups, 1);
  EXPECT_FALSE(c.balance_placement);
  EXPECT_EQ(c.spec.shared_ffn, 16);  // 2 shared experts of expert_ffn[0]
  EXPECT_EQ(c.spec.router.score, kernels::RouterScore::sigmoid);
  EXPECT_FALSE(c.spec.router.normalize);
  EXPECT_DOUBLE_EQ(c.spec.router.scale, 2.5);
  EXPECT_EQ(c.spec.router.bias.size(), 4u);
  EXPECT_DOUBLE_EQ(c.spec.capacity.factor, 1.25);
  EXPECT_EQ(c.spec.capacity.policy, kernels::DropPolicy::position);
  EXPECT_DOUBLE_EQ(c.spec.aux_coef, 0.01);
  EXPECT_FALSE(c.is_moe_layer(0));  // dense
  EXPECT_TRUE(c.is_moe_layer(1));   // (1 + 1) % 2 == 0
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
  EXPECT_DOUBLE_EQ(c.routing.skew, 1.2);
  EXPECT_EQ(c.routing.seed, 3u);
  EXPECT_NE(sharding::plans::moe_text(c).find("4 experts top-1"), std::string::npos);
  c = parse("model:\n  moe: {experts: 256, top_k: 8, expert_ffn: 4, expert_groups: 8, group_limit: 4, group_top: 2,\n"
            "    placement: balanced}\n");  // DeepSeek-V3's router
  EXPECT_EQ(c.spec.router.groups, 8);
  EXPECT_EQ(c.spec.router.group_limit, 4);
  EXPECT_EQ(c.spec.router.group_top, 2);
  EXPECT_TRUE(c.balance_placement);
  EXPECT_NE(sharding::plans::moe_text(c).find("node-limited: 4 of 8 expert groups"), std::string::npos);
}

TEST(MoeConfig, BadValuesNameTheKeyAndLine) {
  EXPECT_NE(error_of("model:\n  moe: {experts: 8, top_k: 9, expert_ffn: 4}\n").find("moe.yaml:2"), std::string::npos);
  EXPECT_NE(error_of("model:\n  moe: {experts: 8, top_k: 9, expert_ffn: 4}\n").find("top_k"), std::string::npos);
  EXPECT_NE(error_of("model:\n  moe: {experts: 3, top_k: 1, expert_ffn: [4, 4]}\n").find("expert_ffn"), std::string::npos);
  EXPECT_NE(error_of("model:\n  moe: {experts: 2, top_k: 1, expert_ffn: 4, router: relu}\n").find("router"), std::string::npos);
  EXPECT_NE(error_of("model:\n  moe: {experts: 2, top_k: 1, expert_ffn: 4, experts_x: 1}\n").find("experts_x"), std::string::npos);
  EXPECT_NE(error_of("model:\n  moe: {experts: 2, top_k: 1, expert_ffn: 4, dense_layers: 5}\n").find("dense_layers"), std::string::npos);
  EXPECT_NE(error_of("model:\n  moe: {experts: 2, top_k: 1, expert_ffn: 4, skew: 2}\n").find("skew"), std::string::npos);
  EXPECT_NE(error_of("model:\n  moe: {experts: 2, top_k: 1, expert_ffn: 4, capacity_factor: -1}\n").find("capacity_factor"), std::string::npos);
  EXPECT_NE(error_of("model:\n  moe: {experts: 8, top_k: 2, expert_ffn: 4, expert_groups: 3}\n").find("expert_groups"), std::string::npos);
  EXPECT_NE(error_of("model:\n  moe: {experts: 8, top_k: 3, expert_ffn: 4, expert_groups: 4, group_limit: 1}\n").find("group_limit"), std::string::npos);
  EXPECT_NE(error_of("model:\n  moe: {experts: 8, top_k: 2, expert_ffn: 4, group_top: 1}\n").find("group_top"), std::string::npos);
  EXPECT_NE(error_of("model:\n  moe: {experts: 8, top_k: 2, expert_ffn: 4, placement: eplb}\n").find("placement"), std::string::npos);
  EXPECT_EQ(sharding::plans::ep_obstacle(8, 4), "");
  EXPECT_NE(sharding::plans::ep_obstacle(8, 3).find("parallel.ep"), std::string::npos);
}

// Mixtral-8x7B-shaped layer: 8 experts of 3 x 4096 x 14336, top-2 (Mixtral's published 46.7 B total / 12.9 B
// active over 32 layers plus attention and embeddings: the MoE part alone is 45.1 B / 11.3 B).
TEST(MoeConfig, ParamsAndLoad) {
  kernels::MoeSpec s;
  s.hidden = 4096;
  s.router.experts = 8;
  s.router.top_k = 2;
  s.expert_ffn.assign(8, 14336);
  const auto p = kernels::moe_params(s);
  EXPECT_DOUBLE_EQ(p.total, 4096.0 * 8 + 8 * 3.0 * 4096 * 14336);
  EXPECT_DOUBLE_EQ(p.active, 4096.0 * 8 + 2 * 3.0 * 4096 * 14336);
  EXPECT_NEAR(32 * p.total / 1e9, 45.1, 0.1);
  const auto l = kernels::moe_load({4, 0, 8, 4}, 3);
  EXPECT_EQ(l.max, 8);
  EXPECT_EQ(l.empty, 1);
  EXPECT_DOUBLE_EQ(l.imbalance(), 2.0);
  EXPECT_EQ(l.dropped, 3);
}

}  // namespace

TEST(MoeConfig, CapacityPiecesFollowTheChipsOfASplitSequence) {
  kernels::CapacityOptions c{1.0, kernels::DropPolicy::probs, 3, 1, {}};
  // Zigzag cp 2 over 2 sequences of 8 (chunks of 2): cp rank 0 holds positions {0, 1, 6, 7} of each sequence, rank 1
  // {2, 3, 4, 5}; sp over tp 2 then halves each rank's rows.
  sharding::plans::split_capacity_over_chips(c, 8, 2, 2, true, 2);
  EXPECT_EQ(c.split, 4);
  EXPECT_EQ(c.order, (std::vector<int64_t>{0, 1, 6, 7, 8, 9, 14, 15, 2, 3, 4, 5, 10, 11, 12, 13}));
  EXPECT_EQ(c.groups, 3);  // untouched
  sharding::plans::split_capacity_over_chips(c, 8, 1, 2, false, 1);  // contiguous (Ulysses)
  EXPECT_EQ(c.split, 2);
  EXPECT_EQ(c.order, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  sharding::plans::split_capacity_over_chips(c, 8, 1, 1, true, 1);  // no split: no pieces
  EXPECT_EQ(c.split, 1);
  EXPECT_TRUE(c.order.empty());
  c.factor = 0;  // dropless: no pieces either
  sharding::plans::split_capacity_over_chips(c, 8, 1, 2, true, 2);
  EXPECT_EQ(c.split, 1);
  kernels::CapacityOptions six{1.0};  // 6 rows do not split over 4 sp chips
  EXPECT_THROW(sharding::plans::split_capacity_over_chips(six, 6, 1, 1, true, 4), std::invalid_argument);
}

// routing: histogram (model.moe.routing_file): a CSV "layer,expert,tokens", layer "all" for every MoE layer without
// rows of its own; the declared routing then gives each expert its row's share, the largest row first on ties.
TEST(MoeConfig, RoutingHistogramFile) {
  const std::string f = testing::TempDir() + "moe_hist.csv";
  auto with = [&](const std::string& csv) {
    std::ofstream(f) << csv;
    return "model:\n  moe: {experts: 4, top_k: 1, expert_ffn: 4, dense_layers: 1, routing: histogram, routing_file: " + f +
           "}\n";
  };
  const kernels::MoeConfig c = parse(with("layer,expert,tokens\nall,0,6\nall,1,2\nall,2,0\nall,3,0\n3,3,1"));
  ASSERT_EQ(c.routing.histogram.size(), 4u);
  EXPECT_TRUE(c.routing.histogram[0].empty());  // dense layer 0
  EXPECT_EQ(c.routing.histogram[1], (std::vector<double>{6, 2, 0, 0}));
  EXPECT_EQ(c.routing.histogram[3], (std::vector<double>{0, 0, 0, 1}));
  // 80 tokens top-1: 60 / 20 / 0 / 0 on layer 1; all on expert 3 on layer 3; no row: uniform.
  EXPECT_EQ(kernels::declared_routing(c.spec, 80, c.routing, 0, 1).counts, (std::vector<int64_t>{60, 20, 0, 0}));
  EXPECT_EQ(kernels::declared_routing(c.spec, 80, c.routing, 0, 3).counts, (std::vector<int64_t>{0, 0, 0, 80}));
  EXPECT_EQ(kernels::declared_routing(c.spec, 80, c.routing, 0, 0).counts, (std::vector<int64_t>{20, 20, 20, 20}));
  // Top-2 over 10 tokens, all weight on one expert: it takes every token once, the excess goes by the row's order.
  kernels::MoeSpec k2 = c.spec;
  k2.router.top_k = 2;
  EXPECT_EQ(kernels::declared_routing(k2, 10, c.routing, 0, 3).counts[3], 10);
  const auto bad = [&](const std::string& csv, const std::string& what) {
    const std::string e = error_of(with(csv));
    EXPECT_NE(e.find(what), std::string::npos) << e;
    EXPECT_NE(e.find("model.moe.routing_file"), std::string::npos) << e;
  };
  bad("layer,expert,tokens\n0,1,5\n", ":2: ");                      // a dense layer
  bad("layer,expert,tokens\nall,4,5\n", "expert '4'");
  bad("layer,expert,tokens\nall,1,-1\n", "tokens '-1'");
  bad("layer,expert,tokens\nall,1,inf\n", "tokens 'inf'");
  bad("layer,expert,tokens\nall,1,1\nall,1,2\n", "first on line 2");
  bad("layer,expert,tokens\n1,1,1\n", "MoE layer 2 has no records");
  bad("layer,expert,tokens\nall,1,0\n", "sum to 0");
  bad("expert,layer,tokens\n", "header");
  bad("layer,expert,tokens\nall,\x1b[31m,1\n", "\\x1b");  // echoed escaped
  std::remove(f.c_str());
  EXPECT_NE(error_of("model:\n  moe: {experts: 4, top_k: 1, expert_ffn: 4, routing: histogram}\n").find("routing_file"),
            std::string::npos);
  EXPECT_NE(error_of("model:\n  moe: {experts: 4, top_k: 1, expert_ffn: 4, routing_file: x.csv}\n").find("only used"),
            std::string::npos);
}
