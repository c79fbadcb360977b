// Mixture-of-experts kernels on one chip: the router (scores, top-k, combine weights), capacity and token dropping,
// the permutation of token rows to experts and back, the load-balancing auxiliary loss, the grouped GEMM over
// experts of uneven token counts, and the backward of each. The MoE MLP that composes them is kernels/moe_mlp.h.
//
// Router (one token t with logits l[t, 0..E) = x[t]·W_router):
//   scores   s = softmax(l) (Switch, GShard, Mixtral, Qwen3)  |  s = sigmoid(l) (DeepSeek-V3, arXiv 2412.19437 §2.1.2)
//   choice   the top_k experts by s[e] + bias[e] (bias: DeepSeek-V3's auxiliary-loss-free balancing; it only
//            chooses, it never enters a weight); ties to the lower expert id; NaN ranks above every number (as
//            torch.topk), so an all-NaN token goes to experts 0..k-1 with NaN weights and its own output is NaN
//            while every other token's is unaffected.
//   weights  w_j = scale · s[e_j] / Σ_i s[e_i] (normalize: Mixtral, Qwen3 norm_topk_prob, DeepSeek-V3) or
//            w_j = scale · s[e_j]; scale = DeepSeek-V3's routed_scaling_factor (1 elsewhere).
// Capacity (Switch Transformer, Fedus et al. 2021 arXiv 2101.03961; GShard, Lepikhin et al. 2020 arXiv
// 2006.16668, group-level capacity): the tokens are cut into GROUPS equal groups of T/G consecutive rows (one per
// chip whose tokens are routed together: an ep rank's batch); each expert takes at most
//   C = ceil(capacity_factor · (T/G) · k / E)
// assignments of a group. Over capacity, policy `position` keeps the earliest tokens (Switch/GShard), `probs` the
// highest combine weights (Megatron-Core's default --moe-token-drop-policy probs; ties to the earlier token). A
// dropped assignment's weight becomes 0 (the others are not renormalised: the token passes through the
// residual with what is left). capacity_factor <= 0: dropless (MegaBlocks, arXiv 2211.15841; DeepSeek-V3).
// Auxiliary load-balancing loss per group g (Switch eq. 4 with Megatron-Core's top-k normalisation):
//   aux_g = coef · E · Σ_i f_i · P_i,   f_i = c_i / (T_g · k),  P_i = (1/T_g) Σ_{t in g} p[t, i]
// c_i = assignments to expert i in the group before dropping (not differentiated), p = the softmax scores, or
// for sigmoid the scores normalised over all E experts per token (DeepSeek-V3's sequence-wise loss form).
// Uniform routing gives aux_g = coef. The value reported is the mean over groups.
//
// Layout: routing metadata is fp32 / int32 host vectors indexed [t·k + j] (token t, slot j) or [t·E + e]; token
// rows (x, y and their gradients) are runtime::Tensor [T, h] in fp32 or bf16 (arithmetic in fp32). Permuted rows
// are one [N, h] tensor of the kept assignments, expert-major (expert 0's rows first), within an expert in token
// order; offsets[e] .. offsets[e+1] are expert e's rows.
//
// Costs (KernelCost, for sim::Timeline::compute): FLOPs and HBM bytes as listed per function; permute and
// unpermute are HBM-bound copies. Shape-only inputs (kernels/kernel_cost.h): the same checks and costs, no values;
// a shape-only route takes its counts from the caller (Routing::from_counts).
// Errors: std::invalid_argument naming the shapes or the option.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kernel_cost.h"
#include "runtime/tensor.h"

