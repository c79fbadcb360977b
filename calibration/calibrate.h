// Fitting the link model to measured collective timings (`shardsim calibrate`). Its input,
// nccl-tests tables, is read by calibration/nccl_log.h.
//
// Model fitted: the topology file's links with every latency scaled by one factor a and every bandwidth by one
// factor b (so the ratios between dimensions stay as the file gives them; a single-dimension topology thus gets
// its latency and bandwidth fitted outright). The prediction for a row is the collective's simulated time on that
// topology (estimate_ns: the event-free replay of the algorithm's schedule, the same rules as a simulated run).
// The fit minimises the sum of squared relative time errors over the rows at or above min_bytes: a weighted
// linear least-squares start (time is linear in latency and 1/bandwidth for ring-family schedules), then
// Gauss-Newton steps on the full replay (which may take a max over paths). b is the "efficiency": the fraction of
// the file's line rate the measurement achieved (NCCL's protocol overhead, e.g. ~370 of 450 GB/s on H100 NVLink).
//
// With protocols = 2 the rows split at a size into a low-latency protocol (smaller rows: own latency factor and
// efficiency) and the bandwidth protocol (NCCL's LL/LL128 vs Simple): every split is tried, the least squares wins.
// With fit_overhead the protocol's per-message overhead o (topology.h, Protocol::message_overhead_ns: once per
// message at the sender, not per hop) is a third parameter: t = a x L(S) + o x M(S) + W(S) / b, M = the number of
// messages on the critical path. It is identifiable only when the fitted rows do not all charge messages and hop
// latencies in one ratio: single-hop ring steps (one message per hop), or any one schedule whose message and hop
// counts do not change with size, make o and a one parameter (ConfigError saying so; without fit_overhead o stays
// 0 and the fitted latency absorbs it). Pipelined pieces (chunk_bytes: k pieces per step pay k overheads on the
// port but overlap their latencies) or rows of schedules with different hop/message ratios separate them.
//
// With fit_call_overhead the protocol's per-call overhead c (Protocol::call_overhead_ns: once per collective call,
// however many steps) is one more parameter: t = a x L(S) + c + W(S) / b (+ o x M(S) with fit_overhead). With
// protocols = 2 there is one c for both protocols (a kernel launch does not depend on the protocol the call then
// uses): t = a_lo x L + c + W / b_lo below the split, a x L + c + W / b above it, fitted jointly for every split.
// c is identifiable only when the fitted rows' latency terms L(S) are not all one multiple of 1 (checked as the
// part of c's column that the other columns cannot express, relative, > 1e-9; else ConfigError saying why): one
// unpipelined schedule of one collective at one p has L(S) = steps x hops x alpha for every size, so c and a x L
// are one intercept. Logs of two collectives whose schedules take different step counts (all_reduce's 2(p-1) ring
// steps and all_gather's or reduce_scatter's p-1) separate them; fit those together (LOG1 LOG2 ...).
// Without fit_call_overhead c stays 0 and the fitted latency absorbs it (per step).
//
// In-switch reduction (collectives/in_switch.h; a topology whose switch has `reduction: true`): when the fitted
// rows run in_switch (algorithm "in_switch", or "auto" choosing it on the file's topology for some fitted row), the
// switch's reduction bandwidth R (GB/s of result) and latency alpha_R (ns) are two more parameters, fitted by the
// same machinery (calibrate_fitter.h: r = R / the file's reduction_bandwidth_gbps, alpha_R in us; a linear start
// from the replay at unlimited rates, then Gauss-Newton on the full replay, which takes the max of the links' and
// the switch's rates per piece). Every reduction switch of the topology gets the same factor r and the same
// alpha_R. Identifiability: an in_switch row pays two link hops and one alpha_R at every size, so a x alpha and
// alpha_R are one intercept when every fitted row runs in_switch: then a is held at 1 (the file's link latency,
// Calibration::link_latency_held) and alpha_R takes the rest; with fit_call_overhead c and alpha_R are one
// intercept too (ConfigError). R and b separate through the pieces (1 MiB by default, up to 64): below 1 MiB a
// row's link term grows with its size, from 1 to 64 MiB it stays one piece's; rows that are all >= 64 MiB cannot
// tell R from b (ConfigError). Not with protocols = 2 (UsageError).
//
#pragma once

#include <string>
#include <vector>

#include "collectives/algorithms.h"
#include "calibration/nccl_log.h"
#include "runtime/transport.h"
#include "runtime/world.h"
#include "topology/topology.h"

