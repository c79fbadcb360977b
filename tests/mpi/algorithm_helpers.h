// Helpers the per-collective MPI test files share (moved from algorithms_test.cpp): test topologies, ring routes,
// byte patterns, exact-integer reduction inputs with their expected results computed here (independently of
// verification/verify), and the binomial tree's first-principles schedule.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "collectives/collectives.h"
#include "mpi/collective_fixture.h"
#include "mpi/mpi_util.h"
#include "common/error.h"

namespace algtest {

using namespace shardsim;
using collectives::Collective;
using collectives::CollectiveOptions;
using collectives::CollectiveResult;
using collectives::ReduceOp;
using runtime::DType;
using topology::LinkSpec;
using topology::Topology;
using Bytes = std::vector<unsigned char>;

inline Topology ring_topo(double bw, double lat, bool bidirectional = true) {
  return Topology::ring(world_size(), LinkSpec{bw, lat}, bidirectional);
}

// The route a -> b on a bidirectional ring of p chips: the shorter way, + on a tie; a 2-chip ring has one link
// each way (topology.h).
inline int ring_fwd(int p, int a, int b) { return ((b - a) % p + p) % p; }
inline int ring_hops(int p, int a, int b) {
  const int f = ring_fwd(p, a, b);
  return p <= 2 ? f : std::min(f, p - f);
}
inline int ring_dir(int p, int a, int b) {
  const int f = ring_fwd(p, a, b);
  return (p <= 2 || f <= p - f) ? +1 : -1;
}

// All ranks' span ends, gathered on every rank (index = world rank).
inline std::vector<double> all_ends(double mine) {
  std::vector<double> v(static_cast<size_t>(world_size()));
  MPI_Allgather(&mine, 1, MPI_DOUBLE, v.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  return v;
}

// Raw test bytes: a function of (rank, byte index, salt) that differs between neighbouring bytes and ranks.
inline Bytes pattern(size_t nbytes, int rank, int salt) {
  Bytes b(nbytes);
  for (size_t i = 0; i < nbytes; ++i)
    b[i] = static_cast<unsigned char>((static_cast<size_t>(rank) * 131 + i * 29 + (i >> 8) * 3 +
                                       static_cast<size_t>(salt) * 7 + 1) & 0xFF);
  return b;
}

inline ::testing::AssertionResult same_bytes(const Bytes& got, const Bytes& want, size_t elem = 1) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i])
      return ::testing::AssertionFailure() << "first difference at byte " << i << " (element " << i / elem
                                           << "): got " << int(got[i]) << ", want " << int(want[i]);
  return ::testing::AssertionSuccess();
}

inline std::string dt(DType t) { return runtime::dtype_name(t); }
inline std::string opname(ReduceOp op) { return collectives::reduce_op_name(op); }

// ---- integer-valued reduction inputs and their expected results, computed here ----

// Every integer in [-M, M] is exact in a float type with m mantissa bits when M = 2^(m+1).
inline double float_exact_limit(DType t) {
  switch (t) {
    case DType::fp16: return 2048;           // 10 + 1 bits
    case DType::bf16: return 256;            // 7 + 1
    case DType::fp32: return 16777216.0;     // 23 + 1
    case DType::fp64: return 9007199254740992.0;
    case DType::fp8_e4m3: return 16;         // 3 + 1
    case DType::fp8_e5m2: return 8;          // 2 + 1
    default: throw std::logic_error("not a float type");
  }
}

inline uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) { return mix(a * 1000003 + mix(b * 7919 + mix(c))); }

// Value of rank R's element I for OP over P ranks in type T. Floats: every partial result stays an exact integer
// (sum: |x| <= M/p; avg: the same, with per-element sums divisible by p so the quotient is exact; prod: +-1, +-2,
// |product| <= 2^8; min/max: |x| <= min(M, 1000)). 8/32-bit integers: any value (sums and products wrap modulo
// 2^bits, which is order-independent; prod: odd values). 64-bit integers: small values.
inline int64_t value(DType t, ReduceOp op, int p, int r, size_t i, int salt) {
  const uint64_t h = hash3(static_cast<uint64_t>(r) + 1, i, static_cast<uint64_t>(salt));
  if (runtime::is_integer(t)) {
    if (t == DType::int64 || t == DType::uint64) {
      if (op == ReduceOp::prod) return static_cast<int64_t>(h % 7) - 3;
      return static_cast<int64_t>(h % 2001) - (t == DType::uint64 ? 0 : 1000);
    }
    // prod: odd values, so the wrapped product is never trivially 0 (it is odd) yet still wraps.
    if (op == ReduceOp::prod) return (static_cast<int64_t>(h & 0xFFFFFFFFull) - 0x80000000ll) | 1;
    return static_cast<int64_t>(h & 0xFFFFFFFFull) - 0x80000000ll;
  }
  const int64_t M = static_cast<int64_t>(std::min(float_exact_limit(t), 1e6));
  const int64_t L = M / p;
  switch (op) {
    case ReduceOp::sum: return static_cast<int64_t>(h % static_cast<uint64_t>(2 * L + 1)) - L;
    case ReduceOp::avg: {
      const uint64_t he = hash3(99, i, static_cast<uint64_t>(salt));  // the same on every rank
      const int64_t b = static_cast<int64_t>(he % static_cast<uint64_t>(2 * L + 1)) - L;
      const int64_t k = p >= 2 ? static_cast<int64_t>((he >> 20) % static_cast<uint64_t>(L - std::llabs(b) + 1)) : 0;
      return b + (r == 0 ? k : r == 1 ? -k : 0);  // sum over ranks = p * b
    }
    case ReduceOp::prod: return ((h & 1) ? -1 : 1) * (((h >> 1) % 4 == 0) ? 2 : 1);
    case ReduceOp::min:
    case ReduceOp::max: {
      const int64_t m = std::min<int64_t>(M, 1000);
      return static_cast<int64_t>(h % static_cast<uint64_t>(2 * m + 1)) - m;
    }
  }
  return 0;
}

