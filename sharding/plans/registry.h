// The plan registry: one descriptor per parallel plan unit (tp, sp, fused, cp, ulysses, ep, etp, pp, dp, recompute),
// registered in one place (registry.cpp), like the collective algorithms (collectives/registry.h).
//
// Everything that needs to know which plans exist derives from it: the parallel: section's keys and their checks
// (parse_parallel_plan, sharding/model_spec.h: parallel_keys(), each unit's read and check hooks, the mesh-size
// rule over the units' axes), `--plan`'s accepted keys (sharding/engine_config.cpp), a sweep's plan entries
// (experiments/sweep.cpp: sweep_plan_keys(), the kind of each value), `shardsim help plans` (catalogue_text), the
// report's plan line for run and train (plan_text), the device mesh's axis sizes (mesh_axis_sizes, read by
// sharding/device_mesh.h's build_mesh) and the parametrised tests (tests/unit/plan_registry_test.cpp enumerates the
// registry: every key parses, every divisibility rule rejects its bad case naming its key, help lists the unit,
// docs/CONFIG.md has a row per key).
//
// Recipe for a new plan (docs/ARCHITECTURE.md, "Plan registry"): its unit (sharding/plans/NAME.{h,cpp}: the
// sharded kernels, forward and backward), its fields in ParallelPlan, one registration in registry.cpp (a
// descriptor: keys, read / check / text hooks, its bad case for the tests), its rows in docs/CONFIG.md, its tests.
#pragma once

#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/config.h"
#include "sharding/model_spec.h"

namespace shardsim::sharding::plans {

// The executor's modes (models/lm_tp.h): forward (`run`: one forward pass, validated against one device), train
// (`train`: forward, backward, gradient reduction, optimizer) and serve (`serve`: prefill and decode iterations
// with a KV cache).
enum class PlanMode { forward, train, serve };
inline constexpr PlanMode kPlanModes[] = {PlanMode::forward, PlanMode::train, PlanMode::serve};
const char* plan_mode_name(PlanMode mode);  // "forward" | "train" | "serve"

// What a unit or a key does in a mode: runs there; is accepted and changes nothing (a training config's key in a
// forward: the config runs in every mode); or is refused (exit 2 at parse, naming the key).
enum class ModeUse { runs, no_effect, refused };

// The modes a plan unit (or one of its keys) works in: the one source of `help plans`, docs/CONFIG.md's modes
// column (tests/unit/plan_modes_test.cpp compares them) and the parser's mode refusals (parse_parallel_plan).
struct PlanModes {
  ModeUse forward = ModeUse::runs, train = ModeUse::runs, serve = ModeUse::runs;
  std::string why;  // why the modes that do not run do not ("no backward", ...): help and the refusal say it
  ModeUse in(PlanMode mode) const;
};
// "forward, train, serve" | "forward, train; serve: refused" | "train; forward, serve: no effect"; WHY adds
// " (WHY)" after the last part that does not run (help's and the refusal's text).
std::string modes_text(const PlanModes& modes, bool why = false);

// What a unit's hooks see while ROOT's parallel: section is parsed (parse_parallel_plan). Errors are ConfigError
// "FILE:LINE: parallel.KEY: ..." at the key when the section gives it, else at the section (exit 2).
struct PlanParse {
  const ConfigNode& root;  // the whole config
  const ConfigNode& par;   // its parallel: section (ROOT itself when the config has none: given false)
  bool given;
  const ModelSpec& model;
  SpecUse use;
  int64_t chips;
  bool forward = false;  // the executor's forward mode (`run`) or its serving mode (both run forwards only)
  bool serve = false;    // the executor's serving mode (`serve`)

  PlanMode mode() const { return serve ? PlanMode::serve : forward ? PlanMode::forward : PlanMode::train; }

