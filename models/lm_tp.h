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
// Fused collectives (FUSED, parallel.fused: true; with sequence parallelism): the tp collectives around the
// GEMMs become the fused ops of sharding/fused.h, the block plans' (issue 6), so their transfers overlap the GEMMs'
// row chunks in the simulated timeline. Forward: all_gather + the column-parallel GEMMs (q/k/v in one gather,
// gate/up in one, the head) = all_gather_gemm; the row-parallel GEMM + reduce_scatter (wo, w_down) =
// gemm_reduce_scatter. Backward: a row-parallel layer's all_gather of dY with its dX GEMM (row chunks as they
// arrive) then its dW GEMM = all_gather_gemm_backward; a column-parallel layer's dX GEMMs with the reduce_scatter
// of dX, and the all_gather of its input (re-gathered: the forward keeps only this rank's rows of the norm
// outputs, as Megatron does, so activations shrink) before its dW GEMMs = gemm_reduce_scatter_backward. The dW
// GEMMs and the row chunks of every GEMM compute what the unfused path computes; the fused reduce_scatters add
// the partial sums in ring order, a different fp32 order than the reduce_scatter collective. The embedding's
// reduce_scatter and all_gather (no GEMM), the cross-entropy all_reduces and the norm-gradient all_reduce stay
// unfused.
//
// Context parallelism (mesh axis cp, between tp and dp: Megatron's rank order tp-cp-dp; the plan unit
// sharding/plans/context_parallel.h, ring_attention_forward / _backward): ring attention (Liu et
// al., arXiv:2310.01889) forward AND backward. Each sequence is Shard(0) over cp: cp rank c holds the tokens of
// sharding::plans::cp_chunks (zigzag: chunks c and 2cp-1-c of 2cp, Megatron's causal load balance; contiguous:
// chunk c of cp), so every token-wise layer (embedding, norms, GEMMs, RoPE at the tokens' global positions, the
// head and cross-entropy) runs on seq/cp tokens per sequence with no communication. Attention: the chip's K/V
// block (all its local sequences, compute dtype) travels round the cp ring in cp-1 sendrecv steps, each posted
// before the compute on the block in hand so it overlaps it; each (query chunk, key chunk) pair that has a
// visible pair is attended with its global offsets into fp32 partials merged by log-sum-exp; O (rounded once to
// the compute dtype) and the merged log-sum-exp per (sequence, chunk) are saved. Backward recomputes from them
// (kernels/attention_backward.h with the final lse, exact for any split): the K/V blocks go round the ring again
// and with each travel its fp32 dK/dV accumulators, to which every chip adds its queries' contributions; after
// cp steps (the last one a dK/dV-only send) they are back at their owner. dQ stays local. Traffic per chip and
// layer: forward cp-1 K/V blocks, backward cp-1 K/V blocks + cp fp32 dK/dV blocks. Weights are replicated
// over cp: gradients are averaged and ZeRO state partitioned over the dp x cp group of each tp coordinate (the
// replicas below are its dp·cp ranks; each chip's loss is the mean over its own seq/cp tokens of each sequence, so
// the average over the group is the global mean). Requires seq a multiple of cp (zigzag: 2cp; with sp also
// (seq/cp) a multiple of tp).
//
// Ulysses (Jacobs et al., "DeepSpeed Ulysses", arXiv:2309.14509; the plan unit sharding/plans/ulysses.h,
// ulysses_seq_to_heads / _heads_to_seq) on the same cp axis (parallel.ulysses: U): the
// sequence is split contiguously over U as above; around attention an all_to_all over cp turns q, k, v [tokens/U,
// H, d] into [all tokens, H/U, d] (each chip's query heads and their GQA kv heads), attention (forward and the
// flash backward from the saved lse) runs locally on whole sequences, and an all_to_all turns O back (backward: dO
// to heads, dQ, dK, dV back to tokens). The head-sharded q, k, v, O and lse are what the backward keeps. Needs
// the local (per tp rank) q heads to be a multiple of U and the local kv heads a multiple or a divisor of U: with
// fewer kv heads than U each is replicated to the U/kv chips whose query heads form its GQA group (as Megatron
// replicates the query groups when a parallel degree exceeds them), and their partial dK/dV are summed on the
// way back. Gradients and ZeRO as for cp.
//
// Data parallelism across the dp axis, with ZeRO: the plan unit sharding/plans/data_parallel.h (stages 0-3,
// gradient buckets overlapping backward, stage-3 gathers one unit ahead) over the dp group of each tp coordinate
// (with cp: its dp x cp group), on this rank's tp shards: Ψ_tp = their parameter count, N_d = dp·cp. Replica d
// takes sequences [d·B/dp, (d+1)·B/dp) of the global batch, so the global batch is identical for any dp. Units:
// 0 = embed, 1 + l = block l, layers + 1 = final norm + head. With sp a bucket's reduction waits for the end of
// backward (the norm weights' gradients are all_reduced over tp after it) unless parallel.overlap_grad_reduce is on
// (LmDpConfig::overlap_grad_reduce: the dp average and that tp sum commute, so each bucket goes when ready). A dp-only mesh (tp = cp = 1) is this
// trainer with every tp and cp collective absent.
// Global-norm clipping follows kernels/optimizer.h's rule: every rank adds the squares of the reduced gradient
// elements of its dp chunk (stage 0: the chunk it would own, so each element counts once over dp), skipping the
// replicated norm weights unless its tp coordinate is 0; the pieces are all_reduce(sum)ed over the whole mesh.
// AdamW (fp32 masters and moments of the owned chunks, bf16 compute copy in mixed precision) is the single-device
// step's, per element.
//
// Activation recomputation (LmDpConfig::recompute, Megatron's full recomputation): the forward keeps only each
// block's input; right before a block's backward (after its ZeRO-3 gather) the block's forward runs again from it,
// for real on the host and on the timeline, with its tp collectives (all_reduce, or with sp all_gather /
// reduce_scatter). Losses and weights are bit-identical to the run without it; the step gains one forward of every
// block (kernels and tp collectives); activations drop to lm_cache_bytes(cache, true).
//
// Initialisation: each rank's shards are slices of lm_init(global), so the model is the single-device one. The
// simulated step: kernels and collectives in program order on the timeline (tp's all_reduces are on the
// critical path, as in Megatron; ZeRO-3's dp gathers issued one unit ahead), each bucket's dp reduction when its
// last unit's gradients are ready, the 8-byte grad-norm all_reduce over the mesh, AdamW (one multi-tensor kernel
// over the owned chunks), then the stage 1-2 parameter all_gathers over dp.
//
// Errors: std::invalid_argument naming the field when zero is not in 0..3, bucket_bytes < 0 (but kMegatronBuckets), heads, kv_heads, ffn
// or vocab is not a multiple of tp, or
// the global batch is not a multiple of dp, seq is not a multiple of cp (2cp zigzag; with sp, seq/cp of tp), or
// the mesh has axes other than dp, cp and tp; collective errors
// propagate; std::runtime_error for a non-finite gradient norm (the step is not applied).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>

