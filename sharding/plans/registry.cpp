#include "sharding/plans/registry.h"

#include <algorithm>

#include "collectives/algorithms.h"
#include "collectives/registry.h"
#include "common/byte_size.h"
#include "sharding/plans/expert_parallel_config.h"
#include "sharding/plans/pipeline_schedule.h"

namespace shardsim::sharding::plans {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

bool train(const PlanParse& c) { return c.use == SpecUse::train; }

// Tokens of one sequence on each chip of the context axis (cp x ulysses shards).
int64_t tokens_per_context_shard(const ModelSpec& s, const ParallelPlan& p) {
  return s.seq / (int64_t{p.cp} * p.ulysses);
}

// ---- tp: tensor parallel (tensor_parallel.h) ----
void tp_check(const PlanParse& c, const ParallelPlan& p) {
  const ModelSpec& s = c.model;
  if (c.use == SpecUse::mlp) {
    if (s.ffn < p.tp)
      c.fail("tp", "model.ffn " + str(s.ffn) + " is smaller than tp=" + str(p.tp) +
                       ": some chips would hold no FFN column");
    return;
  }
  // Whole heads per chip; KV heads split, or (tp above their count) replicated whole.
  if (s.heads % p.tp != 0)
    c.fail("tp", str(s.heads) + " query heads are not divisible by tp " + str(p.tp) +
                     " (uneven head splits are not supported)");
  if (s.kv_heads % p.tp != 0) {
    if (p.tp % s.kv_heads != 0)
      c.fail("tp", str(s.kv_heads) + " KV heads and tp " + str(p.tp) +
                       ": one must divide the other (KV heads are split or replicated whole)");
    // The executor replicates them in its forward (run); its backward does not yet.
    if (train(c) && !c.forward)
      c.not_implemented("tp", "tp: tp above the " + str(s.kv_heads) + " KV heads (replicated KV heads)");
  }
  if (train(c))
    for (const char* k : {"ffn", "vocab"}) {
      const int64_t v = std::string(k) == "ffn" ? s.ffn : s.vocab;
      if (v % p.tp != 0)
        c.fail("tp", std::string("model.") + k + " " + str(v) + " is not a multiple of tp " + str(p.tp) +
                         " (the trainer splits whole ffn columns and vocabulary rows)");
    }
}
std::string tp_text(const ModelSpec& s, const ParallelPlan& p, bool) {
  if (!s.has_attention())  // the MLP-only model: the placements of its tensors on the tp axis
    return "tensor parallel tp=" + str(p.tp) + " (Megatron MLP: gate/up column-parallel Shard(1), down row-parallel "
           "Shard(0), all_reduce(sum) of the output)";
  return "tensor parallel tp=" + str(p.tp) + " (Megatron: column-parallel q/k/v, gate/up; row-parallel wo, w_down" +
         (s.has_embedding() ? "; vocab-parallel embedding and cross-entropy)" : ")");
}

// ---- sp: sequence parallel (sequence_parallel.h) ----
void sp_read(const PlanParse& c, ParallelPlan& p) {
  if (!c.given) return;
  p.sp = c.par.get_bool("sp", false);
  if (p.sp && p.tp == 1) c.fail("sp", "sequence parallelism needs tp > 1 (it splits the tp axis)");
  if (p.sp && c.use == SpecUse::mlp) c.not_implemented("sp", "sp: the MLP shards no sequence");
  // sp x ulysses: the trainer runs it (sp on the tp axis around the tp GEMMs, the Ulysses all_to_alls on the cp
  // axis around attention); the block's forward does not yet.
  if (p.ulysses > 1 && p.sp && !train(c)) c.not_implemented("sp", "sp with ulysses");
}
void sp_check(const PlanParse& c, const ParallelPlan& p) {
  const int64_t shard = tokens_per_context_shard(c.model, p);
  if (p.sp && shard % p.tp != 0)
    c.fail("sp", "the " + str(shard) + " tokens per context shard are not divisible by tp " + str(p.tp));
}
std::string sp_text(const ModelSpec&, const ParallelPlan&, bool) {
  return "sequence parallel (reduce_scatter / all_gather around the norms)";
}

// ---- fused: the tp collectives fused with their GEMMs (sharding/fused.h) ----
void fused_read(const PlanParse& c, ParallelPlan& p) {
  if (!c.given) return;
  // The output [this chip's tokens, hidden] is what gemm_all_reduce cuts into chunks.
  p.fused = parse_fused_plan(c.par, p.tp, tokens_per_context_shard(c.model, p), c.model.hidden);
  if (p.fused.enabled && p.sp && c.has("chunks"))
    c.fail("chunks", "with sp the fused ops are rings over the tp shards (tp pieces); chunks applies to the "
                     "all_reduce form (sp: false)");
  if (!train(c) || c.forward) return;  // the forward mode runs both forms (the plan units')
  if (p.fused.enabled && !p.sp)
    c.not_implemented("fused", "fused: fused without sp (gemm_all_reduce; the trainer fuses the sequence-parallel "
                               "collectives: set sp: true)");
  if (c.has("chunks")) c.not_implemented("chunks", "chunks: (the trainer's fused ops are rings of tp pieces)");
}
std::string fused_text(const ModelSpec& s, const ParallelPlan& p, bool train_mode) {
  if (p.sp)
    return std::string("fused: all_gather_gemm / gemm_reduce_scatter") + (train_mode ? " and their backward" : "");
  return std::string("fused: ") + (s.has_attention() ? "the row-parallel GEMMs" : "the down projection") +
         " + all_reduce as one gemm_all_reduce (" + p.fused.describe() + ")";
}

// ---- cp: context parallel, ring attention (context_parallel.h) ----
void refuse_unfused(const PlanParse& c, const char* key) {
  if (c.model.attention_impl == AttentionImpl::unfused)
    c.not_implemented(key, std::string(key) + " with model.attention_impl: unfused (context parallelism runs the "
                                              "flash-style kernels)");
}
void cp_read(const PlanParse& c, ParallelPlan& p) {
  if (!c.given) return;
  const std::string split = c.par.get_string("cp_split", "zigzag");
  if (split != "zigzag" && split != "contiguous") c.fail("cp_split", "'" + split + "' (zigzag | contiguous)");
  if (c.has("cp_split") && p.cp == 1) c.fail("cp_split", "only used with context parallelism (cp > 1)");
  p.zigzag = split == "zigzag";
  if (p.cp == 1) return;
  if (c.use == SpecUse::mlp) c.not_implemented("cp", "cp: the MLP shards no sequence");
  refuse_unfused(c, "cp");
}
void cp_check(const PlanParse& c, const ParallelPlan& p) {
  if (p.cp > 1 && !c.model.causal)
    c.fail("cp", "ring attention runs the causal mask only (model.causal: false needs cp 1, or ulysses)");
  if (p.cp > 1 && c.model.seq % (p.zigzag ? 2 * p.cp : p.cp) != 0)
    c.fail("cp", "seq " + str(c.model.seq) + " is not divisible by " +
                     (p.zigzag ? "2*cp = " + str(2 * p.cp) + " (zig-zag split)" : "cp = " + str(p.cp)));
}
std::string cp_text(const ModelSpec&, const ParallelPlan& p, bool train_mode) {
  return "context parallel cp=" + str(p.cp) + " (ring attention" + (train_mode ? " forward and backward" : "") + ", " +
         (p.zigzag ? "zig-zag" : "contiguous") + " split)";
}

// ---- ulysses: DeepSpeed-Ulysses all_to_all attention on the cp axis (ulysses.h) ----
void ulysses_read(const PlanParse& c, ParallelPlan& p) {
  if (p.ulysses == 1) return;
  if (p.cp > 1) c.fail("ulysses", "ulysses and cp both shard the sequence on the mesh's cp axis; use one of them");
  if (c.use == SpecUse::mlp) c.not_implemented("ulysses", "ulysses: the MLP shards no sequence");
  refuse_unfused(c, "ulysses");
}
void ulysses_check(const PlanParse& c, const ParallelPlan& p) {
  if (p.ulysses == 1) return;
  const ModelSpec& s = c.model;
  if (s.seq % p.ulysses != 0) c.fail("ulysses", "seq " + str(s.seq) + " is not divisible by " + str(p.ulysses));
  // Each tp shard's heads are split over the ulysses ranks; KV heads split, or replicated when fewer.
  const int64_t hq = s.heads / p.tp, hkv = s.kv_heads % p.tp == 0 ? s.kv_heads / p.tp : 0;
  const std::string per = p.tp > 1 ? " per tp shard" : "";
  if (hq % p.ulysses != 0)
    c.fail("ulysses", str(hq) + " query heads" + per + " are not divisible by " + str(p.ulysses));
  if (hkv == 0 || (hkv % p.ulysses != 0 && p.ulysses % hkv != 0))
    c.fail("ulysses", str(hkv) + " KV heads" + per + " are neither a multiple nor a divisor of " + str(p.ulysses) +
                          " (Ulysses splits or replicates them)");
  if (hkv % p.ulysses != 0 && c.use == SpecUse::block)
    c.not_implemented("ulysses", "ulysses: ulysses above the " + str(hkv) + " KV heads" + per +
                                     " (replicated KV heads)");
}
std::string ulysses_text(const ModelSpec&, const ParallelPlan& p, bool train_mode) {
  return "Ulysses ulysses=" + str(p.ulysses) + " (all_to_all sequence <-> heads" +
         (train_mode ? ", forward and backward)" : ")");
}

// ---- pp: pipeline parallel (pipeline_schedule.h) ----
void pp_read(const PlanParse& c, ParallelPlan& p) {
  if (!c.given) return;
  if (p.pp > 1 && !train(c)) c.not_implemented("pp", "pp: pipeline parallelism");
  if (p.pp > 1 && c.model.tied_embeddings)
    c.not_implemented("pp", "pp with model.tied_embeddings (the embedding's and the head's stages would all_reduce "
                            "the shared weight's gradient)");
  for (const char* k : {"schedule", "virtual_stages", "pp_layers"})
    if (c.has(k) && p.pp == 1) c.fail(k, "only used with pipeline parallelism (pp > 1)");
  p.schedule = c.par.get_string("schedule", "1f1b");
  if (!schedule_from_name(p.schedule)) c.fail("schedule", "'" + p.schedule + "' (" + kScheduleNames + ")");
  if (train(c) && p.fused.enabled && p.pp > 1 && p.schedule == "zb_h1")
    c.not_implemented("fused", "fused with schedule: zb_h1 (zb_h1 defers the weight gradients' GEMMs, which the "
                               "fused ops compute inside)");
  p.virtual_stages = static_cast<int>(c.par.get_int_in("virtual_stages", 1, SpecBounds::layers, 1));
  if (c.given && c.par.yaml()["pp_layers"].IsDefined())  // each entry in [1, layers]: the sum cannot wrap
    p.pp_layers = c.par.get_int_list_in("pp_layers", 1, SpecBounds::layers);
}
// Micro-batches of one replica's step.
int micro_batches(const ModelSpec& s, const ParallelPlan& p) {
  const int64_t per_replica = s.batch / (int64_t{p.dp} * p.ep);  // ep: one more data-parallel axis for the batch
  return static_cast<int>(s.micro_batch > 0 ? per_replica / s.micro_batch : 1);
}
void pp_check(const PlanParse& c, const ParallelPlan& p) {
  if (!train(c) || p.pp == 1) return;
  const std::string why = pipeline_obstacle(*schedule_from_name(p.schedule), p.pp, micro_batches(c.model, p),
                                            p.virtual_stages, c.model.layers, p.pp_layers);
  if (why.empty()) return;
  // The obstacle names its key: parallel.KEY or model.KEY.
  const std::string key = why.substr(0, why.find(':'));
  const std::string leaf = key.substr(key.find('.') + 1);
  (key.rfind("model.", 0) == 0 ? c.model_at(leaf) : c.at(leaf)).fail(why);
}
// Layers per model stage, "2/2/3"; a run of four or more equal stages is written once with its count, "1 (x105)",
// so a 35-stage, 3-chunk plan is one short line instead of 105 numbers.
std::string stage_layers_text(const std::vector<int64_t>& per) {
  std::string text;
  for (size_t i = 0; i < per.size();) {
    size_t j = i;
    while (j < per.size() && per[j] == per[i]) ++j;
    const size_t run = j - i;
    if (run >= 4) {
      text += (text.empty() ? "" : "/") + str(per[i]) + " (x" + str(static_cast<int64_t>(run)) + ")";
    } else {
      for (size_t k = i; k < j; ++k) text += (text.empty() ? "" : "/") + str(per[k]);
    }
    i = j;
  }
  return text;
}
std::string pp_text(const ModelSpec& s, const ParallelPlan& p, bool train_mode) {
  const std::string layers = stage_layers_text(stage_layers(s.layers, p.pp * p.virtual_stages, p.pp_layers));
  return "pipeline pp=" + str(p.pp) + " (" + p.schedule +
         (p.virtual_stages > 1 ? ", " + str(p.virtual_stages) + " virtual stages per chip" : std::string()) + ", " +
         str(micro_batches(s, p)) + " micro-batches, layers per stage " + layers + "; activations" +
         (train_mode ? " and their gradients" : "") + " sent stage to stage)";
}

// ---- dp: data parallel, ZeRO stages, gradient buckets and their overlap (data_parallel.h) ----
void dp_read(const PlanParse& c, ParallelPlan& p) {
  if (!c.given) return;
  p.zero = static_cast<int>(c.par.get_int_in("zero", 0, 3, 0));
  if (c.par.has("bucket_bytes") && c.par.child("bucket_bytes").printable_text() == "auto") p.bucket_bytes = -1;
  else p.bucket_bytes = config_bytes_in(c.par, "bucket_bytes", 0, SpecBounds::bucket_bytes, p.bucket_bytes);
  p.overlap_grad_reduce = c.par.get_bool("overlap_grad_reduce", !p.sp);
  p.overlap_param_gather = c.par.get_bool("overlap_param_gather", false);
  if (p.overlap_param_gather && (p.zero < 1 || p.zero > 2))
    c.fail("overlap_param_gather", "needs zero 1 or 2 (the distributed optimizer's parameter all_gather; ZeRO-3 "
                                   "gathers before every use already)");
}
void dp_check(const PlanParse& c, const ParallelPlan& p) {
  const ModelSpec& s = c.model;
  if (!train(c)) {
    if (s.batch != 0 && s.batch != p.dp)
      c.at("dp").fail("model.batch other than dp (one sequence per replica): not implemented yet in " +
                      std::string(spec_use_name(c.use)));
    return;
  }
  if (s.batch % p.dp != 0)
    c.fail("dp", "the global batch (model.batch " + str(s.batch) + " sequences) must be a multiple of dp (" +
                     str(p.dp) + ")");
  if (s.micro_batch > 0 && (s.batch / p.dp) % s.micro_batch != 0) {
    const ConfigNode at = c.model_at("micro_batch");
    const std::string path = c.root.has("workload") ? c.root.child("workload").path() : "model";
    at.fail(path + ".micro_batch: " + str(s.micro_batch) + " sequences per micro-batch must divide the " +
            str(s.batch / p.dp) + " sequences of each data-parallel replica (model.batch / dp = " + str(s.batch) +
            " / " + str(p.dp) + ")");
  }
}
std::string dp_text(const ModelSpec&, const ParallelPlan& p, bool train_mode) {
  if (!train_mode) return "data parallel dp=" + str(p.dp) + " (replicas)";
  const int nd = p.dp * p.cp * p.ulysses;
  std::string t = "data parallel dp=" + str(p.dp) + " (gradients averaged over " +
                  (nd != p.dp ? std::string(p.cp > 1 ? "dp x cp = " : "dp x ulysses = ") + str(nd) : "dp") +
                  ", ZeRO stage " + str(p.zero) + ", ";
  if (p.zero == 3) t += "reduced per unit";
  else if (p.bucket_bytes == 0) t += "one reduction after the backward";
  else if (p.bucket_bytes < 0)
    t += p.overlap_grad_reduce ? "Megatron's buckets (max(40M, 1M x " + str(nd) +
                                     ") elements on the first stage's first model chunk, one bucket per chunk "
                                     "elsewhere) reduced as ready"
                               : "one bucket per model chunk, reduced after the backward (Megatron's rule)";
  else
    t += "buckets of " + str(p.bucket_bytes) + " bytes reduced " + (p.overlap_grad_reduce ? "as ready" : "after the backward");
  if (p.overlap_param_gather) t += ", parameter all_gather overlapping the next forward";
  return t + ")";
}

// ---- recompute: activation recomputation none | selective | full ----
void recompute_read(const PlanParse& c, ParallelPlan& p) {
  if (c.has("recompute")) {
    if (c.root.has("train") && c.root.child("train").is_map() && c.root.child("train").has("recompute"))
      c.fail("recompute", "and train.recompute: are the same key; keep parallel.recompute");
    // none | selective | full; true and false (the older spellings) are full and none.
    const std::string r = c.par.get_string("recompute");
    if (r == "true" || r == "full") p.recompute = true;
    else if (r == "selective") p.selective_recompute = true;
    else if (r == "false" || r == "none") p.recompute = false;
    else c.fail("recompute", "'" + r + "' (none | selective | full; true = full, false = none)");
  }
  if ((p.recompute || p.selective_recompute) && !train(c)) c.fail("recompute", "training only");
}
std::string recompute_text(const ModelSpec& s, const ParallelPlan& p, bool) {
  if (p.recompute) return "recompute: full (each block's forward again right before its backward)";
  return s.attention_impl == AttentionImpl::unfused
             ? "recompute: selective (the unfused attention core's forward again in the backward)"
             : "recompute: selective (the attention core recomputed in the backward, as flash attention always does)";
}

// ---- plan-wide: the collective algorithm rule and the mesh's dimension order ----
void algorithm_read(const PlanParse& c, ParallelPlan& p) {
  for (const char* k : {"algorithm", "all_reduce"}) {
    if (!c.has(k)) continue;
    const std::string a = c.par.get_string(k);
    // algorithm: any registered name (each collective takes it where implemented); all_reduce: the tp's.
    const std::string why =
        std::string(k) == "all_reduce" ? collectives::algorithm_name_error(collectives::Collective::all_reduce, a)
        : a == "auto" || collectives::find_algorithm(a)
            ? std::string()
            : collectives::not_an_algorithm_of(collectives::Collective::all_reduce, a);
    if (!why.empty()) c.fail(k, why);
    (std::string(k) == "all_reduce" ? p.tp_all_reduce : p.algorithm) = a;
  }
  // One rule for run and train (one executor; both parse as SpecUse::train): the tp all_reduce takes
  // parallel.algorithm like every collective.
  if (train(c) && c.has("all_reduce"))
    c.fail("all_reduce", "the tp all_reduce has no algorithm of its own in run or train (one executor, one rule): "
                         "parallel.algorithm sets the algorithm of every collective of the plan, the tp all_reduce's "
                         "included");
}
void mesh_read(const PlanParse& c, ParallelPlan& p) {
  if (!c.has("mesh_dims")) return;
  for (int64_t d : c.par.get_int_list_in("mesh_dims", 0, 64)) p.mesh_dims.push_back(static_cast<int>(d));
}

// The test model (tests/unit/plan_registry_test.cpp's cases): 2 layers, 4 heads (2 KV), seq 8, batch 2; SET's
// "key: value" items (", "-separated, each starting with ", ") replace or add model keys.
std::string lm(const std::string& set = "", const std::string& par = "") {
  std::vector<std::pair<std::string, std::string>> keys = {
      {"vocab", "32"}, {"hidden", "16"}, {"layers", "2"}, {"heads", "4"}, {"kv_heads", "2"},
      {"head_dim", "4"}, {"ffn", "32"},  {"seq", "8"},    {"batch", "2"}};
  for (size_t at = set.find(", "); at != std::string::npos; at = set.find(", ", at + 2)) {
    const size_t colon = set.find(": ", at), end = set.find(", ", at + 2);
    const std::string k = set.substr(at + 2, colon - at - 2);
    const std::string v = set.substr(colon + 2, end == std::string::npos ? end : end - colon - 2);
    auto it = std::find_if(keys.begin(), keys.end(), [&](const auto& kv) { return kv.first == k; });
    if (it == keys.end()) keys.emplace_back(k, v);
    else it->second = v;
  }
  std::string model;
  for (const auto& [k, v] : keys) model += (model.empty() ? "" : ", ") + k + ": " + v;
  return "model: {" + model + "}\nparallel: {" + par + "}\n";
}
constexpr const char* kBlock = "model: {kind: transformer_block, hidden: 64, heads: 8, kv_heads: 2, ffn: 128, seq: 16}\n";

using V = PlanValue;
const std::string kSizes = "1..1048576";

// The units on the tp axis: tensor parallel, its sequence-parallel and fused variants.
void add_tp_axis_units(std::vector<PlanDescriptor>& v) {
  {
    PlanDescriptor d;
    d.name = "tp";
    d.title = "tensor parallel";
    d.summary = "Megatron column/row-parallel GEMMs (q/k/v and gate/up column-, wo and w_down row-parallel), "
                "vocab-parallel embedding and loss; whole query heads per chip, KV heads split or replicated "
                "(sharding/plans/tensor_parallel.h)";
    d.axis = "tp";
    d.size = &ParallelPlan::tp;
    d.keys = {{"tp", V::size, kSizes, "MLP: chips / dp; else 1", "tensor-parallel size", true}};
    d.check = tp_check;
    d.text = tp_text;
    d.example = {lm("", "tp: 2"), SpecUse::train, 2, ""};
    d.bad_cases = {{lm("", "tp: 3"), SpecUse::train, 3, "tp"}, {lm("", "tp: 4"), SpecUse::train, 4, "tp"}};
    v.push_back(d);
  }
  {
    PlanDescriptor d;
    d.name = "sp";
    d.title = "sequence parallel";
    d.summary = "the tp axis also splits the tokens outside the tp GEMMs: reduce_scatter / all_gather around the "
                "norms instead of the all_reduce (Korthikanti et al. 2022; sharding/plans/sequence_parallel.h)";
    d.axis = "tp";
    d.keys = {{"sp", V::flag, "true | false", "false", "sequence parallelism on the tp axis", true}};
    d.needs = {"tp"};
    d.active = [](const ParallelPlan& p) { return p.sp; };
    d.read = sp_read;
    d.check = sp_check;
    d.text = sp_text;
    d.example = {lm("", "tp: 2, sp: true"), SpecUse::train, 2, ""};
    d.bad_cases = {{lm(", seq: 9", "tp: 2, sp: true"), SpecUse::train, 2, "sp"},
                   {lm("", "sp: true"), SpecUse::train, 2, "sp"}};
    v.push_back(d);
  }
  {
    PlanDescriptor d;
    d.name = "fused";
    d.title = "fused tp collectives";
    d.summary = "the tp collectives overlapped with their GEMMs: gemm_all_reduce (chunks pieces), or with sp "
                "all_gather_gemm / gemm_reduce_scatter rings (sharding/fused.h)";
    d.axis = "tp";
    d.keys = {{"fused", V::flag, "true | false", "false", "fuse the tp collectives with their GEMMs"},
              {"chunks", V::number, "auto | 1..4096", "auto", "run, fused all_reduce form: pieces of the output"}};
    d.needs = {"tp"};
    d.active = [](const ParallelPlan& p) { return p.fused.enabled; };
    d.read = fused_read;
    d.text = fused_text;
    d.example = {std::string(kBlock) + "parallel: {tp: 2, fused: true, chunks: 2}\n", SpecUse::block, 2, ""};
    d.bad_cases = {{std::string(kBlock) + "parallel: {tp: 2, fused: true, chunks: 4096}\n", SpecUse::block, 2, "chunks"},
                   {lm("", "fused: true"), SpecUse::train, 2, "fused"}};
    v.push_back(d);
  }
}

// The units on the cp axis: ring attention and Ulysses.
void add_context_units(std::vector<PlanDescriptor>& v) {
  {
    PlanDescriptor d;
    d.name = "cp";
    d.title = "context parallel";
    d.summary = "ring attention: the sequence split over the cp axis, K/V blocks passed round the ring (zig-zag "
                "split: chip c holds chunks c and 2cp-1-c, balancing the causal mask; "
                "sharding/plans/context_parallel.h)";
    d.axis = "cp";
    d.size = &ParallelPlan::cp;
    d.keys = {{"cp", V::size, kSizes, "1", "context-parallel (ring attention) size", true},
              {"cp_split", V::choice, "zigzag | contiguous", "zigzag", "how the sequence is cut over cp", true}};
    d.excludes = {"ulysses"};
    d.read = cp_read;
    d.check = cp_check;
    d.text = cp_text;
    d.example = {lm("", "cp: 2, cp_split: contiguous"), SpecUse::train, 2, ""};
    d.bad_cases = {{lm("", "cp: 3"), SpecUse::train, 3, "cp"}, {lm("", "cp_split: contiguous"), SpecUse::train, 1,
                                                                "cp_split"}};
    v.push_back(d);
  }
  {
    PlanDescriptor d;
    d.name = "ulysses";
    d.title = "DeepSpeed-Ulysses";
    d.summary = "all_to_all attention on the cp axis: tokens -> heads before attention, heads -> tokens after "
                "(Jacobs et al. 2023; sharding/plans/ulysses.h)";
    d.axis = "cp";
    d.size = &ParallelPlan::ulysses;
    d.keys = {{"ulysses", V::size, kSizes, "1", "Ulysses size (on the mesh's cp axis)", true}};
    d.excludes = {"cp"};
    d.read = ulysses_read;
    d.check = ulysses_check;
    d.text = ulysses_text;
    d.example = {lm("", "ulysses: 2"), SpecUse::train, 2, ""};
    d.bad_cases = {{lm("", "ulysses: 3"), SpecUse::train, 3, "ulysses"},
                   {lm("", "ulysses: 2, cp: 2"), SpecUse::train, 4, "ulysses"}};
    v.push_back(d);
  }
}

// Pipeline and data parallelism, activation recomputation.
void add_step_units(std::vector<PlanDescriptor>& v) {
  {
    PlanDescriptor d;
    d.name = "pp";
    d.title = "pipeline parallel";
    d.summary = "the layers cut into stages on the outermost axis, micro-batches scheduled gpipe | 1f1b | "
                "interleaved | zb_h1, activations and their gradients sent stage to stage "
                "(sharding/plans/pipeline_schedule.h)";
    d.axis = "pp";
    d.size = &ParallelPlan::pp;
    d.keys = {{"pp", V::size, kSizes, "1", "pipeline stages (train)", true},
              {"schedule", V::choice, "gpipe | 1f1b | interleaved | zb_h1", "1f1b", "the pipeline schedule", true},
              {"virtual_stages", V::size, "1..4096", "1", "interleaved: model chunks per chip", true},
              {"pp_layers", V::list, "[n, ...] summing to layers", "even split", "layers of each model stage", true,
               false, false}};
    d.read = pp_read;
    d.check = pp_check;
    d.text = pp_text;
    d.example = {lm(", layers: 4, micro_batch: 1", "pp: 2, schedule: interleaved, virtual_stages: 2, pp_layers: [1, 1, 1, 1]"),
                 SpecUse::train, 2, ""};
    d.bad_cases = {{lm("", "pp: 4"), SpecUse::train, 4, "pp"},
                   {lm("", "tp: 2, schedule: gpipe"), SpecUse::train, 2, "schedule"},
                   {lm(", layers: 4", "pp: 2, pp_layers: [1, 2]"), SpecUse::train, 2, "pp_layers"}};
    v.push_back(d);
  }
  {
    PlanDescriptor d;
    d.name = "dp";
    d.title = "data parallel";
    d.summary = "replicas on the outermost axis but pp: the batch split over them, gradients averaged in buckets "
                "overlapping the backward, optimizer state sharded by ZeRO stage 0-3 "
                "(sharding/plans/data_parallel.h)";
    d.axis = "dp";
    d.size = &ParallelPlan::dp;
    d.keys = {{"dp", V::size, kSizes, "chips / (tp x cp x ulysses x ep x pp); MLP: 1", "data-parallel replicas", true},
              {"zero", V::number, "0..3", "0", "ZeRO stage over the dp (x cp) replicas", false, true},
              {"bucket_bytes", V::number, "auto | 0..2^50 (or 25M, 1G)", "auto (Megatron's rule)",
               "gradient bucket bytes (0: one reduction after the backward)", false, true},
              {"overlap_grad_reduce", V::flag, "true | false", "true; with sp false",
               "each bucket reduced as soon as its gradients are ready", false, true, false},
              {"overlap_param_gather", V::flag, "true | false", "false",
               "ZeRO 1-2: the parameter all_gather overlaps the next forward", false, true, false}};
    d.read = dp_read;
    d.check = dp_check;
    d.text = dp_text;
    d.example = {lm("", "dp: 2, zero: 1, bucket_bytes: 1M, overlap_grad_reduce: false, overlap_param_gather: true"),
                 SpecUse::train, 2, ""};
    d.bad_cases = {{lm("", "dp: 4"), SpecUse::train, 4, "dp"},
                   {lm("", "overlap_param_gather: true"), SpecUse::train, 1, "overlap_param_gather"},
                   {std::string(kBlock) + "parallel: {tp: 4, zero: 1}\n", SpecUse::block, 4, "zero"}};
    v.push_back(d);
  }
  {
    PlanDescriptor d;
    d.name = "recompute";
    d.title = "activation recomputation";
    d.summary = "none | selective (the attention core recomputed in the backward; Korthikanti et al. 2022) | full "
                "(each block's forward again right before its backward)";
    d.keys = {{"recompute", V::choice, "none | selective | full (true = full, false = none)", "none",
               "activation recomputation (train)", false, true}};
    d.active = [](const ParallelPlan& p) { return p.recompute || p.selective_recompute; };
    d.read = recompute_read;
    d.text = recompute_text;
    d.example = {lm("", "recompute: selective"), SpecUse::train, 1, ""};
    d.bad_cases = {{lm("", "recompute: partial"), SpecUse::train, 1, "recompute"}};
    v.push_back(d);
  }
}

// The plan-wide keys (no unit): the collective algorithm rule, the mesh order.
void add_plan_wide_keys(std::vector<PlanDescriptor>& v) {
  {
    PlanDescriptor d;
    d.name = "algorithm";
    d.title = "collective algorithms";
    d.summary = "the plan's collective algorithm (collectives/registry.h; default auto for every collective: "
                "ParallelPlan::algorithm_for)";
    d.unit = false;
    d.keys = {{"algorithm", V::name, "auto | a name of `shardsim bench --list`", "auto",
               "algorithm for every collective of the plan that implements it", false, false, false},
              {"all_reduce", V::name, "auto | an all_reduce algorithm", "auto", "refused (run and train): use algorithm"}};
    d.active = [](const ParallelPlan&) { return false; };
    d.read = algorithm_read;
    d.example = {std::string(kBlock) + "parallel: {tp: 2, algorithm: ring, all_reduce: bidir_ring}\n", SpecUse::block, 2, ""};
    d.bad_cases = {{lm("", "algorithm: bogus"), SpecUse::train, 1, "algorithm"},
                   {lm("", "all_reduce: ring"), SpecUse::train, 1, "all_reduce"}};
    v.push_back(d);
  }
  {
    PlanDescriptor d;
    d.name = "mesh";
    d.title = "device mesh order";
    d.summary = "which topology dimensions the mesh fills, innermost axis (tp) first (sharding/device_mesh.h)";
    d.unit = false;
    d.keys = {{"mesh_dims", V::list, "[d0, d1, ...]", "fastest links first",
               "topology dimensions the mesh fills, innermost axis first", false, false, false}};
    d.active = [](const ParallelPlan&) { return false; };
    d.read = mesh_read;
    d.example = {lm("", "mesh_dims: [0]"), SpecUse::train, 1, ""};
    d.bad_cases = {{lm("", "mesh_dims: [99]"), SpecUse::train, 1, "mesh_dims"}};
    v.push_back(d);
  }
}

// THE registration, in the order the parser reads the units, the plan line lists them and help prints them.
// Sizes first (tp, cp, ulysses, ep, pp, dp: the mesh's product), then each unit's read, then each unit's check.
std::vector<PlanDescriptor> make_registry() {
  std::vector<PlanDescriptor> v;
  add_tp_axis_units(v);
  add_context_units(v);
  v.push_back(ep_plan_descriptor());   // sharding/plans/expert_parallel_config.cpp
  v.push_back(etp_plan_descriptor());
  add_step_units(v);
  add_plan_wide_keys(v);
  return v;
}

std::vector<std::string_view> key_list(bool sweep) {
  std::vector<std::string_view> out;
  for (const auto& d : registered_plans())
    for (const auto& k : d.keys)
      if (!sweep || k.swept) out.emplace_back(k.name);
  if (sweep) out.emplace_back("micro_batch");  // model.micro_batch, a training plan's knob
  return out;
}

}  // namespace

