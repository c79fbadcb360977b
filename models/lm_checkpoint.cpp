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

void save_lm_train_state(const runtime::World& world, const std::string& path, const ModelSpec& c,
                         const LmTrainConfig& t, const LmTrainSnapshot& s, const std::string& mesh,
                         const std::string& config_text) {
  const bool writer = world.rank() == 0;
  // Every rank passes the same entries; only rank 0's data is written (an empty block elsewhere).
  const LmWeights* parts[3] = {&s.master, &s.m, &s.v};
  const int groups = s.weights_only ? 1 : 3;  // the weights part: master/ alone
  std::vector<std::pair<std::string, const Tensor*>> named[3];
  for (int g = 0; g < groups; ++g) named[g] = parts[g]->named_weights();
  const LmWeights ref = lm_zeros(c, DType::fp32);  // shapes, for ranks whose snapshot is empty
  const auto shapes = ref.named_weights();
  std::vector<Tensor> empty;  // stable storage for the non-writers' empty blocks
  empty.reserve(3 * shapes.size());
  std::vector<checkpoint::CheckpointEntry> entries;
  for (int g = 0; g < groups; ++g)
    for (size_t i = 0; i < shapes.size(); ++i) {
      const runtime::Shape& shape = shapes[i].second->shape();
      const Tensor* local;
      if (writer) {
        if (i >= named[g].size() || named[g][i].second->shape() != shape || named[g][i].second->dtype() != DType::fp32)
          throw std::logic_error("save_lm_train_state: " + std::string(kGroups[g]) + shapes[i].first +
                                 " is not fp32 " + runtime::shape_str(shape));
        local = named[g][i].second;
      } else {
        empty.emplace_back(DType::fp32, runtime::Shape(shape.size(), 0));
        local = &empty.back();
      }
      entries.push_back({kGroups[g] + shapes[i].first, local, shape, runtime::Shape(shape.size(), 0),
                         "Replicate (whole, global layout)", writer});
    }
  // The selection biases of aux-loss-free balancing (state beside the weights, no moments): moe_bias/layers.L.
  std::vector<Tensor> biases;
  biases.reserve(size_t(c.layers));
  for (int64_t l = 0; l < c.layers; ++l) {
    if (!saves_moe_bias(c, l)) continue;
    const auto E = c.moe->spec.experts();
    biases.push_back(writer ? Tensor::from_float(s.master.layers[size_t(l)].moe.bias, DType::fp32, {E})
                            : Tensor(DType::fp32, {0}));
    entries.push_back({moe_bias_name(l), &biases.back(), {E}, {0}, "Replicate (whole, global layout)", writer});
  }
  const std::map<std::string, std::string> attrs = {
      {"shardsim_version", "0.1.0"},
      {"workload", "lm_train"},
      {"contents", s.weights_only ? "weights" : "training_state"},
      {"model", lm_model_text(c)},
      {"batch", std::to_string(c.batch)},
      {"dtype", runtime::dtype_name(c.dtype)},
      {"init_seed", std::to_string(c.seed)},
      {"data_seed", std::to_string(t.data_seed)},
      {"data_position", std::to_string(s.step * c.batch)},
      {"rng", "synthetic data: Philox4x32-10 keyed by data_seed, counter = sequence index; the next sequence is "
              "data_position (models/lm_data.h)"},
      {"adamw", adamw_text(t)},
      {"config", config_text},
  };
  checkpoint::SaveOptions so;
  so.step = s.step;
  so.mesh = mesh;
  checkpoint::save_checkpoint(world, path, entries, attrs, so);
}

LmTrainSnapshot load_lm_train_state(const runtime::World& world, const std::string& path, const ModelSpec& c,
                                    const LmTrainConfig& t) {
  const int rank = world.rank();
  const std::string where = "checkpoint " + path + ": ";
  checkpoint::CheckpointReader rd(world, path);
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
  LmTrainSnapshot s;
  s.step = step;
  // Files saved before the attribute existed hold the whole state.
  s.weights_only = rd.root_attributes().count("contents") && rd.root_attribute("contents") == "weights";
  s.master = lm_zeros(c, DType::fp32);
  s.m = lm_zeros(c, DType::fp32);
  s.v = lm_zeros(c, DType::fp32);
  LmWeights* parts[3] = {&s.master, &s.m, &s.v};
  for (int g = 0; g < (s.weights_only ? 1 : 3); ++g)
    for (auto& [name, tensor] : parts[g]->named_weights()) {
      const std::string ds = kGroups[g] + name;
      if (!rd.has(ds)) throw ConfigError(where + "dataset '" + ds + "' is missing");
      if (rd.dtype(ds) != DType::fp32 || rd.global_shape(ds) != tensor->shape())
        throw ConfigError(where + "dataset '" + ds + "' is " + runtime::dtype_name(rd.dtype(ds)) + " " +
                          runtime::shape_str(rd.global_shape(ds)) + " but the model needs fp32 " +
                          runtime::shape_str(tensor->shape()));
      // Every rank reads the whole tensor; rank 0's copy counts for the checksum.
      rd.read_block_verified(ds, runtime::Shape(tensor->shape().size(), 0), *tensor, rank == 0);
      if (s.mesh.empty()) s.mesh = rd.info(ds).mesh;
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
    Tensor b(DType::fp32, {E});
    rd.read_block_verified(ds, {0}, b, rank == 0);
    s.master.layers[size_t(l)].moe.bias = b.to_float();
  }
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
