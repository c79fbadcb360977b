#include "models/lm_model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/attention.h"
#include "kernels/attention_backward.h"
#include "kernels/attention_unfused.h"
#include "kernels/bias_dropout.h"
#include "kernels/backward.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/fp8.h"
#include "kernels/gemm.h"
#include "kernels/mse_loss.h"
#include "kernels/norm.h"
#include "models/init.h"

namespace shardsim::models {

using runtime::DType;
using runtime::Tensor;

namespace {

Tensor f32(runtime::Shape s) { return Tensor(DType::fp32, std::move(s)); }

void log_cost(std::vector<kernels::KernelCost>* costs, const kernels::KernelCost& c) {
  if (costs) costs->push_back(c);
}

std::vector<int64_t> positions(const ModelSpec& c) {
  std::vector<int64_t> p(static_cast<size_t>(c.batch * c.seq));
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int64_t>(i) % c.seq;
  return p;
}

kernels::AttentionOptions causal(const ModelSpec& c) {
  kernels::AttentionOptions o;
  o.causal = c.causal;
  return o;
}

void check_batch(const ModelSpec& c, const LmBatch& b) {
  const auto n = static_cast<size_t>(c.batch * c.seq);
  if (c.vocab == 0) {
    const runtime::Shape want{c.batch * c.seq, c.hidden};
    if (b.input.shape() != want || b.target.shape() != want)
      throw std::invalid_argument("lm: a batch of a block stack needs input and target activations " +
                                  runtime::shape_str(want) + ", got " + runtime::shape_str(b.input.shape()) + " and " +
                                  runtime::shape_str(b.target.shape()));
    return;
  }
  if (b.inputs.size() != n || b.targets.size() != n)
    throw std::invalid_argument("lm: a batch needs " + std::to_string(n) + " input and target tokens (batch " +
                                std::to_string(c.batch) + " x seq " + std::to_string(c.seq) + "), got " +
                                std::to_string(b.inputs.size()) + " and " + std::to_string(b.targets.size()));
}

// y = x · w for x [N, in] and w [in, out], into a fresh [N, out].
Tensor matmul(const Tensor& x, const Tensor& w, std::vector<kernels::KernelCost>* costs) {
  Tensor y(x.dtype(), {x.dim(0), w.dim(1)});
  log_cost(costs, kernels::gemm(x, w, y));
  return y;
}

// The GEMMs X·W_i that read one input (q/k/v; SwiGLU's gate and up) as the trainer issues them on a device with
// fused kernels, its default (sharding/plans/block_ops.h, column_gemms: Megatron's linear_qkv and linear_fc1): the
// values each GEMM's, the logged cost ONE GEMM over the concatenated columns.
std::vector<Tensor> column_matmuls(const Tensor& x, const std::vector<const Tensor*>& ws,
                                   std::vector<kernels::KernelCost>* costs) {
  std::vector<Tensor> out;
  int64_t cols = 0;
  for (const Tensor* w : ws) {
    out.emplace_back(x.dtype(), runtime::Shape{x.dim(0), w->dim(1)});
    (void)kernels::gemm(x, *w, out.back());
    cols += w->dim(1);
  }
  const Tensor w = Tensor::make(ws[0]->dtype(), {ws[0]->dim(0), cols}, false);
  Tensor y = Tensor::make(x.dtype(), {x.dim(0), cols}, false);
  log_cost(costs, kernels::gemm(x, w, y));
  return out;
}

// The backward of column_matmuls into DX (= Σ_i dY_i·W_i^T, summed in order) and DWS: the values as separate
// gemm_backward calls and adds, the logged cost one gemm_backward over the concatenated columns.
void column_matmuls_backward(const Tensor& x, const std::vector<const Tensor*>& ws, const std::vector<const Tensor*>& dys,
                             Tensor& dx, const std::vector<Tensor*>& dws, std::vector<kernels::KernelCost>* costs) {
  std::vector<Tensor> parts;
  int64_t cols = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    Tensor* into = &dx;
    if (i > 0) into = &parts.emplace_back(dx.dtype(), dx.shape());
    (void)kernels::gemm_backward(x, *ws[i], *dys[i], into, dws[i]);
    cols += ws[i]->dim(1);
  }
  for (const Tensor& p : parts) (void)kernels::add_inplace(dx, p);
  const Tensor w = Tensor::make(ws[0]->dtype(), {ws[0]->dim(0), cols}, false);
  const Tensor dy = Tensor::make(dys[0]->dtype(), {dys[0]->dim(0), cols}, false);
  Tensor dxf = Tensor::make(dx.dtype(), dx.shape(), false), dwf = Tensor::make(w.dtype(), w.shape(), false);
  log_cost(costs, kernels::gemm_backward(x, w, dy, &dxf, &dwf));
}

void check_weights(const ModelSpec& c, const LmWeights& w) {
  const LmWeights want = lm_zeros(c, c.dtype);
  const auto a = w.named_weights(), b = want.named_weights();
  if (a.size() != b.size())
    throw std::invalid_argument("lm: weights have " + std::to_string(a.size()) + " tensors, the config needs " +
                                std::to_string(b.size()));
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].second->shape() != b[i].second->shape() || a[i].second->dtype() != c.dtype)
      throw std::invalid_argument("lm: weight " + a[i].first + " is " + runtime::dtype_name(a[i].second->dtype()) +
                                  " " + runtime::shape_str(a[i].second->shape()) + ", the config needs " +
                                  runtime::dtype_name(c.dtype) + " " + runtime::shape_str(b[i].second->shape()));
}