#include "collectives/types.h"
#include "models/lm_checkpoint.h"
#include "models/lm_model.h"
#include "models/lm_train.h"
#include "sharding/device_mesh.h"
#include "sharding/plans/block.h"
#include "sharding/plans/context_parallel.h"
#include "sharding/plans/data_parallel.h"
#include "sharding/plans/kv_attention.h"
#include "sharding/plans/pipeline_executor.h"
#include "sharding/plans/pipeline_schedule.h"
#include "sharding/plans/tensor_parallel.h"
#include "sim/timeline.h"

namespace shardsim::models {

// The trainer's data-parallel settings: the ZeRO stage, buckets and collective algorithm of the data-parallel plan
// unit (sharding/plans/data_parallel.h) and activation recomputation per block (lm_model.h): the forward keeps
// only each block's input; right before a block's backward (after its ZeRO-3 gather) its forward runs again.
// MICRO_BATCH (model.micro_batch): sequences per micro-batch on each data-parallel replica (Megatron's
// --micro-batch-size); 0 = the replica's whole batch in one pass. The replica's batch / micro_batch micro-batches
// of a step run forward and backward in turn; their gradients accumulate (one add per unit and micro-batch after
// the first, charged) and the data-parallel reduction runs once per step, its buckets overlapping the last
// micro-batch's backward.
struct LmDpConfig {
  int zero = 0;                             // ZeRO stage 0..3
  // Megatron's rule (sharding/plans/data_parallel.h "Buckets"), > 0 DDP's bytes per bucket, 0 = one bucket
  int64_t bucket_bytes = sharding::plans::kMegatronBuckets;
  std::string algorithm = "auto";           // collective algorithm (collectives/algorithms.h)
  bool recompute = false;
  int64_t micro_batch = 0;                  // sequences per micro-batch and replica; 0 = the replica's batch
  // Pipeline parallelism (mesh axis pp > 1; see "Pipeline parallelism" above): the schedule, virtual stages per
  // chip (interleaved only) and the layers of each model stage (empty: even split).
  sharding::plans::ScheduleKind schedule = sharding::plans::ScheduleKind::one_f_one_b;
  int virtual_stages = 1;
  std::vector<int64_t> pp_layers{};
  // Selective recomputation (Korthikanti et al. 2022, parallel.recompute: selective): recompute the attention core
  // (QK^T, softmax, P·V) in the backward, keep the rest. With the unfused core (ModelSpec::attention_impl) the
  // forward keeps no softmax output and the backward runs the core's forward again (sharding/plans/block.h). The
  // flash-style core never keeps the [s, s] tensors and its backward always recomputes them from q, k and the
  // log-sum-exp (kernels/attention_backward.h), so there selective runs the same kernels as no recompute.
  bool selective = false;
  // Data-parallel overlap (sharding::ParallelPlan): buckets reduced as they are ready (unset: on without sp, off
  // with sp, where the buckets wait for the norm weights' tp all_reduce after backward); the ZeRO 1-2 parameter
  // all_gather overlapped with the next step's forward.
  std::optional<bool> overlap_grad_reduce{};
  bool overlap_param_gather = false;
  // The forward mode only (run: forward_step, never step): what the plan units run in a forward but the trainer's
  // backward does not yet (fused without sp: gemm_all_reduce).
  bool forward_only = false;
  // parallel.chunks (with FUSED and without sp: gemm_all_reduce's pieces; 0 = auto, sharding/fused.h).
  int fused_chunks = 0;
  // parallel.etp (a MoE model, ModelSpec::moe): 1, or tp: the experts' inner sizes split over the tp group.
  int etp = 1;
};

// One pipeline stage's step (this chip): its forward and backward spans in schedule order, the most micro-batches
// of activations it held at once, the bytes it sent to its neighbours (activations forward, gradients backward).
// One stage of the last step, as the report shows it (chip stage·tp·cp·dp: tp, cp and dp coordinates 0). The
// pipeline part of the step runs from 0 to PIPELINE_NS, the last action's end on any stage (the optimizer and the
// dp reduction after it are not counted); a stage's bubble is that minus its busy time (its F and B spans, their
// tp / cp collectives included), i.e. the time it waits for a neighbour.
struct LmStageSummary {
  double busy_ns = 0, bubble_ns = 0, pipeline_ns = 0;
  double peak_activation_bytes = 0;  // most activations held at once (zb_h1: with the pending weight gradients')
  double peak_pending_w_bytes = 0;   // zb_h1: most bytes kept for pending weight-gradient passes at once
  double peak_microbatches = 0;      // the same in micro-batches of the stage's layers (chunks / v)
  double bytes_forward = 0, bytes_backward = 0;
  double mean_f_ns = 0, mean_b_ns = 0, mean_w_ns = 0;  // mean F, B (zb_h1: BI) and BW span
  double bubble_fraction() const { return pipeline_ns > 0 ? bubble_ns / pipeline_ns : 0; }
};

// The per-action costs of the schedule's closed forms as the trainer measured them: the stages' mean F, B (zb_h1:
// BI + W) and W spans (sharding/plans/pipeline_schedule.h, PipeCosts; uniform stages assumed).
sharding::plans::PipeCosts lm_stage_costs(const std::vector<LmStageSummary>& stages);

using LmStageStats = sharding::plans::PipeStageStats;  // sharding/plans/pipeline_executor.h

// ZB-H1's deferred weight gradients of one (chunk, micro-batch): per unit, in backward order, its dW GEMMs with
// their operands (sharding/plans/tensor_parallel.h, WeightGradGemm), and on model stage 0 the embedding's gradient
// input (whole over tp) and tokens. The W pass runs them.
struct LmPendingW {
  std::vector<std::pair<int, sharding::plans::WeightGradGemms>> units;
  runtime::Tensor embed_dx;
  std::vector<int64_t> tokens;
  double bytes() const;
};

// Per-chip bytes of the training state between steps (sharding::plans::DpMemory: measured, and ZeRO's formulas)
// and the activations this rank's forward keeps (lm_cache_bytes; not in the formula).
struct LmDpMemory : sharding::plans::DpMemory {
  double activations = 0;
};

struct LmDpStepResult {
  int64_t step = 0;      // 1-based
  double loss = 0;       // global mean loss before the update
  double grad_norm = 0;  // global norm before clipping
  double clip = 1;
  sim::Breakdown breakdown;  // this chip's simulated step
  double idle_ns() const { return std::max(0.0, breakdown.total - breakdown.compute - breakdown.exposed_comm); }  // no -0.000 from rounding
};

// The serving mode's iteration (LmTpTrainer::serve_step, models/lm_tp_decode.cpp): this data-parallel replica's
// sequences (cache slot, tokens already cached, new tokens) and, on real data, their new tokens concatenated
// sequence-major (Σ rows ids in [0, vocab); shape-only runs may leave them empty). With expert parallelism (a MoE
// model, parallel.ep > 1) the replica spans its ep chips: every one of them is given the whole batch and attends
// the sequences whose slot mod ep is its ep rank (data-parallel attention, as SGLang's and DeepSeek's MoE serving),
// holding their KV cache; the MoE layers route every chip's rows over the ep group (declared per chip's row count
// in shape-only runs).
// REPEAT_BLOCKS (shape-only only): the stage's blocks are simulated until they run periodically, and the period
// is repeated for the others, which is exact: every block of a stage runs the same kernels and collectives on the
// same shapes and ends with its tp reduction, so a block's span depends only on how far the host's kernel issue
// runs ahead of the device when it starts (sim/timeline.h, host issue). With the host's lead not shrinking over a
// block, a block whose kernels the host never gated, or a second block in a row with the same span, means every
// later block runs the same (without host issue: from the first block); the chips of a tp group agree on it (tests/mpi/serve_decode_test.cpp checks the
// times equal the full run's, with and without host issue).
// ORIGIN_NS >= 0 (a shared timeline, apps/serve_disagg.cpp): the timeline is not reset; the iteration starts at
// ORIGIN_NS (absolute ns, no earlier than the chip's previous iteration's end), so its flows meet the flows booked
// on the same chips around it (KV cache transfers); the result's stages stay relative to ORIGIN_NS. REPEAT_BLOCKS
// then repeats the period only over a time no other flow can touch: from the second of two blocks that both start
// at or after QUIET_AFTER_NS (the end of the flows booked before on this chip) to an end at or before HORIZON_NS
// (the earliest flow that may be booked after it). FOREIGN_END_NS: the latest end of such flows booked on this
// chip's timeline (the chip's end is then read from its clock, not from the timeline's last event).
struct LmServeBatch {
  std::vector<sharding::plans::KvSeq> seqs;
  std::vector<int64_t> tokens;
  bool repeat_blocks = false;
  double origin_ns = -1;  // < 0: a fresh timeline (reset) from 0
  double quiet_after_ns = 0, horizon_ns = 1e300, foreign_end_ns = -1;
};
struct LmServeResult {
  // Real data: per sequence, the logits over the whole vocabulary of its last new row (the next token's), on every
  // chip of the replica. Shape-only: empty.
  std::vector<std::vector<float>> logits;
  sim::TimeNs chip_ns = 0;  // this chip's simulated end of the iteration
  sim::TimeNs ns = 0;       // the iteration's simulated time: the latest chip's end over this dp replica
  // Per pipeline stage of this replica: when the batch's rows reached it (0 on the first stage) and when its last
  // chip ended, ns from the iteration's start (the serve scheduler composes batches in flight from them).
  std::vector<sim::Span> stages;
};

class LmTpTrainer {
 public:
  // MESH: dp × cp × tp over every rank of WORLD (its transport, made by the caller on TIMELINE, mesh rank = rank).
  // CP_ZIGZAG: the cp split (zigzag or contiguous), used when the mesh has cp > 1. ULYSSES: the cp axis runs
  // DeepSpeed-Ulysses instead of ring attention (contiguous split; CP_ZIGZAG ignored).
  // DP: ZeRO stage, bucket_bytes, collective algorithm and recompute (LmDpConfig); std::invalid_argument naming the
  // field for a stage outside 0..3 or bucket_bytes < 0. FUSED (parallel.fused, needs SEQUENCE_PARALLEL; else
  // std::invalid_argument naming parallel.fused): the tp collectives around the GEMMs as the fused ops of
  // sharding/fused.h (see "Fused collectives" above).
  LmTpTrainer(const ModelSpec& global, const LmTrainConfig& train, sharding::DeviceMesh& mesh,
              runtime::Transport& world, sim::Timeline& timeline, const LmDpConfig& dp,
              bool sequence_parallel = false, bool cp_zigzag = true, bool ulysses = false, bool fused = false);
  // DDP (ZeRO 0, one bucket after backward, no recompute) with ALGORITHM.
  LmTpTrainer(const ModelSpec& global, const LmTrainConfig& train, sharding::DeviceMesh& mesh,
              runtime::Transport& world, sim::Timeline& timeline, std::string algorithm = "auto",
              bool sequence_parallel = false);
  // Not copied or moved: work_refs_ points into work_.
  LmTpTrainer(const LmTpTrainer&) = delete;
  LmTpTrainer& operator=(const LmTpTrainer&) = delete;
  LmDpStepResult step();
  // The forward mode (`shardsim run` on a model with a vocabulary): the forward of the next step's batch through
  // every plan unit of the step (the embedding, the blocks, the head and the vocab-parallel loss; pp: each stage's
  // forward actions of the schedule, the backward ones left out), no backward, no gradient reduction, no update.
  // R.loss is the global mean loss (as step()'s), R.grad_norm 0, R.breakdown this chip's simulated forward; the
  // weights and steps_done() are unchanged.
  LmDpStepResult forward_step();
  // The serving mode (models/lm_tp_decode.cpp; issue 50): one iteration of BATCH, a forward of its new rows through
  // the embedding, this stage's blocks (the block program with its attention over CACHE: each sequence's new keys
  // and values appended, sharding/plans/kv_attention.h) and on the last stage the final norm and the head on each
  // sequence's last row, the vocab-parallel logits gathered over tp (all_gather, as vLLM gathers them for
  // sampling). pp: the rows go stage to stage (send/recv over the pp axis, one batch in flight); the logits are
  // shared over pp host-side (not simulated). A fresh timeline per iteration unless BATCH.origin_ns >= 0 (see
  // LmServeBatch); collective over the mesh.
  // std::invalid_argument for a plan serving does not run (sp, cp, Ulysses, virtual stages) or a batch whose
  // tokens do not match its rows.
  LmServeResult serve_step(const LmServeBatch& batch, sharding::plans::KvCache& cache);
  // This chip's KV cache for sequences of up to CAPACITY tokens (its layers, its kv heads, the compute dtype).
  sharding::plans::KvCache make_kv_cache(int64_t capacity) const;
  // The forward mode's output of a block stack (vocab 0, real data; empty otherwise): this chip's residual-stream
  // rows after its last virtual stage, every micro-batch in order, ROWS their global ids in the step's batch
  // (sequence b's token i is row b·seq + i) and OUT [rows, hidden] in the compute dtype; OWNER: these rows are the
  // model's output (the last model stage; with sp each tp rank's rows, else tp rank 0's). Every chip holds the same
  // row count (models/lm_validate.h gathers them).
  struct ForwardOutput {
    std::vector<int64_t> rows;
    runtime::Tensor out;
    bool owner = false;
  };
  const ForwardOutput& forward_output() const { return forward_out_; }
  // Whole fp32 masters (all_gather over dp at stages 1-3, then over tp; collective).
  LmWeights gather_master();
  // Whole training state (all_gather over tp; collective); restore() keeps this rank's shards of SNAPSHOT.
  LmTrainSnapshot gather_state();
  void restore(const LmTrainSnapshot& snapshot);
  // The checkpoint's path (models/lm_checkpoint.h): this chip's part of the state in the file's global layout,
  // no tensor gathered over tp, ep or pp (ZeRO stages 1-3 gather over dp first; collective), MOMENTS false: the
  // masters alone (weights only); state_layout: zeros of the same blocks to load into; restore from one.
  LmStateShard state_shard(bool moments);
  LmStateShard state_layout(bool moments) const;
  void restore(LmStateShard& shard);  // reads SHARD's tensors (left as they are)
  int64_t steps_done() const { return step_; }
  const ModelSpec& local_config() const { return local_; }
  int tp() const { return tp_size_; }
  bool sequence_parallel() const { return sp_; }
  int dp() const { return dp_size_; }
  int cp() const { return cp_size_; }
  bool cp_zigzag() const { return zigzag_; }
  bool ulysses() const { return ulysses_; }
  bool fused() const { return fused_; }
  int zero() const { return dp_.zero; }
  int micro_batches() const { return micro_; }  // per step and replica
  int pp() const { return pp_size_; }
  int pp_rank() const { return pp_rank_; }
  const sharding::plans::PipelineSchedule& schedule() const { return schedule_; }
  const LmStageStats& stage_stats() const { return stage_stats_; }  // the last step's
  // Every stage's summary of the last step (collective over the mesh; host-side, not simulated).
  std::vector<LmStageSummary> pipeline_summary();
  int buckets() const { return data_->buckets(); }
  // The last step's per-collective record and fused ops of this chip (the plan units', sharding/plans/block_ops.h):
  // the report's tables (reporting/report.h, gather_chip_figures).
  const sharding::plans::Comm& comm() const { return comm_; }
  const std::vector<sharding::FusedOp>& fused_ops() const { return fused_ops_; }
  // Simulated time of the last step's attention kernels on this chip (the block program's attention cores, ring
  // attention's steps included, and a recomputing backward's; the report's attention_ns).
  double attention_ns() const { return attention_ns_; }
  // Per-chip bytes of the training state between steps, measured from the buffers this rank keeps: parameters
  // (compute dtype; stage 3: the dp chunk), reduced gradients (compute dtype; stages 2-3: the chunk) and optimizer
  // state (fp32 master + m + v for bf16, m + v for fp32; stages 1-3: the chunk), next to ZeRO's formulas (sharding/plans/data_parallel.h)
  // with Ψ = Ψ_tp, this chip's tp shards (replicated norms whole), and N_d = dp; the activations this rank's
  // forward keeps (lm_cache_bytes).
  LmDpMemory memory() const;
  // Ψ_tp: the parameters of this chip's tp shards.
  double local_param_count() const;

