#include "apps/cli_common.h"

#include "runtime/chips.h"
#include "runtime/host_memory.h"

#include "common/byte_size.h"
#include "common/number.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "common/config.h"
#include "common/error.h"
#include "common/output_file.h"
#include "runtime/job_text.h"
#include "common/text.h"
#include "runtime/chips.h"
#include "topology/topology_yaml.h"

namespace shardsim::apps {

void NetFlags::add_to(CLI::App* app) {
  app->add_option("--topology", topology_file,
                  "YAML file with a topology: section (and optionally device:), e.g. a workload config");
  app->add_option("--torus", torus, "torus dimensions instead of a ring, e.g. 2x4 or 2x2x2 (product = ranks)");
  app->add_option("--bandwidth", bandwidth_gbps,
                  "link bandwidth, GB/s per direction (GB = 1e9 B; 0.001..1e6; default 100)")
      ->each([this](const std::string&) { bandwidth_given = true; });
  app->add_option("--latency", latency_ns, "link latency, ns per hop (0..1e9; default 1000)")
      ->each([this](const std::string&) { latency_given = true; });
  app->add_option("--mesh", mesh, "mesh (no wrap-around) dimensions instead of a ring, e.g. 2x4");
  app->add_flag("--switch", switched, "every chip on one switch (chip -> switch -> chip, two links) instead of a ring");
  app->add_flag("--fully-connected", fully_connected, "a direct link between every pair of chips instead of a ring");
  app->add_flag("--unidirectional", unidirectional, "one-way ring (default: links both ways)");
  app->add_option("--group", group,
                  "run in sub-groups: world | dim:D (lines along torus dimension D) | mod:K (ranks r with equal "
                  "r%K, data-parallel style) | div:K (blocks of K consecutive ranks, tensor-parallel style)");
}

void write_file(const std::string& path, const std::string& text) { write_file_atomic(path, text); }

std::vector<std::string> split_list(const std::string& s) {
  try {
    return split_items(s);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

size_t parse_bytes(const std::string& text, const std::string& flag) {
  try {
    return parse_byte_size(text);
  } catch (const std::invalid_argument& e) {
    throw UsageError(flag + ": " + e.what());
  }
}

double available_host_bytes() { return runtime::mem_available_bytes(); }

namespace {
std::string gib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GiB", bytes / 1073741824.0);
  return b;
}
}  // namespace

void check_memory(const Net& net, double bytes_per_rank, double device_bytes, const std::string& what) {
  const double hbm = net.device.hbm_gib * 1073741824.0;
  if (device_bytes > hbm)
    throw UsageError(what + ": simulated out of memory on chip " + std::to_string(net.timeline ? net.timeline->chip() : 0) +
                     ": needs " + gib(device_bytes) + ", has " + gib(hbm) + " (device " + net.device.name + ")");
  const double avail = available_host_bytes();
  if (avail > 0 && bytes_per_rank * net.ranks_on_host > 0.9 * avail)
    // ranks_on_host counts chips (a rank hosting K chips holds K chips' buffers): say chips, as the job has them.
    throw RuntimeFault(what + ": needs about " + gib(bytes_per_rank) + " of host memory per chip x " +
                       std::to_string(net.ranks_on_host) + " chips on this host, but only " + gib(avail) +
                       " is available; use a smaller size or fewer chips per host");
}

void check_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) { check_outputs_distinct(outputs); }

void connect(Net& net, const runtime::World& world) {
  if (world.vcomm()) {
    // Chip mode: the chips of this host's ranks (runtime/chips.h); no MPI collective from a chip's fiber.
    net.ranks_on_host = runtime::node_ranks() * runtime::chips_per_rank();
  } else {
    MPI_Comm local = MPI_COMM_NULL;
    runtime::check_mpi(MPI_Comm_split_type(world.comm(), MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL, &local),
                       world.rank(), "host rank count");
    MPI_Comm_size(local, &net.ranks_on_host);
    MPI_Comm_free(&local);
  }
  // Rank r runs on chip placement[r] (identity unless the topology file sets one).
  const auto& ids = net.topo().placement();
  net.timeline = std::make_unique<sim::Timeline>(ids.at(static_cast<size_t>(world.rank())), net.topo(), net.device,
                                                 net.record_events);
  net.world = std::make_unique<runtime::Transport>(world, *net.timeline, ids);
  net.group = net.split_color >= 0 ? &net.world->subgroup("cli.group", net.split_color, net.split_key)
                                   : net.world.get();
}

std::string Net::describe() const { return topo().describe() + "; device " + device.name + "; group " + group_text; }

namespace {
bool same_topology(const topology::Topology& a, const topology::Topology& b) {
  if (a.num_chips() != b.num_chips() || a.describe() != b.describe() || a.placement() != b.placement() ||
      a.links().size() != b.links().size())
    return false;
  for (size_t i = 0; i < a.links().size(); ++i) {
    const auto &x = a.links()[i], &y = b.links()[i];
    if (x.src != y.src || x.dst != y.dst || x.bandwidth_gbps != y.bandwidth_gbps || x.latency_ns != y.latency_ns ||
        x.dim != y.dim || x.dir != y.dir)
      return false;
  }
  return true;
}
}  // namespace

std::shared_ptr<const topology::Topology> per_rank_topology(topology::Topology topo) {
  if (!runtime::chip_mode()) return std::make_shared<const topology::Topology>(std::move(topo));
  // The chips of a rank are fibers of one thread: no locking. Holds weak references, so a finished run's
  // topologies go when their last Net does.
  static std::vector<std::weak_ptr<const topology::Topology>> known;
  std::erase_if(known, [](const auto& w) { return w.expired(); });
  for (const auto& w : known)
    if (auto t = w.lock(); t && same_topology(*t, topo)) return t;
  auto t = std::make_shared<const topology::Topology>(std::move(topo));
  known.push_back(t);
  return t;
}

std::unique_ptr<Net> build_net(const NetFlags& f, const runtime::World& world) {
  auto net = std::make_unique<Net>();
  const int n = world.size();
  topology::Topology topo;  // built here, then shared with the rank's other chips (per_rank_topology)
  std::shared_ptr<const topology::Topology> shared;  // chip mode: the copy another chip of this rank built
  if (!f.topology_file.empty()) {
    if (!f.torus.empty() || !f.mesh.empty() || f.switched || f.fully_connected || f.unidirectional ||
        f.bandwidth_given || f.latency_given)
      throw UsageError("--topology " + f.topology_file +
                       " already defines the network; drop --torus/--mesh/--switch/--fully-connected/--bandwidth/"
                       "--latency/--unidirectional (or edit the file)");
    if (std::filesystem::is_directory(f.topology_file))
      throw UsageError("--topology " + f.topology_file + ": is a directory, need a YAML file");
    const ConfigNode root = ConfigNode::load_file(f.topology_file);
    topo = topology::load_topology_document(root);  // ASTRA-sim network.yml, topology: section or bare map
    net->device = root.has("device") ? sim::load_device(root.child("device")) : sim::device_preset("generic");
  } else {
    auto text = [](double v) {
      std::ostringstream os;
      os << v;
      return os.str();
    };
    if (!(f.bandwidth_gbps >= topology::kMinBandwidthGbps && f.bandwidth_gbps <= topology::kMaxBandwidthGbps))
      throw UsageError("--bandwidth: must be " + topology::bandwidth_range_text() + " (got " + text(f.bandwidth_gbps) +
                       ")");
    if (!(f.latency_ns >= 0 && f.latency_ns <= topology::kMaxLatencyNs))
      throw UsageError("--latency: must be " + topology::latency_range_text() + " (got " + text(f.latency_ns) + ")");
    const topology::LinkSpec link{f.bandwidth_gbps, f.latency_ns};
    const int shapes = !f.torus.empty() + !f.mesh.empty() + f.switched + f.fully_connected;
    if (shapes > 1) throw UsageError("give at most one of --torus, --mesh, --switch, --fully-connected");
    if (f.unidirectional && shapes) throw UsageError("--unidirectional applies to rings only");
    auto parse_dims = [](const std::string& flag, const std::string& text) {
      std::vector<int> dims;
      std::stringstream ss(text);
      std::string item;
      const std::string bad = flag + ": '" + text + "' is not a list of positive dimensions like 2x4";
      if (text.back() == 'x' || text.front() == 'x') throw UsageError(bad);
      while (std::getline(ss, item, 'x')) {
        const auto d = decimal_int(item);
        if (!d || *d < 1 || *d > (1 << 24)) throw UsageError(bad);
        dims.push_back(static_cast<int>(*d));
      }
      return dims;
    };
    // Chip mode: the rank's chips ask for the same network; the first builds it, the others take its copy (building
    // it per chip is O(chips) each, O(chips^2) per rank). Keyed by everything the build reads; weak, so it goes
    // with the last Net that holds it.
    static std::map<std::string, std::weak_ptr<const topology::Topology>> built;
    std::ostringstream key;
    key.precision(17);
    key << n << '|' << f.torus << '|' << f.mesh << '|' << f.switched << f.fully_connected << f.unidirectional << '|'
        << f.bandwidth_gbps << '|' << f.latency_ns;
    if (runtime::chip_mode())
      if (auto it = built.find(key.str()); it != built.end()) shared = it->second.lock();
    if (shared) {
      // another chip of this rank built it
    } else if (!f.torus.empty()) topo = topology::Topology::torus(parse_dims("--torus", f.torus), {link});
    else if (!f.mesh.empty()) topo = topology::Topology::mesh(parse_dims("--mesh", f.mesh), {link});
    else if (f.switched) topo = topology::Topology::switched(n, link);
    else if (f.fully_connected) topo = topology::Topology::fully_connected(n, link);
    else topo = topology::Topology::ring(n, link, !f.unidirectional);
    if (runtime::chip_mode() && !shared) {
      shared = per_rank_topology(std::move(topo));
      std::erase_if(built, [](const auto& kv) { return kv.second.expired(); });
      built[key.str()] = shared;
    }
    net->device = sim::device_preset("generic");
  }
  const topology::Topology& tp = shared ? *shared : topo;
  if (tp.num_chips() != n)
    throw UsageError("the topology has " + std::to_string(tp.num_chips()) + " chips but the job has " +
                     runtime::job_size_text(n) + "; run it with " + runtime::resize_hint(tp.num_chips(), n));
  // Validate the group flag before any communication.
  int color_mod = 0, color_div = 0, dim = -1;
  auto number_after = [&](const std::string& prefix) {
    const auto v = decimal_int(f.group.substr(prefix.size()));
    if (!v || *v < 0 || *v > (1 << 24)) throw UsageError("--group: '" + f.group + "' (expected world, dim:D, mod:K or div:K)");
    return static_cast<int>(*v);
  };
  if (f.group.rfind("dim:", 0) == 0) {
    dim = number_after("dim:");
    if (!tp.is_grid())
      throw UsageError("--group " + f.group + ": the topology is a " + tp.kind_name() +
                       " (an explicit edge list) and has no dimensions; use world, mod:K or div:K");
    const int nd = static_cast<int>(tp.dims().size());
    if (dim < 0 || dim >= nd)
      throw UsageError("--group " + f.group + ": the " + tp.kind_name() + " topology has " +
                       std::to_string(nd) + (nd == 1 ? " dimension (dim:0)" : " dimensions (dim:0..dim:" +
                       std::to_string(nd - 1) + ")"));
  } else if (f.group.rfind("mod:", 0) == 0) {
    color_mod = number_after("mod:");
    if (color_mod < 1 || n % color_mod != 0)
      throw UsageError("--group " + f.group + ": K must divide the " + std::to_string(n) + " ranks");
  } else if (f.group.rfind("div:", 0) == 0) {
    color_div = number_after("div:");
    if (color_div < 1 || n % color_div != 0)
      throw UsageError("--group " + f.group + ": K must divide the " + std::to_string(n) + " ranks");
  } else if (f.group != "world") {
    throw UsageError("--group: '" + f.group + "' (expected world, dim:D, mod:K or div:K)");
  }
  const int r = world.rank();
  net->group_text = "world (" + std::to_string(n) + " chips)";
  if (dim >= 0) {
    auto xyz = tp.coords(tp.placement().at(static_cast<size_t>(r)));
    net->split_key = xyz[static_cast<size_t>(dim)];
    xyz[static_cast<size_t>(dim)] = 0;
    net->split_color = tp.chip_at(xyz);
    net->group_text = "lines along dimension " + std::to_string(dim) + ": " +
                      std::to_string(n / tp.dims()[static_cast<size_t>(dim)]) + " groups of " +
                      std::to_string(tp.dims()[static_cast<size_t>(dim)]);
  } else if (color_mod) {
    net->split_color = r % color_mod;
    net->split_key = r;
    net->group_text = "ranks with equal rank % " + std::to_string(color_mod) + ": " + std::to_string(color_mod) +
                      " groups of " + std::to_string(n / color_mod);
  } else if (color_div) {
    net->split_color = r / color_div;
    net->split_key = r;
    net->group_text = "blocks of " + std::to_string(color_div) + " consecutive ranks: " +
                      std::to_string(n / color_div) + " groups";
  }
  net->topo_ = shared ? shared : per_rank_topology(std::move(topo));
  return net;
}

namespace {
// A finite number in [LO, HI] described as RANGE, else CLI11's error naming the flag (exit 2): what bench and
// calibrate say for --bandwidth nan, so that run, train and profile do not take NaN for "not given".
CLI::Validator finite_in(double lo, double hi, const std::string& range) {
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        const auto v = decimal_double(text);
        if (!v || !(*v >= lo && *v <= hi)) return "must be " + range + " (got '" + escape_control(text) + "')";
        return "";
      },
      range);
}

