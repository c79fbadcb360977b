// The result of a run: what the modelled hardware would do (simulated) and what the host paid (wall).
// Simulated and wall numbers are kept in separate fields and never mixed.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "sharding/fused.h"
#include "sim/timeline.h"

namespace shardsim::sharding {

struct ChipReport {
  int chip = 0;
  sim::Breakdown breakdown;
  double peak_memory_bytes = 0;  // simulated HBM in use at the chip's peak: sim::Memory::peak() of its run
};

struct RunReport {
  std::string name;
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
  double all_reduce_ns = 0;
  std::string all_reduce_algorithm;
  double all_reduce_bytes_per_chip = 0;   // bytes each chip injects in the all_reduce
  double all_reduce_expected_bytes = 0;   // 2(p-1)/p * M
  double single_device_ns = 0;             // the same workload on one modelled chip (0 if not validated)
  std::vector<ChipReport> per_chip;
  std::vector<FusedOp> fused;              // fused collective+GEMM ops of the critical chip (parallel.fused)
  double hbm_capacity_bytes = 0;

  // Validation.
  bool validated = false;
  bool passed = true;
  double max_abs_error = 0;
  double max_abs_reference = 0;
  double relative_error = 0;  // max_abs_error / max_abs_reference
  double tolerance = 0;
  std::string resumed_from;
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
