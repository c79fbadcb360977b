// Megatron-LM's parallelism, batch, recompute, optimizer-sharding and overlap flags (import), and the launch line of
// a shardsim config (export). See megatron.h.
#include <algorithm>
#include <sstream>

#include "common/error.h"
#include "common/text.h"
#include "interop/launch_args.h"
#include "interop/megatron.h"

namespace shardsim::interop {

using sharding::SpecBounds;
using std::to_string;

namespace {

int64_t world_of(LaunchArgs& a, const LaunchOptions& opt, std::string& from) {
  const char* nproc = a.has("--nproc-per-node") ? "--nproc-per-node" : "--nproc_per_node";
  const auto g = a.integer(nproc, 1, SpecBounds::axis);
  const auto n = a.integer("--nnodes", 1, SpecBounds::axis);
  if (opt.world_size > 0) {
    from = "import --world-size " + to_string(opt.world_size);
    if (g) from += " (over " + a.show(nproc) + (n ? " x " + a.show("--nnodes") : std::string()) + ")";
    return opt.world_size;
  }
  if (!g) return 0;
  from = a.show(nproc) + " x " + (n ? a.show("--nnodes") : std::string("1 node"));
  return *g * n.value_or(1);
}

void map_recompute(LaunchArgs& a, Imported& imp) {
  const auto gran = a.text("--recompute-granularity");
  if (gran && *gran != "full" && *gran != "selective")
    a.fail("--recompute-granularity", "'" + escape_control(*gran) + "' (full or selective)");
  if (a.flag("--recompute-activations") && !gran) {
    imp.set("parallel", "recompute", "selective", "--recompute-activations");
    return;
  }
  if (!gran) {
    imp.set("parallel", "recompute", "none", "(no --recompute-granularity: none)");
    return;
  }
  imp.set("parallel", "recompute", *gran, a.show("--recompute-granularity"));
  const auto method = a.text("--recompute-method");
  const auto n = a.integer("--recompute-num-layers", 1, SpecBounds::layers);
  if (*gran == "full" && method == "block")
    imp.drop(a.show("--recompute-method") + " " + a.show("--recompute-num-layers"),
             "block recompute of the first N layers per stage is not expressible: every layer is recomputed");
  else if (*gran == "full" && n && *n > 1)
    imp.drop(a.show("--recompute-num-layers"), "uniform recompute keeps one input per group of N layers; shardsim "
                                               "keeps one per layer (the same recomputed FLOPs, more kept memory)");
}

void map_sharding(LaunchArgs& a, Imported& imp, bool overlap) {
  int zero = 0;
  std::string zfrom = "(no --use-distributed-optimizer: no optimizer sharding)";
  if (a.flag("--use-distributed-optimizer")) {
    zero = 1;
    zfrom = "--use-distributed-optimizer (optimizer state and fp32 masters sharded over dp)";
  }
  const bool fsdp = a.flag("--use-custom-fsdp") | a.flag("--use-megatron-fsdp");
  if (fsdp) {
    const std::string s = a.text("--data-parallel-sharding-strategy").value_or("optim_grads_params");
    const int z = s == "no_shard" ? 0 : s == "optim" ? 1 : s == "optim_grads" ? 2 : s == "optim_grads_params" ? 3 : -1;
    if (z < 0)
      a.fail("--data-parallel-sharding-strategy", "'" + escape_control(s) + "' (no_shard, optim, optim_grads, optim_grads_params)");
    zero = z;
    zfrom = "Megatron FSDP " + a.show("--data-parallel-sharding-strategy");
  }
  if (a.flag("--use-torch-fsdp2")) {
    zero = 3;
    zfrom = "--use-torch-fsdp2 (fully sharded)";
  }
  imp.set("parallel", "zero", to_string(zero), zfrom);
  imp.set("parallel", "overlap_grad_reduce", overlap ? "true" : "false",
          overlap ? "--overlap-grad-reduce" : "(no --overlap-grad-reduce: reduced after the backward)");
  const bool opg = a.flag("--overlap-param-gather");
  if (opg && zero == 0) a.fail("--overlap-param-gather", "needs --use-distributed-optimizer (Megatron-LM asserts it)");
  if (opg && zero <= 2) imp.set("parallel", "overlap_param_gather", "true", "--overlap-param-gather");
  else if (opg) imp.drop("--overlap-param-gather", "with FSDP the parameter all_gather is prefetched per layer; "
                                                   "shardsim's overlap_param_gather is for ZeRO 1-2 only");
}

void map_bucket(LaunchArgs& a, Imported& imp, bool overlap) {
  const std::string dtype = imp.get("model", "dtype").value_or("fp32");
  const int64_t bytes = dtype == "fp32" ? 4 : 2;
  const auto n = a.integer("--ddp-bucket-size", 0, SpecBounds::bucket_bytes / 4);
  if (n) {
    imp.set("parallel", "bucket_bytes", to_string(*n * bytes), a.show("--ddp-bucket-size") + " elements x " + to_string(bytes) + " bytes");
  } else {
    imp.set("parallel", "bucket_bytes", "auto",
            std::string(overlap ? "(no --ddp-bucket-size" : "(no --overlap-grad-reduce: one bucket per model chunk") +
                ": Megatron's rule, sharding/plans/data_parallel.h \"Buckets\")");
  }
}

void map_train(LaunchArgs& a, Imported& imp, const LaunchOptions& opt) {
  imp.set("train", "steps", to_string(opt.steps), "import --steps (one simulated step by default)");
  if (a.has("--train-iters")) {
    a.use("--train-iters");
    imp.drop(a.show("--train-iters"), "the run's length: train.steps is the simulated steps (import --steps)");
  }
  if (a.has("--train-samples")) {
    a.use("--train-samples");
    imp.drop(a.show("--train-samples"), "the run's length: train.steps is the simulated steps (import --steps)");
  }
  const std::pair<const char*, const char*> keys[] = {{"--lr", "lr"},          {"--adam-beta1", "beta1"},
                                                      {"--adam-beta2", "beta2"}, {"--adam-eps", "eps"},
                                                      {"--weight-decay", "weight_decay"}, {"--clip-grad", "max_grad_norm"}};
  for (const auto& [flag, key] : keys)
    if (const auto v = a.real(flag, 0, flag == std::string("--lr") ? 1e30 : flag == std::string("--adam-beta1") ||
                                                                           flag == std::string("--adam-beta2") ? 0.999999 : 1e30))
      imp.set("train", key, number_text(*v), a.show(flag));
}

}  // namespace

void map_megatron_plan(LaunchArgs& a, Imported& imp, const LaunchOptions& opt, int64_t tp) {
  const int64_t layers = std::stoll(*imp.get("model", "layers"));
  const int64_t pp = a.integer("--pipeline-model-parallel-size", 1, SpecBounds::axis).value_or(1);
  int64_t cp = a.integer("--context-parallel-size", 1, SpecBounds::axis).value_or(1), ulysses = 1;
  const std::string comm = a.text("--cp-comm-type").value_or("p2p");
  if (comm == "a2a") std::swap(cp, ulysses);
  else if (comm != "p2p")
    imp.drop(a.show("--cp-comm-type"), "written as ring attention (p2p): the all-gather and hierarchical variants are "
                                       "not modelled");
  std::string wfrom;
  const int64_t world = world_of(a, opt, wfrom);
  const int64_t model = tp * pp * cp * ulysses;
  int64_t dp = 0;
  if (world > 0) {
    if (world % model != 0)
      a.fail("--tensor-model-parallel-size", "tp " + to_string(tp) + " x pp " + to_string(pp) + " x cp " +
                                                 to_string(cp * ulysses) + " = " + to_string(model) +
                                                 " does not divide the world size " + to_string(world) + " (" + wfrom + ")");
    dp = world / model;
    imp.chips = world;
  } else {
    imp.notes.push_back("world size unknown (no torchrun --nproc_per_node / --nnodes, no import --world-size): dp is "
                        "the chips of the run / (tp x pp x cp), e.g. `shardsim train FILE --chips N`");
  }
  imp.set("parallel", "tp", to_string(tp), a.has("--tensor-model-parallel-size") ? a.show("--tensor-model-parallel-size") : "(default 1)");
  imp.set("parallel", "pp", to_string(pp), a.has("--pipeline-model-parallel-size") ? a.show("--pipeline-model-parallel-size") : "(default 1)");
  if (ulysses > 1) imp.set("parallel", "ulysses", to_string(ulysses), a.show("--context-parallel-size") + " --cp-comm-type a2a");
  else imp.set("parallel", "cp", to_string(cp), a.has("--context-parallel-size") ? a.show("--context-parallel-size") : "(default 1)");
  if (dp > 0) imp.set("parallel", "dp", to_string(dp), "world " + to_string(world) + " / " + to_string(model) + " (" + wfrom + ")");
  const bool sp = a.flag("--sequence-parallel");
  if (sp && tp == 1) imp.drop("--sequence-parallel", "no effect with tp 1 (Megatron-LM turns it off)");
  imp.set("parallel", "sp", sp && tp > 1 ? "true" : "false", sp ? "--sequence-parallel" : "(no --sequence-parallel)");
  if (a.flag("--tp-comm-overlap")) imp.set("parallel", "fused", "true", "--tp-comm-overlap (tp collectives overlapped with their GEMMs)");
  // Batch.
  const auto micro = a.integer("--micro-batch-size", 1, SpecBounds::batch);
  const auto global = a.integer("--global-batch-size", 1, SpecBounds::batch);
  const int64_t m = micro.value_or(1);
  if (global && dp > 0 && *global % (m * dp) != 0)
    a.fail("--global-batch-size", to_string(*global) + " is not a multiple of --micro-batch-size " + to_string(m) +
                                      " x dp " + to_string(dp) + " (Megatron-LM asserts it)");
  const int64_t batch = global ? *global : m * std::max<int64_t>(dp, 1);
  imp.set("model", "batch", to_string(batch), global ? a.show("--global-batch-size") : "(no --global-batch-size: micro-batch x dp)");
  imp.set("model", "micro_batch", to_string(m), micro ? a.show("--micro-batch-size") : "(no --micro-batch-size: 1)");
  if (a.has("--rampup-batch-size")) {
    a.use("--rampup-batch-size");
    imp.drop(a.show("--rampup-batch-size"), "batch ramp-up: the simulated step is at the full global batch");
  }
  // Pipeline schedule and layers.
  int64_t v = a.integer("--num-virtual-stages-per-pipeline-rank", 1, SpecBounds::layers).value_or(1);
  if (const auto k = a.integer("--num-layers-per-virtual-pipeline-stage", 1, SpecBounds::layers)) {
    if (layers % (pp * *k) != 0)
      a.fail("--num-layers-per-virtual-pipeline-stage", to_string(*k) + " x pp " + to_string(pp) + " does not divide --num-layers " + to_string(layers));
    v = layers / (pp * *k);
  }
  if (pp > 1) imp.set("parallel", "schedule", v > 1 ? "interleaved" : "1f1b", v > 1 ? "virtual pipeline stages (interleaved 1F1B)" : "Megatron-LM's 1F1B");
  if (v > 1) imp.set("parallel", "virtual_stages", to_string(v), a.has("--num-layers-per-virtual-pipeline-stage")
                                                                     ? a.show("--num-layers-per-virtual-pipeline-stage") + ": layers / (pp x it)"
                                                                     : a.show("--num-virtual-stages-per-pipeline-rank"));
  const auto first = a.integer("--decoder-first-pipeline-num-layers", 0, SpecBounds::layers);
  const auto last = a.integer("--decoder-last-pipeline-num-layers", 0, SpecBounds::layers);
  if ((first || last) && pp > 1) {
    const int64_t stages = pp * v, f = first.value_or(-1), l = last.value_or(-1);
    const int64_t fixed = (f >= 0) + (l >= 0), rest = layers - std::max<int64_t>(f, 0) - std::max<int64_t>(l, 0);
    if (stages - fixed <= 0 || rest < 0 || rest % (stages - fixed) != 0)
      a.fail(first ? "--decoder-first-pipeline-num-layers" : "--decoder-last-pipeline-num-layers",
             "the other stages cannot share the remaining " + to_string(rest) + " layers evenly");
    std::string list = "[";
    for (int64_t s = 0; s < stages; ++s) {
      const int64_t n = s == 0 && f >= 0 ? f : s == stages - 1 && l >= 0 ? l : rest / (stages - fixed);
      list += (s ? ", " : "") + to_string(n);
    }
    imp.set("parallel", "pp_layers", list + "]", (first ? a.show("--decoder-first-pipeline-num-layers") : "") +
                                                     (first && last ? ", " : "") + (last ? a.show("--decoder-last-pipeline-num-layers") : ""));
  }
  if (pp > 1 && imp.get("model", "tied_embeddings") == "true") {
    imp.set("model", "tied_embeddings", "false", "(tied by default, but pp > 1)");
    imp.drop("tied embedding and output weights (Megatron's default) with pp " + to_string(pp),
             "train does not tie across pipeline stages yet: written untied (the head has its own vocab x hidden weight, "
             "and the embedding-gradient all_reduce between the first and last stage is not modelled)");
  }
  const bool overlap = a.flag("--overlap-grad-reduce");
  map_sharding(a, imp, overlap);
  map_bucket(a, imp, overlap);
  map_recompute(a, imp);
  map_train(a, imp, opt);
}

std::string export_megatron(const PlanSource& src, std::vector<Unexpressed>* unexpressed) {
  const auto& m = src.spec;
  const auto& p = src.plan;
  std::vector<Unexpressed> un;
  std::vector<std::string> f;
  auto add = [&](const std::string& s) { f.push_back(s); };
  auto num = [](double v) { return number_text(v); };
  add("--num-layers " + to_string(m.layers));
  add("--hidden-size " + to_string(m.hidden));
  add("--ffn-hidden-size " + to_string(m.ffn));
  add("--num-attention-heads " + to_string(m.heads));
  if (m.kv_heads != m.heads) add("--group-query-attention --num-query-groups " + to_string(m.kv_heads));
  add("--kv-channels " + to_string(m.head_dim));
  add("--seq-length " + to_string(m.seq));
  add("--max-position-embeddings " + to_string(m.seq));
  add("--vocab-size " + to_string(m.vocab));
  add("--make-vocab-size-divisible-by 1");
  add("--position-embedding-type " + std::string(m.position == sharding::PositionKind::rope ? "rope"
                                                 : m.position == sharding::PositionKind::learned ? "learned_absolute" : "none"));
  if (m.has_rope()) add("--rotary-base " + num(m.rope_theta));
  add("--normalization " + std::string(m.norm == sharding::NormKind::rmsnorm ? "RMSNorm" : "LayerNorm"));
  add("--norm-epsilon " + num(m.norm_eps));
  if (m.mlp == sharding::MlpKind::swiglu) add("--swiglu");
  if (m.mlp == sharding::MlpKind::geglu) un.push_back({"model.mlp geglu", "Megatron-LM has no GeGLU flag (--swiglu is SiLU-gated)"});
  if (!m.tied_embeddings) add("--untie-embeddings-and-output-weights");
  if (!m.linear_bias) add("--disable-bias-linear");
  add("--hidden-dropout " + num(m.dropout));
  add("--attention-dropout " + num(m.dropout));
  add("--attention-backend " + std::string(m.attention_impl == sharding::AttentionImpl::unfused ? "unfused" : "flash"));
  if (m.dtype == runtime::DType::bf16) add("--bf16");
  add("--seed " + to_string(m.seed));
  const int64_t mb = m.micro_batch > 0 ? m.micro_batch : m.batch / p.dp;
  add("--micro-batch-size " + to_string(mb));
  add("--global-batch-size " + to_string(m.batch));
  add("--tensor-model-parallel-size " + to_string(p.tp));
  add("--pipeline-model-parallel-size " + to_string(p.pp));
  if (p.ulysses > 1) add("--context-parallel-size " + to_string(p.ulysses) + " --cp-comm-type a2a");
  else add("--context-parallel-size " + to_string(p.cp));
  if (p.cp > 1 && !p.zigzag) un.push_back({"parallel.cp_split contiguous", "Megatron-LM's context parallelism always load-balances (zigzag)"});
  if (p.sp) add("--sequence-parallel");
  if (p.fused.enabled) add("--tp-comm-overlap");
  if (p.schedule == "interleaved" && p.virtual_stages > 1 && p.pp_layers.empty())
    add("--num-layers-per-virtual-pipeline-stage " + to_string(m.layers / (p.pp * p.virtual_stages)));
  else if (p.virtual_stages > 1) add("--num-virtual-stages-per-pipeline-rank " + to_string(p.virtual_stages));
  if (p.pp > 1 && (p.schedule == "gpipe" || p.schedule == "zb_h1"))
    un.push_back({"parallel.schedule " + p.schedule, "Megatron-LM runs 1F1B (interleaved with virtual stages); the "
                                                     "import reads it back as 1f1b"});
  if (!p.pp_layers.empty()) {
    const size_t n = p.pp_layers.size();
    bool middle_even = true;
    for (size_t i = 2; i + 1 < n; ++i) middle_even = middle_even && p.pp_layers[i] == p.pp_layers[1];
    if (middle_even && n >= 3) {
      add("--decoder-first-pipeline-num-layers " + to_string(p.pp_layers.front()));
      add("--decoder-last-pipeline-num-layers " + to_string(p.pp_layers.back()));
    } else {
      un.push_back({"parallel.pp_layers", "only the first and last stage may differ in Megatron-LM's flags"});
    }
  }
  if (p.zero == 1) add("--use-distributed-optimizer");
  if (p.zero >= 2) add("--use-megatron-fsdp --data-parallel-sharding-strategy " + std::string(p.zero == 2 ? "optim_grads" : "optim_grads_params"));
  if (p.overlap_grad_reduce) add("--overlap-grad-reduce");
  if (p.overlap_param_gather) add("--overlap-param-gather");
  const int64_t gbytes = m.dtype == runtime::DType::fp32 ? 4 : 2;
  if (p.bucket_bytes > 0) add("--ddp-bucket-size " + to_string(p.bucket_bytes / gbytes));
  if (p.bucket_bytes > 0 && p.bucket_bytes % gbytes) un.push_back({"parallel.bucket_bytes", "not a whole number of gradient elements"});
  if (p.recompute) add("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1");
  else if (p.selective_recompute) add("--recompute-granularity selective");
  if (!p.algorithm.empty() || !p.tp_all_reduce.empty())
    un.push_back({"parallel.algorithm", "NCCL chooses the algorithm (NCCL_ALGO in the environment)"});
  if (!p.mesh_dims.empty()) un.push_back({"parallel.mesh_dims", "rank placement is the launcher's"});
  add("--train-iters " + to_string(src.train.steps));
  add("--lr " + float_text(src.train.adamw.lr));
  add("--adam-beta1 " + float_text(src.train.adamw.beta1));
  add("--adam-beta2 " + float_text(src.train.adamw.beta2));
  add("--adam-eps " + float_text(src.train.adamw.eps));
  add("--weight-decay " + float_text(src.train.adamw.weight_decay));
  add("--clip-grad " + num(std::max(0.0, src.train.max_grad_norm)));
  std::ostringstream os;
  os << "# shardsim export megatron " << escape_control(src.where) << " (docs/IMPORT.md)\n";
  for (const Unexpressed& u : un) os << "# not expressible: " << escape_control(u.key) << ": " << u.why << "\n";
  const int64_t per_node = src.chips % 8 == 0 ? 8 : src.chips;
  os << "torchrun --nnodes " << src.chips / per_node << " --nproc_per_node " << per_node << " pretrain_gpt.py \\\n";
  for (size_t i = 0; i < f.size(); ++i) os << "  " << f[i] << (i + 1 < f.size() ? " \\\n" : "\n");
  if (unexpressed) *unexpressed = un;
  return os.str();
}

}  // namespace shardsim::interop
