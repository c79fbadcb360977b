#include "experiments/sweep.h"

#include "common/byte_size.h"

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
#include "common/output_file.h"
#include "runtime/dtype.h"
#include "models/runner.h"
#include "sharding/engine_config.h"
#include "sharding/model_spec.h"
#include "sim/device_spec.h"
#include "topology/topology_yaml.h"

namespace shardsim::sharding {

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
const std::set<std::string_view> kSettableModelKeys(std::begin(kModelKeys), std::end(kModelKeys));

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
    const ConfigNode root = load_workload_config(e.file);
    if (!root.has("workload") || !root.child("workload").is_map())
      root.fail("model: missing (a sweep workload must be a `shardsim run` config)");
    e.block = is_block_config(root);
    e.root = YAML::Clone(root.yaml());
    if (set) {
      if (!set->is_map()) set->fail(set->path() + ": expected a map of workload fields");
      const auto& allowed = kSettableModelKeys;
      for (const auto& kv : set->yaml()) {
        const auto k = kv.first.as<std::string>();
        if (!allowed.count(k) || k == "kind")
          ConfigNode(kv.first, set->file(), set->path()).fail(set->path() + "." + k + ": not a settable workload field");
        e.root["workload"][k] = YAML::Clone(kv.second);
      }
    }
    if (e.label.empty()) e.label = fs::path(e.file).stem().string();
    for (const auto& o : out)
      if (o.label == e.label) item.fail(item.path() + ": workload label '" + e.label + "' listed twice (add `label:`)");
    out.push_back(std::move(e));
  }
  return out;
}

// A plan entry with `chips` substituted; and its label.
YAML::Node plan_for(const ConfigNode& plan, int chips, std::string* label, const YAML::Node& file_parallel,
                    const std::string& workload_file) {
  YAML::Node out(YAML::NodeType::Map);
  int tp = 1, cp = 1, ul = 1, dp = 1;
  bool sp = false, fused = false, dp_fill = false;
  std::string split, ar, chunks;
  for (const auto& kv : plan.yaml()) {
    const auto k = kv.first.as<std::string>();
    // Every value can end up in the plan's label (plots, CSV): printable text only.
    const std::string v = kv.second.IsScalar() ? ConfigNode(kv.second, plan.file(), plan.path() + "." + k).printable_text() : "";
    if (k == "dp" && v == "fill") {  // the data-parallel replicas that fill the point's chips (below)
      dp_fill = true;
    } else if (k == "tp" || k == "cp" || k == "ulysses" || k == "dp") {
      int n = 0;
      if (v == "chips") n = chips;
      else {
        size_t used = 0;
        try {
          n = std::stoi(v, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != v.size())
          ConfigNode(kv.second, plan.file(), plan.path()).fail(plan.path() + "." + k + ": a size or `chips`" +
                                                               (k == "dp" ? " or `fill`" : "") + " (got '" + v + "')");
      }
      out[k] = n;
      (k == "tp" ? tp : k == "cp" ? cp : k == "dp" ? dp : ul) = n;
    } else if (k == "sp" || k == "fused") {
      bool b = false;
      try {
        b = kv.second.as<bool>();
      } catch (const std::exception&) {
        ConfigNode(kv.second, plan.file(), plan.path()).fail(plan.path() + "." + k + ": true or false (got '" + v + "')");
      }
      out[k] = b;
      (k == "sp" ? sp : fused) = b;
    } else if (k == "chunks") {
      out[k] = v;
      chunks = v;
    } else if (k == "cp_split") {
      out[k] = v;
      split = v;
    } else if (k == "all_reduce") {
      out[k] = v;
      ar = v;
    }
  }
  // dp: fill = chips / (tp x cp x ulysses) replicas; when that does not divide, dp stays 1 and the point is
  // skipped with the parser's reason (the mesh does not cover the chips).
  if (dp_fill) {
    const int model = tp * cp * ul;
    dp = model > 0 && chips % model == 0 ? chips / model : 1;
    if (dp > 1) out["dp"] = dp;
  }
  // The workload file's own fused/chunks carry over unless the plan sets them (values checked by the parser).
  if (file_parallel && file_parallel.IsMap()) {
    if (!out["fused"] && file_parallel["fused"] && file_parallel["fused"].IsScalar()) {
      out["fused"] = YAML::Clone(file_parallel["fused"]);
      try {
        fused = file_parallel["fused"].as<bool>();
      } catch (const std::exception&) {
      }
    }
    if (!out["chunks"] && file_parallel["chunks"] && file_parallel["chunks"].IsScalar()) {
      out["chunks"] = YAML::Clone(file_parallel["chunks"]);
      chunks = ConfigNode(file_parallel["chunks"], workload_file, "parallel.chunks").printable_text();
    }
  }
  std::string s;
  auto add = [&](const std::string& name, int n, bool given) {
    if (given) s += (s.empty() ? "" : "x") + name + std::to_string(n);
  };
  add("tp", tp, out["tp"].IsDefined());
  add("cp", cp, out["cp"].IsDefined());
  add("ulysses", ul, out["ulysses"].IsDefined());
  add("dp", dp, out["dp"].IsDefined());
  if (s.empty()) s = "single";
  if (sp) s += "+sp";
  if (!split.empty()) s += "-" + split;
  if (!ar.empty()) s += "-ar_" + ar;
  if (fused) s += "+fused";
  if (!chunks.empty()) s += "-c" + chunks;
  *label = s;
  return out;
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
  if (!p.model || p.model->shape_only()) return;
  YAML::Node small = YAML::Clone(cfg);
  std::string dims;
  if (!shrink_for_validation(small, block_kind, chips, &dims)) return;
  small["name"] = cfg["name"].as<std::string>() + "/validate";
  YAML::Node id = YAML::Clone(small);
  id.remove("name");
  const std::string key = "validate|" + short_hash(block(id));
  try {
    const std::string text = block(small);
    auto model = std::make_shared<ModelConfig>(parse_model_config(workload_config_from_text(text, file + "[" + key + "]")));
    if (model->kind == ModelConfig::Kind::mlp) check_world_size(model->mlp, chips);
    p.validation_model = std::move(model);
    p.validation_key = key;
    p.validation_dims = dims;
  } catch (const Error&) {
    // The shrunk shape does not fit the plan: the full-size point runs with real data (validated_at self).
  }
}

}  // namespace

