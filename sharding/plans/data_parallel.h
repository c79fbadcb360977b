// Data parallelism with ZeRO stages 0-3 and gradient buckets: the plan unit every trainer uses (the dp group of a
// dp-only mesh, or the dp x cp ranks of one tp coordinate). It owns the fp32 master weights, the AdamW moments and
// the reduced gradients of the parameters it is given, partitions them over REPLICAS, reduces the local gradients
// bucket by bucket as the backward completes them, gathers parameters (stage 3: before each unit's forward and
// backward, one unit ahead) and runs AdamW on the chunk this rank owns. It knows no model: parameters are a list of
// (unit, element count) in a fixed order, and every call receives the model's tensors in that order.
//
// Units: the granularity of gathers and FSDP buckets, numbered in forward order 0 .. units-1 (the language model:
// 0 = embedding, 1 + l = block l, units-1 = final norm + head). The flat gradient order is the backward order
// (unit units-1 first, then downwards), parameters in list order within a unit.
//
// Buckets: whole parameters in flat order are appended to a bucket until it holds at least its limit; a bucket's
// reduction is issued on the simulated timeline when its last unit's gradients are ready (grads_ready), so it
// overlaps the backward of the units before it. The limit (ZeroConfig::bucket_bytes):
//   kMegatronBuckets (the default): Megatron-LM's rule (megatron/core/distributed/distributed_data_parallel.py and
//      distributed_data_parallel_config.py, DistributedDataParallelConfig.bucket_size): each model chunk (an
//      interleaved pipeline's virtual stage; else the chip's whole model) is its own buffer, so no bucket spans two
//      chunks; with overlap_grad_reduce the first chunk on the first pipeline stage is cut into buckets of
//      megatron_bucket_elements(replicas) = max(40,000,000, 1,000,000 x replicas) elements (replicas: the dp x cp
//      group; "larger DP sizes need larger buckets to ensure collectives do not become latency-bound"); every
//      other chunk (pipeline rank > 0, or model chunk > 0: bucketing off "since data-parallel communication on
//      these stages is not on the critical path") and every chunk without overlap_grad_reduce is one bucket.
//   > 0: PyTorch DDP's rule (bucket_cap_mb): buckets of >= bucket_bytes of gradient (compute dtype) over the chip's
//      whole flat buffer, every stage and chunk alike (DDP's 25 MiB: bucket_bytes 26214400).
//   0: one bucket, one reduction after backward.
// ZeRO-3 always uses one bucket per unit (FSDP's units; a unit with expert parameters has a second one, over the
// experts' group).
//
// ZeRO stages (Rajbhandari et al., "ZeRO", SC'20, arXiv:1910.02054). Each bucket of n elements is split over the
// replicas by collectives::Partition{n, replicas}; rank r owns chunk r.
//   0  plain DDP: all_reduce(avg) per bucket; every rank keeps the whole fp32 master, moments and gradient and runs
//      AdamW on all of it.
//   1  optimizer state sharded: reduce_scatter(avg) per bucket into the owned chunk of the whole local gradient
//      buffer (which stays allocated); master and moments of the chunk only; AdamW on it, then all_gather of the
//      updated parameters (compute dtype) per bucket. Traffic Ψ + Ψ, as stage 0's all_reduce.
//   2  as 1, but only the chunk's reduced gradient persists.
//   3  also parameters (FSDP): between steps only the chunk of each unit's parameters; before a unit's forward and
//      again before its backward the unit is all_gathered into the model's working tensors, issued when the
//      previous unit starts (FSDP's one-unit prefetch).
// Padding (stages 1-3; Megatron-LM's distributed optimizer, megatron/core/distributed/param_and_grad_buffer.py,
// _ParamAndGradBuffer: _pad_start_of_param_if_needed and _pad_end_of_bucket_if_needed): every parameter starts at
// a multiple of kParamAlignment = 64 elements of the flat buffer, and every bucket ends at a multiple of
// bucket_alignment(replicas) = lcm(replicas, 128) elements, so the bucket splits into equal chunks on every replica
// (Megatron asserts numel % dp == 0 and shards with a plain slice). The gaps are zeros: they travel in the
// reduce_scatter / all_gather (bytes sent), occupy the gradient and parameter buffers and the chunk's optimizer
// state (memory; Megatron keeps fp32 state for the chunk's parameter ranges only, so that row is up to one
// alignment per parameter high), and AdamW leaves them zero. DpMemory::padding reports the padded elements.
// Stage 0 (plain DDP's all_reduce) is not padded, as Megatron pads only with use_distributed_optimizer.
// Norm piece (kernels/optimizer.h's global-norm rule): the squares of the reduced gradient elements of this rank's
// Partition chunk (stage 0 holds the whole bucket but counts its chunk only), for the parameters marked counted
// (a tensor-parallel trainer marks replicated norm weights counted on one tp coordinate only); the caller
// all_reduces the pieces over the whole mesh.
//
// Mixed precision (compute dtype bf16): compute copy and gradients bf16, masters and moments fp32 (K = 12 bytes of
// optimizer state per parameter in ZeRO's notation); fp32: the fp32 parameters are the masters (K = 8).
// Shape-only (STORE false): storage-less buffers; collectives move headers only; the simulated schedule is the
// real run's.
//
// Collective names on the timeline: all_reduce.grads / reduce_scatter.grads, all_gather.params; state gathers
// all_gather.master / all_gather.adam_m / all_gather.adam_v. Errors: std::invalid_argument naming parallel.zero
// (not 0..3) or parallel.bucket_bytes (< 0 but not kMegatronBuckets); std::logic_error for a tensor of the wrong dtype or a shape-only
// state request; collective errors propagate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kernel_cost.h"
#include "kernels/optimizer.h"
#include "runtime/tensor.h"
#include "runtime/transport.h"
#include "sim/timeline.h"

