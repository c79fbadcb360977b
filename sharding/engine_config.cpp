#include "sharding/engine_config.h"

#include "common/text.h"
#include "common/number.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <filesystem>
#include <sstream>

#include "common/error.h"
#include "common/input_file.h"
#include "sharding/plans/registry.h"
#include "topology/topology_yaml.h"

namespace shardsim::sharding {

namespace {

namespace fs = std::filesystem;

// "2x4" -> [2, 4]; UsageError naming FLAG otherwise.
std::vector<int> parse_dims(const std::string& text, const std::string& flag) {
  std::vector<int> dims;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, 'x')) {
    const auto v = decimal_int(item);
    if (!v || *v < 1 || *v > (1 << 24))
      throw UsageError(flag + " " + text + ": expected dimensions like 2x4 (positive integers joined by 'x')");
    dims.push_back(static_cast<int>(*v));
  }
  if (dims.empty()) throw UsageError(flag + ": empty dimensions");
  return dims;
}

// The value of a --set / --plan item as YAML (so 2 is a number, true a bool, [0, 1] a list).
// A value padded with blanks (`--plan "ep= 2"`, `--set model.seq=2048 `) or only blanks is refused: YAML would trim
// it silently, and a blank is how a shell-quoting slip shows.
YAML::Node yaml_value(const std::string& text, const std::string& flag) {
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
  if (!text.empty() && (blank(text.front()) || blank(text.back())))
    throw UsageError(flag + ": the value '" + text + "' starts or ends with a blank (write it without spaces around it)");
  try {
    return ConfigNode::unmarked(YAML::Load(text));  // its positions are the flag's, not the config file's lines
  } catch (const YAML::Exception& e) {
    throw UsageError(flag + ": '" + text + "' is not a YAML value: " + e.msg);
  }
}

// "dims[0][1]" -> ("dims", {0, 1}); "seq" -> ("seq", {}); UsageError naming ITEM for a malformed index.
std::pair<std::string, std::vector<size_t>> set_key_segment(const std::string& seg, const std::string& item) {
  const size_t open = seg.find('[');
  if (open == std::string::npos) {
    if (seg.find(']') != std::string::npos) throw UsageError("--set " + item + ": unmatched ']' in '" + seg + "'");
    return {seg, {}};
  }
  if (open == 0) throw UsageError("--set " + item + ": '" + seg + "' has an index but no key");
  std::vector<size_t> index;
  for (size_t at = open; at < seg.size();) {
    const size_t close = seg.find(']', at);
    const std::string digits = close == std::string::npos ? "" : seg.substr(at + 1, close - at - 1);
    if (seg[at] != '[' || digits.empty() || digits.size() > 6 ||
        digits.find_first_not_of("0123456789") != std::string::npos)
      throw UsageError("--set " + item + ": '" + seg + "': an index is [N], N a list position from 0");
    index.push_back(std::stoul(digits));
    at = close + 1;
  }
  return {seg.substr(0, open), index};
}

