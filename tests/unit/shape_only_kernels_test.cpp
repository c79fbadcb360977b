// The shape-only rule of kernels/kernel_cost.h, kernel by kernel: the same call on shape-only tensors returns a
// KernelCost equal in every field to the real call's, touches no element, and leaves its outputs shape-only.
// Every kernel in kernels/ (forward, backward, optimizer), small shapes, fp32 and bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_backward.h"
#include "kernels/backward.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/optimizer.h"

using namespace shardsim;
using kernels::KernelCost;
using runtime::DType;
using runtime::Shape;
using runtime::Tensor;

namespace {

// Tensors of one call: real ones hold values uniform in [-1, 1] from a fixed seed, shape-only ones nothing.
struct Maker {
  bool storage;
  std::mt19937 rng{7};
  Tensor operator()(DType dt, Shape s) {
    Tensor t = Tensor::make(dt, std::move(s), storage);
    if (storage) {
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
    }
    return t;
  }
};

// One kernel call: builds its tensors with MK, calls the kernel and returns its cost and the outputs it wrote.
using Call = std::function<KernelCost(Maker& mk, DType dt, std::vector<Tensor>& outputs)>;

struct Case {
  std::string name;
  Call call;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  const std::vector<int64_t> pos4 = {0, 1, 2, 3}, tok = {1, 5, 2, 7, 0, 3};
  c.push_back({"gemm", [](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor a = mk(dt, {5, 4}), b = mk(dt, {3, 4});
                 out.push_back(mk(dt, {5, 3}));
                 return kernels::gemm(a, b, out[0], {.trans_a = false, .trans_b = true});
               }});
  c.push_back({"gemm_rows", [](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor a = mk(dt, {6, 4}), b = mk(dt, {4, 3});
                 out.push_back(mk(dt, {5, 3}));
                 return kernels::gemm_rows(a, 2, 3, b, out[0], 1);
               }});
  for (auto act : {kernels::Activation::silu, kernels::Activation::gelu}) {
    c.push_back({"activation_" + kernels::activation_name(act), [act](Maker& mk, DType dt, std::vector<Tensor>& out) {
                   out.push_back(mk(dt, {4, 6}));
                   return kernels::activation_inplace(out[0], act);
                 }});
    c.push_back({"glu_" + kernels::activation_name(act), [act](Maker& mk, DType dt, std::vector<Tensor>& out) {
                   Tensor up = mk(dt, {4, 6});
                   out.push_back(mk(dt, {4, 6}));
                   return kernels::glu_inplace(out[0], up, act);
                 }});
  }
  c.push_back({"mul", [](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor b = mk(dt, {3, 5});
                 out.push_back(mk(dt, {3, 5}));
                 return kernels::mul_inplace(out[0], b);
               }});
  c.push_back({"rmsnorm", [](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor x = mk(dt, {4, 8}), w = mk(dt, {8});
                 out.push_back(mk(dt, {4, 8}));
                 return kernels::rmsnorm(x, w, out[0]);
               }});
  c.push_back({"layernorm", [](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor x = mk(dt, {4, 8}), w = mk(dt, {8}), b = mk(dt, {8});
                 out.push_back(mk(dt, {4, 8}));
                 return kernels::layernorm(x, w, b, out[0]);
               }});
  c.push_back({"rope", [pos4](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 out.push_back(mk(dt, {4, 2, 6}));
                 return kernels::rope_inplace(out[0], pos4);
               }});
  c.push_back({"add", [](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor b = mk(dt, {3, 5});
                 out.push_back(mk(dt, {3, 5}));
                 return kernels::add_inplace(out[0], b);
               }});
  for (bool causal : {false, true}) {
    const std::string sfx = causal ? "_causal" : "";
    c.push_back({"attention" + sfx, [causal](Maker& mk, DType dt, std::vector<Tensor>& out) {
                   Tensor q = mk(dt, {6, 4, 8}), k = mk(dt, {7, 2, 8}), v = mk(dt, {7, 2, 8});
                   out.push_back(mk(DType::fp32, {6, 4, 8}));
                   out.push_back(mk(DType::fp32, {4, 6}));
                   kernels::AttentionOptions o;
                   o.causal = causal;
                   o.q_offset = 3;
                   o.k_offset = 1;
                   o.block_q = 4;
                   o.block_k = 3;
                   return kernels::attention(q, k, v, out[0], out[1], o);
                 }});
    c.push_back({"attention_backward" + sfx, [causal](Maker& mk, DType dt, std::vector<Tensor>& out) {
                   Tensor q = mk(dt, {6, 4, 8}), k = mk(dt, {6, 2, 8}), v = mk(dt, {6, 2, 8});
                   Tensor o_ = mk(dt, {6, 4, 8}), lse = mk(DType::fp32, {4, 6}), dout = mk(dt, {6, 4, 8});
                   out.push_back(mk(dt, {6, 4, 8}));
                   out.push_back(mk(dt, {6, 2, 8}));
                   out.push_back(mk(dt, {6, 2, 8}));
                   kernels::AttentionOptions o;
                   o.causal = causal;
                   o.block_q = 4;
                   o.block_k = 3;
                   return kernels::attention_backward(q, k, v, o_, lse, dout, out[0], out[1], out[2], o);
                 }});
  }
  c.push_back({"merge_attention_partials", [](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor ob = mk(dt, {5, 2, 4}), lb = mk(DType::fp32, {2, 5});
                 out.push_back(mk(dt, {5, 2, 4}));
                 out.push_back(mk(DType::fp32, {2, 5}));
                 return kernels::merge_attention_partials(out[0], out[1], ob, lb);
               }});
  c.push_back({"embedding_forward", [tok](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor table = mk(dt, {4, 5});
                 out.push_back(mk(dt, {6, 5}));
                 return kernels::embedding_forward(table, tok, 4, 8, out[0]);
               }});
  c.push_back({"embedding_backward", [tok](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor dout = mk(dt, {6, 5});
                 out.push_back(mk(dt, {4, 5}));
                 return kernels::embedding_backward(dout, tok, 0, 8, out[0]);
               }});
  c.push_back({"ce_shard_max", [](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor z = mk(dt, {6, 4});
                 out.push_back(mk(DType::fp32, {6}));
                 return kernels::ce_shard_max(z, out[0]);
               }});
  c.push_back({"ce_shard_stats", [tok](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor z = mk(dt, {6, 4}), m = mk(DType::fp32, {6});
                 out.push_back(mk(DType::fp32, {6}));
                 out.push_back(mk(DType::fp32, {6}));
                 return kernels::ce_shard_stats(z, m, tok, 4, 8, out[0], out[1]);
               }});
  c.push_back({"ce_loss", [](Maker& mk, DType, std::vector<Tensor>& out) {
                 Tensor m = mk(DType::fp32, {6}), s = mk(DType::fp32, {6}), t = mk(DType::fp32, {6});
                 out.push_back(mk(DType::fp32, {6}));
                 return kernels::ce_loss(m, s, t, out[0]);
               }});
  c.push_back({"ce_backward", [tok](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor z = mk(dt, {6, 4}), m = mk(DType::fp32, {6}), s = mk(DType::fp32, {6});
                 out.push_back(mk(dt, {6, 4}));
                 return kernels::ce_backward(z, m, s, tok, 4, 8, 1.0f / 6, out[0]);
               }});
  c.push_back({"gemm_backward", [](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor x = mk(dt, {5, 4}), w = mk(dt, {4, 3}), dy = mk(dt, {5, 3});
                 out.push_back(mk(dt, {5, 4}));
                 out.push_back(mk(dt, {4, 3}));
                 return kernels::gemm_backward(x, w, dy, &out[0], &out[1]);
               }});
  c.push_back({"gemm_backward_dx_only", [](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor x = mk(dt, {5, 4}), w = mk(dt, {4, 3}), dy = mk(dt, {5, 3});
                 out.push_back(mk(dt, {5, 4}));
                 return kernels::gemm_backward(x, w, dy, &out[0], nullptr);
               }});
  c.push_back({"swiglu_backward", [](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor g = mk(dt, {3, 6}), u = mk(dt, {3, 6}), d = mk(dt, {3, 6});
                 out.push_back(mk(dt, {3, 6}));
                 out.push_back(mk(dt, {3, 6}));
                 return kernels::swiglu_backward(g, u, d, out[0], out[1]);
               }});
  c.push_back({"rmsnorm_backward", [](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor x = mk(dt, {4, 8}), w = mk(dt, {8}), dy = mk(dt, {4, 8});
                 out.push_back(mk(dt, {4, 8}));
                 out.push_back(mk(dt, {8}));
                 return kernels::rmsnorm_backward(x, w, dy, out[0], &out[1]);
               }});
  c.push_back({"layernorm_backward", [](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor x = mk(dt, {4, 8}), w = mk(dt, {8}), dy = mk(dt, {4, 8});
                 out.push_back(mk(dt, {4, 8}));
                 out.push_back(mk(dt, {8}));
                 out.push_back(mk(dt, {8}));
                 return kernels::layernorm_backward(x, w, dy, out[0], &out[1], &out[2]);
               }});
  c.push_back({"gelu_backward", [](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor x = mk(dt, {3, 6}), dy = mk(dt, {3, 6});
                 out.push_back(mk(dt, {3, 6}));
                 return kernels::gelu_backward(x, dy, out[0]);
               }});
  c.push_back({"rope_backward", [pos4](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 out.push_back(mk(dt, {4, 2, 6}));
                 return kernels::rope_backward_inplace(out[0], pos4);
               }});
  c.push_back({"add_backward", [](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor dy = mk(dt, {3, 5});
                 out.push_back(mk(dt, {3, 5}));
                 out.push_back(mk(dt, {3, 5}));
                 return kernels::add_backward(dy, out[0], out[1]);
               }});
  c.push_back({"adamw", [](Maker& mk, DType dt, std::vector<Tensor>& out) {
                 Tensor grad = mk(dt, {4, 5});
                 out.push_back(mk(DType::fp32, {4, 5}));
                 out.push_back(mk(DType::fp32, {4, 5}));
                 out.push_back(mk(DType::fp32, {4, 5}));
                 out.push_back(mk(DType::bf16, {4, 5}));
                 return kernels::adamw_step(out[0], out[1], out[2], grad, 3, {}, 0.5f, &out[3]);
               }});
  return c;
}

}  // namespace