ConfigNode PlanParse::at(std::string_view key) const { return has(key) ? par.child(key) : par; }

ConfigNode PlanParse::model_at(std::string_view key) const {
  const ConfigNode m = root.has("workload") ? root.child("workload") : root.has("model") ? root.child("model") : root;
  return m.has(key) ? m.child(key) : m;
}

void PlanParse::fail(std::string_view key, const std::string& message) const {
  at(key).fail("parallel." + std::string(key) + ": " + message);
}

void PlanParse::not_implemented(std::string_view key, const std::string& what) const {
  at(key).fail("parallel." + what + ": not implemented yet in " + spec_use_name(use));
}

bool PlanDescriptor::is_active(const ParallelPlan& plan) const {
  if (active) return active(plan);
  return size && plan.*size > 1;
}

const PlanKey* PlanDescriptor::key(std::string_view n) const {
  for (const auto& k : keys)
    if (k.name == n) return &k;
  return nullptr;
}

const std::vector<PlanDescriptor>& registered_plans() {
  static const std::vector<PlanDescriptor> v = make_registry();
  return v;
}

const PlanDescriptor* find_plan(std::string_view name) {
  for (const auto& d : registered_plans())
    if (d.name == name) return &d;
  return nullptr;
}

const PlanDescriptor* plan_of_key(std::string_view key, const PlanKey** out) {
  for (const auto& d : registered_plans())
    if (const PlanKey* k = d.key(key)) {
      if (out) *out = k;
      return &d;
    }
  if (out) *out = nullptr;
  return nullptr;
}

