#include "experiments/sweep.h"

#include "common/byte_size.h"
#include "common/checked.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "collectives/algorithms.h"
#include "collectives/registry.h"
#include "common/config.h"
#include "common/error.h"
#include "common/number.h"
#include "common/input_file.h"
#include "common/output_file.h"
#include "models/executor_config.h"
#include "runtime/dtype.h"
#include "serving/scheduler.h"
#include "sharding/engine_config.h"
#include "sharding/model_spec.h"
#include "sharding/plans/registry.h"
#include "sim/device_spec.h"
#include "topology/topology_yaml.h"

namespace shardsim::experiments {

namespace fs = std::filesystem;

std::string short_hash(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(h & 0xffffffffu));
  return buf;
}

size_t parse_size(const std::string& text) { return parse_byte_size(text, 1); }

std::string size_label(size_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  size_t v = b;
  while (u < 4 && v >= 1024 && v % 1024 == 0) {
    v /= 1024;
    ++u;
  }
  return std::to_string(v) + units[u];
}

namespace {

std::string flow(const YAML::Node& n) {
  YAML::Emitter e;
  e.SetMapFormat(YAML::Flow);
  e.SetSeqFormat(YAML::Flow);
  e << n;
  return e.c_str();
}

std::string block(const YAML::Node& n) {
  YAML::Emitter e;
  e << n;
  return std::string(e.c_str()) + "\n";
}

// One entry of the topology axis.
struct TopoEntry {
  std::string label, yaml, origin;  // yaml: the topology section (or a whole ASTRA-sim network file)
  bool astra = false;
  int chips = 0;
};

struct DeviceEntry {
  std::string label, yaml;  // yaml: a device section
};

struct WorkloadEntry {
  std::string label, origin, file;
  YAML::Node root;  // the whole config, `set` applied
  bool block = false;
  bool train = false;  // a `shardsim train` config (model: without kind, or kind: lm)
  bool serve = false;  // a `shardsim serve` config (a train config with a serve: section)
};

std::string resolve(const std::string& path, const std::string& sweep_file) {
  if (path.empty() || fs::path(path).is_absolute()) return path;
  const fs::path rel = fs::path(sweep_file).parent_path() / path;
  if (fs::exists(rel)) return rel.lexically_normal().string();
  return path;  // relative to the working directory
}

std::vector<ConfigNode> axis_items(const ConfigNode& axes, const std::string& name) {
  const YAML::Node raw = axes.yaml()[name];
  const ConfigNode node(raw, axes.file(), "axes." + name);
  if (!raw.IsDefined() || raw.IsNull() || (raw.IsSequence() && raw.size() == 0))
    node.fail("axes." + name + ": empty axis (list at least one value, or leave the axis out)");
  std::vector<ConfigNode> out;
  if (raw.IsSequence()) {
    for (size_t i = 0; i < raw.size(); ++i)
      out.emplace_back(raw[i], axes.file(), "axes." + name + "[" + std::to_string(i) + "]");
  } else {
    out.push_back(node);  // a single value
  }
  return out;
}

std::string scalar(const ConfigNode& n, const std::string& what) {
  if (!n.yaml().IsScalar()) n.fail(n.path() + ": expected a " + what);
  return n.printable_text();
}

std::string auto_topo_label(const YAML::Node& n, int chips) {
  std::string kind = n["kind"] && n["kind"].IsScalar() ? n["kind"].as<std::string>() : "topology";
  if (n["dims"] && n["dims"].IsSequence() && kind != "stacked") {
    std::string s = kind;
    for (size_t i = 0; i < n["dims"].size(); ++i) s += (i ? "x" : "") + n["dims"][i].as<std::string>();
    return s;
  }
  return kind + std::to_string(chips);
}

std::vector<TopoEntry> parse_topologies(const ConfigNode& axes) {
  std::vector<TopoEntry> out;
  for (const auto& item : axis_items(axes, "topology")) {
    TopoEntry e;
    e.origin = item.where();
    if (item.yaml().IsScalar()) {
      const std::string path = resolve(item.printable_text(), axes.file());  // the file stem becomes the label
      std::ifstream in(path);
      if (!in) item.fail(item.path() + ": cannot read topology file '" + path + "'");
      const ConfigNode root = ConfigNode::load_file(path);
      const topology::Topology t = topology::load_topology_document(root);
      if (topology::is_astra_network(root)) {
        e.astra = true;
        e.yaml = root.text();
      } else {
        e.yaml = flow((root.has("topology") ? root.child("topology") : root).yaml());
      }
      e.chips = t.num_chips();
      e.label = fs::path(path).stem().string();
    } else {
      if (!item.is_map()) item.fail(item.path() + ": expected a topology section (a map) or a file path");
      YAML::Node n = YAML::Clone(item.yaml());
      std::string label;
      if (n["label"]) {
        label = ConfigNode(item.yaml()["label"], item.file(), item.path() + ".label").printable_text();
        n.remove("label");
      }
      // Validate with the original node (its line numbers), minus the label.
      YAML::Node orig = item.yaml();
      if (orig["label"]) orig.remove("label");
      const auto t = topology::load_topology(ConfigNode(orig, item.file(), item.path()));
      e.chips = t.num_chips();
      e.yaml = flow(n);
      e.label = label.empty() ? auto_topo_label(n, e.chips) : label;
    }
    for (const auto& o : out)
      if (o.label == e.label)
        item.fail(item.path() + ": topology label '" + e.label + "' is already used by the entry at " + o.origin +
                  " (give them distinct `label:`s)");
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<DeviceEntry> parse_devices(const ConfigNode& axes) {
  std::vector<DeviceEntry> out;
  for (const auto& item : axis_items(axes, "device")) {
    DeviceEntry e;
    if (item.yaml().IsScalar()) {
      e.label = item.printable_text();
      try {
        (void)sim::device_preset(e.label);
      } catch (const std::invalid_argument& ex) {
        item.fail(item.path() + ": " + ex.what());
      }
      e.yaml = "{preset: " + e.label + "}";
    } else {
      YAML::Node orig = item.yaml();
      std::string label;
      if (orig.IsMap() && orig["label"]) {
        label = ConfigNode(orig["label"], item.file(), item.path() + ".label").printable_text();
        orig.remove("label");
      }
      (void)sim::load_device(ConfigNode(orig, item.file(), item.path()));
      e.yaml = flow(orig);
      if (label.empty())
        label = orig["name"]     ? ConfigNode(orig["name"], item.file(), item.path() + ".name").printable_text()
                : orig["preset"] ? ConfigNode(orig["preset"], item.file(), item.path() + ".preset").printable_text()
                                 : "custom";
      e.label = label;
    }
    for (const auto& o : out)
      if (o.label == e.label) item.fail(item.path() + ": device label '" + e.label + "' listed twice (add `label:`)");
    out.push_back(std::move(e));
  }
  return out;
}

// The model keys `set:` may change: the one parser's list (sharding/model_spec.h), which then checks them.
const std::set<std::string_view> kSettableModelKeys(std::begin(sharding::kModelKeys), std::end(sharding::kModelKeys));

std::vector<WorkloadEntry> parse_workloads(const ConfigNode& axes) {
  std::vector<WorkloadEntry> out;
  for (const auto& item : axis_items(axes, "workload")) {
    WorkloadEntry e;
    e.origin = item.where();
    std::string path;
    std::optional<ConfigNode> set;
    if (item.yaml().IsScalar()) {
      path = item.printable_text();  // the file stem becomes the label
    } else {
      item.expect_keys(kSweepWorkloadKeys);
      path = item.get_string("config");
      e.label = item.get_string("label", "");
      set = item.maybe_child("set");
    }
    e.file = resolve(path, axes.file());
    {
      std::ifstream in(e.file);
      if (!in) item.fail(item.path() + ": cannot read workload config '" + e.file + "'");
    }
    // The loader `run` uses (sharding/engine_config.h): model: is read as workload:, a relative topology path is
    // resolved next to the file.
    const ConfigNode root = sharding::load_workload_config(e.file);
    if (!root.has("workload") || !root.child("workload").is_map())
      root.fail("model: missing (a sweep workload must be a `shardsim run` config)");
    // Its root keys' values before any point runs (each point would otherwise fail on them as an error row).
    (void)sharding::load_workload_shape_only(root);
    (void)sharding::load_workload_fold(root);
    e.train = sharding::spec_use_of(root.child("workload")) == sharding::SpecUse::train;
    e.serve = e.train && root.has("serve");
    e.block = sharding::spec_use_of(root.child("workload")) == sharding::SpecUse::block;
    e.root = YAML::Clone(root.yaml());
    if (!item.yaml().IsScalar() && item.has("requests")) {
      if (!e.serve) item.child("requests").fail(item.path() + ".requests: only for serve configs (a serve: section)");
      e.root["serve"]["trace"]["count"] = item.get_int_in("requests", 1, serving::kMaxRequests);  // as serve.trace.count
    }
    if (set) {
      if (!set->is_map()) set->fail(set->path() + ": expected a map of workload fields");
      const auto& allowed = kSettableModelKeys;
      for (const auto& kv : set->yaml()) {
        const auto k = kv.first.as<std::string>();
        if (!allowed.count(k) || k == "kind")
          ConfigNode(kv.first, set->file(), set->path()).fail(set->path() + "." + k + ": not a settable workload field");
        e.root["workload"][k] = YAML::Clone(kv.second);
      }
      // The values are checked now by the one parser, before any point runs (a bad one used to become an error
      // row of every point and exit 0): the file's own section first (its errors name the workload file), then
      // with the set: values (their nodes carry the sweep file's lines).
      const sharding::SpecUse use = sharding::spec_use_of(root.child("workload"));
      (void)sharding::parse_model_spec(root.child("workload"), use);
      YAML::Node with_set = YAML::Clone(root.child("workload").yaml());
      for (const auto& kv : set->yaml()) with_set[kv.first.as<std::string>()] = kv.second;  // not cloned: marks kept
      (void)sharding::parse_model_spec(ConfigNode(with_set, set->file(), root.child("workload").path()), use);
    }
    if (e.label.empty()) e.label = fs::path(e.file).stem().string();
    for (const auto& o : out)
      if (o.label == e.label) item.fail(item.path() + ": workload label '" + e.label + "' listed twice (add `label:`)");
    out.push_back(std::move(e));
  }
  return out;
}

// A plan entry's value of KEY, printable (it can end up in the plan's label: plots, CSV); one value per key.
std::string plan_value(const ConfigNode& plan, const std::string& k, const YAML::Node& value) {
  if (!value.IsScalar())
    ConfigNode(value, plan.file(), plan.path()).fail(plan.path() + "." + k + ": one value, not a " +
                                                     (value.IsSequence() ? "list" : "map") +
                                                     " (each plan entry is one point; list the plans)");
  return ConfigNode(value, plan.file(), plan.path() + "." + k).printable_text();
}

// An axis size of a plan entry: a positive integer or `chips` (the point's chip count); dp also `fill`.
int plan_size(const ConfigNode& plan, const std::string& k, const YAML::Node& value, const std::string& v, int chips) {
  if (v == "chips") return chips;
  const int n = static_cast<int>(std::clamp<int64_t>(decimal_int(v).value_or(0), 0, INT32_MAX));  // common/number.h
  if (n < 1 || n > sharding::SpecBounds::axis)
    ConfigNode(value, plan.file(), plan.path()).fail(plan.path() + "." + k + ": a size from 1 to " +
                                                     std::to_string(sharding::SpecBounds::axis) + " or `chips`" +
                                                     (k == "dp" ? " or `fill`" : "") + " (got '" + v + "')");
  return n;
}

// A plan entry with `chips` substituted; and its label. The keys and the kind of each value come from the plan
// registry (sharding/plans/registry.h): axis sizes (`chips`, dp `fill`), flags, the rest as given (checked by the
// one parser when the point is made).
YAML::Node plan_for(const ConfigNode& plan, int chips, std::string* label, const YAML::Node& file_parallel,
                    const std::string& workload_file) {
  YAML::Node out(YAML::NodeType::Map);
  std::map<std::string, int> sizes;     // the axis sizes given (dp: after fill)
  std::map<std::string, std::string> given;  // every other value given, printable
  bool dp_fill = false;
  for (const auto& kv : plan.yaml()) {
    const auto k = kv.first.as<std::string>();
    const std::string v = plan_value(plan, k, kv.second);
    const sharding::plans::PlanKey* key = nullptr;
    const sharding::plans::PlanDescriptor* d = sharding::plans::plan_of_key(k, &key);
    if (k == "dp" && v == "fill") {  // the data-parallel replicas that fill the point's chips (below)
      dp_fill = true;
    } else if (d && d->size && d->name == k) {
      out[k] = sizes[k] = plan_size(plan, k, kv.second, v, chips);
    } else if (k == "recompute") {  // none | selective | full (true = full, false = none), as the parser reads it
      if (v != "none" && v != "selective" && v != "full" && v != "true" && v != "false")
        ConfigNode(kv.second, plan.file(), plan.path())
            .fail(plan.path() + ".recompute: none, selective or full (got '" + v + "')");
      out[k] = v;
      given[k] = v;
    } else if (key && key->value == sharding::plans::PlanValue::flag) {
      const bool b = plan.get_bool(k, false);  // the config's rule: true or false, with the key's line
      out[k] = b;
      given[k] = b ? "true" : "false";
    } else {  // checked by the one parser (sharding/model_spec.h) when the point is made
      out[k] = v;
      given[k] = v;
    }
  }
  // dp: fill = chips / (the other axes) replicas; when that does not divide, dp stays 1 and the point is skipped
  // with the parser's reason (the mesh does not cover the chips).
  if (dp_fill) {
    int64_t model = 1;  // each size <= sharding::SpecBounds::axis: the product is checked, never wrapped
    for (const auto& [k, n] : sizes)
      if (k != "dp") model = model > 0 ? checked_mul(model, n).value_or(0) : 0;
    const int dp = model > 0 && chips % model == 0 ? static_cast<int>(chips / model) : 1;
    if (dp > 1) out["dp"] = sizes["dp"] = dp;
  }
  // The workload file's own keys other than the plan's (the mesh and the pipeline: PlanKey::mesh) carry over
  // unless the plan sets them, as with --plan (zero, bucket_bytes, recompute, fused, chunks, ...; values checked by
  // the parser). fused and chunks show in the label.
  if (file_parallel && file_parallel.IsMap()) {
    const auto mesh = sharding::plans::mesh_plan_keys();
    for (const auto& kv : file_parallel) {
      const auto k = kv.first.as<std::string>();
      if (std::find(mesh.begin(), mesh.end(), k) != mesh.end() || out[k]) continue;
      out[k] = YAML::Clone(kv.second);
      if ((k == "fused" || k == "chunks") && kv.second.IsScalar())
        given[k] = ConfigNode(kv.second, workload_file, "parallel." + k).printable_text();
    }
  }
  const auto value = [&](const char* k) { return given.count(k) ? given.at(k) : std::string(); };
  // Label: the sizes given, pipeline first, then the registry's order (pp4xtp8xdp8), then the options.
  std::string s;
  const auto add = [&](const std::string& name) {
    if (sizes.count(name)) s += (s.empty() ? "" : "x") + name + std::to_string(sizes.at(name));
  };
  add("pp");
  for (const auto& d : sharding::plans::registered_plans())
    if (d.size && d.name != "pp") add(d.name);
  if (s.empty()) s = "single";
  if (value("sp") == "true") s += "+sp";
  if (!value("cp_split").empty()) s += "-" + value("cp_split");
  if (!value("all_reduce").empty()) s += "-ar_" + value("all_reduce");
  if (value("fused") == "true") s += "+fused";
  if (!value("chunks").empty()) s += "-c" + value("chunks");
  // Training plans: pp4xtp8xdp8+sp-1f1b-v2-mb1-z1-b25M+rc (only the keys given).
  const std::pair<const char*, const char*> options[] = {
      {"schedule", "-"}, {"virtual_stages", "-v"}, {"micro_batch", "-mb"}, {"zero", "-z"}, {"bucket_bytes", "-b"}};
  for (const auto& [k, prefix] : options)
    if (!value(k).empty()) s += prefix + value(k);
  const std::string rc = value("recompute");
  if (rc == "true" || rc == "full") s += "+rc";
  else if (rc == "selective") s += "+src";
  *label = s;
  return out;
}

// A workload point's config through the one loader (models/executor_config.h: the rules apps/train_setup.cpp's
// load applies to the same file under the point's command, `run`'s forward mode for a `run` config) and the
// device: a plan that cannot run throws here and the point is recorded as skipped with the loader's one-line
// reason. Sets P's shape-only mode and micro-batch count.
void throw_if_point_cannot_run(SweepPoint& p, const ConfigNode& root, int chips) {
  models::check_executor_root_keys(root, false);
  const models::ExecutorConfig e = models::read_executor_config(root, chips, !p.train, false);
  (void)sharding::load_workload_device(root);
  p.shape_only = sharding::load_workload_shape_only(root);
  // The data-parallel replicas of attention: dp x ep (each ep rank has its own sequences).
  const int64_t replicas = int64_t{std::max(e.plan.dp, 1)} * std::max(e.plan.ep, 1);
  p.micro_batches = static_cast<int>(e.spec.micro_batch > 0 ? e.spec.batch / replicas / e.spec.micro_batch : 1);
}

// Validate once: CFG (a workload point's whole config, as generated) with its model shrunk for the real-data
// validation run (experiments/sweep.h: the rule); DIMS gets "hidden=256,ffn=512,..." (the fields changed). Returns
// false when nothing shrinks (the point is small already) or a field is not a plain integer.
bool shrink_for_validation(YAML::Node& cfg, bool block_kind, int chips, std::string* dims) {
  YAML::Node w = cfg["workload"];
  if (!w || !w.IsMap() || chips < 1) return false;
  auto get = [&](const char* k, long long* v) {
    if (!w[k]) return false;
    try {
      *v = w[k].as<long long>();
    } catch (const std::exception&) {
      return false;
    }
    return *v > 0;
  };
  std::vector<std::pair<std::string, long long>> changed;
  auto set_if_smaller = [&](const char* k, long long now, long long small) {
    if (small >= now) return;
    w[k] = small;
    changed.emplace_back(k, small);
  };
  const long long c = chips;
  if (block_kind) {
    long long heads = 0, hidden = 0, ffn = 0, seq = 0, layers = 1;
    if (!get("heads", &heads) || !get("hidden", &hidden) || !get("ffn", &ffn) || !get("seq", &seq)) return false;
    if (w["layers"] && !get("layers", &layers)) return false;
    const long long hidden_s = std::min(hidden, heads * 8);
    set_if_smaller("hidden", hidden, hidden_s);
    set_if_smaller("ffn", ffn, 2 * hidden_s);
    const long long step = 2 * c;
    set_if_smaller("seq", seq, step * ((64 + step - 1) / step));
    set_if_smaller("layers", layers, 2);
  } else {
    long long hidden = 0, ffn = 0, tokens = 0;
    if (!get("hidden", &hidden) || !get("ffn", &ffn) || !get("tokens", &tokens)) return false;
    set_if_smaller("hidden", hidden, 128);
    set_if_smaller("ffn", ffn, c * ((256 + c - 1) / c));
    set_if_smaller("tokens", tokens, 32);
  }
  if (changed.empty()) return false;
  dims->clear();
  for (const auto& [k, v] : changed) *dims += (dims->empty() ? "" : ",") + k + "=" + std::to_string(v);
  return true;
}

// Validate once: P's validation run (experiments/sweep.h), when its config shrinks and the shrunk config still
// fits the plan; otherwise P validates itself. A workload file with mode: shape_only is never validated.
void add_validation(SweepPoint& p, const YAML::Node& cfg, bool block_kind, int chips, const std::string& file) {
  if (p.shape_only) return;
  YAML::Node small = YAML::Clone(cfg);
  std::string dims;
  if (!shrink_for_validation(small, block_kind, chips, &dims)) return;
  small["name"] = cfg["name"].as<std::string>() + "/validate";
  YAML::Node id = YAML::Clone(small);
  id.remove("name");
  const std::string key = "validate|" + short_hash(block(id));
  try {
    const std::string text = block(small);
    SweepPoint v = p;
    throw_if_point_cannot_run(v, sharding::workload_config_from_text(text, file + "[" + key + "]"), chips);
    p.validation_config_yaml = text;
    p.validation_key = key;
    p.validation_dims = dims;
  } catch (const Error&) {
    // The shrunk shape does not fit the plan: the full-size point runs with real data (validated_at self).
  }
}

}  // namespace

bool validated_separately(const SweepPoint& p, const SweepSpec& spec) {
  return p.kind == PointKind::workload && !p.train && !spec.validate_every && !p.validation_config_yaml.empty();
}

SweepSpec load_sweep(const std::string& file) {
  if (fs::is_directory(file)) throw UsageError(file + ": is a directory, need a sweep YAML file");
  return parse_sweep(read_input_file(file, 16u << 20, "a sweep file"), file);  // a regular file, at most 16 MiB
}

namespace {

// Appends P to SPEC's points (its index set); ConfigError when its key is already there.
void add_point(SweepSpec& spec, SweepPoint p) {
  p.index = static_cast<int>(spec.points.size());
  for (const auto& q : spec.points)
    if (q.key == p.key)
      throw ConfigError(p.origin + ": point " + p.key + " appears twice (a value is listed twice in an axis)");
  spec.points.push_back(std::move(p));
}

// The collective grid: topology x device x collective x algorithm x dtype x size.
void add_collective_points(SweepSpec& spec, const ConfigNode& axes, const std::vector<TopoEntry>& topos,
                           const std::vector<DeviceEntry>& devices, const std::string& file) {
  auto given = [&](const std::string& a) { return std::find(spec.axes.begin(), spec.axes.end(), a) != spec.axes.end(); };
  std::vector<std::pair<collectives::Collective, std::string>> cs;
  for (const auto& item : axis_items(axes, "collective")) {
    const auto name = scalar(item, "collective name");
    try {
      cs.emplace_back(collectives::parse_collective(name), item.where());
    } catch (const std::invalid_argument& e) {
      item.fail(item.path() + ": " + e.what());
    }
  }
  std::vector<std::string> algs = {"auto"};
  if (given("algorithm")) {
    algs.clear();
    for (const auto& item : axis_items(axes, "algorithm")) {
      const auto a = scalar(item, "algorithm name");
      bool known = a == "auto";
      for (const auto& c : cs) known = known || collectives::algorithm_name_error(c.first, a).empty();
      if (!known) item.fail(item.path() + ": no listed collective has an algorithm '" + a + "'");
      algs.push_back(a);
    }
  }
  std::vector<runtime::DType> dts = {runtime::DType::fp32};
  if (given("dtype")) {
    dts.clear();
    for (const auto& item : axis_items(axes, "dtype")) {
      try {
        dts.push_back(runtime::parse_dtype(scalar(item, "dtype")));
      } catch (const std::invalid_argument& e) {
        item.fail(item.path() + ": " + e.what());
      }
    }
  }
  std::vector<size_t> sizes;
  {
    const YAML::Node raw = axes.yaml()["size"];
    if (raw.IsMap()) {
      const ConfigNode r(raw, file, "axes.size");
      r.expect_keys(kSweepRangeKeys);
      size_t from = 0, to = 0;
      try {
        from = parse_size(r.get_string("from"));
      } catch (const std::invalid_argument& e) {
        r.child("from").fail("axes.size.from: " + std::string(e.what()));
      }
      try {
        to = parse_size(r.get_string("to"));
      } catch (const std::invalid_argument& e) {
        r.child("to").fail("axes.size.to: " + std::string(e.what()));
      }
      const int64_t factor = r.get_int("factor", 2);
      if (factor < 2) r.child("factor").fail("axes.size.factor: must be an integer >= 2");
      if (from > to) r.fail("axes.size: from is larger than to");
      // from >= 1 and to <= 1e15 (parse_size); stop before a product that would pass TO (or wrap).
      for (size_t s = from; s <= to; s *= static_cast<size_t>(factor)) {
        sizes.push_back(s);
        if (s > to / static_cast<size_t>(factor)) break;
      }
    } else {
      for (const auto& item : axis_items(axes, "size")) {
        try {
          sizes.push_back(parse_size(scalar(item, "size")));
        } catch (const std::invalid_argument& e) {
          item.fail(item.path() + ": " + e.what());
        }
      }
    }
  }
  const std::vector<DeviceEntry> devs = devices.empty() ? std::vector<DeviceEntry>{{"generic", "{preset: generic}"}} : devices;
  for (const auto& t : topos)
    for (const auto& d : devs)
      for (const auto& [c, corigin] : cs)
        for (const auto& a : algs)
          for (auto dt : dts)
            for (size_t s : sizes) {
              SweepPoint p;
              p.kind = PointKind::collective;
              p.chips = t.chips;
              p.topology = t.label;
              p.device = d.label;
              p.collective = collectives::collective_name(c);
              p.algorithm = a == "auto" ? a : collectives::canonical_algorithm(c, a);
              if (p.algorithm.empty()) {
                p.algorithm = a;
                p.error = p.collective;
                p.error += ": ";
                p.error += collectives::not_an_algorithm_of(c, a);
              }
              p.dtype = runtime::dtype_name(dt);
              p.size_bytes = s;
              p.topology_yaml = t.yaml;
              p.device_yaml = d.yaml;
              p.origin = corigin;
              p.key = p.collective + "|" + p.algorithm + "|" + p.topology + "|" + p.device + "|" + p.dtype + "|" +
                      std::to_string(s) + "#" + short_hash(t.yaml + "\n" + d.yaml);
              add_point(spec, std::move(p));
            }
}

// A serve point's settings: its rate (serve.trace.rate) and batching entry (serve-section keys), with their labels.
struct ServeVariant {
  std::string rate, batching;
  YAML::Node rate_value, settings;
};

// The rate x batching product of AXES (each axis optional; one variant with neither when both are absent).
std::vector<ServeVariant> serve_variants(const ConfigNode& axes) {
  std::vector<ServeVariant> rates(1), out;
  if (axes.has("rate")) {
    rates.clear();
    for (const auto& item : axis_items(axes, "rate")) {
      const std::string v = scalar(item, "request rate (requests/s)");
      const auto r = decimal_double(v);  // serve.trace.rate's rule: decimal, within its bounds
      if (!r || !(*r >= serving::kMinRate && *r <= serving::kMaxRate))
        item.fail(item.path() + ": a request rate in requests/s from 1e-6 to 1e9 (got '" + v + "')");
      ServeVariant sv;
      sv.rate = v;
      sv.rate_value = YAML::Clone(item.yaml());
      rates.push_back(sv);
    }
  }
  std::vector<ServeVariant> batchings(1);
  if (axes.has("batching")) {
    batchings.clear();
    for (const auto& item : axis_items(axes, "batching")) {
      if (!item.is_map()) item.fail(item.path() + ": a map of serve settings, e.g. {policy: chunked, max_num_batched_tokens: 2048}");
      item.expect_keys(kSweepBatchingKeys);
      serving::SchedulerConfig checked;  // each value as serve reads it, so a bad one is refused here, not a row
      serving::read_batching(item, checked);
      ServeVariant sv;
      sv.settings = YAML::Node(YAML::NodeType::Map);
      std::string label;
      for (const auto& kv : item.yaml()) {
        const auto k = kv.first.as<std::string>();
        if (k == "label") continue;
        const std::string v = scalar(ConfigNode(kv.second, item.file(), item.path() + "." + k), "value");
        sv.settings[k] = YAML::Clone(kv.second);
        label += (label.empty() ? "" : ",") + (k == "policy" ? v : k + "=" + v);
      }
      sv.batching = item.get_string("label", label.empty() ? "config" : label);
      for (const auto& o : batchings)
        if (o.batching == sv.batching) item.fail(item.path() + ": batching label '" + sv.batching + "' listed twice (add `label:`)");
      batchings.push_back(sv);
    }
  }
  for (const auto& b : batchings)
    for (const auto& r : rates) out.push_back({r.rate, b.batching, r.rate_value, b.settings});
  return out;
}

// The workload grid: workload x topology x device x plan (topology and device default to the workload file's own;
// serve workloads also x batching x rate).
void add_workload_points(SweepSpec& spec, const ConfigNode& axes, const std::vector<TopoEntry>& topos,
                         const std::vector<DeviceEntry>& devices, const std::string& file) {
  const auto workloads = parse_workloads(axes);
  std::vector<ConfigNode> plans;
  for (const auto& item : axis_items(axes, "plan")) {
    item.expect_keys(sharding::plans::sweep_plan_keys());
    plans.push_back(item);
  }
  for (const auto& w : workloads) {
    // Topology: the axis, else the workload file's own.
    std::vector<TopoEntry> ts = topos;
    if (ts.empty()) {
      TopoEntry e;
      if (!w.root["topology"])
        ConfigNode(w.root, w.file, "").fail("topology: missing (give the sweep a `topology` axis or the workload a "
                                             "topology: section)");
      // Inline or a path to a topology file, as `run` reads it.
      e.chips = sharding::load_workload_topology(ConfigNode(w.root, w.file, "")).num_chips();
      e.yaml = flow(w.root["topology"]);
      e.label = w.root["topology"].IsScalar() ? fs::path(w.root["topology"].as<std::string>()).stem().string()
                                              : auto_topo_label(w.root["topology"], e.chips);
      ts.push_back(e);
    }
    std::vector<DeviceEntry> ds = devices;
    if (ds.empty()) {
      DeviceEntry e;
      if (w.root["device"]) {
        e.yaml = flow(w.root["device"]);
        // A preset name (as `run` accepts it) or a section.
        e.label = w.root["device"].IsScalar()
                      ? ConfigNode(w.root["device"], w.file, "device").printable_text()
                  : w.root["device"]["preset"]
                      ? ConfigNode(w.root["device"]["preset"], w.file, "device.preset").printable_text()
                      : "custom";
      } else {
        e.yaml = "{preset: generic}";
        e.label = "generic";
      }
      ds.push_back(e);
    }
    const std::vector<ServeVariant> variants = w.serve ? serve_variants(axes) : std::vector<ServeVariant>(1);
    for (const auto& t : ts)
      for (const auto& d : ds)
        for (const auto& plan : plans)
          for (const auto& sv : variants) {
            SweepPoint p;
            p.kind = PointKind::workload;
            p.chips = t.chips;
            p.topology = t.label;
            p.device = d.label;
            p.workload = w.label;
            p.origin = plan.where();
            YAML::Node cfg = YAML::Clone(w.root);
            // The plan replaces the file's `parallel:`; its fused/chunks settings carry over unless the plan
            // sets them (so a fused workload file stays fused, and the label says so).
            YAML::Node par = plan_for(plan, t.chips, &p.plan, w.root["parallel"], w.file);
            if (par["micro_batch"]) {  // a model key (sequences per micro-batch), swept with the plan
              cfg["workload"]["micro_batch"] = YAML::Clone(par["micro_batch"]);
              par.remove("micro_batch");
            }
            cfg["name"] = w.label + "/" + p.plan + "/" + t.label;
            cfg["topology"] = YAML::Load(t.yaml);
            cfg["device"] = YAML::Load(d.yaml);
            cfg["parallel"] = par;
            if (!w.block && cfg["checkpoint"]) cfg.remove("checkpoint");
            if (w.serve && !sv.rate.empty()) cfg["serve"]["trace"]["rate"] = YAML::Clone(sv.rate_value);
            if (w.serve && sv.settings.IsMap())
              for (const auto& kv : sv.settings) cfg["serve"][kv.first.as<std::string>()] = YAML::Clone(kv.second);
            p.config_yaml = block(cfg);
            p.serve = w.serve;
            p.rate = sv.rate;
            p.batching = sv.batching;
            p.key = "workload|" + p.workload + "|" + p.plan + "|" + p.topology + "|" + p.device +
                    (w.serve ? "|" + p.batching + "|" + p.rate : std::string()) + "#" + short_hash(p.config_yaml);
            const std::string where = file + "[" + p.key + "]";
            p.train = w.train && !w.serve;
            if (t.astra) {
              p.error = "ASTRA-sim network files can only be used in collective sweeps";
            } else if (w.serve) {
              // Run by serve's runner (experiments/scheduler.h); its loader checks the config when the point runs
              // (a refusal is the row's reason).
            } else {
              try {
                // Run by the executor (experiments/scheduler.h) in the command's mode; checked here by its parser.
                throw_if_point_cannot_run(p, sharding::workload_config_from_text(p.config_yaml, where), t.chips);
                if (!w.train) add_validation(p, cfg, w.block, t.chips, file);
              } catch (const Error& e) {
                // "FILE[KEY]:LINE: msg": the line is in the generated config, not in a file the user has; the row
                // already carries the key.
                p.error = e.what();
                if (p.error.rfind(where + ":", 0) == 0) {
                  const auto colon = p.error.find(": ", where.size());
                  if (colon != std::string::npos) p.error = p.error.substr(colon + 2);
                }
                p.error = "plan does not fit: " + p.error;
              }
            }
            add_point(spec, std::move(p));
          }
  }
}

}  // namespace

SweepSpec parse_sweep(const std::string& text, const std::string& file) {
  const ConfigNode root = ConfigNode::load_string(text, file);
  root.expect_keys(kSweepRootKeys);
  SweepSpec spec;
  spec.file = file;
  spec.name = root.get_string("name", fs::path(file).stem().string());
  spec.output = root.get_string("output", "out/sweeps/" + spec.name);
  if (root.has("validate_max_bytes")) {
    const auto n = root.child("validate_max_bytes");
    try {
      spec.validate_max_bytes = n.yaml().as<std::string>() == "0" ? 0.0
                                                                   : static_cast<double>(parse_size(n.yaml().as<std::string>()));
    } catch (const std::invalid_argument& e) {
      n.fail("validate_max_bytes: " + std::string(e.what()));
    }
  }
  if (root.has("validate")) {
    const auto n = root.child("validate");
    const std::string v = n.yaml().IsScalar() ? n.printable_text() : std::string();
    if (v == "every") spec.validate_every = true;
    else if (v != "once")
      n.fail("validate: 'once' (default: each distinct plan validated with real data at a small size, full-size "
             "points timed shape-only) or 'every' (every point validated at full size)" +
             (v.empty() ? std::string(" (got a non-scalar)") : " (got '" + v + "')"));
  }
  if (!root.has("axes")) root.fail("axes: missing (the axes to sweep: topology, collective, size, ... or workload, plan)");
  const ConfigNode axes = root.child("axes");
  axes.expect_keys(kSweepAxisKeys);
  for (const auto& kv : axes.yaml()) spec.axes.push_back(kv.first.as<std::string>());
  auto given = [&](const std::string& a) { return std::find(spec.axes.begin(), spec.axes.end(), a) != spec.axes.end(); };
  // Empty axes are errors wherever they are.
  for (const auto& a : spec.axes) (void)axis_items(axes, a);

  const bool coll = given("collective"), wl = given("workload");
  if (!coll && !wl) axes.fail("axes: nothing to sweep: give `collective` (with `size`, `topology`) or `workload` (with `plan`)");
  for (const char* a : {"algorithm", "size", "dtype"})
    if (given(a) && !coll) axes.fail(std::string("axes.") + a + ": only applies to collectives, and no `collective` axis is given");
  if (given("plan") && !wl) axes.fail("axes.plan: only applies to workloads, and no `workload` axis is given");
  for (const char* a : {"rate", "batching"})
    if (given(a) && !wl) axes.fail(std::string("axes.") + a + ": only applies to serve workloads, and no `workload` axis is given");
  if (coll && !given("size")) axes.fail("axes: the collective grid needs a `size` axis");
  if (coll && !given("topology")) axes.fail("axes: the collective grid needs a `topology` axis");
  if (wl && !given("plan")) axes.fail("axes: the workload grid needs a `plan` axis (e.g. [{tp: chips}, {cp: chips}])");

  const std::vector<TopoEntry> topos = given("topology") ? parse_topologies(axes) : std::vector<TopoEntry>{};
  const std::vector<DeviceEntry> devices = given("device") ? parse_devices(axes) : std::vector<DeviceEntry>{};
  if (coll) add_collective_points(spec, axes, topos, devices, file);
  if (wl) add_workload_points(spec, axes, topos, devices, file);
  return spec;
}

}  // namespace shardsim::experiments
