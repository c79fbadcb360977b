// Internal to apps/train*.cpp (not a public header): the training report's pieces (apps/train_report.cpp), for
// `train` and for `run`, the executor's forward mode (apps/train.cpp's run_train_dp).
#pragma once

#include <optional>
#include <string>

#include "apps/train_setup.h"
#include "models/lm_checkpoint.h"
#include "models/lm_tp.h"
#include "reporting/report.h"
#include "sharding/device_mesh.h"
#include "sim/timeline.h"

namespace shardsim::apps::train_detail {

// The summary of the last step (or the mean step on one chip) from its breakdown B: step time, tokens/s, MFU.
void finish_simulated(reporting::RunReport& r, const sim::Breakdown& b);

// The memory rows of MEM (bytes per chip) beside ZeRO's formulas in PSI ("Psi" or "Psi_tp") over DP_SIZE replicas,
// BASIS the rows' basis line. FORWARD (the forward mode): the parameters alone and one micro-batch's forward
// tensors (an upper bound).
reporting::TrainMemory memory_of(const models::LmDpMemory& mem, const TrainSetup& s, const std::string& basis,
                                 const char* psi, int dp_size, bool forward);

// The mesh attribute of a checkpoint, N chips and DP_SIZE replicas: "pp=2 x dp=2 x tp=2 (sequence parallel), ZeRO
// stage 1".
std::string mesh_text_of(const TrainSetup& s, int dp_size);

// The report's head, printed before the first step: the model, topology, MESH, the plan line (the plan registry's
// one text for both modes, and in training the trainer's BUCKETS), the data line and the RESUMED state.
reporting::RunReport report_head(const TrainFlags& f, const TrainSetup& s, int n, int dp_size,
                                 const sharding::DeviceMesh& mesh, int buckets,
                                 const std::optional<models::LmTrainSnapshot>& resumed);

// The report's tail figures into REP after the last step: the memory rows, the pipeline's stages, the collected
// per-chip / per-collective / fused / per-op tables FIGS (the forward's headline is the chip that finishes last,
// run's rule; a training step's stays chip 0's step) and the MoE rows. Collective over the trainer's chips (the
// pipeline and MoE sections gather).
void report_figures(models::LmTpTrainer& trainer, const TrainSetup& s, const TrainFlags& f,
                    const reporting::RunReport& figs, int n, int dp_size, reporting::RunReport& rep);

}  // namespace shardsim::apps::train_detail
