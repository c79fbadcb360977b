#include "interop/torchtitan.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/input_file.h"
#include "common/text.h"

namespace shardsim::interop {

namespace {

using sharding::SpecBounds;
using std::to_string;

// The document with what the importer did with each key ("section.key").
class Toml {
 public:
  Toml(const std::string& text, std::string where) : where_(std::move(where)) {
    try {
      root_ = toml::parse(text, where_);
    } catch (const toml::parse_error& e) {
      throw ConfigError(where_ + ":" + to_string(e.source().begin.line) + ": not valid TOML (" +
                        escape_control(std::string(e.description())) + ")");
    }
  }
  const toml::node* node(const std::string& sec, const std::string& key) const {
    const toml::table* t = root_[sec].as_table();
    return t ? t->get(key) : nullptr;
  }
  bool has(const std::string& sec, const std::string& key) const { return node(sec, key) != nullptr; }
  void use(const std::string& sec, const std::string& key) { used_.insert(sec + "." + key); }
  std::string at(const std::string& sec, const std::string& key) const {
    const toml::node* n = node(sec, key);
    return where_ + (n ? ":" + to_string(n->source().begin.line) : "") + ": [" + escape_control(sec) + "] " + escape_control(key);
  }
  [[noreturn]] void fail(const std::string& sec, const std::string& key, const std::string& what) const {
    throw ConfigError(at(sec, key) + ": " + what);
  }
  std::string show(const std::string& sec, const std::string& key) const {
    std::ostringstream v;
    if (const toml::node* n = node(sec, key)) {
      if (n->is_floating_point()) v << number_text(n->value<double>().value());
      else n->visit([&](const auto& x) { v << x; });
    }
    std::string s = "[" + sec + "] " + key + " = " + v.str();
    if (s.size() > 100) s = s.substr(0, 97) + "...";
    return escape_control(s);
  }
  std::optional<int64_t> integer(const std::string& sec, const std::string& key, int64_t lo, int64_t hi) {
    use(sec, key);
    const toml::node* n = node(sec, key);
    if (!n) return std::nullopt;
    if (!n->is_integer()) fail(sec, key, "must be an integer (got " + show(sec, key) + ")");
    const int64_t v = n->value<int64_t>().value();
    if (v < lo || v > hi) fail(sec, key, "must be between " + to_string(lo) + " and " + to_string(hi) + " (got " + to_string(v) + ")");
    return v;
  }
  std::optional<double> real(const std::string& sec, const std::string& key, double lo, double hi) {
    use(sec, key);
    const toml::node* n = node(sec, key);
    if (!n) return std::nullopt;
    if (!n->is_number()) fail(sec, key, "must be a number (got " + show(sec, key) + ")");
    const double v = n->value<double>().value();
    if (!std::isfinite(v) || v < lo || v > hi)
      fail(sec, key, "must be between " + number_text(lo) + " and " + number_text(hi) + " (got " + show(sec, key) + ")");
    return v;
  }
  std::optional<std::string> text(const std::string& sec, const std::string& key) {
    use(sec, key);
    const toml::node* n = node(sec, key);
    if (!n) return std::nullopt;
    if (!n->is_string()) fail(sec, key, "must be a string (got " + show(sec, key) + ")");
    return n->value<std::string>().value();
  }
  std::optional<bool> flag(const std::string& sec, const std::string& key) {
    use(sec, key);
    const toml::node* n = node(sec, key);
    if (!n) return std::nullopt;
    if (!n->is_boolean()) fail(sec, key, "must be true or false (got " + show(sec, key) + ")");
    return n->value<bool>().value();
  }
  // The first of SECS that holds KEY (torchtitan moved keys between sections across versions); "" if none.
  std::string section_of(std::initializer_list<const char*> secs, const std::string& key) const {
    for (const char* s : secs)
      if (has(s, key)) return s;
    return "";
  }
  std::vector<std::pair<std::string, std::string>> unused() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& [sec, n] : root_) {
      const toml::table* t = n.as_table();
      if (!t) {
        if (!used_.count("." + std::string(sec.str()))) out.emplace_back("", std::string(sec.str()));
        continue;
      }
      for (const auto& [key, v] : *t)
        if (!used_.count(std::string(sec.str()) + "." + std::string(key.str())))
          out.emplace_back(std::string(sec.str()), std::string(key.str()));
    }
    return out;
  }
  const std::string& where() const { return where_; }

