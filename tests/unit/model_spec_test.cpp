// sharding/model_spec.h: the one model description and plan, and the one collective-algorithm rule.
#include <gtest/gtest.h>

#include "common/checked.h"
#include "common/error.h"
#include "sharding/model_spec.h"

namespace shardsim::sharding {
namespace {

// One default rule for run and train: auto (NCCL's choice, collectives/registry.h) for every collective.
TEST(ParallelPlan, DefaultAlgorithmRuleIsAutoEverywhere) {
  const ParallelPlan p;
  for (PlanCollective c : {PlanCollective::tp_all_reduce, PlanCollective::sp_all_gather,
                           PlanCollective::sp_reduce_scatter, PlanCollective::ulysses_all_to_all,
                           PlanCollective::dp_gradients, PlanCollective::loss})
    EXPECT_EQ(p.algorithm_for(c), "auto");
}

TEST(ParallelPlan, NamedAlgorithmAppliesWhereItIsImplemented) {
  ParallelPlan p;
  p.algorithm = "halving_doubling";  // an all_reduce / reduce_scatter / all_gather algorithm, not all_to_all
  EXPECT_EQ(p.algorithm_for(PlanCollective::tp_all_reduce), "halving_doubling");
  EXPECT_EQ(p.algorithm_for(PlanCollective::dp_gradients), "halving_doubling");
  EXPECT_EQ(p.algorithm_for(PlanCollective::ulysses_all_to_all), "auto");  // the default rule's
  p.algorithm = "auto";
  EXPECT_EQ(p.algorithm_for(PlanCollective::ulysses_all_to_all), "auto");
  p.tp_all_reduce = "bidir_ring";  // parallel.all_reduce names the tp all_reduce's alone
  EXPECT_EQ(p.algorithm_for(PlanCollective::tp_all_reduce), "bidir_ring");
  EXPECT_EQ(p.algorithm_for(PlanCollective::sp_all_gather), "auto");
}

TEST(ModelSpec, NamesAndPieces) {
  ModelSpec m;
  EXPECT_FALSE(m.has_attention());  // heads 0
  m.heads = 4;
  EXPECT_TRUE(m.has_attention());
  m.attention = false;
  EXPECT_FALSE(m.has_attention());
  EXPECT_STREQ(position_name(PositionKind::learned), "learned");
  EXPECT_STREQ(norm_name(NormKind::layernorm), "layernorm");
  EXPECT_STREQ(mlp_name(MlpKind::geglu), "geglu");
  m.mlp = MlpKind::geglu;
  EXPECT_EQ(m.glu_activation(), kernels::Activation::gelu);
}

// The message of parsing TEXT's model: section (and its parallel: section on CHIPS chips) for USE; "" if it parses.
std::string spec_error(const std::string& text, SpecUse use, int64_t chips = 1) {
  try {
    const ConfigNode root = ConfigNode::load_string(text, "t.yaml");
    const ModelSpec m = parse_model_spec(root.child("model"), use);
    (void)parse_parallel_plan(root, m, use, chips);
    (void)parse_train_spec(root);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

constexpr const char* kLm = "model: { vocab: 32, hidden: 16, layers: 2, heads: 4, kv_heads: 2, head_dim: 4, ffn: 32, "
                            "seq: 8, batch: 2}\n";

// kLm with the "key: value" items of SET (comma-separated) replacing or adding keys.
std::string lm(const std::string& set) {
  std::string out = kLm;
  size_t at = 0;
  while (at < set.size()) {
    size_t end = set.find(", ", at);
    if (end == std::string::npos) end = set.size();
    const std::string item = set.substr(at, end - at);
    const std::string key = item.substr(0, item.find(':') + 1);
    const size_t k = out.find(" " + key);
    if (k != std::string::npos) {
      const size_t v = out.find_first_of(",}", k);
      out.replace(k + 1, v - k - 1, item);
    } else {
      out.insert(out.find('}'), ", " + item);
    }
    at = end + 2;
  }
  return out;
}

TEST(Checked, ProductsThatWrapAreRefused) {
  EXPECT_EQ(checked_product({1000000, 1000000, 1000}), int64_t{1000000000000000});
  EXPECT_FALSE(checked_product({int64_t{1} << 40, int64_t{1} << 30}));
  EXPECT_FALSE(checked_mul(-(int64_t{1} << 62), 4));
  EXPECT_FALSE(checked_add(INT64_MAX, 1));
}

TEST(ModelSpecParse, TrainingModelParses) {
  const ConfigNode root = ConfigNode::load_string(kLm, "t.yaml");
  const ModelSpec m = parse_model_spec(root.child("model"), SpecUse::train);
  EXPECT_EQ(m.vocab, 32);
  EXPECT_EQ(m.head_dim, 4);
  EXPECT_EQ(m.batch, 2);
  const ParallelPlan p = parse_parallel_plan(root, m, SpecUse::train, 2);
  EXPECT_EQ(p.dp, 2);  // no parallel section: data parallel over the chips
  EXPECT_EQ(spec_error(kLm, SpecUse::train), "");
}

// Issue inputs (hostile sizes): every one is exit 2 naming FILE:LINE and the key, never a wrapped product.
TEST(ModelSpecParse, SizesAboveTheirBoundsNameTheKey) {
  EXPECT_NE(spec_error(lm("ffn: 200000000000000000"), SpecUse::train).find("t.yaml:1: model.ffn: must be between"),
            std::string::npos);
  EXPECT_NE(spec_error(lm("hidden: 1000000000"), SpecUse::train).find("model.hidden: must be between 1 and 1048576"),
            std::string::npos);
  EXPECT_NE(spec_error(lm("vocab: 9000000000000000000, hidden: 9000000000000000000"), SpecUse::train)
                .find("model.vocab: must be between"),
            std::string::npos);
  EXPECT_NE(spec_error(lm("seq: 1000000000000, batch: 1000000000000"), SpecUse::train).find("model.seq: must be"),
            std::string::npos);
  EXPECT_NE(spec_error(lm("seq: 100000000"), SpecUse::train).find("model.seq: must be between 1 and 16777216"),
            std::string::npos);
  // Products: each factor in bounds, the product not.
  EXPECT_NE(spec_error(lm("seq: 16777216, batch: 16777216"), SpecUse::train).find("batch x seq (tokens per step)"),
            std::string::npos);
  EXPECT_NE(spec_error(lm("hidden: 1048576, ffn: 4194304"), SpecUse::train).find("hidden x ffn"), std::string::npos);
  EXPECT_NE(spec_error(lm("hidden: 262144, ffn: 1048576, layers: 4096"), SpecUse::train)
                .find("layers x parameters per layer"),
            std::string::npos);
  // Mesh axes: each within the chip limit, their product beyond int64 is refused, not wrapped.
  EXPECT_NE(spec_error(std::string(kLm) + "parallel: {tp: 1048576, cp: 1048576, ulysses: 1048576, dp: 1048576}\n",
                       SpecUse::train, 2)
                .find("parallel: tp x cp x ulysses x ep x pp"),
            std::string::npos);
}

TEST(ModelSpecParse, UnknownAlgorithmIsAParseErrorListingTheKnownOnes) {
  const std::string e = spec_error(std::string(kLm) + "parallel:\n  algorithm: bogus\n", SpecUse::train, 2);
  EXPECT_NE(e.find("t.yaml:3: parallel.algorithm: unknown algorithm 'bogus'"), std::string::npos) << e;
  EXPECT_NE(e.find("ring"), std::string::npos) << e;
  EXPECT_EQ(spec_error(std::string(kLm) + "parallel:\n  algorithm: halving_doubling\n", SpecUse::train, 2), "");
}

TEST(ModelSpecParse, VariantsNotImplementedAreRefusedNamingTheKey) {
  // train runs the GPT variants; run's block and MLP do not (yet) and say so naming the key.
  for (const char* v : {"norm: layernorm", "mlp: gelu", "position: learned", "tied_embeddings: true"}) {
    EXPECT_EQ(spec_error(lm(v), SpecUse::train), "") << v;
    const std::string block = std::string("model: {kind: transformer_block, hidden: 64, heads: 8, kv_heads: 2, ffn: "
                                          "128, seq: 16, ") + v + "}\n";
    const std::string e = spec_error(block, SpecUse::block);
    EXPECT_NE(e.find("not implemented yet in"), std::string::npos) << v << ": " << e;
    EXPECT_NE(e.find(std::string(v).substr(0, std::string(v).find(':'))), std::string::npos) << v << ": " << e;
  }
  EXPECT_NE(spec_error(lm("mlp: geglu"), SpecUse::train).find("model.mlp: geglu: not implemented yet in train"),
            std::string::npos);
  const std::string tied_pp = spec_error(lm("tied_embeddings: true, layers: 4") + "parallel: {pp: 2}\n", SpecUse::train, 2);
  EXPECT_NE(tied_pp.find("parallel.pp with model.tied_embeddings"), std::string::npos) << tied_pp;
  const std::string block_pp = "model: {kind: transformer_block, hidden: 64, heads: 8, kv_heads: 2, ffn: 128, seq: 16}\n"
                               "parallel: {pp: 2}\n";
  EXPECT_NE(spec_error(block_pp, SpecUse::block, 2).find("parallel.pp: pipeline parallelism: not implemented yet"),
            std::string::npos);
  EXPECT_NE(spec_error(lm("norm: batchnorm"), SpecUse::train).find("(rmsnorm | layernorm)"), std::string::npos);
}

TEST(ModelSpecParse, PipelinePlansNameTheKeyTheyBreak) {
  // kLm: 2 layers, batch 2. pp 2 with micro-batches of 1: m = 2.
  EXPECT_EQ(spec_error(lm("micro_batch: 1") + "parallel: {pp: 2}\n", SpecUse::train, 2), "");
  EXPECT_EQ(spec_error(lm("micro_batch: 1") + "parallel: {pp: 2, schedule: gpipe, pp_layers: [1, 1]}\n",
                       SpecUse::train, 2), "");
  auto err = [](const std::string& model_set, const std::string& par, int chips) {
    return spec_error(lm(model_set) + "parallel: " + par + "\n", SpecUse::train, chips);
  };
  EXPECT_NE(err("batch: 2", "{pp: 4}", 4).find("parallel.pp: 4 stages but the model has only 2 layers"),
            std::string::npos);
  EXPECT_NE(err("layers: 4, batch: 3, micro_batch: 1", "{pp: 2, schedule: interleaved, virtual_stages: 2}", 2)
                .find("model.micro_batch: the interleaved schedule needs"),
            std::string::npos);
  EXPECT_NE(err("layers: 6, batch: 2, micro_batch: 1", "{pp: 2, schedule: interleaved, virtual_stages: 2}", 2)
                .find("parallel.virtual_stages: 2 does not divide the 3 layers per stage"),
            std::string::npos);
  EXPECT_NE(err("layers: 4", "{pp: 2, virtual_stages: 2}", 2).find("parallel.virtual_stages: 2 virtual stages per "
                                                                   "chip need parallel.schedule: interleaved"),
            std::string::npos);
  EXPECT_NE(err("layers: 4", "{pp: 2, pp_layers: [1, 2]}", 2).find("parallel.pp_layers: the stages hold 3 layers"),
            std::string::npos);
  EXPECT_NE(err("layers: 4", "{pp: 2, schedule: pipedream}", 2).find("parallel.schedule: 'pipedream'"),
            std::string::npos);
  EXPECT_EQ(err("layers: 4", "{pp: 2, schedule: zb_h1}", 2), "");
  // The mesh-size error names every axis in its product, pp included, and why dp did not fill the chips.
  EXPECT_NE(err("layers: 4", "{pp: 2, tp: 2}", 6).find("parallel: tp 2 x cp 1 x ulysses 1 x pp 2 = 4 does not match "
                                                        "the job's 6 chips"),
            std::string::npos);
  EXPECT_NE(err("layers: 4", "{pp: 2, tp: 2}", 6).find("dp, not given, fills the chips left by tp x cp x ulysses x ep x "
                                                        "pp = 4 only when that divides them"),
            std::string::npos);
  EXPECT_NE(err("layers: 4", "{pp: 2, tp: 2, sp: true, fused: true, schedule: zb_h1}", 4)
                .find("fused with schedule: zb_h1"),
            std::string::npos);
  EXPECT_NE(err("layers: 4", "{tp: 2, schedule: gpipe}", 2).find("parallel.schedule: only used with pipeline"),
            std::string::npos);
}

TEST(ModelSpecParse, MicroBatchesDivideEachReplicasBatch) {
  EXPECT_EQ(spec_error(lm("batch: 8, micro_batch: 2"), SpecUse::train, 2), "");  // dp 2: 4 sequences, 2 micro-batches
  const std::string e = spec_error(lm("batch: 8, micro_batch: 4"), SpecUse::train, 4);  // dp 4: 2 sequences
  EXPECT_NE(e.find("model.micro_batch: 4 sequences per micro-batch must divide the 2 sequences"), std::string::npos)
      << e;
  EXPECT_NE(spec_error(lm("batch: 8, micro_batch: 3"), SpecUse::train).find("micro_batch"), std::string::npos);
  const std::string block = "model: {kind: transformer_block, hidden: 64, heads: 8, kv_heads: 2, ffn: 128, seq: 16, "
                            "micro_batch: 1}\n";
  EXPECT_NE(spec_error(block, SpecUse::block, 1).find("training only"), std::string::npos);
}

TEST(ModelSpecParse, OneRuleForWhatEachModeAccepts) {
  // tp above the KV heads: replicated in every mode; tp neither a multiple nor a divisor of them is refused.
  const std::string block = "model: {kind: transformer_block, hidden: 64, heads: 8, kv_heads: 2, ffn: 128, seq: 16}\n"
                            "parallel: {tp: 4}\n";
  EXPECT_EQ(spec_error(block, SpecUse::block, 4), "");
  const std::string lm = "model: {vocab: 32, hidden: 64, heads: 8, kv_heads: 2, head_dim: 8, ffn: 128, seq: 16, "
                         "batch: 4}\nparallel: {tp: 4}\n";
  EXPECT_EQ(spec_error(lm, SpecUse::train, 4), "");
  const std::string odd = "model: {vocab: 48, hidden: 64, heads: 12, kv_heads: 3, head_dim: 8, ffn: 96, seq: 16, "
                          "batch: 4}\nparallel: {tp: 4}\n";
  EXPECT_NE(spec_error(odd, SpecUse::train, 4).find("parallel.tp: 3 KV heads and tp 4: one must divide the other"),
            std::string::npos);
  // Keys with no effect in a forward (the registry's modes: gradient buckets) in a block config outside the
  // executor; ZeRO runs in a forward (stage 3 gathers the parameters), so it is accepted.
  const std::string buckets = "model: {kind: transformer_block, hidden: 64, heads: 8, kv_heads: 2, ffn: 128, seq: 16}\n"
                              "parallel: {tp: 4, bucket_bytes: 1M}\n";
  EXPECT_NE(spec_error(buckets, SpecUse::block, 4).find("parallel.bucket_bytes: training only"), std::string::npos);
  // The MLP: no attention keys.
  EXPECT_NE(spec_error("model: {kind: mlp, hidden: 16, ffn: 32, tokens: 8, heads: 2}\n", SpecUse::mlp)
                .find("model.heads: model.kind mlp has no attention"),
            std::string::npos);
}

}  // namespace
// parallel.recompute: none | selective | full, with true / false the older spellings of full / none.
TEST(ModelSpecParse, RecomputeTakesNoneSelectiveOrFull) {
  auto plan = [](const std::string& value) {
    const ConfigNode root = ConfigNode::load_string(std::string(kLm) + "parallel:\n  recompute: " + value + "\n", "t.yaml");
    return parse_parallel_plan(root, parse_model_spec(root.child("model"), SpecUse::train), SpecUse::train, 1);
  };
  for (const char* v : {"true", "full"}) EXPECT_TRUE(plan(v).recompute && !plan(v).selective_recompute) << v;
  for (const char* v : {"false", "none"}) EXPECT_FALSE(plan(v).recompute || plan(v).selective_recompute) << v;
  EXPECT_TRUE(plan("selective").selective_recompute);
  EXPECT_FALSE(plan("selective").recompute);
  const std::string e = spec_error(std::string(kLm) + "parallel:\n  recompute: partial\n", SpecUse::train);
  EXPECT_NE(e.find("t.yaml:3: parallel.recompute: 'partial' (none | selective | full"), std::string::npos) << e;
}

}  // namespace shardsim::sharding