std::span<const std::string_view> plan_keys() {
  static const std::vector<std::string_view> v = key_list(false);
  return v;
}

std::span<const std::string_view> sweep_plan_keys() {
  static const std::vector<std::string_view> v = key_list(true);
  return v;
}

std::vector<std::string> mesh_plan_keys() {
  std::vector<std::string> out;
  for (const auto& d : registered_plans())
    for (const auto& k : d.keys)
      if (k.mesh) out.push_back(k.name);
  return out;
}

std::map<std::string, int> mesh_axis_sizes(const ParallelPlan& plan) {
  std::map<std::string, int> sizes;
  for (const auto& d : registered_plans())
    if (d.size && !d.axis.empty()) {
      auto [it, fresh] = sizes.emplace(d.axis, 1);
      it->second *= plan.*d.size;
    }
  return sizes;
}

std::string size_product_text(const ParallelPlan& plan) {
  std::string t;
  for (const auto& d : registered_plans()) {
    if (!d.size) continue;
    const bool always = d.name == "tp" || d.name == "cp" || d.name == "ulysses";
    if (always || plan.*d.size > 1) t += (t.empty() ? "" : " x ") + d.name + " " + str(plan.*d.size);
  }
  return t;
}

std::string plan_text(const ModelSpec& model, const ParallelPlan& plan, bool train_mode) {
  std::string t;
  for (const auto& d : registered_plans())
    if (d.unit && d.text && d.is_active(plan)) {
      const std::string part = d.text(model, plan, train_mode);
      if (!part.empty()) t += (t.empty() ? "" : "; ") + part;
    }
  return t.empty() ? "single device" : t;
}