 private:
  toml::table root_;
  std::string where_;
  std::set<std::string> used_;
};

// torchtitan's llama3 flavors (torchtitan/models/llama3: TransformerModelArgs; the FFN size is
// multiple_of x ceil(ffn_dim_multiplier x int(8 dim / 3) / multiple_of)).
struct Flavor {
  const char* name;
  int64_t dim, layers, heads, kv_heads;
  double ffn_multiplier;
  int64_t multiple_of;
  int64_t ffn() const {
    const int64_t h = static_cast<int64_t>(ffn_multiplier * static_cast<double>(2 * 4 * dim / 3));
    return multiple_of * ((h + multiple_of - 1) / multiple_of);
  }
};
constexpr Flavor kLlama3[] = {{"8B", 4096, 32, 32, 8, 1.3, 1024},
                              {"70B", 8192, 80, 64, 8, 1.3, 4096},
                              {"405B", 16384, 126, 128, 8, 1.2, 4096}};
constexpr int64_t kLlama3Vocab = 128256;

const std::vector<std::string> kShapeKeys = {"vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "ffn",
                                             "rope_theta", "norm_eps", "tied_embeddings"};

void map_model(Toml& t, Imported& imp, const LaunchOptions& opt) {
  if (t.has("shardsim_model", "hidden")) {  // an export's shape for a model that is no torchtitan flavor
    for (const std::string& k : kShapeKeys)
      if (t.has("shardsim_model", k)) {
        const toml::node* n = t.node("shardsim_model", k);
        t.use("shardsim_model", k);
        std::string v;
        if (n->is_integer()) v = to_string(n->value<int64_t>().value());
        else if (n->is_floating_point()) v = number_text(n->value<double>().value());
        else if (n->is_boolean()) v = n->value<bool>().value() ? "true" : "false";
        else t.fail("shardsim_model", k, "must be a number or a boolean");
        imp.set("model", k, v, t.show("shardsim_model", k));
      }
    t.use("model", "name");
    t.use("model", "flavor");
  } else {
    const std::string name = t.text("model", "name").value_or("llama3");
    if (name != "llama3")
      t.fail("model", "name", "'" + escape_control(name) + "' is not a model shardsim imports from torchtitan (llama3; "
                              "other families: `shardsim import hf config.json`)");
    const std::string flavor = t.text("model", "flavor").value_or("");
    const Flavor* f = nullptr;
    for (const Flavor& x : kLlama3)
      if (flavor == x.name) f = &x;
    if (!f) t.fail("model", "flavor", "'" + escape_control(flavor) + "' is not a llama3 flavor shardsim knows (8B, 70B, 405B)");
    const std::string from = "llama3 " + t.show("model", "flavor");
    imp.set("model", "vocab", to_string(kLlama3Vocab), from + ": the Llama 3 tokenizer's 128256 tokens");
    imp.set("model", "hidden", to_string(f->dim), from + ": dim");
    imp.set("model", "layers", to_string(f->layers), from + ": n_layers");
    imp.set("model", "heads", to_string(f->heads), from + ": n_heads");
    imp.set("model", "kv_heads", to_string(f->kv_heads), from + ": n_kv_heads");
    imp.set("model", "head_dim", to_string(f->dim / f->heads), from + ": dim / n_heads");
    imp.set("model", "ffn", to_string(f->ffn()), from + ": ffn_dim_multiplier, multiple_of");
    imp.set("model", "rope_theta", "500000", from + ": rope_theta");
    imp.set("model", "norm_eps", "1e-05", from + ": norm_eps");
    imp.set("model", "tied_embeddings", "false", from + ": untied output");
  }
  imp.set("model", "model", yaml_string(opt.label.empty() ? "llama3" : opt.label),
          opt.label.empty() ? t.show("model", "name") : "import --label");
  imp.set("model", "mlp", "swiglu", "torchtitan llama3: SwiGLU feed-forward");
  imp.set("model", "norm", "rmsnorm", "torchtitan llama3: RMSNorm");
  imp.set("model", "position", "rope", "torchtitan llama3: rotary embedding");
  imp.set("model", "linear_bias", "false", "torchtitan llama3: no biases");
  for (const char* k : {"tokenizer_path", "hf_assets_path", "converters", "print_after_conversion"})
    if (t.has("model", k)) {
      t.use("model", k);
      const bool fp8 = std::string(k) == "converters" && t.show("model", k).find("float8") != std::string::npos;
      imp.drop(t.show("model", k), fp8 ? "float8 training is not modelled (the step runs at the dtype written)"
                                       : "tokenizer files: no simulated cost");
    }
  const std::string ts = t.section_of({"training"}, "seq_len");
  const auto seq = t.integer("training", "seq_len", 1, SpecBounds::seq);
  imp.set("model", "seq", to_string(seq.value_or(2048)), seq ? t.show("training", "seq_len") : "(no seq_len: torchtitan's 2048)");
  const std::string mp = t.text("training", "mixed_precision_param").value_or("bfloat16");
  if (mp != "bfloat16" && mp != "float32")
    t.fail("training", "mixed_precision_param", "'" + escape_control(mp) + "' (bfloat16 or float32)");
  imp.set("model", "dtype", mp == "float32" ? "fp32" : "bf16",
          t.has("training", "mixed_precision_param") ? t.show("training", "mixed_precision_param") : "(no mixed_precision_param: bfloat16)");
  const std::string seed_sec = t.section_of({"training", "debug"}, "seed");
  if (!seed_sec.empty()) imp.set("model", "seed", to_string(*t.integer(seed_sec, "seed", 0, int64_t{1} << 62)), t.show(seed_sec, "seed"));
}

