// The result of a run: what the modelled hardware would do (simulated) and what the host paid (wall).
// Simulated and wall numbers are kept in separate fields and never mixed.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "runtime/world.h"
#include "sharding/fused.h"
#include "sim/timeline.h"

namespace shardsim::sharding {

// Where one chip's simulated time went, per kernel and per collective (docs/MODEL.md, "Report breakdown").
// Built from the chip's sim::Timeline events: a kernel is a "compute" event, a collective a "collective" region;
// events whose names differ only in numbers (ring steps, chunks, the chip whose K/V block is attended) are one
// row, the numbers written as N. time_ns sums the events' durations (ns of simulated time; collective regions of
// one row may overlap each other and compute, so rows do not add up to the total); flops and bytes sum the events'
// FLOPs and bytes (bytes: a region's recorded bytes, 0 when the collective records none).
struct OpStat {
  std::string name;
  std::string kind;  // "kernel" | "collective"
  int calls = 0;
  double time_ns = 0;
  double flops = 0;
  double bytes = 0;
};
std::vector<OpStat> op_breakdown(const sim::Timeline& tl);
// The op rows of world rank CRITICAL_RANK on every rank (collective over WORLD: every rank calls it).
std::vector<OpStat> ops_of_rank(const runtime::World& world, const std::vector<OpStat>& mine, int critical_rank);
// The rank whose chip finishes last (lowest rank among ties), on every rank (collective).
int critical_rank(const runtime::World& world, double my_total_ns);
// Rows sorted by time, kernels first: calls, time, % of TOTAL_NS, and for kernels TFLOP/s and % of
// PEAK_TFLOPS_PER_CHIP (the device's peak at the workload's precision).
std::string ops_text(const std::vector<OpStat>& ops, double total_ns, double peak_tflops_per_chip);
nlohmann::json ops_json(const std::vector<OpStat>& ops, double total_ns, double peak_tflops_per_chip);

struct ChipReport {
  int chip = 0;
  sim::Breakdown breakdown;
  double peak_memory_bytes = 0;  // simulated HBM in use at the chip's peak: sim::Memory::peak() of its run
};

// One collective's figures on the critical chip (bytes sent by this chip; the plan's formula for them).
struct CommStat {
  double bytes = 0;     // bytes this chip sent
  double expected = 0;  // the formula's bytes per chip
  int calls = 0;
  double ns = 0;          // simulated time of the calls (the unfused collective alone for fused ops)
  std::string algorithm;  // what ran ("auto" resolved), when recorded
};

// The one report of `shardsim run` for every model (MLP, transformer block) and plan: text (to_text) and JSON
// (to_json). Complete on rank 0.
struct RunReport {
  std::string name;
  std::string model;  // the config's model label ("" none)
  std::string config_file;
  std::string topology;  // one-line description
  std::string device;    // one-line description
  std::string plan;      // one-line description
  std::string mesh;      // DeviceMesh::mapping_text(): the axes and where they lie on the topology
  int chips = 0;
  std::string dtype;

  // Simulated (ns; FLOPs; bytes). The headline is the critical chip (the one that finishes last).
  sim::Breakdown critical;
  int critical_chip = 0;
  double total_flops = 0;            // over all chips
  double sim_tflops = 0;             // total_flops / critical.total
  double peak_tflops = 0;            // chips x per-chip peak at the workload's precision
  double peak_fraction = 0;
  double peak_tflops_per_chip = 0;   // the device's peak at the workload's precision
  double tokens_per_s = 0;           // tokens / critical.total (simulated)
  std::vector<OpStat> ops;           // the critical chip's time per kernel and per collective
  double attention_ns = 0;           // of the critical chip: attention kernels + ring (0 without attention)
  std::map<std::string, CommStat> comm;  // per collective of the plan ("tp all_reduce", ...), the critical chip's
  double all_reduce_ns = 0;
  std::string all_reduce_algorithm;
  double all_reduce_bytes_per_chip = 0;   // bytes each chip injects in the all_reduce
  double all_reduce_expected_bytes = 0;   // 2(p-1)/p * M
  double single_device_ns = 0;             // the same workload on one modelled chip (0 if not validated)
  std::vector<ChipReport> per_chip;
  std::vector<FusedOp> fused;              // fused collective+GEMM ops of the critical chip (parallel.fused)
  double hbm_capacity_bytes = 0;

  // Layers run in sequence (workload.layers; 1 for the MLP): the critical chip's simulated time per layer, whose
  // sum is critical.total up to the time before the first layer starts.
  int layers = 1;
  std::vector<double> layer_ns;

  // Shape-only mode (mode: shape_only / --shape-only): every simulated figure as in real-data mode, nothing
  // validated (validated false; the text says "not validated (shape-only)").
  bool shape_only = false;

  // Validation.
  bool validated = false;
  bool passed = true;
  double max_abs_error = 0;
  double max_abs_reference = 0;
  double relative_error = 0;  // max_abs_error / max_abs_reference
  double tolerance = 0;
  std::string resumed_from;
  bool resume_compared = false;   // the checkpoint held an output the resumed run was compared with
  bool resume_bit_exact = true;   // same layout: output bit-identical to the stored one; resharded: within tolerance
  bool resume_same_layout = true; // the checkpoint was written with the same tp
  int resume_saved_tp = 0;        // tp recorded in the checkpoint (0 if unknown)
  double resume_relative_error = 0;
  std::string checkpoint;         // path written ("" if none)
  std::string trace;              // Chrome trace written ("" if none)

  // Wall clock of this host (seconds).
  double wall_total_s = 0;
  double wall_init_s = 0;        // generating (or loading) inputs and this chip's weights
  double wall_forward_s = 0;
  double wall_reference_s = 0;
  double wall_checkpoint_s = 0;

  bool ok() const { return passed && resume_bit_exact; }
};

// "12.345 MiB" (bytes / 2^20, three decimals): the byte figures of the text reports.
std::string format_mib(double bytes);

nlohmann::json to_json(const RunReport& r);
std::string to_text(const RunReport& r);

}  // namespace shardsim::sharding
