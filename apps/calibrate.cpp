// `shardsim calibrate LOG... [--predict LOG...] --topology FILE [--out FILE] [--json FILE] [--strict]`: fits the
// stated topology's link latency and bandwidth to measured nccl-tests tables (calibration/calibrate.h) and prints
// the fit with the error per size. Run it with as many chips as the topology has (mpirun -np N, or --chips N on
// one rank); rank 0 computes the fit and prints, every rank agrees on its errors. --out writes the fitted topology
// as a file that run, bench, validate and sweep accept (--topology); --json the fit and every row as JSON.
// Physically impossible fits (Calibration::warnings) are printed as warnings, exit 2 with --strict.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "apps/calibrate_kernels.h"
#include "apps/cli_common.h"
#include "apps/commands.h"
#include "calibration/calibrate.h"
#include "collectives/registry.h"
#include "verification/verify.h"
#include "common/error.h"
#include "common/text.h"
#include "common/output_file.h"
#include "common/text.h"

namespace shardsim::apps {

namespace {

struct CalibrateFlags {
  NetFlags net;
  std::vector<std::string> logs, predict, collective;
  std::string algorithm = "ring", min_bytes = "0", max_bytes = "0", out, chunk_bytes = "0", json;
  bool out_given = false, json_given = false, fit_overhead = false, fit_call_overhead = false, strict = false;
  int protocols = 1;
  std::string kernels, device;  // --kernels TABLE --device PRESET|FILE: the kernel model's fit instead
};

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4 && std::fmod(b, 1024) == 0) b /= 1024, ++u;
  char s[32];
  std::snprintf(s, sizeof s, "%g %s", b, units[u]);
  return s;
}

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// --collective values: NAME (every log without a "Collective test starting" line) or FILE=NAME (that log; must
// agree with its line). Returns, per log path, the name and whether it was named for that file.
struct CollectiveNames {
  std::string all;
  std::map<std::string, std::string> per_file;
  std::pair<std::string, bool> of(const std::string& log) const {
    const auto it = per_file.find(log);
    return it == per_file.end() ? std::make_pair(all, false) : std::make_pair(it->second, true);
  }
};

CollectiveNames collective_names(const CalibrateFlags& f) {
  CollectiveNames out;
  for (const auto& v : f.collective) {
    const size_t eq = v.rfind('=');
    const std::string file = eq == std::string::npos ? "" : v.substr(0, eq);
    const std::string name = eq == std::string::npos ? v : v.substr(eq + 1);
    try {
      (void)collectives::parse_collective(name);
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--collective: ") + e.what());
    }
    if (file.empty()) {
      if (!out.all.empty() && out.all != name)
        throw UsageError("--collective: " + out.all + " and " + name + " both given for every log; name each log's "
                         "collective with --collective FILE=NAME");
      out.all = name;
      continue;
    }
    if (std::find(f.logs.begin(), f.logs.end(), file) == f.logs.end() &&
        std::find(f.predict.begin(), f.predict.end(), file) == f.predict.end())
      throw UsageError("--collective " + v + ": " + file + " is not one of the logs given");
    if (const auto it = out.per_file.find(file); it != out.per_file.end() && it->second != name)
      throw UsageError("--collective: " + file + " named twice (" + it->second + ", " + name + ")");
    out.per_file[file] = name;
  }
  return out;
}

std::vector<calibration::NcclLog> read_logs(const std::vector<std::string>& paths, const CollectiveNames& names) {
  std::vector<calibration::NcclLog> out;
  for (const auto& p : paths) {
    const auto [name, named_for_file] = names.of(p);
    out.push_back(calibration::parse_nccl_tests_log(p, name, named_for_file));
  }
  return out;
}

