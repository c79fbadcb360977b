#include "models/report.h"

#include <cstdio>
#include <sstream>

namespace shardsim::sharding {

namespace {
nlohmann::json breakdown_json(const sim::Breakdown& b) {
  return {{"total_ns", b.total},           {"compute_ns", b.compute}, {"communication_ns", b.communication},
          {"exposed_comm_ns", b.exposed_comm}, {"flops", b.flops},    {"bytes_sent", b.bytes_sent}};
}

std::string fmt_ns(double ns) {
  char buf[64];
  if (ns >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.3f ms", ns / 1e6);
  } else if (ns >= 1e3) {
    std::snprintf(buf, sizeof buf, "%.3f us", ns / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f ns", ns);
  }
  return buf;
}
std::string pct(double part, double whole) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%5.1f%%", whole > 0 ? 100.0 * part / whole : 0.0);
  return buf;
}
}  // namespace

std::string format_mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

nlohmann::json to_json(const RunReport& r) {
  nlohmann::json chips = nlohmann::json::array();
  for (const auto& c : r.per_chip)
    chips.push_back({{"chip", c.chip}, {"simulated", breakdown_json(c.breakdown)}, {"peak_memory_bytes", c.peak_memory_bytes}});
  nlohmann::json j = {
      {"name", r.name},
      {"config", r.config_file},
      {"topology", r.topology},
      {"device", r.device},
      {"plan", r.plan},
      {"mesh", r.mesh},
      {"chips", r.chips},
      {"dtype", r.dtype},
      {"units", {{"time", "ns (simulated) / s (wall)"}, {"bandwidth", "GB/s, GB = 1e9 bytes"}}},
      {"simulated",
       {{"critical_chip", r.critical_chip},
        {"breakdown", breakdown_json(r.critical)},
        {"total_flops", r.total_flops},
        {"tflops", r.sim_tflops},
        {"peak_tflops", r.peak_tflops},
        {"peak_fraction", r.peak_fraction},
        {"all_reduce_ns", r.all_reduce_ns},
        {"all_reduce_algorithm", r.all_reduce_algorithm},
        {"all_reduce_bytes_per_chip", r.all_reduce_bytes_per_chip},
        {"all_reduce_expected_bytes_per_chip", r.all_reduce_expected_bytes},
        {"single_device_ns", r.single_device_ns},
        {"hbm_capacity_bytes", r.hbm_capacity_bytes},
        {"speedup_vs_single_device", r.single_device_ns > 0 && r.critical.total > 0
                                         ? r.single_device_ns / r.critical.total
                                         : 0.0},
        {"per_chip", chips}}},
      {"validation",
       {{"enabled", r.validated},
        {"passed", r.passed},
        {"max_abs_error", r.max_abs_error},
        {"max_abs_reference", r.max_abs_reference},
        {"relative_error", r.relative_error},
        {"tolerance", r.tolerance},
        {"resumed_from", r.resumed_from}}},
      {"checkpoint", r.checkpoint},
      {"trace", r.trace},
      {"wall",
       {{"total_s", r.wall_total_s},
        {"init_s", r.wall_init_s},
        {"forward_s", r.wall_forward_s},
        {"reference_s", r.wall_reference_s},
        {"checkpoint_s", r.wall_checkpoint_s}}},
      {"verdict", r.ok() ? "PASS" : "FAIL"},
  };
  if (!r.fused.empty()) j["simulated"]["fused"] = fused_json(r.fused, r.critical.total);
  if (!r.resumed_from.empty()) {
    auto& v = j["validation"];
    v["resume_bit_exact"] = r.resume_same_layout && r.resume_bit_exact;
    v["resume_same_layout"] = r.resume_same_layout;
    v["resume_saved_tp"] = r.resume_saved_tp;
    v["resume_relative_error"] = r.resume_relative_error;
    v["resume_ok"] = r.resume_bit_exact;
  }
  return j;
}

std::string to_text(const RunReport& r) {
  std::ostringstream os;
  const auto& b = r.critical;
  os << "shardsim run" << (r.name.empty() ? "" : ": " + r.name) << "  (" << r.config_file << ")\n";
  os << "  topology   " << r.topology << "\n";
  os << "  device     " << r.device << "\n";
  os << "  plan       " << r.plan << ", dtype " << r.dtype << "\n";
  if (!r.mesh.empty()) os << "  mesh       " << r.mesh << "\n";
  os << "simulated (modelled hardware; critical chip " << r.critical_chip << ")\n";
  os << "  total              " << fmt_ns(b.total) << "\n";
  os << "  compute            " << fmt_ns(b.compute) << "  " << pct(b.compute, b.total) << "\n";
  os << "  communication      " << fmt_ns(b.communication) << "  " << pct(b.communication, b.total) << "\n";
  os << "  exposed comm       " << fmt_ns(b.exposed_comm) << "  " << pct(b.exposed_comm, b.total) << "\n";
  char buf[256];
  std::snprintf(buf, sizeof buf, "  throughput         %.2f TFLOP/s = %.1f%% of %.1f TFLOP/s peak (%d chips)\n",
                r.sim_tflops, 100.0 * r.peak_fraction, r.peak_tflops, r.chips);
  os << buf;
  os << "  all_reduce         " << fmt_ns(r.all_reduce_ns) << (r.fused.empty() ? "" : " alone") << " ("
     << r.all_reduce_algorithm << "), "
     << format_mib(r.all_reduce_bytes_per_chip)
     << " sent per chip (2(p-1)/p*M = " << format_mib(r.all_reduce_expected_bytes) << ")\n";
  double peak_mem = 0;
  int peak_chip = 0;
  for (const auto& c : r.per_chip)
    if (c.peak_memory_bytes > peak_mem) {
      peak_mem = c.peak_memory_bytes;
      peak_chip = c.chip;
    }
  std::snprintf(buf, sizeof buf, "  peak memory        %.3f GiB on chip %d (%.1f%% of %.0f GiB HBM)\n",
                peak_mem / 1073741824.0, peak_chip, r.hbm_capacity_bytes > 0 ? 100.0 * peak_mem / r.hbm_capacity_bytes : 0.0,
                r.hbm_capacity_bytes / 1073741824.0);
  os << buf;
  if (r.single_device_ns > 0) {
    std::snprintf(buf, sizeof buf, "  single device      %s  -> speedup %.2fx on %d chips\n",
                  fmt_ns(r.single_device_ns).c_str(), r.single_device_ns / b.total, r.chips);
    os << buf;
  }
  os << fused_text(r.fused, b.total);
  os << "wall (this host)\n";
  std::snprintf(buf, sizeof buf, "  total %.3f s  (init %.3f s, sharded forward %.3f s, reference %.3f s, checkpoint %.3f s)\n",
                r.wall_total_s, r.wall_init_s, r.wall_forward_s, r.wall_reference_s, r.wall_checkpoint_s);
  os << buf;
  if (!r.resumed_from.empty()) {
    os << "resume     weights from " << r.resumed_from;
    if (r.resume_same_layout) {
      os << ": output " << (r.resume_bit_exact ? "bit-identical to" : "DIFFERS from") << " the stored output\n";
    } else {
      std::snprintf(buf, sizeof buf, ": resharded from tp=%d to tp=%d, output %s the stored output (relative %.3g)\n",
                    r.resume_saved_tp, r.chips, r.resume_bit_exact ? "within tolerance of" : "DIFFERS from",
                    r.resume_relative_error);
      os << buf;
    }
  }
  if (r.validated) {
    std::snprintf(buf, sizeof buf, "validation %s  max|y-y_ref| = %.3g, max|y_ref| = %.3g, relative %.3g (tolerance %.3g)\n",
                  r.passed ? "PASS" : "FAIL", r.max_abs_error, r.max_abs_reference, r.relative_error, r.tolerance);
    os << buf;
  } else {
    os << "validation skipped (validate.enabled: false)\n";
  }
  if (!r.checkpoint.empty()) os << "checkpoint " << r.checkpoint << "\n";
  if (!r.trace.empty()) os << "trace      " << r.trace << " (Chrome trace JSON: open in ui.perfetto.dev)\n";
  os << (r.ok() ? "PASS" : "FAIL") << "\n";
  return os.str();
}

}  // namespace shardsim::sharding