  enum class Split { replicate, rows, cols };
  static Split split_of(const std::string& name);
  // NAME is a KV projection (wk, wv) whose heads are replicated over tp (tp above kv_heads: the forward mode).
  bool replicated_kv(const std::string& name) const;
  // How weight NAME is split over tp: the Megatron layout; a MoE layer's router replicated, its experts and shared
  // experts split like the dense MLP with EXPERT_TP (etp = tp), else replicated.
  static Split split_of(const std::string& name, bool expert_tp = false);
  // A MoE model's routing of the last step (forward): per MoE layer of this chip, the tokens each expert received
  // from this chip's routing (kept assignments, its last micro-batch), the aux loss and the dispatch bytes sent.
  struct MoeLayerStats {
    int64_t layer = 0;
    std::vector<int64_t> tokens;  // [experts]
    int64_t received = 0;         // rows this chip's experts received
    double aux = 0, dispatch_bytes = 0;
    sim::TimeNs dispatch_ns = 0;
    double buffer_bytes = 0;      // the dispatch buffers the layer keeps (EpActivations::buffer_bytes)
    sim::TimeNs expert_ns = 0, balanced_expert_ns = 0;  // EpActivations' (the experts' forward; perfect balance)
    double max_tokens = 0, mean_tokens = 0;  // moe_layer_table: of the ep group's tokens per expert (TOKENS empty)
    std::vector<size_t> send_rows;           // rows this chip dispatched to each ep peer (EpActivations')
    // moe_layer_table: the link the ep group's dispatch flows keep busy longest (its bytes at its bandwidth;
    // topology link id, -1: none), its bytes
    // (every flow of the group through it: rows x hidden x dtype size, routed by topology::Topology::route) and
    // those bytes at its bandwidth (a lower bound of the dispatch time that link sets).
    int link = -1;
    std::string link_name;  // topology::Topology::link_name of LINK ("" when -1)
    double link_bytes = 0;
    sim::TimeNs link_bound_ns = 0;
    // Node-limited routing (model.moe.group_limit): the expert groups (nodes) other than this chip's own its routed
    // tokens reach, summed over them (real data: kernels::node_fanout; shape-only: kernels::declared_node_tokens),
    // and those tokens; moe_layer_table: REMOTE_NODES the ep group's mean per token, -1 without a node limit.
    double remote_reach = 0, routed_tokens = 0, remote_nodes = -1;
  };
  std::vector<MoeLayerStats> moe_stats() const;
  // REMOTE_REACH and ROUTED_TOKENS of ST from this chip's routing R of a node-limited model: the groups reached that
  // hold none of this chip's experts (nothing without a node limit).
  void note_remote_reach(const kernels::Routing& r, MoeLayerStats& st) const;
  // Every MoE layer of the model (collective over the world, host-side: no simulated time), from the ep group
  // of the chips at tp, cp and dp coordinate 0 of the stage holding it: MAX_TOKENS and MEAN_TOKENS of the tokens
  // per expert summed over the group's chips (their last micro-batch's routing; TOKENS left empty), AUX their mean; RECEIVED, DISPATCH_BYTES, DISPATCH_NS, BUFFER_BYTES and EXPERT_NS
  // the group's maximum (the slowest chip), BALANCED_EXPERT_NS its mean; LINK, LINK_BYTES and LINK_BOUND_NS the
  // busiest link of the group's dispatch flows.
  std::vector<MoeLayerStats> moe_layer_table();
  // Expert weights this chip holds (elements; its ep shard of every MoE layer, etp-split).
  double expert_param_count() const;
  int ep() const { return ep_size_; }