std::string catalogue_text() {
  std::string out;
  for (const auto& d : registered_plans()) {
    out += d.name + (d.unit ? "  " : "  (plan-wide keys) ") + d.title;
    if (!d.axis.empty()) out += ", mesh axis " + d.axis;
    out += "\n  " + d.summary + "\n";
    std::string rel;
    for (const auto& n : d.needs) rel += (rel.empty() ? "" : ", ") + ("needs " + n);
    for (const auto& n : d.excludes) rel += (rel.empty() ? "" : ", ") + ("not with " + n);
    if (!rel.empty()) out += "  " + rel + "\n";
    for (const auto& k : d.keys) {
      out += "  " + k.name + ": " + k.values + " (default " + k.fallback + ") " + k.doc;
      std::string tags;
      if (k.training_only) tags += "train only";
      if (k.mesh) tags += std::string(tags.empty() ? "" : ", ") + "--plan replaces it";
      out += (tags.empty() ? "" : " [" + tags + "]") + std::string("\n");
    }
  }
  return out;
}

}  // namespace shardsim::sharding::plans

namespace shardsim::sharding {

std::span<const std::string_view> parallel_keys() { return plans::plan_keys(); }

int ParallelPlan::chips() const {
  int n = 1;
  for (const auto& d : plans::registered_plans())
    if (d.size) n *= this->*d.size;
  return n;
}

}  // namespace shardsim::sharding
