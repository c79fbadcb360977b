// The pipeline executor: one stage (chip) of the pp axis runs its actions of a schedule (pipeline_schedule.h) in
// order, with the model's forward and backward supplied as hooks (the trainer's, models/lm_tp.h) and the
// activations and their gradients sent to the neighbouring stages over the pp sub-group (the topology's routes).
//
// Point-to-point as Megatron's batched isend/irecv: a send is booked at the time its data is ready but posted with
// the stage's next receive (or at the end of the schedule) in one exchange (runtime::Transport::exchange), so two
// neighbouring stages that send to each other never wait for each other's receive (MPI's rendezvous for large
// messages). Each action's span is recorded on the timeline's "pipeline" track (pp > 1; not in the breakdown) as
// F<micro>[.c<chunk>], B..., BI..., BW..., and the receives and sends as "collective" regions
// (pp.recv_activation, pp.send_activation, pp.recv_gradient, pp.send_gradient, pp.send).
#pragma once

#include <functional>
#include <vector>

#include "runtime/tensor.h"
#include "runtime/transport.h"
#include "sharding/plans/pipeline_schedule.h"
#include "sim/timeline.h"

namespace shardsim::sharding::plans {

// One stage's record of a step: its actions' spans in schedule order, the most (chunk, micro-batch) activations it
// held at once, what one chunk's forward keeps (set by the caller), the most bytes held at once (activations plus,
// zb_h1, the operands kept for pending weight-gradient passes) and those alone, and the bytes sent to the next
// stage (activations) and to the previous one (their gradients).
struct PipeStageStats {
  struct Span {
    PipeAction action;
    sim::TimeNs start = 0, end = 0;
  };
  std::vector<Span> spans;
  int peak_in_flight = 0;
  double chunk_activation_bytes = 0;
  double peak_activation_bytes = 0, peak_pending_w_bytes = 0;
  double bytes_forward = 0;
  double bytes_backward = 0;
  double busy_ns() const {
    double b = 0;
    for (const auto& s : spans) b += s.end - s.start;
    return b;
  }
};

// What the executor calls (the model's side). T is the stage's clock: each hook runs from it and advances it.
struct PipeStageHooks {
  // An empty activation (or gradient) of one micro-batch as a neighbour sends it, to receive into.
  std::function<runtime::Tensor()> make_boundary;
  // F: X is the previous model stage's output (empty on model stage 0); on return this chunk's output.
  std::function<void(const PipeAction& a, runtime::Tensor& x, sim::TimeNs& t)> forward;
  // B, or zb_h1's BI (the weight gradients deferred to BW): DX is the next model stage's gradient (empty on the last
  // model stage); on return the gradient for the previous one.
  std::function<void(const PipeAction& a, runtime::Tensor& dx, sim::TimeNs& t)> backward;
  // zb_h1's BW: the weight-gradient pass of (chunk, micro-batch).
  std::function<void(const PipeAction& a, sim::TimeNs& t)> weight_backward;
  // Bytes this stage holds with HELD (chunk, micro-batch) activations in flight, and of them the pending
  // weight-gradient passes' (zb_h1).
  std::function<std::pair<double, double>(int held)> held_bytes;
};

// Runs stage STAGE's actions of SCHEDULE (FORWARD_ONLY: its forward actions alone, nothing kept after each) on the
// pp sub-group PP (rank = stage; size 1 without pipeline parallelism) from T (T = its end), recording on TL; STATS
// is reset and filled (chunk_activation_bytes left to the caller). std::logic_error for a backward before its
// forward (a malformed schedule; the hooks throw it).
void run_pipeline_stage(const PipelineSchedule& schedule, int stage, runtime::Transport& pp, sim::Timeline& tl,
                        bool forward_only, const PipeStageHooks& hooks, PipeStageStats& stats, sim::TimeNs& t);

}  // namespace shardsim::sharding::plans
