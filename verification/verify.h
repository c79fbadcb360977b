// Running one collective "case" on real ranks and checking it against a single-device reference.
//
// Shared by `shardsim validate`, `shardsim bench` (its #wrong column) and the tests.
//
// Sizes follow nccl-tests: COUNT is the element count of the per-rank buffer the bandwidth is computed from:
//   all_reduce, broadcast, reduce: the buffer;  reduce_scatter: the input (each rank keeps ~COUNT/p);
//   all_gather(v): the output (each rank contributes ~COUNT/p);  all_to_all(v): the send buffer (COUNT/p per
//   peer; all_to_all needs COUNT % p == 0, other counts are rounded down to a multiple of p);
//   gather: the root's output;  scatter: the root's input (both rounded down to a multiple of p);
//   send_recv: the message (rank r sends to r+1);  barrier: ignored.
// all_gatherv uses skewed counts (rank r contributes ~ COUNT (r+1) / (p(p+1)/2)); all_to_allv sends
// f(src, dst) elements with f varying per pair, zero-size blocks included.
//
// Inputs (rank r, element i) come from a counter-based hash, so every rank can rebuild every other rank's
// input locally and compute the reference for its own output without communication:
//   verifiable: small integers (as nccl-tests does) chosen per dtype, op and p so that every partial result is
//               exactly representable: the check is bit-exact whatever order an algorithm reduces in.
//               sum/avg: |x| <= floor(M/p) with M the dtype's exact-integer limit (or one +-1 per M ranks when
//               p > M); prod: +-1 with at most three +-2s per element (and some zeros); min/max: |x| <= 100;
//               integers: any value in [-100, 100] (wrap-around arithmetic is exact and order-independent).
//   random:     uniform in [-1, 1) (integers: as above), checked with the bound of Higham, "Accuracy and
//               Stability of Numerical Algorithms" (2002), sec. 4.2, for two different reduction orders:
//               |got - want| <= 2 (p-1) u sum_r |x_r|  (+ 2u |want| for avg; prod: 2p (u |prod| + eta)), u = unit
//               roundoff of the storage type (narrow types round at every step), eta its smallest subnormal.
//   special:    verifiable input in which element i of every group of 8 (i % 8 = 1..7) carries special values,
//               placed on rank j = (i / 8) % p (and j + 1) so that the result is exact and the same in every
//               reduction order (each pattern lists what every rank holds):
//                 1 NaN on rank j                          -> NaN for every op
//                 2 +Inf on rank j                         -> sum/avg +Inf, prod +-Inf or NaN (0 * Inf)
//                 3 -Inf on rank j, +Inf on rank j+1       -> sum NaN, max +Inf, min -Inf
//                 4 -0 on every rank (even i/8) or on rank j, +0 elsewhere -> the IEEE signs of zero
//                 5 subnormals: multiples of the smallest subnormal (sum/min/max, exact), or the largest
//                   subnormal on rank j times the verifiable +-1/+-2 of the others (prod, exact)
//                 6 the largest finite value (sum/avg: on every rank, one sign -> overflow: Inf, fp8: saturated;
//                   prod: -max on rank j, +max elsewhere; min/max: +max on rank j, -max on rank j+1)
//                 7 NaN on rank j and +Inf on rank j+1      -> NaN (max(Inf, NaN) is NaN)
//               e4m3 has no infinity: patterns 2 and 3 use 6, 7 uses 1. Integers: the type's largest value on
//               rank j (pattern 1, 3) and its smallest on rank j+1 (2, 3), wrap-around arithmetic is exact.
//               Data-movement collectives carry the special value on every rank (bit-exact transport).
//               The check is bit-exact, except that any NaN matches any NaN (payloads and signs of NaNs
//               produced by arithmetic are not specified by IEEE 754).
#pragma once

#include <string>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::verification {

using collectives::Collective;
using collectives::CollectiveResult;
using collectives::ReduceOp;
using runtime::DType;

