// Sweep plots: gnuplot scripts and their data files written from result rows (experiments/sweep.h).
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include "collectives/registry.h"
#include "common/gnuplot.h"
#include "common/output_file.h"
#include "experiments/sweep.h"

namespace shardsim::experiments {

namespace fs = std::filesystem;

namespace {
// Plot scripts never interpret text from configs or results files: common/gnuplot.h (gp_quote, gp_data_string).
// Collective names from a results file are plotted only when they are names this program knows.
bool known_collective(const std::string& name) {
  try {
    (void)collectives::parse_collective(name);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}
std::string file_safe(const std::string& s) {
  std::string o;
  for (char c : s) o += std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' ? c : '_';
  return o;
}
void write(const fs::path& p, const std::string& text) { write_file_atomic(p.string(), text); }
bool has_number(const Row& r, const std::string& c) {
  const auto it = r.find(c);
  return it != r.end() && !it->second.empty();
}
double num(const Row& r, const std::string& c) { return has_number(r, c) ? std::strtod(r.at(c).c_str(), nullptr) : 0.0; }
// Training plans (run_mode train): train.gp, the simulated step (ms, bars, left axis) and the pipeline bubble
// (% of the step, points, right axis) per plan that ran; plans over HBM keep their bar, labelled "(over HBM)"; plans
// that could not run are left out (the best-plan table lists them with the reason). "" when no training plan ran.
std::string write_train_plot(const std::string& dir, const std::vector<Row>& rows) {
  std::set<std::string> workloads, topos, devs;
  for (const auto& r : rows)
    if (r.at("kind") == "workload" && r.at("run_mode") == "train") {
      workloads.insert(r.at("workload"));
      topos.insert(r.at("topology"));
      devs.insert(r.at("device"));
    }
  std::string dat = "# label step_ms bubble_percent (simulated)\n";
  int n = 0;
  for (const auto& r : rows) {
    if (r.at("kind") != "workload" || r.at("run_mode") != "train" || !has_number(r, "sim_time_us")) continue;
    std::string label = (workloads.size() > 1 ? r.at("workload") + " " : "") + r.at("plan") +
                        (topos.size() > 1 ? " " + r.at("topology") : "") + (devs.size() > 1 ? " " + r.at("device") : "") +
                        (r.at("fits_hbm") == "no" ? " (over HBM)" : "");
    char b[96];
    std::snprintf(b, sizeof b, " %.6f %.6f\n", num(r, "sim_time_us") / 1e3, 100 * num(r, "bubble_fraction"));
    dat += gp_data_string(label) + b;
    ++n;
  }
  if (n == 0) return "";
  char term[128];  // wide enough for one readable label per bar
  std::snprintf(term, sizeof term, "set terminal pngcairo size %d,820 noenhanced font ',10'\n", std::max(960, 26 * n + 240));
  write(fs::path(dir) / "train.dat", dat);
  write(fs::path(dir) / "train.gp",
        "# gnuplot script written by shardsim sweep; redraw with: gnuplot train.gp (in this directory)\n" +
            std::string(term) +
            "set output 'train.png'\nset title " +
            gp_quote("training step and pipeline bubble per plan" +
                     (workloads.size() == 1 ? ": " + *workloads.begin() : std::string(" (per workload)"))) +
            "\n"
            "set style fill solid 0.85 border -1\nset boxwidth 0.75\nset xtics rotate by 90 right scale 0 font ',8'\n"
            "set ylabel 'simulated step (ms)'\nset y2label 'pipeline bubble (% of the step)'\nset y2tics\n"
            "set ytics nomirror\nset yrange [0:*]\nset y2range [0:100]\nset key outside top center horizontal\n"
            "set grid ytics\nset bmargin 26\n"
            "plot 'train.dat' using 0:2:xtic(1) with boxes title 'step (ms)', "
            "'' using 0:3 axes x1y2 with points pt 7 ps 1.2 lc rgb 'black' title 'bubble (%)'\n");
  return "train.gp";
}

// Serve points (run_mode serve): serve_latency.gp, TTFT (log scale) and TPOT p50 (solid) and p99 (dashed) against
// the request rate, one colour per series (the workload, plan, batching, topology and device that vary). "" when
// no serve point ran.
std::string write_serve_plot(const std::string& dir, const std::vector<Row>& rows) {
  std::map<std::string, std::set<std::string>> vary;
  for (const auto& r : rows)
    if (r.at("kind") == "workload" && r.at("run_mode") == "serve" && has_number(r, "ttft_p50_ms"))
      for (const char* c : {"workload", "plan", "batching", "topology", "device"}) vary[c].insert(r.at(c));
  if (vary.empty()) return "";
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::vector<double>>> series;
  for (const auto& r : rows) {
    if (r.at("kind") != "workload" || r.at("run_mode") != "serve" || !has_number(r, "ttft_p50_ms")) continue;
    std::string label;
    for (const char* c : {"workload", "plan", "batching", "topology", "device"})
      if (vary[c].size() > 1) label += (label.empty() ? "" : " ") + r.at(c);
    if (label.empty()) label = r.at("workload") + " " + r.at("plan");
    if (!series.count(label)) order.push_back(label);
    series[label].push_back({num(r, "rate"), num(r, "ttft_p50_ms"), num(r, "ttft_p99_ms"), num(r, "tpot_p50_ms"),
                             num(r, "tpot_p99_ms")});
  }
  std::string dat, ttft, tpot;
  for (size_t i = 0; i < order.size(); ++i) {
    auto pts = series[order[i]];
    std::sort(pts.begin(), pts.end());
    dat += gp_data_string(order[i]) + " ttft_p50_ms ttft_p99_ms tpot_p50_ms tpot_p99_ms\n";
    for (const auto& v : pts) {
      char b[160];
      std::snprintf(b, sizeof b, "%.9g %.9g %.9g %.9g %.9g\n", v[0], v[1], v[2], v[3], v[4]);
      dat += b;
    }
    dat += "\n\n";
    const std::string idx = "'serve_latency.dat' index " + std::to_string(i), lc = " lc " + std::to_string(i + 1);
    for (const auto& [out, col] : {std::pair{&ttft, 2}, std::pair{&tpot, 4}}) {
      *out += std::string(i ? ", \\\n     " : "plot ") + idx + " using 1:" + std::to_string(col) +
              " with linespoints lw 2 dt 1 pt 7" + lc + " title columnheader(1)";
      *out += ", \\\n     " + idx + " using 1:" + std::to_string(col + 1) + " with linespoints lw 2 dt 2 pt 6" + lc +
              " notitle";
    }
  }
  write(fs::path(dir) / "serve_latency.dat", dat);
  write(fs::path(dir) / "serve_latency.gp",
        "# gnuplot script written by shardsim sweep; redraw with: gnuplot serve_latency.gp (in this directory)\n"
        "set terminal pngcairo size 1200,520 noenhanced font ',10'\nset output 'serve_latency.png'\n"
        "set multiplot layout 1,2 title " +
            gp_quote("serving latency against the request rate (simulated; solid p50, dashed p99)") +
            "\nset xlabel 'request rate (requests/s)'\nset grid\nset key top left opaque\n"
            "set logscale y\nset ylabel 'TTFT (ms)'\n" + ttft +
            "\nunset logscale y\nset yrange [0:*]\nset ylabel 'TPOT (ms)'\n" + tpot + "\nunset multiplot\n");
  return "serve_latency.gp";
}
}  // namespace

std::vector<std::string> write_plot_scripts(const std::string& dir, const std::vector<Row>& rows) {
  std::vector<std::string> scripts;
  const std::string term = "set terminal pngcairo size 960,600 noenhanced font ',10'\n";
  // busbw vs size, one plot per collective.
  std::vector<std::string> colls;
  for (const auto& r : rows)
    if (r.at("kind") == "collective" && has_number(r, "busbw_gbps") && known_collective(r.at("collective")) &&
        std::find(colls.begin(), colls.end(), r.at("collective")) == colls.end())
      colls.push_back(r.at("collective"));
  for (const auto& c : colls) {
    std::set<std::string> dtypes, devices;
    for (const auto& r : rows)
      if (r.at("collective") == c && has_number(r, "busbw_gbps")) {
        dtypes.insert(r.at("dtype"));
        devices.insert(r.at("device"));
      }
    std::vector<std::string> order, topos, algs;
    std::map<std::string, std::vector<std::pair<double, double>>> series;
    std::map<std::string, std::pair<size_t, size_t>> style;  // colour by topology, dash type by algorithm
    auto index_of = [](std::vector<std::string>& v, const std::string& x) {
      const auto it = std::find(v.begin(), v.end(), x);
      if (it != v.end()) return static_cast<size_t>(it - v.begin());
      v.push_back(x);
      return v.size() - 1;
    };
    for (const auto& r : rows) {
      if (r.at("kind") != "collective" || r.at("collective") != c || !has_number(r, "busbw_gbps")) continue;
      std::string label = r.at("topology") + " " + r.at("algorithm");
      if (dtypes.size() > 1) label += " " + r.at("dtype");
      if (devices.size() > 1) label += " " + r.at("device");
      if (!series.count(label)) {
        order.push_back(label);
        style[label] = {index_of(topos, r.at("topology")), index_of(algs, r.at("algorithm"))};
      }
      series[label].emplace_back(num(r, "size_bytes"), num(r, "busbw_gbps"));
    }
    std::string dat, plot;
    for (size_t i = 0; i < order.size(); ++i) {
      auto pts = series[order[i]];
      std::sort(pts.begin(), pts.end());
      dat += gp_data_string(order[i]) + " busbw_gbps\n";  // the block's column headers: its title
      for (const auto& [x, y] : pts) {
        char b[64];
        std::snprintf(b, sizeof b, "%.0f %.9g\n", x, y);
        dat += b;
      }
      dat += "\n\n";
      plot += std::string(i ? ", \\\n     " : "plot ") + "'busbw_" + file_safe(c) + ".dat' index " + std::to_string(i) +
              " using 1:2 with linespoints lw 2 lc " + std::to_string(style[order[i]].first + 1) + " dt " +
              std::to_string(style[order[i]].second % 5 + 1) + " pt " + std::to_string(style[order[i]].second + 1) +
              " title columnheader(1)";
    }
    const std::string base = "busbw_" + file_safe(c);
    write(fs::path(dir) / (base + ".dat"), dat);
    write(fs::path(dir) / (base + ".gp"),
          "# gnuplot script written by shardsim sweep; redraw with: gnuplot " + base + ".gp (in this directory)\n" + term +
              "set output '" + base + ".png'\n" + "set title " +
              gp_quote(c + ": simulated bus bandwidth vs message size (GB = 1e9 B)") + "\n" +
              "set logscale x 2\nset format x '%.0b%B'\nset xlabel 'message size per rank (bytes)'\n"
              "set ylabel 'busbw (GB/s, simulated)'\nset key top left\nset grid\nset yrange [0:*]\n" +
              plot + "\n");
    scripts.push_back(base + ".gp");
  }
  // Workload breakdown: stacked bars.
  std::string dat;
  int n = 0;
  std::set<std::string> workloads, devs;
  for (const auto& r : rows)
    if (r.at("kind") == "workload" && r.at("run_mode") != "serve" && has_number(r, "sim_time_us")) {
      workloads.insert(r.at("workload"));
      devs.insert(r.at("device"));
    }
  for (const auto& r : rows) {
    if (r.at("kind") != "workload" || r.at("run_mode") == "serve") continue;  // serve points: serve_latency.gp
    // A point that could not run (e.g. a plan that cannot fill the chips) stays on the plot as an empty bar
    // labelled "(skipped)", so the grid's gaps are visible; the reason is in the CSV and the best-plan table.
    const bool ran = has_number(r, "sim_time_us");
    const double total = ran ? num(r, "sim_time_us") : 0, comp = ran ? num(r, "compute_us") : 0,
                 exp = ran ? num(r, "exposed_comm_us") : 0;
    // Only the axes that vary go into the bar labels.
    std::string label = (workloads.size() > 1 ? r.at("workload") + " " : "") + r.at("plan") + " " + r.at("topology") +
                        (devs.size() > 1 ? " " + r.at("device") : "") + (ran ? "" : " (skipped)");
    const std::string q = gp_data_string(label);
    char b[160];
    std::snprintf(b, sizeof b, " %.6f %.6f %.6f\n", comp, exp, std::max(0.0, total - comp - exp));
    dat += q + b;
    ++n;
  }
  if (!workloads.empty() && n > 0) {
    write(fs::path(dir) / "breakdown.dat", "# label compute_us exposed_comm_us idle_us (simulated)\n" + dat);
    write(fs::path(dir) / "breakdown.gp",
          "# gnuplot script written by shardsim sweep; redraw with: gnuplot breakdown.gp (in this directory)\n" + term +
              "set output 'breakdown.png'\nset title " +
              gp_quote("simulated time per plan and topology" +
                       (workloads.size() == 1 ? ": " + *workloads.begin() : std::string(" (per workload)"))) +
              "\n"
              "set style data histograms\nset style histogram rowstacked\nset style fill solid 0.85 border -1\n"
              "set boxwidth 0.75\nset xtics rotate by 45 right scale 0\nset ylabel 'simulated time (us)'\n"
              "set key outside top center horizontal\nset grid ytics\nset yrange [0:*]\n"
              "set bmargin 10\n"
              "plot 'breakdown.dat' using 2:xtic(1) title 'compute', '' using 3 title 'exposed communication', "
              "'' using 4 title 'idle'\n");
    scripts.push_back("breakdown.gp");
  }
  if (const std::string gp = write_train_plot(dir, rows); !gp.empty()) scripts.push_back(gp);
  if (const std::string gp = write_serve_plot(dir, rows); !gp.empty()) scripts.push_back(gp);
  return scripts;
}

}  // namespace shardsim::experiments