// The block's norm (rmsnorm, or layernorm with its bias B) of X into a fresh tensor.
Tensor norm(const ModelSpec& c, const Tensor& x, const Tensor& w, const Tensor& b, std::vector<kernels::KernelCost>* costs) {
  Tensor y(c.dtype, x.shape());
  log_cost(costs, c.layernorm() ? kernels::layernorm(x, w, b, y, c.norm_eps) : kernels::rmsnorm(x, w, y, c.norm_eps));
  return y;
}

// Its backward: DX (overwritten) and the weights' gradients DW (and DB with layernorm).
void norm_backward(const ModelSpec& c, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor* dw,
                   Tensor* db, std::vector<kernels::KernelCost>* costs) {
  log_cost(costs, c.layernorm() ? kernels::layernorm_backward(x, w, dy, dx, dw, db, c.norm_eps)
                                : kernels::rmsnorm_backward(x, w, dy, dx, dw, c.norm_eps));
}

// The block's charged bias and dropout work (kernels/bias_dropout.h) on one device (a MoE layer: no dense MLP bias).
kernels::BlockExtras block_extras(const ModelSpec& c, bool moe) {
  const int64_t N = c.batch * c.seq;
  return sharding::plans::block_extras(c, N, N, (c.heads + 2 * c.kv_heads) * c.head_dim,
                                       moe ? 0 : c.ffn);
}

bool is_moe(const LmLayer& L) { return L.moe.router.rank() > 0; }

kernels::MoeCharge moe_charge(std::vector<kernels::KernelCost>* costs) {
  return kernels::MoeCharge{[costs](const kernels::KernelCost& k) { log_cost(costs, k); }};
}

// The reference's MoE gradients are overwritten each backward (an expert without tokens gets zeros).
void zero_moe(kernels::MoeWeights& g) {
  auto zero = [](Tensor& t) {
    if (t.rank() > 0 && t.has_storage()) std::fill_n(static_cast<char*>(t.data()), t.nbytes(), char(0));
  };
  zero(g.router);
  for (auto* e : {&g.shared}) zero(e->w_gate), zero(e->w_up), zero(e->w_down);
  for (auto& e : g.experts) zero(e.w_gate), zero(e.w_up), zero(e.w_down);
}

