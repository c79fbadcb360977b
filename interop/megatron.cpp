#include "interop/megatron.h"

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/input_file.h"
#include "common/text.h"
#include "interop/launch_args.h"

namespace shardsim::interop {

namespace {

using sharding::SpecBounds;
using std::to_string;

// Flags with no simulated cost, by group; each group is one header line.
struct IgnoredGroup {
  const char* why;
  std::vector<const char*> flags;
};
const std::vector<IgnoredGroup>& ignored_groups() {
  static const std::vector<IgnoredGroup> g = {
      {"data, tokenizer files, checkpoints, evaluation and logging: no simulated cost",
       {"--data-path", "--split", "--vocab-file", "--merge-file", "--tokenizer-model", "--save", "--load",
        "--save-interval", "--eval-interval", "--eval-iters", "--log-interval", "--tensorboard-dir", "--data-cache-path",
        "--mock-data", "--dataloader-type", "--num-workers", "--log-throughput", "--log-timers-to-tensorboard",
        "--log-validation-ppl-to-tensorboard", "--log-memory-to-tensorboard", "--wandb-project", "--wandb-exp-name",
        "--wandb-save-dir", "--timing-log-level", "--no-load-optim", "--no-load-rng", "--ckpt-format",
        "--use-checkpoint-args", "--exit-interval", "--exit-duration-in-mins", "--finetune", "--log-params-norm",
        "--log-num-zeros-in-grad", "--tensorboard-log-interval", "--async-save", "--use-dist-ckpt",
        "--distributed-timeout-minutes", "--manual-gc", "--manual-gc-interval"}},
      {"learning-rate schedule and initialisation: no simulated cost",
       {"--lr-decay-style", "--min-lr", "--lr-warmup-fraction", "--lr-warmup-iters", "--lr-decay-iters",
        "--lr-warmup-init", "--lr-decay-samples", "--lr-warmup-samples", "--init-method-std", "--optimizer"}},
      {"launcher rendezvous: no simulated cost",
       {"--master_addr", "--master_port", "--node_rank", "--rdzv_backend", "--rdzv_endpoint", "--rdzv_id",
        "--master-addr", "--master-port", "--node-rank"}},
      {"implementation switches (module classes, kernel fusions): shardsim's kernel model charges each op as modelled",
       {"--use-mcore-models", "--transformer-impl", "--no-masked-softmax-fusion", "--no-bias-gelu-fusion",
        "--no-bias-dropout-fusion", "--no-gradient-accumulation-fusion", "--no-async-tensor-model-parallel-allreduce",
        "--cross-entropy-loss-fusion", "--no-rope-fusion", "--masked-softmax-fusion", "--bias-gelu-fusion",
        "--attention-softmax-in-fp32", "--distributed-backend", "--use-legacy-models", "--ckpt-fully-parallel-save"}},
  };
  return g;
}

struct MoeFlag {
  const char* flag;
  int64_t MoeFields::*field;
};

void map_moe(LaunchArgs& a, Imported& imp) {
  const MoeFlag fields[] = {{"--num-experts", &MoeFields::experts},
                            {"--moe-router-topk", &MoeFields::top_k},
                            {"--moe-ffn-hidden-size", &MoeFields::moe_ffn},
                            {"--moe-shared-expert-intermediate-size", &MoeFields::shared_ffn},
                            {"--expert-model-parallel-size", &MoeFields::expert_parallel}};
  for (const MoeFlag& f : fields)
    if (a.has(f.flag)) {
      imp.moe.sources.push_back(a.show(f.flag));
      imp.moe.*f.field = *a.integer(f.flag, 1, SpecBounds::ffn);
    }
  for (const char* f : {"--moe-layer-freq", "--moe-grouped-gemm", "--moe-token-dispatcher-type", "--moe-aux-loss-coeff",
                        "--moe-router-load-balancing-type", "--expert-tensor-parallel-size", "--moe-router-pre-softmax",
                        "--moe-z-loss-coeff", "--moe-permute-fusion", "--moe-router-dtype", "--moe-router-score-function"})
    if (a.has(f)) {
      a.use(f);
      imp.moe.sources.push_back(a.show(f));
    }
  if (imp.moe.shared_ffn > 0) imp.moe.shared_experts = 1;
  if (const auto aux = a.real("--moe-aux-loss-coeff", 0, 1e6)) imp.moe.aux_coef = *aux;
  if (const auto score = a.text("--moe-router-score-function")) imp.moe.score = *score;
}

// Model shape flags and Megatron's defaults for the absent ones.
void map_model(LaunchArgs& a, Imported& imp, const LaunchOptions& opt, int64_t tp) {
  const auto need = [&](const char* f, int64_t hi) {
    const auto v = a.integer(f, 1, hi);
    if (!v) throw ConfigError(a.at(f) + ": missing (Megatron-LM requires it)");
    imp.set("model", f == std::string("--num-layers") ? "layers" : f == std::string("--hidden-size") ? "hidden"
                     : f == std::string("--num-attention-heads") ? "heads" : "seq",
            to_string(*v), a.show(f));
    return *v;
  };
  if (!opt.label.empty()) imp.set("model", "model", yaml_string(opt.label), "import --label");
  const int64_t layers = need("--num-layers", SpecBounds::layers);
  const int64_t hidden = need("--hidden-size", SpecBounds::hidden);
  const int64_t heads = need("--num-attention-heads", SpecBounds::heads);
  (void)layers;
  const bool gqa = a.flag("--group-query-attention");
  const auto groups = a.integer("--num-query-groups", 1, SpecBounds::heads);
  if (gqa && groups) imp.set("model", "kv_heads", to_string(*groups), a.show("--group-query-attention") + " " + a.show("--num-query-groups"));
  else imp.set("model", "kv_heads", to_string(heads), "(no --group-query-attention: multi-head attention)");
  if (!gqa && groups) imp.drop(a.show("--num-query-groups"), "ignored without --group-query-attention (as Megatron-LM does)");
  if (const auto d = a.integer("--kv-channels", 1, SpecBounds::head_dim)) imp.set("model", "head_dim", to_string(*d), a.show("--kv-channels"));
  else if (hidden % heads == 0) imp.set("model", "head_dim", to_string(hidden / heads), "(no --kv-channels: hidden / heads)");
  else a.fail("--num-attention-heads", "does not divide --hidden-size " + to_string(hidden) + " and no --kv-channels is given");
  const bool swiglu = a.flag("--swiglu");
  imp.set("model", "mlp", swiglu ? "swiglu" : "gelu", swiglu ? "--swiglu" : "(no --swiglu: GeLU MLP)");
  if (a.flag("--squared-relu")) imp.drop("--squared-relu", "squared ReLU is written as the GeLU MLP (the same GEMMs)");
  if (const auto f = a.integer("--ffn-hidden-size", 1, SpecBounds::ffn)) imp.set("model", "ffn", to_string(*f), a.show("--ffn-hidden-size"));
  else imp.set("model", "ffn", to_string(swiglu ? (4 * hidden * 2 / 3) / 64 * 64 : 4 * hidden),
               swiglu ? "(no --ffn-hidden-size, --swiglu: int(8h/3 / 64) x 64)" : "(no --ffn-hidden-size: 4 x hidden)");
  need("--seq-length", SpecBounds::seq);
  // Position embedding.
  std::string pos = a.text("--position-embedding-type").value_or(a.flag("--use-rotary-position-embeddings") ? "rope" : "learned_absolute");
  if (pos != "rope" && pos != "learned_absolute" && pos != "none")
    a.fail("--position-embedding-type", "'" + escape_control(pos) + "' (rope, learned_absolute or none; mrope and "
                                        "relative are not modelled)");
  imp.set("model", "position", pos == "learned_absolute" ? "learned" : pos,
          a.has("--position-embedding-type") ? a.show("--position-embedding-type") : a.has("--use-rotary-position-embeddings")
              ? "--use-rotary-position-embeddings" : "(no --position-embedding-type: learned_absolute)");
  if (pos == "rope") {
    const auto base = a.real("--rotary-base", 1, 1e12);
    imp.set("model", "rope_theta", number_text(base.value_or(10000)), base ? a.show("--rotary-base") : "(no --rotary-base: 10000)");
  }
  if (const auto mp = a.integer("--max-position-embeddings", 1, SpecBounds::seq))
    if (pos == "learned_absolute")
      imp.drop(a.show("--max-position-embeddings"), "the learned position table is written with seq rows (its parameters "
                                                    "differ by (max - seq) x hidden when they differ)");
  a.use("--max-position-embeddings");
  for (const char* f : {"--rotary-percent", "--rotary-seq-len-interpolation-factor", "--use-rope-scaling",
                        "--rope-scaling-factor", "--rotary-interleaved"})
    if (a.has(f)) {
      a.use(f);
      imp.drop(a.show(f), "RoPE variants change no cost here (shardsim rotates the whole head)");
    }
  // Norm.
  const std::string norm = a.text("--normalization").value_or("LayerNorm");
  if (norm != "LayerNorm" && norm != "RMSNorm") a.fail("--normalization", "'" + escape_control(norm) + "' (LayerNorm or RMSNorm)");
  imp.set("model", "norm", norm == "RMSNorm" ? "rmsnorm" : "layernorm",
          a.has("--normalization") ? a.show("--normalization") : "(no --normalization: LayerNorm)");
  const auto eps = a.real("--norm-epsilon", 1e-30, 1);
  imp.set("model", "norm_eps", number_text(eps.value_or(1e-5)), eps ? a.show("--norm-epsilon") : "(no --norm-epsilon: 1e-5)");
  if (a.flag("--apply-layernorm-1p")) imp.drop("--apply-layernorm-1p", "norm weights as 1 + w: no cost difference");
  // Embeddings, biases, dropout, attention kernels.
  const bool untie = a.flag("--untie-embeddings-and-output-weights");
  imp.set("model", "tied_embeddings", untie ? "false" : "true",
          untie ? "--untie-embeddings-and-output-weights" : "(no --untie-embeddings-and-output-weights: tied)");
  const bool no_bias = a.flag("--disable-bias-linear");
  imp.set("model", "linear_bias", no_bias ? "false" : "true", no_bias ? "--disable-bias-linear" : "(no --disable-bias-linear: biases)");
  if (a.flag("--add-qkv-bias")) imp.drop("--add-qkv-bias", "q/k/v-only biases are not expressible (linear_bias is all or none)");
  const auto hd = a.real("--hidden-dropout", 0, 0.999999), ad = a.real("--attention-dropout", 0, 0.999999);
  const double p = std::max(hd.value_or(0.1), ad.value_or(0.1));
  imp.set("model", "dropout", number_text(p), hd || ad ? (hd ? a.show("--hidden-dropout") : "") + (hd && ad ? ", " : "") +
                                                        (ad ? a.show("--attention-dropout") : "")
                                                  : "(no --hidden-dropout/--attention-dropout: 0.1)");
  if (hd.value_or(0.1) != ad.value_or(0.1))
    imp.drop(a.show(hd.value_or(0.1) < p ? "--hidden-dropout" : "--attention-dropout"),
             "one dropout probability per model: the larger, " + number_text(p) + ", is written");
  std::string backend = a.text("--attention-backend").value_or(a.flag("--use-flash-attn") ? "flash" : "auto");
  if (backend != "flash" && backend != "fused" && backend != "auto" && backend != "unfused" && backend != "local")
    a.fail("--attention-backend", "'" + escape_control(backend) + "' (flash, fused, unfused, local or auto)");
  const bool unfused = backend == "unfused" || backend == "local";
  imp.set("model", "attention_impl", unfused ? "unfused" : "flash",
          a.has("--attention-backend") ? a.show("--attention-backend") : a.has("--use-flash-attn") ? "--use-flash-attn"
                                       : "(no --attention-backend: auto, a fused flash-style kernel)");
  // Precision.
  const bool bf16 = a.flag("--bf16"), fp16 = a.flag("--fp16");
  if (bf16 && fp16) a.fail("--fp16", "contradicts --bf16 (Megatron-LM refuses both)");
  imp.set("model", "dtype", bf16 || fp16 ? "bf16" : "fp32", bf16 ? "--bf16" : fp16 ? "--fp16" : "(no --bf16/--fp16: fp32)");
  if (fp16) imp.drop("--fp16", "fp16 is written as bf16: the same bytes and peak on every modelled device (no loss scaling)");
  for (const char* f : {"--fp8-format", "--fp8-recipe", "--fp8-margin", "--fp8-amax-history-len", "--fp8-amax-compute-algo", "--fp8-param-gather"})
    if (a.has(f)) {
      a.use(f);
      imp.drop(a.show(f), "fp8 compute is not modelled by train (the step runs at the dtype written)");
    }
  if (a.flag("--accumulate-allreduce-grads-in-fp32"))
    imp.drop("--accumulate-allreduce-grads-in-fp32", "gradient reductions in fp32 are not modelled (the dtype's bytes are sent)");
  // Vocabulary: --vocab-size, or the GPT-2 BPE files; padded as Megatron-LM pads it.
  int64_t vocab = opt.vocab;
  std::string vfrom = "import --vocab";
  if (!vocab && a.has("--vocab-size")) {
    vocab = *a.integer("--vocab-size", 1, SpecBounds::vocab);
    vfrom = a.show("--vocab-size");
  }
  const auto tok = a.text("--tokenizer-type");
  if (!vocab && (tok == "GPT2BPETokenizer" || (!tok && a.has("--vocab-file") && a.has("--merge-file")))) {
    vocab = 50257;
    vfrom = (tok ? a.show("--tokenizer-type") : "--vocab-file + --merge-file (GPT-2 BPE)") + ": 50257 tokens";
  }
  if (!vocab)
    throw ConfigError(a.at(tok ? "--tokenizer-type" : "--num-layers") + ": the vocabulary size is not in the arguments "
                      "(a tokenizer file sets it): give import --vocab N");
  const int64_t divisible = a.integer("--make-vocab-size-divisible-by", 1, 1 << 20).value_or(128) * tp;
  const int64_t padded = (vocab + divisible - 1) / divisible * divisible;
  imp.set("model", "vocab", to_string(padded),
          vfrom + (padded != vocab ? ", padded to a multiple of " + to_string(divisible) +
                                         " (--make-vocab-size-divisible-by x tp, as Megatron-LM pads)" : ""));
  if (const auto seed = a.integer("--seed", 0, int64_t{1} << 62)) imp.set("model", "seed", to_string(*seed), a.show("--seed"));
  if (tok) imp.drop(a.show("--tokenizer-type"), "the tokenizer only sets the vocabulary size");
}

}  // namespace

void map_megatron_plan(LaunchArgs& a, Imported& imp, const LaunchOptions& opt, int64_t tp);  // megatron_plan.cpp

Imported import_megatron_text(const std::string& text, const std::string& where, const LaunchOptions& opt) {
  const bool file = where != "arguments";
  LaunchArgs a(text, where, file);
  Imported imp;
  imp.origin = "Megatron-LM arguments " + (file ? where : std::string("(given on the command line)"));
  const int64_t tp = a.integer("--tensor-model-parallel-size", 1, SpecBounds::axis).value_or(1);
  map_model(a, imp, opt, tp);
  map_megatron_plan(a, imp, opt, tp);
  map_moe(a, imp);
  for (const std::string& f : a.repeated()) imp.drop(a.show(f), "given more than once: the last value is used (as argparse does)");
  for (const IgnoredGroup& g : ignored_groups()) {
    std::string list;
    for (const char* f : g.flags)
      if (a.has(f)) {
        a.use(f);
        list += (list.empty() ? "" : ", ") + a.show(f);
      }
    if (!list.empty()) imp.drop(list, g.why);
  }
  for (const std::string& f : a.unused()) imp.drop(a.show(f), "not modelled: shardsim has no mapping for this flag (imported without it)");
  return imp;
}

Imported import_megatron(const std::string& arg, const LaunchOptions& opt) {
  std::error_code ec;
  if (std::filesystem::exists(arg, ec) || (arg.find("--") == std::string::npos && arg.find('\n') == std::string::npos))
    return import_megatron_text(read_input_file(arg, 1u << 20, "a Megatron-LM launch script"), arg, opt);
  return import_megatron_text(arg, "arguments", opt);
}

}  // namespace shardsim::interop
