#include "sharding/plans/pipeline_schedule.h"

#include "sharding/plans/registry.h"

#include "common/checked.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace shardsim::sharding::plans {

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::gpipe: return "gpipe";
    case ScheduleKind::one_f_one_b: return "1f1b";
    case ScheduleKind::interleaved: return "interleaved";
    case ScheduleKind::zb_h1: return "zb_h1";
  }
  return "?";
}

std::optional<ScheduleKind> schedule_from_name(std::string_view name) {
  for (ScheduleKind k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved, ScheduleKind::zb_h1})
    if (name == schedule_name(k)) return k;
  return std::nullopt;
}

const char* pipe_op_name(PipeOp op) {
  switch (op) {
    case PipeOp::F: return "F";
    case PipeOp::B: return "B";
    case PipeOp::BI: return "BI";
    case PipeOp::BW: return "BW";
  }
  return "?";
}

std::string pipeline_obstacle(ScheduleKind kind, int p, int m, int v, int64_t layers,
                              const std::vector<int64_t>& per_stage) {
  // The model's layers before the micro-batches: no micro-batch setting fixes too few layers.
  std::ostringstream e;
  if (p < 1) {
    e << "parallel.pp: " << p << " stages; needs at least 1";
  } else if (v < 1) {
    e << "parallel.virtual_stages: " << v << "; needs at least 1";
  } else if (v > 1 && kind != ScheduleKind::interleaved) {
    e << "parallel.virtual_stages: " << v << " virtual stages per chip need parallel.schedule: interleaved (got "
      << schedule_name(kind) << ")";
  } else if (layers > 0 && int64_t(p) * v > layers) {
    e << "parallel.pp: " << p << " stages";
    if (v > 1) e << " x " << v << " virtual stages";
    e << " but the model has only " << layers << " layers";
  } else if (m < 1) {
    e << "model.micro_batch: " << m << " micro-batches per step; needs at least 1";
  } else if (kind == ScheduleKind::interleaved && m % p != 0) {
    e << "model.micro_batch: the interleaved schedule needs the micro-batches per step (" << m
      << ") to be a multiple of parallel.pp (" << p << ")";
  } else if (layers > 0 && !per_stage.empty()) {
    for (int64_t n : per_stage)
      if (n < 1 || n > layers) {
        e << "parallel.pp_layers: every stage holds between 1 and the model's " << layers << " layers (got " << n
          << ")";
        return e.str();
      }
    const auto sum = checked_sum(per_stage);  // entries <= layers: no overflow unless the list is absurdly long
    if (per_stage.size() != size_t(p) * size_t(v))
      e << "parallel.pp_layers: " << per_stage.size() << " entries; needs one per stage (parallel.pp x "
        << "virtual_stages = " << p * v << ")";
    else if (!sum || *sum != layers)
      e << "parallel.pp_layers: the stages hold " << (sum ? std::to_string(*sum) : std::string("more than 2^63"))
        << " layers but the model has " << layers;
  } else if (layers > 0 && v > 1 && (layers % p != 0 || (layers / p) % v != 0)) {
    e << "parallel.virtual_stages: " << v << " does not divide the " << (layers % p == 0 ? layers / p : layers)
      << " layers " << (layers % p == 0 ? "per stage" : "(not a multiple of parallel.pp)")
      << "; give parallel.pp_layers to split them unevenly";
  }
  return e.str();
}

std::vector<int64_t> stage_layers(int64_t layers, int stages, const std::vector<int64_t>& per_stage) {
  if (!per_stage.empty()) return per_stage;
  std::vector<int64_t> out(size_t(stages), layers / stages);
  for (int64_t i = 0; i < layers % stages; ++i) ++out[size_t(i)];
  return out;
}