template <class T>
inline void put_typed(Bytes& b, size_t i, T v) {
  std::memcpy(b.data() + i * sizeof(T), &v, sizeof(T));
}

// Stores the integer V as element I of type T (integers: converted modulo 2^bits; floats: must be exact).
inline void put(Bytes& b, size_t i, DType t, int64_t v) {
  switch (t) {
    case DType::int8: return put_typed(b, i, static_cast<int8_t>(v));
    case DType::uint8: return put_typed(b, i, static_cast<uint8_t>(v));
    case DType::int32: return put_typed(b, i, static_cast<int32_t>(v));
    case DType::uint32: return put_typed(b, i, static_cast<uint32_t>(v));
    case DType::int64: return put_typed(b, i, static_cast<int64_t>(v));
    case DType::uint64: return put_typed(b, i, static_cast<uint64_t>(v));
    default:
      runtime::store_from_double(b.data(), i, t, static_cast<double>(v));
      if (runtime::load_as_double(b.data(), i, t) != static_cast<double>(v))
        throw std::logic_error("test input " + std::to_string(v) + " is not exact in " + dt(t));
  }
}

inline Bytes make_input(DType t, ReduceOp op, int p, int r, size_t count, int salt) {
  Bytes b(count * runtime::dtype_size(t));
  for (size_t i = 0; i < count; ++i) put(b, i, t, value(t, op, p, r, i, salt));
  return b;
}

// The reduction over ranks 0..p-1 in the element type's own arithmetic (modulo 2^bits for integers).
template <class T>
inline T fold_int(const std::vector<int64_t>& xs, ReduceOp op, int p) {
  using U = std::make_unsigned_t<T>;
  T acc = static_cast<T>(xs[0]);
  for (size_t r = 1; r < xs.size(); ++r) {
    const T x = static_cast<T>(xs[r]);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: acc = static_cast<T>(static_cast<U>(static_cast<U>(acc) + static_cast<U>(x))); break;
      case ReduceOp::prod: acc = static_cast<T>(static_cast<U>(static_cast<U>(acc) * static_cast<U>(x))); break;
      case ReduceOp::min: acc = std::min(acc, x); break;
      case ReduceOp::max: acc = std::max(acc, x); break;
    }
  }
  if (op == ReduceOp::avg) acc = static_cast<T>(acc / static_cast<T>(p));  // truncating division
  return acc;
}

inline int64_t fold_exact(const std::vector<int64_t>& xs, ReduceOp op, int p) {
  int64_t acc = xs[0];
  for (size_t r = 1; r < xs.size(); ++r) {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: acc += xs[r]; break;
      case ReduceOp::prod: acc *= xs[r]; break;
      case ReduceOp::min: acc = std::min(acc, xs[r]); break;
      case ReduceOp::max: acc = std::max(acc, xs[r]); break;
    }
  }
  if (op == ReduceOp::avg) {
    if (acc % p != 0) throw std::logic_error("avg test input: sum not divisible by p");
    acc /= p;
  }
  return acc;
}

inline Bytes expected_reduce(DType t, ReduceOp op, int p, size_t count, int salt) {
  Bytes out(count * runtime::dtype_size(t));
  std::vector<int64_t> xs(static_cast<size_t>(p));
  for (size_t i = 0; i < count; ++i) {
    for (int r = 0; r < p; ++r) xs[static_cast<size_t>(r)] = value(t, op, p, r, i, salt);
    switch (t) {
      case DType::int8: put_typed(out, i, fold_int<int8_t>(xs, op, p)); break;
      case DType::uint8: put_typed(out, i, fold_int<uint8_t>(xs, op, p)); break;
      case DType::int32: put_typed(out, i, fold_int<int32_t>(xs, op, p)); break;
      case DType::uint32: put_typed(out, i, fold_int<uint32_t>(xs, op, p)); break;
      case DType::int64: put_typed(out, i, fold_int<int64_t>(xs, op, p)); break;
      case DType::uint64: put_typed(out, i, fold_int<uint64_t>(xs, op, p)); break;
      default: put(out, i, t, fold_exact(xs, op, p));
    }
  }
  return out;
}