struct Case {
  Collective collective = Collective::all_reduce;
  DType dtype = DType::fp32;
  ReduceOp op = ReduceOp::sum;
  std::string algorithm = "auto";
  size_t count = 0;
  bool in_place = false;
  int root = 0;
  bool random_input = false;   // false: verifiable (bit-exact) input
  bool special_input = false;  // verifiable input with special values (above); not with random_input
  size_t chunk_bytes = 0;
  uint64_t seed = 1;
  // Shape-only (runtime/transport.h): no buffers are allocated (send/recv buffers are null), the collective runs
  // its schedule moving only timing headers, nothing is checked (Outcome.checked = 0, digest of nothing). The
  // simulated time and bytes sent equal those of the same case with real data.
  bool shape_only = false;
  // Test hooks (hidden CLI flags), to prove the failure paths: rank 0 passes COUNT + 1 to the collective
  // (mismatched counts across ranks); rank 0 flips a bit of its output before the check.
  bool inject_count_mismatch = false;
  bool inject_wrong_result = false;
};

// One case on this group. Every rank of TP gets the same Outcome (aggregated over the group).
struct Outcome {
  size_t checked = 0;       // output elements compared, summed over ranks
  size_t wrong = 0;         // of which wrong, summed over ranks
  double max_error = 0;     // largest |got - want| (random input), max over ranks
  std::string first_wrong;  // "chip C element I: got X want Y" for the first wrong element (lowest rank)
  double sim_time_ns = 0;   // simulated: latest end over ranks (every rank starts at 0 on a fresh clock)
  double bytes = 0;         // the nccl-tests size: COUNT * element size
  double bytes_sent = 0;    // bytes the busiest chip injected
  std::string algorithm;    // what ran ("auto" resolved)
  std::string explanation;  // why auto chose it
  // Fingerprint of the outputs: sum over ranks of (2r+1) * H(rank r's output bytes), mod 2^64. Equal
  // digests across runs (e.g. 1 or K chips per rank) mean bit-identical outputs on every rank, with high odds.
  // H is FNV-1a-64 over 8-byte words, each step's product folded (h ^= h >> 29), then over the trailing bytes.
  unsigned long long digest = 0;
};

// Runs the case on TP from a fresh simulated clock (the Timeline is reset), checks the result, aggregates.
// Inapplicable algorithms and bad arguments throw UsageError on every rank alike (nothing has been sent yet).
Outcome run_case(runtime::Transport& tp, const Case& c);

// The run_case work without the check, for timing loops: prepare() fills the inputs, execute() runs the
// collective as often as asked, check_local() compares the output of the last execute() on this rank
// (in-place runs overwrite their input: prepare() again before re-checking).
class CaseRunner {
 public:
  CaseRunner(runtime::Transport& tp, const Case& c);
  ~CaseRunner();
  CaseRunner(const CaseRunner&) = delete;
  CaseRunner& operator=(const CaseRunner&) = delete;
  void prepare();
  CollectiveResult execute(sim::TimeNs ready = 0);
  Outcome check_local() const;  // {checked, wrong, max_error, first_wrong} of this rank only
  // Raw buffers, e.g. to time MPI's own collective on the same data.
  void* send_buffer();
  void* recv_buffer();
  size_t send_count() const;  // elements in this rank's send buffer
  size_t recv_count() const;  // elements in this rank's receive buffer

 private:
  struct Impl;
  Impl* impl_;
};

// nccl-tests' bus-bandwidth factor for C on N ranks: all_reduce 2(n-1)/n; reduce_scatter, all_gather(v),
// all_to_all(v), gather, scatter (n-1)/n; broadcast, reduce, send_recv 1; barrier 1 (no data).
double busbw_factor(Collective c, int n);

// Host bytes one rank needs to run C with this case (buffers, scratch, the check's reference blocks).
double host_bytes_needed(const Case& c, int ranks);

// The counts `shardsim validate` uses by default: 0, 1, 2, primes, counts not divisible by typical rank counts,
// and counts above the chunk size it sets.
std::vector<size_t> default_validate_counts();

}  // namespace shardsim::verification