// CLI11's PositiveNumber said "Value 0 not in range 0.000000 to 1797693134862315708...": 309 digits, and let NaN
// through NonNegativeNumber. One short line instead, NaN and Inf refused (the flag is named by CLI11's prefix).
CLI::Validator number_at_least(double lo, bool strict, bool whole) {
  const std::string want = std::string(whole ? "a whole number" : "a finite number") + (strict ? " > " : " >= ") +
                           (lo == 0 ? "0" : std::to_string(static_cast<long long>(lo)));
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        const auto d = decimal_double(s);
        const double v = d.value_or(0);
        const bool ok = d && (strict ? v > lo : v >= lo) && (!whole || v == std::floor(v));
        return ok ? std::string() : "must be " + want + " (got '" + escape_control(s) + "')";
      },
      whole ? "INT" : "NUMBER");
}
}  // namespace

CLI::Validator decimal_integer() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const bool ok = (text.empty() || text[0] != '-') && decimal_int(text);
        return ok ? std::string() : "'" + escape_control(text) + "' is not a decimal integer within int64";
      },
      "INT");
}

void add_trace_flags(CLI::App* app, reporting::TraceOptions& t, bool step) {
  CLI::Option* trace = app->get_option("--trace");
  app->add_option("--trace-chips", t.chips, "--trace: only these chips, e.g. 0-7,64 (docs/PROFILE.md)")->needs(trace);
  app->add_option("--trace-axis", t.axis,
                  "--trace: only the chips of one group of a mesh axis, AXIS or AXIS:CHIP (the group holding CHIP, "
                  "default 0), e.g. pp = one pipeline's stages")
      ->needs(trace);
  if (step)
    app->add_option("--trace-step", t.step, "--trace: the step to trace (default: the last)")
        ->check(decimal_integer())
        ->check(number_at_least(1, false, true))
        ->needs(trace);
  add_trace_window_flags(app, t);
}

