// Collectives fused with the GEMMs around them, so communication hides behind compute (issue 6).
//
// Every function runs on the group TP (P ranks), moves real data, and charges its kernels and messages to the
// chip's sim::Timeline. The compute engine and the link ports run concurrently, so a chunk's transfer overlaps
// the next chunk's GEMM in the simulated timeline. Results equal the unfused path (the same GEMMs on the same
// rows, the same reduction order per chunk) up to fp32 rounding of the reduction order.
//
//   gemm_all_reduce      C = all_reduce_sum(A · B): A [M, K_r], B [K_r, N] (row-parallel partials), C [M, N].
//                        The output is cut into CHUNKS pieces; piece i's all_reduce starts when its GEMM ends
//                        while piece i+1's GEMM runs (Wang et al., ASPLOS'23, "decomposition"). The cut is along
//                        the longer of M and N (ties: M, rows): a row piece re-reads all of B from HBM, a column
//                        piece re-reads all of A, so cutting the longer side re-reads the smaller operand.
//                        CHUNKS = 0 picks the count (1, 2, 4, ... 64) with the lowest modelled pipeline time:
//                        sum of piece GEMMs, each piece's all_reduce estimate (collectives/algorithms.h) after
//                        both its GEMM and the previous piece's all_reduce; the max over ranks decides, so every
//                        rank picks the same count. On the host, pieces of >= 1 MiB have their all_reduce issued
//                        on the chip's communication engine (collectives/async.h) so the next piece's GEMM runs on
//                        this thread meanwhile (real overlap; bench/async_overlap.sh measures it); the simulated
//                        spans are the synchronous ones either way.
//   all_gather_gemm      C_j = all_gather(X) · W_j for each weight j: X [M/P rows of this rank, K], W_j [K, N_j],
//                        C_j [M, N_j]. Ring: the GEMMs on the shard already here start at once; shard (r - s)
//                        mod P arrives at step s and is multiplied while it is forwarded (Flux / T3-style
//                        all_gather overlap). Several weights share one gather (Q/K/V, gate/up).
//   gemm_reduce_scatter  C = reduce_scatter(A · B) over rows: A [M, K_r], B [K_r, N], C [M/P rows, N]. Ring:
//                        the partial of row chunk (r - s - 1) mod P is computed, added to the accumulator that
//                        arrives from r - 1 and passed on to r + 1; rank r ends with its chunk. The add is not
//                        charged: as in the collectives, reduction arithmetic is fused into the data movement.
// The backward of the two sequence-parallel forms (the trainer's, models/lm_tp.h; Korthikanti et al.,
// arXiv:2205.05198, and Megatron-LM's overlap of the sequence-parallel backward collectives with its GEMMs):
//   all_gather_gemm_backward      backward of Y = reduce_scatter(X · W), a row-parallel GEMM (gemm_reduce_scatter):
//                        dY is this rank's rows [M/P, N], X [M, K_r] and W [K_r, N] local. dX = all_gather(dY) · Wᵀ
//                        [M, K_r] and dW = Xᵀ · all_gather(dY) [K_r, N]. Ring: shard (r - s) mod P of dY arrives
//                        at step s and its rows of dX are computed while it is forwarded; dW is one GEMM over the
//                        gathered dY after the last arrival (the unfused path's GEMM: the same values).
//   gemm_reduce_scatter_backward  backward of Y_j = all_gather(X) · W_j, column-parallel GEMMs (all_gather_gemm):
//                        X this rank's rows [M/P, K], W_j [K, N_j], dY_j [M, N_j]. dX = reduce_scatter(Σ_j dY_j ·
//                        W_jᵀ) [M/P, K] and dW_j = all_gather(X)ᵀ · dY_j [K, N_j]. Two rings run together: the
//                        all_gather of X (re-gathered: the forward keeps only the rows) issued at READY, hidden
//                        behind the dX GEMMs, and the reduce_scatter of dX as in gemm_reduce_scatter (row chunk
//                        (r - s - 1) mod P of Σ_j dY_j · W_jᵀ, the adds of several weights charged as the unfused
//                        path's add kernels); the dW GEMMs (the unfused path's, on the whole X) run once X is whole
//                        and hide the reduce_scatter's last transfers.
// Both: T_comm = the ring collective(s) alone, unfused = the whole dX and dW GEMMs then the collective(s). Shape-only
// operands: cost only, shape-only outputs.
// M must be divisible by P for the all_gather / reduce_scatter forms (the row chunks are the shards); CHUNKS
// in 0..(the cut side's length) for gemm_all_reduce. Dtypes: fp32 or bf16 (all tensors alike). Errors:
// UsageError naming the op and the shapes.
//
// FusedTiming reports what docs/MODEL.md defines, for this chip:
//   T_compute   compute_ns: the fused op's GEMM kernels (pieces)
//   T_comm      comm_ns: the same collective unfused and alone, started on every rank at once: its replay
//               estimate (collectives/algorithms.h), which equals the simulated collective when the element count
//               divides into the ring's chunks (else it is off by up to one element per step)
//   T_fused     fused_ns: start to end of the fused op
//   unfused     unfused_ns: what the unfused path takes: the whole GEMM(s) as single kernels, then the collective
//   overlap efficiency = (T_compute + T_comm - T_fused) / min(T_compute, T_comm); speedup = unfused / T_fused.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "runtime/tensor.h"
#include "runtime/transport.h"