TEST(ShapeOnlyKernels, CostEqualsTheRealCallsAndNothingIsComputed) {
  int checked = 0;
  for (const auto& k : cases())
    for (DType dt : {DType::fp32, DType::bf16}) {
      SCOPED_TRACE(k.name + " " + runtime::dtype_name(dt));
      Maker real{true}, meta{false};
      std::vector<Tensor> real_out, meta_out;
      const KernelCost a = k.call(real, dt, real_out);
      const KernelCost b = k.call(meta, dt, meta_out);
      EXPECT_EQ(a.name, b.name);
      EXPECT_EQ(a.flops, b.flops);
      EXPECT_EQ(a.bytes, b.bytes);
      EXPECT_EQ(a.dtype, b.dtype);
      EXPECT_GT(a.bytes, 0.0);
      ASSERT_EQ(real_out.size(), meta_out.size());
      for (size_t i = 0; i < meta_out.size(); ++i) {
        EXPECT_TRUE(real_out[i].has_storage());
        EXPECT_FALSE(meta_out[i].has_storage());
        EXPECT_EQ(meta_out[i].shape(), real_out[i].shape());
        EXPECT_EQ(meta_out[i].nbytes(), real_out[i].nbytes());
      }
      ++checked;
    }
  EXPECT_EQ(checked, 2 * 31);
}