 private:
  // The busiest link of one MoE layer's dispatch flows over the ep group (moe_layer_table).
  struct DispatchLink {
    int link = -1;
    double bytes = 0;
    sim::TimeNs bound_ns = 0;
  };
  DispatchLink busiest_dispatch_link(const double* rows, runtime::Transport& ep) const;
  runtime::Tensor make(runtime::DType dtype, runtime::Shape shape) const;  // zero-filled, or shape-only
  LmWeights gather_field(sharding::plans::DataParallel::Field field);  // local fp32 shards, whole over dp
  void begin_forward(int unit, sim::TimeNs& t);   // the data-parallel unit's hooks (stage 3: the unit's gather)
  void begin_backward(int unit, sim::TimeNs& t);
  // Block L's forward: the block program (sharding/plans/block.h) on this chip's plan context, from T.
  void block_forward(int64_t l, runtime::Tensor& x, LmCache::Layer& S, sim::TimeNs& t);
  sharding::plans::BlockWeights block_weights(int64_t l) const;  // local layer L's work_ weights, as the block reads them
  static bool is_norm(const std::string& weight);  // a norm weight or bias (replicated over tp)
  static bool is_moe(const std::string& weight);   // a MoE layer's router, expert or shared-expert weight
  sharding::plans::PlanContext context(sharding::plans::Chip& chip);  // this chip's plan units, clock CHIP
  // Forward of micro-batch B through virtual stage CHUNK of this chip: the embedding first when it is model stage
  // 0 (else X is the previous stage's output), its blocks, and on the last model stage the head and the loss
  // (returned; else 0 and X is the output for the next stage).
  double forward(const LmBatch& b, LmCache& C, runtime::Tensor& x, int chunk, sim::TimeNs& t);
  // The backward of one micro-batch (MICRO of micro_batches()): its gradients into grads_ (the first) or into
  // mgrads_, added into grads_ per unit; the data-parallel reduction is told of ready units in the last one only.
  // DX: the gradient from the next stage (ignored on the last model stage, which starts from the loss); on return
  // the gradient for the previous stage (model stage 0: the embedding's backward ran instead).
  // DEFER (zb_h1): the input-gradient pass only (BI); the weight gradients' GEMMs and the embedding's backward go
  // to DEFER for weight_backward (the norms' weight gradients, cheap, stay in BI; so do a MoE layer's, which the
  // ep unit's backward computes whole).
  void backward(const LmBatch& b, LmCache& C, runtime::Tensor& dx, int chunk, int micro, sim::TimeNs& t,
                LmPendingW* defer = nullptr);
  void weight_backward(LmPendingW& w, int micro, sim::TimeNs& t);  // ZB-H1's W pass of micro-batch MICRO
  enum class UnitPart { all, bi, weights };  // zb_h1: what BI completes (UnitGrad::in_bi), what W does
  // The embedding's backward (unit 0) from DX_FULL, the residual stream's gradient whole over tp, of TOKENS.
  void embedding_backward(const runtime::Tensor& dx_full, const std::vector<int64_t>& tokens, int micro,
                          sim::TimeNs& t, UnitPart part);
  void finish_backward(sim::TimeNs& t);  // after every micro-batch: sp's norm-gradient all_reduce
  // This stage's actions of schedule_ (FORWARD_ONLY: its forward actions alone, each micro-batch's saved tensors
  // dropped after its forward); returns the loss (last stage).
  double run_schedule(sim::TimeNs& t, bool forward_only = false);
  void setup_pipeline(const ModelSpec& global);
  // Both modes' start: a fresh timeline and step state (R.step = the step to run), then this stage's schedule from
  // T = 0 (FORWARD_ONLY: its forward actions); returns the stage's loss.
  double start_step(LmDpStepResult& r, sim::TimeNs& t, bool forward_only);
  double last_stage_loss(double local_loss);
  // V summed over the tp ranks in tp order (host-side, not simulated): a block stack's loss under sp, where each tp
  // rank holds 1/tp of the residual rows.
  double sum_over_tp(double v);  // LOCAL_LOSS of the last model stage, on every stage (pp > 1)
  double sum_over(runtime::Transport& g, double v, const char* what);  // V summed over G's members, in G's order
  bool owns(const std::string& weight) const;  // embed on the first model stage, final_norm and head on the last
  sharding::plans::TensorRefs prefs(LmWeights& w) const;  // the tensors this chip owns, in DpParam order
  LmWeights own_layers(const LmWeights& whole) const;     // WHOLE with only this chip's layers
  LmWeights gather_stages(const LmWeights& mine);         // every stage's layers (broadcast over pp)
  std::vector<LmStateBlock> state_blocks(const LmWeights& local) const;  // LOCAL's blocks (state_shard)
  // Unit U's gradients of micro-batch MICRO are complete at T: accumulated (micro_ > 1), and in the last
  // micro-batch handed to the data-parallel unit (grads_ready). zb_h1 in two parts: those BI completes (UnitGrad's
  // in_bi) after BI, the rest (then grads_ready) after W.
  void unit_grads_done(int u, int micro, sim::TimeNs& t, UnitPart part = UnitPart::all);
  LmBatch micro_batch_tokens(int micro) const;  // this chip's tokens of micro-batch MICRO of the step
  void all_reduce_tp(runtime::Tensor& x, collectives::ReduceOp op, sim::TimeNs& t, const char* name);
  void charge(const kernels::KernelCost& k, sim::TimeNs& t);
  // The final norm's backward (rmsnorm, or layernorm with its bias gradient DB), charged from T.
  void norm_backward(const runtime::Tensor& x, const runtime::Tensor& w, const runtime::Tensor& dy, runtime::Tensor& dx,
                     runtime::Tensor* dw, runtime::Tensor* db, sim::TimeNs& t);
  // The global positions of this chip's residual-stream rows (its sp rows of layout_).
  std::vector<int64_t> resid_positions() const;
  // F(ctx) on this chip's plan context with its clock at T; T = the clock after it (the plan units of
  // sharding/plans/ charge plans::Chip, the trainer's own kernels T).
  template <class F>
  auto on_chip(sim::TimeNs& t, F&& f) {
    sharding::plans::Chip chip{&tl_, t};
    auto ctx = context(chip);
    auto r = f(ctx);
    t = chip.t;
    attention_ns_ += chip.attention_ns;
    return r;
  }
  // Throws ConfigKeyError (parallel.algorithm) when a named algorithm cannot run on a group of the plan (ZERO: its
  // ZeRO stage): collectives::plan_obstacle on every group that runs a collective, before the first step.
  void check_plan_algorithm(int zero);
  // The sum over every chip of SQ (its share of the squared gradient norm), replica-symmetric (lm_tp.cpp), and
  // when it is known, from READY.
  std::string grad_norm_gather_algorithm() const;  // the gradient norm's gather over dp (ring under auto)
  std::pair<double, sim::TimeNs> grad_norm_sq(double sq, sim::TimeNs ready);
  LmWeights gather(const LmWeights& local);
  LmWeights shard(const LmWeights& whole) const;
  // Mixture of experts (models/lm_tp_moe.cpp): this chip's experts and their etp shard in local_, the ep groups;
  // whether weight NAME is an expert's (reduced over the expert-data-parallel group).
  void setup_moe();
  bool expert_weight(const std::string& name) const;
  // With sp, does each tp chip route its own rows (etp 1)? With etp = tp they route the gathered rows together.
  bool sp_routes_own_rows() const;
  sharding::plans::BlockMoe block_moe(int64_t l) const;
  // WHOLE (every expert, this chip's tp-gathered ones filled): each expert broadcast over ep from its owner.
  void share_experts(LmWeights& whole);
  // Auxiliary-loss-free balancing (model.moe.bias_update > 0): the step's tokens per expert of this chip's MoE
  // layers (moe_load_, its micro-batches' routing) summed over the replicas by one all_reduce from READY, then
  // every layer's selection bias updated (kernels::update_expert_bias). Returns when the update is done.
  sim::TimeNs update_moe_bias(sim::TimeNs ready);
  // The selection biases in checkpoints (bias_update > 0): share_moe_bias gives WHOLE's MoE layers every stage's
  // current biases (one all_reduce over pp); restore(LmStateShard&) gives this chip's MoE layers the saved ones.
  void share_moe_bias(LmWeights& whole);
  double moe_aux_grad() const;  // d loss / d this chip's aux loss of a micro-batch
  // Serving (models/lm_tp_decode.cpp): the refusals; the logits of the last rows XF [B, h] of the last stage.
  void check_servable() const;
  std::vector<std::vector<float>> serve_logits(const runtime::Tensor& xf, int64_t seqs, sim::TimeNs& t);
  // This chip's share of a replica's batch under ep (see LmServeBatch): its sequences with their tokens, EP_ROWS
  // the new rows of every ep rank, INDEX each of its sequences' position in BATCH.
  LmServeBatch ep_share(const LmServeBatch& batch, std::vector<int64_t>& ep_rows, std::vector<size_t>& index) const;
  // serve_step's pieces: the rows entering this stage (the tp unit's embedding on the first, the previous stage's
  // activations on the others) for new rows at positions POS; the stage's blocks over X (REPEAT_BLOCKS, EP_ROWS
  // non-null under ep); the chip's end and every stage's span into R.
  runtime::Tensor serve_input(const std::vector<int64_t>& tokens, const std::vector<int64_t>& pos, sim::TimeNs& t);
  void serve_blocks(const LmServeBatch& whole, const LmServeBatch& batch, sharding::plans::KvCache& cache,
                    const std::vector<int64_t>& pos, std::vector<int64_t>* ep_rows, runtime::Tensor& x, sim::TimeNs& t);
  void serve_stages(const LmServeBatch& whole, sim::TimeNs stage_start, sim::TimeNs t, LmServeResult& r);

