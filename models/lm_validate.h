// Validating a sharded training run against the single-device reference (models/lm_train.h): the limit on each
// step's loss difference, derived from the dtype and the step, and the comparison.
//
// fp32: 1e-5 absolute at every step. The sharded trainers and the reference differ only in fp32 summation order
// (LmDp/LmTp measure <= 4.5e-8 over their tests), so 1e-5 is far above that and far below any plan error.
//
// bf16 (mixed precision: bf16 compute copy, activations and gradients, fp32 masters): relative, 2^-9 x STEP at
// step STEP (1-based). Reasoning: at step 1 both runs hold the same weights; the sharded forward rounds its
// partial sums to bf16 before each reduction where the reference rounds the whole sum once, so the loss differs
// by about one bf16 rounding, 2^-9 relative (half of bf16's 2^-8 spacing). Every update then starts from
// gradients that differ by about one rounding as well; AdamW's update follows each gradient component's sign and
// ratio to its running RMS, so the weights drift apart by a similar amount per step and the loss difference grows
// about linearly with the number of updates instead of staying at one rounding (a fixed 2^-9 failed at steps 4-5:
// configs/lm_train_dp4.yaml at dp 4 measured 0.0037 at step 5, under this rule's 0.0098). A plan error is far
// larger: a gradient reduction that loses half of the replicas' contributions moves the loss by several times the
// limit within a few steps (tests/unit/lm_validate_test.cpp). Not caught by any loss check: a reduction that sums
// instead of averaging, since AdamW normalises the gradient's scale (the printed gradient norm shows it).
//
// FP8 (model.fp8: tensor or block, in either dtype): 3 % relative at every step, the bound docs/MODEL.md ("FP8
// training") and tests/e2e/fp8.sh hold FP8 losses to against the bf16 reference's. Each chip quantises the
// operands as it holds them (the amax over its shard and micro-batch), the single-device reference over the whole
// batch, so the two runs round to different E4M3 values by design and differ by up to the quantisation's own
// effect on the loss, not by summation order. Only errors that move the loss by more than 3 % fail it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/fp8.h"
#include "models/lm_model.h"
#include "models/lm_train.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"
#include "runtime/world.h"

namespace shardsim::models {

struct LossTolerance {
  double limit = 0;
  bool relative = false;  // |loss - reference| / |reference| (bf16) or |loss - reference| (fp32)
  std::string rule;       // one line: the rule and why
};
// The limit at STEP (1-based) for a run in DTYPE (fp32 or bf16; std::invalid_argument otherwise) and FP8 scaling.
LossTolerance loss_tolerance(runtime::DType dtype, int64_t step, kernels::Fp8Scaling fp8 = kernels::Fp8Scaling::none);

struct LossCheck {
  bool passed = true;
  double error = 0;       // the error at the step closest to (or furthest beyond) its limit
  LossTolerance tolerance;  // that step's limit
  int64_t step = 0;
  int64_t steps = 0;      // steps compared
};
// The single-device reference's losses for a run whose last step is T.steps, REFERENCE[i] at step i + 1 (what
// check_losses reads): from the seeded initial state, or, for a run resumed from a checkpoint (RESUMED), from that
// same checkpoint with the run's own hyper-parameters, so a run resumed with a changed learning rate is compared
// with a reference that changed it at the same step (not with one retrained from step 0 under the new rate). The
// steps up to the checkpoint's are NaN: a resumed run reports none of them.
struct LmTrainSnapshot;
std::vector<double> reference_losses(const ModelSpec& c, const LmTrainConfig& t, const LmTrainSnapshot* resumed);

// LOSSES: (step, loss) of the run; REFERENCE[i]: the reference's loss at step i + 1. A NaN error fails.
LossCheck check_losses(runtime::DType dtype, const std::vector<std::pair<int64_t, double>>& losses,
                       const std::vector<double>& reference, kernels::Fp8Scaling fp8 = kernels::Fp8Scaling::none);

// ---- Output rows (the forward mode of a block stack: `run` on kind transformer_block or mlp) ----
// Rank 0's copy of every owner chip's rows: ROWS (global row ids, as doubles) in chip order and their values VALS
// [total, hidden] fp32; other ranks get nothing. TOTAL = rows gathered.
struct GatheredRows {
  int total = 0;
  std::vector<double> rows;
  std::vector<float> vals;
};
// Collective over WORLD: each chip passes OWNER (whether its rows count: replicas pass false), its global row ids
// ROWS and OUT [rows, HIDDEN]. One chip per rank: MPI_Gather(v) to rank 0; several chips per rank (any
// row counts): the owner flags through the chip router, then each owner's [row ids, values] broadcast from it.
GatheredRows gather_owner_rows(const runtime::World& world, bool owner, const std::vector<int64_t>& rows,
                               const runtime::Tensor& out, int64_t hidden);

// The gathered rows against the reference's output REF [rows, hidden] (row r of the step's batch is REF's row r):
// max |y - y_ref| over every element (a non-finite y counts as infinite), max |y_ref|, their ratio (max |y - y_ref|
// when the reference is all zero); PASSED when every reference row was gathered exactly once and the ratio is
// within TOLERANCE.
struct RowCheck {
  bool passed = true;
  double max_abs_error = 0, max_abs_reference = 0, relative_error = 0, tolerance = 0;
};
RowCheck check_rows(const GatheredRows& got, const runtime::Tensor& ref, double tolerance);

}  // namespace shardsim::models