bool validated_separately(const SweepPoint& p, const SweepSpec& spec) {
  return p.kind == PointKind::workload && !spec.validate_every && p.validation_model != nullptr;
}

SweepSpec load_sweep(const std::string& file) {
  if (fs::is_directory(file)) throw UsageError(file + ": is a directory, need a sweep YAML file");
  std::ifstream in(file);
  if (!in) throw UsageError(file + ": cannot read the sweep file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_sweep(ss.str(), file);
}

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
  if (coll && !given("size")) axes.fail("axes: the collective grid needs a `size` axis");
  if (coll && !given("topology")) axes.fail("axes: the collective grid needs a `topology` axis");
  if (wl && !given("plan")) axes.fail("axes: the workload grid needs a `plan` axis (e.g. [{tp: chips}, {cp: chips}])");

  const std::vector<TopoEntry> topos = given("topology") ? parse_topologies(axes) : std::vector<TopoEntry>{};
  const std::vector<DeviceEntry> devices = given("device") ? parse_devices(axes) : std::vector<DeviceEntry>{};

  auto add_point = [&](SweepPoint p) {
    p.index = static_cast<int>(spec.points.size());
    for (const auto& q : spec.points)
      if (q.key == p.key)
        throw ConfigError(p.origin + ": point " + p.key + " appears twice (a value is listed twice in an axis)");
    spec.points.push_back(std::move(p));
  };

  if (coll) {
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
        for (size_t s = from; s <= to; s *= static_cast<size_t>(factor)) sizes.push_back(s);
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
                add_point(std::move(p));
              }
  }

  if (wl) {
    const auto workloads = parse_workloads(axes);
    std::vector<ConfigNode> plans;
    for (const auto& item : axis_items(axes, "plan")) {
      item.expect_keys(kSweepPlanKeys);
      plans.push_back(item);
    }
    for (const auto& w : workloads) {
      // Topology: the axis, else the workload file's own.
      std::vector<TopoEntry> ts = topos;
      if (ts.empty()) {
        TopoEntry e;
        if (!w.root["topology"]) ConfigNode(w.root, w.file, "").fail("topology: missing");
        // Inline or a path to a topology file, as `run` reads it.
        e.chips = load_workload_topology(ConfigNode(w.root, w.file, "")).num_chips();
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
      for (const auto& t : ts)
        for (const auto& d : ds)
          for (const auto& plan : plans) {
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
            const YAML::Node par = plan_for(plan, t.chips, &p.plan, w.root["parallel"], w.file);
            cfg["name"] = w.label + "/" + p.plan + "/" + t.label;
            cfg["topology"] = YAML::Load(t.yaml);
            cfg["device"] = YAML::Load(d.yaml);
            cfg["parallel"] = par;
            if (!w.block && cfg["checkpoint"]) cfg.remove("checkpoint");
            p.config_yaml = block(cfg);
            p.key = "workload|" + p.workload + "|" + p.plan + "|" + p.topology + "|" + p.device + "#" +
                    short_hash(p.config_yaml);
            const std::string where = file + "[" + p.key + "]";
            if (t.astra) {
              p.error = "ASTRA-sim network files can only be used in collective sweeps";
            } else {
              try {
                auto model = std::make_shared<ModelConfig>(
                    parse_model_config(workload_config_from_text(p.config_yaml, where)));
                if (model->kind == ModelConfig::Kind::mlp) check_world_size(model->mlp, t.chips);
                p.model = std::move(model);
                add_validation(p, cfg, w.block, t.chips, file);
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
            add_point(std::move(p));
          }
    }
  }
  return spec;
}

// ---- rows and CSV ----

const std::vector<std::string>& result_columns() {
  static const std::vector<std::string> cols = {
      "key",        "kind",          "topology",  "device",      "chips",     "collective", "algorithm",
      "algorithm_used", "dtype",     "size_bytes", "workload",   "plan",      "timing",     "sim_time_us",
      "algbw_gbps", "busbw_gbps",    "compute_us", "comm_us",    "exposed_comm_us", "peak_mem_bytes",
      "wrong",      "max_rel_error", "verdict",   "reason",      "wall_s",          "ranks",
      "idle_us",    "tflops",        "peak_fraction", "tokens_per_s", "validated_at"};
  return cols;
}

Row base_row(const SweepPoint& p) {
  Row r;
  for (const auto& c : result_columns()) r[c] = "";
  r["key"] = p.key;
  r["kind"] = p.kind == PointKind::collective ? "collective" : "workload";
  r["topology"] = p.topology;
  r["device"] = p.device;
  r["chips"] = std::to_string(p.chips);
  if (p.kind == PointKind::collective) {
    r["collective"] = p.collective;
    r["algorithm"] = p.algorithm;
    r["dtype"] = p.dtype;
    r["size_bytes"] = std::to_string(p.size_bytes);
  } else {
    r["workload"] = p.workload;
    r["plan"] = p.plan;
  }
  return r;
}

std::string csv_line(const std::vector<std::string>& fields) {
  std::string out;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i) out += ',';
    const auto& f = fields[i];
    if (f.find_first_of(",\"\n\r") == std::string::npos) {
      out += f;
    } else {
      out += '"';
      for (char c : f) {
        if (c == '"') out += "\"\"";
        else if (c == '\n' || c == '\r') out += ' ';
        else out += c;
      }
      out += '"';
    }
  }
  return out + "\n";
}