namespace shardsim::kernels {

enum class RouterScore { softmax, sigmoid };
enum class DropPolicy { position, probs };
RouterScore parse_router_score(const std::string& name);  // "softmax" | "sigmoid"; invalid_argument otherwise
const char* router_score_name(RouterScore s);
DropPolicy parse_drop_policy(const std::string& name);  // "position" | "probs"
const char* drop_policy_name(DropPolicy p);

struct RouterOptions {
  int64_t experts = 0;  // E >= 1
  int64_t top_k = 1;    // 1 <= k <= E
  RouterScore score = RouterScore::softmax;
  bool normalize = true;  // normalise the k weights to sum 1 (times scale)
  double scale = 1.0;
  std::vector<float> bias;  // per-expert selection bias [E] (empty: none)
  // Node-limited routing (DeepSeek-V3 §2.1.2 "Node-Limited Routing", arXiv 2412.19437; DeepSeek-V2 §2.2.2
  // device-limited routing, arXiv 2405.04434): the E experts form GROUPS equal groups of consecutive ids (the
  // experts of one node when ep spreads them over GROUPS nodes; HF DeepSeek-V3's n_group); each token first picks
  // the GROUP_LIMIT groups (topk_group, V3's M = 4) of the highest group score, the sum of the group's GROUP_TOP
  // highest choice keys s + bias (V3: K_r / M = 2; V2: 1, the group's highest), ties to the lower group, then its
  // top-k among those groups' experts only. GROUP_LIMIT 0 (or >= GROUPS): every expert is eligible.
  int64_t groups = 1;
  int64_t group_limit = 0;
  int64_t group_top = 0;  // 0: max(1, top_k / group_limit)
  bool group_limited() const { return group_limit > 0 && group_limit < groups; }
};

struct CapacityOptions {
  double factor = 0;   // <= 0: dropless
  DropPolicy policy = DropPolicy::position;
  int64_t groups = 1;  // tokens routed together: T/G consecutive rows each (T must be a multiple of G)
  // Capacity pieces of a group whose tokens several chips route (a sequence split over chips by sp, cp or
  // Ulysses: Megatron-Core drops over each chip's local tokens, the aux loss's group staying the sequence's):
  // each group is cut into SPLIT pieces of T/(G·SPLIT) tokens with capacity C over each, piece p holding the
  // group's tokens ORDER[p·T/(G·SPLIT) ..] (indices within the group, ascending within a piece: a chip's rows in
  // its own order). Empty ORDER: consecutive pieces. `chosen` stays per group (the aux loss's counts).
  int64_t split = 1;
  std::vector<int64_t> order;
  // Expert capacity of a group of TOKENS (see above); INT64_MAX when dropless.
  int64_t capacity(int64_t tokens, int64_t top_k, int64_t experts) const;
  // The same factor and policy over one group of a chip's own tokens (groups 1, no pieces).
  CapacityOptions one_group() const { return {factor, policy, 1, 1, {}}; }
};

// One routing decision for T tokens.
struct Routing {
  int64_t tokens = 0, experts = 0, top_k = 0;
  bool has_values = true;        // false: shape-only (only `counts` is meaningful)
  std::vector<int32_t> expert;   // [T·k] chosen expert of (t, j)
  std::vector<float> weight;     // [T·k] combine weight (0 when dropped)
  std::vector<uint8_t> kept;     // [T·k] 1 = kept, 0 = dropped by capacity
  std::vector<float> scores;     // [T·E] s (softmax or sigmoid), kept for the backward and the aux loss
  std::vector<int64_t> chosen;   // [G·E] assignments per (group, expert) before dropping
  std::vector<int64_t> counts;   // [E] kept assignments per expert (the permuted rows of each)
  int64_t dropped = 0;           // assignments dropped by capacity
  // The aux loss's group when it spans several chips (sequence or context parallel: Megatron-Core's
  // sequence_partition_group): SPAN_CHOSEN [E] the whole group's assignments per expert before dropping (this
  // routing's `chosen` all-reduced over the chips) and SPAN_TOKENS its tokens. Set (non-empty; one group here),
  // aux_loss and router_backward take this chip's share of the group's loss, the shares summing to it:
  //   coef · E · Σ_i c_i / (T_G · k) · (Σ_{t here} p[t, i]) / T_G.
  std::vector<int64_t> span_chosen;
  int64_t span_tokens = 0;
  // Shape-only routing: COUNTS[e] kept rows per expert (from a declared distribution, kernels/moe_mlp.h).
  static Routing from_counts(int64_t tokens, int64_t top_k, std::vector<int64_t> counts);
  // offsets[e] = Σ_{i<e} counts[i], offsets[E] = N.
  std::vector<int64_t> offsets() const;
  int64_t rows() const;  // N = Σ counts
};

// The router's logits LOGITS [T, E] = X [T, h] · W [h, E] (shapes preset, one dtype): every entry one dot product in
// a fixed order (i = 0 .. h-1, fp64 accumulation, rounded to fp32 and stored in the logits' dtype; no FP8
// quantisation: routers stay in high precision), so a token's logits have the
// same bits whatever other rows share the GEMM. A BLAS GEMM's rounding of a row can depend on the row count
// (OpenBLAS's FMA kernels: row 0 of a 16 x 32 product differs between M = 1..8 and M >= 13), and a sharded run
// routes fewer rows per GEMM than its single-device reference: the top-k and capacity decisions, which are not
// continuous in the logits, must see the same values on both. Cost: gemm's (the simulated kernel is the GEMM).
KernelCost router_logits(const runtime::Tensor& x, const runtime::Tensor& w, runtime::Tensor& logits);

// Router on LOGITS [T, E] (fp32 or bf16): scores, top-k, weights; then capacity (every assignment kept when
// dropless). Cost: FLOPs T·E·(5 softmax | 4 sigmoid + k compares) + T·k·3; bytes = logits read, scores written
// (fp32), T·k·(4 + 4 + 1) routing bytes written. Capacity is charged separately (apply_capacity's cost).
KernelCost route(const runtime::Tensor& logits, const RouterOptions& o, Routing& out);
// Capacity and dropping on a routed R (see above); fills kept, weight, chosen, counts, dropped. Cost: one pass
// over the T·k assignments (a prefix count per expert): 2 FLOPs and 9 bytes read + 5 written per assignment (an
// extra sort by weight with policy probs: T·k·log2(T·k) compares).
KernelCost apply_capacity(Routing& r, const CapacityOptions& c);

// The aux loss of R (groups of T/G tokens, G = c.groups), the mean over groups; PER_GROUP (optional) receives each.
// Dropless or not, c_i counts every choice. NaN scores give NaN. Cost: T·E·2 FLOPs, scores read.
double aux_loss(const Routing& r, const RouterOptions& o, double coef, int64_t groups,
                std::vector<double>* per_group = nullptr, KernelCost* cost = nullptr);

// Permuted row of every (t, j): row_of[t·k + j] in [0, N), -1 when dropped. Not a kernel (index bookkeeping
// the permute kernel does on the way).
std::vector<int64_t> permuted_rows(const Routing& r);

// XP[row_of(t, j)] = X[t] for every kept assignment. X [T, h], XP [N, h], one dtype. Cost: 0 FLOPs; bytes =
// 2·N·h·element + N·8 (indices).
KernelCost permute(const runtime::Tensor& x, const Routing& r, runtime::Tensor& xp);
// Y[t] = Σ_j w[t, j] · YP[row_of(t, j)] over the kept slots in slot order, summed in fp32 (0 for a token with
// none). YP [N, h], Y [T, h]. Cost: 2·N·h FLOPs; bytes = (N + T)·h·element + N·12.
KernelCost unpermute(const runtime::Tensor& yp, const Routing& r, runtime::Tensor& y);

// Backward of unpermute: DYP[row_of(t, j)] = w[t, j] · DY[t]; DW[t·k + j] = Σ_i DY[t, i] · YP[row_of(t, j), i]
// (0 when dropped). Cost: 4·N·h FLOPs; bytes = (2N + T)·h·element + N·16.
KernelCost unpermute_backward(const runtime::Tensor& dy, const runtime::Tensor& yp, const Routing& r,
                              runtime::Tensor& dyp, std::vector<float>& dweight);
// Backward of permute: DX[t] = Σ_j DXP[row_of(t, j)] (fp32 sum in slot order; 0 for a token with none). Cost: N·h
// FLOPs; bytes = (N + T)·h·element + N·8.
KernelCost permute_backward(const runtime::Tensor& dxp, const Routing& r, runtime::Tensor& dx);

// Backward of route + capacity + aux loss: DLOGITS [T, E] (the logits' dtype) from DWEIGHT [T·k] (dL/d combine
// weights, from unpermute_backward) and AUX_GRAD = dL/d aux_g for every group (0: no aux loss term), with the
// aux loss's COEF and GROUPS. Through the weights (normalised or not, the dropped slots masked), the aux loss's
// P term (c_i constant), and the softmax or sigmoid. The bias gets no gradient (update_expert_bias).
// Cost: T·E·8 + T·k·6 FLOPs; bytes = scores read, dlogits written, T·k·8 read.
KernelCost router_backward(const Routing& r, const RouterOptions& o, const std::vector<float>& dweight,
                           double aux_grad, double coef, int64_t groups, runtime::Tensor& dlogits);

// Tokens per expert of a step, for reports: COUNTS [E] (Routing::counts, summed over chips for a layer) and the
// assignments dropped by capacity. imbalance = max / mean (1 = perfect balance; E for all on one expert).
struct MoeLoad {
  int64_t max = 0, min = 0, empty = 0, dropped = 0;  // empty: experts with no tokens
  double mean = 0;
  double imbalance() const { return mean > 0 ? double(max) / mean : 1.0; }
};
MoeLoad moe_load(const std::vector<int64_t>& counts, int64_t dropped = 0);

// Node fan-out of a routing (node-limited routing's saving): experts in NODES equal groups of consecutive ids.
// remote_rows: kept assignments to experts outside OWN_NODE (what a per-assignment dispatcher such as
// Megatron-Core's alltoall sends across nodes); remote_tokens: Σ_t distinct nodes other than OWN_NODE among t's
// kept assignments (what a dispatcher sending each token once per destination node, as DeepEP's internode
// kernels, sends across nodes). OWN_NODE -1: every node is remote. Needs a routing with values.
struct NodeFanout {
  int64_t remote_rows = 0, remote_tokens = 0;
};
NodeFanout node_fanout(const Routing& r, int64_t nodes, int64_t own_node);
// Closed form of remote_tokens / T for exchangeable routing (every k-subset of the experts equally likely, e.g.
// iid scores): without a limit (LIMIT 0 or >= NODES) a token reaches D = n·(1 − C(E − E/n, k) / C(E, k)) distinct
// nodes; with node-limited routing at most LIMIT (M), so D = M is the bound (reached when each of the M groups
// keeps one of the k choices, as almost always for k >= M). A reached node is the token's own with probability
// 1/n by symmetry: remote nodes per token = D·(n − 1)/n. NODES must divide EXPERTS.
double expected_remote_nodes(int64_t experts, int64_t top_k, int64_t nodes, int64_t limit);

// Declared node-limited routing (shape-only runs, O.group_limited()): the tokens of T that reach each of the
// O.groups expert groups (nodes) when COUNTS [E] are the kept assignments per expert (a declared distribution's
// marginals, e.g. declared_routing's counts; they stay as declared: the distribution states the loads the limited
// router produces). Each token reaches R = min(k, M) groups (M = group_limit; V3's router reaches M almost always
// when k >= M), so the groups' reaches sum to T·R: group g gets a share in proportion to its assignments Q_g,
// within [ceil(Q_g / min(k, E/G)), min(T, Q_g)] (a token brings at most min(k, E/G) assignments to a group, and
// reaches it at most once), by largest remainder (ties to the lower group). Uniform counts give T·M/G per group:
// remote nodes per token M·(G−1)/G, expected_remote_nodes' bound. Deterministic; throws unless group-limited.
std::vector<int64_t> declared_node_tokens(const RouterOptions& o, const std::vector<int64_t>& counts, int64_t tokens);

// DeepSeek-V3's auxiliary-loss-free balancing step (arXiv 2412.19437 §2.1.2; Wang et al. 2024, arXiv 2408.15664):
// bias[e] += gamma · sign(mean_i load_i − load_e) (sign 0: unchanged), in fp32. LOAD: the tokens each expert took
// in the step (Routing::counts, after capacity: Megatron-Core's local_tokens_per_expert, the routing map summed
// over the step's micro-batches and all-reduced over its TP x CP x DP group before get_updated_expert_bias).
void update_expert_bias(std::vector<float>& bias, const std::vector<int64_t>& load, double gamma);

// ---- Grouped GEMM: one GEMM per expert, each of its own token count (and its own inner size) ----
// Megatron-Core's GroupedMLP (CUTLASS grouped GEMM) runs them as one kernel. Cost: each group's KernelCost (its
// shape for the kernel model's tile/wave quantization, its own FLOPs and bytes); groups of 0 rows cost nothing;
// total() is the one kernel a chip charges (sim::grouped_kernel_time: per-group tiles, shared waves, one launch).
struct GroupedCost {
  std::vector<KernelCost> groups;  // one per group (an empty group's cost has 0 FLOPs and 0 bytes)
  // One grouped kernel: FLOPs and bytes summed, the name and dtype of the first group; shape: the non-empty groups'
  // work as KernelShape::groups (sim::grouped_kernel_time charges it), m = their rows, n, k, batch and class of the
  // first of them (a report's label); no non-empty group: no shape.
  KernelCost total() const;
  void add(const GroupedCost& o);  // append O's groups
};

// C_g = A[offsets[g] : offsets[g+1]] · B_g for every group g. A [N, K] (rows grouped), B_g [K, n_g], C_g
// [rows_g, n_g] (shapes preset). One dtype.
GroupedCost grouped_gemm_rows_in(const runtime::Tensor& a, const std::vector<int64_t>& offsets,
                                 const std::vector<const runtime::Tensor*>& b, std::vector<runtime::Tensor>& c);
// C[offsets[g] : offsets[g+1]] = A_g · B_g. A_g [rows_g, k_g], B_g [k_g, N'], C [N, N'].
GroupedCost grouped_gemm_rows_out(const std::vector<runtime::Tensor>& a, const std::vector<const runtime::Tensor*>& b,
                                  const std::vector<int64_t>& offsets, runtime::Tensor& c);
// Backward of grouped_gemm_rows_in: DA [N, K] += ... written (overwritten when ACCUMULATE is false, else added in
// fp32) = DC_g · B_g^T per group; DB_g = A_g^T · DC_g (DB entries may be null: no weight gradient).
GroupedCost grouped_gemm_rows_in_backward(const runtime::Tensor& a, const std::vector<int64_t>& offsets,
                                          const std::vector<const runtime::Tensor*>& b,
                                          const std::vector<runtime::Tensor>& dc, runtime::Tensor* da,
                                          bool accumulate, const std::vector<runtime::Tensor*>& db);
// Backward of grouped_gemm_rows_out: DA_g = DC[group rows] · B_g^T, DB_g = A_g^T · DC[group rows].
GroupedCost grouped_gemm_rows_out_backward(const std::vector<runtime::Tensor>& a,
                                           const std::vector<const runtime::Tensor*>& b,
                                           const std::vector<int64_t>& offsets, const runtime::Tensor& dc,
                                           std::vector<runtime::Tensor>& da, const std::vector<runtime::Tensor*>& db);

}  // namespace shardsim::kernels