// One block's forward: X (the block's input, updated in place to its output), its saved tensors into S.
void forward_block(const ModelSpec& c, const LmLayer& L, LmCache::Layer& S, Tensor& x, const std::vector<int64_t>& pos,
                   std::vector<kernels::KernelCost>* costs) {
  const kernels::Fp8Scope fp8(kernels::Fp8Recipe{c.fp8});  // the block's linear layers in FP8 (model.fp8)
  const int64_t N = c.batch * c.seq, T = c.seq;
  const int64_t hq = c.heads, hkv = c.kv_heads, d = c.head_dim;
  auto act = [&c](runtime::Shape sh) { return Tensor(c.dtype, std::move(sh)); };
  S.x_in = x;
  if (c.attention) {  // the attention sublayer (none in an MLP-only block)
    S.a = norm(c, x, L.attn_norm, L.attn_norm_b, costs);
    auto qkv = column_matmuls(S.a, {&L.wq, &L.wk, &L.wv}, costs);
    S.q = std::move(qkv[0]).reshaped({N, hq, d});
    S.k = std::move(qkv[1]).reshaped({N, hkv, d});
    S.v = std::move(qkv[2]).reshaped({N, hkv, d});
    if (c.position == sharding::PositionKind::rope) {
      log_cost(costs, kernels::rope_inplace(S.q, pos, c.rope_theta));
      log_cost(costs, kernels::rope_inplace(S.k, pos, c.rope_theta));
    }
    S.o = act({N, hq, d});
    S.lse.clear();
    S.probs.clear();
    for (int64_t b = 0; b < c.batch; ++b) {
      Tensor ob = act({T, hq, d});
      if (c.unfused_attention()) {  // Megatron's core: the softmax output kept for the backward
        Tensor p = act({hq, T, T});
        for (const auto& k : kernels::attention_unfused(S.q.rows(b * T, T), S.k.rows(b * T, T), S.v.rows(b * T, T),
                                                        ob, p, causal(c), c.dropout))
          log_cost(costs, k);
        S.probs.push_back(std::move(p));
      } else {
        Tensor lse = f32({hq, T});
        log_cost(costs, kernels::attention(S.q.rows(b * T, T), S.k.rows(b * T, T), S.v.rows(b * T, T), ob, lse,
                                           causal(c)));
        S.lse.push_back(std::move(lse));
      }
      S.o.set_rows(b * T, ob);
    }
    Tensor o2 = Tensor(S.o).reshaped({N, hq * d});
    Tensor attn = matmul(o2, L.wo, costs);
    log_cost(costs, kernels::add_inplace(x, attn));
    }
  S.x_mid = x;
  S.m = norm(c, x, L.mlp_norm, L.mlp_norm_b, costs);
  if (is_moe(L)) {  // the MoE MLP: every expert on this one device (kernels/moe_mlp.h)
    const Tensor y = kernels::moe_forward(c.moe->spec, L.moe, S.m, S.moe_ref, moe_charge(costs));
    log_cost(costs, kernels::add_inplace(x, y));
  } else if (c.gated()) {
    auto gu = column_matmuls(S.m, {&L.w_gate, &L.w_up}, costs);
    S.gate = std::move(gu[0]);
    S.up = std::move(gu[1]);
    S.act = S.gate;
    log_cost(costs, kernels::glu_inplace(S.act, S.up, c.mlp == sharding::MlpKind::geglu ? kernels::Activation::gelu
                                                                                        : kernels::Activation::silu));
  } else {  // GELU MLP: up keeps the activation's input
    S.up = matmul(S.m, L.w_up, costs);
    S.act = S.up;
    log_cost(costs, kernels::activation_inplace(S.act, kernels::Activation::gelu));
  }
  if (!is_moe(L)) {
    Tensor mlp = matmul(S.act, L.w_down, costs);
    log_cost(costs, kernels::add_inplace(x, mlp));
  }
  const auto extras = block_extras(c, is_moe(L));
  for (const auto& k : kernels::block_extras_forward(extras)) log_cost(costs, k);
  S.charged_bytes = kernels::block_extras_activation_bytes(extras);
  if (c.dropout > 0)  // the attention dropout's mask (1 byte) and output per score
    for (const auto& p : S.probs) S.charged_bytes += double(p.numel()) + double(p.nbytes());
}

}  // namespace

LmWeights lm_compute_copy(const ModelSpec& c, const LmWeights& master) {
  LmWeights out = lm_zeros(c, c.dtype);
  auto dst = out.named_weights();
  const auto src = master.named_weights();
  for (size_t i = 0; i < dst.size(); ++i) {
    const Tensor& m = *src[i].second;
    if (m.shape() != dst[i].second->shape())
      throw std::invalid_argument("lm_compute_copy: " + src[i].first + " has shape " + runtime::shape_str(m.shape()));
    for (int64_t k = 0; k < m.numel(); ++k) dst[i].second->set(k, m.get(k));
  }
  return out;
}

void check_lm_config(const ModelSpec& c) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("lm config: " + what);
  };
  need(c.vocab >= 0 && c.hidden >= 1 && c.layers >= 0 && c.ffn >= 1 && c.seq >= 1 && c.batch >= 1,
       "hidden, ffn, seq, batch must be >= 1, vocab >= 0 (0: a block stack) and layers >= 0");
  need(c.vocab > 0 || (!c.tied_embeddings && c.position != sharding::PositionKind::learned),
       "tied_embeddings and learned positions need a vocabulary (vocab 0 has no embedding)");
  need(!c.attention || (c.heads >= 1 && c.kv_heads >= 1 && c.heads % c.kv_heads == 0),
       "heads (" + std::to_string(c.heads) + ") must be a multiple of kv_heads (" + std::to_string(c.kv_heads) + ")");
  need(!c.attention || (c.head_dim >= 1 && (c.position != sharding::PositionKind::rope || c.head_dim % 2 == 0)),
       "head_dim must be >= 1 and even under RoPE (it rotates pairs), got " + std::to_string(c.head_dim));
  need(c.dtype == DType::fp32 || c.dtype == DType::bf16,
       "dtype must be fp32 or bf16, got " + runtime::dtype_name(c.dtype));
  need(std::isfinite(c.rope_theta) && c.rope_theta > 0 && std::isfinite(c.norm_eps) && c.norm_eps > 0,
       "rope_theta and norm_eps must be finite and > 0");
}