std::string csv_header() { return csv_line(result_columns()); }

std::string csv_row(const Row& row) {
  std::vector<std::string> f;
  for (const auto& c : result_columns()) {
    const auto it = row.find(c);
    f.push_back(it == row.end() ? "" : it->second);
  }
  return csv_line(f);
}

std::vector<Row> parse_csv(const std::string& text, const std::string& file, int* dropped) {
  if (dropped) *dropped = 0;
  std::vector<Row> rows;
  std::vector<std::vector<std::string>> records;
  std::vector<std::string> rec;
  std::string field;
  bool quoted = false, any = false;
  size_t i = 0;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"') {
        if (i + 1 < text.size() && text[i + 1] == '"') {
          field += '"';
          ++i;
        } else {
          quoted = false;
        }
      } else {
        field += c;
      }
    } else if (c == '"') {
      quoted = true;
      any = true;
    } else if (c == ',') {
      rec.push_back(field);
      field.clear();
      any = true;
    } else if (c == '\n') {
      rec.push_back(field);
      records.push_back(rec);
      rec.clear();
      field.clear();
      any = false;
    } else if (c != '\r') {
      field += c;
      any = true;
    }
  }
  if (any || !rec.empty()) {
    if (dropped) ++*dropped;  // last line without its newline: an interrupted write
  }
  if (records.empty()) return rows;
  // Columns are matched by name, so a file written before a column was added still resumes (the new column
  // stays empty in its old rows).
  const auto& known = result_columns();
  const auto& cols = records[0];
  bool ours = std::find(cols.begin(), cols.end(), "key") != cols.end();
  for (const auto& c : cols) ours = ours && std::find(known.begin(), known.end(), c) != known.end();
  if (!ours)
    throw ConfigError(file + ":1: not a shardsim sweep results file (unexpected header); move it away or use --force");
  for (size_t r = 1; r < records.size(); ++r) {
    if (records[r].size() != cols.size()) {
      if (dropped) ++*dropped;
      continue;
    }
    Row row;
    for (const auto& c : known) row[c] = "";
    for (size_t k = 0; k < cols.size(); ++k) row[cols[k]] = records[r][k];
    rows.push_back(std::move(row));
  }
  return rows;
}

