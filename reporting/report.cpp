#include "reporting/report.h"

#include "reporting/profile.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <sstream>

#include <mpi.h>

#include "common/text.h"
#include "runtime/chips.h"


namespace shardsim::reporting {

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

// The spread of the chips' simulated totals, "  chip totals        LO .. HI (load balance LO/HI)"; "" without chips.
std::string chip_totals_line(const RunReport& r) {
  if (r.per_chip.empty()) return "";
  double lo = r.per_chip[0].breakdown.total, hi = lo;
  for (const auto& c : r.per_chip) {
    lo = std::min(lo, c.breakdown.total);
    hi = std::max(hi, c.breakdown.total);
  }
  std::ostringstream os;
  os << "  chip totals        " << fmt_ns(lo) << " .. " << fmt_ns(hi) << " (load balance " << (hi > 0 ? lo / hi : 1.0)
     << ")\n";
  return os.str();
}

std::string pct(double part, double whole) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%5.1f%%", whole > 0 ? 100.0 * part / whole : 0.0);
  return buf;
}
}  // namespace

namespace {
double wall_now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Progress::Progress(std::string what, bool enabled) : what_(std::move(what)), enabled_(enabled), start_s_(wall_now_s()) {}

double Progress::elapsed_s() const { return wall_now_s() - start_s_; }

void Progress::update(int64_t done, int64_t total, const char* unit) {
  if (!enabled_ || done >= total) return;  // the last unit: the report follows
  const double now = elapsed_s();
  if (now < kFirstS || (last_print_s_ >= 0 && now - last_print_s_ < kEveryS)) return;
  last_print_s_ = now;
  const double left = done > 0 ? now / double(done) * double(total - done) : 0;
  std::fprintf(stderr, "shardsim: %s: %lld of %lld %s done, %.0f s elapsed, about %.0f s left (wall)\n",
               what_.c_str(), (long long)done, (long long)total, unit, now, left);
  std::fflush(stderr);
}

std::string format_mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

namespace {
double op_tflops(const OpStat& o) { return o.time_ns > 0 ? o.flops / o.time_ns / 1e3 : 0; }
}  // namespace

std::string ops_text(const std::vector<OpStat>& ops, double total_ns, double peak) {
  if (ops.empty()) return "";
  std::ostringstream os;
  char buf[320];
  os << "time by op (critical chip; kernels: simulated TFLOP/s and % of the chip's peak)\n";
  for (const auto& o : ops) {
    const std::string name = o.name.size() > 34 ? o.name.substr(0, 31) + "..." : o.name;
    if (o.kind == "kernel") {
      std::snprintf(buf, sizeof buf, "  %-10s %-34s %4d x %14s %s  %9.2f TFLOP/s %5.1f%% of peak\n", o.kind.c_str(),
                    name.c_str(), o.calls, fmt_ns(o.time_ns).c_str(), pct(o.time_ns, total_ns).c_str(), op_tflops(o),
                    peak > 0 ? 100.0 * op_tflops(o) / peak : 0.0);
    } else {
      std::snprintf(buf, sizeof buf, "  %-10s %-34s %4d x %14s %s  %s\n", o.kind.c_str(), name.c_str(), o.calls,
                    fmt_ns(o.time_ns).c_str(), pct(o.time_ns, total_ns).c_str(),
                    o.bytes > 0 ? format_mib(o.bytes).c_str() : "");
    }
    os << buf;
  }
  return os.str();
}

nlohmann::json ops_json(const std::vector<OpStat>& ops, double total_ns, double peak) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& o : ops) {
    nlohmann::json r = {{"name", o.name},       {"kind", o.kind},   {"calls", o.calls},
                        {"time_ns", o.time_ns}, {"flops", o.flops}, {"bytes", o.bytes},
                        {"fraction_of_total", total_ns > 0 ? o.time_ns / total_ns : 0.0}};
    if (o.kind == "kernel") {
      r["tflops"] = op_tflops(o);
      r["peak_fraction"] = peak > 0 ? op_tflops(o) / peak : 0.0;
    }
    a.push_back(r);
  }
  return a;
}

double TrainMemory::total() const {
  double t = 0;
  for (const auto& row : rows) t += row.bytes;
  return t;
}
double TrainMemory::formula_total() const {
  double t = 0;
  for (const auto& row : rows) t += row.formula;
  return t;
}

bool fits_hbm(const RunReport& r) {
  return r.train.memory.chip_bytes() <= r.hbm_capacity_bytes - r.hbm_reserve_bytes;  // DeviceSpec::usable_hbm_bytes
}

