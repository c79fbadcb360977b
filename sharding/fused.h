// Collectives fused with the GEMMs around them, so communication hides behind compute (issue 6).
//
// Every function runs on the group TP (P ranks), moves real data, and charges its kernels and messages to the
// chip's sim::Timeline. The compute engine and the link ports run concurrently, so a chunk's transfer overlaps
// the next chunk's GEMM in the simulated timeline. Results equal the unfused path (the same GEMMs on the same
// rows, the same ring reduction order per row chunk) up to fp32 rounding of the reduction order.
//
//   gemm_all_reduce      C = all_reduce_sum(A · B): A [M, K_r], B [K_r, N] (row-parallel partials), C [M, N].
//                        M is cut into CHUNKS row chunks; chunk i's all_reduce (ring) starts when its GEMM ends
//                        while chunk i+1's GEMM runs (Wang et al., ASPLOS'23 "decomposition").
//   all_gather_gemm      C = all_gather(X) · W: X [M/P rows of this rank, K], W [K, N_r], C [M, N_r]. Ring:
//                        the GEMM on the shard already here starts at once; shard (r - s) mod P arrives at step s
//                        and is multiplied while it is forwarded (Flux / T3-style all_gather overlap).
//   gemm_reduce_scatter  C = reduce_scatter(A · B) over rows: A [M, K_r], B [K_r, N], C [M/P rows, N]. Ring:
//                        the partial of row chunk (r - s - 1) mod P is computed, added to the accumulator that
//                        arrives from r - 1 and passed on to r + 1; rank r ends with its chunk.
// M must be divisible by P for the all_gather / reduce_scatter forms (the row chunks are the shards); CHUNKS >= 1
// and <= M for gemm_all_reduce. Dtypes: fp32 or bf16 (all tensors alike). Errors: UsageError naming the shapes.
//
// FusedTiming reports what docs/MODEL.md defines: T_compute (the GEMMs' busy time), T_comm (the same collective
// unfused, measured by running it alone), T_fused (start to end of the fused op), unfused = T_compute + T_comm,
// overlap efficiency = (T_compute + T_comm - T_fused) / min(T_compute, T_comm), speedup = unfused / T_fused.
#pragma once

#include <string>

#include "runtime/tensor.h"
#include "runtime/transport.h"

namespace shardsim::sharding {

struct FusedTiming {
  double compute_ns = 0;  // sum of the GEMM chunks' durations
  double fused_ns = 0;    // the fused op, start to end (this chip)
  double bytes_sent = 0;
};

FusedTiming gemm_all_reduce(runtime::Transport& tp, const runtime::Tensor& a, const runtime::Tensor& b,
                            runtime::Tensor& c, int chunks, sim::TimeNs ready, const std::string& name);
FusedTiming all_gather_gemm(runtime::Transport& tp, const runtime::Tensor& x, const runtime::Tensor& w,
                            runtime::Tensor& c, sim::TimeNs ready, const std::string& name);
FusedTiming gemm_reduce_scatter(runtime::Transport& tp, const runtime::Tensor& a, const runtime::Tensor& b,
                                runtime::Tensor& c, sim::TimeNs ready, const std::string& name);

// (T_compute + T_comm - T_fused) / min(T_compute, T_comm); 0 when either is 0.
double overlap_efficiency(double compute_ns, double comm_ns, double fused_ns);

}  // namespace shardsim::sharding