namespace shardsim::sharding::plans {

// Megatron's alignments (see "Padding" above), in elements.
inline constexpr size_t kParamAlignment = 64;
size_t bucket_alignment(int replicas);  // lcm(replicas, 128)

// ZeroConfig::bucket_bytes: Megatron-LM's bucket rule ("Buckets" above); the default.
inline constexpr int64_t kMegatronBuckets = -1;
size_t megatron_bucket_elements(int replicas);  // max(40,000,000, 1,000,000 x replicas)

struct ZeroConfig {
  int zero = 0;                               // ZeRO stage 0..3
  int64_t bucket_bytes = kMegatronBuckets;    // kMegatronBuckets, > 0 (DDP's rule) or 0 = one bucket after backward
  std::string algorithm = "auto";             // collective algorithm (collectives/algorithms.h)
  // Stages 1-2 (Megatron's --overlap-param-gather): publish() issues no all_gather; the next step's forward gathers
  // them: begin_forward of a bucket's first unit (in forward order) waits for its gather, and issues the next
  // unit's buckets' gathers, which overlap this unit's forward.
  bool overlap_param_gather = false;
  // The forward mode (`run`): the parameters alone. No gradient buffer or AdamW moments are allocated (storage-less
  // tensors of their shapes, so memory() still reports their sizes); reduce_gradients, optimizer_step and
  // gather_state of m or v throw std::logic_error.
  bool forward_only = false;
  // Megatron's rule only (bucket_bytes = kMegatronBuckets): whether buckets are reduced as they are ready (else one
  // bucket per chunk), whether this chip is on the first pipeline stage, and the model chunk of each unit (an
  // interleaved pipeline's virtual stage; empty: one chunk). Only chunk 0 of the first stage is cut into buckets.
  bool overlap_grad_reduce = true;
  bool first_stage = true;
  std::vector<int> unit_chunk{};
};

// One parameter tensor, in the model's fixed order.
struct DpParam {
  int unit = 0;         // 0 .. units-1, forward order
  size_t numel = 0;     // elements of this rank's tensor
  bool counted = true;  // its reduced gradient counts in this rank's norm piece
  bool expert = false;  // reduced and partitioned over the expert replicas (DataParallel's EXPERTS), not REPLICAS
  // A 1-D parameter (a norm weight or a bias): Megatron-LM's no-weight-decay parameter group
  // (megatron/core/optimizer: no_weight_decay_cond, biases and 1-D tensors), which FusedAdam steps with launches of
  // its own (one multi_tensor_apply per group). Decides the optimizer's launches only.
  bool no_decay = false;
};

// The second group of a data-parallel unit: the expert-data-parallel replicas of a mixture-of-experts model's
// expert weights (Megatron-Core's expert data parallel group: the dp ranks of one ep coordinate), and the factor
// their averaged gradients are scaled by (1 / ep: the loss is a mean over the dp x ep replicas while the
// experts' gradients are averaged over dp only; Megatron's expert gradient scaling factor, applied here uncharged).
struct DpExperts {
  runtime::Transport* replicas = nullptr;
  double scale = 1;
};

// The model's tensors in DpParam order (weights, gradients or state of the local shapes).
using TensorRefs = std::vector<runtime::Tensor*>;

// Bytes of the state kept between steps, measured from the buffers, next to ZeRO's formulas (paper §5.1) for
// Ψ = param_count() parameters on N_d = replicas: params P·Ψ (stage 3: /N_d), grads P·Ψ (stages 2-3: /N_d),
// optimizer K·Ψ (stages 1-3: /N_d); P = bytes of the compute dtype, K = 12 mixed precision, 8 fp32. The measured
// bytes include the padding (above), which the formulas do not.
struct DpMemory {
  double params = 0, grads = 0, optimizer = 0;
  double psi = 0;      // Ψ: parameter elements
  double padding = 0;  // elements of padding in this rank's whole flat buffer (every bucket, before sharding)
  // Measured / formula for every row at stages 1-3 (every padded bucket splits evenly): (Ψ + padding) / Ψ.
  double padded_ratio() const { return psi > 0 ? (psi + padding) / psi : 1.0; }
  double formula_params = 0, formula_grads = 0, formula_optimizer = 0;
  double total() const { return params + grads + optimizer; }
  double formula_total() const { return formula_params + formula_grads + formula_optimizer; }
};

class DataParallel {
 public:
  // PARAMS: every parameter of this rank (its shards); UNITS: their unit count; REPLICAS: the group the state is
  // partitioned over and gradients averaged over (shares the chip's timeline); COMPUTE: the compute dtype.
  // EXPERTS: the group of the parameters marked expert (their buckets are their own; ZeRO-3 gathers a unit's dense
  // bucket over REPLICAS and its experts' over EXPERTS).
  DataParallel(std::vector<DpParam> params, int units, const ZeroConfig& config, runtime::Transport& replicas,
               runtime::DType compute, bool store, const DpExperts& experts = {});