  ModelSpec global_, local_;  // the whole model (what the plan units read), this chip's shard of it
  LmTrainConfig train_;
  sharding::DeviceMesh& mesh_;
  runtime::Transport& world_;
  sim::Timeline& tl_;
  LmDpConfig dp_;
  std::string algorithm_;
  bool sp_ = false;
  bool zigzag_ = true;
  bool ulysses_ = false;
  bool fused_ = false;  // parallel.fused: the sp collectives fused with their GEMMs (sharding/fused.h)
  bool store_ = true;  // false: shape-only (the transport's mode at construction)
  int kv_rep_ = 1;      // tp ranks per KV head: > 1 when tp is above kv_heads (each holds its group's head)
  runtime::Transport* kv_group_ = nullptr;  // training with kv_rep_ > 1: the tp chips sharing this chip's KV head
  // dp_rank_ / dp_size_: the data-parallel replicas of attention and the dense weights, dp x ep (ep innermost).
  int ep_rank_ = 0, ep_size_ = 1, etp_ = 1;
  std::unique_ptr<sharding::plans::EpGroups> ep_groups_;  // a MoE model: mesh["ep"] and (etp > 1) mesh["tp"]
  std::map<int64_t, MoeLayerStats> moe_stats_;  // per model layer, the step's last forward (moe_stats)
  std::map<int64_t, std::vector<int64_t>> moe_load_;  // per local layer, the step's tokens per expert (bias_update)
  runtime::Transport* expert_dp_ = nullptr;  // ep x cp: the experts' replicas (dp x cp chips of one ep coordinate)
  int tp_rank_ = 0, tp_size_ = 1, dp_rank_ = 0, dp_size_ = 1, cp_rank_ = 0, cp_size_ = 1, pp_rank_ = 0, pp_size_ = 1;
  sharding::plans::PipelineSchedule schedule_;
  std::vector<int64_t> layer_global_;          // global index of each local layer
  std::vector<int64_t> chunk_first_, chunk_len_;  // per virtual stage: its local layers
  bool owns_embed_ = true, owns_head_ = true;
  LmStageStats stage_stats_;
  int rep_rank_ = 0, rep_size_ = 1;     // this chip in the dp x cp group of its tp coordinate (cp innermost)
  runtime::Transport* rep_ = nullptr;   // that group: gradient averaging, ZeRO partitions, parameter gathers
  sharding::plans::TokenLayout layout_;  // this chip's token rows of a micro-batch and their global positions
  // FP8 (model.fp8): the recipe the block's linear layers run under, and the elements of this chip's block weights
  // (the once-per-step cast; 0 without FP8).
  kernels::Fp8Recipe fp8_recipe() const;
  double fp8_weight_elements() const;
  sharding::ParallelPlan plan_;
  sharding::plans::Comm comm_;           // the plan units' per-collective counts of the last step
  std::vector<sharding::FusedOp> fused_ops_;
  double attention_ns_ = 0;  // see attention_ns()
  int64_t step_ = 0;
  LmWeights work_, grads_;  // local compute-dtype weights (stage 3: gathered per unit) and local gradients
  sharding::plans::TensorRefs work_refs_;  // prefs(work_), built once per assignment of work_ (not per unit: O(L^2))
  int micro_ = 1;            // micro-batches per step and replica (local_.batch: sequences of one)
  LmWeights mgrads_;         // micro_ > 1: one micro-batch's gradients, added into grads_ per unit
  struct UnitGrad {
    runtime::Tensor *acc, *one;  // grads_'s and mgrads_'s
    // Complete after zb_h1's BI (added then, before a later micro-batch's BI overwrites ONE): the norms' (BI computes
    // them) and a MoE layer's (the ep unit's backward computes its router and experts' dW in BI, not deferred).
    bool in_bi;
  };
  std::vector<std::vector<UnitGrad>> unit_grads_;  // per unit
  std::unique_ptr<sharding::plans::DataParallel> data_;  // ZeRO over rep_ (sharding/plans/data_parallel.h)
  double activation_bytes_ = 0;
  ForwardOutput forward_out_;  // forward_step's output rows (vocab 0, real data)
  void keep_output(int micro, const runtime::Tensor& x, bool last_stage);
  runtime::Tensor dhead_;  // tied embeddings: the head use's gradient [h, V/T], added into embed's at unit 0
};

}  // namespace shardsim::models