namespace shardsim::sharding {

struct FusedTiming {
  double compute_ns = 0;  // T_compute
  double comm_ns = 0;     // T_comm (unfused collective alone)
  double fused_ns = 0;    // T_fused
  double unfused_ns = 0;  // unchunked kernels + the collective
  double bytes_sent = 0;
  int chunks = 1;             // pieces (the ring's P for the all_gather / reduce_scatter forms)
  bool auto_chunks = false;   // CHUNKS was 0 and the model picked
  std::string cut;            // "rows", "columns" or "ring shards"
  double overlap_efficiency() const;
  double speedup() const { return fused_ns > 0 ? unfused_ns / fused_ns : 0; }
};

// A parallel plan's `fused:` settings (workload configs: parallel.fused, parallel.chunks).
struct FusedPlan {
  bool enabled = false;
  int chunks = 0;  // gemm_all_reduce pieces; 0 = auto
  std::string describe() const;  // "chunks auto" / "chunks 4"; "" when not enabled
};
// Reads `fused: true|false` and `chunks: auto|N` (N >= 1; only with fused: true) of a workload's `parallel:`
// map. TP is the plan's tensor-parallel size: fused needs tp > 1 (there is no collective to hide otherwise).
// OUT_ROWS x OUT_COLS is the fused all_reduce's output: gemm_all_reduce cuts its longer side, so N may not exceed
// that. Errors: ConfigError "FILE:LINE: parallel.chunks: ..." (exit 2).
FusedPlan parse_fused_plan(const ConfigNode& parallel, int tp, int64_t out_rows, int64_t out_cols);

FusedTiming gemm_all_reduce(runtime::Transport& tp, const runtime::Tensor& a, const runtime::Tensor& b,
                            runtime::Tensor& c, int chunks, sim::TimeNs ready, const std::string& name,
                            const std::string& algorithm = "ring");
FusedTiming all_gather_gemm(runtime::Transport& tp, const runtime::Tensor& x, const runtime::Tensor& w,
                            runtime::Tensor& c, sim::TimeNs ready, const std::string& name);
FusedTiming all_gather_gemm(runtime::Transport& tp, const runtime::Tensor& x,
                            const std::vector<const runtime::Tensor*>& ws, const std::vector<runtime::Tensor*>& cs,
                            sim::TimeNs ready, const std::string& name);
FusedTiming gemm_reduce_scatter(runtime::Transport& tp, const runtime::Tensor& a, const runtime::Tensor& b,
                                runtime::Tensor& c, sim::TimeNs ready, const std::string& name);
FusedTiming all_gather_gemm_backward(runtime::Transport& tp, const runtime::Tensor& dy, const runtime::Tensor& x,
                                     const runtime::Tensor& w, runtime::Tensor& dx, runtime::Tensor& dw,
                                     sim::TimeNs ready, const std::string& name);
FusedTiming gemm_reduce_scatter_backward(runtime::Transport& tp, const runtime::Tensor& x,
                                         const std::vector<const runtime::Tensor*>& ws,
                                         const std::vector<const runtime::Tensor*>& dys, runtime::Tensor& dx,
                                         const std::vector<runtime::Tensor*>& dws, sim::TimeNs ready,
                                         const std::string& name);

// (T_compute + T_comm - T_fused) / min(T_compute, T_comm); 0 when either is 0.
double overlap_efficiency(double compute_ns, double comm_ns, double fused_ns);

// ---- reports: the fused ops of a workload, for the text and JSON reports of `run` ----
struct FusedOp {
  std::string name;
  FusedTiming t;
};
// Numbers of OPS flattened (for MPI gathers) and back; names come from the caller.
std::vector<double> pack(const std::vector<FusedOp>& ops);
std::vector<FusedOp> unpack(const double* v, const std::vector<FusedOp>& names);
constexpr int kFusedFields = 8;
// Lines for the text report: one per op plus the sum, and "TOTAL_NS unfused would be ..." for the run.
std::string fused_text(const std::vector<FusedOp>& ops, double total_ns);
nlohmann::json fused_json(const std::vector<FusedOp>& ops, double total_ns);

}  // namespace shardsim::sharding