int64_t lm_moe_groups(int64_t batch, int64_t micro_batch, int64_t replicas) {
  return micro_batch > 0 ? batch / micro_batch : replicas;
}

namespace {
// Weights of layer L's projections (GEMM operands): a MoE layer's MLP all of them (TOTAL) or its active ones.
int64_t block_matmul_params(const ModelSpec& c, int64_t l, bool total) {
  const int64_t qd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
  const int64_t attn = c.attention ? c.hidden * qd + 2 * c.hidden * kvd + qd * c.hidden : 0;
  if (!c.moe_layer(l)) return attn + (c.gated() ? 3 : 2) * c.hidden * c.ffn;
  const kernels::MoeParams m = kernels::moe_params(c.moe->spec);
  return attn + static_cast<int64_t>(total ? m.total : m.active);
}
int64_t norm_params(const ModelSpec& c) { return (c.layernorm() ? 2 : 1) * c.hidden; }
}  // namespace

int64_t lm_param_count(const ModelSpec& c) {
  const int64_t tables = (c.tied_embeddings ? 1 : 2) * c.vocab * c.hidden +
                         (c.position == sharding::PositionKind::learned ? c.position_rows() * c.hidden : 0);
  int64_t blocks = 0;
  for (int64_t l = 0; l < c.layers; ++l)
    blocks += block_matmul_params(c, l, true) + (c.attention ? 2 : 1) * norm_params(c);
  return tables + blocks + (c.vocab > 0 ? norm_params(c) : 0);
}

int64_t lm_matmul_param_count(const ModelSpec& c) {
  int64_t blocks = 0;
  for (int64_t l = 0; l < c.layers; ++l) blocks += block_matmul_params(c, l, false);
  return blocks + c.hidden * c.vocab;
}

double lm_model_flops_per_token(const ModelSpec& c) {
  // Causal attention: a token at position i sees i + 1 keys, (s + 1) / 2 on average; QK^T and PV are 2·d FLOPs per
  // visible pair and head each, forward, times 3 with the backward: 6·d·(s + 1) per token and head.
  return 6.0 * double(lm_matmul_param_count(c)) + 6.0 * double(c.layers) * double(c.heads) * double(c.head_dim) *
                                                      double(c.seq + 1);
}

std::vector<std::pair<const char*, Tensor*>> LmLayer::slots() {
  return {{"attn_norm", &attn_norm}, {"attn_norm_b", &attn_norm_b}, {"wq", &wq}, {"wk", &wk}, {"wv", &wv},
          {"wo", &wo}, {"mlp_norm", &mlp_norm}, {"mlp_norm_b", &mlp_norm_b}, {"w_gate", &w_gate}, {"w_up", &w_up},
          {"w_down", &w_down}};
}

std::vector<std::pair<std::string, Tensor*>> LmWeights::named_weights() {
  std::vector<std::pair<std::string, Tensor*>> out;
  auto add = [&out](std::string name, Tensor* t) {
    if (t->rank() > 0) out.emplace_back(std::move(name), t);
  };
  add("embed", &embed);  // absent without a vocabulary
  add("pos_embed", &pos_embed);
  for (size_t l = 0; l < layers.size(); ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    for (auto [n, t] : layers[l].slots()) add(p + n, t);
    kernels::MoeWeights& m = layers[l].moe;
    add(p + "moe.router", &m.router);
    for (size_t e = 0; e < m.experts.size(); ++e) {
      const std::string q = p + "moe.expert." + std::to_string(m.first_expert + int64_t(e)) + ".";
      add(q + "w_gate", &m.experts[e].w_gate);
      add(q + "w_up", &m.experts[e].w_up);
      add(q + "w_down", &m.experts[e].w_down);
    }
    add(p + "moe.shared.w_gate", &m.shared.w_gate);
    add(p + "moe.shared.w_up", &m.shared.w_up);
    add(p + "moe.shared.w_down", &m.shared.w_down);
  }
  add("final_norm", &final_norm);
  add("final_norm_b", &final_norm_b);
  add("head", &head);
  return out;
}

