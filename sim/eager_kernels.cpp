#include "sim/eager_kernels.h"

#include <string>
#include <unordered_map>

namespace shardsim::sim {

namespace {

const std::unordered_map<std::string, EagerDecomposition>& table() {
  static const std::unordered_map<std::string, EagerDecomposition> t = {
      {"rmsnorm",
       {2,
        {{"to_fp32", 1, 1, true}, {"pow", 0, 2}, {"mean", 0, 1}, {"add_eps", 0, 0}, {"rsqrt", 0, 0},
         {"mul_rstd", 0, 2}, {"type_as", 1, 1, true}, {"mul_weight", 2, 0}}}},
      {"rmsnorm_backward",
       {3,
        {{"mul_dy_w", 3, 0}, {"mul_dy_y", 3, 0}, {"sum_dw", 1, 0}, {"to_fp32", 1, 1, true}, {"mul_rstd", 0, 2},
         {"mul_x", 0, 3}, {"sum_rows", 0, 1}, {"mean_backward", 0, 1}, {"pow_backward", 0, 3}, {"add", 0, 3},
         {"to_dtype", 1, 1, true}}}},
      {"rope", {2, {{"to_fp32", 1, 1, true}, {"complex_mul", 0, 2}, {"type_as", 1, 1, true}}}},
      {"rope_backward", {2, {{"to_fp32", 1, 1, true}, {"complex_mul", 0, 2}, {"type_as", 1, 1, true}}}},
      {"swiglu", {3, {{"silu", 2, 0}, {"mul", 3, 0}}}},
      {"swiglu_backward", {5, {{"mul_silu", 3, 0}, {"mul_up", 3, 0}, {"silu_backward", 3, 0}}}},
      {"ce_max", {1, {{"to_fp32", 1, 1, true}, {"log_softmax_max", 0, 1}}}},
      {"ce_stats", {1, {{"log_softmax_sum_exp", 0, 1}, {"log_softmax_out", 0, 2}}}},
      {"ce_backward",
       {2, {{"nll_loss_backward_fill", 0, 1}, {"log_softmax_backward", 0, 4}, {"to_dtype", 1, 1, true}}}},
  };
  return t;
}

}  // namespace

const EagerDecomposition* eager_decomposition(std::string_view name) {
  const std::string base(name.substr(0, name.find('.')));
  const auto& t = table();
  const auto it = t.find(base);
  return it == t.end() ? nullptr : &it->second;
}

}  // namespace shardsim::sim
