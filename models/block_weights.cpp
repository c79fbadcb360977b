#include "models/block_weights.h"

#include <cmath>

#include "collectives/types.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/norm.h"
#include "models/init.h"
#include "models/mlp.h"
#include "models/workload.h"
#include "sharding/plans/block_ops.h"
#include "sharding/plans/tensor_parallel.h"

namespace shardsim::sharding::block_detail {

namespace {

// The shared pieces and the plan units (sharding/plans/).
using plans::Chip;
using plans::Chunk;
using plans::Comm;
using plans::gemm;
using plans::rmsnorm;

constexpr uint32_t kIdX = 1, kIdNorm1 = 2, kIdWq = 3, kIdWk = 4, kIdWv = 5, kIdWo = 6, kIdNorm2 = 7, kIdWg = 8,
                   kIdWu = 9, kIdWd = 10;

// The block of the global [*, global_cols] tensor ID at (row0, col0), scaled for a fan-in of FAN_IN.
Tensor init_block(const ModelSpec& s, uint32_t id, int64_t rows, int64_t cols, int64_t global_cols, int64_t row0,
                  int64_t col0, double fan_in, bool storage) {
  if (!storage) return Tensor::shape_only({rows, cols}, s.dtype);
  Tensor t(s.dtype, {rows, cols});
  const float a = static_cast<float>(1.0 / std::sqrt(fan_in));
  fill_uniform_block(t, InitSpec{s.seed, id, -a, a}, global_cols, row0, col0);
  return t;
}
Tensor init_norm(const ModelSpec& s, uint32_t id, bool storage) {
  if (!storage) return Tensor::shape_only({s.hidden}, s.dtype);
  Tensor t(s.dtype, {1, s.hidden});
  fill_uniform_block(t, InitSpec{s.seed, id, 0.9f, 1.1f}, s.hidden, 0, 0);
  return Tensor::from_float(t.to_float(), s.dtype, {s.hidden});
}

}  // namespace

Tensor init_x(const ModelSpec& s, const std::vector<int64_t>& rows, bool storage) {
  if (!storage) return Tensor::shape_only({static_cast<int64_t>(rows.size()), s.hidden}, s.dtype);
  Tensor x(s.dtype, {static_cast<int64_t>(rows.size()), s.hidden});
  for (size_t i = 0; i < rows.size();) {  // contiguous runs
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
    Tensor run(s.dtype, {static_cast<int64_t>(j - i), s.hidden});
    fill_uniform_block(run, InitSpec{s.seed, kIdX, -1.0f, 1.0f}, s.hidden, rows[i], 0);
    x.set_rows(static_cast<int64_t>(i), run);
    i = j;
  }
  return x;
}


// Layer L's weights (layer 0: the tensor ids above; layer l adds 16·l, so every layer has its own seeded values).
// Shape-only (STORAGE false): the same shapes without storage.
Weights make_weights(const ModelSpec& s, int tp, int t, int64_t layer, bool storage) {
  Weights w;
  const collectives::Partition fp{static_cast<size_t>(s.ffn), static_cast<size_t>(tp)};
  w.f0 = static_cast<int64_t>(fp.offset(static_cast<size_t>(t)));
  w.nf = static_cast<int64_t>(fp.size(static_cast<size_t>(t)));
  if (!s.attention) {  // the MLP workload: models/mlp.h's seeded weights (one layer)
    MlpWeights m = make_mlp_weights(mlp_shape_of(s), w.f0, w.nf, storage);
    w.wg = std::move(m.w_gate);
    w.wu = std::move(m.w_up);
    w.wd = std::move(m.w_down);
    return w;
  }
  const auto id = [layer](uint32_t base) { return base + 16u * static_cast<uint32_t>(layer); };
  const int64_t d = s.head_dim;
  w.nq = s.heads / tp;
  w.q0 = t * w.nq;
  if (tp <= s.kv_heads) {
    w.nkv = s.kv_heads / tp;
    w.g0 = t * w.nkv;
  } else {
    w.nkv = 1;  // replicated: the KV head this chip's q heads use
    w.g0 = w.q0 / (s.heads / s.kv_heads);
  }
  const double h = static_cast<double>(s.hidden);
  w.norm1 = init_norm(s, id(kIdNorm1), storage);
  w.norm2 = init_norm(s, id(kIdNorm2), storage);
  w.wq = init_block(s, id(kIdWq), s.hidden, w.nq * d, s.heads * d, 0, w.q0 * d, h, storage);
  w.wk = init_block(s, id(kIdWk), s.hidden, w.nkv * d, s.kv_heads * d, 0, w.g0 * d, h, storage);
  w.wv = init_block(s, id(kIdWv), s.hidden, w.nkv * d, s.kv_heads * d, 0, w.g0 * d, h, storage);
  w.wo = init_block(s, id(kIdWo), w.nq * d, s.hidden, s.hidden, w.q0 * d, 0, static_cast<double>(s.heads * d), storage);
  w.wg = init_block(s, id(kIdWg), s.hidden, w.nf, s.ffn, 0, w.f0, h, storage);
  w.wu = init_block(s, id(kIdWu), s.hidden, w.nf, s.ffn, 0, w.f0, h, storage);
  w.wd = init_block(s, id(kIdWd), w.nf, s.hidden, s.hidden, w.f0, 0, static_cast<double>(s.ffn), storage);
  return w;
}

uint64_t weight_bytes(const Weights& w) {
  uint64_t b = 0;
  for (const Tensor* t : {&w.norm1, &w.wq, &w.wk, &w.wv, &w.wo, &w.norm2, &w.wg, &w.wu, &w.wd}) b += t->nbytes();
  return b;
}

plans::BlockWeights block_weights(const Weights& w) {
  return {&w.norm1, &w.wq, &w.wk, &w.wv, &w.wo, &w.norm2, &w.wg, &w.wu, &w.wd};
}

// The single-device block (the reference), charged to CHIP.
Tensor block_single(Chip& chip, const ModelSpec& s, const Tensor& x, const Weights& w) {
  if (!s.attention) return plans::mlp_layer(chip, nullptr, x, block_weights(w), s.glu_activation());
  const int64_t T = s.seq, d = s.head_dim;
  Tensor a = rmsnorm(chip, x, w.norm1, "rmsnorm.attn", s.norm_eps);
  Tensor q = gemm(chip, a, w.wq, "gemm.q").reshaped({a.dim(0), s.heads, d});
  Tensor k = gemm(chip, a, w.wk, "gemm.k").reshaped({a.dim(0), s.kv_heads, d});
  Tensor v = gemm(chip, a, w.wv, "gemm.v").reshaped({a.dim(0), s.kv_heads, d});
  if (s.has_rope()) {
    const auto pos = plans::token_layout(T, 1, 1, 0, false).pos;
    chip.charge(kernels::rope_inplace(q, pos, static_cast<float>(s.rope_theta)), "rope.q");
    chip.charge(kernels::rope_inplace(k, pos, static_cast<float>(s.rope_theta)), "rope.k");
  }
  std::vector<Tensor> lse;
  Tensor o = plans::local_attention(chip, s, q, k, v, 1, T, lse).reshaped({T, s.heads * d});
  Tensor x1 = gemm(chip, o, w.wo, "gemm.o");
  chip.charge(kernels::add_inplace(x1, x), "residual");
  Tensor out = plans::mlp_layer(chip, nullptr, rmsnorm(chip, x1, w.norm2, "rmsnorm.mlp", s.norm_eps), block_weights(w),
                                s.glu_activation());
  chip.charge(kernels::add_inplace(out, x1), "residual");
  return out;
}


// max |y - reference| / max |reference| over all elements (max |y - reference| when the reference is all zero); a
// non-finite y counts as an infinite error.
double relative_error(const Tensor& y, const Tensor& ref) {
  double err = 0, mag = 0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    const double a = y.get(i), b = ref.get(i);
    err = std::isfinite(a) ? std::max(err, std::fabs(a - b)) : INFINITY;
    mag = std::max(mag, std::fabs(b));
  }
  return mag > 0 ? err / mag : err;
}