  bool has(std::string_view key) const { return given && par.has(key); }
  bool train() const { return use == SpecUse::train; }  // a training-model config (run's forward mode included)
  ConfigNode at(std::string_view key) const;        // the key's node when given, else the section
  ConfigNode model_at(std::string_view key) const;  // the model: section's key (or the section)
  [[noreturn]] void fail(std::string_view key, const std::string& message) const;  // "parallel.KEY: MESSAGE"
  // "parallel.WHAT: not implemented yet in USE" at KEY (WHAT starts with the key).
  [[noreturn]] void not_implemented(std::string_view key, const std::string& what) const;
};

// How a key's value is written (for --plan, sweeps' plan entries and `help plans`).
enum class PlanValue {
  size,     // a positive integer (an axis size; a sweep also takes `chips`, dp `fill`)
  flag,     // true | false
  choice,   // one of PlanKey::values
  number,   // an integer or a byte size (checked by the unit's read hook)
  name,     // a collective algorithm name or auto
  list,     // a list of integers
};

struct PlanKey {
  std::string name;        // the key in parallel: (and --plan, and a sweep's plan entry)
  PlanValue value = PlanValue::size;
  std::string values;      // accepted values as users read them: "1..2^20", "zigzag | contiguous", ...
  std::string fallback;    // the default, as text
  std::string doc;         // one line
  bool mesh = false;       // a key of the plan's shape (the mesh and the pipeline): --plan and sweeps replace it
  bool swept = true;       // accepted in a sweep's plan entry
  std::optional<PlanModes> modes = std::nullopt;  // its own modes; none: its unit's (PlanDescriptor::modes)
  // When the key takes effect (what a refusal in a mode refuses); null: whenever the config gives it.
  bool (*set)(const ParallelPlan& plan) = nullptr;
};

// A config (model: and parallel: sections) on CHIPS chips for USE, for the parametrised tests: an example that
// parses with the unit active, or a bad case whose parse fails naming KEY.
struct PlanCase {
  std::string yaml;
  SpecUse use = SpecUse::train;
  int64_t chips = 1;
  std::string key;  // bad cases: the message contains "parallel.KEY" (or "model.KEY")
};

struct PlanDescriptor {
  std::string name;     // "tp": what help, errors and tests call it (its size key, when it has one)
  std::string title;    // "tensor parallel"
  std::string summary;  // one doc line
  std::string axis;     // the DeviceMesh axis it shards ("tp", "cp", "dp", "pp"; "" none)
  int ParallelPlan::*size = nullptr;  // its size on AXIS (the key NAME); null when it has no size
  std::vector<PlanKey> keys;
  std::vector<std::string> needs;     // units that must be active with it (sp: tp)
  std::vector<std::string> excludes;  // units that cannot be active with it (ulysses: cp)
  bool needs_attention = false;       // refused on a model without attention (the MLP-only workload)
  PlanModes modes;                    // the modes the unit works in (its keys' unless a key has its own)
  bool unit = true;                   // false: plan-wide keys (the collective algorithm, the mesh order)
  // True when PLAN uses the unit (size > 1, its flag set, ...). Null: size > 1.
  bool (*active)(const ParallelPlan& plan) = nullptr;
  // Reads the unit's keys other than its size into PLAN (sizes are read first, for every unit, by the parser):
  // values, bounds and the rules between the plan's own keys (needs, excludes, "only used with", what USE runs).
  void (*read)(const PlanParse& ctx, ParallelPlan& plan) = nullptr;
  // The divisibility rules: functions of the model and the whole plan (after every unit is read).
  void (*check)(const PlanParse& ctx, const ParallelPlan& plan) = nullptr;
  // Its part of the report's plan line (plan_text), for MODEL under PLAN in MODE; "" adds nothing.
  std::string (*text)(const ModelSpec& model, const ParallelPlan& plan, bool train) = nullptr;
  // For tests/unit/plan_registry_test.cpp: a config that sets every key of the unit and parses (the unit active),
  // and the cases its read or check must refuse naming a key of this unit.
  PlanCase example;
  std::vector<PlanCase> bad_cases;
  // For tests/unit/plan_modes_test.cpp: training-model configs (none: the example, a training-model one), each
  // accepted in the modes every key it gives runs in or has no effect in, refused (exit 2) in the others.
  std::vector<PlanCase> mode_cases;