void add_trace_window_flags(CLI::App* app, reporting::TraceOptions& t) {
  CLI::Option* trace = app->get_option("--trace");
  app->add_option("--trace-window", t.window,
                  "--trace: only events overlapping FROM:TO, microseconds of simulated time (either may be left out)")
      ->needs(trace);
  app->add_option("--trace-max-mib", t.max_mib,
                  "--trace: do not write a trace estimated above this many MiB (default 1024; 0: no limit)")
      ->check(finite_in(0, 1e9, "0 .. 1e9 MiB"))
      ->needs(trace);
}

void add_config_override_flags(CLI::App* app, sharding::ConfigOverrides& ov) {
  app->add_option("--topology", ov.topology_file,
                  "topology from this file instead of the config's (a file with a topology: section, e.g. "
                  "configs/topologies/*.yaml, or an ASTRA-sim network.yml)");
  app->add_option("--ring", ov.ring, "a bidirectional ring of N chips instead of the config's topology")
      ->check(decimal_integer())
      ->check(number_at_least(1, false, true));
  app->add_option("--torus", ov.torus, "a torus of these dimensions instead, e.g. 2x4");
  app->add_option("--mesh", ov.mesh, "a mesh (no wrap-around) of these dimensions instead, e.g. 2x4");
  app->add_option("--bandwidth", ov.bandwidth_gbps,
                  "link bandwidth, GB/s per direction (GB = 1e9 B; default: the config's, else 100)")
      ->check(finite_in(topology::kMinBandwidthGbps, topology::kMaxBandwidthGbps, topology::bandwidth_range_text()));
  app->add_option("--latency", ov.latency_ns, "link latency, ns per hop (default: the config's, else 1000)")
      ->check(finite_in(0, topology::kMaxLatencyNs, topology::latency_range_text()));
  app->add_option("--device", ov.device,
                  "device preset instead of the config's (`shardsim help devices` lists them), or a YAML file "
                  "with a device: section (e.g. from calibrate --kernels --out)");
  app->add_option("--plan", ov.plan,
                  "parallel plan instead of the config's axis keys, e.g. tp=2,cp=4 or tp=4,sp=true or ulysses=8");
  app->add_option("--set", ov.set, "set a config key, e.g. --set model.seq=2048 --set parallel.mesh_dims=[1,0] "
                  "(repeatable; a YAML value)")
      ->allow_extra_args(false);
}

}  // namespace shardsim::apps
