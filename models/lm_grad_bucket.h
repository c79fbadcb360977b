// One gradient bucket's reduction over the replicas of a model (shard): the data-parallel step shared by the dp
// trainer (models/lm_dp.h: the replicas are the dp ranks) and the dp x cp x tp trainer (models/lm_tp.h: the dp x cp
// ranks of one tp coordinate), so both do exactly the same thing (docs/MODEL.md, "Data parallelism with ZeRO").
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "collectives/all_reduce.h"
#include "collectives/reduce_scatter.h"
#include "collectives/types.h"
#include "models/lm_model.h"
#include "runtime/transport.h"
#include "sim/timeline.h"

namespace shardsim::models {

// Reduces bucket B of the local gradients GRADS (compute dtype DTYPE, the bucket's SLOTS packed in backward order)
// over GROUP, the replicas; rank r of GROUP owns chunk r of collectives::Partition{B.count, GROUP.size()}, which is
// [B.own_off, B.own_off + B.own_n) for ZeRO stages 1-3.
//  - ZERO 0: B.grad (the whole bucket) = all_reduce(avg) of the packed gradients.
//  - ZERO 1: the packed gradients go into B.grad (the whole bucket: stage 1 keeps the local gradient buffer) and
//    reduce_scatter(avg) writes the owned chunk in place at own_off (reduce_scatter copies its send buffer before
//    it writes the receive buffer, so the two may overlap); the rest of B.grad stays local.
//  - ZERO 2-3: reduce_scatter(avg) of the packed gradients into B.grad (the chunk only; a single replica keeps the
//    packed bucket, which is its chunk).
//    (ZeRO's stage 1-2 traffic: Ψ for this reduce_scatter plus Ψ for the parameter all_gather after AdamW, not
//    all_reduce's 2Ψ plus Ψ.)
// Every collective is issued at READY (when the bucket's last gradient is complete) on the link engines, named
// "all_reduce.grads" / "reduce_scatter.grads", with O's algorithm. A single replica issues none (the average of
// one gradient is itself). Returns when the reduction ends (READY if none ran).
// Norm piece: adds to SQ the squares of the reduced elements of this rank's Partition chunk (stage 0 holds the
// whole bucket but counts its chunk only, so over the group every element counts once), in the slots for which
// COUNTED(slot) is true (lm_tp: a replicated norm weight only on tp coordinate 0), in bucket order. Shape-only
// buckets (B.grad without storage) move no bytes and add nothing. WHO names the trainer in pack errors.
template <class Bucket, class Counted>
sim::TimeNs lm_reduce_grad_bucket(Bucket& b, const LmWeights& grads, int zero, runtime::Transport& group,
                                  runtime::DType dtype, sim::TimeNs ready, collectives::CollectiveOptions o,
                                  Counted&& counted, double& sq, const char* who) {
  const bool store = b.grad.has_storage();
  const int replicas = group.size();
  const collectives::Partition p{b.count, static_cast<size_t>(replicas)};
  const size_t own_off = p.offset(static_cast<size_t>(group.rank())), own_n = p.size(static_cast<size_t>(group.rank()));
  sim::TimeNs end = ready;
  size_t base = 0;  // the bucket element at b.grad's index 0
  if (zero >= 1) {
    runtime::Tensor flat;
    if (zero >= 2) {  // b.grad is the chunk: pack into a whole-bucket buffer
      flat = runtime::Tensor::make(dtype, {int64_t(b.count)}, store);
      lm_pack_slots(b.slots, grads, flat, who);
    } else {
      lm_pack_slots(b.slots, grads, b.grad, who);
    }
    if (replicas == 1) {
      if (zero >= 2) b.grad = std::move(flat);
    } else {
      const runtime::Tensor& whole = zero >= 2 ? flat : b.grad;
      void* out = store ? static_cast<char*>(b.grad.data()) + (zero == 1 ? own_off : 0) * runtime::dtype_size(dtype)
                        : nullptr;
      o.name = "reduce_scatter.grads";
      end = collectives::reduce_scatter(group, whole.data_if_stored(), out, b.count, dtype, collectives::ReduceOp::avg,
                                        ready, o)
                .span.end;
    }
    base = zero >= 2 ? own_off : 0;
  } else {
    lm_pack_slots(b.slots, grads, b.grad, who);
    if (replicas > 1) {
      o.name = "all_reduce.grads";
      end = collectives::all_reduce(group, b.grad.data_if_stored(), b.grad.data_if_stored(), b.count, dtype,
                                    collectives::ReduceOp::avg, ready, o)
                .span.end;
    }
  }
  if (!store) return end;  // shape-only: no values, the norm piece is 0
  for (const auto& s : b.slots) {
    if (!counted(s)) continue;
    const size_t lo = std::max(s.offset, own_off), hi = std::min(s.offset + s.numel, own_off + own_n);
    for (size_t i = lo; i < hi; ++i) {
      const double g = b.grad.get(int64_t(i - base));
      sq += g * g;
    }
  }
  return end;
}

}  // namespace shardsim::models