nlohmann::json calibration_json(const calibration::Calibration& cal, const std::vector<calibration::NcclLog>& fit,
                                const std::vector<calibration::NcclLog>& held,
                                const calibration::CalibrationOptions& opt, int chips) {
  using nlohmann::json;
  const auto& proto = cal.fitted.protocol();
  json j = {{"algorithm", opt.algorithm},
            {"topology", cal.fitted.describe()},
            {"fitted", !fit.empty()},
            {"latency_factor", cal.latency_factor},
            {"bandwidth_factor", cal.bandwidth_factor},
            {"efficiency", proto.efficiency},
            {"message_overhead_ns", cal.message_overhead_ns},
            {"call_overhead_ns", cal.call_overhead_ns},
            {"rms_rel_error", cal.rms_rel_error},
            {"warnings", cal.warnings}};
  if (cal.reduction)
    j["reduction"] = {{"bandwidth_gbps", cal.reduction_bandwidth_gbps},
                      {"latency_ns", cal.reduction_latency_ns},
                      {"link_latency_held", cal.link_latency_held}};
  json algorithms = json::array();
  for (const auto& u : cal.algorithms)
    algorithms.push_back({{"file", u.file},
                          {"collective", collectives::collective_name(u.collective)},
                          {"bytes", u.bytes},
                          {"algorithm", u.algorithm},
                          {"channels", u.channels}});
  j["algorithms"] = algorithms;
  if (cal.low_latency)
    j["low_latency"] = {{"max_bytes", proto.low_latency_max_bytes},
                        {"efficiency", cal.low_latency_efficiency},
                        {"latency_factor", proto.low_latency_latency_factor}};
  json logs = json::array();
  for (const auto* group : {&fit, &held})
    for (const auto& l : *group)
      logs.push_back({{"file", l.file},
                      {"collective", collectives::collective_name(l.collective)},
                      {"use", group == &fit ? "fit" : "held out"},
                      {"ranks", l.ranks},
                      {"notes", l.notes}});
  j["logs"] = logs;
  json rows = json::array();
  for (const auto& p : cal.predictions) {
    const double factor = verification::busbw_factor(p.log->collective, chips);
    rows.push_back({{"file", p.log->file},
                    {"line", p.row.line},
                    {"collective", collectives::collective_name(p.log->collective)},
                    {"bytes", p.row.bytes},
                    {"measured_us", p.row.time_us},
                    {"predicted_us", p.predicted_us},
                    {"rel_error", p.rel_error()},
                    {"busbw_measured_gbps", p.row.bytes / (p.row.time_us * 1e3) * factor},
                    {"busbw_predicted_gbps", p.row.bytes / (p.predicted_us * 1e3) * factor},
                    {"fitted", p.fitted}});
  }
  j["rows"] = rows;
  return j;
}

// The fitted parameters of CAL, one line each (and the warnings), as `calibrate` prints them.
void print_fit(const calibration::Calibration& cal, const CalibrateFlags& f, bool no_fit) {
  if (no_fit)
    std::printf("no fit: every row predicted on the topology as given (a = b = 1)\n");
  else
    std::printf("fit   a = %.6g (latency), b = %.6g (bandwidth = efficiency of the file's line rate), %d Gauss-Newton "
              "step(s)%s\n",
              cal.latency_factor, cal.bandwidth_factor, cal.iterations,
              cal.low_latency ? " (bandwidth protocol; the low-latency one below)" : "");
  const auto& dims = cal.fitted.dim_specs();
  const auto& proto = cal.fitted.protocol();
  for (size_t d = 0; d < dims.size(); ++d)
    std::printf("  dim%zu %-15s %3d chips  latency %.6g ns  bandwidth %.6g GB/s effective (line rate %.6g GB/s x "
                "efficiency %.6g; per direction, GB = 1e9 B)\n",
                d, topology::dim_kind_name(dims[d].kind).c_str(), dims[d].size, dims[d].link.latency_ns,
                dims[d].link.bandwidth_gbps * proto.efficiency, dims[d].link.bandwidth_gbps, proto.efficiency);
  if (cal.low_latency)
    std::printf("  low-latency protocol for messages <= %.0f B: latency x %.6g, efficiency %.6g\n",
                proto.low_latency_max_bytes, proto.low_latency_latency_factor, proto.low_latency_efficiency);
  if (f.fit_overhead)
    std::printf("  message overhead o = %.6g ns per message (at the sender, once, not per hop)\n",
                cal.message_overhead_ns);
  if (f.fit_call_overhead)
    std::printf("  call overhead c = %.6g ns per collective call (once, on every chip, before the first step)\n",
                cal.call_overhead_ns);
  if (cal.reduction)
    std::printf("  in-switch reduction R = %.6g GB/s (of result, per switch), latency alpha_R = %.6g ns%s\n",
                cal.reduction_bandwidth_gbps, cal.reduction_latency_ns,
                cal.link_latency_held ? "; a held at 1: every in_switch row pays two link hops and one alpha_R at "
                                        "every size, so the rows cannot split that intercept (alpha_R took it)"
                                      : "");
  for (const auto& u : cal.algorithms)
    if (u.channels > 1 || u.algorithm != f.algorithm)
      std::printf("# algorithm: %s (%s) at %s ran %s%s\n", escape_control(u.file).c_str(),
                  collectives::collective_name(u.collective).c_str(), human_bytes(u.bytes).c_str(),
                  u.algorithm.c_str(),
                  u.channels > 1 ? (" on " + std::to_string(u.channels) + " channels (rings at once)").c_str() : "");
  for (const auto& w : cal.warnings) std::printf("warning: physically impossible fit: %s\n", w.c_str());
}

