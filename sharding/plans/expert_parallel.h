// Expert parallelism: the MoE MLP (kernels/moe_mlp.h) with its E routed experts sharded over the ep axis of the
// device mesh (sharding/device_mesh.h: tp-cp-ep-dp-pp), GShard's design (Lepikhin et al. 2020, arXiv 2006.16668)
// as Megatron-Core's alltoall token dispatcher runs it (megatron/core/transformer/moe/token_dispatcher.py).
//
// Each ep rank holds its own tokens (for attention the ep axis is one more data-parallel axis, as in Megatron where
// EP divides DP) and experts [r·E/ep, (r+1)·E/ep) (E must be a multiple of ep). The forward on rank r:
//   routing = router(x) on r's T tokens                 (router weights replicated; capacity per rank's T tokens:
//                                                        GShard's group = the ep rank)
//   xp = permute(x)                                      expert-major = destination-major rows
//   counts all_to_all: to rank j the counts of j's experts (int64, E/ep per peer)      "ep all_to_all (counts)"
//   dispatch all_to_allv: rows for j's experts to j      "ep all_to_allv (dispatch)"   (modelled links, contention)
//   xr = rows regrouped source-major -> expert-major     (moe.sort_chunks, HBM-bound)
//   yr = local experts (grouped GEMMs over the E/ep experts, each at its own token count)
//   combine all_to_allv: rows back to their tokens' ranks (regrouped first)            "ep all_to_allv (combine)"
//   y = unpermute(yp, weights) + shared(x)
// The shared experts (if any) overlap the dispatch (EpOptions::overlap_shared; Megatron's
// --moe-shared-expert-overlap): they are charged from the dispatch's start on the compute engine while the
// all_to_allv occupies the links; the local experts wait for both. The backward runs the same exchange in reverse
// (the combine's gradient is dispatched, the dispatch's combined), and the shared experts' backward overlaps it.
//
// Expert tensor parallelism (etp; Megatron-Core's --expert-tensor-parallel-size): each ep rank is a group of etp
// chips holding the same tokens (a tensor-parallel group's replicated activations) and the same routing; each
// holds the columns [c0, c1) of every local expert's W_gate and W_up and the rows of W_down (shard_etp), and
// exchanges over the ep group of its own etp coordinate. Its experts' outputs are partial sums: combined back,
// unpermuted and added to the (etp-sharded) shared experts' partial output, then summed over etp by one
// all_reduce ("etp all_reduce (output)", as the row-parallel MLP's). The backward sums the partial combine-weight
// gradients (T·k fp32) and the partial input gradients over etp the same way; the router's part is added after.
// With sequence parallelism the caller gathers the tp group's rows first and EpOptions::etp_scatter
// reduce_scatters the sums back to each chip's rows instead (sharding/plans/block.cpp).
//
// Gradients: expert weights are complete for the tokens of this ep group (reduce them over the expert-data-parallel
// group: the dp axis); the router's (and the shared experts') are this rank's partial and are reduced with the
// dense parameters over dp x ep (the executor's data-parallel unit). The aux loss is this rank's group's (the
// single-device reference with capacity.groups = ep computes the same per group).
//
// Shape-only runs (runtime::Tensor shape-only, Transport::shape_only): every rank's routing comes from the declared
// distribution (declared_ep_routing), so each rank knows what every peer sends it; the collectives move timing
// headers only and every simulated time equals a real-data run with those counts.
// Errors: std::invalid_argument for E not a multiple of ep, weights that do not hold this rank's experts, a
// missing declared routing in a shape-only run.
#pragma once

#include <string>
#include <vector>

#include "kernels/moe_mlp.h"
#include "sharding/plans/block_ops.h"