void apply_set(YAML::Node root, const std::string& item) {
  const auto eq = item.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UsageError("--set " + item + ": expected key.path=value (e.g. model.seq=2048)");
  std::string path = item.substr(0, eq);
  std::vector<std::string> keys;
  std::stringstream ss(path);
  std::string k;
  while (std::getline(ss, k, '.')) {
    if (k.empty()) throw UsageError("--set " + item + ": empty key in '" + path + "'");
    keys.push_back(k);
  }
  if (!keys.empty() && keys[0] == "model") keys[0] = "workload";  // model: is read as workload:
  // `device: h100` is the preset h100: --set device.KEY=V overrides a field of it ({preset: h100, KEY: V}).
  if (keys.size() > 1 && keys[0] == "device" && (!root["device"] || root["device"].IsScalar())) {
    const std::string preset = root["device"] ? root["device"].as<std::string>() : std::string(kDefaultDevice);
    root["device"] = YAML::Node(YAML::NodeType::Map);
    root["device"]["preset"] = preset;
  }
  // `topology: FILE`: --set topology.KEY=V changes that file's topology section, set inline (as --what-if does).
  if (keys.size() > 1 && keys[0] == "topology" && root["topology"] && root["topology"].IsScalar()) {
    const std::string file = root["topology"].as<std::string>();
    const ConfigNode doc = ConfigNode::load_file(file);
    if (topology::is_astra_network(doc))
      throw UsageError("--set " + item + ": the topology is an ASTRA-sim network file (" + file +
                       "); change its bandwidth:/latency: lists, or use a shardsim topology file");
    const ConfigNode section = doc.has("topology") ? doc.child("topology") : doc;
    if (!section.is_map()) section.fail("topology: expected a map");
    root["topology"] = ConfigNode::unmarked(section.yaml());  // its lines are that file's, not the config's
  }
  YAML::Node n = root;
  for (size_t i = 0; i < keys.size(); ++i) {
    // KEY or KEY[I][J]...: an entry of a list the config already has (topology.dims[0].bandwidth_gbps=800).
    const auto [name, index] = set_key_segment(keys[i], item);
    const bool last = i + 1 == keys.size();
    if (last && index.empty()) {
      n[name] = yaml_value(item.substr(eq + 1), "--set " + item);
      return;
    }
    YAML::Node next = n[name];
    if (!index.empty() && (!next || !next.IsSequence()))
      throw UsageError("--set " + item + ": '" + name + "' is not a list in the config");
    if (next && index.empty() && !next.IsMap())
      throw UsageError("--set " + item + ": '" + name + "' is not a section (it holds a value)");
    if (!next) n[name] = YAML::Node(YAML::NodeType::Map);
    n.reset(n[name]);  // (operator= would overwrite the node n refers to)
    std::string shown = name;
    for (size_t k = 0; k < index.size(); ++k) {
      if (!n.IsSequence() || index[k] >= n.size())
        throw UsageError("--set " + item + ": '" + shown + "' has " +
                         (n.IsSequence() ? std::to_string(n.size()) + " entries" : std::string("no entries")) +
                         " (indices from 0)");
      shown += "[" + std::to_string(index[k]) + "]";
      if (last && k + 1 == index.size()) {
        n[index[k]] = yaml_value(item.substr(eq + 1), "--set " + item);
        return;
      }
      n.reset(n[index[k]]);
    }
    if (!last && !n.IsMap()) throw UsageError("--set " + item + ": '" + shown + "' is not a section (it holds a value)");
  }
}

// --plan KEY=VALUE,...: the keys of the plan registry (sharding/plans/registry.h), each once, each with a value. The
// plan's shape (PlanKey::mesh: the mesh axes and the pipeline) is replaced; the config's other parallel: keys
// (zero, bucket_bytes, fused, chunks, mesh_dims, ...) stay unless the plan sets them.
void apply_plan(YAML::Node root, const std::string& plan) {
  const std::string flag = "--plan " + escape_control(plan);
  std::vector<std::pair<std::string, std::string>> items;
  std::vector<std::string> parts;
  try {  // commas inside [] stay in their item (pp_layers=[3,1]); an empty item (`ep=2,`) is refused
    parts = split_items(plan);
  } catch (const std::invalid_argument& e) {
    throw UsageError("--plan: " + std::string(e.what()) + " (e.g. --plan tp=2,cp=4)");
  }
  for (const std::string& item : parts) {
    const auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError(flag + ": expected key=value items, e.g. tp=2,cp=4 or tp=4,sp=true");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (!plans::plan_of_key(key)) {
      std::string known;
      for (auto k : plans::plan_keys()) known += (known.empty() ? "" : ", ") + std::string(k);
      throw UsageError(flag + ": unknown plan key '" + escape_control(key) + "' (known: " + known +
                       "; `shardsim help plans`)");
    }
    if (value.empty()) throw UsageError(flag + ": " + key + " has an empty value");
    for (const auto& [k, v] : items)
      if (k == key) throw UsageError(flag + ": " + key + " given twice");
    items.emplace_back(key, value);
  }
  if (items.empty()) throw UsageError("--plan: empty plan (e.g. --plan tp=2,cp=4)");
  if (!root["parallel"] || !root["parallel"].IsMap()) root["parallel"] = YAML::Node(YAML::NodeType::Map);
  YAML::Node par = root["parallel"];
  for (const auto& k : plans::mesh_plan_keys()) par.remove(k);
  for (const auto& [k, v] : items) par[k] = yaml_value(v, flag);
}

