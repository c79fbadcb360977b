// Pieces the collective commands (validate, bench) share: the network flags, building the topology and
// device on every rank, sub-groups, list flags.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/transport.h"
#include "reporting/trace_filter.h"
#include "sharding/engine_config.h"
#include "runtime/world.h"
#include "sim/device_spec.h"
#include "sim/timeline.h"
#include "common/error.h"
#include "topology/topology.h"

namespace shardsim::apps {

struct NetFlags {
  std::string topology_file;  // YAML with a `topology:` section (and optionally `device:`), e.g. a workload
  std::string torus;          // "2x4", "2x2x2": a torus of these dims instead of a ring
  std::string mesh;           // "2x4": a mesh (no wrap-around) of these dims
  bool switched = false;      // every chip on one switch
  bool fully_connected = false;
  double bandwidth_gbps = 100;
  double latency_ns = 1000;
  bool unidirectional = false;
  bool bandwidth_given = false, latency_given = false;
  std::string group = "world";  // world | dim:D | mod:K | div:K
  void add_to(CLI::App* app);
};

// The overrides of a workload config that `run` and `train` share, with the same names and meaning (the network
// flags have bench's names): --topology FILE, --ring N, --torus AxB, --mesh AxB, --bandwidth GBPS, --latency NS,
// --device PRESET, --plan tp=2,cp=4 and --set key.path=value, stored in OV and applied to the YAML tree by
// sharding::load_workload_config.
void add_config_override_flags(CLI::App* app, sharding::ConfigOverrides& ov);
// The trace's filters and size limit (reporting/trace_filter.h): --trace-chips, --trace-axis, --trace-window,
// --trace-max-mib, and with STEP (train) --trace-step; each needs --trace (added before). Chips, axes and windows
// are checked against the run's topology and mesh before it runs (reporting::resolve_trace_filter).
void add_trace_flags(CLI::App* app, reporting::TraceOptions& t, bool step);
// Only --trace-window and --trace-max-mib (a trace without chips: serve's).
void add_trace_window_flags(CLI::App* app, reporting::TraceOptions& t);

// The simulated machine of one rank plus its transports. Built identically on every rank.
struct Net {
  // The topology, shared by the chips of a rank (per_rank_topology): one copy per rank, not per chip (a 4,096-chip
  // ring's topology is ~0.5 MiB, issue 17's host-memory target is 1 MiB per chip).
  std::shared_ptr<const topology::Topology> topo_;
  const topology::Topology& topo() const { return *topo_; }
  sim::DeviceSpec device;
  std::unique_ptr<sim::Timeline> timeline;
  std::unique_ptr<runtime::Transport> world;  // all chips, rank r on chip r
  runtime::Transport* group = nullptr;        // the group this rank's collectives run in (world or a split)
  std::string group_text;                     // "world (8 chips)", "lines along dimension 1: ...", ...
  int split_color = -1, split_key = 0;        // the sub-group this rank joins (color -1: the world)
  int ranks_on_host = 1;                      // ranks sharing this host's memory (set by connect)
  bool record_events = true;                  // the timeline keeps its events (off: times only, e.g. shape-only)
  std::string describe() const;
};

// TOPO as a shared, immutable topology: with several chips per rank, the copy an earlier chip of this rank made of
// an identical topology (same chips, links, placement), else a new one. One chip per rank: a new one.
std::shared_ptr<const topology::Topology> per_rank_topology(topology::Topology topo);

// Reads the flags and files; no communication. Throws ConfigError/UsageError (call inside World::agree).
std::unique_ptr<Net> build_net(const NetFlags& flags, const runtime::World& world);
// Creates the timeline and transports (collective over the world: call on every rank after build_net agreed).
void connect(Net& net, const runtime::World& world);

// Before allocating BYTES_PER_RANK on every rank: UsageError when the simulated chip's HBM cannot hold them
// ("simulated out of memory on chip N: needs X GiB, has Y GiB"), RuntimeFault (exit 3) when this host's available
// memory cannot (every rank on the host needs them; the kernel would kill the job instead). Local, no communication: call
// inside World::agree.
void check_memory(const Net& net, double bytes_per_rank, double device_bytes, const std::string& what);
// This host's MemAvailable (/proc/meminfo) in bytes; 0 when unknown (then do not check).
double available_host_bytes();
// Output files: not empty, not a directory, directory writable, all distinct (common/output_file.h's
// output_identity, so two names of one not-yet-existing file are caught too). UsageError otherwise.
void check_outputs(const std::vector<std::pair<std::string, std::string>>& flag_and_path);

// Writes TEXT to PATH atomically (temporary + fsync + rename, common/output_file.h); RuntimeFault (exit 3) with
// one line naming the file and the cause when anything fails (e.g. "No space left on device").
void write_file(const std::string& path, const std::string& text);

// "a,b,c" -> {"a","b","c"}; an empty item ("a,,b", "a,") is a UsageError.
std::vector<std::string> split_list(const std::string& s);
// Parses "1K", "4M", "1G" (binary multiples) or plain numbers of bytes. UsageError naming FLAG otherwise.
size_t parse_bytes(const std::string& text, const std::string& flag);
// A CLI11 check for integer flags: plain decimal digits (an optional '+') within int64. CLI11 alone also reads
// hex, octal and binary prefixes ("0x10" as 16) and lets numbers beyond int64 through to its range check.
CLI::Validator decimal_integer();

// Parses a comma list with PARSE (which throws std::invalid_argument) or 'all'; UsageError naming FLAG.
template <class T, class Parse>
inline std::vector<T> parse_list(const std::string& text, const std::vector<T>& all, Parse parse, const std::string& flag) {
  if (text == "all") return all;
  std::vector<T> out;
  for (const auto& item : split_list(text)) {
    try {
      out.push_back(parse(item));
    } catch (const std::invalid_argument& e) {
      throw UsageError(flag + ": " + e.what());
    }
  }
  if (out.empty()) throw UsageError(flag + ": empty list");
  return out;
}

}  // namespace shardsim::apps
