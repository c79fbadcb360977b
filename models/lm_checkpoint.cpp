#include "models/lm_checkpoint.h"

#include <sstream>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "common/error.h"

namespace shardsim::models {

using runtime::DType;
using runtime::Tensor;

namespace {

constexpr const char* kGroups[3] = {"master/", "adam_m/", "adam_v/"};

std::string adamw_text(const LmTrainConfig& t) {
  std::ostringstream os;
  os.precision(9);
  os << "lr " << t.adamw.lr << " beta1 " << t.adamw.beta1 << " beta2 " << t.adamw.beta2 << " eps " << t.adamw.eps
     << " weight_decay " << t.adamw.weight_decay << " max_grad_norm " << t.max_grad_norm;
  return os.str();
}

// Layer L's selection bias is saved when it is state (model.moe.bias_update > 0 updates it every step).
bool saves_moe_bias(const ModelSpec& c, int64_t l) { return c.moe && c.moe->bias_update > 0 && c.moe_layer(l); }
std::string moe_bias_name(int64_t l) { return "moe_bias/layers." + std::to_string(l); }

}  // namespace

std::string lm_model_text(const ModelSpec& c) {
  std::ostringstream os;
  os << "vocab " << c.vocab << " hidden " << c.hidden << " layers " << c.layers << " heads " << c.heads
     << " kv_heads " << c.kv_heads << " head_dim " << c.head_dim << " ffn " << c.ffn << " seq " << c.seq;
  // The block variants, only where they differ from the Llama block (files saved before them read the same).
  if (c.norm != sharding::NormKind::rmsnorm) os << " norm " << sharding::norm_name(c.norm);
  if (c.mlp != sharding::MlpKind::swiglu) os << " mlp " << sharding::mlp_name(c.mlp);
  if (c.position != sharding::PositionKind::rope) os << " position " << sharding::position_name(c.position);
  if (c.tied_embeddings) os << " tied_embeddings";
  return os.str();
}

namespace {

// A chip's tensors of the state (master, m, v; null or empty when absent) and their blocks in the global layout:
// the one save and load path of LmStateShard and of whole snapshots.
struct Blocks {
  const LmWeights* parts[3] = {nullptr, nullptr, nullptr};
  const std::vector<LmStateBlock>* blocks = nullptr;
  const std::map<int64_t, std::vector<float>>* bias = nullptr;  // this chip's layers' selection biases
  bool bias_owner = false;
  // dataset -> index into BLOCKS (and into each part's named_weights()).
  std::map<std::string, size_t> index() const {
    std::map<std::string, size_t> out;
    for (size_t i = 0; blocks && i < blocks->size(); ++i) out[(*blocks)[i].dataset] = i;
    return out;
  }
};

const char* kLayout = "Replicate (whole, global layout)";

void save_blocks(const runtime::World& world, const std::string& path, const ModelSpec& c, const LmTrainConfig& t,
                 const Blocks& in, int64_t step, bool weights_only, const std::string& mesh,
                 const std::string& config_text) {
  const int groups = weights_only ? 1 : 3;  // the weights part: master/ alone
  const LmWeights ref = lm_zeros(c, DType::fp32, false);  // the global shapes (no storage)
  const auto shapes = ref.named_weights();
  const auto index = in.index();
  std::vector<std::pair<std::string, const Tensor*>> named[3];
  for (int g = 0; g < groups; ++g)
    if (in.parts[g]) named[g] = in.parts[g]->named_weights();
  std::vector<Tensor> empty;  // stable storage for the blocks this chip does not write
  empty.reserve(3 * shapes.size() + size_t(c.layers));
  std::vector<checkpoint::CheckpointEntry> entries;
  for (int g = 0; g < groups; ++g)
    for (const auto& [name, whole] : shapes) {
      const runtime::Shape& shape = whole->shape();
      const auto it = index.find(name);
      if (it != index.end() && (*in.blocks)[it->second].owner) {
        const size_t i = it->second;
        if (i >= named[g].size() || named[g][i].second->dtype() != DType::fp32 ||
            named[g][i].second->rank() != whole->rank())
          throw std::logic_error("save_lm_train_state: this chip's " + std::string(kGroups[g]) + name +
                                 " is not an fp32 block of " + runtime::shape_str(shape));
        entries.push_back({kGroups[g] + name, named[g][i].second, shape, (*in.blocks)[i].offset, kLayout, true});
      } else {
        empty.emplace_back(DType::fp32, runtime::Shape(shape.size(), 0));
        entries.push_back({kGroups[g] + name, &empty.back(), shape, runtime::Shape(shape.size(), 0), kLayout, false});
      }
    }
  // The selection biases of aux-loss-free balancing (state beside the weights, no moments): moe_bias/layers.L.
  std::vector<Tensor> biases;
  biases.reserve(size_t(c.layers));
  for (int64_t l = 0; l < c.layers; ++l) {
    if (!saves_moe_bias(c, l)) continue;
    const auto E = c.moe->spec.experts();
    const bool mine = in.bias_owner && in.bias && in.bias->count(l);
    biases.push_back(mine ? Tensor::from_float(in.bias->at(l), DType::fp32, {E}) : Tensor(DType::fp32, {0}));
    entries.push_back({moe_bias_name(l), &biases.back(), {E}, {0}, kLayout, mine});
  }
  const std::map<std::string, std::string> attrs = {
      {"shardsim_version", "0.1.0"},
      {"workload", "lm_train"},
      {"contents", weights_only ? "weights" : "training_state"},
      {"model", lm_model_text(c)},
      {"batch", std::to_string(c.batch)},
      {"dtype", runtime::dtype_name(c.dtype)},
      {"init_seed", std::to_string(c.seed)},
      {"data_seed", std::to_string(t.data_seed)},
      {"data_position", std::to_string(step * c.batch)},
      {"rng", "synthetic data: Philox4x32-10 keyed by data_seed, counter = sequence index; the next sequence is "
              "data_position (models/lm_data.h)"},
      {"adamw", adamw_text(t)},
      {"config", config_text},
  };
  checkpoint::SaveOptions so;
  so.step = step;
  so.mesh = mesh;
  so.chunking.kind = checkpoint::Chunking::Kind::whole;  // the file is the same whatever mesh wrote it
  checkpoint::save_checkpoint(world, path, entries, attrs, so);
}

// The file's attributes checked against C and T (ConfigError naming the file); its step.
int64_t check_state_file(const checkpoint::CheckpointReader& rd, const std::string& where, const ModelSpec& c,
                         const LmTrainConfig& t) {
  const std::string workload = rd.root_attribute("workload");
  if (workload != "lm_train") {
    if (workload == "mlp" || workload == "block")  // the older run schema's kinds
      throw ConfigError(where + "written by `shardsim run` before version 0.2 (datasets weights/<w>, workload '" +
                        workload + "'); the current schema is the weights part of a training state (master/<name>): "
                        "run the config again with --checkpoint to write one (its weights come from the seed)");
    throw ConfigError(where + "not a checkpoint of `shardsim run` or `shardsim train` (workload '" + workload +
                      "'; need 'lm_train')");
  }
  const std::string model = rd.root_attribute("model");
  if (model != lm_model_text(c))
    throw ConfigError(where + "saved for model '" + model + "' but the config's model is '" + lm_model_text(c) + "'");
  if (rd.root_attribute("data_seed") != std::to_string(t.data_seed))
    throw ConfigError(where + "saved with train.data_seed " + rd.root_attribute("data_seed") +
                      " but the config's is " + std::to_string(t.data_seed) + " (the data would not continue)");
  const int64_t step = rd.step();
  if (step < 0) throw ConfigError(where + "step " + std::to_string(step) + " is negative");
  const std::string pos = rd.root_attribute("data_position");
  if (pos != std::to_string(step * c.batch)) {
    if (rd.root_attribute("batch") == std::to_string(c.batch))  // the batch agrees: the file disagrees with itself
      throw ConfigError(where + "data position " + pos + " sequences at step " + std::to_string(step) +
                        " does not match its own step x batch (" + std::to_string(step) + " x " +
                        std::to_string(c.batch) + "): its attributes disagree (edited or corrupted)");
    throw ConfigError(where + "data position " + pos + " sequences at step " + std::to_string(step) + " (batch " +
                      rd.root_attribute("batch") + ") but the config's global batch is " + std::to_string(c.batch) +
                      " (resuming needs the same global batch)");
  }
  return step;
}

struct Loaded {
  int64_t step = 0;
  bool weights_only = false;
  std::string mesh;
};

// Reads each chip's blocks into PARTS (null or empty parts are not read; MOMENTS, the same on every chip, says
// whether m and v are read at all) and the selection biases of BIAS's layers. Collective.
Loaded load_blocks(const runtime::World& world, const std::string& path, const ModelSpec& c, const LmTrainConfig& t,
                   LmWeights* const parts[3], const std::vector<LmStateBlock>& blocks,
                   std::map<int64_t, std::vector<float>>* bias, bool bias_owner, bool moments) {
  const std::string where = "checkpoint " + path + ": ";
  checkpoint::CheckpointReader rd(world, path);
  Loaded out;
  out.step = check_state_file(rd, where, c, t);
  // Files saved before the attribute existed hold the whole state.
  out.weights_only = rd.root_attributes().count("contents") && rd.root_attribute("contents") == "weights";
  const LmWeights ref = lm_zeros(c, DType::fp32, false);  // the global shapes (no storage)
  Blocks b;
  b.blocks = &blocks;
  const auto index = b.index();
  for (int g = 0; g < (out.weights_only || !moments ? 1 : 3); ++g) {
    std::vector<std::pair<std::string, Tensor*>> named;
    if (parts[g]) named = parts[g]->named_weights();
    for (const auto& [name, whole] : ref.named_weights()) {
      const std::string ds = kGroups[g] + name;
      if (!rd.has(ds)) throw ConfigError(where + "dataset '" + ds + "' is missing");
      if (rd.dtype(ds) != DType::fp32 || rd.global_shape(ds) != whole->shape())
        throw ConfigError(where + "dataset '" + ds + "' is " + runtime::dtype_name(rd.dtype(ds)) + " " +
                          runtime::shape_str(rd.global_shape(ds)) + " but the model needs fp32 " +
                          runtime::shape_str(whole->shape()));
      const auto it = index.find(name);
      if (it != index.end() && it->second < named.size()) {
        rd.read_block_verified(ds, blocks[it->second].offset, *named[it->second].second, blocks[it->second].owner);
      } else {
        Tensor none(DType::fp32, runtime::Shape(whole->shape().size(), 0));
        rd.read_block_verified(ds, runtime::Shape(whole->shape().size(), 0), none, false);
      }
      if (out.mesh.empty()) out.mesh = rd.info(ds).mesh;
    }
  }
  // A file without them (saved with bias_update 0, whose biases never moved) keeps the config's start (zeros).
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string ds = moe_bias_name(l);
    if (!saves_moe_bias(c, l) || !rd.has(ds)) continue;
    const int64_t E = c.moe->spec.experts();
    if (rd.dtype(ds) != DType::fp32 || rd.global_shape(ds) != runtime::Shape{E})
      throw ConfigError(where + "dataset '" + ds + "' is " + runtime::dtype_name(rd.dtype(ds)) + " " +
                        runtime::shape_str(rd.global_shape(ds)) + " but the model needs fp32 [" + std::to_string(E) +
                        "]");
    const bool mine = bias && bias->count(l);
    Tensor v(DType::fp32, {mine ? E : 0});
    rd.read_block_verified(ds, {0}, v, mine && bias_owner);
    if (mine) (*bias)[l] = v.to_float();
  }
  return out;
}

// Whole tensors at offset 0 of every dataset of C, owned by the chip OWNER is true on.
std::vector<LmStateBlock> whole_blocks(const ModelSpec& c, bool owner) {
  std::vector<LmStateBlock> out;
  const LmWeights shapes = lm_zeros(c, DType::fp32, false);  // alive while its tensors are read
  for (const auto& [name, t] : shapes.named_weights())
    out.push_back({name, runtime::Shape(t->shape().size(), 0), owner});
  return out;
}

std::map<int64_t, std::vector<float>> biases_of(const ModelSpec& c, const LmWeights& w) {
  std::map<int64_t, std::vector<float>> out;
  for (int64_t l = 0; l < c.layers && size_t(l) < w.layers.size(); ++l)
    if (saves_moe_bias(c, l)) out[l] = w.layers[size_t(l)].moe.bias;
  return out;
}

}  // namespace

