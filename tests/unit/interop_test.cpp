// interop/ (issue 52): Hugging Face config.json, Megatron-LM arguments and torchtitan TOML in; launch arguments out.
// Parameter counts against the published ones, every field accounted for, bad input as one line naming the file
// (and line) or flag, and import(export(C)) = C for every shipped training config.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "interop/hf_config.h"
#include "interop/megatron.h"
#include "interop/torchtitan.h"
#include "sharding/plans/expert_parallel_config.h"

namespace shardsim::interop {
namespace {

namespace fs = std::filesystem;
const std::string kData = std::string(SHARDSIM_CONFIG_DIR) + "/../tests/data/";

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

PlanSource loaded(const Imported& imp) { return check_loads(to_yaml(imp), "imported", imp.chips); }

// Published parameter counts: the safetensors totals on each model's Hugging Face hub page (Llama 2 7B, Llama 3 8B,
// Llama 3.2 1B, Mistral 7B v0.1, Qwen2 7B, Qwen3 8B, GPT-2, Pythia 160M, Gemma 2B). shardsim counts no linear biases
// and no q/k norms, hence "within 0.5 %" (the issue's bound), not equal.
struct Published {
  const char* file;
  int64_t params;
};
constexpr Published kPublished[] = {
    {"llama2_7b.json", 6738415616},   {"llama3_8b.json", 8030261248},   {"llama3.2_1b.json", 1235814400},
    {"mistral_7b.json", 7241732096},  {"qwen2_7b.json", 7615616512},    {"qwen3_8b.json", 8190735360},
    {"gpt2.json", 124439808},         {"pythia_160m.json", 162322944},  {"gemma_2b.json", 2506172416}};

TEST(InteropHf, DenseFamiliesLoadAndMatchPublishedParameterCounts) {
  for (const Published& p : kPublished) {
    SCOPED_TRACE(p.file);
    const Imported imp = import_hf(kData + "hf/" + p.file);
    const PlanSource s = loaded(imp);
    const double rel = std::fabs(double(param_count(s.spec)) - double(p.params)) / double(p.params);
    EXPECT_LT(rel, 0.005) << param_count(s.spec) << " vs published " << p.params;
    EXPECT_FALSE(imp.moe.any());
  }
}

TEST(InteropHf, FieldsMapToModelSpec) {
  const PlanSource s = loaded(import_hf(kData + "hf/qwen3_8b.json", HfOptions{.seq = 2048, .batch = 4}));
  EXPECT_EQ(s.spec.hidden, 4096);
  EXPECT_EQ(s.spec.layers, 36);
  EXPECT_EQ(s.spec.heads, 32);
  EXPECT_EQ(s.spec.kv_heads, 8);
  EXPECT_EQ(s.spec.head_dim, 128);
  EXPECT_EQ(s.spec.ffn, 12288);
  EXPECT_EQ(s.spec.vocab, 151936);
  EXPECT_EQ(s.spec.rope_theta, 1e6);
  EXPECT_EQ(s.spec.norm_eps, 1e-6);
  EXPECT_EQ(s.spec.seq, 2048);
  EXPECT_EQ(s.spec.batch, 4);
  EXPECT_EQ(s.spec.dtype, runtime::DType::bf16);
  const PlanSource g = loaded(import_hf(kData + "hf/gpt2.json"));
  EXPECT_EQ(g.spec.position, sharding::PositionKind::learned);
  EXPECT_EQ(g.spec.norm, sharding::NormKind::layernorm);
  EXPECT_EQ(g.spec.mlp, sharding::MlpKind::gelu);
  EXPECT_TRUE(g.spec.tied_embeddings);
  EXPECT_TRUE(g.spec.linear_bias);
  EXPECT_EQ(g.spec.ffn, 4 * 768);
  EXPECT_EQ(g.spec.seq, 1024);
  EXPECT_DOUBLE_EQ(g.spec.dropout, 0.1);
  const PlanSource l = loaded(import_hf(kData + "hf/llama3.2_1b.json"));
  EXPECT_TRUE(l.spec.tied_embeddings);
  EXPECT_EQ(l.spec.head_dim, 64);
}

TEST(InteropHf, EveryFieldIsMappedOrNamed) {
  // Each top-level field of the file appears in the header: as a source of a key, a "not expressed" line or MoE.
  for (const char* f : {"mistral_7b.json", "deepseek_v3.json", "llama4_scout.json", "pythia_160m.json", "gemma_2b.json"}) {
    SCOPED_TRACE(f);
    const std::string yaml = to_yaml(import_hf(kData + "hf/" + f));
    std::ifstream in(kData + "hf/" + f);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("  \"", 0) != 0 || line.find(": null") != std::string::npos) continue;  // set top-level keys
      const std::string key = line.substr(3, line.find('"', 3) - 3);
      if (key == "architectures") continue;
      EXPECT_NE(yaml.find(key), std::string::npos) << key << " is not in the header";
    }
  }
}