namespace {
// NaN (a shape-only step computes no loss) is JSON null.
nlohmann::json number_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }


nlohmann::json train_json(const RunReport& r) {
  const TrainReport& t = r.train;
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& st : t.steps)
    steps.push_back({{"step", st.step},
                     {"loss", number_or_null(st.loss)},
                     {"grad_norm", number_or_null(st.grad_norm)},
                     {"total_ns", st.breakdown.total},
                     {"compute_ns", st.breakdown.compute},
                     {"communication_ns", st.breakdown.communication},
                     {"exposed_comm_ns", st.breakdown.exposed_comm},
                     {"bubble_ns", st.bubble_ns},
                     {"idle_ns", st.idle_ns()}});
  nlohmann::json saved = nlohmann::json::array();
  for (const auto& [step, path] : t.saved) saved.push_back({{"step", step}, {"path", path}});
  nlohmann::json j = {{"model", t.model},
                      {"data", t.data},
                      {"steps", steps},
                      {"step_ns", t.step_ns},
                      {"tokens_per_step", t.tokens_per_step},
                      {"tokens_per_s", r.tokens_per_s},
                      {"model_flops_per_step", t.model_flops_per_step},
                      {"mfu", t.mfu},
                      {"kernel_flops_per_step", t.kernel_flops_per_step},
                      {"hfu", t.hfu},
                      {"checkpoints", saved},
                      {"resumed_from", t.resumed_from},
                      {"resumed_step", t.resumed_step}};
  if (t.forward) {
    j["forward"] = true;
    if (r.validated) j["reference_loss"] = number_or_null(t.reference_loss);
    j["rows_validated"] = t.rows_validated;  // the validation section's errors are then the output rows'
  }
  if (t.has_memory) {
    nlohmann::json m = {{"basis", t.memory.basis}};
    for (const auto& row : t.memory.rows)
      m[row.what == "optimizer state" ? "optimizer" : row.what] = {
          {"bytes", row.bytes}, {"formula_bytes", row.formula}, {"formula", row.rule}};
    m["total_bytes"] = t.memory.total();
    m["formula_total_bytes"] = t.memory.formula_total();
    m["activations_bytes"] = t.memory.activations;
    m["chip_bytes"] = t.memory.chip_bytes();
    m["hbm_capacity_bytes"] = r.hbm_capacity_bytes;
    m["hbm_reserve_bytes"] = r.hbm_reserve_bytes;
    m["fits"] = fits_hbm(r);
    j["memory_per_chip"] = m;
  }
  if (t.has_pipeline) {
    const TrainPipeline& p = t.pipeline;
    nlohmann::json stages = nlohmann::json::array();
    for (const auto& st : p.stages)
      stages.push_back({{"busy_ns", st.busy_ns}, {"bubble_ns", st.bubble_ns}, {"bubble_fraction", st.bubble_fraction},
                        {"peak_activation_bytes", st.peak_activation_bytes},
                        {"peak_microbatches", st.peak_microbatches}, {"bytes_to_next_stage", st.bytes_forward},
                        {"bytes_to_previous_stage", st.bytes_backward},
                        {"peak_pending_w_bytes", st.peak_pending_w_bytes}});
    j["pipeline"] = {{"schedule", p.schedule}, {"pp", p.p}, {"micro_batches", p.m}, {"virtual_stages", p.v},
                     {"pipeline_ns", p.pipeline_ns}, {"bubble_fraction", p.bubble_fraction},
                     {"closed_form_bubble_fraction", p.closed_form}, {"closed_form", p.closed_form_rule},
                     {"stages", stages}};
  }
  if (t.has_moe) {
    const TrainMoe& m = t.moe;
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& l : m.layers)
      layers.push_back({{"layer", l.layer}, {"max_tokens_per_expert", l.max_tokens},
                        {"mean_tokens_per_expert", l.mean_tokens}, {"received_rows", l.received_rows},
                        {"aux_loss", l.aux}, {"dispatch_bytes", l.dispatch_bytes},
                        {"dispatch_closed_form_bytes", l.dispatch_closed_form}, {"dispatch_ns", l.dispatch_ns},
                        {"dispatch_buffer_bytes", l.buffer_bytes}, {"slowest_expert_ns", l.expert_ns},
                        {"balanced_expert_ns", l.balanced_expert_ns}, {"imbalance_ns", l.imbalance_ns()},
                        {"busiest_link", l.busiest_link}, {"busiest_link_bytes", l.link_bytes},
                        {"busiest_link_bound_ns", l.link_bound_ns},
                        {"remote_nodes_per_token", l.remote_nodes_per_token}});
    j["moe"] = {{"spec", m.spec}, {"total_params", m.total_params}, {"active_params", m.active_params},
                {"expert_params_chip", m.expert_params_chip}, {"expert_state_bytes", m.expert_state_bytes},
                {"expert_state_rule", m.expert_state_rule}, {"layers", layers}};
  }
  return j;
}
}  // namespace