int64_t degree(Toml& t, const char* key, int64_t lo, std::string& from) {
  const std::string sec = t.section_of({"parallelism", "training", "experimental"}, key);
  if (sec.empty()) return 1;
  from = t.show(sec, key);
  return *t.integer(sec, key, lo, SpecBounds::axis);
}

void map_plan(Toml& t, Imported& imp, const LaunchOptions& opt);

// S as a TOML basic string ("..." with \\, \" and \uXXXX escapes for control characters).
std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace

Imported import_torchtitan_text(const std::string& text, const std::string& where, const LaunchOptions& opt) {
  Toml t(text, where);
  Imported imp;
  imp.origin = "torchtitan job TOML " + where;
  map_model(t, imp, opt);
  map_plan(t, imp, opt);
  std::string quiet;
  for (const auto& [sec, key] : t.unused()) {
    static const std::set<std::string> kNoCost = {"job", "profiling", "metrics", "checkpoint", "comm", "lr_scheduler",
                                                  "validation", "memory_estimation", "fault_tolerance"};
    const std::string name = sec.empty() ? key : "[" + sec + "] " + key;
    if (kNoCost.count(sec)) quiet += (quiet.empty() ? "" : ", ") + name;
    else if (sec == "float8" || sec == "mx") imp.drop(t.show(sec, key), "low-precision training is not modelled");
    else if (sec == "compile" || key == "compile") imp.drop(t.show(sec, key), "torch.compile fusions are not modelled");
    else imp.drop(t.show(sec, key), "not modelled: shardsim has no mapping for this key (imported without it)");
  }
  if (!quiet.empty())
    imp.drop(quiet, "job, profiling, metrics, checkpointing, communication timeouts, LR schedule: no simulated cost");
  return imp;
}

Imported import_torchtitan(const std::string& path, const LaunchOptions& opt) {
  return import_torchtitan_text(read_input_file(path, 1u << 20, "a torchtitan job TOML"), path, opt);
}

