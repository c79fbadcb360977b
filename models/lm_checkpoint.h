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
// Layout independence. The file holds whole tensors in the global layout whatever the mesh was. A sharded run
// saves and loads through LmStateShard: each chip writes the block of each tensor it holds (one chip per block:
// the owner; ZeRO stages 1-3 first all_gather master, m and v over dp, LmTpTrainer::state_shard) and reads back the
// block its own mesh gives it (a hyperslab), so no chip ever holds a whole tensor it does not own and any mesh can
// resume any checkpoint, including the single-device reference's. The datasets' chunks are those of one writer
// writing the whole tensor (checkpoint::Chunking::Kind::whole), so the file is the same byte for byte whatever the
// mesh that wrote it. The LmTrainSnapshot overloads hold whole tensors (one chip writes them; every chip, or one,
// reads them): the single-device reference's state.
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
#include <vector>

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

// One chip's part of a training state, in the file's global layout. MASTER (and M, V unless WEIGHTS_ONLY) hold this
// chip's tensors, fp32, in named_weights() order; BLOCKS[i] says which dataset and offset tensor i is (its global
// name: pipeline stages number their layers locally) and whether this chip owns it (writes it and counts it for
// the checksum; every element of the state has exactly one owner). MOE_BIAS: the selection biases of this chip's
// MoE layers (model.moe.bias_update > 0) by global layer, written by BIAS_OWNER. STEP, WEIGHTS_ONLY and MESH as in
// LmTrainSnapshot.
struct LmStateBlock {
  std::string dataset;  // the weight's global name, e.g. "layers.5.wq" (the file's "master/layers.5.wq", ...)
  runtime::Shape offset;
  bool owner = false;
};
struct LmStateShard {
  LmWeights master, m, v;
  std::vector<LmStateBlock> blocks;
  std::map<int64_t, std::vector<float>> moe_bias;
  bool bias_owner = false;
  int64_t step = 0;
  bool weights_only = false;
  std::string mesh;
};

// Collective over the chips of WORLD (any number of chips per rank): each chip writes the blocks it owns.
// MESH describes the layout at save (e.g. "dp=2 x tp=4, ZeRO stage 1"); CONFIG_TEXT is stored as the `config`
// attribute.
void save_lm_train_state(const runtime::World& world, const std::string& path, const ModelSpec& c, const LmTrainConfig& t,
                         const LmStateShard& shard, const std::string& mesh, const std::string& config_text);

// Collective over the chips of WORLD: each chip reads its blocks into SHARD (its tensors and blocks as
// LmTpTrainer::state_layout made them; M and V are read when they hold tensors and the file has moments, else left
// as they are) and sets its step, weights_only and mesh. Checks the file against C and T as described above;
// checksums verified from the owners' blocks.
void load_lm_train_state(const runtime::World& world, const std::string& path, const ModelSpec& c, const LmTrainConfig& t,
                         LmStateShard& shard);

// Whole tensors: chip 0 writes SNAPSHOT (it only matters on chip 0). Collective over the chips of WORLD.
void save_lm_train_state(const runtime::World& world, const std::string& path, const ModelSpec& c, const LmTrainConfig& t,
                         const LmTrainSnapshot& snapshot, const std::string& mesh, const std::string& config_text);

// The same over the ranks of COMM (one chip per rank).
void save_lm_train_state(MPI_Comm comm, const std::string& path, const ModelSpec& c, const LmTrainConfig& t,
                         const LmTrainSnapshot& snapshot, const std::string& mesh, const std::string& config_text);

// Whole tensors, collective over the chips of WORLD: HOLDER's chip (every chip when HOLDER is -1) gets the whole
// state, fp32 with C's shapes; the others get the step, weights_only and mesh alone (no tensors).
LmTrainSnapshot load_lm_train_state(const runtime::World& world, const std::string& path, const ModelSpec& c,
                                    const LmTrainConfig& t, int holder = -1);

LmTrainSnapshot load_lm_train_state(MPI_Comm comm, const std::string& path, const ModelSpec& c, const LmTrainConfig& t);

// The single-device state from a snapshot (the bf16 compute copy rebuilt from the master when C is bf16).
LmTrainState lm_train_state_from(const ModelSpec& c, LmTrainSnapshot snapshot);

}  // namespace shardsim::models
