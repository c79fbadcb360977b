#include "experiments/scheduler.h"

#include <mpi.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <optional>
#include <span>
#include <utility>

#include <nlohmann/json.hpp>

#include "collectives/algorithms.h"
#include "verification/verify.h"
#include "common/config.h"
#include "common/error.h"
#include "runtime/chip_split.h"
#include "runtime/host_memory.h"
#include "runtime/transport.h"
#include "sim/timeline.h"
#include "sim/device_spec.h"
#include "topology/topology_yaml.h"

namespace shardsim::experiments {

Row failed_row(Row row, const std::string& why) {
  row["verdict"] = "error";
  row["reason"] = why;
  return row;
}

std::string point_text(const SweepPoint& p) {
  if (p.kind == PointKind::collective)
    return p.collective + " " + p.algorithm + " " + p.topology + " " + p.device + " " + size_label(p.size_bytes) +
           " " + p.dtype;
  return p.workload + " " + p.plan + " " + p.topology + " " + p.device +
         (p.serve ? " " + p.batching + (p.rate.empty() ? "" : " " + p.rate + " req/s") : std::string());
}

namespace {

std::string fmt(double v) {
  char b[64];
  const auto r = std::to_chars(b, b + sizeof b, v);
  return std::string(b, r.ptr);
}


Row failed(Row row, const std::string& why) { return failed_row(std::move(row), why); }

// The critical chip's breakdown and throughput, the same columns for forward and training points.
void fill_breakdown(Row& row, const reporting::RunReport& r) {
  row["compute_us"] = fmt(r.critical.compute / 1e3);
  row["comm_us"] = fmt(r.critical.communication / 1e3);
  row["exposed_comm_us"] = fmt(r.critical.exposed_comm / 1e3);
  row["idle_us"] = fmt(std::max(0.0, r.critical.total - r.critical.compute - r.critical.exposed_comm) / 1e3);
  row["tflops"] = fmt(r.sim_tflops);
  row["peak_fraction"] = fmt(r.peak_fraction);
  row["tokens_per_s"] = fmt(r.tokens_per_s);
}

// The maximum of V over the group W (wall times): MPI_Allreduce with one chip per rank, the chip router otherwise.
double group_max(double v, const runtime::World& w) {
  if (w.vcomm()) {
    runtime::chips::reduce_to_all(*w.vcomm(), &v, sizeof v, [](void* acc, const void* in) {
      double& a = *static_cast<double*>(acc);
      a = std::max(a, *static_cast<const double*>(in));
    }, "sweep wall time");
    return v;
  }
  double out = v;
  runtime::check_mpi(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, w.comm()), w.rank(), "sweep wall time");
  return out;
}

// One collective point on the group SW. The row is complete on SW's rank 0.
Row run_collective(const runtime::World& sw, const SweepPoint& pt, const SweepSpec& spec, int world_size) {
  Row row = base_row(pt);
  const std::string where = spec.file + "[" + pt.key + "]";
  topology::Topology topo;
  sim::DeviceSpec dev;
  verification::Case cs;
  size_t bytes = 0;
  try {
    sw.agree([&] {
      const ConfigNode tn = ConfigNode::load_string(pt.topology_yaml, where);
      topo = topology::load_topology_document(tn);
      dev = sim::load_device(ConfigNode::load_string(pt.device_yaml, where));
      if (topo.num_chips() != sw.size()) throw UsageError("internal: group of " + std::to_string(sw.size()) + " ranks");
      cs.collective = collectives::parse_collective(pt.collective);
      cs.dtype = runtime::parse_dtype(pt.dtype);
    });
  } catch (const AgreedError& e) {
    return failed(row, e.what());
  }
  const int p = sw.size();
  const auto c = cs.collective;
  const size_t es = runtime::dtype_size(cs.dtype);
  size_t count = c == collectives::Collective::barrier ? 0 : pt.size_bytes / es;
  // As `shardsim bench`: block-structured collectives move COUNT/p per rank, so COUNT is rounded down to p's multiple.
  const bool blocky = c == collectives::Collective::reduce_scatter || c == collectives::Collective::all_gather ||
                      c == collectives::Collective::all_to_all || c == collectives::Collective::all_to_allv ||
                      c == collectives::Collective::gather || c == collectives::Collective::scatter ||
                      c == collectives::Collective::all_gatherv;
  if (blocky) count = count / static_cast<size_t>(p) * static_cast<size_t>(p);
  bytes = count * es;
  cs.count = count;
  cs.algorithm = pt.algorithm;
  row["size_bytes"] = std::to_string(bytes);
  const bool run = static_cast<double>(bytes) <= spec.validate_max_bytes;

  // Above validate_max_bytes: the same schedule in shape-only mode (no per-message event list: nothing reads it).
  sim::Timeline tl(topo.placement().at(static_cast<size_t>(sw.rank())), topo, dev, run);
  runtime::Transport tp(sw, tl, topo.placement());  // MPI, or the chip router with several chips per rank
  try {
    sw.agree([&] {
      if (count == 0 && c != collectives::Collective::barrier)
        throw UsageError("size " + std::to_string(pt.size_bytes) + " B holds no " + pt.dtype + " element per rank");
      if (pt.algorithm != "auto")
        if (const auto why = collectives::obstacle(c, pt.algorithm, tp); !why.empty())
          throw UsageError(pt.collective + ": algorithm '" + pt.algorithm + "' cannot run on " + pt.topology + ": " + why);
      if (run) {
        const double need = verification::host_bytes_needed(cs, p);
        const double avail = runtime::mem_available_bytes();
        if (avail > 0 && need * world_size > 0.9 * avail)
          throw UsageError("needs about " + fmt(need / 1073741824.0) + " GiB of host memory per rank x " +
                           std::to_string(world_size) + " ranks; lower validate_max_bytes to time it shape-only");
      }
    });
  } catch (const AgreedError& e) {
    return failed(row, e.what());
  }
  double sim_ns = 0;
  // Real data (checked) or shape-only (the same CaseRunner and schedule with timing headers only, as `shardsim
  // bench --shape-only`): one schedule code, so the simulated time equals the real-data run's.
  cs.shape_only = !run;
  verification::CaseRunner runner(tp, cs);
  runner.prepare();
  tl.reset();
  const auto r = runner.execute(0.0);
  sim_ns = r.span.end;
  tp.allreduce(std::span<double>(&sim_ns, 1), runtime::Reduce::max, "sweep time");
  row["algorithm_used"] = r.algorithm;
  if (run) {
    const auto o = runner.check_local();
    unsigned long long total = o.wrong;
    tp.allreduce(std::span<unsigned long long>(&total, 1), runtime::Reduce::sum, "sweep check");
    row["timing"] = "run";
    row["wrong"] = std::to_string(total);
    row["verdict"] = total ? "fail" : "pass";
    row["validated_at"] = "self";
    if (total) row["reason"] = std::to_string(total) + " wrong elements; first: " + o.first_wrong;
  } else {
    row["timing"] = "shape_only";
    row["verdict"] = "not_validated";
    row["reason"] = "size " + size_label(bytes) + " > validate_max_bytes " +
                    size_label(static_cast<size_t>(spec.validate_max_bytes)) +
                    ": shape-only run (the schedule moved timing headers only), not checked";
  }
  row["sim_time_us"] = fmt(sim_ns / 1e3);
  if (sim_ns > 0) {
    const double algbw = static_cast<double>(bytes) / sim_ns;  // bytes/ns = GB/s (1e9)
    row["algbw_gbps"] = fmt(algbw);
    row["busbw_gbps"] = fmt(algbw * verification::busbw_factor(c, p));
  }
  row["comm_us"] = row["sim_time_us"];
  return row;
}

// --what-if: each change's speedup (baseline / re-simulated) in its column (what_if_column).
void add_what_if(Row& row, const std::vector<reporting::WhatIf>& rows) {
  for (const auto& w : rows) row[what_if_column(w.change)] = fmt(w.speedup);
}

// Every change of SPEC through RUN (SPEC -> the what-if rows); when they fail together, each change alone, so a
// change the point cannot take marks only its own column ("error: REASON") and never the row or the others.
void what_if_by_change(Row& row, const std::string& spec, const std::function<std::vector<reporting::WhatIf>(const std::string&)>& run) {
  const auto changes = what_if_changes(spec);
  if (changes.size() > 1) {
    try {
      add_what_if(row, run(spec));
      return;
    } catch (const AgreedError&) {  // one of them: find which, below
    }
  }
  for (const auto& c : changes) {
    try {
      add_what_if(row, run(c));
    } catch (const AgreedError& e) {
      row[what_if_column(c)] = std::string("error: ") + e.what();
    }
  }
}

// One workload point through the one executor in its command's mode (forward for a `run` config, training for a
// `train` config); the row's columns from its report (reporting/report.h): the simulated forward or step as
// sim_time_us with the critical chip's split, tokens/s, MFU, the chip's memory (the mode's memory model) against
// the device's HBM, the pipeline's bubble and micro-batches, the validation against one device.
Row run_workload_point(const runtime::World& sw, const SweepPoint& pt, const SweepSpec& spec, const ExecutorRunner& exec) {
  Row row = base_row(pt);
  ExecutorRun run;
  run.where = spec.file + "[" + pt.key + "]";
  if (!exec) return failed(row, "internal: no executor for " + run.where);
  run.config_yaml = pt.config_yaml;
  run.train = pt.train;
  // Validate once: the plan was validated by a smaller real-data run (apps/sweep.cpp merges its verdict); the
  // full-size point runs the same program in shape-only mode.
  const bool separately = validated_separately(pt, spec);
  run.shape_only = separately;
  run.validate = !separately && !pt.shape_only;
  reporting::RunReport r;
  bool what_if_failed = false;  // the run with every change failed: the baseline alone, then change by change
  for (const bool with_what_if : {true, false}) {
    if (!with_what_if && (!what_if_failed || spec.what_if.empty())) break;
    try {
      run.what_if = with_what_if ? spec.what_if : "";
      r = exec(sw, run);
      break;
    } catch (const AgreedError& e) {
      if (with_what_if && !spec.what_if.empty()) {
        what_if_failed = true;
        continue;
      }
      std::string why = e.what();  // "FILE[KEY]:LINE: msg": the line is in the generated config
      if (why.rfind(run.where + ":", 0) == 0)
        if (const auto colon = why.find(": ", run.where.size()); colon != std::string::npos) why = why.substr(colon + 2);
      return failed(row, "plan does not fit: " + why);
    }
  }
  const auto& t = r.train;
  row["timing"] = separately || pt.shape_only ? "shape_only" : "run";
  row["sim_time_us"] = fmt(r.critical.total / 1e3);
  fill_breakdown(row, r);
  row["tokens_per_step"] = fmt(t.tokens_per_step);
  row["mfu"] = fmt(t.mfu);
  row["peak_mem_bytes"] = fmt(t.memory.chip_bytes());
  row["hbm_capacity_bytes"] = fmt(r.hbm_capacity_bytes);
  row["fits_hbm"] = reporting::fits_hbm(r) ? "yes" : "no";  // with the device's HBM reserve
  row["bubble_fraction"] = fmt(t.has_pipeline ? t.pipeline.bubble_fraction : 0.0);
  row["micro_batches"] = std::to_string(t.has_pipeline ? t.pipeline.m : pt.micro_batches);
  // A block stack's forward compares its output rows (relative error); otherwise the loss.
  const double error = t.rows_validated ? r.relative_error : t.max_loss_error;
  if (r.validated) {
    row["max_rel_error"] = fmt(error);
    row["validated_at"] = "self";
  }
  if (separately) row["validated_at"] = pt.validation_dims;  // verdict: apply_validation on rank 0
  row["verdict"] = !r.validated ? "not_validated" : r.passed ? "pass" : "fail";
  if (r.validated && !r.passed)
    row["reason"] = t.rows_validated ? "relative error " + fmt(error) + " of the output rows above tolerance " +
                                           fmt(r.tolerance) + ", or loss error " + fmt(t.max_loss_error) +
                                           " above " + t.loss_limit_rule
                                     : "loss error " + fmt(t.max_loss_error) + " above " + t.loss_limit_rule;
  if (!what_if_failed) add_what_if(row, r.what_if);
  else  // the what-if re-runs the point per change; a change the point cannot take marks only its column
    what_if_by_change(row, spec.what_if, [&](const std::string& s) {
      ExecutorRun again = run;
      again.validate = false;
      again.what_if = s;
      return exec(sw, again).what_if;
    });
  return row;
}

// One serve point (SweepPoint::serve) through serve's runner: the run's metrics as the row's serve columns
// (shape-only, not validated: the serving mode's real-data checks are tests/mpi/serve_decode_test.cpp's).
Row run_serve_point(const runtime::World& sw, const SweepPoint& pt, const SweepSpec& spec, const ServeRunner& serve) {
  Row row = base_row(pt);
  const std::string where = spec.file + "[" + pt.key + "]";
  if (!serve) return failed(row, "internal: no serve runner for " + where);
  std::map<std::string, double> m;
  try {
    m = serve(sw, pt.config_yaml, where);
  } catch (const AgreedError& e) {
    std::string why = e.what();  // "FILE[KEY]:LINE: msg": the line is in the generated config
    if (why.rfind(where + ":", 0) == 0)
      if (const auto colon = why.find(": ", where.size()); colon != std::string::npos) why = why.substr(colon + 2);
    return failed(row, "plan does not fit: " + why);
  }
  for (const auto& [k, v] : m) row[k] = fmt(v);
  row["timing"] = "shape_only";
  row["verdict"] = "not_validated";
  return row;
}

Row run_point_impl(const runtime::World& sw, const SweepPoint& pt, const SweepSpec& spec, int world_size,
                   const PointRunners& runners) {
  const auto t0 = std::chrono::steady_clock::now();
  Row row = pt.kind == PointKind::collective ? run_collective(sw, pt, spec, world_size)
            : pt.serve                       ? run_serve_point(sw, pt, spec, runners.serve)
                                             : run_workload_point(sw, pt, spec, runners.executor);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  row["wall_s"] = fmt(group_max(wall, sw));
  return row;
}

std::string row_to_text(const Row& r) { return nlohmann::json(r).dump(); }
Row row_from_text(const std::string& s) { return nlohmann::json::parse(s).get<Row>(); }

// Gathers one string per rank (empty for ranks with nothing) to rank 0 of WORLD (MPI_Gatherv, or the chip router's
// variable-length gather with several chips per rank).
std::vector<std::string> gather_strings(const std::string& mine, const runtime::World& world) {
  if (world.vcomm()) {
    const auto parts = runtime::chips::gather(*world.vcomm(), mine.data(), mine.size(), 0, "sweep gather");
    std::vector<std::string> out;
    for (const auto& p : parts) out.emplace_back(p.begin(), p.end());
    return out;
  }
  const int n = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(world.size()));
  runtime::check_mpi(MPI_Gather(&n, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, world.comm()), world.rank(), "sweep gather");
  std::vector<int> displs(lens.size());
  int total = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    displs[i] = total;
    total += lens[i];
  }
  std::string all(static_cast<size_t>(world.rank() == 0 ? total : 0), '\0');
  runtime::check_mpi(MPI_Gatherv(mine.data(), n, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0,
                                 world.comm()),
                     world.rank(), "sweep gather");
  std::vector<std::string> out;
  if (world.rank() == 0)
    for (size_t i = 0; i < lens.size(); ++i) out.push_back(all.substr(static_cast<size_t>(displs[i]), static_cast<size_t>(lens[i])));
  return out;
}