// The MoE section of the text report (TrainMoe).
static std::string moe_text(const TrainMoe& m) {
  std::ostringstream os;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "mixture of experts (%s)\n  parameters         %.4g total, %.4g active per token (the MFU line counts "
                "the active: 6 x active + attention per token)\n  expert state       %.0f expert weights on chip 0, "
                "%.0f bytes (%s)\n",
                m.spec.c_str(), m.total_params, m.active_params, m.expert_params_chip, m.expert_state_bytes,
                m.expert_state_rule.c_str());
  os << buf;
  os << "  layer  tokens/expert max     mean  max/mean  rows_recv        aux  dispatch_B  closed_form_B  dispatch_us"
        "   buffers_B  expert_us  balanced_us  imbalance      link_B  link_us  busiest link\n";
  for (const auto& l : m.layers) {
    std::snprintf(buf, sizeof buf,
                  "  %5lld  %17.0f  %7.1f  %8.3f  %9.0f  %9.4g  %10.0f  %13.0f  %11.3f  %10.0f  %9.3f  %11.3f  %8.1f%%"
                  "  %10.0f  %7.3f  %s\n",
                  (long long)l.layer, l.max_tokens, l.mean_tokens, l.mean_tokens > 0 ? l.max_tokens / l.mean_tokens : 0,
                  l.received_rows, l.aux, l.dispatch_bytes, l.dispatch_closed_form, l.dispatch_ns / 1e3,
                  l.buffer_bytes, l.expert_ns / 1e3, l.balanced_expert_ns / 1e3,
                  l.balanced_expert_ns > 0 && std::fabs(l.imbalance_ns()) > 1e-6 * l.balanced_expert_ns
                      ? 100.0 * l.imbalance_ns() / l.balanced_expert_ns : 0.0,
                  l.link_bytes, l.link_bound_ns / 1e3, l.busiest_link.empty() ? "-" : l.busiest_link.c_str());
    os << buf;
  }
  os << "  (every MoE layer, from the ep group of its stage's chips at tp, cp, dp coordinate 0, their last micro-batch: "
        "tokens summed over the group; rows_recv, dispatch, buffers and expert_us its busiest chip's; balanced_us: "
        "the group's rows spread evenly over the experts; imbalance: expert_us over it; buffers: the permuted, "
        "received and combined rows kept for the backward; link_B: the bytes of every dispatch flow of the group on "
        "the link they keep busy longest, link_us those bytes at that link's bandwidth: a lower bound of dispatch_us)\n";
  double reach = 0, limited = 0;
  for (const auto& l : m.layers)
    if (l.remote_nodes_per_token >= 0) reach += l.remote_nodes_per_token, ++limited;
  if (limited > 0) {
    std::snprintf(buf, sizeof buf,
                  "  node-limited routing: %.3f remote expert groups (nodes) per token, the mean over %.0f MoE layers "
                  "(groups holding none of the chip's experts that a token's kept experts lie in, the ep group's mean; "
                  "shape-only: from the declared loads, DeepSeek-V3's M per token at most)\n", reach / limited, limited);
    os << buf;
  }
  return os.str();
}

std::string train_head_text(const RunReport& r) {
  const TrainReport& t = r.train;
  std::ostringstream os;
  os << (t.forward ? "shardsim run" : "shardsim train") << (r.name.empty() ? "" : ": " + escape_control(r.name))
     << "  (" << escape_control(r.config_file) << ")"
     << (t.forward ? "  forward mode of the executor (one forward, no update)" : "") << "\n";
  os << "  topology   " << r.topology << "\n";
  os << "  device     " << r.device << "\n";
  os << "  model      " << t.model << "\n";
  os << "  plan       " << r.plan << "\n";
  if (!r.mesh.empty()) os << "  mesh       " << r.mesh << "\n";
  os << "  data       " << t.data << "\n";
  if (r.shape_only)
    os << "  mode       shape-only (storage-less tensors, cost-only kernels, collectives move timing headers only: "
          "the simulated fields are those of a real-data run; no values, no losses: NOT VALIDATED)\n";
  if (!t.resumed_from.empty())
    os << "resumed: " << escape_control(t.resumed_from) << " at step " << t.resumed_step << " (saved under "
       << escape_control(t.resumed_mesh) << ")\n";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%6s %10s %10s %14s %12s %12s %10s%s\n", "step", "loss", "grad_norm",
                t.forward ? "sim_fwd_us" : "sim_step_us", "compute_us", "exposed_us", "idle_us",
                t.pipelined ? "  bubble_us" : "");
  return escape_lines(os.str()) + buf;  // the checkpoint's attributes and paths are untrusted text
}

