#include "runtime/fold_shift.h"

#include <utility>

namespace shardsim::runtime {

namespace {
std::vector<int>& shift() {
  static std::vector<int> image;
  return image;
}
}  // namespace

void set_fold_chip_shift(std::vector<int> image) { shift() = std::move(image); }
const std::vector<int>& fold_chip_shift() { return shift(); }

}  // namespace shardsim::runtime
