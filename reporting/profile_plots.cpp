#include "reporting/profile_plots.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <stdexcept>

#include "common/error.h"
#include "common/gnuplot.h"
#include "common/input_file.h"
#include "common/output_file.h"
#include "common/text.h"

namespace shardsim::reporting {

namespace fs = std::filesystem;
using sim::TimeNs;

double Roof::attainable_tflops(double intensity) const { return std::min(peak_tflops, intensity * hbm_gbps / 1e3); }

Roofline roofline(const std::vector<sim::ChipEvents>& chips, const Roof& roof) {
  if (!(roof.peak_tflops > 0) || !(roof.hbm_gbps > 0))
    throw std::invalid_argument("roofline: the device's peak and HBM bandwidth must be positive");
  Roofline r;
  r.roof = roof;
  std::map<std::string, RooflinePoint> by_op;
  for (const auto& ce : chips)
    for (const auto& e : ce.events) {
      if (e.category != "compute") continue;
      if (!(e.flops > 0) || !(e.bytes > 0)) {
        ++r.unplaced_calls;
        continue;
      }
      auto& p = by_op[sim::op_family(e.name)];
      p.calls += 1;
      p.flops += e.flops;
      p.bytes += e.bytes;
      p.time += e.span.end - e.span.start;
    }
  for (auto& [op, p] : by_op) {
    p.op = op;
    r.points.push_back(p);
  }
  std::stable_sort(r.points.begin(), r.points.end(),
                   [](const RooflinePoint& a, const RooflinePoint& b) { return a.time > b.time; });
  return r;
}

namespace {

using Interval = std::pair<TimeNs, TimeNs>;

// Sorted, disjoint union of IV.
std::vector<Interval> merged(std::vector<Interval> iv) {
  std::sort(iv.begin(), iv.end());
  std::vector<Interval> out;
  for (const auto& x : iv) {
    if (x.second <= x.first) continue;
    if (!out.empty() && x.first <= out.back().second)
      out.back().second = std::max(out.back().second, x.second);
    else
      out.push_back(x);
  }
  return out;
}

// Adds each interval's overlap with every bin (width W, COUNT bins from 0) to ACC[bin], in ns.
void spread(const std::vector<Interval>& iv, double w, std::vector<double>& acc) {
  const auto n = static_cast<long>(acc.size());
  for (const auto& [a, b] : iv) {
    long i = std::clamp(static_cast<long>(double(a) / w), 0L, n - 1);
    for (; i < n && double(i) * w < double(b); ++i) {
      const double lo = std::max(double(a), double(i) * w), hi = std::min(double(b), double(i + 1) * w);
      if (hi > lo) acc[size_t(i)] += hi - lo;
    }
  }
}

}  // namespace

std::vector<UtilisationBin> utilisation(const std::vector<sim::ChipEvents>& chips, TimeNs end, int bins) {
  if (end <= 0 || bins < 1 || chips.empty()) return {};
  const double w = double(end) / bins;
  const auto n = static_cast<size_t>(bins);
  std::vector<double> compute(n), hbm(n), link(n), busy(n);
  for (const auto& ce : chips) {
    std::vector<Interval> c, h, l, any;
    for (const auto& e : ce.events) {
      const Interval x{e.span.start, e.span.end};
      if (e.category == "compute") {
        (e.bound == sim::Bound::hbm ? h : c).push_back(x);
        any.push_back(x);
      } else if (e.category == "send") {
        l.push_back(x);
        any.push_back(x);
      }
    }
    spread(merged(std::move(c)), w, compute);
    spread(merged(std::move(h)), w, hbm);
    spread(merged(std::move(l)), w, link);
    spread(merged(std::move(any)), w, busy);
  }
  std::vector<UtilisationBin> out(n);
  const double chip_time = w * double(chips.size());
  for (size_t i = 0; i < out.size(); ++i) {
    auto& b = out[i];
    b.from = static_cast<TimeNs>(std::llround(double(i) * w));
    b.to = i + 1 == out.size() ? end : static_cast<TimeNs>(std::llround(double(i + 1) * w));
    b.compute = compute[i] / chip_time;
    b.hbm = hbm[i] / chip_time;
    b.link = link[i] / chip_time;
    b.idle = std::max(0.0, 1.0 - busy[i] / chip_time);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> check_plots_dir(const std::string& dir) {
  if (dir.empty()) return {};
  std::error_code ec;
  const auto st = fs::status(dir, ec);
  if (fs::exists(st) && !fs::is_directory(st))
    throw UsageError("--plots " + escape_control(dir) + ": exists and is not a directory");
  // Created and checked before any work, as the sweep's output folder (a name too long or a parent that is a file
  // used to be found after the run, exit 3).
  if (const std::string why = make_output_dir(dir); !why.empty())
    throw UsageError("--plots " + escape_control(dir) + ": the directory cannot be created: " + why);
  if (::access(dir.c_str(), W_OK) != 0)
    throw UsageError("--plots " + escape_control(dir) + ": the directory is not writable: " + std::strerror(errno));
  std::vector<std::pair<std::string, std::string>> files;
  for (const char* name : {"roofline.dat", "roofline.gp", "roofline.png", "utilisation.dat", "utilisation.gp",
                           "utilisation.png"})
    files.emplace_back("--plots " + dir + " (" + name + ")", (fs::path(dir) / name).string());
  return files;
}

namespace {

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

constexpr size_t kMaxPngBytes = size_t{64} << 20;  // a 960x600 PNG is tens of KiB
const char* kTerm = "set terminal pngcairo size 960,600 noenhanced font ',10'\n";

std::string roofline_dat(const Roofline& r) {
  std::string s = "# shardsim roofline: op calls intensity_flop_per_byte achieved_tflops time_us attainable_tflops "
                  "label label_x label_y\n";
  s += "# roof: peak_tflops " + num(r.roof.peak_tflops) + " hbm_gbps " + num(r.roof.hbm_gbps) + " ridge " +
       num(r.roof.ridge()) + "\n";
  // Points that share a label carry "" (nothing drawn); the label's row carries every name and its placed position.
  std::vector<const RooflineLabel*> at(r.points.size(), nullptr);
  const auto labels = roofline_labels(r);
  for (const auto& l : labels) at[l.point] = &l;
  for (size_t i = 0; i < r.points.size(); ++i) {
    const auto& p = r.points[i];
    const RooflineLabel* l = at[i];
    s += gp_data_string(p.op) + " " + std::to_string(p.calls) + " " + num(p.intensity()) + " " +
         num(p.achieved_tflops()) + " " + num(double(p.time) / 1e3) + " " +
         num(r.roof.attainable_tflops(p.intensity())) + " " + gp_data_string(l ? l->text : "") + " " +
         num(l ? l->x : p.intensity()) + " " + num(l ? l->y : p.achieved_tflops()) + "\n";
  }
  return s;
}

std::string roofline_gp(const std::string& title, const Roofline& r) {
  const RooflineRange g = roofline_range(r);
  const std::string peak = num(r.roof.peak_tflops), bw = num(r.roof.hbm_gbps / 1e3);
  return std::string("# gnuplot script written by shardsim; redraw with: gnuplot roofline.gp (in this directory)\n") +
         kTerm + "set output 'roofline.png'\nset title " +
         gp_quote("roofline (simulated): " + title + "; ridge " + num(r.roof.ridge()) + " FLOP/byte") +
         "\nset logscale xy 10\nset xlabel 'arithmetic intensity (FLOP per HBM byte)'\n"
         "set ylabel 'achieved TFLOP/s (simulated)'\nset grid\nset key bottom right\n"
         "set xrange [" + num(g.x_lo) + ":" + num(g.x_hi) + "]\nset yrange [" + num(g.y_lo) + ":" + num(g.y_hi) + "]\n"
         "roof(x) = (x * " + bw + " < " + peak + ") ? x * " + bw + " : " + peak + "\nset samples 400\n"
         "plot roof(x) with lines lw 2 lc rgb 'black' title 'roof: min(peak, I x HBM bandwidth)', \\\n"
         "     'roofline.dat' using 3:4 with points pt 7 ps 1.5 lc 1 title 'kernel families', \\\n"
         "     'roofline.dat' using 8:9:7 with labels left font ',8' notitle\n";
}

std::string utilisation_dat(const std::vector<UtilisationBin>& bins) {
  std::string s = "# shardsim utilisation: from_us to_us compute hbm link idle (fractions of chip-time)\n";
  for (const auto& b : bins)
    s += num(double(b.from) / 1e3) + " " + num(double(b.to) / 1e3) + " " + num(b.compute) + " " + num(b.hbm) + " " +
         num(b.link) + " " + num(b.idle) + "\n";
  return s;
}

std::string utilisation_gp(const std::string& title) {
  return std::string("# gnuplot script written by shardsim; redraw with: gnuplot utilisation.gp (in this directory)\n") +
         kTerm + "set output 'utilisation.png'\nset title " + gp_quote("utilisation over time (simulated): " + title) +
         "\nset xlabel 'simulated time (us)'\nset ylabel 'fraction of chip-time (mean over chips)'\n"
         "set yrange [0:1.05]\nset grid\nset key outside right\n"
         "plot 'utilisation.dat' using (($1+$2)/2):3 with steps lw 2 title 'compute-bound kernels', \\\n"
         "     '' using (($1+$2)/2):4 with steps lw 2 title 'HBM-bound kernels', \\\n"
         "     '' using (($1+$2)/2):5 with steps lw 2 title 'links sending', \\\n"
         "     '' using (($1+$2)/2):6 with steps lw 2 dt 2 title 'idle'\n";
}

}  // namespace

std::string write_profile_plots(const std::string& dir, const std::string& title, const Roofline& r,
                                const std::vector<UtilisationBin>& bins, std::vector<std::string>* pngs) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw RuntimeFault("cannot create --plots directory " + dir + ": " + ec.message());
  const std::vector<std::pair<std::string, std::string>> files = {{"roofline.dat", roofline_dat(r)},
                                                                  {"roofline.gp", roofline_gp(title, r)},
                                                                  {"utilisation.dat", utilisation_dat(bins)},
                                                                  {"utilisation.gp", utilisation_gp(title)}};
  for (const auto& [name, text] : files) write_file_atomic((fs::path(dir) / name).string(), text);
  // gnuplot writes its PNG in place (it opens the name it is given, following a planted symlink), so it draws in
  // a fresh private directory (mkdtemp, mode 0700) and each PNG is renamed into DIR: a reader sees the old PNG or
  // the new one, and no name in DIR is ever opened by gnuplot.
  std::string tmpl = (fs::path(dir) / ".plots.XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw RuntimeFault("cannot create a temporary directory in " + dir + ": " + std::strerror(errno));
  const fs::path tmp = tmpl;
  std::string err;
  try {
    for (const auto& [name, text] : files) write_file_atomic((tmp / name).string(), text);
    std::vector<std::string> drawn;
    err = draw_gnuplot_scripts(tmp.string(), {"roofline.gp", "utilisation.gp"}, &drawn);
    if (err.empty())
      for (const auto& png : drawn) {  // landed as every output (a symlink's target is written, never replaced)
        const fs::path to = fs::path(dir) / fs::path(png).filename();
        write_file_atomic(to.string(), read_input_file(png, kMaxPngBytes, "a plot gnuplot drew"));
        pngs->push_back(to.string());
      }
    else if (err.rfind("gnuplot not found", 0) == 0)
      err = "gnuplot not found ('" + gnuplot_program() + "'; apt-get install gnuplot-nox): the plots were not drawn; "
            "their data and scripts are in " + dir;
    else  // its log is in a private directory about to be removed: say how to see it
      err = "gnuplot failed: the plots were not drawn; their data and scripts are in " + dir +
            " (run gnuplot roofline.gp there to see why)";
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  fs::remove_all(tmp, ec);
  return err;
}

RooflineRange roofline_range(const Roofline& r) {
  RooflineRange g{r.roof.ridge() / 100, r.roof.ridge() * 100, r.roof.peak_tflops / 4, r.roof.peak_tflops * 4};
  for (const auto& p : r.points) {
    g.x_lo = std::min(g.x_lo, p.intensity() / 4);
    g.x_hi = std::max(g.x_hi, p.intensity() * 4);
    g.y_lo = std::min(g.y_lo, p.achieved_tflops() / 4);
    g.y_hi = std::max(g.y_hi, p.achieved_tflops() * 4);
  }
  return g;
}

std::vector<RooflineLabel> roofline_labels(const Roofline& r) {
  // The plot area of a 960x600 px pngcairo plot with axis labels and a title (about), an 8 pt font's character
  // width and line height: estimates, enough to keep labels apart.
  constexpr double kWidthPx = 820, kHeightPx = 480, kCharPx = 5.5, kLinePx = 12, kMarkerPx = 7;
  const RooflineRange g = roofline_range(r);
  const double xs = kWidthPx / std::log10(g.x_hi / g.x_lo), ys = kHeightPx / std::log10(g.y_hi / g.y_lo);
  const auto px = [&](double x) { return std::log10(x / g.x_lo) * xs; };
  const auto py = [&](double y) { return std::log10(y / g.y_lo) * ys; };
  struct Box {
    double x0, x1, y0, y1;
  };
  std::vector<Box> placed;
  std::vector<RooflineLabel> out;
  std::vector<bool> taken(r.points.size(), false);
  for (size_t i = 0; i < r.points.size(); ++i) {
    if (taken[i]) continue;
    const double x = px(r.points[i].intensity()), y = py(r.points[i].achieved_tflops());
    std::vector<std::string> names{r.points[i].op};
    for (size_t j = i + 1; j < r.points.size(); ++j)
      if (!taken[j] && std::fabs(px(r.points[j].intensity()) - x) < kMarkerPx &&
          std::fabs(py(r.points[j].achieved_tflops()) - y) < kMarkerPx) {
        taken[j] = true;
        names.push_back(r.points[j].op);
      }
    std::string text;
    for (size_t k = 0; k < names.size() && k < 3; ++k) text += (k ? ", " : "") + names[k];
    if (names.size() > 3) text += " +" + std::to_string(names.size() - 3) + " more";
    const double w = kCharPx * static_cast<double>(text.size());
    const double x0 = x + kMarkerPx + 2;
    double best = y + kLinePx / 2;
    for (int k = 0; k <= 40; ++k) {  // 0, +1, -1, +2, -2, ... lines
      const double cy = y + kLinePx / 2 + kLinePx * (k % 2 ? (k + 1) / 2 : -(k / 2));
      const bool clear = std::none_of(placed.begin(), placed.end(), [&](const Box& b) {
        return x0 < b.x1 && b.x0 < x0 + w && cy - kLinePx / 2 < b.y1 && b.y0 < cy + kLinePx / 2;
      });
      if (clear) {
        best = cy;
        break;
      }
    }
    placed.push_back({x0, x0 + w, best - kLinePx / 2, best + kLinePx / 2});
    out.push_back({i, text, g.x_lo * std::pow(10.0, x0 / xs), g.y_lo * std::pow(10.0, best / ys)});
  }
  return out;
}

}  // namespace shardsim::reporting
