// `shardsim sweep SWEEP.yaml`: runs every point of a sweep grid (experiments/sweep.h) in one MPI launch.
//
// Points run on groups of ranks side by side (experiments/scheduler.h: run_point, run_in_groups, the group
// scheduler); after each wave rank 0 lands results.csv again with the new rows (temporary + fsync + rename per
// row, common/output_file.h: the file is always complete, and an interrupted sweep loses only the running wave).
// At the end rank 0 rewrites results.csv in grid order, writes results.json and draws the plots with gnuplot.
// This file: the command line, resuming, the CSV/JSON files, progress and the plots.
//
// Exit codes: 0 every point passed or was timed shape-only (points that cannot run, e.g. an inapplicable
// algorithm or more chips than the launch has, are recorded with verdict `error` and do not change it);
// 1 some point failed validation; 2 bad input (sweep file, flags, an unreadable results file); 3 runtime fault,
// or --plot-only when gnuplot is missing or fails (a full sweep only warns: its CSV/JSON are the product).
//
// Environment: SHARDSIM_GNUPLOT=PATH runs that gnuplot (default: `gnuplot` on the PATH). Test hook:
// SHARDSIM_SWEEP_POINT_DELAY_MS=N makes rank 0 sleep N ms after each wave, so tests/e2e/sweep.sh can kill a
// sweep mid-way reliably.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "apps/cli_common.h"
#include "apps/commands.h"
#include "apps/profile.h"
#include "collectives/algorithms.h"
#include "verification/verify.h"
#include "common/config.h"
#include "common/error.h"
#include "common/gnuplot.h"
#include "common/dir_lock.h"
#include "common/input_file.h"
#include "common/output_file.h"
#include "common/text.h"
#include "experiments/sweep.h"
#include "experiments/scheduler.h"
#include "runtime/chips.h"
#include "runtime/host_memory.h"
#include "sharding/engine_config.h"
#include "sim/device_spec.h"
#include "topology/topology_yaml.h"

namespace shardsim::apps {

namespace {

namespace fs = std::filesystem;
using experiments::Row;
using experiments::SweepPoint;
using experiments::SweepSpec;

// set_sweep_point_launch (apps/commands.h): the launch's chips and the most one rank may host unfolded; 0: the
// points run on groups of the chips the launch started.
int g_launch_chips = 0, g_max_unfolded = 0;

struct SweepFlags {
  std::string file, output, what_if, export_kind;
  bool force = false, plot_only = false, no_plots = false, validate_every = false;
};

// results.csv as read for a resume or --plot-only: a regular file (a FIFO cannot block, a directory is said as
// such) of at most kMaxResultsBytes.
constexpr uint64_t kMaxResultsBytes = 1ull << 30;
std::string read_text(const std::string& path) { return read_input_file(path, kMaxResultsBytes, "a sweep results file"); }

// Writes the gnuplot scripts and runs gnuplot. Returns "" or what went wrong. PNGS gets the files drawn.
std::string draw(const std::string& dir, const std::vector<Row>& rows, std::vector<std::string>* pngs) {
  const auto scripts = experiments::write_plot_scripts(dir, rows);
  if (scripts.empty()) return "";
  return draw_gnuplot_scripts(dir, scripts, pngs);
}

class Progress {
 public:
  Progress(int total, int done) : total_(total), done_(done), start_done_(done), tty_(::isatty(2) == 1) {}
  void show(const std::string& current) {
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    const int ran = done_ - start_done_, left = total_ - done_;
    std::string eta = "--:--";
    if (ran > 0) {
      const int s = static_cast<int>(el / ran * left + 0.5);
      char b[32];
      std::snprintf(b, sizeof b, "%d:%02d", s / 60, s % 60);
      eta = b;
    }
    char head[96];
    std::snprintf(head, sizeof head, "[%d/%d] %5.1f%% ETA %s", done_, total_, total_ ? 100.0 * done_ / total_ : 100.0,
                  eta.c_str());
    if (tty_) {
      const int width = 20, fill = total_ ? width * done_ / total_ : width;
      std::fprintf(stderr, "\r%s [%s%s] %s\033[K", head, std::string(static_cast<size_t>(fill), '#').c_str(),
                   std::string(static_cast<size_t>(width - fill), '.').c_str(), current.c_str());
    } else {
      std::fprintf(stderr, "%s  %s\n", head, current.c_str());
    }
    std::fflush(stderr);
  }
  void advance(int n) { done_ += n; }
  // Points recorded without running (they cannot run): done, but not part of the rate the ETA uses.
  void recorded(int n) {
    done_ += n;
    start_done_ += n;
  }
  // One line per finished point on stderr: its verdict, simulated time and wall time (a long sweep is never
  // silent between the wave lines).
  void finished(const std::string& point, const Row& r, const std::string& note = "") {
    const auto get = [&](const char* c) {
      const auto it = r.find(c);
      return it == r.end() || it->second.empty() ? std::string("-") : it->second;
    };
    const auto num = [&](const char* c, const char* f) {
      const std::string v = get(c);
      if (v == "-") return v;
      char b[64];
      std::snprintf(b, sizeof b, f, std::strtod(v.c_str(), nullptr));
      return std::string(b);
    };
    const std::string sim = num("sim_time_us", "%.3f us simulated"), wall = num("wall_s", "%.2f s wall");
    std::fprintf(stderr, "%s[%d/%d] done %s: %s, %s, %s%s%s\n", tty_ ? "\r\033[K" : "", done_, total_, point.c_str(),
                 get("verdict").c_str(), sim.c_str(), wall.c_str(), note.empty() ? "" : "; ",
                 escape_control(note).c_str());
    std::fflush(stderr);
  }
  void finish() {
    if (tty_) std::fprintf(stderr, "\n");
  }