std::string train_step_text(const RunReport& r, const TrainStep& st) {
  char loss[32] = "-", gn[32] = "-", buf[200];
  if (!r.shape_only) std::snprintf(loss, sizeof loss, "%.4f", st.loss);
  if (!r.shape_only && !r.train.forward) std::snprintf(gn, sizeof gn, "%.4f", st.grad_norm);  // no gradient in a forward
  const auto& b = st.breakdown;
  const int n = std::snprintf(buf, sizeof buf, "%6lld %10s %10s %14.3f %12.3f %12.3f %10.3f", (long long)st.step, loss,
                              gn, b.total / 1e3, b.compute / 1e3, b.exposed_comm / 1e3, st.idle_ns() / 1e3);
  if (r.train.pipelined && n > 0) std::snprintf(buf + n, sizeof buf - size_t(n), " %10.3f", st.bubble_ns / 1e3);
  return std::string(buf) + "\n";
}

std::string train_saved_text(int64_t step, const std::string& path) {
  return "checkpoint: step " + std::to_string(step) + " saved to " + escape_control(path) + "\n";
}

// " (log vocab = X)": the loss of a uniform guess, for scale; nothing for a block stack (no vocabulary).
static std::string log_vocab_text(const TrainReport& t) {
  if (!std::isfinite(t.log_vocab)) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, " (log vocab = %.4f)", t.log_vocab);
  return buf;
}

namespace {
// The critical chip's per-collective table (the plan's collectives; the MLP's one all_reduce has its own line),
// fused ops and time per op: both modes' text.
std::string plan_tables_text(const RunReport& r) {
  std::ostringstream os;
  if (r.all_reduce_algorithm.empty() && !r.comm.empty()) {
    os << "communication per chip (bytes sent; formulas in sharding/plans/tensor_parallel.h and beside each unit)\n";
    for (const auto& [k, c] : r.comm)
      os << "  " << k << std::string(20 - std::min<size_t>(19, k.size()), ' ') << format_mib(c.bytes) << " in "
         << c.calls << " call(s)" << (c.algorithm.empty() ? "" : " (" + c.algorithm + ")") << ", formula "
         << format_mib(c.expected) << "\n";
  }
  os << fused_text(r.fused, r.critical.total);
  os << ops_text(r.ops, r.critical.total, r.peak_tflops_per_chip);
  return os.str();
}
}  // namespace

