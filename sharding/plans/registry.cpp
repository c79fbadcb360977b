#include "sharding/plans/registry.h"

#include <algorithm>

#include "collectives/algorithms.h"
#include "collectives/registry.h"
#include "sharding/plans/block.h"
#include "sharding/plans/context_parallel.h"
#include "sharding/plans/data_parallel.h"
#include "sharding/plans/expert_parallel_config.h"
#include "sharding/plans/pipeline_schedule.h"
#include "sharding/plans/sequence_parallel.h"
#include "sharding/plans/tensor_parallel.h"
#include "sharding/plans/ulysses.h"

namespace shardsim::sharding::plans {

int64_t tokens_per_context_shard(const ModelSpec& s, const ParallelPlan& p) {
  return s.seq / (int64_t{p.cp} * p.ulysses);
}

void refuse_unfused_attention(const PlanParse& c, const char* key) {
  if (c.model.attention_impl == AttentionImpl::unfused)
    c.not_implemented(key, std::string(key) + " with model.attention_impl: unfused (context parallelism runs the "
                                              "flash-style kernels)");
}

std::string plan_test_model(const std::string& set, const std::string& par) {
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

namespace {

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
  if (c.train() && c.has("all_reduce"))
    c.fail("all_reduce", "the tp all_reduce has no algorithm of its own in run or train (one executor, one rule): "
                         "parallel.algorithm sets the algorithm of every collective of the plan, the tp all_reduce's "
                         "included");
}
void mesh_read(const PlanParse& c, ParallelPlan& p) {
  if (!c.has("mesh_dims")) return;
  for (int64_t d : c.par.get_int_list_in("mesh_dims", 0, 64)) p.mesh_dims.push_back(static_cast<int>(d));
}

using V = PlanValue;

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
               "algorithm for every collective of the plan that implements it", false, false},
              {"all_reduce", V::name, "auto | an all_reduce algorithm", "auto", "refused: use algorithm", false, true,
               PlanModes{ModeUse::refused, ModeUse::refused, ModeUse::refused,
                         "the tp all_reduce has no algorithm of its own: parallel.algorithm sets every collective's"}}};
    d.active = [](const ParallelPlan&) { return false; };
    d.read = algorithm_read;
    d.example = {std::string(kPlanTestBlock) + "parallel: {tp: 2, algorithm: ring, all_reduce: bidir_ring}\n", SpecUse::block, 2, ""};
    d.bad_cases = {{plan_test_model("", "algorithm: bogus"), SpecUse::train, 1, "algorithm"},
                   {plan_test_model("", "all_reduce: ring"), SpecUse::train, 1, "all_reduce"}};
    d.mode_cases = {{plan_test_model("", "tp: 2, algorithm: ring"), SpecUse::train, 2, ""},
                    {plan_test_model("", "all_reduce: ring"), SpecUse::train, 1, ""}};
    v.push_back(d);
  }
  {
    PlanDescriptor d;
    d.name = "mesh";
    d.title = "device mesh order";
    d.summary = "which topology dimensions the mesh fills, innermost axis (tp) first (sharding/device_mesh.h)";
    d.unit = false;
    d.keys = {{"mesh_dims", V::list, "[d0, d1, ...]", "fastest links first",
               "topology dimensions the mesh fills, innermost axis first", false, false}};
    d.active = [](const ParallelPlan&) { return false; };
    d.read = mesh_read;
    d.example = {plan_test_model("", "mesh_dims: [0]"), SpecUse::train, 1, ""};
    d.bad_cases = {{plan_test_model("", "mesh_dims: [99]"), SpecUse::train, 1, "mesh_dims"}};
    v.push_back(d);
  }
}