  // Takes this rank's chunks of the fp32 MASTER and, when given, moments M and V (else zero), and of the compute
  // copy WORK (bf16 only). Local: every replica passes the same tensors.
  void load(const TensorRefs& master, const TensorRefs* m, const TensorRefs* v, const TensorRefs& work);

  // The step's schedule. begin_step resets the per-unit times. begin_forward / begin_backward return the time the
  // unit may start (stage 3: after its gather into WORK, issued one unit ahead; else T); grads_ready(u, t): unit
  // u's gradients are complete at T (all_grads_ready: every unit's).
  void begin_step();
  sim::TimeNs begin_forward(int unit, const TensorRefs& work, sim::TimeNs t);
  sim::TimeNs begin_backward(int unit, const TensorRefs& work, sim::TimeNs t);
  void grads_ready(int unit, sim::TimeNs t);
  void all_grads_ready(sim::TimeNs t);
  // Every bucket's reduction of GRADS (compute dtype), each issued when its last unit's gradients were ready; adds
  // this rank's norm piece to SQ. Returns max(T, the last reduction's end).
  sim::TimeNs reduce_gradients(const TensorRefs& grads, double& sq, sim::TimeNs t);
  // AdamW on the owned chunks with the gradients scaled by CLIP (inside AdamW: no clip kernel); returns its kernels
  // for the caller to charge in order: FusedAdam's multi-tensor launches (kernels::multi_tensor_launches, depth 4, or
  // 5 writing the compute copy) over this chip's pieces of the parameters, one multi_tensor_apply per parameter
  // group (the weight-decay group, then DpParam::no_decay's), the work of all of them shared by elements.
  std::vector<kernels::KernelCost> optimizer_step(int64_t step, const kernels::AdamWConfig& adamw, float clip);
  // What the gradient norm's local sum of squares costs: Apex/Megatron's multi_tensor_l2norm reading every
  // reduced gradient element this chip holds (the whole buffer without ZeRO, the owned chunks with it) once,
  // 2 FLOPs each, vector class: its multi-tensor launches (depth 1) over the parameters' pieces, then its cleanup
  // kernel. The values themselves are summed by reduce_gradients; this is only the charge.
  std::vector<kernels::KernelCost> grad_norm_cost() const;
  // After the optimizer (ended at T): the updated parameters into WORK (stage 0: local copy; 1-2: all_gather per
  // bucket, or with overlap_param_gather at the next step's forward; 3: nothing, gathered before the next use).
  void publish(const TensorRefs& work, sim::TimeNs t);