// The groups of one chip count: WORLD's ranks with equal COLOR (>= 0) form a group, ordered by rank; a rank with a
// negative color joins none (idle). One chip per rank: MPI_Comm_split of WORLD's communicator (freed with the
// group). Several chips per rank: a chip-level split of WORLD's communicator (runtime/chip_split.h), so a group's
// chips may sit on one rank or on several, and the rank's chips run their groups' points side by side as fibers.
class Group {
 public:
  Group(const runtime::World& world, int color) {
    if (world.vcomm()) {
      auto vc = runtime::chips::split(*world.vcomm(), color < 0 ? -1 : color, world.rank(), "sweep split");
      if (color >= 0) world_.emplace(std::move(vc));
      return;
    }
    runtime::check_mpi(MPI_Comm_split(world.comm(), color < 0 ? MPI_UNDEFINED : color, world.rank(), &comm_),
                       world.rank(), "sweep split");
    if (comm_ != MPI_COMM_NULL) world_.emplace(comm_);
  }
  ~Group() {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  // This rank's group, or null when it idles.
  const runtime::World* world() const { return world_ ? &*world_ : nullptr; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::optional<runtime::World> world_;
};

}  // namespace

Row run_point(const runtime::World& sw, const SweepPoint& pt, const SweepSpec& spec, int world_size,
              const PointRunners& runners) {
  return run_point_impl(sw, pt, spec, world_size, runners);
}

Row apply_validation(Row row, const Row* v) {
  if (row["verdict"] == "error") return row;  // the full-size point itself could not run (e.g. out of HBM)
  const std::string at = row["validated_at"];
  const std::string vv = v ? v->at("verdict") : "";
  if (vv == "pass" || vv == "fail") {
    row["verdict"] = vv;
    row["max_rel_error"] = v->at("max_rel_error");
    if (vv == "fail") row["reason"] = "the plan failed validation at " + at + ": " + v->at("reason");
    return row;
  }
  row["validated_at"] = "";
  row["verdict"] = "not_validated";
  row["reason"] = !v                ? "internal: no validation run for this plan"
                  : vv == "error"   ? "the plan's validation run at " + at + " could not run: " + v->at("reason")
                                    : "the workload's validation is disabled (validate.enabled: false)";
  return row;
}

std::vector<SweepPoint> validation_points(const SweepSpec& spec, const std::vector<size_t>& todo) {
  std::vector<SweepPoint> out;
  std::map<std::string, size_t> seen;
  for (size_t i : todo) {
    const SweepPoint& p = spec.points.at(i);
    if (!validated_separately(p, spec) || seen.count(p.validation_key)) continue;
    seen[p.validation_key] = out.size();
    SweepPoint v = p;
    v.index = static_cast<int>(out.size());
    v.key = p.validation_key;
    v.config_yaml = p.validation_config_yaml;
    v.validation_config_yaml.clear();
    v.validation_key.clear();
    v.plan = p.plan + " @" + p.validation_dims;  // progress lines
    out.push_back(std::move(v));
  }
  return out;
}

namespace {

// The `ranks` column: the chips of group COLOR of K chips ("3" for one chip, "0-7").
std::string ranks_label(int color, int k) {
  return k == 1 ? std::to_string(color) : std::to_string(color * k) + "-" + std::to_string(color * k + k - 1);
}

// GroupCallbacks::launch: the points one at a time, each on the chips LAUNCH starts for it.
void run_launched(const runtime::World& world, const SweepSpec& spec,
                  const std::map<int, std::vector<size_t>>& by_chips, const GroupCallbacks& cb) {
  const bool root = world.rank() == 0;
  for (const auto& [k, list] : by_chips) {
    const int groups = cb.launch_chips / k;
    if (root && cb.on_chips) cb.on_chips(k, list.size(), groups);
    for (size_t j = 0; j < list.size(); ++j) {
      const SweepPoint& pt = spec.points[list[j]];
      if (root && cb.on_wave) cb.on_wave({list[j]});
      Row r = cb.launch(k, pt, [&](const runtime::World& sw) { return run_point(sw, pt, spec, k, cb.runners); });
      r["ranks"] = ranks_label(static_cast<int>(j % static_cast<size_t>(groups)), k);
      world.agree([&] {
        if (root && cb.on_rows) cb.on_rows({r});
      });
    }
  }
}

}  // namespace

void run_in_groups(const runtime::World& world, const SweepSpec& spec,
                   const std::map<int, std::vector<size_t>>& by_chips, const GroupCallbacks& cb) {
  if (cb.launch) return run_launched(world, spec, by_chips, cb);
  const bool root = world.rank() == 0;
  const int N = world.size();
  for (const auto& [k, list] : by_chips) {
    const int groups = N / k;
    const int color = world.rank() < groups * k ? world.rank() / k : -1;
    const Group group(world, color);
    if (root && cb.on_chips) cb.on_chips(k, list.size(), groups);
    const size_t waves = (list.size() + static_cast<size_t>(groups) - 1) / static_cast<size_t>(groups);
    for (size_t w = 0; w < waves; ++w) {
      if (root && cb.on_wave) {
        std::vector<size_t> wave;
        for (int g = 0; g < groups; ++g) {
          const size_t j = w * static_cast<size_t>(groups) + static_cast<size_t>(g);
          if (j >= list.size()) break;
          wave.push_back(list[j]);
        }
        cb.on_wave(wave);
      }
      std::string mine;
      if (const runtime::World* sw = group.world()) {
        const size_t j = w * static_cast<size_t>(groups) + static_cast<size_t>(color);
        if (j < list.size()) {
          Row r = run_point(*sw, spec.points[list[j]], spec, N, cb.runners);
          r["ranks"] = ranks_label(color, k);
          if (sw->rank() == 0) mine = row_to_text(r);
        }
      }
      world.sleepy_barrier();  // idle ranks and finished groups sleep instead of spinning in the gather
      const auto texts = gather_strings(mine, world);
      world.agree([&] {
        if (!root) return;
        std::vector<Row> rows;
        for (const auto& t : texts)
          if (!t.empty()) rows.push_back(row_from_text(t));
        if (cb.on_rows) cb.on_rows(rows);
      });
    }
  }

}

}  // namespace shardsim::experiments
