#include "kernels/embedding.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace shardsim::kernels {

using runtime::shape_str;
using runtime::Tensor;

namespace {

void check(const Tensor& table, const std::vector<int64_t>& tokens, int64_t v0, int64_t vocab, const Tensor& rows,
           const char* op, const char* tname, const char* rname) {
  if (table.rank() != 2 || rows.rank() != 2 || rows.dim(1) != table.dim(1) ||
      rows.dim(0) != static_cast<int64_t>(tokens.size()) || rows.dtype() != table.dtype())
    throw std::invalid_argument(std::string(op) + ": " + tname + " " + shape_str(table.shape()) + " " +
                                runtime::dtype_name(table.dtype()) + ", " + rname + " " + shape_str(rows.shape()) + " " +
                                runtime::dtype_name(rows.dtype()) + ", " + std::to_string(tokens.size()) +
                                " tokens (want [Vs, h] and [T, h] of one dtype, T tokens)");
  if (v0 < 0 || v0 + table.dim(0) > vocab)
    throw std::invalid_argument(std::string(op) + ": shard rows [" + std::to_string(v0) + ", " +
                                std::to_string(v0 + table.dim(0)) + ") are not inside the vocabulary [0, " +
                                std::to_string(vocab) + ")");
  for (size_t t = 0; t < tokens.size(); ++t)
    if (tokens[t] < 0 || tokens[t] >= vocab)
      throw std::invalid_argument(std::string(op) + ": token " + std::to_string(t) + " is " +
                                  std::to_string(tokens[t]) + ", outside the vocabulary [0, " + std::to_string(vocab) +
                                  ")");
}

}  // namespace

KernelCost embedding_forward(const Tensor& table, const std::vector<int64_t>& tokens, int64_t v0, int64_t vocab,
                             Tensor& out) {
  check(table, tokens, v0, vocab, out, "embedding_forward", "table", "out");
  const int64_t vs = table.dim(0), h = table.dim(1);
  {
    const double n = static_cast<double>(out.numel()), es = static_cast<double>(runtime::dtype_size(table.dtype()));
    const KernelCost cost{"embedding", 0.0, 2.0 * n * es + 8.0 * double(tokens.size()), table.dtype(), {}};
    if (cost_only({&table}, {&out})) return cost;
  }
  const size_t row_bytes = static_cast<size_t>(h) * runtime::dtype_size(table.dtype());
  auto* dst = static_cast<unsigned char*>(out.data());
  const auto* src = static_cast<const unsigned char*>(table.data());
  for (size_t t = 0; t < tokens.size(); ++t) {
    const int64_t r = tokens[t] - v0;
    if (r >= 0 && r < vs)
      std::memcpy(dst + t * row_bytes, src + static_cast<size_t>(r) * row_bytes, row_bytes);
    else
      std::memset(dst + t * row_bytes, 0, row_bytes);
  }
  const double n = static_cast<double>(out.numel()), es = static_cast<double>(runtime::dtype_size(table.dtype()));
  return {"embedding", 0.0, 2.0 * n * es + 8.0 * double(tokens.size()), table.dtype(), {}};
}

KernelCost embedding_backward(const Tensor& dout, const std::vector<int64_t>& tokens, int64_t v0, int64_t vocab,
                              Tensor& dtable) {
  check(dtable, tokens, v0, vocab, dout, "embedding_backward", "dtable", "dout");
  const int64_t vs = dtable.dim(0), h = dtable.dim(1);
  {
    const double n = static_cast<double>(dout.numel()), es = static_cast<double>(runtime::dtype_size(dout.dtype()));
    const KernelCost cost{"embedding_backward", n, (2.0 * n + double(vs * h)) * es + 8.0 * double(tokens.size()),
                          dout.dtype(), {}};
    if (cost_only({&dout}, {&dtable})) return cost;
  }
  std::vector<float> acc(static_cast<size_t>(vs * h), 0.0f);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const int64_t r = tokens[t] - v0;
    if (r < 0 || r >= vs) continue;
    for (int64_t i = 0; i < h; ++i) acc[static_cast<size_t>(r * h + i)] += dout.get(static_cast<int64_t>(t) * h + i);
  }
  for (int64_t i = 0; i < vs * h; ++i) dtable.set(i, acc[static_cast<size_t>(i)]);
  const double n = static_cast<double>(dout.numel()), es = static_cast<double>(runtime::dtype_size(dout.dtype()));
  return {"embedding_backward", n, (2.0 * n + double(vs * h)) * es + 8.0 * double(tokens.size()), dout.dtype(), {}};
}

}  // namespace shardsim::kernels