TEST(InteropHf, MoeFieldsAreRecordedAndNamed) {
  const Imported mix = import_hf(kData + "hf/mixtral_8x7b.json");
  EXPECT_EQ(mix.moe.experts, 8);
  EXPECT_EQ(mix.moe.top_k, 2);
  const Imported ds = import_hf(kData + "hf/deepseek_v3.json");
  EXPECT_EQ(ds.moe.experts, 256);
  EXPECT_EQ(ds.moe.top_k, 8);
  EXPECT_EQ(ds.moe.moe_ffn, 2048);
  EXPECT_EQ(ds.moe.shared_experts, 1);
  EXPECT_EQ(ds.moe.first_dense, 3);
  EXPECT_EQ(ds.moe.score, "sigmoid");
  EXPECT_DOUBLE_EQ(ds.moe.aux_coef, 0.001);
  const Imported q = import_hf(kData + "hf/qwen3_30b_a3b.json");
  EXPECT_EQ(q.moe.experts, 128);
  EXPECT_EQ(q.moe.moe_ffn, 768);
  const Imported l4 = import_hf(kData + "hf/llama4_scout.json");
  EXPECT_EQ(l4.moe.experts, 16);
  EXPECT_EQ(l4.moe.top_k, 1);
  // The hook: the model.moe keys each MoE model maps to parse with the model.moe parser (expert_parallel_config.h).
  for (const Imported* imp : {&mix, &ds, &q, &l4}) {
    std::string moe = "moe:\n";
    for (const Mapped& m : moe_keys(imp->moe)) moe += "  " + m.key + ": " + m.value + "\n";
    const ConfigNode node = ConfigNode::load_string(moe, "moe.yaml");
    const kernels::MoeConfig c = sharding::plans::parse_moe_config(node.child("moe"), loaded(*imp).spec);
    EXPECT_EQ(c.spec.router.experts, imp->moe.experts);
    EXPECT_EQ(c.spec.router.top_k, imp->moe.top_k);
  }
  const kernels::MoeConfig dc = sharding::plans::parse_moe_config(
      ConfigNode::load_string("moe: {experts: 256, top_k: 8, expert_ffn: 2048, shared_experts: 1, router: sigmoid, "
                              "scale: 2.5, dense_layers: 3}", "m.yaml").child("moe"), loaded(ds).spec);
  EXPECT_EQ(dc.spec.shared_ffn, 2048);
  EXPECT_EQ(moe_keys(ds.moe).size(), 9u);  // experts .. dense_layers (layer_step 1 is the default)
  const std::string yaml = to_yaml(ds);
  // The model parser reads model.moe (sharding::kModelKeys): the section is live, the header lists the sources.
  EXPECT_NE(yaml.find("# Mixture of experts: the model.moe section below"), std::string::npos);
  EXPECT_NE(yaml.find("\n  moe:\n    experts: 256\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("n_routed_experts 256"), std::string::npos);
  EXPECT_NE(yaml.find("multi-head latent attention is not expressible"), std::string::npos);
  EXPECT_NO_THROW(loaded(ds));  // the dense skeleton loads
}

TEST(InteropHf, BadInputIsOneLineNamingFileLineOrField) {
  const std::string good = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256})";
  EXPECT_NO_THROW(loaded(import_hf_text(good, "c.json")));
  EXPECT_EQ(message_of([&] { import_hf_text(good.substr(0, 100), "c.json"); }).rfind("c.json:2: not valid JSON", 0), 0u)
      << message_of([&] { import_hf_text(good.substr(0, 100), "c.json"); });
  std::string dup = good;
  dup.insert(1, "\"vocab_size\": 1, ");
  EXPECT_NE(message_of([&] { import_hf_text(dup, "c.json"); }).find("duplicate key 'vocab_size'"), std::string::npos);
  std::string unknown = good;
  unknown.replace(unknown.find("LlamaForCausalLM"), 16, "Evil\\u001b[2JModel");
  const std::string m = message_of([&] { import_hf_text(unknown, "c.json"); });
  EXPECT_NE(m.find("architectures: 'Evil\\x1b[2JModel' is not an architecture shardsim imports"), std::string::npos) << m;
  std::string big = good;
  big.replace(big.find("\"hidden_size\": 64"), 17, "\"hidden_size\": 99999999999");
  EXPECT_NE(message_of([&] { import_hf_text(big, "c.json"); }).find("c.json: hidden_size: must be at most"), std::string::npos);
  std::string text = good;
  text.replace(text.find("\"num_attention_heads\": 4"), 24, "\"num_attention_heads\": \"4\"");
  EXPECT_NE(message_of([&] { import_hf_text(text, "c.json"); }).find("num_attention_heads: must be an integer"), std::string::npos);
  EXPECT_NE(message_of([&] { import_hf_text("[1, 2]", "c.json"); }).find("expected a JSON object"), std::string::npos);
}