void save_lm_train_state(const runtime::World& world, const std::string& path, const ModelSpec& c,
                         const LmTrainConfig& t, const LmStateShard& s, const std::string& mesh,
                         const std::string& config_text) {
  Blocks b;
  b.parts[0] = &s.master, b.parts[1] = &s.m, b.parts[2] = &s.v;
  b.blocks = &s.blocks;
  b.bias = &s.moe_bias;
  b.bias_owner = s.bias_owner;
  save_blocks(world, path, c, t, b, s.step, s.weights_only, mesh, config_text);
}

void save_lm_train_state(const runtime::World& world, const std::string& path, const ModelSpec& c,
                         const LmTrainConfig& t, const LmTrainSnapshot& s, const std::string& mesh,
                         const std::string& config_text) {
  const bool writer = world.rank() == 0;
  // Every chip passes the same datasets; only chip 0 holds (and writes) the whole tensors.
  const std::vector<LmStateBlock> blocks = writer ? whole_blocks(c, true) : std::vector<LmStateBlock>{};
  const auto bias = writer ? biases_of(c, s.master) : std::map<int64_t, std::vector<float>>{};
  Blocks b;
  b.parts[0] = &s.master, b.parts[1] = &s.m, b.parts[2] = &s.v;
  b.blocks = &blocks;
  b.bias = &bias;
  b.bias_owner = writer;
  save_blocks(world, path, c, t, b, s.step, s.weights_only, mesh, config_text);
}