namespace {
bool numeric_column(const std::string& c) {
  static const std::set<std::string> n = {"chips", "size_bytes", "sim_time_us", "algbw_gbps", "busbw_gbps",
                                          "compute_us", "comm_us", "exposed_comm_us", "peak_mem_bytes", "wrong",
                                          "max_rel_error", "wall_s", "idle_us", "tflops", "peak_fraction",
                                          "tokens_per_s"};
  return n.count(c) > 0;
}
nlohmann::json best_json(const std::vector<BestPlan>& best) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& b : best) {
    nlohmann::json o = {{"workload", b.workload}, {"topology", b.topology}, {"device", b.device},
                        {"compared", b.compared}};
    if (b.best.empty()) {
      o["best_plan"] = nullptr;
    } else {
      o["best_plan"] = b.best.at("plan");
      o["key"] = b.best.at("key");
      const auto at = b.best.find("validated_at");
      o["validated_at"] = at == b.best.end() ? std::string() : at->second;
      for (const char* c : {"sim_time_us", "compute_us", "comm_us", "exposed_comm_us", "idle_us", "tflops",
                            "peak_fraction", "tokens_per_s"}) {
        const auto it = b.best.find(c);
        o[c] = it == b.best.end() || it->second.empty() ? nlohmann::json(nullptr)
                                                         : nlohmann::json(std::strtod(it->second.c_str(), nullptr));
      }
    }
    nlohmann::json sk = nlohmann::json::array(), fl = nlohmann::json::array();
    for (const auto& [p, w] : b.skipped) sk.push_back({{"plan", p}, {"reason", w}});
    for (const auto& [p, w] : b.failed) fl.push_back({{"plan", p}, {"reason", w}});
    o["skipped"] = sk;
    o["failed_validation"] = fl;
    a.push_back(o);
  }
  return a;
}
}  // namespace

std::vector<BestPlan> best_plans(const std::vector<Row>& rows) {
  std::vector<BestPlan> out;
  std::map<std::string, size_t> at;  // group key -> index in OUT
  for (const auto& r : rows) {
    auto get = [&](const char* c) {
      const auto it = r.find(c);
      return it == r.end() ? std::string() : it->second;
    };
    if (get("kind") != "workload") continue;
    const std::string key = get("workload") + '\x1f' + get("topology") + '\x1f' + get("device");
    auto [it, fresh] = at.emplace(key, out.size());
    if (fresh) out.push_back({get("workload"), get("topology"), get("device"), {}, 0, {}, {}});
    BestPlan& b = out[it->second];
    const std::string v = get("verdict");
    if (v == "error") {
      b.skipped.emplace_back(get("plan"), get("reason"));
      continue;
    }
    if (v == "fail") {
      b.failed.emplace_back(get("plan"), get("reason"));
      continue;
    }
    if (v != "pass" && v != "not_validated") continue;
    char* end = nullptr;
    const std::string t = get("sim_time_us");
    const double us = std::strtod(t.c_str(), &end);
    if (t.empty() || !end || *end != '\0') continue;
    ++b.compared;
    if (b.best.empty() || us < std::strtod(b.best.at("sim_time_us").c_str(), nullptr)) b.best = r;
  }
  return out;
}