 private:
  int total_, done_, start_done_;
  bool tty_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

// The sweep file as F asks for it (its `output:` and `validate:` overridden by the flags). With several chips per
// rank the rank's chips share one copy (they are fibers of one thread: no locking): every workload point holds
// its parsed run config, topology included, so a copy per chip would cost O(chips) per chip. A load that failed
// fails every chip of the rank with the same error.
std::shared_ptr<const SweepSpec> load_spec(const SweepFlags& f) {
  auto load = [&] {
    auto spec = std::make_shared<SweepSpec>(experiments::load_sweep(f.file));
    if (!f.output.empty()) spec->output = f.output;
    if (f.validate_every) spec->validate_every = true;
    spec->what_if = f.what_if;
    if (!f.what_if.empty())  // every change must apply to every workload point: exit 2 before anything runs
      for (const auto& p : spec->points)
        if (p.kind == experiments::PointKind::workload && p.error.empty())
          (void)plan_what_if(f.what_if, sharding::workload_config_from_text(p.config_yaml, f.file + "[" + p.key + "]"));
    return std::shared_ptr<const SweepSpec>(std::move(spec));
  };
  if (!runtime::chip_mode()) return load();
  struct Entry {
    std::shared_ptr<const SweepSpec> spec;
    std::exception_ptr error;
  };
  static std::map<std::string, Entry> memo;  // keyed by what was asked
  const std::string key = f.file + "\n" + f.output + "\n" + (f.validate_every ? "every" : "") + "\n" + f.what_if;
  auto it = memo.find(key);
  if (it == memo.end()) {
    Entry e;
    try {
      e.spec = load();
    } catch (...) {
      e.error = std::current_exception();
    }
    it = memo.emplace(key, std::move(e)).first;
  }
  if (it->second.error) std::rethrow_exception(it->second.error);
  return it->second.spec;
}

// One point on K chips started for it alone (GroupCallbacks::launch; one MPI rank): a training point folds where
// `train` would fold the same run (train_point_fold; fold: auto falls back to every chip as `train` does), every
// other point runs on all K chips. NOTE gets how it ran, for the progress line. A point that cannot be simulated
// here (it does not fold and needs more chips or host memory than one rank has) is a row with verdict error.
Row launch_point(int k, const SweepPoint& pt, const SweepSpec& spec, const std::function<Row(const runtime::World&)>& run,
                 std::string& note) {
  const std::string where = spec.file + "[" + pt.key + "]";
  FoldDecision d;
  if (pt.kind == experiments::PointKind::workload && pt.train)
    d = train_point_fold(pt.config_yaml, where, k, !pt.shape_only, spec.what_if);
  Row row;
  const auto body = [&](const runtime::World& w) {
    Row r = run(w);
    if (w.rank() == 0) row = std::move(r);
    return 0;
  };
  int code = runtime::kFoldFellBack;
  std::string why = d.why_not;
  if (d.spec.on()) {
    runtime::FoldSpec fold = d.spec;
    fold.fallback = true;  // a break ends the attempt, not the sweep
    code = runtime::run_chips(k, body, fold);
    const int ran = fold.chips / fold.size * fold.period;
    if (code != runtime::kFoldFellBack)
      note = "folded: " + std::to_string(ran) + " of " + std::to_string(k) + " chips simulated";
    else
      why = "fold: " + runtime::chips::fold_fallback_reason();
  }
  // fold: on is a promise not to fall back (as `train` exits 3): the point is an error row naming why, never a
  // silent run on every chip (issue 46, kind 7).
  if (code == runtime::kFoldFellBack && d.on)
    return experiments::failed_row(experiments::base_row(pt),
                                   "fold: on, but this run does not fold (" +
                                       (why.rfind("fold: ", 0) == 0 ? why.substr(6) : why) +
                                       "; fold: auto falls back to every chip)");
  if (code == runtime::kFoldFellBack) {
    if (d.expected || d.spec.on()) note = "every chip simulated: " + why;
    std::string cannot;
    if (k > g_max_unfolded)
      cannot = "does not fold (" + why + ") and needs " + std::to_string(k) + " chips, past the " +
               std::to_string(g_max_unfolded) + " one rank may host unfolded (docs/performance/fold.md)";
    else
      cannot = runtime::host_memory_check(k, g_max_unfolded);
    if (!cannot.empty()) return experiments::failed_row(experiments::base_row(pt), cannot);
    code = runtime::run_chips(k, body);
  }
  if (code != 0 || row.empty())
    return experiments::failed_row(experiments::base_row(pt), "internal: the point's chips ended with code " + std::to_string(code));
  return row;
}

// --plot-only: rank 0 draws the plots of an existing results.csv; the exit code on every rank.
int plot_only(const runtime::World& world, const SweepSpec& spec, const std::string& csv_path) {
  const bool root = world.rank() == 0;
  int code = kExitOk;
  if (root) {
    std::vector<Row> rows;
    try {
      rows = experiments::parse_csv(read_text(csv_path), csv_path);
    } catch (const Error& e) {
      std::fprintf(stderr, "shardsim: error: %s\n", escape_control(e.what()).c_str());
      code = e.exit_code();
    }
    if (code == kExitOk) {
      std::vector<std::string> pngs;
      std::string err;
      try {
        err = draw(spec.output, rows, &pngs);
      } catch (const Error& e) {  // writing a script or its data failed (e.g. a full disk)
        err = e.what();
      }
      if (!err.empty()) {
        std::fprintf(stderr, "shardsim: error: %s\n", escape_control(err).c_str());
        code = kExitRuntimeFault;
      }
      for (const auto& p : pngs) std::printf("plot %s\n", escape_control(p).c_str());
      if (pngs.empty() && err.empty())
        std::printf("sweep %s: nothing to plot in %s\n", spec.name.c_str(), escape_control(csv_path).c_str());
    }
  }
  return std::stoi(world.broadcast(std::to_string(code), 0));
}

// What a sweep run keeps on rank 0: the rows already done (by key), the what-if columns, rows of other grids,
// and the growing results.csv; MASK ('1': point already done) is every rank's.
struct SweepState {
  std::map<std::string, Row> done;
  std::vector<std::string> extra;
  std::vector<Row> foreign;
  std::string mask;
  GrowingOutput out;
  int dropped = 0;
};

// Rank 0: reads results.csv (if any) into ST, marks the points already done (unless --force; validate: every
// re-runs rows validated elsewhere), and rewrites what is kept (dropping a half-written last line).
void resume(const SweepSpec& spec, const SweepFlags& f, const std::string& csv_path, int launch_chips, SweepState& st) {
  std::vector<Row> rows;
  if (fs::exists(csv_path)) rows = experiments::parse_csv(read_text(csv_path), csv_path, &st.dropped);
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < spec.points.size(); ++i) index[spec.points[i].key] = i;
  for (auto& r : rows) {
    const auto it = index.find(r["key"]);
    // validate: every re-runs rows that took their verdict from a smaller validation run (validate once).
    const bool validated_elsewhere = !r["validated_at"].empty() && r["validated_at"] != "self";
    // A point an earlier launch was too small for is not a result: it runs again when this launch has its chips
    // (it was "already in results" forever, the error row kept); a launch still too small keeps the row.
    const bool launch_too_small = it != index.end() && r["verdict"] == "error" &&
                                  r["reason"].rfind("needs ", 0) == 0 &&
                                  r["reason"].find(" chips, the launch has ") != std::string::npos &&
                                  spec.points[it->second].chips <= launch_chips;
    if (it == index.end()) st.foreign.push_back(r);
    else if (!f.force && !launch_too_small && !(spec.validate_every && r["kind"] == "workload" && validated_elsewhere)) {
      st.mask[it->second] = '1';
      st.done[r["key"]] = r;
    }
  }
  // Rewrite what is kept (drops a half-written last line), then append to it.
  st.extra = experiments::what_if_columns(rows, spec.what_if);  // the file's own what-if columns stay
  std::string text = experiments::csv_header(st.extra);
  for (const auto& r : st.foreign) text += experiments::csv_row(r, st.extra);
  for (size_t i = 0; i < spec.points.size(); ++i)
    if (st.mask[i] == '1') text += experiments::csv_row(st.done[spec.points[i].key], st.extra);
  st.out.reset(csv_path, text);
  st.out.land();
}

// The end of a sweep: results.csv and results.json rewritten in grid order, the summary and best-plan table,
// the plots; exit code on every rank (a failed write is exit 3 on every rank with one line).
int finish(const runtime::World& world, const SweepSpec& spec, const SweepFlags& f, Progress& progress,
           SweepState& st, const std::vector<Row>& fresh, int ran, int skipped, const std::string& csv_path,
           const std::string& json_path) {
  const bool root = world.rank() == 0;
  auto& done = st.done;
  const auto& extra = st.extra;
  const auto& foreign = st.foreign;
  int code = kExitOk;
  world.agree([&] {  // a failed write (e.g. a full disk) is exit 3 on every rank with one line
    if (!root) return;
    progress.show("done");
    progress.finish();
    for (const auto& r : fresh) done[r.at("key")] = r;
    std::vector<Row> rows;
    int failed_validation = 0, errors = 0, shape_only = 0, validated_small = 0;
    for (const auto& pt : spec.points) {
      const auto it = done.find(pt.key);
      if (it == done.end()) continue;
      rows.push_back(it->second);
      const auto& v = it->second.at("verdict");
      failed_validation += v == "fail";
      errors += v == "error";
      shape_only += it->second.at("timing") == "shape_only";
      validated_small += !it->second.at("validated_at").empty() && it->second.at("validated_at") != "self";
    }
    std::string text = experiments::csv_header(extra);
    for (const auto& r : rows) text += experiments::csv_row(r, extra);
    for (const auto& r : foreign) text += experiments::csv_row(r, extra);
    write_file_atomic(csv_path, text);
    std::vector<Row> all = rows;
    all.insert(all.end(), foreign.begin(), foreign.end());
    write_file_atomic(json_path, experiments::rows_to_json(spec.name, all));
    const int recorded_now = static_cast<int>(fresh.size()) - ran;
    std::printf("sweep %s: ran %d, skipped %d (already in results), recorded %d without running; "
                "%zu rows: %d failed validation, %d could not run (verdict error), %d timed shape-only (%d of them "
                "with their plan validated at a small size)\n",
                spec.name.c_str(), ran, skipped, recorded_now, rows.size(), failed_validation, errors, shape_only,
                validated_small);
    const auto best = experiments::best_plans(rows);
    std::printf("%s%s", experiments::best_plans_text(best).c_str(), winner_exports(f.export_kind, spec, best).c_str());
    std::printf("results %s\nresults %s\n", escape_control(csv_path).c_str(), escape_control(json_path).c_str());
    if (!f.no_plots) {
      std::vector<std::string> pngs;
      const auto err = draw(spec.output, all, &pngs);
      for (const auto& p : pngs) std::printf("plot %s\n", escape_control(p).c_str());
      if (!err.empty()) std::fprintf(stderr, "shardsim: warning: %s\n", escape_control(err).c_str());
    }
    std::fflush(stdout);
    code = failed_validation ? kExitValidationFailed : kExitOk;
  });
  return std::stoi(world.broadcast(std::to_string(code), 0));
}

// The points to run grouped by chip count (BY_CHIPS); those that cannot run (a refused plan, more chips than the
// launch has) as failed rows for rank 0 to record (CANNOT_RUN).
void group_points(const SweepSpec& spec, const std::string& mask, int N, bool root,
                  std::map<int, std::vector<size_t>>& by_chips, std::vector<Row>& cannot_run) {
  for (size_t i = 0; i < spec.points.size(); ++i) {
    if (mask[i] == '1') continue;
    const auto& pt = spec.points[i];
    std::string why = pt.error;
    if (why.empty() && pt.chips > N)
      why = "needs " + std::to_string(pt.chips) + " chips, the launch has " + std::to_string(N) + " (mpirun -np " +
            std::to_string(pt.chips) + " or more, or --chips " + std::to_string(pt.chips) + " or more)";
    if (why.empty() && pt.chips < 1) why = "no chips";
    if (!why.empty()) {
      if (root) cannot_run.push_back(experiments::failed_row(experiments::base_row(pt), why));
      continue;
    }
    by_chips[pt.chips].push_back(i);
  }
}

// Validate once (experiments/sweep.h): the distinct validation runs the points of BY_CHIPS need, each with real data
// on its shrunk config, on the launch's groups (or chips started per point: LAUNCH_CHIPS > 0 with LAUNCHER, as the
// points run). Returns rank 0's rows by validation key; a validation that does not pass says so on stderr.
template <class Launcher>
std::map<std::string, Row> run_validations(const runtime::World& world, const SweepSpec& spec,
                                           const std::map<int, std::vector<size_t>>& by_chips, Progress& progress,
                                           int launch_chips, const Launcher& launcher) {
  std::map<std::string, Row> validations;  // rank 0: validation key -> its row
  std::vector<size_t> todo;
  for (const auto& [k, list] : by_chips) todo.insert(todo.end(), list.begin(), list.end());
  SweepSpec vspec;
  vspec.file = spec.file;
  vspec.name = spec.name;
  vspec.validate_max_bytes = spec.validate_max_bytes;
  vspec.points = experiments::validation_points(spec, todo);
  if (!vspec.points.empty()) {
    std::map<int, std::vector<size_t>> vby_chips;
    for (size_t i = 0; i < vspec.points.size(); ++i) vby_chips[vspec.points[i].chips].push_back(i);
    if (world.rank() == 0) {
      std::printf("validate once: %zu distinct plan(s) validated with real data at a small size; the full-size "
                  "points run shape-only (validate: every or --validate-every to validate each point)\n",
                  vspec.points.size());
      std::fflush(stdout);
    }
    experiments::GroupCallbacks vcb;
    vcb.runners.executor = run_executor_point;
    if (launch_chips > 0) {
      vcb.launch = launcher(vspec);
      vcb.launch_chips = launch_chips;
    }
    vcb.on_wave = [&](const std::vector<size_t>& wave) {
      std::string cur = "validating " + experiments::point_text(vspec.points[wave.front()]);
      if (wave.size() > 1) cur += " (+" + std::to_string(wave.size() - 1) + " beside it)";
      progress.show(cur);
    };
    vcb.on_rows = [&](const std::vector<Row>& rows) {
      for (const auto& r : rows) {
        validations[r.at("key")] = r;
        const auto& v = r.at("verdict");
        if (v != "pass")
          std::fprintf(stderr, "%svalidation of %s at %s: %s%s%s\n", ::isatty(2) == 1 ? "\n" : "", r.at("plan").c_str(),
                       r.at("topology").c_str(), v.c_str(), r.at("reason").empty() ? "" : ": ", r.at("reason").c_str());
      }
    };
    experiments::run_in_groups(world, vspec, vby_chips, vcb);
  }
  return validations;
}

int run_sweep(const runtime::World& world, const SweepFlags& f) {
  const bool root = world.rank() == 0;
  std::shared_ptr<const SweepSpec> shared_spec;
  std::string csv_path, json_path;
  std::unique_ptr<DirLock> lock;  // rank 0: the output folder is this sweep's until it returns
  world.agree([&] {
    shared_spec = load_spec(f);
    const SweepSpec& spec = *shared_spec;
    if (const std::string why = make_output_dir(spec.output); !why.empty())
      throw UsageError("output directory '" + spec.output + "' cannot be created: " + why);
    if (::access(spec.output.c_str(), W_OK) != 0)
      throw UsageError("output directory '" + spec.output + "' is not writable: " + std::strerror(errno));
    csv_path = (fs::path(spec.output) / "results.csv").string();
    json_path = (fs::path(spec.output) / "results.json").string();
    if (f.plot_only && f.force) throw UsageError("--plot-only and --force contradict each other");
    if (f.plot_only && !fs::exists(csv_path)) throw UsageError("--plot-only: no results file " + csv_path);
    for (const auto& p : {csv_path, json_path})
      if (const std::string why = not_a_regular_file(p); !why.empty()) throw UsageError(p + ": " + why);
    if (world.rank() == 0)
      lock = std::make_unique<DirLock>(spec.output, std::string(f.plot_only ? "sweep --plot-only " : "sweep ") + f.file);
  });
  const SweepSpec& spec = *shared_spec;

  if (f.plot_only) return plot_only(world, spec, csv_path);

  // Resume: rank 0 reads what is already done; every rank learns the mask. N: chips (= ranks with one chip per rank;
  // the launch's chips when each point starts its own).
  const bool launched = g_launch_chips > 0;
  const int N = launched ? g_launch_chips : world.size();
  const size_t P = spec.points.size();
  SweepState st;
  st.mask.assign(P, '0');
  world.agree([&] {
    if (root) resume(spec, f, csv_path, N, st);
  });
  std::string& mask = st.mask;
  const auto& extra = st.extra;
  auto& out = st.out;
  const int dropped = st.dropped;
  mask = world.broadcast(mask, 0);

  int skipped = 0;
  for (char c : mask) skipped += c == '1';
  std::vector<Row> fresh;  // rank 0: rows made by this run
  auto record = [&](const Row& r) {  // rank 0; call inside world.agree so a failed write stops every rank
    out.append(experiments::csv_row(r, extra));
    fresh.push_back(r);
  };
  Progress progress(static_cast<int>(P), skipped);
  const int delay_ms = std::getenv("SHARDSIM_SWEEP_POINT_DELAY_MS") ? std::atoi(std::getenv("SHARDSIM_SWEEP_POINT_DELAY_MS")) : 0;
  const std::string where_chips =
      launched ? " (1 rank(s) x " + std::to_string(N) + " chips, started for each point in turn)"
      : runtime::chips_per_rank() > 1 ? " (" + std::to_string(N / runtime::chips_per_rank()) + " rank(s) x " +
                                            std::to_string(runtime::chips_per_rank()) + " chips)"
                                      : std::string();
  // One MPI rank with chips started per point: how each point ran (folded or not), for its progress line.
  std::map<std::string, std::string> launch_notes;
  const auto launcher = [&launch_notes](const SweepSpec& sp) {
    return [&launch_notes, spp = &sp](int k, const SweepPoint& pt, const std::function<Row(const runtime::World&)>& run) {
      std::string note;
      Row r = launch_point(k, pt, *spp, run, note);
      launch_notes[pt.key] = note;
      return r;
    };
  };
  if (root) {
    std::printf("sweep %s: %zu points, %d already in %s (skipped%s), %zu to run on %d chip(s)%s\n", spec.name.c_str(), P,
                skipped, escape_control(csv_path).c_str(), dropped ? (", " + std::to_string(dropped) + " incomplete line(s) dropped").c_str() : "",
                P - static_cast<size_t>(skipped), N,
                where_chips.c_str());
    std::fflush(stdout);
  }

  // Points that cannot run are recorded at once; the others grouped by chip count.
  std::map<int, std::vector<size_t>> by_chips;
  std::vector<Row> cannot_run;  // rank 0
  group_points(spec, mask, N, root, by_chips, cannot_run);
  world.agree([&] {
    for (const auto& r : cannot_run) {
      record(r);
      progress.recorded(1);
    }
  });
  // Validate once: each distinct plan of the points to run is validated first, with real data on its shrunk
  // config (experiments/sweep.h); the full-size points then run shape-only and take that run's verdict.
  const std::map<std::string, Row> validations =
      run_validations(world, spec, by_chips, progress, launched ? N : 0, launcher);
  std::map<std::string, size_t> point_of;  // rank 0: key -> index in spec.points
  if (root)
    for (size_t i = 0; i < P; ++i) point_of[spec.points[i].key] = i;

  int ran = 0;
  experiments::GroupCallbacks cb;
  if (launched) {
    cb.launch = launcher(spec);
    cb.launch_chips = N;
  }
  cb.on_chips = [&](int k, size_t n, int groups) {
    if (launched)
      std::printf("chips %d: %zu point(s), one at a time on %d chip(s) started for each (one MPI rank: a training "
                  "point folds as `train` folds it)\n", k, n, k);
    else
      std::printf("chips %d: %zu point(s) on %d concurrent group(s) of %d chip(s)%s\n", k, n, groups, k,
                groups * k < N ? (", " + std::to_string(N - groups * k) + " chip(s) idle").c_str() : "");
    std::fflush(stdout);
  };
  cb.on_wave = [&](const std::vector<size_t>& wave) {
    std::string cur = experiments::point_text(spec.points[wave.front()]);
    if (wave.size() > 1) cur += " (+" + std::to_string(wave.size() - 1) + " beside it)";
    progress.show(cur);
  };
  cb.runners.executor = run_executor_point;
  cb.runners.serve = run_serve_point;
  cb.on_rows = [&](const std::vector<Row>& rows) {
    for (const auto& r0 : rows) {
      Row r = r0;
      const auto& pt = spec.points[point_of.at(r.at("key"))];
      if (experiments::validated_separately(pt, spec)) {
        const auto v = validations.find(pt.validation_key);
        r = experiments::apply_validation(std::move(r), v == validations.end() ? nullptr : &v->second);
      }
      record(r);
      progress.advance(1);
      ++ran;
      const auto note = launch_notes.find(pt.key);
      progress.finished(experiments::point_text(pt), r, note == launch_notes.end() ? "" : note->second);
    }
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));  // test hook
  };
  experiments::run_in_groups(world, spec, by_chips, cb);