namespace {

void map_batch(Toml& t, Imported& imp, int64_t dp, int64_t pp) {
  const std::string lk = t.has("training", "local_batch_size") ? "local_batch_size" : "batch_size";
  const auto local = t.integer("training", lk, 1, SpecBounds::batch);
  const int64_t l = local.value_or(8);
  const auto global = t.integer("training", "global_batch_size", -1, SpecBounds::batch);
  int64_t batch = l * dp;
  std::string from = (local ? t.show("training", lk) : "(no batch size: torchtitan's 8)") + " x dp " + to_string(dp);
  if (global && *global > 0) {
    if (*global % (l * dp) != 0)
      t.fail("training", "global_batch_size", to_string(*global) + " is not a multiple of " + lk + " " + to_string(l) +
                                                  " x dp " + to_string(dp) + " (gradient accumulation needs whole steps)");
    batch = *global;
    from = t.show("training", "global_batch_size");
  }
  imp.set("model", "batch", to_string(batch), from);
  if (pp > 1) {
    const std::string ms = t.section_of({"parallelism", "experimental"}, "pipeline_parallel_microbatch_size");
    const std::string ns = t.section_of({"parallelism", "experimental"}, "pipeline_parallel_microbatches");
    int64_t m = 1;
    std::string mfrom = "(no pipeline_parallel_microbatch_size: 1)";
    if (!ms.empty()) {
      m = *t.integer(ms, "pipeline_parallel_microbatch_size", 1, SpecBounds::batch);
      mfrom = t.show(ms, "pipeline_parallel_microbatch_size");
    } else if (!ns.empty()) {
      const int64_t n = *t.integer(ns, "pipeline_parallel_microbatches", 1, SpecBounds::batch);
      if (l % n != 0) t.fail(ns, "pipeline_parallel_microbatches", "does not divide the local batch " + to_string(l));
      m = l / n;
      mfrom = t.show(ns, "pipeline_parallel_microbatches") + ": local batch / it";
    }
    if (l % m != 0) t.fail(ms.empty() ? "parallelism" : ms, "pipeline_parallel_microbatch_size", "does not divide the local batch " + to_string(l));
    imp.set("model", "micro_batch", to_string(m), mfrom);
  } else if (batch > l * dp) {
    imp.set("model", "micro_batch", to_string(l), t.show("training", lk) + ": gradient accumulation over global / (local x dp)");
  }
}

void map_pipeline(Toml& t, Imported& imp, int64_t pp) {
  if (pp <= 1) return;
  const int64_t layers = std::stoll(*imp.get("model", "layers"));
  const std::string ss = t.section_of({"parallelism", "experimental"}, "pipeline_parallel_schedule");
  const std::string s = ss.empty() ? "1F1B" : *t.text(ss, "pipeline_parallel_schedule");
  const std::string from = ss.empty() ? "(no pipeline_parallel_schedule: 1F1B)" : t.show(ss, "pipeline_parallel_schedule");
  std::string sched = s == "1F1B" ? "1f1b" : s == "GPipe" ? "gpipe" : s == "Interleaved1F1B" ? "interleaved"
                      : s == "InterleavedZeroBubble" || s == "ZBVZeroBubble" ? "zb_h1" : "";
  if (sched.empty()) {
    imp.drop(from, "this schedule is not modelled: written as 1f1b");
    sched = "1f1b";
  } else if (s == "ZBVZeroBubble") {
    imp.drop(from, "ZB-V (two stages per rank in a V) is written as ZB-H1 (one stage per rank): the bubble differs");
  }
  imp.set("parallel", "schedule", sched, from);
  const std::string ls = t.section_of({"parallelism", "experimental"}, "pipeline_parallel_layers_per_stage");
  const std::string sp = t.section_of({"parallelism", "experimental"}, "pipeline_parallel_split_points");
  int64_t v = 1;
  if (!ls.empty()) {
    const int64_t per = *t.integer(ls, "pipeline_parallel_layers_per_stage", 1, SpecBounds::layers);
    if (layers % (per * pp) != 0)
      t.fail(ls, "pipeline_parallel_layers_per_stage", "x pp " + to_string(pp) + " does not divide the " + to_string(layers) + " layers");
    v = layers / (per * pp);
    if (v > 1) imp.set("parallel", "virtual_stages", to_string(v), t.show(ls, "pipeline_parallel_layers_per_stage") + ": layers / (pp x it)");
  } else if (!sp.empty()) {
    t.use(sp, "pipeline_parallel_split_points");
    const toml::array* arr = t.node(sp, "pipeline_parallel_split_points")->as_array();
    std::vector<int64_t> cuts;
    if (arr)
      for (const auto& e : *arr) {
        const auto str = e.value<std::string>();
        if (!str || str->rfind("layers.", 0) != 0) t.fail(sp, "pipeline_parallel_split_points", "entries must be \"layers.N\"");
        cuts.push_back(std::atoll(str->c_str() + 7));
      }
    if (!arr || cuts.empty() || static_cast<int64_t>(cuts.size() + 1) % pp != 0)
      t.fail(sp, "pipeline_parallel_split_points", "must cut the layers into a multiple of pp " + to_string(pp) + " stages");
    std::string list = "[";
    int64_t prev = 0;
    cuts.push_back(layers);
    for (size_t i = 0; i < cuts.size(); ++i) {
      if (cuts[i] <= prev) t.fail(sp, "pipeline_parallel_split_points", "must increase within (0, layers)");
      list += (i ? ", " : "") + to_string(cuts[i] - prev);
      prev = cuts[i];
    }
    v = static_cast<int64_t>(cuts.size()) / pp;
    if (v > 1) imp.set("parallel", "virtual_stages", to_string(v), t.show(sp, "pipeline_parallel_split_points"));
    imp.set("parallel", "pp_layers", list + "]", t.show(sp, "pipeline_parallel_split_points"));
  } else if (sched == "interleaved") {
    v = 2;
    imp.set("parallel", "virtual_stages", "2", "(Interleaved1F1B without layers per stage: 2 stages per rank)");
  }
}

void map_recompute(Toml& t, Imported& imp) {
  const std::string mode = t.text("activation_checkpoint", "mode").value_or("selective");
  const std::string from = t.has("activation_checkpoint", "mode") ? t.show("activation_checkpoint", "mode") : "(no mode: selective)";
  const std::string opt = t.text("activation_checkpoint", "selective_ac_option").value_or("2");
  if (mode == "none" || mode == "full") {
    imp.set("parallel", "recompute", mode, from);
  } else if (mode == "selective" && opt == "op") {
    imp.set("parallel", "recompute", "selective", from + ", " + t.show("activation_checkpoint", "selective_ac_option"));
    imp.drop(t.show("activation_checkpoint", "selective_ac_option"),
             "op-level selective AC (GEMM outputs kept, the rest recomputed) is written as Korthikanti's selective "
             "recompute (the attention core recomputed)");
  } else if (mode == "selective") {
    imp.set("parallel", "recompute", "full", from);
    imp.drop(t.show("activation_checkpoint", "selective_ac_option") + " (every N-th layer)",
             "layer-wise selective AC is not expressible: written as full recompute of every layer");
  } else {
    t.fail("activation_checkpoint", "mode", "'" + escape_control(mode) + "' (none, selective or full)");
  }
}

void map_plan(Toml& t, Imported& imp, const LaunchOptions& opt) {
  std::string rf, sf, tf, cf, pf;
  const int64_t rep = degree(t, "data_parallel_replicate_degree", 1, rf);
  int64_t shard = degree(t, "data_parallel_shard_degree", -1, sf);
  const int64_t tp = degree(t, "tensor_parallel_degree", 1, tf), cp = degree(t, "context_parallel_degree", 1, cf);
  const int64_t pp = degree(t, "pipeline_parallel_degree", 1, pf);
  if (shard == 0) t.fail("parallelism", "data_parallel_shard_degree", "must be -1 (the rest) or at least 1");
  const int64_t rest = rep * tp * cp * pp;
  int64_t world = opt.world_size;
  if (shard == -1) {
    if (world <= 0)
      t.fail("parallelism", "data_parallel_shard_degree", "-1 takes the rest of the world size: give import --world-size N");
    if (world % rest != 0)
      t.fail("parallelism", "data_parallel_shard_degree", "-1: replicate x tp x cp x pp = " + to_string(rest) +
                                                              " does not divide the world size " + to_string(world));
    shard = world / rest;
    sf = "data_parallel_shard_degree -1: world " + to_string(world) + " / " + to_string(rest);
  } else if (world > 0 && world != rest * shard) {
    t.fail("parallelism", "data_parallel_shard_degree", "replicate x shard x tp x cp x pp = " + to_string(rest * shard) +
                                                            " is not the world size " + to_string(world));
  }
  world = rest * shard;
  imp.chips = world;
  const int64_t dp = rep * shard;
  imp.set("parallel", "dp", to_string(dp), (rf.empty() ? "" : rf + ", ") + sf);
  imp.set("parallel", "tp", to_string(tp), tf.empty() ? "(tensor_parallel_degree 1)" : tf);
  imp.set("parallel", "sp", tp > 1 ? "true" : "false", tp > 1 ? "torchtitan's TP shards the norms' sequence (sp)" : "(tp 1)");
  imp.set("parallel", "cp", to_string(cp), cf.empty() ? "(context_parallel_degree 1)" : cf);
  imp.set("parallel", "pp", to_string(pp), pf.empty() ? "(pipeline_parallel_degree 1)" : pf);
  const std::string reshard = t.text("parallelism", "fsdp_reshard_after_forward").value_or("default");
  int zero = shard > 1 ? (reshard == "never" ? 2 : 3) : 0;
  imp.set("parallel", "zero", to_string(zero), shard > 1 ? "FSDP2 over data_parallel_shard_degree " + to_string(shard) +
                                                               ", fsdp_reshard_after_forward " + reshard
                                                         : "(no sharded data parallelism: DDP)");
  if (rep > 1 && shard > 1)
    imp.drop(rf + " with sharding (HSDP)", "ZeRO shards over every dp replica here, not within groups of " + to_string(shard));
  imp.set("parallel", "overlap_grad_reduce", "true", zero ? "FSDP2 reduce-scatters each block's gradients in the backward"
                                                          : "DDP all-reduces each bucket in the backward");
  imp.set("parallel", "bucket_bytes", "26214400", zero ? "FSDP2 reduces per block: written as 25 MiB buckets" : "DDP's bucket_cap_mb 25");
  if (const auto a = t.flag("parallelism", "enable_async_tensor_parallel"); a && *a && tp > 1)
    imp.set("parallel", "fused", "true", t.show("parallelism", "enable_async_tensor_parallel"));
  if (t.has("parallelism", "context_parallel_rotate_method")) {
    t.use("parallelism", "context_parallel_rotate_method");
    imp.drop(t.show("parallelism", "context_parallel_rotate_method"), "written as ring attention (K/V passed round the ring)");
  }
  if (t.has("parallelism", "expert_parallel_degree")) {
    t.use("parallelism", "expert_parallel_degree");
    imp.moe.sources.push_back(t.show("parallelism", "expert_parallel_degree"));
  }
  map_batch(t, imp, dp, pp);
  map_pipeline(t, imp, pp);
  map_recompute(t, imp);
  // Optimizer and training loop (torchtitan's AdamW defaults for absent keys).
  const std::string on = t.text("optimizer", "name").value_or("AdamW");
  if (on != "AdamW" && on != "Adam") imp.drop(t.show("optimizer", "name"), "written as AdamW (the optimizer's state is the same size for Adam)");
  const std::tuple<const char*, const char*, double> keys[] = {
      {"lr", "lr", 8e-4}, {"beta1", "beta1", 0.9}, {"beta2", "beta2", 0.95}, {"eps", "eps", 1e-8}, {"weight_decay", "weight_decay", 0.1}};
  for (const auto& [k, key, def] : keys) {
    const auto v = t.real("optimizer", k, 0, std::string(k).rfind("beta", 0) == 0 ? 0.999999 : 1e30);
    imp.set("train", key, number_text(v.value_or(def)), v ? t.show("optimizer", k) : "(no [optimizer] " + std::string(k) + ": torchtitan's " + number_text(def) + ")");
  }
  const auto mn = t.real("training", "max_norm", 0, 1e30);
  imp.set("train", "max_grad_norm", number_text(mn.value_or(1.0)), mn ? t.show("training", "max_norm") : "(no max_norm: 1.0)");
  imp.set("train", "steps", to_string(opt.steps), "import --steps (one simulated step by default)");
  if (t.has("training", "steps")) {
    t.use("training", "steps");
    imp.drop(t.show("training", "steps"), "the run's length: train.steps is the simulated steps (import --steps)");
  }
  for (const char* k : {"dataset", "dataset_path", "warmup_steps", "gc_freq", "deterministic", "enable_cpu_offload",
                        "mixed_precision_reduce"})
    if (t.has("training", k)) {
      t.use("training", k);
      imp.drop(t.show("training", k), std::string(k) == "mixed_precision_reduce" ? "reductions run in the model dtype here"
                                                                                 : "data and determinism settings: no simulated cost");
    }
}

}  // namespace

