// What a local kernel did, so the simulator can cost it on the modelled chip (sim::Timeline::compute).
#pragma once

#include <string>

#include "runtime/dtype.h"

namespace shardsim::kernels {

struct KernelCost {
  std::string name;
  double flops = 0;  // floating-point operations (a multiply-add counts 2)
  double bytes = 0;  // HBM traffic: every input read once, every output written once
  runtime::DType dtype = runtime::DType::fp32;
};

}  // namespace shardsim::kernels