std::vector<WeightSlot> weight_slots(const ModelSpec& s, Weights& w) {
  const int64_t d = s.head_dim, H = s.hidden;
  if (!s.attention)
    return {
        {"weights/w_gate", &w.wg, {H, s.ffn}, {0, w.f0}, Shard{1}},
        {"weights/w_up", &w.wu, {H, s.ffn}, {0, w.f0}, Shard{1}},
        {"weights/w_down", &w.wd, {s.ffn, H}, {w.f0, 0}, Shard{0}},
    };
  return {
      {"weights/norm1", &w.norm1, {H}, {0}, Replicate{}},
      {"weights/wq", &w.wq, {H, s.heads * d}, {0, w.q0 * d}, Shard{1}},
      {"weights/wk", &w.wk, {H, s.kv_heads * d}, {0, w.g0 * d}, Shard{1}, true},
      {"weights/wv", &w.wv, {H, s.kv_heads * d}, {0, w.g0 * d}, Shard{1}, true},
      {"weights/wo", &w.wo, {s.heads * d, H}, {w.q0 * d, 0}, Shard{0}},
      {"weights/norm2", &w.norm2, {H}, {0}, Replicate{}},
      {"weights/w_gate", &w.wg, {H, s.ffn}, {0, w.f0}, Shard{1}},
      {"weights/w_up", &w.wu, {H, s.ffn}, {0, w.f0}, Shard{1}},
      {"weights/w_down", &w.wd, {s.ffn, H}, {w.f0, 0}, Shard{0}},
  };
}

}  // namespace shardsim::sharding::block_detail