std::string train_tail_text(const RunReport& r) {
  const TrainReport& t = r.train;
  std::ostringstream os;
  char buf[400];
  if (t.steps.empty()) {
    os << "loss: no step ran\n";
  } else if (r.shape_only) {
    os << "loss: not computed (shape-only) over " << t.steps.size() << (t.forward ? " forward\n" : " steps\n");
  } else if (t.forward) {
    std::snprintf(buf, sizeof buf, "loss: %.4f, the forward of step %lld's batch", t.steps.front().loss,
                  (long long)t.steps.front().step);
    os << buf << log_vocab_text(t) << "\n";
  } else {
    std::snprintf(buf, sizeof buf, "loss: %.4f -> %.4f over %zu steps", t.steps.front().loss, t.steps.back().loss,
                  t.steps.size());
    os << buf << log_vocab_text(t) << "\n";
  }
  const auto& b = r.critical;
  os << "simulated (modelled hardware; " << (t.forward ? "the forward" : "the last step")
     << " of the critical chip, chip " << r.critical_chip << ": the one that ends last)\n";
  os << (t.forward ? "  forward time       " : "  step time          ") << fmt_ns(b.total) << "\n";
  os << "  compute            " << fmt_ns(b.compute) << "  " << pct(b.compute, b.total) << "\n";
  if (t.step_split) {
    os << "  communication      " << fmt_ns(b.communication) << "  " << pct(b.communication, b.total) << "  ("
       << fmt_ns(std::max(0.0, b.communication - b.exposed_comm)) << " hidden under compute)\n";
    os << "  exposed comm       " << fmt_ns(b.exposed_comm) << "  " << pct(b.exposed_comm, b.total) << "\n";
    if (t.pipelined)
      os << "  pipeline bubble    " << fmt_ns(r.bubble_ns) << "  " << pct(r.bubble_ns, b.total)
         << "  (waiting on the neighbouring stages: their pp receives, the transfer included)\n";
    const double idle = std::max(0.0, b.total - b.compute - b.exposed_comm - r.bubble_ns);
    os << "  idle               " << fmt_ns(idle) << "  " << pct(idle, b.total) << "\n";
  }
  std::snprintf(buf, sizeof buf, "  tokens/s           %.4g (simulated; %.0f tokens per step)\n", r.tokens_per_s,
                t.tokens_per_step);
  os << buf;
  std::snprintf(buf, sizeof buf,
                "  MFU                %.4f%% of %d x %.1f TFLOP/s %s peak (model FLOPs per %s %.6g: %s per token, "
                "causal)\n",
                100.0 * t.mfu, r.chips, r.peak_tflops_per_chip, r.dtype.c_str(), t.forward ? "forward" : "step",
                t.model_flops_per_step, t.forward ? "2N + 2*L*H*d*(s+1)" : "6N + 6*L*H*d*(s+1)");
  os << buf;
  if (t.kernel_flops_per_step > 0) {
    std::snprintf(buf, sizeof buf, "  HFU                %.4f%% (kernel FLOPs per step %.6g: forward, backward, optimizer)\n",
                  100.0 * t.hfu, t.kernel_flops_per_step);
    os << buf;
  }
  os << chip_totals_line(r);
  if (r.single_device_ns > 0) {
    std::snprintf(buf, sizeof buf, "  single device      %s  -> speedup %.2fx on %d chips\n",
                  fmt_ns(r.single_device_ns).c_str(), r.single_device_ns / b.total, r.chips);
    os << buf;
  }
  if (t.has_memory) {
    const TrainMemory& m = t.memory;
    os << "memory per chip (bytes; " << m.basis << ")\n";
    auto row = [&](const std::string& what, double v, double formula, const std::string& rule) {
      std::snprintf(buf, sizeof buf, "  %-16s %14.0f  formula %14.0f  %s\n", what.c_str(), v, formula, rule.c_str());
      os << buf;
    };
    for (const auto& x : m.rows) row(x.what, x.bytes, x.formula, x.rule);
    row("total", m.total(), m.formula_total(), "");
    std::snprintf(buf, sizeof buf, "  %-16s %14.0f  (%s; not in the formula)\n", "activations", m.activations,
                  m.activations_note.c_str());
    os << buf;
    std::snprintf(buf, sizeof buf, "  %-16s %14.0f  = %.2f GiB of the device's %.0f GiB HBM, %.3g GiB kept in reserve: %s\n",
                  "state + activ.", m.chip_bytes(), m.chip_bytes() / 1073741824.0, r.hbm_capacity_bytes / 1073741824.0,
                  r.hbm_reserve_bytes / 1073741824.0, fits_hbm(r) ? "fits" : "does NOT fit");
    os << buf;
  }
  if (t.has_pipeline) {
    const TrainPipeline& p = t.pipeline;
    std::snprintf(buf, sizeof buf,
                  "pipeline (schedule %s, pp %d, %d micro-batches%s; the last step's schedule part: %.3f us)\n"
                  "  bubble             %.2f%% of it (mean over stages); closed form %s = %.2f%% (uniform stages, free "
                  "communication)\n",
                  p.schedule.c_str(), p.p, p.m, p.v > 1 ? (", v " + std::to_string(p.v)).c_str() : "",
                  p.pipeline_ns / 1e3, 100 * p.bubble_fraction, p.closed_form_rule.c_str(), 100 * p.closed_form);
    os << buf;
    os << "  stage        busy_us      bubble_us  bubble  peak_act_bytes  (micro-batches)  to_next_B  to_prev_B\n";
    for (size_t i = 0; i < p.stages.size(); ++i) {
      const auto& st = p.stages[i];
      std::snprintf(buf, sizeof buf, "  %5zu  %13.3f  %13.3f  %5.1f%%  %14.0f  (%.2f)  %13.0f  %9.0f\n", i,
                    st.busy_ns / 1e3, st.bubble_ns / 1e3, 100 * st.bubble_fraction, st.peak_activation_bytes,
                    st.peak_microbatches, st.bytes_forward, st.bytes_backward);
      os << buf;
    }
    if (p.schedule == "zb_h1") {
      os << "  peak_act_bytes include the pending weight gradients' operands, at most:";
      for (const auto& st : p.stages) os << " " << static_cast<long long>(st.peak_pending_w_bytes);
      os << " bytes per stage\n";
    }
  }
  os << plan_tables_text(r);
  if (t.has_moe) os << moe_text(t.moe);
  if (r.validated) {
    std::snprintf(buf, sizeof buf,
                  "validation: %s (%s|loss - reference| = %.3g over %lld steps, limit %.3g: %s; reference: the "
                  "single-device model, models/lm_train.h%s)\n",
                  r.passed ? "PASS" : "FAIL", t.loss_error_relative ? "relative " : "", t.max_loss_error,
                  (long long)t.validated_steps, t.loss_limit, t.loss_limit_rule.c_str(),
                  t.forward ? ", its forward" : "");
    os << buf;
    if (t.rows_validated) {  // the output rows (run's line)
      std::snprintf(buf, sizeof buf, "validation %s  max|y-y_ref| = %.3g, max|y_ref| = %.3g, relative %.3g (tolerance "
                    "%.3g)\n", r.passed ? "PASS" : "FAIL", r.max_abs_error, r.max_abs_reference, r.relative_error,
                    r.tolerance);
      os << buf;
    }
  } else if (t.forward && r.shape_only) {
    os << "validation not validated (shape-only: no data; simulated figures as with real data)\n";
  }
  if (!r.trace.empty()) os << "trace      " << escape_control(r.trace) << " (Chrome trace JSON: open in ui.perfetto.dev)\n";
  os << profile_section_text(r);
  std::snprintf(buf, sizeof buf, "wall (this host)\n  total %.3f s\n", r.wall_total_s);
  os << buf;
  if (r.chips_total > 0) {
    std::snprintf(buf, sizeof buf, "  peak RSS %.0f MiB, %.0f scheduler events, chips simulated %d of %d%s\n",
                  r.host_peak_rss_mib, r.host_events, r.chips_simulated, r.chips_total,
                  r.chips_simulated < r.chips_total ? " (folded: one data-parallel replica runs, the others are its "
                                                      "mirror images; docs/performance/fold.md)"
                                                    : "");
    os << buf;
  }
  os << (r.shape_only ? "DONE (shape-only, not validated)" : !r.validated ? "DONE (not validated: --validate compares "
                                                                            "with the single-device model)"
                                                        : r.ok() ? "PASS" : "FAIL")
     << "\n";
  return escape_lines(os.str());
}