std::string best_plans_text(const std::vector<BestPlan>& best) {
  if (best.empty()) return "";
  std::ostringstream os;
  os << "best plan per topology x device (lowest simulated time among the plans that ran and passed; critical "
        "chip's breakdown in us)\n";
  char buf[512];
  std::snprintf(buf, sizeof buf, "  %-18s %-14s %-10s %-22s %11s %11s %11s %11s %11s %8s %6s  %s\n", "workload",
                "topology", "device", "best plan", "total", "compute", "comm", "exposed", "idle", "TFLOP/s", "%peak",
                "compared; validated at");
  os << buf;
  auto col = [](const Row& r, const char* c) {
    const auto it = r.find(c);
    return it == r.end() || it->second.empty() ? std::string("-") : it->second;
  };
  auto num = [&](const Row& r, const char* c, const char* f, double scale) {
    const std::string v = col(r, c);
    if (v == "-") return v;
    char b[64];
    std::snprintf(b, sizeof b, f, std::strtod(v.c_str(), nullptr) * scale);
    return std::string(b);
  };
  for (const auto& b : best) {
    std::string tail = std::to_string(b.compared) + " plan(s)";
    if (!b.skipped.empty()) tail += ", " + std::to_string(b.skipped.size()) + " skipped";
    if (!b.failed.empty()) tail += ", " + std::to_string(b.failed.size()) + " failed validation";
    if (!b.best.empty()) {
      const std::string at = col(b.best, "validated_at");
      tail += "; " + (at == "-" ? std::string("not validated") : at);
    }
    if (b.best.empty()) {
      std::snprintf(buf, sizeof buf, "  %-18s %-14s %-10s %-22s  %s\n", b.workload.c_str(), b.topology.c_str(),
                    b.device.c_str(), "(none ran)", tail.c_str());
    } else {
      std::snprintf(buf, sizeof buf, "  %-18s %-14s %-10s %-22s %11s %11s %11s %11s %11s %8s %6s  %s\n",
                    b.workload.c_str(), b.topology.c_str(), b.device.c_str(), col(b.best, "plan").c_str(),
                    num(b.best, "sim_time_us", "%.3f", 1).c_str(), num(b.best, "compute_us", "%.3f", 1).c_str(),
                    num(b.best, "comm_us", "%.3f", 1).c_str(), num(b.best, "exposed_comm_us", "%.3f", 1).c_str(),
                    num(b.best, "idle_us", "%.3f", 1).c_str(), num(b.best, "tflops", "%.2f", 1).c_str(),
                    num(b.best, "peak_fraction", "%.1f", 100).c_str(), tail.c_str());
    }
    os << buf;
    for (const auto& [plan, why] : b.skipped)
      os << "    skipped " << plan << " on " << b.topology << " / " << b.device << ": " << why << "\n";
    for (const auto& [plan, why] : b.failed)
      os << "    failed  " << plan << " on " << b.topology << " / " << b.device << ": " << why << "\n";
  }
  return os.str();
}

std::string rows_to_json(const std::string& name, const std::vector<Row>& rows) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json o = nlohmann::json::object();
    for (const auto& c : result_columns()) {
      const auto it = r.find(c);
      const std::string v = it == r.end() ? "" : it->second;
      if (numeric_column(c)) {
        if (v.empty()) o[c] = nullptr;
        else {
          char* end = nullptr;
          const double d = std::strtod(v.c_str(), &end);
          if (end && *end == '\0') {
            if (c == "chips" || c == "size_bytes" || c == "wrong" || c == "peak_mem_bytes") o[c] = static_cast<long long>(d);
            else o[c] = d;
          } else {
            o[c] = v;
          }
        }
      } else {
        o[c] = v;
      }
    }
    arr.push_back(o);
  }
  return nlohmann::json{{"sweep", name},
                        {"units", {{"time", "us (simulated unless wall_s)"}, {"bandwidth", "GB/s, GB = 1e9 B"}}},
                        {"rows", arr},
                        {"best_plans", best_json(best_plans(rows))}}
             .dump(2) +
         "\n";
}

