// Helpers the MPI test files share.
#pragma once

#include <mpi.h>

#include <numeric>
#include <vector>

inline int world_rank() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int s;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}
// Rank r on chip r.
inline std::vector<int> identity_chips(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}