// ---- first-principles schedules on a bidirectional ring of p chips (rank r on chip r) ----

// Arrival time at every rank (index = rank) of a binomial-tree broadcast of one S-byte piece from ROOT, all data
// ready at 0. tree.h: in root-relative ranks v, v receives from v - lowbit(v) and sends to v + 2^j for every
// 2^j < lowbit(v), largest subtree first; a parent's sends through the same port queue in that order.
inline std::vector<double> binomial_broadcast_arrivals(int p, int root, double S, double B, double alpha) {
  std::vector<double> at(static_cast<size_t>(p), 0.0);  // root-relative
  int top = 1;
  while (top < p) top *= 2;
  for (int v = 0; v < p; ++v) {  // a parent (v - lowbit v) always comes before its children
    const int low = v == 0 ? top : (v & -v);
    const int me = (v + root) % p;
    std::map<int, double> port_free;
    for (int mask = low / 2; mask >= 1; mask /= 2) {
      const int c = v + mask;
      if (c >= p) continue;
      const int dst = (c + root) % p;
      const double start = std::max(at[static_cast<size_t>(v)], port_free[ring_dir(p, me, dst)]);
      port_free[ring_dir(p, me, dst)] = start + S / B;
      at[static_cast<size_t>(c)] = start + ring_hops(p, me, dst) * alpha + S / B;
    }
  }
  std::vector<double> by_rank(static_cast<size_t>(p));
  for (int v = 0; v < p; ++v) by_rank[static_cast<size_t>((v + root) % p)] = at[static_cast<size_t>(v)];
  return by_rank;
}

// Completion time at every rank of a binomial-tree reduce of one S-byte piece to ROOT, data ready at 0: each
// rank sends once, to its parent, as soon as all its children's data is in (every rank uses its port once, so
// there is no queueing): t(v) = max over children c of t(c) + hops(c, v) alpha + S/B.
inline std::vector<double> binomial_reduce_done(int p, int root, double S, double B, double alpha) {
  std::vector<double> t(static_cast<size_t>(p), 0.0);  // root-relative
  for (int v = p - 1; v >= 1; --v) {                   // children have larger v than their parent
    const int parent = v - (v & -v);
    const int a = (v + root) % p, b = (parent + root) % p;
    t[static_cast<size_t>(parent)] =
        std::max(t[static_cast<size_t>(parent)], t[static_cast<size_t>(v)] + ring_hops(p, a, b) * alpha + S / B);
  }
  std::vector<double> by_rank(static_cast<size_t>(p));
  for (int v = 0; v < p; ++v) by_rank[static_cast<size_t>((v + root) % p)] = t[static_cast<size_t>(v)];
  return by_rank;
}

const double kBws[] = {25.0, 400.0};
const double kAlphas[] = {0.0, 700.0};

// Topologies on which every edge of the binomial tree rooted at rank 0 is one hop and no parent sends two
// messages through one port: a ring of 2 or 3 chips (the root's children are its two neighbours) and the
// hypercube-shaped tori 2x2 and 2x2x2 (edge v -> v + 2^j runs along one dimension). Empty when p has none.
inline std::vector<int> hypercube_dims(int p) {
  if (p == 4) return {2, 2};
  if (p == 8) return {2, 2, 2};
  return {};
}
inline std::optional<Topology> contention_free_tree_topology(double bw, double alpha) {
  const int p = world_size();
  if (p == 2 || p == 3) return ring_topo(bw, alpha);
  if (p == 4 || p == 8) return Topology::torus(hypercube_dims(p), {LinkSpec{bw, alpha}});
  return std::nullopt;
}
inline int popcount(int v) { return __builtin_popcount(static_cast<unsigned>(v)); }

const char* const kFlatAlgorithms[] = {"ring", "bidir_ring", "torus", "halving_doubling", "auto"};

// Element counts per rank for all_gatherv: several uneven patterns with zeros.
inline std::vector<std::vector<size_t>> gatherv_patterns(int p) {
  std::vector<std::vector<size_t>> v;
  std::vector<size_t> a, b(size_t(p), 0), c(size_t(p), 0), d;
  for (int r = 0; r < p; ++r) a.push_back(size_t((r * 5 + 3) % 4));  // 3, 0, 1, 2, 3, 0, ...
  b[size_t(p - 1)] = 37;                                               // everything on the last rank
  for (int r = 0; r < p; ++r) d.push_back(size_t(300 + 17 * r));       // larger, all different
  v = {a, b, c, d};
  if (p >= 2) {
    std::vector<size_t> e(size_t(p), 2);
    e[0] = 0;  // only rank 0 empty
    v.push_back(e);
  }
  return v;
}

}  // namespace algtest