namespace {

// 1F1B over COUNT forward slots: WARMUP forwards, then forward/backward pairs, then the remaining backwards.
// FWD(k) / BWD(k) give the k-th forward / backward action. SPLIT: the backward is BI, and the BW passes follow
// the rule of zb_h1 (at most KEEP_W pending).
template <class Fwd, class Bwd>
std::vector<PipeAction> one_f_one_b(int count, int warmup, Fwd fwd, Bwd bwd, bool split, int keep_w) {
  std::vector<PipeAction> out;
  int f = 0, b = 0, w = 0;
  auto backward = [&] {
    PipeAction a = bwd(b++);
    if (!split) {
      out.push_back(a);
      return;
    }
    a.op = PipeOp::BI;
    out.push_back(a);
    if (b - w > keep_w) out.push_back({PipeOp::BW, bwd(w).chunk, bwd(w).micro}), ++w;
  };
  for (; f < warmup; ++f) out.push_back(fwd(f));
  while (f < count) {
    out.push_back(fwd(f++));
    backward();
  }
  while (b < count) backward();
  while (split && w < count) out.push_back({PipeOp::BW, bwd(w).chunk, bwd(w).micro}), ++w;
  return out;
}

}  // namespace

PipelineSchedule make_schedule(ScheduleKind kind, int p, int m, int v) {
  const std::string why = pipeline_obstacle(kind, p, m, v, 0);
  if (!why.empty()) throw std::invalid_argument(why);
  PipelineSchedule s;
  s.kind = kind;
  s.p = p;
  s.m = m;
  s.v = v;
  s.stages.resize(size_t(p));
  for (int st = 0; st < p; ++st) {
    auto& out = s.stages[size_t(st)];
    auto fwd = [](int k) { return PipeAction{PipeOp::F, 0, k}; };
    auto bwd = [](int k) { return PipeAction{PipeOp::B, 0, k}; };
    switch (kind) {
      case ScheduleKind::gpipe:
        for (int i = 0; i < m; ++i) out.push_back(fwd(i));
        for (int i = 0; i < m; ++i) out.push_back(bwd(i));
        break;
      case ScheduleKind::one_f_one_b:
        out = one_f_one_b(m, std::min(p - 1 - st, m), fwd, bwd, false, 0);
        break;
      case ScheduleKind::zb_h1:
        out = one_f_one_b(m, std::min(p - 1 - st, m), fwd, bwd, true, st);
        break;
      case ScheduleKind::interleaved: {
        // Megatron-LM's get_model_chunk_id / microbatch order (schedules.py, forward_backward_pipelining_with_
        // interleaving): groups of p micro-batches pass through every chunk in turn.
        auto ifwd = [p, v](int k) { return PipeAction{PipeOp::F, (k / p) % v, (k / (p * v)) * p + k % p}; };
        auto ibwd = [p, v](int k) { return PipeAction{PipeOp::B, v - 1 - (k / p) % v, (k / (p * v)) * p + k % p}; };
        out = one_f_one_b(m * v, std::min((p - 1 - st) * 2 + (v - 1) * p, m * v), ifwd, ibwd, false, 0);
        break;
      }
    }
  }
  return s;
}