namespace shardsim::sharding::plans {

// The ep group of this chip (experts sharded over it) and, optionally, its etp group (the experts' inner size
// sharded over it); nullptr or size 1: no expert tensor parallelism.
struct EpGroups {
  runtime::Transport& ep;
  runtime::Transport* etp = nullptr;
  // The chips whose tokens share this chip's aux-loss group (a sequence split over them: sp's tp group, cp's or
  // Ulysses' cp group; Megatron-Core's sequence_partition_group): the router's counts before dropping are
  // all-reduced over each ("aux all_reduce (counts)", E int64) and the chip keeps its share of the group's aux loss
  // (kernels::Routing::span_chosen; EpActivations::aux is that share). Empty: the chip's tokens are the group.
  std::vector<runtime::Transport*> span;
  int etp_size() const;
  int etp_rank() const;
};

struct EpOptions {
  std::string algorithm = "auto";  // the all_to_all / all_to_allv algorithm (collectives/registry.h)
  bool overlap_shared = true;      // shared experts during the dispatch / its gradient's exchange
  // etp with sequence parallelism (the etp group is sp's tp group; X and the backward's DY are its all_gathered
  // rows, gathered by the caller): the summed output, and in the backward the summed input gradient, are
  // reduce_scattered to this chip's T / etp rows ("etp reduce_scatter") instead of all_reduced, as sp's
  // row-parallel GEMM does.
  bool etp_scatter = false;
  // Expert placement (placement_by_load): PLACEMENT[slot] = the expert held at slot (rank slot / (E/ep) holds the
  // slots [r·E/ep, (r+1)·E/ep), its weights' experts in slot order). Empty: expert e at slot e (ep_shard's
  // contiguous ranges). A permutation of the experts: routing, values and gradients are unchanged, only which chip
  // computes which expert (and so the links and the slowest chip) moves.
  std::vector<int64_t> placement;
};

// Expert placement by load (DeepSeek's EPLB idea, without replicas): LOAD[e] the expected rows of expert e; the
// experts taken hottest first (ties to the lower id) each go to the ep rank with the least load so far that still
// has a free slot of its E/ep (ties to the first rank from FIRST_RANK on, cyclically), so every rank's load evens
// out (greedy balanced packing). Returns PLACEMENT (EpOptions::placement): rank r's slots hold its experts in
// ascending id order. Deterministic. FIRST_RANK in [0, ep).
std::vector<int64_t> placement_by_load(const std::vector<double>& load, int ep, int first_rank = 0);
// placement_by_load of layer LAYER's load: every ep rank's routed rows per expert (DECLARED, declared_ep_routing's)
// summed; ties start at rank LAYER mod ep, so successive layers' hottest experts land on different chips (with one
// expert per chip a layer's placement cannot even its loads, and a fixed tie-break would put every layer's hottest
// expert, and its activations kept for the backward, on rank 0). Every rank computes the same placement.
std::vector<int64_t> placement_by_layer_load(const std::vector<kernels::Routing>& declared, int ep, int64_t layer);

// The experts of ep rank R of EP: [first, first + count).
struct EpShard {
  int64_t first = 0, count = 0;
};
EpShard ep_shard(int64_t experts, int ep, int rank);

// This chip's etp shard of W (one ep rank's weights): every expert's (and the shared MLP's) W_gate and W_up
// columns and W_down rows [offset(i), offset(i) + size(i)) of an even split of its inner size over ETP
// (collectives::Partition: the first f % etp ranks one more); the router unchanged.
kernels::MoeWeights shard_etp(const kernels::MoeWeights& w, int etp, int rank);

// What one chip's forward keeps (and reports).
struct EpActivations {
  kernels::Routing routing;              // this chip's tokens (capacity over them)
  std::vector<size_t> send_rows;         // rows to each ep peer (dispatch) = rows back from it (combine)
  std::vector<int64_t> recv_counts;      // [ep x local experts]: rows from source s for local expert e
  std::vector<int64_t> local_offsets;    // expert-major offsets of the received rows (local experts + 1)
  runtime::Tensor xr;                    // received rows, expert-major [M, h]
  runtime::Tensor yp;                    // expert outputs back here, permuted order [N, h]
  kernels::ExpertActs experts, shared;
  double aux = 0;                        // this chip's aux loss (its group's; with EpGroups::span its share)
  kernels::Routing slots;                // with EpOptions::placement: ROUTING with experts renamed to slots
  double dispatch_bytes = 0, combine_bytes = 0;  // bytes this chip sent (forward)
  // Simulated time of this chip's experts' grouped GEMMs in the forward (their kernels' sum), and what they would
  // take with the same rows spread evenly over the ep group's experts (perfect balance: every expert ceil(rows of
  // the group / E) rows; sim's kernel model, nothing charged). The slowest chip's expert_ns over the ep group's
  // mean balanced_ns is what imbalance costs.
  sim::TimeNs expert_ns = 0, balanced_expert_ns = 0;
  sim::TimeNs dispatch_ns = 0, combine_ns = 0;   // simulated time of the two all_to_allv calls (forward)
  int64_t local_rows() const { return local_offsets.empty() ? 0 : local_offsets.back(); }
  // Simulated HBM of the exchange buffers at the layer's peak (bytes): the permuted rows and the combined-back
  // outputs (N rows each) and the received, sorted and expert-output rows (M rows each, three buffers), of H
  // elements of DTYPE; the experts' own activations are ExpertActs'.
  double buffer_bytes(int64_t h, runtime::DType dtype) const {
    return double(2 * routing.rows() + 3 * local_rows()) * double(h) * double(runtime::dtype_size(dtype));
  }
};

// The declared routing of every ep rank (shape-only runs): kernels::declared_routing with stream LAYER·ep + rank
// under Zipf (each layer its own hot experts), the rank alone under uniform routing (every layer the same counts),
// and LAYER's histogram row when the distribution has one;
// of TOKENS rows on every rank, or of TOKENS_PER_RANK[rank] rows (ep = its size; ranks may route different counts).
std::vector<kernels::Routing> declared_ep_routing(const kernels::MoeSpec& s, int64_t tokens,
                                                  const kernels::RoutingDistribution& d, int ep, int64_t layer);
std::vector<kernels::Routing> declared_ep_routing(const kernels::MoeSpec& s, const std::vector<int64_t>& tokens_per_rank,
                                                  const kernels::RoutingDistribution& d, int64_t layer);

// The forward on this chip's tokens X [T, h]. W: the router, this rank's experts (W.first_expert = ep_shard's), the
// shared MLP (with etp: shard_etp of them). S.capacity.groups is ignored (the rank's tokens are one group). DECLARED: every rank's routing
// (shape-only X; else unused, may be null). Kernels are charged to CHIP, the collectives' bytes to COMM.
runtime::Tensor ep_moe_forward(const EpGroups& g, const kernels::MoeSpec& s, const kernels::MoeWeights& w,
                               const runtime::Tensor& x, Chip& chip, Comm& comm, EpActivations& keep,
                               const std::vector<kernels::Routing>* declared = nullptr, const EpOptions& o = {});

// The backward from DY [T, h] and AUX_GRAD (dL/d this rank's aux loss): returns DX [T, h]; GRADS (zero_like(W))
// receive this rank's expert gradients (complete) and the router's and shared experts' partial gradients.
runtime::Tensor ep_moe_backward(const EpGroups& g, const kernels::MoeSpec& s, const kernels::MoeWeights& w,
                                const runtime::Tensor& x, const EpActivations& keep, const runtime::Tensor& dy,
                                double aux_grad, kernels::MoeWeights& grads, Chip& chip, Comm& comm,
                                const EpOptions& o = {});

}  // namespace shardsim::sharding::plans