// Keys a flag replaces are still checked, one rule with serve.trace under --requests (apps/serve.cpp): a bad key
// of the config is exit 2 naming its FILE:LINE, never silently dropped by the flag that replaces it. The config's
// device: under --device (as a device section), and its plan-shape keys (PlanKey::mesh) under --plan, each by its
// kind: a size 1..2^20, a flag, a list of sizes, a printable name (consistency with the model is the new plan's).
void check_replaced_keys(const ConfigNode& root, const ConfigOverrides& o) {
  if (!o.device.empty() && root.has("device")) (void)load_workload_device(root);
  if (o.plan.empty() || !root.has("parallel") || !root.child("parallel").is_map()) return;
  const ConfigNode par = root.child("parallel");
  for (const std::string& k : plans::mesh_plan_keys()) {
    const plans::PlanKey* key = nullptr;
    if (!par.has(k) || !plans::plan_of_key(k, &key) || !key) continue;
    switch (key->value) {
      case plans::PlanValue::size: (void)par.get_int_in(k, 1, 1 << 20); break;
      case plans::PlanValue::flag: (void)par.get_bool(k, false); break;
      case plans::PlanValue::list: (void)par.get_int_list_in(k, 1, 1 << 20); break;
      default: (void)par.get_string(k); break;
    }
  }
}

// The link figures of a generated topology: the flags, else the config's scalar ones, else 100 GB/s and 1 us.
void apply_topology_flags(YAML::Node root, const ConfigOverrides& o) {
  const int shapes = (o.ring > 0) + !o.torus.empty() + !o.mesh.empty() + o.switched + o.fully_connected +
                     !o.topology_file.empty();
  if (shapes > 1)
    throw UsageError("--topology, --ring, --torus, --mesh, --switch and --fully-connected exclude each other");
  YAML::Node old = root["topology"];
  auto scalar = [&](const char* key, double fallback) {
    if (old && old.IsMap() && old[key] && old[key].IsScalar()) {
      if (const auto v = decimal_double(old[key].Scalar())) return *v;  // decimal only (common/number.h)
    }
    return fallback;
  };
  if (!o.topology_file.empty()) {
    root["topology"] = fs::absolute(o.topology_file).string();
  } else if (shapes == 1) {
    YAML::Node t(YAML::NodeType::Map);
    if (o.ring > 0) {
      t["kind"] = "ring";
      t["chips"] = o.ring;
    } else if (!o.torus.empty() || !o.mesh.empty()) {
      t["kind"] = o.torus.empty() ? "mesh" : "torus";
      YAML::Node dims(YAML::NodeType::Sequence);
      for (int d : parse_dims(o.torus.empty() ? o.mesh : o.torus, o.torus.empty() ? "--mesh" : "--torus"))
        dims.push_back(d);
      dims.SetStyle(YAML::EmitterStyle::Flow);
      t["dims"] = dims;
    } else {
      throw UsageError("--switch / --fully-connected need a chip count: give it with --set topology.chips=N "
                       "after --ring N, or use --topology FILE");
    }
    t["bandwidth_gbps"] = o.bandwidth_gbps > 0 ? o.bandwidth_gbps : scalar("bandwidth_gbps", 100);
    t["latency_ns"] = o.latency_ns >= 0 ? o.latency_ns : scalar("latency_ns", 1000);
    root["topology"] = t;
    return;
  }
  if (o.bandwidth_gbps > 0 || o.latency_ns >= 0) {
    YAML::Node t = root["topology"];
    if (!t || !t.IsMap() || !(t["kind"] && t["kind"].IsScalar()) ||
        (t["kind"].as<std::string>() == "stacked" || t["kind"].as<std::string>() == "graph"))
      throw UsageError("--bandwidth/--latency: only for a ring, torus, mesh, switch or fully-connected topology "
                       "given inline or by --ring/--torus/--mesh");
    if (o.bandwidth_gbps > 0) t["bandwidth_gbps"] = o.bandwidth_gbps;
    if (o.latency_ns >= 0) t["latency_ns"] = o.latency_ns;
  }
}