  return finish(world, spec, f, progress, st, fresh, ran, skipped, csv_path, json_path);
}

}  // namespace

void set_sweep_point_launch(int chips, int max_unfolded) {
  g_launch_chips = chips;
  g_max_unfolded = max_unfolded;
}

Command add_sweep(CLI::App& app, const runtime::World& world) {
  auto* sub = app.add_subcommand("sweep", "run a grid of topologies x collectives x sizes and workloads x plans; "
                                          "results as CSV/JSON and gnuplot PNGs (resumable)");
  auto f = std::make_shared<SweepFlags>();
  sub->add_option("sweep", f->file, "sweep YAML (see configs/sweeps/)")->required();
  sub->add_option("--output", f->output, "output directory (overrides the file's `output:`)");
  sub->add_flag("--force", f->force, "recompute every point (default: skip points already in results.csv)");
  sub->add_flag("--plot-only", f->plot_only, "redraw the plots from the existing results.csv; run nothing");
  sub->add_flag("--no-plots", f->no_plots, "do not draw plots");
  sub->add_option("--what-if", f->what_if,
                  "per workload point, re-simulate each change (shape-only) and add its speedup as a column "
                  "speedup[CHANGE], e.g. link_bw=2x,hbm_bw=2x,peak=2x (docs/PROFILE.md; training points use "
                  "train's --what-if)");
  sub->add_flag("--validate-every", f->validate_every,
                "validate every workload point with real data at full size (the file's `validate: every`; default "
                "`once`: each distinct plan validated at a small size, full-size points timed shape-only)");
  sub->add_option("--export", f->export_kind,
                  "after the best-plan table, print each training group's winner as Megatron-LM launch arguments "
                  "(megatron) or a torchtitan TOML (torchtitan; docs/IMPORT.md)")
      ->check(CLI::IsMember({"megatron", "torchtitan"}));
  return {sub, [f, &world] { return run_sweep(world, *f); }};
}

}  // namespace shardsim::apps