std::vector<std::pair<std::string, const Tensor*>> LmWeights::named_weights() const {
  std::vector<std::pair<std::string, const Tensor*>> out;
  for (auto& [n, t] : const_cast<LmWeights*>(this)->named_weights()) out.emplace_back(n, t);
  return out;
}

LmWeights lm_zeros(const ModelSpec& c, DType dtype, bool storage) {
  auto f32 = [dtype, storage](runtime::Shape sh) { return Tensor::make(dtype, std::move(sh), storage); };
  check_lm_config(c);
  const int64_t h = c.hidden, qd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
  const bool ln = c.layernorm();
  auto bias = [&]() { return ln ? f32({h}) : Tensor(); };
  LmWeights w;
  if (c.vocab > 0) w.embed = f32({c.vocab, h});
  if (c.position == sharding::PositionKind::learned) w.pos_embed = f32({c.position_rows(), h});
  // An MLP of inner size F (a dense MLP, an expert, the shared experts).
  auto mlp = [&](int64_t f) {
    return kernels::ExpertWeights{c.gated() ? f32({h, f}) : Tensor(), f32({h, f}), f32({f, h})};
  };
  for (int64_t l = 0; l < c.layers; ++l) {
    LmLayer L;
    if (c.attention)  // none in an MLP-only block (model.kind mlp)
      L.attn_norm = f32({h}), L.attn_norm_b = bias(), L.wq = f32({h, qd}), L.wk = f32({h, kvd}), L.wv = f32({h, kvd}),
      L.wo = f32({qd, h});
    L.mlp_norm = f32({h}), L.mlp_norm_b = bias();
    if (!c.moe_layer(l)) {
      kernels::ExpertWeights d = mlp(c.ffn);
      L.w_gate = std::move(d.w_gate), L.w_up = std::move(d.w_up), L.w_down = std::move(d.w_down);
    } else {
      const kernels::MoeSpec& s = c.moe->spec;
      L.moe.router = f32({h, s.experts()});
      L.moe.first_expert = c.shard.expert_first;
      const int64_t n = c.shard.expert_count < 0 ? s.experts() : c.shard.expert_count;
      for (int64_t e = c.shard.expert_first; e < c.shard.expert_first + n; ++e) L.moe.experts.push_back(mlp(s.expert_ffn[size_t(e)]));
      if (s.shared_ffn > 0) L.moe.shared = mlp(s.shared_ffn);
      L.moe.bias = s.router.bias;  // the selection bias's start (zeros with model.moe.bias_update > 0)
    }
    w.layers.push_back(std::move(L));
  }
  if (c.vocab == 0) return w;  // a block stack: no final norm or head
  w.final_norm = f32({h});
  w.final_norm_b = bias();
  if (!c.tied_embeddings) w.head = f32({h, c.vocab});
  return w;
}

bool lm_is_norm_bias(const std::string& name) { return name.size() > 2 && name.compare(name.size() - 2, 2, "_b") == 0; }

LmWeights lm_init(const ModelSpec& c) {
  LmWeights w = lm_zeros(c, DType::fp32);
  uint32_t id = 1;
  for (auto& [name, t] : w.named_weights()) {
    const uint32_t tensor_id = id++;
    if (t->rank() == 1) {  // norm weights 1, layernorm biases 0
      if (!lm_is_norm_bias(name))
        for (int64_t i = 0; i < t->numel(); ++i) t->set(i, 1.0f);
      continue;
    }
    const float a = name == "embed" || name == "pos_embed" ? 1.0f : 1.0f / std::sqrt(static_cast<float>(t->dim(0)));
    models::fill_uniform_block(*t, {c.seed, tensor_id, -a, a}, t->dim(1), 0, 0);
  }
  return w;
}

const Tensor& lm_head_weight(const ModelSpec& c, const LmWeights& w, Tensor& scratch) {
  if (!c.tied_embeddings) return w.head;
  scratch = kernels::transposed(w.embed);
  return scratch;
}