std::string dir_of(const std::string& file) {
  const fs::path p = fs::path(file).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

}  // namespace

std::string ConfigOverrides::describe() const {
  std::ostringstream os;
  if (!topology_file.empty()) os << " --topology " << topology_file;
  if (ring > 0) os << " --ring " << ring;
  if (!torus.empty()) os << " --torus " << torus;
  if (!mesh.empty()) os << " --mesh " << mesh;
  if (switched) os << " --switch";
  if (fully_connected) os << " --fully-connected";
  if (bandwidth_gbps > 0) os << " --bandwidth " << bandwidth_gbps;
  if (latency_ns >= 0) os << " --latency " << latency_ns;
  if (!device.empty()) os << " --device " << device;
  if (!plan.empty()) os << " --plan " << plan;
  for (const auto& s : set) os << " --set " << s;
  return os.str();
}

namespace {
// Which flag made each overridden part of the tree (ConfigNode::from_edited_tree), in the order applied, so an
// error in a value a flag gave names that flag ("FILE (with command-line overrides), --set model.seq=0: ...").
std::vector<std::pair<std::string, std::string>> override_origins(const ConfigOverrides& o, bool spelled_model) {
  std::vector<std::pair<std::string, std::string>> out;
  ConfigOverrides topo = o;
  topo.device.clear();
  topo.plan.clear();
  topo.set.clear();
  if (topo.any()) out.emplace_back("topology", escape_control(topo.describe().substr(1)));
  if (!o.device.empty()) out.emplace_back("device", "--device " + escape_control(o.device));
  if (!o.plan.empty()) out.emplace_back("parallel", "--plan " + escape_control(o.plan));
  for (const auto& s : o.set) {
    std::string path = s.substr(0, s.find('='));
    const std::string first = path.substr(0, path.find('.'));
    if (first == "model" || first == "workload")
      path = std::string(spelled_model ? "model" : "workload") + path.substr(first.size());
    out.emplace_back(path, "--set " + escape_control(s));
  }
  return out;
}

ConfigNode normalise(const ConfigNode& loaded, const ConfigOverrides& o) {
  ConfigNode root = loaded;
  if (!root.is_map()) root.fail(root.file() + ": expected a map with topology:, model: (or workload:) and parallel:");
  YAML::Node y = root.yaml();
  const bool spelled_model = root.has("model");
  if (spelled_model) {
    if (root.has("workload"))
      root.child("model").fail("model: and workload: are the same section (workload: is its older name); keep one");
    y["workload"] = y["model"];
    y.remove("model");
    root.show_key_as("workload", "model");  // errors name the section as the file spells it
  }
  // A relative topology path is relative to the config's folder when the file is there.
  if (y["topology"] && y["topology"].IsScalar()) {
    const std::string p = y["topology"].as<std::string>();
    const fs::path near = fs::path(dir_of(root.file())) / p;
    if (fs::path(p).is_relative() && fs::exists(near)) y["topology"] = near.string();
  }
  // So is model.moe.routing_file's.
  const YAML::Node cy = y, cw = cy["workload"];  // const look-ups: a missing key stays missing
  const YAML::Node cm = cw && cw.IsMap() ? cw["moe"] : YAML::Node();
  if (cm && cm.IsMap() && cm["routing_file"] && cm["routing_file"].IsScalar()) {
    YAML::Node f = y["workload"]["moe"]["routing_file"];
    const std::string p = f.as<std::string>();
    const fs::path near = fs::path(dir_of(root.file())) / p;
    if (!p.empty() && fs::path(p).is_relative() && fs::exists(near)) f = near.string();
  }
  if (!o.any()) return root;
  check_replaced_keys(root, o);
  apply_topology_flags(y, o);
  if (!o.device.empty()) y["device"] = device_flag_node(o.device);
  if (!o.plan.empty()) apply_plan(y, o.plan);
  for (const auto& s : o.set) apply_set(y, s);
  YAML::Emitter out;
  out << y;
  // The edited tree itself (not the emitted text parsed again): a node the file gave keeps its FILE:LINE, a node an
  // override made is named by the file and its key path; the text (reports, checkpoints) is the effective config.
  ConfigNode with = ConfigNode::from_edited_tree(y, std::string(out.c_str()) + "\n# run with overrides:" +
                                                        o.describe() + "\n",
                                                 root.file() + " (with command-line overrides)",
                                                 override_origins(o, spelled_model));
  if (spelled_model) with.show_key_as("workload", "model");  // --set model.seq=... errors say model.seq
  return with;
}
}  // namespace