std::string export_torchtitan(const PlanSource& src, std::vector<Unexpressed>* unexpressed) {
  const auto& m = src.spec;
  const auto& p = src.plan;
  std::vector<Unexpressed> un;
  const Flavor* flavor = nullptr;
  for (const Flavor& f : kLlama3)
    if (m.hidden == f.dim && m.layers == f.layers && m.heads == f.heads && m.kv_heads == f.kv_heads &&
        m.head_dim == f.dim / f.heads && m.ffn == f.ffn() && m.vocab == kLlama3Vocab && m.rope_theta == 500000 &&
        m.norm_eps == 1e-5 && !m.tied_embeddings)
      flavor = &f;
  std::ostringstream os, body;
  body << "[model]\nname = \"llama3\"\nflavor = \"" << (flavor ? flavor->name : "shardsim_custom") << "\"\n";
  if (!flavor) {
    body << "\n# The shape of a model that is no torchtitan llama3 flavor: register it as TransformerModelArgs(dim, n_layers,\n"
            "# n_heads, n_kv_heads, ...) under the flavor name above; shardsim's import reads this table.\n"
            "[shardsim_model]\n";
    body << "vocab = " << m.vocab << "\nhidden = " << m.hidden << "\nlayers = " << m.layers << "\nheads = " << m.heads
         << "\nkv_heads = " << m.kv_heads << "\nhead_dim = " << m.head_dim << "\nffn = " << m.ffn
         << "\nrope_theta = " << number_text(m.rope_theta) << (m.rope_theta == std::floor(m.rope_theta) ? ".0" : "")
         << "\nnorm_eps = " << number_text(m.norm_eps) << "\ntied_embeddings = " << (m.tied_embeddings ? "true" : "false") << "\n";
  }
  if (m.mlp != sharding::MlpKind::swiglu || m.norm != sharding::NormKind::rmsnorm || !m.has_rope() || m.linear_bias ||
      m.dropout > 0)
    un.push_back({"model.mlp/norm/position/linear_bias/dropout", "torchtitan's llama3 is SwiGLU, RMSNorm, RoPE, no biases, "
                                                                 "no dropout; the import reads those back"});
  if (m.attention_impl == sharding::AttentionImpl::unfused) un.push_back({"model.attention_impl unfused", "torchtitan runs SDPA (flash)"});
  const int64_t local = m.batch / p.dp;
  body << "\n[training]\nlocal_batch_size = " << (p.pp == 1 && m.micro_batch > 0 ? m.micro_batch : local)
       << "\nglobal_batch_size = " << m.batch << "\nseq_len = " << m.seq << "\nmax_norm = " << number_text(src.train.max_grad_norm)
       << (src.train.max_grad_norm == std::floor(src.train.max_grad_norm) ? ".0" : "") << "\nsteps = " << src.train.steps
       << "\nmixed_precision_param = \"" << (m.dtype == runtime::DType::bf16 ? "bfloat16" : "float32") << "\"\nseed = " << m.seed << "\n";
  body << "\n[optimizer]\nname = \"AdamW\"\nlr = " << float_text(src.train.adamw.lr) << "\nbeta1 = " << float_text(src.train.adamw.beta1)
       << "\nbeta2 = " << float_text(src.train.adamw.beta2) << "\neps = " << float_text(src.train.adamw.eps)
       << "\nweight_decay = " << float_text(src.train.adamw.weight_decay) << "\n";
  const bool fsdp = p.zero >= 2 && p.dp > 1;
  body << "\n[parallelism]\ndata_parallel_replicate_degree = " << (fsdp ? 1 : p.dp) << "\ndata_parallel_shard_degree = "
       << (fsdp ? p.dp : 1) << "\n";
  if (fsdp) body << "fsdp_reshard_after_forward = \"" << (p.zero == 2 ? "never" : "default") << "\"\n";
  if (p.zero == 1) un.push_back({"parallel.zero 1", "torchtitan shards with FSDP2 (ZeRO-2/3) or not at all (DDP); the import reads DDP"});
  if (p.zero >= 2 && p.dp == 1) un.push_back({"parallel.zero", "no data parallelism to shard over"});
  body << "tensor_parallel_degree = " << p.tp << "\n";
  if (p.tp > 1 && !p.sp) un.push_back({"parallel.sp false", "torchtitan's TP always shards the norms' sequence"});
  if (p.fused.enabled) body << "enable_async_tensor_parallel = true\n";
  body << "context_parallel_degree = " << p.cp << "\n";
  if (p.ulysses > 1) un.push_back({"parallel.ulysses", "torchtitan's context parallelism is ring attention"});
  if (p.cp > 1 && !p.zigzag) un.push_back({"parallel.cp_split contiguous", "torch's context parallelism load-balances"});
  body << "pipeline_parallel_degree = " << p.pp << "\n";
  if (p.pp > 1) {
    const std::string s = p.schedule == "gpipe" ? "GPipe" : p.schedule == "interleaved" ? "Interleaved1F1B"
                          : p.schedule == "zb_h1" ? "InterleavedZeroBubble" : "1F1B";
    body << "pipeline_parallel_schedule = \"" << s << "\"\n";
    body << "pipeline_parallel_microbatch_size = " << (m.micro_batch > 0 ? m.micro_batch : local) << "\n";
    if (!p.pp_layers.empty()) {
      body << "pipeline_parallel_split_points = [";
      int64_t at = 0;
      for (size_t i = 0; i + 1 < p.pp_layers.size(); ++i) body << (i ? ", " : "") << "\"layers." << (at += p.pp_layers[i]) << "\"";
      body << "]\n";
    } else {
      body << "pipeline_parallel_layers_per_stage = " << m.layers / (p.pp * p.virtual_stages) << "\n";
    }
  }
  if (!p.overlap_grad_reduce || p.overlap_param_gather || p.bucket_bytes != 26214400)
    un.push_back({"parallel.overlap_grad_reduce/overlap_param_gather/bucket_bytes", "FSDP2 and DDP choose their own "
                                                                                     "overlap and buckets; the import reads 25 MiB, overlapped"});
  if (!p.algorithm.empty() || !p.tp_all_reduce.empty()) un.push_back({"parallel.algorithm", "NCCL chooses the algorithm"});
  if (!p.mesh_dims.empty()) un.push_back({"parallel.mesh_dims", "rank placement is the launcher's"});
  body << "\n[activation_checkpoint]\nmode = \"" << (p.recompute ? "full" : p.selective_recompute ? "selective" : "none") << "\"\n";
  if (p.selective_recompute) body << "selective_ac_option = \"op\"\n";
  os << "# shardsim export torchtitan " << escape_control(src.where) << " (docs/IMPORT.md)\n";
  os << "# world size: " << src.chips << " GPUs (torchrun --nproc_per_node x --nnodes)\n";
  for (const Unexpressed& u : un) os << "# not expressible: " << escape_control(u.key) << ": " << u.why << "\n";
  os << "\n[job]\ndescription = " << toml_string(m.label.empty() ? std::string("shardsim export") : m.label) << "\n\n" << body.str();
  if (unexpressed) *unexpressed = un;
  return os.str();
}

}  // namespace shardsim::interop