double lm_forward(const ModelSpec& c, const LmWeights& w, const LmBatch& batch, LmCache* cache,
                  std::vector<kernels::KernelCost>* costs, std::vector<size_t>* unit_marks) {
  auto mark = [&] {
    if (unit_marks) unit_marks->push_back(costs ? costs->size() : 0);
  };
  if (unit_marks) unit_marks->clear();
  check_lm_config(c);
  check_batch(c, batch);
  const int64_t N = c.batch * c.seq, h = c.hidden;
  const auto pos = positions(c);
  check_weights(c, w);
  auto act = [&c](runtime::Shape sh) { return Tensor(c.dtype, std::move(sh)); };
  LmCache local;
  LmCache& C = cache ? *cache : local;
  C.layers.assign(static_cast<size_t>(c.layers), {});

  Tensor x = act({N, h});
  mark();
  if (c.vocab == 0)  // a block stack: the step's input activations, in the compute dtype
    for (int64_t i = 0; i < x.numel(); ++i) x.set(i, batch.input.get(i));
  else
    log_cost(costs, kernels::embedding_forward(w.embed, batch.inputs, 0, c.vocab, x));
  if (c.position == sharding::PositionKind::learned) {  // + pos_embed[position]: a lookup, then the add
    Tensor p = act({N, h});
    log_cost(costs, kernels::embedding_forward(w.pos_embed, pos, 0, c.position_rows(), p));
    log_cost(costs, kernels::add_inplace(x, p));
  }
  double aux = 0;  // the MoE layers' aux losses (coefficient included)
  for (int64_t l = 0; l < c.layers; ++l) {
    mark();
    forward_block(c, w.layers[static_cast<size_t>(l)], C.layers[static_cast<size_t>(l)], x, pos, costs);
    aux += C.layers[static_cast<size_t>(l)].moe_ref.aux;
  }
  mark();
  C.x_final = x;
  if (c.vocab == 0) {  // the regression loss of a block stack
    double loss = 0;
    log_cost(costs, kernels::mse_loss(x, batch.target, N, loss));
    mark();
    return loss + aux;
  }
  C.xf = norm(c, x, w.final_norm, w.final_norm_b, costs);
  Tensor head_t;
  C.logits = matmul(C.xf, lm_head_weight(c, w, head_t), costs);
  // Cross-entropy as one vocabulary shard (the all_reduces of the vocab-parallel form are identities here).
  C.row_max = f32({N});
  C.sumexp = f32({N});
  Tensor target = f32({N}), loss = f32({N});
  log_cost(costs, kernels::ce_shard_max(C.logits, C.row_max));
  log_cost(costs, kernels::ce_shard_stats(C.logits, C.row_max, batch.targets, 0, c.vocab, C.sumexp, target));
  log_cost(costs, kernels::ce_loss(C.row_max, C.sumexp, target, loss));
  mark();
  double total = 0;
  for (int64_t i = 0; i < N; ++i) total += loss.f32()[i];
  return total / static_cast<double>(N) + aux;
}

void lm_recompute_block(const ModelSpec& c, const LmWeights& w, int64_t layer, LmCache& cache,
                        std::vector<kernels::KernelCost>* costs) {
  check_lm_config(c);
  if (layer < 0 || layer >= c.layers || cache.layers.size() != static_cast<size_t>(c.layers))
    throw std::invalid_argument("lm_recompute_block: layer " + std::to_string(layer) + " of " +
                                std::to_string(c.layers) + " (cache of " + std::to_string(cache.layers.size()) + ")");
  check_weights(c, w);
  auto& S = cache.layers[static_cast<size_t>(layer)];
  Tensor x = S.x_in;
  forward_block(c, w.layers[static_cast<size_t>(layer)], S, x, positions(c), costs);
}

namespace {
// A MoE layer's kept tensors: the dispatch buffers (permuted, received, combined rows) and the experts' activations.
double moe_cache_bytes(const LmCache::Layer& L) {
  double b = 0;
  auto acts = [&b](const kernels::ExpertActs& a) {
    for (const auto* v : {&a.gate, &a.up, &a.act})
      for (const Tensor& t : *v) b += static_cast<double>(t.nbytes());
  };
  b += static_cast<double>(L.moe.xr.nbytes() + L.moe.yp.nbytes());
  acts(L.moe.experts), acts(L.moe.shared);
  b += static_cast<double>(L.moe_ref.xp.nbytes() + L.moe_ref.yp.nbytes());
  acts(L.moe_ref.experts), acts(L.moe_ref.shared);
  return b;
}
}  // namespace