YAML::Node device_flag_node(const std::string& arg) {
  std::error_code ec;
  if (fs::is_regular_file(arg, ec)) {
    const ConfigNode file = ConfigNode::load_file(arg);
    if (!file.has("device")) throw UsageError("--device: " + escape_control(arg) + " has no device: section");
    (void)sim::load_device(file.child("device"));  // its errors name that file and line
    return ConfigNode::unmarked(file.child("device").yaml());  // its lines are that file's, not the config's
  }
  try {
    (void)sim::device_preset(arg);
  } catch (const std::invalid_argument& e) {
    // a path that is there but not a file (--device /dev/null, a folder): say so, not "no such file"
    const std::string why = fs::exists(arg, ec) ? unreadable_input(arg) : std::string();
    throw UsageError(std::string("--device: ") + e.what() +
                     (why.empty() ? ", and no such file" : ", and " + escape_control(arg) + " " + why));
  }
  return YAML::Node(arg);
}

ConfigNode load_workload_config(const std::string& file, const ConfigOverrides& o) {
  return normalise(ConfigNode::load_file(file), o);
}

ConfigNode workload_config_from_text(const std::string& text, const std::string& file, const ConfigOverrides& o) {
  return normalise(ConfigNode::load_string(text, file), o);
}

topology::Topology load_workload_topology(const ConfigNode& root) {
  if (!root.has("topology")) root.fail("topology: missing (a map, or a path to a topology file)");
  const ConfigNode t = root.child("topology");
  if (!t.yaml().IsScalar()) return topology::load_topology(t);
  const std::string path = t.yaml().as<std::string>();
  ConfigNode file = [&] {
    try {
      return ConfigNode::load_file(path);
    } catch (const ConfigError& e) {
      t.fail(std::string("topology: ") + e.what());
    }
  }();
  return topology::load_topology_document(file);
}

bool load_workload_shape_only(const ConfigNode& root) {
  if (!root.has("mode")) return false;
  const std::string m = root.get_string("mode");
  if (m != "real" && m != "shape_only") root.child("mode").fail("mode: '" + m + "' (real | shape_only)");
  return m == "shape_only";
}

bool load_workload_fold(const ConfigNode& root) {
  if (!root.has("fold")) return true;
  const std::string v = root.get_string("fold");
  if (v != "auto" && v != "on" && v != "off") root.child("fold").fail("fold: '" + v + "' (auto | on | off)");
  return v != "off";
}

sim::DeviceSpec load_workload_device(const ConfigNode& root) {
  if (!root.has("device")) return sim::device_preset(kDefaultDevice);
  const ConfigNode d = root.child("device");
  if (d.yaml().IsScalar()) {
    const std::string name = d.yaml().as<std::string>();
    try {
      return sim::device_preset(name);
    } catch (const std::invalid_argument& e) {
      d.fail(std::string("device: ") + e.what());
    }
  }
  return sim::load_device(d);
}

DeviceMesh checked_mesh(const ConfigNode& root, const ParallelPlan& plan, const topology::Topology& topo) {
  try {
    return build_mesh(plan, topo);
  } catch (const std::invalid_argument& e) {
    const std::string why = e.what();
    const bool has = root.has("parallel") && root.child("parallel").is_map();
    if (has && why.rfind("parallel.mesh_dims: ", 0) == 0 && root.child("parallel").has("mesh_dims"))
      root.child("parallel").child("mesh_dims").fail(why);
    (has ? root.child("parallel") : root).fail("parallel: " + why);
  }
}

}  // namespace shardsim::sharding