// ---- plots ----

namespace {
// Plot scripts never interpret text from configs or results files (docs/SECURITY.md): series titles and bar
// labels are data (read from the .dat files with columnheader / xtic), and the few strings written into a
// script go through gp_quote: a gnuplot single-quoted string, in which gnuplot performs no backquote command
// substitution, no @macro expansion and no backslash escapes (the terminal is 'noenhanced'); a quote is
// doubled, and control characters (a newline would end the command) become '?'.
std::string gp_quote(const std::string& s) {
  std::string o = "'";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    o += c == '\'' ? std::string("''") : (u < 0x20 || u == 0x7f) ? std::string("?") : std::string(1, c);
  }
  return o + "'";
}
// A string as one data-file field: in double quotes, with '"' (which a data file cannot escape) as '\'' and
// control characters (which would end the record) as '?'.
std::string gp_data_string(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    o += c == '"' ? '\'' : (u < 0x20 || u == 0x7f) ? '?' : c;
  }
  return o + "\"";
}
// Collective names from a results file are plotted only when they are names this program knows.
bool known_collective(const std::string& name) {
  try {
    (void)collectives::parse_collective(name);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}
std::string file_safe(const std::string& s) {
  std::string o;
  for (char c : s) o += std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' ? c : '_';
  return o;
}
void write(const fs::path& p, const std::string& text) { write_file_atomic(p.string(), text); }
bool has_number(const Row& r, const std::string& c) {
  const auto it = r.find(c);
  return it != r.end() && !it->second.empty();
}
double num(const Row& r, const std::string& c) { return has_number(r, c) ? std::strtod(r.at(c).c_str(), nullptr) : 0.0; }
}  // namespace