PipeSimulation simulate_schedule(const PipelineSchedule& s, const PipeCosts& c) {
  const int p = s.p, stages = s.p * s.v;
  PipeSimulation r;
  r.busy.assign(size_t(p), 0);
  r.bubble.assign(size_t(p), 0);
  r.peak_in_flight.assign(size_t(p), 0);
  r.peak_pending_w.assign(size_t(p), 0);
  // Finished actions: (kind 0 = F, 1 = input gradient (B or BI), 2 = BW; model stage; micro) -> (end, chip).
  std::map<std::tuple<int, int, int>, std::pair<double, int>> done;
  std::vector<size_t> next(size_t(p), 0);
  std::vector<double> free(size_t(p), 0);
  std::vector<int> in_flight(size_t(p), 0), pending_w(size_t(p), 0);
  size_t total = 0, ran = 0;
  for (const auto& l : s.stages) total += l.size();
  auto key = [](PipeOp op) { return op == PipeOp::F ? 0 : op == PipeOp::BW ? 2 : 1; };
  while (ran < total) {
    bool progress = false;
    for (int st = 0; st < p; ++st) {
      const auto& list = s.stages[size_t(st)];
      if (next[size_t(st)] >= list.size()) continue;
      const PipeAction& a = list[next[size_t(st)]];
      const int ms = s.model_stage(st, a.chunk);
      if (a.chunk < 0 || a.chunk >= s.v || a.micro < 0 || a.micro >= s.m) {
        r.error = "stage " + std::to_string(st) + ": action out of range";
        return r;
      }
      std::vector<std::tuple<int, int, int>> deps;
      if (a.op == PipeOp::F) {
        if (ms > 0) deps.push_back({0, ms - 1, a.micro});
      } else if (a.op == PipeOp::BW) {
        deps.push_back({1, ms, a.micro});
      } else {
        deps.push_back({0, ms, a.micro});
        if (ms < stages - 1) deps.push_back({1, ms + 1, a.micro});
      }
      double start = free[size_t(st)];
      bool ready = true;
      for (const auto& d : deps) {
        auto it = done.find(d);
        if (it == done.end()) {
          ready = false;
          break;
        }
        start = std::max(start, it->second.first + (it->second.second == st ? 0.0 : c.comm));
      }
      if (!ready) continue;
      const double dur = a.op == PipeOp::F ? c.f : a.op == PipeOp::B ? c.b : a.op == PipeOp::BI ? c.b - c.w : c.w;
      const auto k = std::make_tuple(key(a.op), ms, a.micro);
      if (done.count(k) || (a.op == PipeOp::B && done.count({2, ms, a.micro}))) {
        r.error = std::string("stage ") + std::to_string(st) + " runs " + pipe_op_name(a.op) + " of micro-batch " +
                  std::to_string(a.micro) + " chunk " + std::to_string(a.chunk) + " twice";
        return r;
      }
      done[k] = {start + dur, st};
      if (a.op == PipeOp::B) done[{2, ms, a.micro}] = {start + dur, st};
      free[size_t(st)] = start + dur;
      r.busy[size_t(st)] += dur;
      int& fl = in_flight[size_t(st)];
      int& pw = pending_w[size_t(st)];
      if (a.op == PipeOp::F) ++fl;
      if (a.op == PipeOp::B || a.op == PipeOp::BI) --fl;
      if (a.op == PipeOp::BI) ++pw;
      if (a.op == PipeOp::BW) --pw;
      r.peak_in_flight[size_t(st)] = std::max(r.peak_in_flight[size_t(st)], fl);
      r.peak_pending_w[size_t(st)] = std::max(r.peak_pending_w[size_t(st)], pw);
      ++next[size_t(st)];
      ++ran;
      progress = true;
    }
    if (!progress) {
      r.deadlock = true;
      std::ostringstream e;
      e << "deadlock: every stage waits (next actions:";
      for (int st = 0; st < p; ++st) {
        const auto& list = s.stages[size_t(st)];
        if (next[size_t(st)] >= list.size()) continue;
        const PipeAction& a = list[next[size_t(st)]];
        e << " stage " << st << " " << pipe_op_name(a.op) << a.micro << "." << a.chunk;
      }
      e << ")";
      r.error = e.str();
      return r;
    }
  }
  // Completeness: every (model stage, micro-batch) has its forward and its whole backward.
  for (int ms = 0; ms < stages && r.error.empty(); ++ms)
    for (int i = 0; i < s.m; ++i)
      for (int k = 0; k < 3; ++k)
        if (!done.count({k, ms, i})) {
          r.error = "model stage " + std::to_string(ms) + " never runs " + (k == 0 ? "F" : k == 1 ? "B/BI" : "BW") +
                    " of micro-batch " + std::to_string(i);
          break;
        }
  for (int st = 0; st < p; ++st) r.makespan = std::max(r.makespan, free[size_t(st)]);
  for (int st = 0; st < p; ++st)
    r.bubble[size_t(st)] = r.makespan > 0 ? (r.makespan - r.busy[size_t(st)]) / r.makespan : 0;
  return r;
}