TEST(InteropMegatron, ArgumentsMapToThePlan) {
  const std::string args =
      "torchrun --nnodes 2 --nproc_per_node 8 pretrain_gpt.py --num-layers 8 --hidden-size 1024 "
      "--num-attention-heads 16 --group-query-attention --num-query-groups 4 --seq-length 512 --swiglu "
      "--normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights "
      "--disable-bias-linear --vocab-size 32000 --micro-batch-size 2 --global-batch-size 32 "
      "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel --bf16 "
      "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --recompute-granularity selective "
      "--num-layers-per-virtual-pipeline-stage 2 --hidden-dropout 0 --attention-dropout 0 --some-new-flag 3";
  const Imported imp = import_megatron(args);
  const PlanSource s = loaded(imp);
  EXPECT_EQ(s.chips, 16);
  EXPECT_EQ(s.plan.tp, 2);
  EXPECT_EQ(s.plan.pp, 2);
  EXPECT_EQ(s.plan.dp, 4);
  EXPECT_TRUE(s.plan.sp);
  EXPECT_EQ(s.plan.zero, 1);
  EXPECT_TRUE(s.plan.overlap_grad_reduce);
  EXPECT_TRUE(s.plan.overlap_param_gather);
  EXPECT_TRUE(s.plan.selective_recompute);
  EXPECT_EQ(s.plan.schedule, "interleaved");
  EXPECT_EQ(s.plan.virtual_stages, 2);
  EXPECT_EQ(s.spec.kv_heads, 4);
  EXPECT_EQ(s.spec.ffn, (4 * 1024 * 2 / 3) / 64 * 64);  // Megatron's --swiglu default
  EXPECT_EQ(s.spec.vocab, 32000);                       // a multiple of 128 x tp already
  EXPECT_EQ(s.spec.micro_batch, 2);
  EXPECT_EQ(s.spec.batch, 32);
  EXPECT_EQ(s.spec.dtype, runtime::DType::bf16);
  const std::string yaml = to_yaml(imp);
  EXPECT_NE(yaml.find("--some-new-flag 3: not modelled"), std::string::npos);  // unmodelled flags still import
}

TEST(InteropMegatron, PublicExampleScriptImports) {
  // NVIDIA/Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh: shell arrays, variables, comments.
  const std::string path = kData + "megatron/gpt3_175b_distributed.sh";
  EXPECT_NE(message_of([&] { import_megatron(path); })
                .find("gpt3_175b_distributed.sh:56: --tensor-model-parallel-size: tp 8 x pp 16 x cp 1 = 128 does not "
                      "divide the world size 8 (--nproc_per_node 8 x --nnodes 1)"),
            std::string::npos)
      << message_of([&] { import_megatron(path); });
  const Imported imp = import_megatron(path, LaunchOptions{.world_size = 256});
  const PlanSource s = loaded(imp);
  EXPECT_EQ(s.spec.layers, 96);
  EXPECT_EQ(s.spec.hidden, 12288);
  EXPECT_EQ(s.spec.vocab, 51200);  // GPT-2 BPE's 50257 padded to a multiple of 128 x tp 8
  EXPECT_EQ(s.spec.position, sharding::PositionKind::learned);
  EXPECT_EQ(s.plan.dp, 2);
  EXPECT_EQ(s.spec.batch, 1536);
  EXPECT_EQ(s.spec.micro_batch, 1);
}