void load_lm_train_state(const runtime::World& world, const std::string& path, const ModelSpec& c,
                         const LmTrainConfig& t, LmStateShard& s) {
  LmWeights* parts[3] = {&s.master, &s.m, &s.v};
  const bool moments = !s.m.named_weights().empty();  // the chip's trainer wants them (training, not the forward)
  const Loaded got = load_blocks(world, path, c, t, parts, s.blocks, &s.moe_bias, s.bias_owner,
                                 world.any(moments));
  s.step = got.step;
  s.weights_only = got.weights_only;
  s.mesh = got.mesh;
}

LmTrainSnapshot load_lm_train_state(const runtime::World& world, const std::string& path, const ModelSpec& c,
                                    const LmTrainConfig& t, int holder) {
  const bool holds = holder < 0 || world.rank() == holder;
  LmTrainSnapshot s;
  if (holds) {
    s.master = lm_zeros(c, DType::fp32);
    s.m = lm_zeros(c, DType::fp32);
    s.v = lm_zeros(c, DType::fp32);
  }
  // Chip 0 (or the holder) counts the whole tensors for the checksum.
  const std::vector<LmStateBlock> blocks =
      holds ? whole_blocks(c, world.rank() == (holder < 0 ? 0 : holder)) : std::vector<LmStateBlock>{};
  std::map<int64_t, std::vector<float>> bias = holds ? biases_of(c, s.master) : std::map<int64_t, std::vector<float>>{};
  LmWeights* parts[3] = {&s.master, &s.m, &s.v};
  const Loaded got = load_blocks(world, path, c, t, parts, blocks, &bias, world.rank() == (holder < 0 ? 0 : holder), true);
  for (auto& [l, b] : bias) s.master.layers[size_t(l)].moe.bias = std::move(b);
  s.step = got.step;
  s.weights_only = got.weights_only;
  s.mesh = got.mesh;
  return s;
}

void save_lm_train_state(MPI_Comm comm, const std::string& path, const ModelSpec& c, const LmTrainConfig& t,
                         const LmTrainSnapshot& s, const std::string& mesh, const std::string& config_text) {
  save_lm_train_state(runtime::World(comm), path, c, t, s, mesh, config_text);
}

LmTrainSnapshot load_lm_train_state(MPI_Comm comm, const std::string& path, const ModelSpec& c,
                                    const LmTrainConfig& t) {
  return load_lm_train_state(runtime::World(comm), path, c, t);
}

LmTrainState lm_train_state_from(const ModelSpec& c, LmTrainSnapshot s) {
  LmTrainState st;
  st.weights = std::move(s.master);
  st.m = std::move(s.m);
  st.v = std::move(s.v);
  st.step = s.step;
  if (c.dtype != DType::fp32) st.compute = lm_compute_copy(c, st.weights);
  return st;
}

}  // namespace shardsim::models