namespace {

// A block's saved tensors other than its input x_in.
double block_rest_bytes(const LmCache::Layer& L) {
  double rest = 0;
  for (const Tensor* t : {&L.a, &L.q, &L.k, &L.v, &L.o, &L.x_mid, &L.m, &L.gate, &L.up, &L.act, &L.o_heads})
    rest += static_cast<double>(t->nbytes());
  for (const auto& t : L.lse) rest += static_cast<double>(t.nbytes());
  for (const auto& t : L.probs) rest += static_cast<double>(t.nbytes());
  return rest + L.charged_bytes + moe_cache_bytes(L);
}

}  // namespace

double lm_recompute_working_bytes(const LmCache& C) {
  double largest = 0;
  for (const auto& L : C.layers) largest = std::max(largest, block_rest_bytes(L));
  return largest;
}

double lm_cache_bytes(const LmCache& C, bool recompute) {
  double b = 0;
  for (const auto& L : C.layers) b += static_cast<double>(L.x_in.nbytes()) + (recompute ? 0.0 : block_rest_bytes(L));
  for (const Tensor* t : {&C.x_final, &C.xf, &C.logits, &C.row_max, &C.sumexp}) b += static_cast<double>(t->nbytes());
  return recompute ? b + lm_recompute_working_bytes(C) : b;
}

int lm_unit_of(const std::string& name, int64_t layers) {
  if (name == "embed" || name == "pos_embed") return 0;
  if (name.rfind("layers.", 0) == 0) return 1 + std::stoi(name.substr(7));
  return static_cast<int>(layers) + 1;  // final_norm, head
}

void lm_drop_block_activations(LmCache& cache) {
  for (auto& S : cache.layers) {
    Tensor keep = std::move(S.x_in);
    S = LmCache::Layer{};
    S.x_in = std::move(keep);
  }
}

