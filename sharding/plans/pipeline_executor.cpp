#include "sharding/plans/pipeline_executor.h"

#include <algorithm>
#include <span>
#include <string>

namespace shardsim::sharding::plans {

using runtime::Tensor;

void run_pipeline_stage(const PipelineSchedule& schedule, int stage, runtime::Transport& pp, sim::Timeline& tl,
                        bool forward_only, const PipeStageHooks& hooks, PipeStageStats& st, sim::TimeNs& t) {
  const int last = schedule.p * schedule.v - 1, stages = pp.size();
  const int next = (stage + 1) % stages, prev = (stage + stages - 1) % stages;
  int held = 0;  // (chunk, micro-batch) activations between their forward and their backward
  st = {};
  const auto record_held = [&] {  // what this stage holds after an action
    const auto [bytes, pending_w] = hooks.held_bytes(held);
    st.peak_activation_bytes = std::max(st.peak_activation_bytes, bytes);
    st.peak_pending_w_bytes = std::max(st.peak_pending_w_bytes, pending_w);
  };
  struct Pending {
    Tensor x;
    int peer;
    sim::TimeNs ready;
    const char* name;
  };
  std::vector<Pending> pending;  // sends booked, posted with the next receive
  const auto exchange = [&](runtime::RecvOp* in, const char* name) {
    std::vector<runtime::SendOp> out;
    for (const Pending& p : pending) out.push_back({p.x.data_if_stored(), size_t(p.x.nbytes()), p.peer, p.ready});
    const sim::TimeNs start = t;
    pp.exchange(out, in ? std::span<runtime::RecvOp>(in, 1) : std::span<runtime::RecvOp>(), name);
    for (const Pending& p : pending) tl.record_region(p.name, "collective", {p.ready, p.ready}, double(p.x.nbytes()));
    pending.clear();
    if (in) {
      t = std::max(t, in->arrival);
      tl.record_region(name, "collective", {start, t}, double(in->bytes));
    }
  };
  const auto send = [&](const Tensor& x, int peer, const char* name, double& bytes) {
    pending.push_back({x, peer, t, name});
    bytes += double(x.nbytes());
  };
  const auto recv = [&](int peer, const char* name) {
    Tensor x = hooks.make_boundary();
    runtime::RecvOp in{x.data_if_stored(), size_t(x.nbytes()), peer, 0};
    exchange(&in, name);
    return x;
  };
  // The action's span on the timeline, for the trace's pipeline track (category "pipeline": not in the breakdown).
  const auto mark = [&](const PipeAction& a, sim::TimeNs begin) {
    st.spans.push_back({a, begin, t});
    std::string name = std::string(pipe_op_name(a.op)) + std::to_string(a.micro);
    if (schedule.v > 1) name += ".c" + std::to_string(a.chunk);
    if (stages > 1) tl.record_region(name, "pipeline", {begin, t});
  };
  for (const PipeAction& a : schedule.stages[size_t(stage)]) {
    const int ms = schedule.model_stage(stage, a.chunk);
    if (forward_only && a.op != PipeOp::F) continue;
    if (a.op == PipeOp::F) {
      Tensor x;
      if (ms > 0) x = recv(prev, "pp.recv_activation");
      const sim::TimeNs begin = t;
      hooks.forward(a, x, t);
      mark(a, begin);
      if (ms < last) send(x, next, "pp.send_activation", st.bytes_forward);
      st.peak_in_flight = std::max(st.peak_in_flight, ++held);
      if (forward_only) {  // nothing is kept for a backward
        record_held();
        --held;
        continue;
      }
    } else if (a.op == PipeOp::BW) {  // zb_h1: the deferred weight gradients
      const sim::TimeNs begin = t;
      hooks.weight_backward(a, t);
      mark(a, begin);
    } else {  // B, or zb_h1's BI (the input gradients; the weight gradients deferred to BW)
      Tensor dx;
      if (ms < last) dx = recv(next, "pp.recv_gradient");
      const sim::TimeNs begin = t;
      hooks.backward(a, dx, t);
      mark(a, begin);
      if (ms > 0) send(dx, prev, "pp.send_gradient", st.bytes_backward);
      --held;
    }
    record_held();
  }
  if (!pending.empty()) exchange(nullptr, "pp.send");
}

}  // namespace shardsim::sharding::plans