// THE registration, in the order the parser reads the units, the plan line lists them and help prints them.
// Sizes first (tp, cp, ulysses, ep, pp, dp: the mesh's product), then each unit's read, then each unit's check.
std::vector<PlanDescriptor> make_registry() {
  std::vector<PlanDescriptor> v;
  for (PlanDescriptor (*unit)() : {tp_plan_descriptor,          // tensor_parallel.cpp
                                   sp_plan_descriptor,          // sequence_parallel.cpp
                                   fused_plan_descriptor,       // tensor_parallel.cpp (sharding/fused.h)
                                   cp_plan_descriptor,          // context_parallel.cpp
                                   ulysses_plan_descriptor,     // ulysses.cpp
                                   ep_plan_descriptor,          // expert_parallel_config.cpp
                                   etp_plan_descriptor,         // expert_parallel_config.cpp
                                   pp_plan_descriptor,          // pipeline_schedule.cpp
                                   dp_plan_descriptor,          // data_parallel.cpp
                                   recompute_plan_descriptor})  // block.cpp
    v.push_back(unit());
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

const char* plan_mode_name(PlanMode m) {
  switch (m) {
    case PlanMode::forward: return "forward";
    case PlanMode::train: return "train";
    case PlanMode::serve: return "serve";
  }
  return "?";
}

ModeUse PlanModes::in(PlanMode m) const {
  return m == PlanMode::forward ? forward : m == PlanMode::train ? train : serve;
}

std::string modes_text(const PlanModes& m, bool why) {
  std::string out[3];  // the modes that run, have no effect, are refused
  for (const PlanMode mode : kPlanModes) {
    std::string& o = out[int(m.in(mode))];
    o += (o.empty() ? "" : ", ") + std::string(plan_mode_name(mode));
  }
  std::string t = out[0].empty() ? "none" : out[0];
  if (!out[1].empty()) t += "; " + out[1] + ": no effect";
  if (!out[2].empty()) t += "; " + out[2] + ": refused";
  if (why && !m.why.empty() && !(out[1].empty() && out[2].empty())) t += " (" + m.why + ")";
  return t;
}

void check_plan_modes(const PlanParse& c, const ParallelPlan& p) {
  const PlanMode mode = c.mode();
  for (const auto& d : registered_plans()) {
    const bool active = d.unit && d.is_active(p);
    if (active && d.needs_attention && !c.model.has_attention())
      c.fail(d.keys.front().name, "needs attention (" + d.title + " shards the attention; this model's layers are "
                                  "the MLP alone: model.kind mlp, or attention false)");
    if (!c.train()) continue;  // the modes are the executor's (a training-model config: run, train, serve)
    const auto refuse = [&](const std::string& key, const PlanModes& m) {
      c.fail(key, std::string("refused in the ") + plan_mode_name(mode) + " mode: " + m.why + " (modes: " +
                      modes_text(m) + "; `shardsim help plans`)");
    };
    if (active && d.modes.in(mode) == ModeUse::refused) refuse(d.keys.front().name, d.modes);
    for (const auto& k : d.keys)
      if (k.modes && k.modes->in(mode) == ModeUse::refused && (k.set ? k.set(p) : c.has(k.name)))
        refuse(k.name, *k.modes);
  }
}

ConfigNode PlanParse::at(std::string_view key) const { return has(key) ? par.child(key) : par; }

ConfigNode PlanParse::model_at(std::string_view key) const {
  const ConfigNode m = root.has("workload") ? root.child("workload") : root.has("model") ? root.child("model") : root;
  return m.has(key) ? m.child(key) : m;
}

void PlanParse::fail(std::string_view key, const std::string& message) const {
  const std::string full = "parallel." + std::string(key);  // a key not set: the file, "not set"
  (given ? par : root).fail_at(given ? key : std::string_view(full), full + ": " + message);
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
    if (always || plan.*d.size > 1) t += (t.empty() ? "" : " x ") + d.name + " " + std::to_string(plan.*d.size);
  }
  return t;
}

std::string plan_text(const ModelSpec& model, const ParallelPlan& plan, bool train_mode) {
  std::string t;
  for (const auto& d : registered_plans())
    if (d.unit && d.text && d.is_active(plan)) {
      // A unit with no effect in the forward mode (recomputation: no backward) says so, not what it would do.
      const std::string part = !train_mode && d.modes.forward == ModeUse::no_effect
                                   ? d.name + ": n/a in the forward mode (" + d.modes.why + ")"
                                   : d.text(model, plan, train_mode);
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
    out += "  modes: " + modes_text(d.modes, true) + "\n";
    std::string rel;
    if (d.needs_attention) rel = "needs attention (not on the MLP-only model)";
    for (const auto& n : d.needs) rel += (rel.empty() ? "" : ", ") + ("needs " + n);
    for (const auto& n : d.excludes) rel += (rel.empty() ? "" : ", ") + ("not with " + n);
    if (!rel.empty()) out += "  " + rel + "\n";
    for (const auto& k : d.keys) {
      out += "  " + k.name + ": " + k.values + " (default " + k.fallback + ") " + k.doc;
      std::string tags;
      if (k.modes) tags += "modes: " + modes_text(*k.modes, true);
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
