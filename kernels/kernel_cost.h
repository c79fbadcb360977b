// What a local kernel did, so the simulator can cost it on the modelled chip (sim::Timeline::compute), and the
// one shape-only rule every kernel in kernels/ follows.
//
// Shape-only rule (PyTorch's meta device): a kernel computes only when every tensor it reads or writes has
// storage. When any of them is shape-only (runtime::Tensor::shape_only, has_storage() false), the kernel
//   1. checks shapes, dtypes and its other arguments exactly as the real call does (the same errors),
//   2. computes nothing and touches no element,
//   3. makes every output it writes shape-only (Tensor::drop_storage), so no stale value can pass for a result,
//   4. returns exactly the KernelCost the real call returns for those shapes (every field equal; the cost never
//      depends on values -- tests/unit/shape_only_kernels_test.cpp checks every kernel in fp32 and bf16).
// Value-returning helpers that are not kernels say what they do with shape-only inputs (grad_sq_norm_local).
#pragma once

#include <initializer_list>
#include <string>

#include "runtime/dtype.h"
#include "runtime/tensor.h"
#include "sim/kernel_model.h"

namespace shardsim::kernels {

struct KernelCost {
  std::string name;
  double flops = 0;  // floating-point operations (a multiply-add counts 2)
  double bytes = 0;  // HBM traffic: every input read once, every output written once
  runtime::DType dtype = runtime::DType::fp32;
  sim::KernelShape shape;  // what the kernel model quantizes (sim/kernel_model.h); vector kernels leave it empty
};

// The shape-only rule's test and step 3 in one call, after a kernel's checks: true (cost only) when any of
// INPUTS or OUTPUTS (nullptr entries are skipped; an in-place operand may appear in both) has no storage, in
// which case every output is made shape-only; false (compute) otherwise.
inline bool cost_only(std::initializer_list<const runtime::Tensor*> inputs,
                      std::initializer_list<runtime::Tensor*> outputs) {
  bool any = false;
  for (const auto* t : inputs) any = any || (t && !t->has_storage());
  for (const auto* t : outputs) any = any || (t && !t->has_storage());
  if (any)
    for (auto* t : outputs)
      if (t && t->has_storage()) t->drop_storage();
  return any;
}

}  // namespace shardsim::kernels