void lm_backward(const ModelSpec& c, const LmWeights& w, const LmBatch& batch, const LmCache& C, LmWeights& g,
                 std::vector<kernels::KernelCost>* costs, std::vector<size_t>* unit_marks) {
  auto mark = [&] {
    if (unit_marks) unit_marks->push_back(costs ? costs->size() : 0);
  };
  if (unit_marks) unit_marks->clear();
  check_lm_config(c);
  if (c.mlp == sharding::MlpKind::geglu)  // forward only (run); the GeGLU backward kernel does not exist yet
    throw std::invalid_argument("lm config: mlp geglu: trains not yet (its backward is not implemented; swiglu | gelu)");
  check_batch(c, batch);
  const int64_t N = c.batch * c.seq, h = c.hidden, T = c.seq;
  const int64_t hq = c.heads, hkv = c.kv_heads, d = c.head_dim;
  if (C.layers.size() != static_cast<size_t>(c.layers) || g.layers.size() != static_cast<size_t>(c.layers))
    throw std::invalid_argument("lm_backward: cache or gradients do not match the config's layers");
  const auto pos = positions(c);
  check_weights(c, w);
  check_weights(c, g);
  auto act = [&c](runtime::Shape sh) { return Tensor(c.dtype, std::move(sh)); };

  Tensor dx = act({N, h});  // gradient of the residual stream
  Tensor dhead_t;
  if (c.vocab == 0) {  // a block stack: the regression loss's gradient
    log_cost(costs, kernels::mse_loss_backward(C.x_final, batch.target, N, dx));
  } else {
    Tensor dlogits = act({N, c.vocab});
    log_cost(costs, kernels::ce_backward(C.logits, C.row_max, C.sumexp, batch.targets, 0, c.vocab,
                                         1.0f / static_cast<float>(N), dlogits));
    Tensor dxf = act({N, h});
    Tensor head_t;
    if (c.tied_embeddings) dhead_t = act({h, c.vocab});  // tied: the head use's gradient
    log_cost(costs, kernels::gemm_backward(C.xf, lm_head_weight(c, w, head_t), dlogits, &dxf,
                                           c.tied_embeddings ? &dhead_t : &g.head));
    norm_backward(c, C.x_final, w.final_norm, dxf, dx, &g.final_norm, &g.final_norm_b, costs);
  }
  mark();  // final_norm and head gradients complete

  for (int64_t l = c.layers - 1; l >= 0; --l) {
    const kernels::Fp8Scope fp8(kernels::Fp8Recipe{c.fp8});
    const LmLayer& L = w.layers[static_cast<size_t>(l)];
    LmLayer& G = g.layers[static_cast<size_t>(l)];
    const auto& S = C.layers[static_cast<size_t>(l)];
    for (const auto& k : kernels::block_extras_backward(block_extras(c, is_moe(L)))) log_cost(costs, k);
    Tensor dm = act({N, h}), dnorm = act({N, h});
    if (is_moe(L)) {  // the MoE MLP; d loss / d aux of each token group = 1 / groups (the loss holds their mean)
      zero_moe(G.moe);
      const kernels::MoeSpec& ms = c.moe->spec;
      dm = kernels::moe_backward(ms, L.moe, S.m, S.moe_ref, dx, 1.0 / double(std::max<int64_t>(ms.capacity.groups, 1)),
                                 G.moe, moe_charge(costs));
    } else {
    // MLP branch: x_out = x_mid + act · w_down
    Tensor dact = act({N, c.ffn}), dgate = act({N, c.ffn}), dup = act({N, c.ffn});
    log_cost(costs, kernels::gemm_backward(S.act, L.w_down, dx, &dact, &G.w_down));
    if (c.gated()) {
      log_cost(costs, kernels::swiglu_backward(S.gate, S.up, dact, dgate, dup));
      column_matmuls_backward(S.m, {&L.w_gate, &L.w_up}, {&dgate, &dup}, dm, {&G.w_gate, &G.w_up}, costs);
    } else {
      log_cost(costs, kernels::gelu_backward(S.up, dact, dup));
      log_cost(costs, kernels::gemm_backward(S.m, L.w_up, dup, &dm, &G.w_up));
    }
    }
    norm_backward(c, S.x_mid, L.mlp_norm, dm, dnorm, &G.mlp_norm, &G.mlp_norm_b, costs);
    log_cost(costs, kernels::add_inplace(dx, dnorm));  // dx is now the gradient at x_mid
    if (!c.attention) {  // an MLP-only block: x_mid is x_in
      mark();
      continue;
    }
    // Attention branch: x_mid = x_in + o · wo
    const Tensor o2 = Tensor(S.o).reshaped({N, hq * d});
    Tensor do2 = act({N, hq * d});
    log_cost(costs, kernels::gemm_backward(o2, L.wo, dx, &do2, &G.wo));
    const Tensor dout = std::move(do2).reshaped({N, hq, d});
    Tensor dq = act({N, hq, d}), dk = act({N, hkv, d}), dv = act({N, hkv, d});
    if (c.unfused_attention())
      sharding::plans::unfused_attention_backward(c, S.q, S.k, S.v, S.probs, dout, dq, dk, dv,
                                                  c.batch, T, [&](const kernels::KernelCost& k) { log_cost(costs, k); });
    else
    for (int64_t b = 0; b < c.batch; ++b) {
      Tensor dqb = act({T, hq, d}), dkb = act({T, hkv, d}), dvb = act({T, hkv, d});
      log_cost(costs, kernels::attention_backward(S.q.rows(b * T, T), S.k.rows(b * T, T), S.v.rows(b * T, T),
                                                  S.o.rows(b * T, T), S.lse[static_cast<size_t>(b)],
                                                  dout.rows(b * T, T), dqb, dkb, dvb, causal(c)));
      dq.set_rows(b * T, dqb);
      dk.set_rows(b * T, dkb);
      dv.set_rows(b * T, dvb);
    }
    if (c.position == sharding::PositionKind::rope) {
      log_cost(costs, kernels::rope_backward_inplace(dq, pos, c.rope_theta));
      log_cost(costs, kernels::rope_backward_inplace(dk, pos, c.rope_theta));
    }
    const Tensor dq2 = std::move(dq).reshaped({N, hq * d}), dk2 = std::move(dk).reshaped({N, hkv * d}),
                 dv2 = std::move(dv).reshaped({N, hkv * d});
    Tensor da = act({N, h});
    column_matmuls_backward(S.a, {&L.wq, &L.wk, &L.wv}, {&dq2, &dk2, &dv2}, da, {&G.wq, &G.wk, &G.wv}, costs);
    norm_backward(c, S.x_in, L.attn_norm, da, dnorm, &G.attn_norm, &G.attn_norm_b, costs);
    log_cost(costs, kernels::add_inplace(dx, dnorm));  // gradient at x_in
    mark();  // layer l's gradients complete
  }
  if (c.vocab > 0) log_cost(costs, kernels::embedding_backward(dx, batch.inputs, 0, c.vocab, g.embed));
  if (c.tied_embeddings) log_cost(costs, kernels::add_inplace(g.embed, kernels::transposed(dhead_t)));
  if (c.position == sharding::PositionKind::learned)
    log_cost(costs, kernels::embedding_backward(dx, pos, 0, c.position_rows(), g.pos_embed));
  mark();
}

}  // namespace shardsim::models