namespace shardsim::calibration {

using collectives::Collective;

// The chips the estimates run on: WORLD's (one per MPI rank, or several per rank with --chips), rank r on chip
// RANK_TO_CHIP[r]. Estimates communicate nothing (a transport over WORLD on a timeline of the topology asked).
struct EstimateGroup {
  const runtime::World* world = nullptr;
  std::vector<int> rank_to_chip;
  int size() const { return static_cast<int>(rank_to_chip.size()); }
};

struct CalibrationOptions {
  std::string algorithm = "ring";  // the schedule the measured library ran (NCCL's default at large sizes)
  double min_bytes = 0;            // rows below this size are predicted but not fitted
  double max_bytes = 0;            // rows above this size are predicted but not fitted (0: no upper limit)
  // 1: one latency and one bandwidth factor for every message. 2: also a low-latency protocol (topology.h,
  // Protocol) for the rows below a fitted size, with its own latency factor and efficiency.
  int protocols = 1;
  bool fit_overhead = false;  // also fit the per-message overhead o (protocols == 1 only)
  bool fit_call_overhead = false;  // also fit the per-call overhead c (either protocols; one c for both)
  size_t chunk_bytes = 0;     // the schedule's pipelining piece size (CollectiveOptions::chunk_bytes; 0: none)
};

struct Prediction {
  const NcclLog* log = nullptr;
  NcclRow row;
  double predicted_us = 0;
  bool fitted = false;  // used in the fit (else held out, below min_bytes or above max_bytes)
  double rel_error() const { return (predicted_us - row.time_us) / row.time_us; }
};

// What one log's collective ran: the algorithm (auto's choice resolved) at BYTES (the log's largest row) on the
// fitted topology, and for channel algorithms the number of rings it runs at once (multi_ring: directed
// Walecki rings; rail_ring: one ring per rail), 1 otherwise.
struct AlgorithmUse {
  std::string file;
  Collective collective = Collective::all_reduce;
  double bytes = 0;
  std::string algorithm;
  int channels = 1;
};

struct Calibration {
  double latency_factor = 1;    // a: fitted latency = a x the file's latency (x 1 ns when the file's are all 0)
  double bandwidth_factor = 1;  // b: fitted bandwidth = b x the file's bandwidth ("efficiency")
  bool low_latency = false;     // protocols == 2: fitted.protocol() holds the low-latency protocol
  double message_overhead_ns = 0;  // fit_overhead: the fitted o (also in fitted.protocol())
  double call_overhead_ns = 0;     // fit_call_overhead: the fitted c (also in fitted.protocol())
  // The file's topology with link latencies x a and a protocol of efficiency b (links keep their line rate unless
  // the fit beat it, b > 1: then their bandwidth is raised and the efficiency is 1); with two protocols, the
  // low-latency one as fitted.
  topology::Topology fitted;
  int iterations = 0;
  std::vector<Prediction> predictions;  // fit logs first, then held-out logs, rows in file order
  double rms_rel_error = 0;            // over the fitted rows
  double low_latency_efficiency = 0;   // protocols == 2: the low-latency protocol's fraction of the line rate
  bool reduction = false;              // the rows ran in_switch: the reduction below was fitted
  double reduction_bandwidth_gbps = 0;  // the fitted R (GB/s of result, GB = 1e9 B; also in fitted's switch)
  double reduction_latency_ns = 0;      // the fitted alpha_R (ns; also in fitted's switch)
  bool link_latency_held = false;       // a held at 1: the rows cannot tell the link latency from alpha_R
  std::vector<AlgorithmUse> algorithms;  // per log (fit logs, then held-out), its largest row's algorithm
  // Why the fit is physically impossible, one line each (empty when it is not): an efficiency above 1 (more than
  // the file's line rate), the latency factor at its bound 0 (the rows want a negative latency), a low-latency
  // protocol slower than the bandwidth protocol at its own threshold, a reduction bandwidth above the line-rate sum
  // of the switch's ports, a reduction latency at its bound 0. `calibrate` prints them as warnings and exits 2
  // with --strict.
  std::vector<std::string> warnings;
};

// Fits TOPO's link parameters to FIT logs; HELD_OUT logs are only predicted (with FIT empty: no fit, every row
// predicted on TOPO as given, factors 1). TP: as many chips as TOPO has (every estimate runs on its own Timeline
// over a scaled copy of TOPO; UsageError otherwise). Deterministic: any rank computes the same result (the app
// computes it on rank 0 alone). ConfigError when a log's rank count differs
// from TOPO's chips, when no row is at or above min_bytes, or when the algorithm cannot run a log's collective.
Calibration calibrate(const topology::Topology& topo, const std::vector<NcclLog>& fit,
                      const std::vector<NcclLog>& held_out, const CalibrationOptions& options,
                      const EstimateGroup& tp);

// The simulated time (us) of LOG's collective on TOPO for BYTES with ALGORITHM (estimate_ns on a transport over
// TP's chips whose timeline is TOPO), pipelined in pieces of CHUNK_BYTES (0: none).
double predict_us(const topology::Topology& topo, Collective c, const std::string& algorithm, double bytes,
                  const EstimateGroup& tp, size_t chunk_bytes = 0);

// The algorithm ALGORITHM resolves to (auto's choice) for C of BYTES on TOPO, with its channel count
// (AlgorithmUse; file left empty). ConfigError when the algorithm cannot run there.
AlgorithmUse resolve_algorithm(const topology::Topology& topo, Collective c, const std::string& algorithm,
                               double bytes, const EstimateGroup& tp, size_t chunk_bytes = 0);

// Why CAL (a fit with OPTIONS) is physically impossible, one line each (Calibration::warnings; empty when it is
// not). Reads CAL's factors, flags and fitted topology only.
std::vector<std::string> physical_warnings(const Calibration& cal, const CalibrationOptions& options);

// TOPO as a topology file (the `topology:` section, readable by load_topology), for `calibrate --out`. Grid
// topologies only: std::invalid_argument for graphs. A switch's in-switch reduction is written with its keys.
std::string topology_yaml(const topology::Topology& topo);

}  // namespace shardsim::calibration