TEST(InteropMegatron, ContradictionsAreOneLineNamingTheFlag) {
  const std::string base = "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --vocab-size 512 ";
  auto msg = [&](const std::string& extra, LaunchOptions o = {}) { return message_of([&] { import_megatron(base + extra, o); }); };
  EXPECT_NE(msg("--bf16 --fp16").find("--fp16: contradicts --bf16"), std::string::npos);
  EXPECT_NE(msg("--tensor-model-parallel-size 3", {.world_size = 8}).find("does not divide the world size 8"), std::string::npos);
  EXPECT_NE(msg("--micro-batch-size 3 --global-batch-size 16", {.world_size = 4}).find("--global-batch-size: 16 is not a multiple"),
            std::string::npos);
  EXPECT_NE(msg("--hidden-size $HIDDEN").find("'$HIDDEN' is not an integer (a shell variable"), std::string::npos);
  EXPECT_NE(msg("--num-layers 99999").find("--num-layers: must be between 1 and 4096"), std::string::npos);
  EXPECT_NE(msg("--seq-length 1e3").find("--seq-length: '1e3' is not an integer"), std::string::npos);
  EXPECT_NE(message_of([&] { import_megatron("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 8"); })
                .find("give import --vocab N"),
            std::string::npos);
}

TEST(InteropMegatron, ShellScriptsAreReadAsAShellWould) {
  const std::string script = R"(#!/bin/bash
export TP=4
PP=2  # pipeline
MODEL_ARGS=(
  --num-layers 8   # a comment
  --hidden-size=1024
  --num-attention-heads 16
)
torchrun --nnodes 1 --nproc_per_node 16 pretrain_gpt.py ${MODEL_ARGS[@]} \
  --tensor-model-parallel-size $TP --pipeline-model-parallel-size ${PP} \
  --seq-length 256 --vocab-size 1000 --data-path "/data/my corpus" --save '/ckpt/$TP' \
  --global-batch-size 8 --global-batch-size 16
)";
  const Imported imp = import_megatron_text(script, "train.sh");
  const PlanSource s = loaded(imp);
  EXPECT_EQ(s.plan.tp, 4);
  EXPECT_EQ(s.plan.pp, 2);
  EXPECT_EQ(s.plan.dp, 2);
  EXPECT_EQ(s.spec.hidden, 1024);
  EXPECT_EQ(s.spec.layers, 8);
  EXPECT_EQ(s.spec.batch, 16);  // given twice: the last wins, as argparse
  EXPECT_EQ(s.spec.vocab, 1024);  // padded to a multiple of 128 x tp 4 = 512
  const std::string yaml = to_yaml(imp);
  EXPECT_NE(yaml.find("--data-path /data/my corpus"), std::string::npos);
  EXPECT_NE(yaml.find("--save /ckpt/$TP"), std::string::npos);  // single quotes: no expansion
  EXPECT_NE(yaml.find("--global-batch-size 16: given more than once"), std::string::npos);
  // Error lines name the script line of the flag, also inside an array.
  const std::string bad = "A=(\n  --num-layers x\n)\npython pretrain_gpt.py ${A[@]}\n";
  EXPECT_NE(message_of([&] { import_megatron_text(bad, "s.sh"); }).find("s.sh:2: --num-layers: 'x' is not an integer"),
            std::string::npos)
      << message_of([&] { import_megatron_text(bad, "s.sh"); });
}

TEST(InteropTorchtitan, PublicTrainConfigImports) {
  const std::string path = kData + "torchtitan/llama3_8b.toml";
  EXPECT_NE(message_of([&] { import_torchtitan(path); }).find("data_parallel_shard_degree: -1 takes the rest"), std::string::npos);
  const PlanSource s = loaded(import_torchtitan(path, LaunchOptions{.world_size = 64}));
  EXPECT_EQ(s.spec.hidden, 4096);
  EXPECT_EQ(s.spec.ffn, 14336);
  EXPECT_EQ(s.spec.seq, 8192);
  EXPECT_EQ(s.plan.dp, 64);
  EXPECT_EQ(s.plan.zero, 3);
  EXPECT_TRUE(s.plan.selective_recompute);
  EXPECT_EQ(s.spec.batch, 64);
  const PlanSource b = loaded(import_torchtitan(kData + "torchtitan/llama3_70b.toml", LaunchOptions{.world_size = 64}));
  EXPECT_EQ(b.spec.ffn, 28672);
  EXPECT_EQ(b.plan.tp, 8);
  EXPECT_EQ(b.plan.dp, 8);
  EXPECT_TRUE(b.plan.sp);
  EXPECT_TRUE(b.plan.recompute);
  EXPECT_EQ(b.spec.batch, 64);
}

