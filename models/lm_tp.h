// Tensor parallelism (Megatron-LM, Shoeybi et al., arXiv:1909.08053) for the reference language model, on a
// dp × tp DeviceMesh of real MPI ranks, forward AND backward, moving real data; the simulated step is recorded on
// the rank's sim::Timeline.
//
// Placements on the tp axis (T = tp size, r = this rank's tp coordinate):
//   embed  [V, h]            Shard(0): rows [r·V/T, (r+1)·V/T)  — vocab-parallel embedding: the lookup writes the
//                            rows it holds and zeros for the others; all_reduce(sum) over tp gives x_0
//   wq, wk, wv [h, H·d]      Shard(1): column-parallel, whole heads (q heads [r·Hq/T, ...), kv heads [r·Hkv/T, ...),
//                            so every local q head finds its GQA kv head locally)
//   wo [Hq·d, h]             Shard(0): row-parallel; all_reduce(sum) of the partial output
//   w_gate, w_up [h, F]      Shard(1): column-parallel
//   w_down [F, h]            Shard(0): row-parallel; all_reduce(sum) of the partial output
//   head [h, V]              Shard(1): vocab-parallel logits [N, V/T]; cross-entropy is vocab-parallel too: the
//                            row maxima all_reduce(max), the sum of exponentials and the target logit all_reduce(sum)
//                            (one [2N] buffer), so no rank ever holds the full logits
//   attn_norm, mlp_norm, final_norm [h]   Replicate (every tp rank computes the same norm on the same x)
// Backward: the row-parallel layers' input gradients are local; the column-parallel layers' input gradients are
// partial sums over the local heads / ffn columns / vocabulary slice, all_reduce(sum) over tp before the norm's
// backward (Megatron's f/g conjugate operators). Replicated norm weights get identical gradients on every tp rank.
//
// Sequence parallelism (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
// arXiv:2205.05198), SEQUENCE_PARALLEL: the residual stream, the norms and the residual adds are split over tp by
// token rows ([N/T, h] per rank, N = local tokens; seq must be a multiple of T): each all_reduce after a
// row-parallel layer becomes a reduce_scatter(sum) to the rows and an all_gather rebuilds the full [N, h] input
// of the next column-parallel layer; in backward the roles swap (all_gather of the residual gradient before a
// row-parallel layer's backward, reduce_scatter of a column-parallel layer's partial input gradient). The norm
// weights' gradients, computed over each rank's rows only, are all_reduce(sum)ed over tp after backward.
//
// Data parallelism across the dp axis: replica d takes sequences [d·B/dp, (d+1)·B/dp) of the global batch (as in
// lm_dp.h); after backward every local gradient is all_reduce(avg)ed over dp in one flat buffer (DDP without
// buckets, ZeRO stage 0; ZeRO and bucketing on a tp mesh are not built). Global-norm clipping follows
// kernels/optimizer.h's rule: a sharded weight's gradient counts on dp coordinate 0, a replicated norm weight's on
// dp and tp coordinates 0; the pieces are all_reduce(sum)ed over the whole mesh. AdamW (fp32 masters and moments
// of the local shards, bf16 compute copy in mixed precision) is the single-device step's, per element.
//
// Initialisation: each rank's shards are slices of lm_init(global), so the model is the single-device one. The
// simulated step: kernels and collectives in program order on the timeline (tp's all_reduces are on the
// critical path, as in Megatron), then the dp all_reduce, the 8-byte grad-norm all_reduce and AdamW.
//
// Errors: std::invalid_argument naming the field when heads, kv_heads, ffn or vocab is not a multiple of tp, or
// the global batch is not a multiple of dp, or the mesh has axes other than dp and tp; collective errors
// propagate; std::runtime_error for a non-finite gradient norm (the step is not applied).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/lm_checkpoint.h"
#include "models/lm_dp.h"
#include "models/lm_model.h"
#include "models/lm_train.h"
#include "sharding/device_mesh.h"
#include "sim/timeline.h"

namespace shardsim::models {

class LmTpTrainer {
 public:
  // MESH: dp × tp over every rank of WORLD (its transport, made by the caller on TIMELINE, mesh rank = rank).
  LmTpTrainer(const LmConfig& global, const LmTrainConfig& train, sharding::DeviceMesh& mesh,
              runtime::Transport& world, sim::Timeline& timeline, std::string algorithm = "auto",
              bool sequence_parallel = false);
  LmDpStepResult step();
  // Whole fp32 masters (all_gather over tp; collective).
  LmWeights gather_master();
  // Whole training state (all_gather over tp; collective); restore() keeps this rank's shards of SNAPSHOT.
  LmTrainSnapshot gather_state();
  void restore(const LmTrainSnapshot& snapshot);
  int64_t steps_done() const { return step_; }
  const LmConfig& local_config() const { return local_; }
  int tp() const { return tp_size_; }
  bool sequence_parallel() const { return sp_; }
  int dp() const { return dp_size_; }
  // Per-chip bytes of the training state between steps: local shards of parameters (compute dtype), gradients
  // (compute dtype) and optimizer state (fp32 master + m + v for bf16, m + v for fp32); the activations this
  // rank's forward keeps.
  LmDpMemory memory() const;

  enum class Split { replicate, rows, cols };
  static Split split_of(const std::string& name);

 private:
  double forward(const LmBatch& b, LmCache& C, sim::TimeNs& t);
  void backward(const LmBatch& b, const LmCache& C, sim::TimeNs& t);
  void all_reduce_tp(runtime::Tensor& x, collectives::ReduceOp op, sim::TimeNs& t, const char* name);
  // The partial [N, h] output of a row-parallel layer (or partial input gradient of a column-parallel one) to the
  // residual stream: all_reduce(sum) (full [N, h]), or with sp reduce_scatter(sum) to this rank's token rows.
  runtime::Tensor to_seq(runtime::Tensor partial, sim::TimeNs& t, const char* name);
  // The residual stream's rows to the full [N, h] a column-parallel layer reads: identity, or with sp all_gather.
  runtime::Tensor from_seq(const runtime::Tensor& rows, sim::TimeNs& t, const char* name);
  void charge(const kernels::KernelCost& k, sim::TimeNs& t);
  LmWeights gather(const LmWeights& local);
  LmWeights shard(const LmWeights& whole) const;

  LmConfig global_, local_;
  LmTrainConfig train_;
  sharding::DeviceMesh& mesh_;
  runtime::Transport& world_;
  sim::Timeline& tl_;
  std::string algorithm_;
  bool sp_ = false;
  int tp_rank_ = 0, tp_size_ = 1, dp_rank_ = 0, dp_size_ = 1;
  int64_t step_ = 0;
  LmWeights master_, m_, v_, work_, grads_;
  double activation_bytes_ = 0;
};

}  // namespace shardsim::models