  bool is_active(const ParallelPlan& plan) const;
  const PlanKey* key(std::string_view name) const;
  const PlanModes& modes_of(const PlanKey& key) const { return key.modes ? *key.modes : modes; }
};

// Every registered descriptor in registration order (the units first, then the plan-wide keys): the order the
// parser reads them, the plan line lists them and `help plans` prints them.
const std::vector<PlanDescriptor>& registered_plans();
// The unit named NAME; nullptr if none.
const PlanDescriptor* find_plan(std::string_view name);
// The descriptor owning parallel: key KEY, and the key; nullptrs if none.
const PlanDescriptor* plan_of_key(std::string_view key, const PlanKey** out = nullptr);
// Every key of every descriptor, registration order (the parallel: section's keys).
std::span<const std::string_view> plan_keys();
// The keys a --plan and a sweep plan entry replace (PlanKey::mesh).
std::vector<std::string> mesh_plan_keys();
// The keys a sweep's plan entry accepts (PlanKey::swept, and model.micro_batch's micro_batch).
std::span<const std::string_view> sweep_plan_keys();

// The mesh axis sizes of PLAN (axis -> size; every unit with an axis and a size, units sharing an axis multiplied:
// cp x ulysses on "cp"), what sharding/device_mesh.h's build_mesh lays on the topology.
std::map<std::string, int> mesh_axis_sizes(const ParallelPlan& plan);
// "tp 2 x cp 1 x ulysses 1 x pp 2 x dp 2": the sizes of the units with one (tp, cp, ulysses always; others when
// above 1), for the mesh-size error.
std::string size_product_text(const ParallelPlan& plan);

// The report's plan line, for `run` (TRAIN false: one forward) and `train`: each active unit's text, in
// registration order, joined by "; " ("single device" when no unit is active).
std::string plan_text(const ModelSpec& model, const ParallelPlan& plan, bool train);

// The mode rules of the registry for PLAN, parsed in C's mode (parse_parallel_plan, after the units' reads): a unit
// active in a mode it is refused in, a key set in a mode its own modes refuse, or a unit that needs attention on a
// model without it, fails naming the key (ConfigError, exit 2).
void check_plan_modes(const PlanParse& c, const ParallelPlan& plan);

// `shardsim help plans`: one block per descriptor (name, title, mesh axis, needs / excludes, summary, its keys
// with values, default and doc line).
std::string catalogue_text();

// ---- For the units' registrations (each unit's descriptor is defined in its own file) ----

// Tokens of one sequence on each chip of the context axis (cp x ulysses shards).
int64_t tokens_per_context_shard(const ModelSpec& model, const ParallelPlan& plan);
// Refuses KEY with model.attention_impl: unfused (the context-axis units run the flash-style kernels).
void refuse_unfused_attention(const PlanParse& ctx, const char* key);
// The descriptors' example and bad cases (tests/unit/plan_registry_test.cpp runs them): the test model, 2 layers,
// 4 heads (2 KV), head_dim 4, ffn 32, seq 8, batch 2, vocab 32, as YAML with PAR as its parallel: section; SET's
// "key: value" items (", "-separated, each starting with ", ") replace or add model keys.
std::string plan_test_model(const std::string& set = "", const std::string& par = "");
// A transformer block config for the same cases (SpecUse::block); append "parallel: {...}\n".
inline constexpr const char* kPlanTestBlock =
    "model: {kind: transformer_block, hidden: 64, heads: 8, kv_heads: 2, ffn: 128, seq: 16}\n";
// The accepted values of an axis size, as help prints them.
inline constexpr const char* kPlanSizes = "1..1048576";

}  // namespace shardsim::sharding::plans
