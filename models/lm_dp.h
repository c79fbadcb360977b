// Data parallelism with ZeRO for the reference language model (issue 18, "Data parallelism"), on real MPI ranks:
// every rank of TRANSPORT is one data-parallel replica (dp = ranks, tp = 1) and moves real data; its sim::Timeline
// records the simulated step (compute from the kernels' roofline costs, communication from the collectives).
//
// Batch: the global batch of step s is lm_synthetic_batch(global config, data_seed, s); replica r takes sequences
// [r·B/dp, (r+1)·B/dp) (B = global batch, which dp must divide), so the global batch is identical for any dp.
// Each replica computes the gradient of its local mean loss; the average over replicas (ReduceOp::avg) is the
// gradient of the global mean loss. The reported loss is the mean of the replicas' losses (summed in rank order).
//
// Units and buckets. Unit 0 = embed, 1 + l = block l, layers + 1 = final_norm + head (lm_model.h). The flat
// gradient order is the backward order: unit layers + 1 first, then blocks layers − 1 .. 0, then the embedding;
// within a unit, named_weights() order. Gradients are reduced in BUCKETS (PyTorch DDP's design): whole weights in
// flat order are appended to a bucket until it holds >= bucket_bytes of gradient (compute dtype); a bucket is
// issued on the simulated timeline as soon as its last unit's backward has finished, so its reduction overlaps
// the backward of the units before it. bucket_bytes = 0: one bucket, one reduction after backward (the
// unbucketed baseline). ZeRO-3 always uses one bucket per unit (FSDP's units: a unit's gradients are reduced and
// its parameters gathered as one flat buffer), bucket_bytes is ignored.
//
// ZeRO stages (Rajbhandari et al., "ZeRO", SC'20, arXiv:1910.02054). Each bucket of n elements is split over the
// dp ranks by collectives::Partition{n, dp}; rank r owns chunk r of every bucket.
//   0  plain DDP: all_reduce(avg) per bucket; every rank holds the whole fp32 master, moments and gradients and
//      runs AdamW on all of them.
//   1  optimizer state sharded: reduce_scatter(avg) per bucket (the paper's stage 1: each rank needs only the
//      reduced gradient of the chunk it updates; the whole local gradient buffer stays allocated and receives the
//      chunk in place); each rank keeps the fp32 master and moments of its chunk only, runs AdamW on it, then
//      all_gather of the updated parameters (compute dtype) per bucket. Traffic per step: Ψ + Ψ, as stage 0's
//      all_reduce (2Ψ), not 1.5x of it.
//   2  also gradients: reduce_scatter(avg) per bucket as 1, but only the chunk's reduced gradient persists.
//   3  also parameters (FSDP): between steps a rank holds only its chunk of each unit's parameters; before a
//      unit's forward and again before its backward the unit is all_gathered (issued one unit ahead, the
//      prefetch of FSDP) into a working buffer that is freed after use.
// Global-norm clipping (kernels/optimizer.h): every rank sums the squares of the reduced gradient elements it
// owns (stage 0: the chunk it would own under Partition, so every element counts once), all_reduce(sum) over dp,
// then sqrt. AdamW (fp32, per element) is the single-device step's.
//
// Mixed precision (LmConfig::dtype bf16): compute copy, activations and gradients bf16, masters and moments fp32
// (12 bytes per parameter of optimizer state, K = 12 in ZeRO's notation). fp32: the fp32 parameters are the
// masters, optimizer state = the two moments (K = 8).
//
// Simulated time per step (Timeline reset at the start of each step): the forward's kernels in order on the
// compute engine (stage 3: each unit waits for its gather), the backward's likewise, each bucket's reduction
// ready when its last unit's gradients are, the grad-norm all_reduce and AdamW after every reduction has landed,
// then (stages 1-2) the parameter all_gathers. Breakdown (sim::Timeline::breakdown): compute = busy time of the
// compute engine, exposed = communication while the compute engine idles, idle = total − compute − exposed.
//
// Errors: std::invalid_argument naming the field (zero not in 0..3, bucket_bytes < 0, global batch not a
// multiple of dp); collective errors propagate (UsageError / RuntimeFault); std::runtime_error for a non-finite
// gradient norm (the step is not applied).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/types.h"
#include "models/lm_checkpoint.h"
#include "models/lm_model.h"
#include "models/lm_train.h"
#include "runtime/transport.h"
#include "sim/timeline.h"