  enum class Field { master, m, v };
  // The fp32 FIELD of this rank's parameters, whole over the replicas (all_gather at stages 1-3), into OUT.
  // Collective over the replicas; std::logic_error when shape-only.
  void gather_state(Field field, const TensorRefs& out);

  DpMemory memory() const;
  int buckets() const { return static_cast<int>(buckets_.size()); }
  double param_count() const;  // Ψ: elements of every parameter given
  double padding() const;      // elements of padding over every bucket (0 at stage 0)
  int replicas() const { return size_; }
  const ZeroConfig& config() const { return config_; }

 private:
  // A folded run: fold_broken (runtime/chips.h) before the first step where a bucket's call over the replicas is
  // not symmetric under the replica shift (collectives::fold_obstacle).
  void check_fold() const;
  struct Slot {
    size_t index;   // into the parameter list
    int unit;
    size_t offset;  // in its bucket, elements
    size_t numel;
    bool counted;
    bool no_decay = false;  // DpParam::no_decay
  };
  struct Bucket {
    std::vector<Slot> slots;
    size_t count = 0;     // elements, padding included (what the collectives move)
    size_t real = 0;      // elements of parameters
    int last_unit = 0;    // the unit whose backward completes it (the lowest unit index)
    size_t own_off = 0, own_n = 0;  // this rank's chunk (stage 0: the whole bucket)
    runtime::Tensor master, m, v;   // fp32 [own_n] (fp32 compute: master = the parameters' chunk)
    runtime::Tensor copy;           // compute-dtype chunk refreshed by AdamW (bf16 only)
    runtime::Tensor grad;           // reduced gradient: whole bucket (stages 0-1) or the chunk (2-3)
    bool expert = false;            // over experts_.replicas
  };
  runtime::Transport& group(const Bucket& b) const { return b.expert ? *experts_.replicas : group_; }
  int group_size(const Bucket& b) const { return b.expert ? experts_.replicas->size() : size_; }
  int group_rank(const Bucket& b) const { return b.expert ? experts_.replicas->rank() : rank_; }
  void pack(const Bucket& b, const TensorRefs& w, runtime::Tensor& flat) const;
  void unpack(const Bucket& b, const runtime::Tensor& flat, const TensorRefs& w) const;
  // The element counts of replica R's pieces of the parameters, bucket by bucket in slot order: whole slots
  // (stage 0) or their overlaps with the chunk group rank R mod the bucket's group size owns; what a multi-tensor
  // kernel over the state iterates. GROUP: -1 every parameter; 0 the weight-decay group only; 1 the no-decay group
  // only (DpParam::no_decay).
  std::vector<int64_t> pieces_of(int r, int group = -1) const;
  // The multi-tensor launches (elements each) of the optimizer (depth 4 or 5) and of the gradient norm (depth 1)
  // every replica charges: those of the replica with the most launches (its pieces are cut the most), so the
  // replicas run alike (they meet at the next gather anyway) and a folded run stays exact. Set at construction.
  std::vector<int64_t> adam_launches_, norm_launches_;
  void take_chunk(const Bucket& b, const TensorRefs& w, runtime::DType dtype, runtime::Tensor& dst) const;
  sim::TimeNs gather_bucket(Bucket& b, const TensorRefs& work, sim::TimeNs ready);
  sim::TimeNs reduce_bucket(Bucket& b, const TensorRefs& grads, double& sq, sim::TimeNs ready);

  ZeroConfig config_;
  runtime::Transport& group_;
  DpExperts experts_;
  runtime::DType dtype_;
  bool store_ = true;
  int rank_ = 0, size_ = 1, units_ = 0;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<int>> unit_buckets_;  // stage 3: unit -> its buckets (dense, then experts')
  std::vector<sim::TimeNs> fwd_start_, bwd_start_, grad_ready_;  // per unit, this step
  std::vector<bool> gather_pending_;        // per bucket: its parameter all_gather deferred to the next forward
  std::vector<sim::TimeNs> gather_end_;     // per bucket: the end of its issued, not yet awaited gather (-1: none)
};

// The plan registry's descriptors of the units in this file (sharding/plans/registry.h; listed once by
// make_registry() in registry.cpp).
struct PlanDescriptor;
PlanDescriptor dp_plan_descriptor();

}  // namespace shardsim::sharding::plans