double closed_form_bubble(ScheduleKind kind, int p, int m, int v, const PipeCosts& c) {
  switch (kind) {
    case ScheduleKind::gpipe:
    case ScheduleKind::one_f_one_b: return double(p - 1) / double(m + p - 1);
    case ScheduleKind::interleaved: return double(p - 1) / double(double(v) * m + p - 1);
    case ScheduleKind::zb_h1: {
      const double bi = c.b - c.w;
      const double bubble = (p - 1) * (c.f + bi - std::min({c.w, c.f, bi}));
      return bubble / (bubble + m * (c.f + bi + c.w));
    }
  }
  return 0;
}

double closed_form_peak_microbatches(ScheduleKind kind, int p, int m, int v) {
  switch (kind) {
    case ScheduleKind::gpipe: return m;
    case ScheduleKind::one_f_one_b:
    case ScheduleKind::zb_h1: return std::min(p, m);
    case ScheduleKind::interleaved: return std::min(double(p) * v + p - 1, double(m) * v) / v;
  }
  return 0;
}

}  // namespace shardsim::sharding::plans

// ==== plan registration (sharding/plans/registry.h: the descriptor make_registry() lists) ====

namespace shardsim::sharding::plans {

namespace {

// ---- pp: pipeline parallel (pipeline_schedule.h) ----
void pp_read(const PlanParse& c, ParallelPlan& p) {
  if (!c.given) return;
  if (p.pp > 1 && !c.train()) c.not_implemented("pp", "pp: pipeline parallelism");
  if (p.pp > 1 && c.model.tied_embeddings)
    c.not_implemented("pp",
                      "pp with model.tied_embeddings (the embedding's and the head's stages would all_reduce "
                      "the shared weight's gradient)");
  for (const char* k : {"schedule", "virtual_stages", "pp_layers"})
    if (c.has(k) && p.pp == 1) c.fail(k, "only used with pipeline parallelism (pp > 1)");
  p.schedule = c.par.get_string("schedule", "1f1b");
  if (!schedule_from_name(p.schedule)) c.fail("schedule", "'" + p.schedule + "' (" + kScheduleNames + ")");
  if (c.train() && p.fused.enabled && p.pp > 1 && p.schedule == "zb_h1")
    c.not_implemented("fused",
                      "fused with schedule: zb_h1 (zb_h1 defers the weight gradients' GEMMs, which the "
                      "fused ops compute inside)");
  p.virtual_stages = static_cast<int>(c.par.get_int_in("virtual_stages", 1, SpecBounds::layers, 1));
  if (c.given && c.par.yaml()["pp_layers"].IsDefined())  // each entry in [1, layers]: the sum cannot wrap
    p.pp_layers = c.par.get_int_list_in("pp_layers", 1, SpecBounds::layers);
}
// Micro-batches of one replica's step.
int micro_batches(const ModelSpec& s, const ParallelPlan& p) {
  const int64_t per_replica = s.batch / (int64_t{p.dp} * p.ep);  // ep: one more data-parallel axis for the batch
  return static_cast<int>(s.micro_batch > 0 ? per_replica / s.micro_batch : 1);
}
void pp_check(const PlanParse& c, const ParallelPlan& p) {
  if (!c.train() || p.pp == 1) return;
  const std::string why = pipeline_obstacle(*schedule_from_name(p.schedule), p.pp, micro_batches(c.model, p),
                                            p.virtual_stages, c.model.layers, p.pp_layers);
  if (why.empty()) return;
  // The obstacle names its key: parallel.KEY or model.KEY.
  const std::string key = why.substr(0, why.find(':'));
  const std::string leaf = key.substr(key.find('.') + 1);
  // At the key's line, or (a default: no line holds it) the file named with "not set".
  if (key.rfind("model.", 0) == 0) c.model_at("").fail_at(leaf, why);
  (c.given ? c.par : c.root).fail_at(c.given ? leaf : key, why);
}
// Layers per model stage, "2/2/3"; a run of four or more equal stages is written once with its count, "1 (x105)",
// so a 35-stage, 3-chunk plan is one short line instead of 105 numbers.
std::string stage_layers_text(const std::vector<int64_t>& per) {
  std::string text;
  for (size_t i = 0; i < per.size();) {
    size_t j = i;
    while (j < per.size() && per[j] == per[i]) ++j;
    const size_t run = j - i;
    if (run >= 4) {
      text +=
          (text.empty() ? "" : "/") + std::to_string(per[i]) + " (x" + std::to_string(static_cast<int64_t>(run)) + ")";
    } else {
      for (size_t k = i; k < j; ++k) text += (text.empty() ? "" : "/") + std::to_string(per[k]);
    }
    i = j;
  }
  return text;
}
std::string pp_text(const ModelSpec& s, const ParallelPlan& p, bool train_mode) {
  const std::string layers = stage_layers_text(stage_layers(s.layers, p.pp * p.virtual_stages, p.pp_layers));
  return "pipeline pp=" + std::to_string(p.pp) + " (" + p.schedule +
         (p.virtual_stages > 1 ? ", " + std::to_string(p.virtual_stages) + " virtual stages per chip" : std::string()) +
         ", " + std::to_string(micro_batches(s, p)) + " micro-batches, layers per stage " + layers + "; activations" +
         (train_mode ? " and their gradients" : "") + " sent stage to stage)";
}

}  // namespace

PlanDescriptor pp_plan_descriptor() {
  PlanDescriptor d;
  d.name = "pp";
  d.title = "pipeline parallel";
  d.summary =
      "the layers cut into stages on the outermost axis, micro-batches scheduled gpipe | 1f1b | "
      "interleaved | zb_h1, activations and their gradients sent stage to stage "
      "(sharding/plans/pipeline_schedule.h)";
  d.axis = "pp";
  d.size = &ParallelPlan::pp;
  d.keys = {
      {"pp", PlanValue::size, kPlanSizes, "1", "pipeline stages", true},
      {"schedule", PlanValue::choice, "gpipe | 1f1b | interleaved | zb_h1", "1f1b", "the pipeline schedule", true, true,
       PlanModes{ModeUse::runs, ModeUse::runs, ModeUse::no_effect,
                 "serving pipelines its own iterations in flight (serving/scheduler.h)"}},
      {"virtual_stages", PlanValue::size, "1..4096", "1", "interleaved: model chunks per chip", true, true,
       PlanModes{ModeUse::runs, ModeUse::runs, ModeUse::refused, "serving runs one model stage per pipeline chip"},
       [](const ParallelPlan& p) { return p.virtual_stages > 1; }},
      {"pp_layers", PlanValue::list, "[n, ...] summing to layers", "even split", "layers of each model stage", true,
       false}};
  d.read = pp_read;
  d.check = pp_check;
  d.text = pp_text;
  d.example = {plan_test_model(", layers: 4, micro_batch: 1",
                               "pp: 2, schedule: interleaved, virtual_stages: 2, pp_layers: [1, 1, 1, 1]"),
               SpecUse::train, 2, ""};
  d.bad_cases = {{plan_test_model("", "pp: 4"), SpecUse::train, 4, "pp"},
                 {plan_test_model("", "tp: 2, schedule: gpipe"), SpecUse::train, 2, "schedule"},
                 {plan_test_model(", layers: 4", "pp: 2, pp_layers: [1, 2]"), SpecUse::train, 2, "pp_layers"}};
  d.mode_cases = {d.example, {plan_test_model(", layers: 4", "pp: 2, pp_layers: [3, 1]"), SpecUse::train, 2, ""},
                  {plan_test_model(", layers: 4", "pp: 2, schedule: gpipe"), SpecUse::train, 2, ""}};
  return d;
}

}  // namespace shardsim::sharding::plans
