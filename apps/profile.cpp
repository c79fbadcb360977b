// `--what-if` (run, train, profile) and the `profile` command: each change becomes --set overrides on the loaded
// config (sharding/engine_config.h's one override mechanism), is re-simulated in this process in shape-only mode
// (the same simulated figures as real data: tests/e2e/shape_only_models.sh), and its speedup against the baseline
// is reported (docs/PROFILE.md).
#include "apps/profile.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>

#include "common/error.h"
#include "common/number.h"
#include "common/output_file.h"
#include "common/text.h"
#include "sharding/engine_config.h"
#include "topology/topology.h"
#include "topology/topology_yaml.h"

namespace shardsim::apps {

namespace {

std::string num(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

// "2x" -> 2 (FACTOR true); "1640" -> 1640 (FACTOR false); else UsageError.
double parse_value(const std::string& change, const std::string& v, bool& factor) {
  factor = !v.empty() && (v.back() == 'x' || v.back() == 'X');
  const std::string n = factor ? v.substr(0, v.size() - 1) : v;
  // Decimal only (common/number.h): strtod alone would also take hex ('0x10x' read as 16x), leading blanks and 'inf'.
  const double d = decimal_double(n).value_or(NAN);
  if (!(d > 0))
    throw UsageError("--what-if " + change + ": '" + v + "' is not a positive factor (2x, 0.5x) or value");
  return d;
}

// What a --what-if factor multiplies: DEV's current value of the numeric device key KEY (a peak as set, 0 when
// unset); NaN for a key without a number (launch_mode, kernel_fusion, preset, ...).
double device_value(const sim::DeviceSpec& dev, const std::string& key) {
  for (auto prec : sim::kAllPrecisions)
    if (key == "peak_tflops_" + sim::precision_name(prec)) return dev.explicit_peak_tflops(prec);
  const sim::KernelParams& k = dev.kernel;
  const std::map<std::string, double> v = {
      {"hbm_gbps", dev.hbm_gbps}, {"hbm_gib", dev.hbm_gib}, {"hbm_reserve_gib", dev.hbm_reserve_gib},
      {"launch_overhead_ns", dev.launch_overhead_ns}, {"host_launch_ns", dev.host_launch_ns},
      {"graph_launch_overhead_ns", dev.graph_launch_overhead_ns >= 0 ? dev.graph_launch_overhead_ns : dev.launch_overhead_ns},
      {"compute_units", k.compute_units}, {"gemm_tile_m", k.gemm_tile_m}, {"gemm_tile_n", k.gemm_tile_n},
      {"gemm_tile_k", k.gemm_tile_k}, {"attention_tile_q", k.attention_tile_q},
      {"matmul_min_columns", k.matmul_min_columns}, {"gemm_efficiency", k.gemm_efficiency},
      {"attention_forward_efficiency", k.attention_forward_efficiency},
      {"attention_backward_efficiency", k.attention_backward_efficiency}, {"hbm_efficiency", k.hbm_efficiency},
      {"scalar_engine_gelems", k.scalar_engine_gelems}, {"vector_engine_gelems", k.vector_engine_gelems}};
  const auto it = v.find(key);
  return it == v.end() ? NAN : it->second;
}

double apply(double old, double v, bool factor) { return factor ? old * v : v; }

// The changes of SPEC (common/text.h split_items: commas inside a --set value's [] stay; empty or repeated refused).
std::vector<std::string> what_if_items(const std::string& spec) {
  try {
    return split_items(spec);
  } catch (const std::invalid_argument& e) {
    throw UsageError("--what-if: " + std::string(e.what()) + " (expected KEY=VALUE,KEY=VALUE,...)");
  }
}

const std::map<std::string, std::string> kDeviceAlias = {{"hbm_bw", "hbm_gbps"}, {"launch", "launch_overhead_ns"},
                                                         {"hbm", "hbm_gib"}};
const std::map<std::string, std::string> kTopologyAlias = {{"link_bw", "bandwidth_gbps"}, {"latency", "latency_ns"},
                                                           {"bandwidth", "bandwidth_gbps"}};

// The topology's section as a YAML map: the inline one (*INLINE true), or the one of the file it names (a
// shardsim topology file: `topology:` section or bare map). UsageError for an ASTRA-sim network file.
YAML::Node topology_tree(const std::string& change, const ConfigNode& root, bool* inline_section) {
  const auto t = root.maybe_child("topology");
  if (!t)  // the default ring over the chips has no section a change could edit
    throw UsageError("--what-if " + change + ": the config has no topology: section (the run uses the default ring "
                     "over its chips); give one with --ring N or --topology FILE, or a topology: section, to change "
                     "its links");
  *inline_section = t->is_map();
  if (t->is_map()) return YAML::Clone(t->yaml());
  const std::string path = t->yaml().as<std::string>();
  const ConfigNode file = ConfigNode::load_file(path);
  if (topology::is_astra_network(file))
    throw UsageError("--what-if " + change + ": the topology is an ASTRA-sim network file (" + escape_control(path) +
                     "); give the changed figures in its bandwidth:/latency: lists, or use a shardsim topology file");
  const ConfigNode section = file.has("topology") ? file.child("topology") : file;
  if (!section.is_map()) section.fail("topology: expected a map");
  return YAML::Clone(section.yaml());
}

// N and everything below it in YAML's flow style (one line: a --set value).
void flow_style(YAML::Node n) {
  if (!n.IsMap() && !n.IsSequence()) return;
  n.SetStyle(YAML::EmitterStyle::Flow);
  if (n.IsSequence())
    for (auto x : n) flow_style(x);
  else
    for (auto kv : n) flow_style(kv.second);
}

// Scales (FACTOR) or sets the number at N[KEY] (a scalar, or a list with one value per dimension: entry DIM only
// when DIM >= 0); false when N has no KEY.
bool change_number(YAML::Node n, const std::string& key, int dim, double v, bool factor) {
  if (!n.IsMap() || !n[key]) return false;
  YAML::Node x = n[key];
  if (x.IsSequence()) {
    for (size_t d = 0; d < x.size(); ++d)
      if (dim < 0 || static_cast<int>(d) == dim) x[d] = num(apply(x[d].as<double>(), v, factor));
  } else if (dim < 0) {
    n[key] = num(apply(x.as<double>(), v, factor));
  } else {
    return false;  // one value for every dimension: the caller makes the list
  }
  return true;
}

// The topology key KEY (bandwidth_gbps | latency_ns) changed: on every dimension (DIM < 0) or on dimension DIM.
// Any topology form: grids (one value or one per dimension), stacked dimensions (dims[i]), graphs and Clos (the
// default and every link's own value; no dimensions), inline or in a topology file (then the whole changed section
// is set inline). The result must lie in the topology's bounds (topology.h).
std::vector<std::string> topology_set(const std::string& change, const ConfigNode& root, const std::string& key,
                                      int dim, double v, bool factor) {
  bool inline_section = false;
  YAML::Node t = topology_tree(change, root, &inline_section);
  const std::string kind = t["kind"] && t["kind"].IsScalar() ? t["kind"].as<std::string>() : "";
  const int ndims = static_cast<int>(sharding::load_workload_topology(root).dims().size());
  const bool graph = kind == "graph" || kind == "clos";
  if (dim >= 0 && (graph || dim >= ndims))
    throw UsageError("--what-if " + change + ": the topology has " +
                     (graph ? std::string("no dimensions (a ") + kind + ")" : std::to_string(ndims) + " dimension(s)"));
  std::vector<std::string> sets;
  try {
    if (kind == "stacked") {
      YAML::Node dims = t["dims"];
      for (size_t d = 0; dims.IsSequence() && d < dims.size(); ++d)
        if (dim < 0 || static_cast<int>(d) == dim) {
          if (!dims[d][key]) {
            if (key == "bandwidth_gbps") continue;  // required by the loader: it reports the missing key
            dims[d][key] = "0";
          }
          change_number(dims[d], key, -1, v, factor);
          sets.push_back("topology.dims[" + std::to_string(d) + "]." + key + "=" + dims[d][key].as<std::string>());
        }
    } else {
      if (!t[key]) t[key] = key == "latency_ns" ? "0" : "100";  // the loaders' defaults
      if (dim >= 0 && !t[key].IsSequence()) {  // one value for all: one per dimension, DIM's changed
        YAML::Node list(YAML::NodeType::Sequence);
        list.SetStyle(YAML::EmitterStyle::Flow);
        for (int d = 0; d < ndims; ++d) list.push_back(t[key].as<std::string>());
        t[key] = list;
      }
      change_number(t, key, dim, v, factor);
      if (graph && t["links"] && t["links"].IsSequence())
        for (size_t i = 0; i < t["links"].size(); ++i) change_number(t["links"][i], key, -1, v, factor);
      YAML::Emitter e;
      e << YAML::Flow << t[key];
      sets.push_back("topology." + key + "=" + e.c_str());
      if (graph) sets.clear();  // per-link values: the whole section below
    }
  } catch (const YAML::Exception&) {
    throw UsageError("--what-if " + change + ": the topology's " + key + " is not a number");
  }
  // Every changed figure within the topology's bounds (what the loader would refuse after the change, said here).
  const auto check = [&](const YAML::Node& x) {
    const double d = x.as<double>();
    const bool ok = key == "bandwidth_gbps" ? d >= topology::kMinBandwidthGbps && d <= topology::kMaxBandwidthGbps
                                            : d >= 0 && d <= topology::kMaxLatencyNs;
    if (!ok)
      throw UsageError("--what-if " + change + ": " + key + " would be " + num(d) + ", outside " +
                       (key == "bandwidth_gbps" ? topology::bandwidth_range_text() : topology::latency_range_text()));
  };
  const auto check_all = [&](const YAML::Node& n) {
    if (!n.IsMap() || !n[key]) return;
    if (n[key].IsSequence())
      for (const auto& x : n[key]) check(x);
    else
      check(n[key]);
  };
  check_all(t);
  for (const char* list : {"dims", "links"})
    if (t[list] && t[list].IsSequence())
      for (const auto& x : t[list]) check_all(x);
  if (inline_section && !sets.empty()) return sets;
  YAML::Emitter e;  // a topology file (or a graph's links): the whole changed section, inline, on one line
  flow_style(t);
  e << t;
  return {std::string("topology=") + e.c_str()};
}

// A dotted path of the YAML tree: KEY=Nx scales the number there, KEY=VALUE sets VALUE (any YAML).
std::string path_set(const std::string& change, const ConfigNode& root, const std::string& key,
                     const std::string& value) {
  bool factor = !value.empty() && (value.back() == 'x' || value.back() == 'X');
  if (!factor) return key + "=" + value;
  // The loaded tree holds model: as workload: (sharding/engine_config.h), as --set reads it: 'model.tokens=2x' said
  // the config had no model.tokens. A read-only walk: const lookups create nothing, reset() rebinds N.
  const std::string path = key.rfind("model.", 0) == 0 ? "workload." + key.substr(6) : key;
  YAML::Node n = YAML::Clone(root.yaml());
  size_t at = 0;
  while (at <= path.size()) {
    const size_t dot = path.find('.', at);
    const std::string k = path.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
    const YAML::Node& parent = n;
    const YAML::Node child = n.IsMap() ? parent[k] : YAML::Node();
    if (!child) throw UsageError("--what-if " + change + ": the config has no '" + key + "' to scale");
    n.reset(child);
    if (dot == std::string::npos) break;
    at = dot + 1;
  }
  double old = 0;
  try {
    old = n.as<double>();
  } catch (const YAML::Exception&) {
    throw UsageError("--what-if " + change + ": '" + key + "' is not a number");
  }
  const double v = parse_value(change, value, factor);
  return key + "=" + num(old * v);
}

}  // namespace

std::vector<WhatIfPlan> plan_what_if(const std::string& spec, const ConfigNode& root) {
  std::vector<WhatIfPlan> plans;
  const sim::DeviceSpec dev = sharding::load_workload_device(root);
  for (const auto& item : what_if_items(spec)) {
    WhatIfPlan p;
    p.change = item;
    std::map<std::string, double> device;  // device key -> new value
    for (const auto& part : [&] {  // "a=2x+b=2x": several changes simulated together
           std::vector<std::string> v;
           size_t at = 0;
           for (size_t plus; (plus = item.find('+', at)) != std::string::npos; at = plus + 1) v.push_back(item.substr(at, plus - at));
           v.push_back(item.substr(at));
           return v;
         }()) {
      const size_t eq = part.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == part.size())
        throw UsageError("--what-if " + part + ": expected KEY=VALUE (e.g. link_bw=2x, hbm_bw=1.5x, peak=2x, "
                         "latency=0.5x, dim1.bandwidth=2x, model.tokens=1024)");
      std::string key = part.substr(0, eq);
      const std::string value = part.substr(eq + 1);
      if (auto a = kDeviceAlias.find(key); a != kDeviceAlias.end()) key = a->second;
      const bool device_key = std::find(std::begin(sim::kDeviceKeys), std::end(sim::kDeviceKeys), key) !=
                              std::end(sim::kDeviceKeys) ||
                              key == "peak";
      bool factor = false;
      if (device_key && key != "preset" && key != "name") {
        const double v = parse_value(part, value, factor);
        if (key == "peak") {
          for (auto prec : sim::kAllPrecisions)
            if (const double old = dev.explicit_peak_tflops(prec); old > 0)
              device["peak_tflops_" + sim::precision_name(prec)] = apply(old, v, factor);
          continue;
        }
        const double cur = device_value(dev, key);
        if (factor && !(cur > 0))  // a factor of an unset figure changed nothing (host_launch_ns=1e300x passed)
          throw UsageError("--what-if " + part + ": device." + key + " is " +
                           (std::isnan(cur) ? std::string("not a number") : "0 (unset) on this device") +
                           ", so a factor changes nothing; give a value (" + key + "=...)");
        device[key] = apply(cur, v, factor);
        continue;
      }
      int dim = -1;
      std::string tkey = key;
      if (key.rfind("dim", 0) == 0 && key.find('.') != std::string::npos) {
        const size_t dot = key.find('.');
        char* end = nullptr;
        const long d = std::strtol(key.c_str() + 3, &end, 10);
        if (end != key.c_str() + dot || d < 0) throw UsageError("--what-if " + part + ": expected dimN.bandwidth or dimN.latency");
        dim = static_cast<int>(d);
        tkey = key.substr(dot + 1);
      }
      if (auto a = kTopologyAlias.find(tkey); a != kTopologyAlias.end()) tkey = a->second;
      if (tkey == "bandwidth_gbps" || tkey == "latency_ns") {
        const double v = parse_value(part, value, factor);
        for (auto& set : topology_set(part, root, tkey, dim, v, factor)) p.sets.push_back(std::move(set));
      } else if (key.find('.') != std::string::npos) {
        p.sets.push_back(path_set(part, root, key, value));
      } else {
        throw UsageError("--what-if " + part + ": unknown change '" + key + "' (link_bw, latency, dimN.bandwidth, "
                         "dimN.latency, peak, hbm_bw, launch, a device key, or a config path such as model.tokens)");
      }
    }
    for (const auto& [k, v] : device)  // the bounds load_device applies, said for the change
      if (const std::string why = sim::device_figure_obstacle(k, v); !why.empty())
        throw UsageError("--what-if " + item + ": device." + k + " would be " + num(v) + ": " + why);
    if (!device.empty()) {
      const auto d = root.maybe_child("device");
      if (d && d->is_map()) {
        for (const auto& [k, v] : device) p.sets.push_back("device." + k + "=" + num(v));
      } else {  // a preset name (or none): the same preset with the changed keys
        std::string s = "device={preset: " + (d ? d->yaml().as<std::string>() : std::string(sharding::kDefaultDevice));
        for (const auto& [k, v] : device) s += ", " + k + ": " + num(v);
        p.sets.push_back(s + "}");
      }
    }
    plans.push_back(std::move(p));
  }
  return plans;
}

std::vector<reporting::WhatIf> run_what_if(const std::vector<WhatIfPlan>& plans, double baseline_ns,
                                          const std::function<double(const sharding::ConfigOverrides&)>& simulate,
                                          const sharding::ConfigOverrides& base) {
  std::vector<reporting::WhatIf> rows;
  for (const auto& p : plans) {
    sharding::ConfigOverrides ov = base;
    ov.set.insert(ov.set.end(), p.sets.begin(), p.sets.end());
    reporting::WhatIf w;
    w.change = p.change;
    w.sets = p.sets;
    w.ns = simulate(ov);
    w.speedup = w.ns > 0 ? baseline_ns / w.ns : 0;
    rows.push_back(std::move(w));
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const reporting::WhatIf& a, const reporting::WhatIf& b) { return a.speedup > b.speedup; });
  return rows;
}

}  // namespace shardsim::apps
