// `shardsim calibrate --kernels`: the kernel model's fit (apps/calibrate_kernels.cpp).
#pragma once

#include <string>

#include "runtime/world.h"

namespace shardsim::apps {

struct KernelCalibrateFlags {
  std::string table;   // --kernels FILE
  std::string device;  // --device PRESET | FILE
  std::string out, json;
  bool strict = false;
};

int run_calibrate_kernels(const runtime::World& world, const KernelCalibrateFlags& f);

}  // namespace shardsim::apps