int run_calibrate(const runtime::World& world, const CalibrateFlags& f) {
  std::unique_ptr<Net> net;
  std::vector<calibration::NcclLog> fit, held;
  calibration::CalibrationOptions opt;
  world.agree([&] {
    net = build_net(f.net, world);
    if (f.logs.empty() && f.predict.empty())
      throw UsageError("calibrate: give at least one nccl-tests log to fit (or --predict LOG alone for the "
                       "topology's predictions without a fit)");
    if (f.logs.empty() && f.out_given) throw UsageError("--out: nothing is fitted without a log to fit");
    // Checked even when every log names its own collective (an unknown name was ignored, exit 0).
    const CollectiveNames names = collective_names(f);
    fit = read_logs(f.logs, names);
    held = read_logs(f.predict, names);
    opt.algorithm = f.algorithm;
    opt.min_bytes = static_cast<double>(parse_bytes(f.min_bytes, "--min-bytes"));
    if (f.max_bytes != "0") {
      opt.max_bytes = static_cast<double>(parse_bytes(f.max_bytes, "--max-bytes"));
      if (opt.max_bytes < opt.min_bytes) throw UsageError("--max-bytes: below --min-bytes");
    }
    opt.protocols = f.protocols;  // checked by calibration::calibrate
    opt.fit_overhead = f.fit_overhead;
    opt.fit_call_overhead = f.fit_call_overhead;
    opt.chunk_bytes = parse_bytes(f.chunk_bytes, "--chunk-bytes");
    if (f.algorithm != "auto") {
      if (!collectives::find_algorithm(f.algorithm))
        throw UsageError("--algorithm: unknown algorithm '" + f.algorithm + "' (shardsim bench --list shows the catalogue)");
    }
    if (f.out_given || f.json_given) {  // never over a log being read or the topology file (lost, exit 0)
      std::vector<std::pair<std::string, std::string>> inputs = {{"the --topology file", f.net.topology_file}};
      for (const auto& l : f.logs) inputs.emplace_back("the log", l);
      for (const auto& l : f.predict) inputs.emplace_back("the --predict log", l);
      std::vector<std::pair<std::string, std::string>> outs;
      if (f.out_given) outs.emplace_back("--out", f.out);
      if (f.json_given) outs.emplace_back("--json", f.json);
      check_outputs_distinct(outs, inputs);
    }
    if (f.out_given && !net->topo().is_grid()) throw UsageError("--out: graph topologies cannot be written back yet");
  });
  connect(*net, world);
  calibration::Calibration cal;
  // Rank 0 alone fits (every estimate is a replay without communication; with --chips N every chip would repeat
  // it); errors reach every rank through the agreement.
  world.agree([&] {
    if (world.rank() != 0) return;
    cal = calibration::calibrate(net->topo(), fit, held, opt, {&world, net->world->rank_to_chip()});
    if (f.strict && !cal.warnings.empty())
      throw ConfigError("calibrate --strict: the fit is physically impossible: " + cal.warnings.front() +
                        (cal.warnings.size() > 1 ? " (and " + std::to_string(cal.warnings.size() - 1) + " more)" : ""));
  });
  const int n = net->topo().num_chips();
  if (world.rank() == 0) {
    for (const auto* logs : {&fit, &held})
      for (const auto& l : *logs)
        for (const auto& note : l.notes)
          std::printf("# note: %s: %s\n", escape_control(l.file).c_str(), escape_control(note).c_str());
    std::printf("# shardsim calibrate: %zu log(s) fitted, %zu held out; topology %s\n", fit.size(), held.size(),
                net->topo().describe().c_str());
    std::printf("# model: every link latency x a, every bandwidth x b (ratios between dimensions as in the file); "
                "algorithm %s; rows >= %s%s%s fitted\n",
                f.algorithm.c_str(), human_bytes(opt.min_bytes).c_str(), opt.max_bytes > 0 ? " and <= " : "",
                opt.max_bytes > 0 ? human_bytes(opt.max_bytes).c_str() : "");
    print_fit(cal, f, fit.empty());
    std::printf("#\n#  %-28s %-15s %12s %12s %12s %8s %10s %10s  %s\n", "file:line", "collective", "size (B)",
                "measured us", "predicted us", "error", "busbw meas", "busbw pred", "use");
    std::vector<double> fit_big, held_big, fit_all, above_all, held_all;
    for (const auto& p : cal.predictions) {
      const double factor = verification::busbw_factor(p.log->collective, n);
      const double pred_busbw = p.row.bytes / (p.predicted_us * 1e3) * factor;
      const double meas_busbw = p.row.bytes / (p.row.time_us * 1e3) * factor;
      const std::string where = p.log->file + ":" + std::to_string(p.row.line);
      const double e = std::fabs(p.rel_error());
      const bool held_out = std::find_if(held.begin(), held.end(), [&](const auto& l) { return &l == p.log; }) !=
                            held.end();
      const char* use = p.fitted                                              ? "fit"
                        : held_out                                            ? "held out"
                        : opt.max_bytes > 0 && p.row.bytes > opt.max_bytes ? "above --max-bytes"
                                                                              : "below --min-bytes";
      std::printf("   %-28s %-15s %12.0f %12.3f %12.3f %+7.2f%% %10.2f %10.2f  %s\n", escape_control(where).c_str(),
                  collectives::collective_name(p.log->collective).c_str(), p.row.bytes, p.row.time_us, p.predicted_us,
                  100 * p.rel_error(), meas_busbw, pred_busbw, use);
      if (p.fitted) fit_all.push_back(e);
      const bool above = !p.fitted && !held_out && opt.max_bytes > 0 && p.row.bytes > opt.max_bytes;
      if (p.row.bytes >= 1 << 20) {
        if (p.fitted) fit_big.push_back(e);
        else if (held_out) held_big.push_back(e);
      }
      if (above) above_all.push_back(e);
      if (held_out) held_all.push_back(e);
    }
    if (fit_all.empty())  // --predict alone: no fit, so no fitted-row statistics (their median was "nan%")
      std::printf("#\nno fitted rows; median |error| %.2f%% over the %zu held-out rows\n", 100 * median(held_all),
                  held_all.size());
    else
      std::printf("#\nerror rms %.2f%% over the %zu fitted rows; median |error| %.2f%% over fitted rows\n",
                  100 * cal.rms_rel_error, fit_all.size(), 100 * median(fit_all));
    if (!fit_big.empty())
      std::printf("      median |error| %.2f%% over fitted rows >= 1 MiB (%zu rows)\n", 100 * median(fit_big), fit_big.size());
    if (!above_all.empty())
      std::printf("      median |error| %.2f%% over rows above --max-bytes (%zu rows, predicted from the fit)\n",
                  100 * median(above_all), above_all.size());
    if (!held_big.empty())
      std::printf("      median |error| %.2f%% over held-out rows >= 1 MiB (%zu rows)\n", 100 * median(held_big),
                  held_big.size());
  }
  if (f.json_given) world.agree([&] {
    if (world.rank() == 0) write_file(f.json, calibration_json(cal, fit, held, opt, n).dump(2) + "\n");
  });
  if (f.out_given) {
    world.agree([&] {
      if (world.rank() != 0) return;
      std::string text = "# written by shardsim calibrate: the topology with every link latency x " +
                         std::to_string(cal.latency_factor) + " and bandwidth x " +
                         std::to_string(cal.bandwidth_factor) +
                         (cal.reduction ? ", the switch's reduction as fitted" : "") + "\n";
      write_file(f.out, text + calibration::topology_yaml(cal.fitted));
    });
    if (world.rank() == 0) std::printf("wrote %s (use it with --topology)\n", escape_control(f.out).c_str());
  }
  return 0;
}

}  // namespace

