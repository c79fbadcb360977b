// Training-state checkpoints of the reference language model (issue 18): everything a run needs to continue
// at step k bit-identically, in the HDF5 checkpoint format of checkpoint/checkpoint.h (atomic write, per-tensor
// checksums, `complete` attribute, agreed errors).
//
// Contents. For every weight of LmWeights::named_weights() (names "embed", "layers.0.wq", ..., "head"), three
// fp32 datasets with the weight's GLOBAL shape: "master/<name>" (the fp32 master weights), "adam_m/<name>" and
// "adam_v/<name>" (AdamW's first and second moments). The bf16 compute copy is not stored: it is the master
// rounded once (lm_compute_copy), exactly what AdamW's refresh produces, so it is rebuilt bit-identically.
// A mixture-of-experts model with model.moe.bias_update > 0 adds each MoE layer's selection bias (state without
// gradient or moments, kernels::MoeWeights::bias) as "moe_bias/layers.L", fp32 [E]; a file without them (saved
// with bias_update 0) resumes with the config's start (zeros).
// Root attributes: workload "lm_train"; step (updates done, the format's own `step`); model (the shape text of
// lm_model_text, which must match on resume); batch (global sequences per step); dtype (compute dtype at save);
// data_seed and data_position (sequences consumed = step · batch) and rng (the state of the data generator: the
// synthetic data is counter-based Philox, so seed + position is the whole state; the init seed is stored as
// init_seed but not needed after step 0); adamw (hyper-parameters, informative); mesh (dp / ZeRO stage at save);
// config (the config file's text) and shardsim_version.
//
// Layout independence. The file holds whole tensors in the global layout whatever the mesh was: a ZeRO-sharded
// run (stages 1-3) all_gathers master, m and v over dp before saving (LmTpTrainer::gather_state) and rank 0
// writes them; at load every rank reads the whole tensors and keeps the chunks its own mesh gives it
// (LmTpTrainer::restore). So any dp size and ZeRO stage can resume any checkpoint, including the single-device
// reference's. The price is one whole fp32 copy of master + m + v per rank during save and load (12Ψ bytes),
// acceptable for the reference-sized model this trains.
//
// A weights-only file (LmTrainSnapshot::weights_only) holds the master/ group alone: the forward mode's checkpoint.
//
// Errors (ConfigError, the same on every rank, exit 2; message names the file): not a training checkpoint (a file
// of the older `run` schema, datasets weights/<w>, says how to write the current one), a
// model shape different from the config's, a different data seed or a data position that is not step · batch
// of the config (a different global batch), a dataset missing or of the wrong dtype/shape, checksum mismatch
// (checkpoint/ checks). Save failures: RuntimeFault (exit 3) from save_checkpoint.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <map>
#include <string>

#include "models/lm_model.h"
#include "models/lm_train.h"
#include "runtime/world.h"

namespace shardsim::models {

// The whole training state (fp32, global shapes), as saved and loaded. WEIGHTS_ONLY: the weights part alone (what
// `run --checkpoint` writes, the forward mode's state: no master/ moments in the file, attribute contents
// "weights"); loaded, M and V are zeros (a training run resumed from it starts AdamW afresh at its step).
struct LmTrainSnapshot {
  LmWeights master, m, v;
  int64_t step = 0;  // updates done
  bool weights_only = false;
  std::string mesh;  // at load: the mesh the file was saved under (e.g. "dp=2, ZeRO stage 1"); unused at save
};

// "vocab V hidden H layers L heads Hq kv_heads Hkv head_dim d ffn F seq S": what must match to resume.
std::string lm_model_text(const ModelSpec& c);

// Collective over the chips of WORLD (any number of chips per rank); chip 0 writes (every chip passes the same
// arguments; SNAPSHOT only matters on chip 0).
// MESH describes the layout at save (e.g. "dp=2, ZeRO stage 1"); CONFIG_TEXT is stored as the `config` attribute.
void save_lm_train_state(const runtime::World& world, const std::string& path, const ModelSpec& c, const LmTrainConfig& t,
                         const LmTrainSnapshot& snapshot, const std::string& mesh, const std::string& config_text);

// The same over the ranks of COMM (one chip per rank).
void save_lm_train_state(MPI_Comm comm, const std::string& path, const ModelSpec& c, const LmTrainConfig& t,
                         const LmTrainSnapshot& snapshot, const std::string& mesh, const std::string& config_text);

// Collective over the chips of WORLD: every chip reads the whole state (checksums verified once). Checks the file against C
// and T as described above. The returned snapshot's weights are fp32 with C's shapes.
LmTrainSnapshot load_lm_train_state(const runtime::World& world, const std::string& path, const ModelSpec& c, const LmTrainConfig& t);

LmTrainSnapshot load_lm_train_state(MPI_Comm comm, const std::string& path, const ModelSpec& c, const LmTrainConfig& t);

// The single-device state from a snapshot (the bf16 compute copy rebuilt from the master when C is bf16).
LmTrainState lm_train_state_from(const ModelSpec& c, LmTrainSnapshot snapshot);

}  // namespace shardsim::models
