// Helpers the MPI test files share.
#pragma once

#include <mpi.h>

#include <cstddef>
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

// The largest of every rank's MINE (e.g. the slowest rank's simulated end time).
inline double max_over_ranks(double mine) {
  double out = 0;
  MPI_Allreduce(&mine, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

// Integer-valued fp32 input of rank R (SALT varies it between cases): |x| <= 11, so every partial sum over up to
// 8 ranks is exact in any order and a reduction's result can be compared bit for bit.
inline float input_value(int r, size_t i, int salt) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(r) * 13 + static_cast<size_t>(salt)) % 23) -
                            11);
}
inline std::vector<float> make_input(int r, size_t count, int salt = 0) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = input_value(r, i, salt);
  return v;
}
// The sum over ranks 0..P-1 of make_input(r, COUNT, SALT), exact.
inline std::vector<float> expected_sum(int p, size_t count, int salt = 0) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) {
    int s = 0;
    for (int q = 0; q < p; ++q) s += static_cast<int>(input_value(q, i, salt));
    v[i] = static_cast<float>(s);
  }
  return v;
}
