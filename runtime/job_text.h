// How messages name the job's size and how to resize it: a job of N chips is N ranks (one chip per rank) or
// R ranks hosting K chips each (--chips / --chips-per-rank, runtime/chips.h), so "the job has 16 ranks" was wrong
// for one rank hosting 16 chips, and "use mpirun -np 8" the wrong advice to a one-rank user.
#pragma once

#include <string>

#include "runtime/chips.h"

namespace shardsim::runtime {

// "16 chips (1 rank x 16 chips)" when ranks host several chips, else "8 ranks (one chip per rank)".
inline std::string job_size_text(int chips) {
  const int k = chips_per_rank();
  if (k <= 1) return std::to_string(chips) + (chips == 1 ? " rank" : " ranks") + " (one chip per rank)";
  const int ranks = chips / k;
  return std::to_string(chips) + " chips (" + std::to_string(ranks) + (ranks == 1 ? " rank" : " ranks") + " x " +
         std::to_string(k) + " chips)";
}

// How to run WANT chips, from a job of JOB_CHIPS: "--chips WANT" (one process, or ranks hosting several chips),
// else "mpirun -np WANT (or --chips WANT on one rank)".
inline std::string resize_hint(int want, int job_chips) {
  if (chips_per_rank() > 1 || job_chips == 1) return "--chips " + std::to_string(want);
  return "mpirun -np " + std::to_string(want) + " (or --chips " + std::to_string(want) + " on one rank)";
}

}  // namespace shardsim::runtime
