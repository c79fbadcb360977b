#include "kernels/bias_dropout.h"

namespace shardsim::kernels {

namespace {

KernelCost vector_cost(const char* name, double flops, double bytes, runtime::DType t) {
  KernelCost c;
  c.name = name;
  c.flops = flops;
  c.bytes = bytes;
  c.dtype = t;
  return c;
}

}  // namespace

std::vector<KernelCost> block_extras_forward(const BlockExtras& x) {
  const double e = double(runtime::dtype_size(x.dtype)), rh = double(x.residual_rows) * double(x.hidden);
  std::vector<KernelCost> v;
  if (x.bias) {
    const double n = double(x.rows) * double(x.qkv_cols);
    v.push_back(vector_cost("bias_add.qkv", n, 2.0 * e * n, x.dtype));
  }
  if (x.dropout > 0) {
    v.push_back(vector_cost("dropout.attention_out", 2.0 * rh, rh, x.dtype));
    v.push_back(vector_cost("dropout.mlp_out", 2.0 * rh, rh, x.dtype));
  }
  return v;
}

std::vector<KernelCost> block_extras_backward(const BlockExtras& x) {
  const double e = double(runtime::dtype_size(x.dtype)), rh = double(x.residual_rows) * double(x.hidden);
  std::vector<KernelCost> v;
  if (x.dropout > 0) v.push_back(vector_cost("dropout_backward.mlp_out", rh, (2.0 * e + 1.0) * rh, x.dtype));
  if (x.bias) {
    const double fc1 = double(x.rows) * double(x.ffn_cols);
    v.push_back(vector_cost("bias_grad.fc2", rh, e * rh, x.dtype));
    v.push_back(vector_cost("bias_grad.fc1", fc1, e * fc1, x.dtype));
  }
  if (x.dropout > 0) v.push_back(vector_cost("dropout_backward.attention_out", rh, (2.0 * e + 1.0) * rh, x.dtype));
  if (x.bias) {
    const double qkv = double(x.rows) * double(x.qkv_cols);
    v.push_back(vector_cost("bias_grad.proj", rh, e * rh, x.dtype));
    v.push_back(vector_cost("bias_grad.qkv", qkv, e * qkv, x.dtype));
  }
  return v;
}

double block_extras_activation_bytes(const BlockExtras& x) {
  return x.dropout > 0 ? 2.0 * double(x.residual_rows) * double(x.hidden) : 0.0;
}

}  // namespace shardsim::kernels