// The profile section (docs/PROFILE.md): the critical path (--profile) and the what-if table (--what-if).
std::string profile_section_text(const RunReport& r) {
  std::string s;
  if (r.profile) s += profile_text(*r.profile);
  if (!r.what_if.empty()) s += what_if_text(r.critical.total, r.what_if);
  if (!r.plots.empty()) {
    s += "plots (docs/PROFILE.md, \"Plots\")\n";
    for (const auto& p : r.plots) s += "  " + escape_control(p) + "\n";
  }
  if (!r.plots_warning.empty()) s += "plots: " + escape_control(r.plots_warning) + "\n";
  if (!r.trace_note.empty()) s += "trace: " + escape_control(r.trace_note) + "\n";
  return s;
}

nlohmann::json to_json(const RunReport& r) {
  nlohmann::json comm = nlohmann::json::object();
  for (const auto& [k, c] : r.comm) {
    comm[k] = {{"bytes_per_chip", c.bytes}, {"formula_bytes", c.expected}, {"calls", c.calls}, {"ns", c.ns}};
    if (!c.algorithm.empty()) comm[k]["algorithm"] = c.algorithm;
  }
  std::vector<double> per_chip_total, per_chip_peak;
  for (const auto& c : r.per_chip) {
    per_chip_total.push_back(c.breakdown.total);
    per_chip_peak.push_back(c.peak_memory_bytes);
  }
  nlohmann::json chips = nlohmann::json::array();
  for (const auto& c : r.per_chip)
    chips.push_back({{"chip", c.chip}, {"simulated", breakdown_json(c.breakdown)}, {"peak_memory_bytes", c.peak_memory_bytes}});
  nlohmann::json j = {
      {"run_mode", r.run_mode},
      {"name", r.name},
      {"model", r.model},
      {"config", r.config_file},
      {"topology", r.topology},
      {"device", r.device},
      {"plan", r.plan},
      {"mesh", r.mesh},
      {"chips", r.chips},
      {"dtype", r.dtype},
      {"mode", r.shape_only ? "shape_only" : "real"},
      {"validated", r.validated},
      {"layers", r.layers},
      {"units", {{"time", "ns (simulated) / s (wall)"}, {"bandwidth", "GB/s, GB = 1e9 bytes"}}},
      {"simulated",
       {{"critical_chip", r.critical_chip},
        {"breakdown", breakdown_json(r.critical)},
        {"total_flops", r.total_flops},
        {"tflops", r.sim_tflops},
        {"peak_tflops", r.peak_tflops},
        {"peak_fraction", r.peak_fraction},
        {"idle_ns", std::max(0.0, r.critical.total - r.critical.compute - r.critical.exposed_comm - r.bubble_ns)},
        {"bubble_ns", r.bubble_ns},
        {"tokens_per_s", r.tokens_per_s},
        {"ops", ops_json(r.ops, r.critical.total, r.peak_tflops_per_chip)},
        {"all_reduce_ns", r.all_reduce_ns},
        {"all_reduce_algorithm", r.all_reduce_algorithm},
        {"all_reduce_bytes_per_chip", r.all_reduce_bytes_per_chip},
        {"all_reduce_expected_bytes_per_chip", r.all_reduce_expected_bytes},
        {"single_device_ns", r.single_device_ns},
        {"hbm_capacity_bytes", r.hbm_capacity_bytes},
        {"speedup_vs_single_device", r.single_device_ns > 0 && r.critical.total > 0
                                         ? r.single_device_ns / r.critical.total
                                         : 0.0},
        {"per_chip", chips},
        // the breakdown's figures flat, and every chip's total and peak memory as lists (the block report's keys)
        {"total_ns", r.critical.total},
        {"compute_ns", r.critical.compute},
        {"communication_ns", r.critical.communication},
        {"exposed_comm_ns", r.critical.exposed_comm},
        {"attention_ns", r.attention_ns},
        {"per_chip_total_ns", per_chip_total},
        {"per_chip_peak_memory_bytes", per_chip_peak},
        {"layer_ns", r.layer_ns}}},
      {"communication", comm},
      {"validation",
       {{"enabled", r.validated},
        {"passed", r.passed},
        {"max_abs_error", r.max_abs_error},
        {"max_abs_reference", r.max_abs_reference},
        {"relative_error", r.relative_error},
        {"tolerance", r.tolerance},
        {"resumed_from", r.resumed_from}}},
      {"checkpoint", r.checkpoint},
      {"resumed_from", r.resumed_from},
      {"trace", r.trace},
      {"wall",
       {{"total_s", r.wall_total_s},
        {"init_s", r.wall_init_s},
        {"forward_s", r.wall_forward_s},
        {"reference_s", r.wall_reference_s},
        {"checkpoint_s", r.wall_checkpoint_s},
        {"peak_rss_mib", r.host_peak_rss_mib},
        {"events", r.host_events},
        {"chips_simulated", r.chips_simulated}}},
      {"verdict", r.ok() ? "PASS" : "FAIL"},
  };
  if (!r.fused.empty()) j["simulated"]["fused"] = fused_json(r.fused, r.critical.total);
  if (r.run_mode == "train" || r.train.forward) j["train"] = train_json(r);
  if (!r.resumed_from.empty()) {
    auto& v = j["validation"];
    v["resume_bit_exact"] = r.resume_same_layout && r.resume_bit_exact;
    v["resume_same_layout"] = r.resume_same_layout;
    v["resume_saved_tp"] = r.resume_saved_tp;
    v["resume_relative_error"] = r.resume_relative_error;
    v["resume_ok"] = r.resume_bit_exact;
  }
  if (r.profile) j["profile"] = profile_json(*r.profile);
  if (!r.what_if.empty()) j["what_if"] = what_if_json(r.critical.total, r.what_if);
  if (!r.plots.empty() || !r.plots_warning.empty()) j["plots"] = {{"files", r.plots}, {"warning", r.plots_warning}};
  if (!r.trace_note.empty()) j["trace_note"] = r.trace_note;
  return j;
}

