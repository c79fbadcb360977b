// Per-chip simulated timeline: engines that are busy until some time, and the events that ran on them.
//
// Engines: engine 0 is the compute engine; engine 1+i is the injection port of the chip's i-th outgoing link
// (Topology::out_links order). An op becomes ready at some time (its inputs' ready times, computed by the
// caller) and starts at max(ready, engine free time); the engine is then busy until start + duration.
// Ops on different engines overlap freely; ops on one engine serialize in the order they were issued.
//
// Contention the timeline sees: the flows this chip injects. A transfer over links l_1..l_h is cut-through:
// its head reaches l_i at start + (alpha_1 + ... + alpha_{i-1}) and it occupies every l_i for S / min_j B_j.
// The timeline keeps a busy-until time for every link of the topology *as used by this chip's own flows*, and
// a transfer starts at the earliest time at which all of its links are free when its head gets there. So two
// flows of one chip that share any link of their routes serialize on it; flows on disjoint links do not slow
// each other. Flows of other chips are invisible here (each rank keeps its own timeline): two chips sending
// through one shared link do not slow each other. See docs/MODEL.md, "Contention".
//
// Simulated time never comes from the host clock: it is advanced only by cost functions and by the
// timestamps carried in messages (Lamport-style), so it is bit-identical from run to run.
// Units: ns of simulated time (double).
#pragma once

#include <string>
#include <vector>

#include "sim/cost.h"
#include "sim/device_spec.h"
#include "topology/topology.h"

namespace shardsim::sim {

using TimeNs = double;

struct Span {
  TimeNs start = 0;
  TimeNs end = 0;
  TimeNs duration() const { return end - start; }
};

struct Event {
  std::string name;      // "gemm", "all_reduce.ring.step3", ...
  std::string category;  // "compute" | "send" | "collective"
  int engine = 0;        // -1 for op-level regions (collectives) that are not on one engine
  Span span;
  double flops = 0;
  double bytes = 0;
  int peer = -1;  // chip on the other end, for sends
};

// Where a chip's simulated time went; see Timeline::breakdown.
struct Breakdown {
  TimeNs total = 0;           // end of the chip's last event
  TimeNs compute = 0;         // busy time of the compute engine
  TimeNs communication = 0;   // union of collective regions
  TimeNs exposed_comm = 0;    // part of `communication` during which the compute engine was idle
  double flops = 0;           // FLOPs executed on this chip
  double bytes_sent = 0;      // bytes injected into links
};

class Timeline {
 public:
  // RECORD_EVENTS false: keep only the engines' and links' busy times (for cost estimates that replay
  // schedules; events() stays empty).
  Timeline(int chip, const topology::Topology& topo, DeviceSpec device, bool record_events = true);

  int chip() const { return chip_; }
  const DeviceSpec& device() const { return device_; }
  const topology::Topology& topology() const { return *topo_; }
  static constexpr int kComputeEngine = 0;
  int num_engines() const { return static_cast<int>(free_.size()); }
  std::string engine_name(int engine) const;
  TimeNs free_at(int engine) const { return free_.at(engine); }

  // A compute op of FLOPS and BYTES (HBM traffic) at precision P, ready at READY. Returns its span.
  Span compute(const std::string& name, double flops, double bytes, Precision p, TimeNs ready);

  // Injects BYTES towards chip DST at READY. The first link of the route is the injection port and is busy
  // for the transfer's occupancy; returns {start, arrival at DST}. Self-sends are free and instantaneous.
  Span send(const std::string& name, int dst, double bytes, TimeNs ready);

  // Records an op-level region (e.g. a whole all_reduce) for the breakdown and the trace.
  void record_region(const std::string& name, const std::string& category, Span span, double bytes = 0);

  const std::vector<Event>& events() const { return events_; }
  // Back to time zero: every engine free, no events (a fresh clock for the next measurement).
  void reset();
  TimeNs end_time() const;
  Breakdown breakdown() const;

 private:
  int chip_;
  const topology::Topology* topo_;
  DeviceSpec device_;
  struct Route {
    int port = 0;                 // engine of the first link
    std::vector<int> links;       // link ids
    std::vector<double> offset;   // head arrival at link i relative to the start: sum of earlier latencies
    double bottleneck_gbps = 0;   // min bandwidth over the route
    double latency_ns = 0;        // sum of latencies
  };
  const Route& route_to(int dst);

  bool record_ = true;
  std::vector<TimeNs> free_;
  std::vector<TimeNs> link_free_;     // per topology link, busy-until by this chip's own flows
  std::vector<Route> routes_;         // per destination chip, filled on first use
  std::vector<bool> have_route_;
  std::vector<Event> events_;
};

}  // namespace shardsim::sim