// One shape-only input is enough: outputs that had storage lose it (no stale values pass for a result).
TEST(ShapeOnlyKernels, MixedOperandsMakeTheOutputsShapeOnly) {
  Tensor a = Tensor::shape_only({5, 4}, DType::fp32), b(DType::fp32, {4, 3}), c(DType::fp32, {5, 3});
  const auto cost = kernels::gemm(a, b, c);
  EXPECT_EQ(cost.flops, 2.0 * 5 * 4 * 3);
  EXPECT_FALSE(c.has_storage());
  EXPECT_TRUE(b.has_storage());
  // Shape checks are the real call's.
  Tensor bad = Tensor::shape_only({5, 3}, DType::fp32);
  EXPECT_THROW(kernels::gemm(a, a, bad), std::invalid_argument);
}

TEST(ShapeOnlyTensor, HasShapeAndSizeButNoBytes) {
  Tensor t = Tensor::shape_only({3, 4}, DType::bf16);
  EXPECT_FALSE(t.has_storage());
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_THROW((void)t.data(), std::logic_error);
  EXPECT_THROW((void)t.bf16(), std::logic_error);
  EXPECT_THROW((void)t.get(0), std::logic_error);
  EXPECT_THROW(t.set(0, 1.0f), std::logic_error);
  EXPECT_THROW((void)t.to_float(), std::logic_error);
  Tensor r = t.rows(1, 2);
  EXPECT_FALSE(r.has_storage());
  EXPECT_EQ(r.shape(), (Shape{2, 4}));
  t.set_rows(0, r);  // both shape-only: checks only
  Tensor real(DType::bf16, {2, 4});
  EXPECT_THROW(t.set_rows(0, real), std::logic_error);
  EXPECT_THROW(real.set_rows(0, r), std::logic_error);
  EXPECT_TRUE(t.bit_equal(Tensor::shape_only({3, 4}, DType::bf16)));
  EXPECT_FALSE(Tensor(DType::bf16, {3, 4}).bit_equal(t));
  Tensor moved = std::move(t).reshaped({12});
  EXPECT_FALSE(moved.has_storage());
  Tensor real2(DType::fp32, {2, 2});
  real2.drop_storage();
  EXPECT_FALSE(real2.has_storage());
  EXPECT_EQ(real2.nbytes(), 16u);
}

// The closed form of the visible pairs (what the attention costs charge) against counting them row by row.
TEST(ShapeOnlyKernels, VisiblePairsClosedFormEqualsTheRowCount) {
  int checked = 0;
  for (int64_t sq : {0, 1, 5, 64, 257})
    for (int64_t sk : {0, 1, 7, 64, 300})
      for (int64_t qo : {0, 3, 64, 500})
        for (int64_t ko : {0, 5, 64, 700})
          for (bool causal : {false, true}) {
            kernels::AttentionOptions o;
            o.causal = causal;
            o.q_offset = qo;
            o.k_offset = ko;
            int64_t want = 0;
            for (int64_t i = 0; i < sq; ++i)
              want += causal ? std::clamp<int64_t>(qo + i - ko + 1, 0, sk) : sk;
            ASSERT_EQ(kernels::attention_visible_pairs(sq, sk, o), want)
                << "sq " << sq << " sk " << sk << " q_offset " << qo << " k_offset " << ko << " causal " << causal;
            ++checked;
          }
  EXPECT_EQ(checked, 5 * 5 * 4 * 4 * 2);
}
