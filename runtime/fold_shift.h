// The replica shift of a folded run on physical chips (docs/performance/fold.md, "Cycle algorithms"): the fold
// decision (apps/train_setup.cpp) sets it from the mesh's placement before the run; collectives::choose reads it to
// check that an algorithm of explicit ring orders (rail_ring, multi_ring) is mapped onto itself by the shift, so a
// folded run over its groups is exact. Process-wide (one run at a time on a rank); empty when no fold is decided.
#pragma once

#include <vector>

namespace shardsim::runtime {

// IMAGE[c]: the physical chip one replica on from chip C (a permutation of the topology's chips); empty: none.
void set_fold_chip_shift(std::vector<int> image);
const std::vector<int>& fold_chip_shift();

}  // namespace shardsim::runtime