Command add_calibrate(CLI::App& app, const runtime::World& world) {
  auto* sub = app.add_subcommand("calibrate", "fit the topology's link latency/bandwidth to nccl-tests logs");
  auto f = std::make_shared<CalibrateFlags>();
  f->net.add_to(sub);
  sub->add_option("logs", f->logs, "nccl-tests output files to fit (one table each)");
  sub->add_option("--predict", f->predict, "nccl-tests output files to predict with the fit (held out)");
  sub->add_option("--collective", f->collective,
                  "NAME: the collective of every log without a 'Collective test starting' line; FILE=NAME: that "
                  "log's (must agree with its line); repeatable");
  sub->add_option("--algorithm", f->algorithm, "the schedule the measured library ran (default ring; auto allowed; in_switch also fits the "
                  "switch's reduction bandwidth and latency)");
  sub->add_option("--protocols", f->protocols,
                  "1 (default): one latency and bandwidth for all sizes; 2: also fit a low-latency protocol below a "
                  "fitted size (NCCL's LL/LL128 vs Simple)");
  sub->add_flag("--fit-overhead", f->fit_overhead,
               "also fit the per-message overhead (protocol.message_overhead_ns; --protocols 1); exit 2 when the rows "
               "cannot tell it from latency");
  sub->add_flag("--fit-call-overhead", f->fit_call_overhead,
               "also fit the per-call overhead (protocol.call_overhead_ns, one for both --protocols); exit 2 when the "
               "rows cannot tell it from latency (one collective's log alone: fit logs of two collectives together)");
  sub->add_option("--chunk-bytes", f->chunk_bytes,
                  "the pipelining piece size the measured schedule used (K/M/G; default 0: none), as bench's");
  sub->add_option("--min-bytes", f->min_bytes, "fit only rows at or above this size (K/M/G; default 0)");
  sub->add_option("--max-bytes", f->max_bytes,
                  "fit only rows at or below this size (K/M/G; default: no limit); larger rows are predicted from "
                  "the fit (a held-out size range)");
  sub->add_flag("--strict", f->strict,
                "exit 2 when the fit is physically impossible (efficiency above 1, latency at 0, a low-latency "
                "protocol slower than the bandwidth one at its threshold, a reduction bandwidth above the switch "
                "ports' line-rate sum, a reduction latency at 0); without it these are warnings");
  sub->add_option("--json", f->json, "also write the fit and every row as JSON")
      ->each([f](const std::string&) { f->json_given = true; });
  sub->add_option("--out", f->out, "write the fitted topology here (YAML for --topology)")
      ->each([f](const std::string&) { f->out_given = true; });
  sub->add_option("--kernels", f->kernels,
                  "fit the device's kernel model to this CSV of measured kernel times instead of links to logs "
                  "(kernel,dtype,m,n,k,batch,causal,time_us; docs/MODEL.md, \"Kernel model\")");
  sub->add_option("--device", f->device, "with --kernels: the device preset or a file with a device: section");
  return {sub, [f, &world, sub] {
            if (f->kernels.empty()) {
              if (!f->device.empty()) throw UsageError("--device: only with --kernels");
              // A held-out prediction is of a table the fit did not see (the same file, by any name, is refused).
              for (const auto& p : f->predict)
                for (const auto& l : f->logs) {
                  std::error_code ec;
                  if (std::filesystem::equivalent(p, l, ec))
                    throw UsageError("--predict " + escape_control(p) + ": is also a fitted log (" +
                                     escape_control(l) + "); a held-out prediction needs a table the fit did not see");
                }
              return run_calibrate(world, *f);
            }
            if (!f->logs.empty() || !f->predict.empty())
              throw UsageError("calibrate --kernels: fits kernels only; give nccl-tests logs in a separate call");
            for (const char* link_only : {"--protocols", "--collective", "--algorithm", "--fit-overhead",
                                          "--fit-call-overhead", "--chunk-bytes", "--min-bytes", "--max-bytes"})
              if (sub->count(link_only) > 0)
                throw UsageError(std::string(link_only) + ": a link fit's flag; calibrate --kernels does not use it");
            return run_calibrate_kernels(world, {f->kernels, f->device, f->out, f->json, f->strict});
          }};
}

}  // namespace shardsim::apps