std::vector<std::string> write_plot_scripts(const std::string& dir, const std::vector<Row>& rows) {
  std::vector<std::string> scripts;
  const std::string term = "set terminal pngcairo size 960,600 noenhanced font ',10'\n";
  // busbw vs size, one plot per collective.
  std::vector<std::string> colls;
  for (const auto& r : rows)
    if (r.at("kind") == "collective" && has_number(r, "busbw_gbps") && known_collective(r.at("collective")) &&
        std::find(colls.begin(), colls.end(), r.at("collective")) == colls.end())
      colls.push_back(r.at("collective"));
  for (const auto& c : colls) {
    std::set<std::string> dtypes, devices;
    for (const auto& r : rows)
      if (r.at("collective") == c && has_number(r, "busbw_gbps")) {
        dtypes.insert(r.at("dtype"));
        devices.insert(r.at("device"));
      }
    std::vector<std::string> order, topos, algs;
    std::map<std::string, std::vector<std::pair<double, double>>> series;
    std::map<std::string, std::pair<size_t, size_t>> style;  // colour by topology, dash type by algorithm
    auto index_of = [](std::vector<std::string>& v, const std::string& x) {
      const auto it = std::find(v.begin(), v.end(), x);
      if (it != v.end()) return static_cast<size_t>(it - v.begin());
      v.push_back(x);
      return v.size() - 1;
    };
    for (const auto& r : rows) {
      if (r.at("kind") != "collective" || r.at("collective") != c || !has_number(r, "busbw_gbps")) continue;
      std::string label = r.at("topology") + " " + r.at("algorithm");
      if (dtypes.size() > 1) label += " " + r.at("dtype");
      if (devices.size() > 1) label += " " + r.at("device");
      if (!series.count(label)) {
        order.push_back(label);
        style[label] = {index_of(topos, r.at("topology")), index_of(algs, r.at("algorithm"))};
      }
      series[label].emplace_back(num(r, "size_bytes"), num(r, "busbw_gbps"));
    }
    std::string dat, plot;
    for (size_t i = 0; i < order.size(); ++i) {
      auto pts = series[order[i]];
      std::sort(pts.begin(), pts.end());
      dat += gp_data_string(order[i]) + " busbw_gbps\n";  // the block's column headers: its title
      for (const auto& [x, y] : pts) {
        char b[64];
        std::snprintf(b, sizeof b, "%.0f %.9g\n", x, y);
        dat += b;
      }
      dat += "\n\n";
      plot += std::string(i ? ", \\\n     " : "plot ") + "'busbw_" + file_safe(c) + ".dat' index " + std::to_string(i) +
              " using 1:2 with linespoints lw 2 lc " + std::to_string(style[order[i]].first + 1) + " dt " +
              std::to_string(style[order[i]].second % 5 + 1) + " pt " + std::to_string(style[order[i]].second + 1) +
              " title columnheader(1)";
    }
    const std::string base = "busbw_" + file_safe(c);
    write(fs::path(dir) / (base + ".dat"), dat);
    write(fs::path(dir) / (base + ".gp"),
          "# gnuplot script written by shardsim sweep; redraw with: gnuplot " + base + ".gp (in this directory)\n" + term +
              "set output '" + base + ".png'\n" + "set title " +
              gp_quote(c + ": simulated bus bandwidth vs message size (GB = 1e9 B)") + "\n" +
              "set logscale x 2\nset format x '%.0b%B'\nset xlabel 'message size per rank (bytes)'\n"
              "set ylabel 'busbw (GB/s, simulated)'\nset key top left\nset grid\nset yrange [0:*]\n" +
              plot + "\n");
    scripts.push_back(base + ".gp");
  }
  // Workload breakdown: stacked bars.
  std::string dat;
  int n = 0;
  std::set<std::string> workloads, devs;
  for (const auto& r : rows)
    if (r.at("kind") == "workload" && has_number(r, "sim_time_us")) {
      workloads.insert(r.at("workload"));
      devs.insert(r.at("device"));
    }
  for (const auto& r : rows) {
    if (r.at("kind") != "workload") continue;
    // A point that could not run (e.g. a plan that cannot fill the chips) stays on the plot as an empty bar
    // labelled "(skipped)", so the grid's gaps are visible; the reason is in the CSV and the best-plan table.
    const bool ran = has_number(r, "sim_time_us");
    const double total = ran ? num(r, "sim_time_us") : 0, comp = ran ? num(r, "compute_us") : 0,
                 exp = ran ? num(r, "exposed_comm_us") : 0;
    // Only the axes that vary go into the bar labels.
    std::string label = (workloads.size() > 1 ? r.at("workload") + " " : "") + r.at("plan") + " " + r.at("topology") +
                        (devs.size() > 1 ? " " + r.at("device") : "") + (ran ? "" : " (skipped)");
    const std::string q = gp_data_string(label);
    char b[160];
    std::snprintf(b, sizeof b, " %.6f %.6f %.6f\n", comp, exp, std::max(0.0, total - comp - exp));
    dat += q + b;
    ++n;
  }
  if (!workloads.empty() && n > 0) {
    write(fs::path(dir) / "breakdown.dat", "# label compute_us exposed_comm_us idle_us (simulated)\n" + dat);
    write(fs::path(dir) / "breakdown.gp",
          "# gnuplot script written by shardsim sweep; redraw with: gnuplot breakdown.gp (in this directory)\n" + term +
              "set output 'breakdown.png'\nset title " +
              gp_quote("simulated time per plan and topology" +
                       (workloads.size() == 1 ? ": " + *workloads.begin() : std::string(" (per workload)"))) +
              "\n"
              "set style data histograms\nset style histogram rowstacked\nset style fill solid 0.85 border -1\n"
              "set boxwidth 0.75\nset xtics rotate by 45 right scale 0\nset ylabel 'simulated time (us)'\n"
              "set key outside top center horizontal\nset grid ytics\nset yrange [0:*]\n"
              "set bmargin 10\n"
              "plot 'breakdown.dat' using 2:xtic(1) title 'compute', '' using 3 title 'exposed communication', "
              "'' using 4 title 'idle'\n");
    scripts.push_back("breakdown.gp");
  }
  return scripts;
}

}  // namespace shardsim::sharding