namespace shardsim::models {

struct LmDpConfig {
  int zero = 0;                           // ZeRO stage 0..3
  int64_t bucket_bytes = 25 * 1024 * 1024;  // DDP's default bucket_cap_mb = 25; 0 = one bucket after backward
  std::string algorithm = "auto";         // collective algorithm (collectives/algorithms.h)
  // Activation recomputation per block (lm_model.h): the forward keeps only each block's input; before a block's
  // backward its forward runs again (on the host for real, and on the timeline: its forward kernels are replayed
  // on the compute engine right before its backward kernels, after its ZeRO-3 gather). Activations then count the
  // block inputs, one block's saved tensors (the one being differentiated) and the head's; the step gains one
  // forward of every block.
  bool recompute = false;
};

// Per-chip bytes the training state occupies between steps, measured from the buffers this rank holds, next to
// ZeRO's formulas for Ψ = lm_param_count parameters on N_d = dp replicas (paper §5.1, Fig. 1):
//   params     = P·Ψ (stage 3: P·Ψ/N_d)          P = bytes of the compute dtype (2 bf16, 4 fp32)
//   grads      = P·Ψ (stages 2-3: P·Ψ/N_d)
//   optimizer  = K·Ψ (stages 1-3: K·Ψ/N_d)       K = 12 mixed precision (fp32 master + m + v), 8 fp32 (m + v)
// so 16Ψ per chip at stage 0 with mixed-precision Adam. Activations: the bytes of the forward's cache (LmCache) for
// this replica's micro-batch, not part of the formula. Uneven partitions make the measured shards differ from the
// formula by at most one element per bucket.
struct LmDpMemory {
  double params = 0, grads = 0, optimizer = 0, activations = 0;
  double formula_params = 0, formula_grads = 0, formula_optimizer = 0;
  double total() const { return params + grads + optimizer; }
  double formula_total() const { return formula_params + formula_grads + formula_optimizer; }
};

struct LmDpStepResult {
  int64_t step = 0;      // 1-based
  double loss = 0;       // global mean loss before the update
  double grad_norm = 0;  // global norm before clipping
  double clip = 1;
  sim::Breakdown breakdown;  // this chip's simulated step
  double idle_ns() const { return std::max(0.0, breakdown.total - breakdown.compute - breakdown.exposed_comm); }  // no -0.000 from rounding
};

// R.loss = the mean of every replica's LOCAL_LOSS (gathered over REPLICAS, one rank per replica, summed in rank
// order: host-side reporting through the transport's control plane, not simulated; works with several chips per
// rank); throws std::runtime_error when R.grad_norm is not finite (the step is then not applied). Shared by the
// dp and the dp x tp trainers.
void finish_step_loss(LmDpStepResult& r, double local_loss, runtime::Transport& replicas, const char* op);

class LmDpTrainer {
 public:
  // GLOBAL: the model with the global batch; TP: the dp group (one rank per replica), TIMELINE: TP's timeline.
  LmDpTrainer(const LmConfig& global, const LmTrainConfig& train, const LmDpConfig& dp, runtime::Transport& tp,
              sim::Timeline& timeline);
  LmDpStepResult step();
  // The fp32 master weights, whole (stages 1-3: all_gathered over dp; collective, every rank must call it).
  LmWeights gather_master();
  // The whole training state (master, AdamW moments, steps done), all_gathered over dp at stages 1-3; collective.
  // What a training-state checkpoint holds (models/lm_checkpoint.h).
  LmTrainSnapshot gather_state();
  // Continues from SNAPSHOT (whole fp32 tensors of the global model, e.g. a checkpoint saved under any dp and ZeRO
  // stage): keeps this rank's chunk of each bucket, rebuilds the compute copy from the master (rounded once, as
  // AdamW's refresh does) and sets the step. Local (every rank passes the same snapshot); std::invalid_argument
  // for a shape mismatch.
  void restore(const LmTrainSnapshot& snapshot);
  LmDpMemory memory() const;
  int buckets() const { return static_cast<int>(buckets_.size()); }
  int64_t steps_done() const { return step_; }
  const LmConfig& local_config() const { return local_; }

 private:
  struct Slot {  // one weight in the flat order
    size_t index;   // into named_weights()
    int unit;
    size_t offset;  // in its bucket, elements
    size_t numel;
  };
  struct Bucket {
    std::vector<Slot> slots;
    size_t count = 0;     // elements
    int last_unit = 0;    // the unit whose backward completes it (the lowest unit index)
    size_t own_off = 0, own_n = 0;
    runtime::Tensor master, m, v;  // fp32 [own_n] (fp32 dtype: master = the parameters' chunk)
    runtime::Tensor copy;          // compute-dtype chunk refreshed by AdamW (bf16 only)
    runtime::Tensor grad;          // reduced gradient: whole bucket (stages 0-1) or the chunk (2-3)
  };
  void pack(const Bucket& b, const LmWeights& w, runtime::Tensor& flat) const;
  void unpack(const Bucket& b, const runtime::Tensor& flat, LmWeights& w) const;
  sim::TimeNs gather_bucket(Bucket& b, sim::TimeNs ready);  // all_gather of the chunk into work_
  LmWeights gather_field(runtime::Tensor Bucket::*field, const char* name);  // fp32 chunks, whole
  void replay(const std::vector<kernels::KernelCost>& costs, size_t from, size_t to, sim::TimeNs& t);

  LmConfig global_, local_;
  LmTrainConfig train_;
  LmDpConfig dp_;
  runtime::Transport& tp_;
  sim::Timeline& tl_;
  int rank_ = 0, size_ = 1;
  int64_t step_ = 0;
  LmWeights work_;   // compute-dtype weights the kernels use (stage 3: the gathered working buffers)
  LmWeights grads_;  // local gradients (compute dtype)
  std::vector<Bucket> buckets_;
  std::vector<int> unit_bucket_;  // stage 3: unit -> bucket
  std::vector<kernels::KernelCost> fwd_costs_, bwd_costs_;
  std::vector<size_t> fwd_marks_, bwd_marks_;
  double activation_bytes_ = 0;
};

}  // namespace shardsim::models