std::string to_text(const RunReport& r) {
  if (r.run_mode == "train" || r.train.forward) {
    std::string text = train_head_text(r);
    for (const auto& st : r.train.steps) {
      text += train_step_text(r, st);
      for (const auto& [step, path] : r.train.saved)
        if (step == st.step) text += train_saved_text(step, path);
    }
    return text + train_tail_text(r);
  }
  std::ostringstream os;
  const auto& b = r.critical;
  os << "shardsim run" << (r.name.empty() ? "" : ": " + escape_control(r.name))
     << (r.model.empty() ? "" : " (" + escape_control(r.model) + ")") << "  (" << escape_control(r.config_file) << ")\n";
  os << "  topology   " << r.topology << "\n";
  os << "  device     " << r.device << "\n";
  os << "  plan       " << r.plan << ", dtype " << r.dtype << "\n";
  if (!r.mesh.empty()) os << "  mesh       " << r.mesh << "\n";
  os << "simulated (modelled hardware; critical chip " << r.critical_chip << ")\n";
  os << "  total              " << fmt_ns(b.total) << "\n";
  os << "  compute            " << fmt_ns(b.compute) << "  " << pct(b.compute, b.total);
  if (r.attention_ns > 0) os << "   (attention " << fmt_ns(r.attention_ns) << ")";
  os << "\n";
  os << "  communication      " << fmt_ns(b.communication) << "  " << pct(b.communication, b.total) << "\n";
  os << "  exposed comm       " << fmt_ns(b.exposed_comm) << "  " << pct(b.exposed_comm, b.total) << "\n";
  const double idle = std::max(0.0, b.total - b.compute - b.exposed_comm);
  os << "  idle               " << fmt_ns(idle) << "  " << pct(idle, b.total) << "\n";
  char buf[256];
  std::snprintf(buf, sizeof buf, "  throughput         %.2f TFLOP/s = %.1f%% of %.1f TFLOP/s peak (%d chips)\n",
                r.sim_tflops, 100.0 * r.peak_fraction, r.peak_tflops, r.chips);
  os << buf;
  std::snprintf(buf, sizeof buf, "  tokens/s           %.4g (simulated)\n", r.tokens_per_s);
  os << buf;
  if (!r.all_reduce_algorithm.empty())  // the MLP: its one all_reduce
    os << "  all_reduce         " << fmt_ns(r.all_reduce_ns) << (r.fused.empty() ? "" : " alone") << " ("
       << r.all_reduce_algorithm << "), " << format_mib(r.all_reduce_bytes_per_chip)
       << " sent per chip (2(p-1)/p*M = " << format_mib(r.all_reduce_expected_bytes) << ")\n";
  os << chip_totals_line(r);
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
  if (r.layers > 1 && !r.layer_ns.empty()) {
    double lo = r.layer_ns[0], hi = lo;
    for (double t : r.layer_ns) {
      lo = std::min(lo, t);
      hi = std::max(hi, t);
    }
    os << "  layers             " << r.layers << " in sequence, " << fmt_ns(lo) << " .. " << fmt_ns(hi)
       << " per layer (first " << fmt_ns(r.layer_ns.front()) << ", last " << fmt_ns(r.layer_ns.back()) << ")\n";
  }
  if (r.single_device_ns > 0) {
    std::snprintf(buf, sizeof buf, "  single device      %s  -> speedup %.2fx on %d chips\n",
                  fmt_ns(r.single_device_ns).c_str(), r.single_device_ns / b.total, r.chips);
    os << buf;
  }
  os << plan_tables_text(r);
  os << "wall (this host)\n";
  if (r.wall_forward_s > 0)
    std::snprintf(buf, sizeof buf, "  total %.3f s  (init %.3f s, sharded forward %.3f s, reference %.3f s, checkpoint %.3f s)\n",
                  r.wall_total_s, r.wall_init_s, r.wall_forward_s, r.wall_reference_s, r.wall_checkpoint_s);
  else
    std::snprintf(buf, sizeof buf, "  total %.3f s\n", r.wall_total_s);
  os << buf;
  if (!r.resumed_from.empty()) {
    os << "resume     weights from " << escape_control(r.resumed_from);
    if (!r.resume_compared) {
      os << "\n";
    } else if (r.resume_same_layout) {
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
  } else if (r.shape_only) {
    os << "validation not validated (shape-only: no data; simulated figures as with real data)\n";
  } else {
    os << "validation skipped (validate.enabled: false)\n";
  }
  if (!r.checkpoint.empty()) os << "checkpoint " << escape_control(r.checkpoint) << "\n";
  if (!r.trace.empty()) os << "trace      " << escape_control(r.trace) << " (Chrome trace JSON: open in ui.perfetto.dev)\n";
  os << profile_section_text(r);
  os << (r.shape_only ? "DONE (shape-only, not validated)" : r.ok() ? "PASS" : "FAIL") << "\n";
  return escape_lines(os.str());  // paths and names are untrusted text (docs/SECURITY.md, promise 9)
}

}  // namespace shardsim::reporting