TEST(InteropTorchtitan, BadInputNamesFileLineAndKey) {
  const std::string t = "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[training]\nbatch_size = 2\n[training]\nseq_len = 8\n";
  EXPECT_EQ(message_of([&] { import_torchtitan_text(t, "j.toml"); }).rfind("j.toml:6: not valid TOML", 0), 0u)
      << message_of([&] { import_torchtitan_text(t, "j.toml"); });
  const std::string bad = "[model]\nflavor = \"9B\"\n";
  EXPECT_NE(message_of([&] { import_torchtitan_text(bad, "j.toml"); }).find("j.toml:2: [model] flavor: '9B' is not a llama3 flavor"),
            std::string::npos);
  const std::string mismatch = "[model]\nflavor = \"8B\"\n[parallelism]\ndata_parallel_shard_degree = 4\n";
  EXPECT_NE(message_of([&] { import_torchtitan_text(mismatch, "j.toml", {.world_size = 8}); }).find("is not the world size 8"),
            std::string::npos);
  EXPECT_NE(message_of([&] { import_torchtitan_text("[training\n", "j.toml"); }).find("j.toml:1: not valid TOML"), std::string::npos);
}

// The shipped training configs.
std::vector<std::string> training_configs() {
  std::vector<std::string> out;
  const std::string dir = SHARDSIM_CONFIG_DIR;
  for (const char* sub : {"", "/models", "/validation", "/validation/slow"})
    for (const auto& e : fs::directory_iterator(dir + sub)) {
      const std::string p = e.path().string();
      if (e.path().extension() != ".yaml") continue;
      std::ifstream in(p);
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string text = ss.str();
      if ((text.find("\nmodel:") == std::string::npos && text.find("\nworkload:") == std::string::npos) ||
          text.find("kind: mlp") != std::string::npos || text.find("kind: transformer_block") != std::string::npos)
        continue;
      // A published run shardsim cannot express yet (configs/validation: `# cannot_run: why`) may not load.
      if (text.find("\n# cannot_run:") != std::string::npos) continue;
      out.push_back(p);
    }
  return out;
}

TEST(InteropRoundTrip, MegatronExportThenImportGivesTheSameConfig) {
  const auto configs = training_configs();
  ASSERT_GE(configs.size(), 10u);
  size_t exact = 0;
  for (const std::string& c : configs) {
    SCOPED_TRACE(c);
    const PlanSource src = load_plan_source(c);
    std::vector<Unexpressed> un;
    const std::string args = export_megatron(src, &un);
    const PlanSource back = loaded(import_megatron_text(args, "exported", LaunchOptions{.steps = src.train.steps}));
    const std::string diff = first_difference(src, back);
    if (un.empty()) EXPECT_EQ(diff, "") << args;
    else EXPECT_NE(args.find("# not expressible: "), std::string::npos);
    exact += un.empty();
  }
  EXPECT_EQ(exact, configs.size());  // every shipped training plan is expressible as Megatron-LM arguments today
}

TEST(InteropRoundTrip, TorchtitanExportThenImportGivesTheSameConfig) {
  for (const std::string& c : training_configs()) {
    SCOPED_TRACE(c);
    const PlanSource src = load_plan_source(c);
    std::vector<Unexpressed> un;
    const std::string toml = export_torchtitan(src, &un);
    const PlanSource back = loaded(import_torchtitan_text(toml, "exported.toml", LaunchOptions{.steps = src.train.steps}));
    if (un.empty()) EXPECT_EQ(first_difference(src, back), "") << toml;
  }
  // A plan torchtitan expresses fully round-trips exactly (the shipped configs use ZeRO-1 and dropout, which it does
  // not; this one is built from the 8B llama3 flavor).
  const PlanSource tt = loaded(import_torchtitan(kData + "torchtitan/llama3_70b.toml", LaunchOptions{.world_size = 64}));
  std::vector<Unexpressed> un;
  const PlanSource back = loaded(import_torchtitan_text(export_torchtitan(tt, &un), "exported.toml"));
  EXPECT_TRUE(un.empty());
  EXPECT_EQ(first_difference(tt, back), "");
}

TEST(InteropRoundTrip, MegatronRoundTripOfAnImportIsExact) {
  const PlanSource a = loaded(import_megatron(kData + "megatron/gpt3_175b_distributed.sh", LaunchOptions{.world_size = 256}));
  const PlanSource b = loaded(import_megatron_text(export_megatron(a), "exported"));
  EXPECT_EQ(first_difference(a, b), "");
}

}  // namespace
}  // namespace shardsim::interop
