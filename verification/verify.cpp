#include "verification/verify.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <thread>
#include <vector>

#include "collectives/collectives.h"
#include "common/error.h"
#include "runtime/world.h"

namespace shardsim::verification {

using namespace collectives;  // the collectives this room calibrates / verifies

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Runs FN(lo, hi) over [0, N) in up to four host threads when N is large (filling and checking a case's elements
// is independent per element and is most of validate's host time); one call on this thread otherwise.
template <class Fn>
void in_parallel(size_t n, Fn&& fn) {
  constexpr size_t kMinPerThread = size_t{1} << 13;
  static const size_t cores = std::max(1u, std::thread::hardware_concurrency());  // reads sysfs: once
  const size_t threads = std::min<size_t>({4, cores, n / kMinPerThread});
  if (threads <= 1) return fn(size_t{0}, n);
  std::vector<std::thread> pool;
  const size_t per = (n + threads - 1) / threads;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back([&fn, t, per, n] { fn(std::min(n, t * per), std::min(n, (t + 1) * per)); });
  fn(size_t{0}, std::min(n, per));
  for (auto& th : pool) th.join();
}

// Every small integer a verifiable input can be (|x| <= 1000, verify.h) stored as each dtype: element I is then
// a copy of its encoding (store_from_double per element, with its dtype switch and rounding, was a third of
// validate's time).
constexpr int64_t kSmallLimit = 1000;
const unsigned char* encoded_small(DType t) {
  static const auto tables = [] {
    std::vector<std::vector<unsigned char>> v;
    for (DType d : runtime::all_dtypes()) {
      if (static_cast<size_t>(d) >= v.size()) v.resize(static_cast<size_t>(d) + 1);
      auto& tab = v[static_cast<size_t>(d)];
      tab.resize((2 * kSmallLimit + 1) * runtime::dtype_size(d));
      for (int64_t x = -kSmallLimit; x <= kSmallLimit; ++x)
        runtime::store_from_double(tab.data(), static_cast<size_t>(x + kSmallLimit), d, static_cast<double>(x));
    }
    return v;
  }();
  return tables[static_cast<size_t>(t)].data();
}

// Rank R's input of case C on P ranks (verify.h), with what does not depend on the element index worked out once.
struct Inputs {
  enum class Kind { signed_int, unsigned_int, random, symmetric, stride, prod } kind = Kind::symmetric;
  uint64_t rank_hash = 0;
  uint64_t k = 0;     // symmetric: |x| <= k
  size_t stride = 1;  // stride: +-1 where (r + i) % stride == 0; prod: +-2 there
  size_t r = 0;
  bool zeros = false;  // prod on rank 0: 0 at i % 11 == 5

  Inputs(const Case& c, int p, int rank) : rank_hash(splitmix(c.seed * 0x100000001b3ull + static_cast<uint64_t>(rank))), r(static_cast<size_t>(rank)) {
    const DType t = c.dtype;
    if (runtime::is_integer(t)) {
      kind = (t == DType::int8 || t == DType::int32 || t == DType::int64) ? Kind::signed_int : Kind::unsigned_int;
      return;
    }
    if (c.random_input) {
      kind = Kind::random;
      return;
    }
    const double limit = runtime::exact_integer_limit(t);
    auto symmetric = [&](double bound) { k = static_cast<uint64_t>(std::min(bound, static_cast<double>(kSmallLimit))); };
    if (!is_reduction(c.collective)) {
      symmetric(limit);
      return;
    }
    switch (c.op) {
      case ReduceOp::sum:
      case ReduceOp::avg: {
        const double per = std::floor(limit / p);
        if (per >= 1) {
          symmetric(per);
          return;
        }
        kind = Kind::stride;
        stride = static_cast<size_t>(std::ceil(p / limit));
        return;
      }
      case ReduceOp::prod:
        kind = Kind::prod;
        zeros = rank == 0;
        stride = static_cast<size_t>(std::max(1.0, std::ceil(p / 3.0)));
        return;
      case ReduceOp::min:
      case ReduceOp::max: symmetric(std::min(limit, 100.0)); return;
    }
  }
  uint64_t hash(size_t i) const { return splitmix(rank_hash ^ i); }
  // Element I, every kind but random: an integer in [-kSmallLimit, kSmallLimit].
  int64_t small(size_t i) const {
    const uint64_t h = hash(i);
    switch (kind) {
      case Kind::signed_int: return static_cast<int64_t>(h % 201) - 100;
      case Kind::unsigned_int: return static_cast<int64_t>(h % 200);
      case Kind::symmetric: return static_cast<int64_t>(h % (2 * k + 1)) - static_cast<int64_t>(k);
      case Kind::stride: return (r + i) % stride == 0 ? ((h & 1) ? 1 : -1) : 0;
      case Kind::prod:
        if (zeros && i % 11 == 5) return 0;
        if ((r + i) % stride == 0) return (h & 2) ? 2 : -2;
        return (h & 1) ? 1 : -1;
      case Kind::random: break;
    }
    return 0;
  }
  double value(size_t i) const {
    return kind == Kind::random ? static_cast<double>(hash(i) >> 11) * 0x1p-52 - 1.0 : static_cast<double>(small(i));
  }
  // Elements [FIRST, FIRST + N) stored as T at DST.
  void store(unsigned char* dst, size_t first, size_t n, DType t) const {
    if (kind == Kind::random) {
      for (size_t k = 0; k < n; ++k) runtime::store_from_double(dst, k, t, value(first + k));
      return;
    }
    const unsigned char* tab = encoded_small(t) + kSmallLimit * runtime::dtype_size(t);
    switch (runtime::dtype_size(t)) {
      case 1: return copy_small<uint8_t>(dst, first, n, tab);
      case 2: return copy_small<uint16_t>(dst, first, n, tab);
      case 4: return copy_small<uint32_t>(dst, first, n, tab);
      default: return copy_small<uint64_t>(dst, first, n, tab);
    }
  }
  template <class W>
  void copy_small(unsigned char* dst, size_t first, size_t n, const unsigned char* zero) const {
    for (size_t k = 0; k < n; ++k) std::memcpy(dst + k * sizeof(W), zero + small(first + k) * static_cast<int64_t>(sizeof(W)), sizeof(W));
  }
};

}  // namespace

double busbw_factor(Collective c, int n) {
  const double d = n;
  switch (c) {
    case Collective::all_reduce: return n > 0 ? 2.0 * (d - 1) / d : 0;
    case Collective::reduce_scatter:
    case Collective::all_gather:
    case Collective::all_gatherv:
    case Collective::all_to_all:
    case Collective::all_to_allv:
    case Collective::gather:
    case Collective::scatter: return n > 0 ? (d - 1) / d : 0;
    default: return 1.0;
  }
}

double host_bytes_needed(const Case& c, int ranks) {
  const double S = static_cast<double>(c.count) * static_cast<double>(runtime::dtype_size(c.dtype));
  const double p = std::max(ranks, 1);
  // send + receive buffers, scratch (reduce_scatter/reduce keep a full-size work copy plus receive space of a
  // chunk; trees keep a copy per child), and the check's reference blocks (a few MiB).
  double scratch = S;
  if (c.collective == Collective::reduce || c.collective == Collective::broadcast) scratch = S * (1 + std::log2(p));
  return 2 * S + scratch + S / p + 64.0 * (1 << 20);
}

std::vector<size_t> default_validate_counts() {
  return {0, 1, 2, 7, 31, 256, 1000, 1031, 4099, 65537};
}

struct CaseRunner::Impl {
  runtime::Transport& tp;
  Case c;
  int p, me;
  size_t es;
  size_t n = 0;                       // nccl-tests count (rounded for block-structured collectives)
  Layout layout;                      // all_gather(v), reduce_scatter: rank chunks
  size_t block = 0;                   // all_to_all, gather, scatter
  std::vector<size_t> scount, sdispl, rcount, rdispl;  // all_to_allv
  std::vector<unsigned char> a, b;    // storage
  unsigned char* send = nullptr;
  unsigned char* recv = nullptr;
  size_t send_n = 0, recv_n = 0;

  // Storage of BYTES in V (shape-only cases keep none: their buffer pointers stay null, runtime/transport.h).
  void grow(std::vector<unsigned char>& v, size_t bytes) const {
    if (!c.shape_only) v.resize(bytes);
  }

  // Buffers for a collective whose one side (OUTER_N elements) contains the other (INNER_N elements at element
  // INNER_AT) when in place: e.g. reduce_scatter's output inside its input. INNER_IS_SEND: the contained side
  // is the send buffer (all_gather) rather than the receive buffer (reduce_scatter).
  void embed(size_t outer_n, size_t inner_n, size_t inner_at, bool inner_is_send) {
    unsigned char*& outer = inner_is_send ? recv : send;
    unsigned char*& inner = inner_is_send ? send : recv;
    grow(a, outer_n * es);
    outer = a.data();
    if (c.in_place) {
      inner = outer + inner_at * es;
    } else {
      grow(b, inner_n * es);
      inner = b.data();
    }
    (inner_is_send ? recv_n : send_n) = outer_n;
    (inner_is_send ? send_n : recv_n) = inner_n;
  }

  Impl(runtime::Transport& t, const Case& cs)
      : tp(t), c(cs), p(t.size()), me(t.rank()), es(runtime::dtype_size(cs.dtype)) {
    const size_t P = static_cast<size_t>(p), M = static_cast<size_t>(me);
    n = c.count;
    const bool rooted = is_rooted(c.collective);
    if (rooted && (c.root < 0 || c.root >= p)) check_root(tp, c.root, collective_name(c.collective));
    const size_t R = static_cast<size_t>(std::max(0, c.root));
    switch (c.collective) {
      case Collective::all_reduce:
      case Collective::broadcast:
      case Collective::reduce: embed(n, n, 0, false); break;
      case Collective::reduce_scatter:
        layout = Layout::from(Partition{n, P});
        embed(n, layout.size[M], layout.offset[M], false);
        break;
      case Collective::all_gather:
      case Collective::all_gatherv: {
        if (c.collective == Collective::all_gather) {
          layout = Layout::from(Partition{n, P});
        } else {
          std::vector<size_t> counts(P);
          size_t used = 0;
          const size_t weights = P * (P + 1) / 2;
          for (size_t r = 0; r + 1 < P; ++r) used += counts[r] = n * (r + 1) / weights;
          counts[P - 1] = n - used;
          layout = Layout::from_counts(counts);
        }
        embed(n, layout.size[M], layout.offset[M], true);
        break;
      }
      case Collective::all_to_all:
        block = n / P;
        n = block * P;
        embed(n, n, 0, false);
        break;
      case Collective::all_to_allv: {
        block = n / P;
        scount.resize(P);
        sdispl.resize(P);
        rcount.resize(P);
        rdispl.resize(P);
        size_t so = 0, ro = 0;
        for (size_t j = 0; j < P; ++j) {
          scount[j] = pair_count(M, j);
          sdispl[j] = so;
          so += scount[j];
          rcount[j] = pair_count(j, M);
          rdispl[j] = ro;
          ro += rcount[j];
        }
        grow(a, so * es);
        grow(b, ro * es);
        send = a.data();
        recv = b.data();
        send_n = so;
        recv_n = ro;
        break;
      }
      case Collective::gather:
      case Collective::scatter: {
        block = n / P;
        n = block * P;
        const bool g = c.collective == Collective::gather;
        // The root's big buffer (p blocks) and everyone's block.
        grow(a, (me == c.root ? n : 0) * es);
        unsigned char* big = a.data();
        unsigned char* root_block = big + R * block * es;
        if (c.in_place && me == c.root) {
          (g ? send : recv) = root_block;
        } else {
          grow(b, block * es);
          (g ? send : recv) = b.data();
        }
        (g ? recv : send) = big;
        send_n = g ? block : (me == c.root ? n : 0);
        recv_n = g ? (me == c.root ? n : 0) : block;
        break;
      }
      case Collective::send_recv:
        grow(a, n * es);
        grow(b, n * es);
        send = a.data();
        recv = b.data();
        send_n = recv_n = n;
        break;
      case Collective::barrier:
        break;
    }
  }

  // all_to_allv: elements rank SRC sends to rank DST (zero for some pairs).
  size_t pair_count(size_t src, size_t dst) const {
    return block * ((src + 2 * dst) % 3) / 2 + ((src + dst) % 5 == 0 ? 1 : 0);
  }

  // Input value of rank R's element with global index I (one element; fill() for many).
  double value(int r, size_t i) const { return Inputs(c, p, r).value(i); }

  // Special-value patterns (verify.h). Returns false where rank R's element I is the verifiable value.
  bool put_special(unsigned char* dst, size_t k, int r, size_t i) const {
    const DType t = c.dtype;
    size_t kind = i % 8;
    if (kind == 0) return false;
    const size_t s = i / 8;
    const int j = static_cast<int>(s % static_cast<size_t>(p)), j1 = (j + 1) % p;
    const bool reduction = is_reduction(c.collective);
    // Which rank holds this pattern's first / second special value (data movement: every rank).
    const bool first = !reduction || r == j, second = !reduction || (p > 1 && r == j1 && !first);
    if (runtime::is_integer(t)) {
      if (kind > 3) return false;
      const bool hi = (kind == 1 || kind == 3) && first, lo = (kind == 2 && first) || (kind == 3 && second);
      if (!hi && !lo) return false;
      put_int_extreme(dst, k, hi);
      return true;
    }
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    const double mx = runtime::max_finite(t), eta = runtime::min_subnormal(t);
    if (!runtime::has_infinity(t)) {
      if (kind == 2 || kind == 3) kind = 6;
      if (kind == 7) kind = 1;
    }
    auto store = [&](double v) {
      runtime::store_from_double(dst, k, t, v);
      return true;
    };
    switch (kind) {
      case 1: return first ? store(s % 2 ? -nan : nan) : false;
      case 2: return first ? store(inf) : false;
      case 3: return first ? store(-inf) : second ? store(inf) : false;
      case 4: return (s % 2 == 0 || first) ? store(-0.0) : store(0.0);
      case 5:
        if (!reduction) return store((1 + static_cast<double>(s % 7)) * eta * (s % 2 ? -1 : 1));
        if (c.op == ReduceOp::prod) {
          if (!first) return false;  // the others' +-1, +-2, 0
          const double largest_sub = runtime::exact_integer_limit(t) / 2 - 1;  // 2^mant - 1
          return store(largest_sub * eta * (s % 2 ? -1 : 1));
        }
        return store(value(r, i) * eta);  // |partial sums| <= M: multiples of eta below 2^(emin+1), exact
      case 6:
        if (!reduction) return store(s % 2 ? -mx : mx);
        switch (c.op) {
          case ReduceOp::sum:
          case ReduceOp::avg: return store(s % 2 ? -mx : mx);
          case ReduceOp::prod: return store(first ? -mx : mx);
          default: return first ? store(mx) : second ? store(-mx) : false;
        }
      case 7: return first ? store(nan) : second ? store(inf) : false;
    }
    return false;
  }

  // The largest (HI) or smallest value of the integer type, written directly (64-bit extremes are not doubles).
  void put_int_extreme(unsigned char* dst, size_t k, bool hi) const {
    auto w = [&](auto v) { std::memcpy(dst + k * es, &v, sizeof v); };
    switch (c.dtype) {
      case DType::int8: return w(hi ? std::numeric_limits<int8_t>::max() : std::numeric_limits<int8_t>::min());
      case DType::uint8: return w(hi ? std::numeric_limits<uint8_t>::max() : uint8_t{0});
      case DType::int32: return w(hi ? std::numeric_limits<int32_t>::max() : std::numeric_limits<int32_t>::min());
      case DType::uint32: return w(hi ? std::numeric_limits<uint32_t>::max() : uint32_t{0});
      case DType::int64: return w(hi ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min());
      case DType::uint64: return w(hi ? std::numeric_limits<uint64_t>::max() : uint64_t{0});
      default: return;
    }
  }

  // Rank R's elements [FIRST_INDEX, FIRST_INDEX + COUNT) at DST: its verifiable or random input, and in special
  // mode the special values over it.
  void fill(unsigned char* dst, int r, size_t first_index, size_t count) const {
    const Inputs in(c, p, r);
    in_parallel(count, [&](size_t lo, size_t hi) {
      in.store(dst + lo * es, first_index + lo, hi - lo, c.dtype);
      if (c.special_input)
        for (size_t k = lo; k < hi; ++k) put_special(dst, k, r, first_index + k);
    });
  }

  // A block of a reduced reference: what it was computed for, and the result.
  struct ReferenceKey {
    int collective = -1, dtype = -1, op = -1;
    uint64_t seed = 0;
    bool random = false, special = false;
    int p = 0;
    size_t count = 0, first = 0, n = 0;
    bool operator==(const ReferenceKey&) const = default;
  };
  struct ReferenceBlock {
    ReferenceKey key;
    std::vector<unsigned char> want;
    std::vector<double> scale;
  };

  // The inputs the chips of this process filled in prepare(), kept for the references of check(), which need
  // other ranks' inputs too: with K chips per process, K ranks' inputs are copied instead of generated again.
  // Only fills of up to 1 MiB are kept (validate's cases; bench's big buffers are not copied): memory stays
  // within host_bytes_needed's allowance for the check.
  struct FilledBlock {
    int rank = 0;
    size_t first = 0;
    std::vector<unsigned char> bytes;
  };
  struct Filled {
    ReferenceKey key;  // the case (first = n = 0)
    std::vector<FilledBlock> blocks;
  };
  static Filled& filled() {
    thread_local Filled f;
    return f;
  }
  ReferenceKey case_key(size_t first = 0, size_t count = 0) const {
    return {static_cast<int>(c.collective), static_cast<int>(c.dtype), static_cast<int>(c.op), c.seed,
            c.random_input, c.special_input, p, c.count, first, count};
  }
  // fill() of this rank's elements, recorded for fill_from().
  void fill_own(unsigned char* dst, size_t first_index, size_t count) const {
    fill(dst, me, first_index, count);
    if (count * es > (size_t{1} << 20)) return;
    Filled& f = filled();
    if (!(f.key == case_key())) f = {case_key(), {}};
    f.blocks.push_back({me, first_index, std::vector<unsigned char>(dst, dst + count * es)});
  }
  // fill(), copied from what a chip of this process recorded if it covers the range.
  void fill_from(unsigned char* dst, int r, size_t first_index, size_t count) const {
    const Filled& f = filled();
    if (f.key == case_key())
      for (const FilledBlock& b : f.blocks)
        if (b.rank == r && b.first <= first_index && first_index + count <= b.first + b.bytes.size() / es) {
          if (count) std::memcpy(dst, b.bytes.data() + (first_index - b.first) * es, count * es);
          return;
        }
    fill(dst, r, first_index, count);
  }

  void prepare() {
    if (c.shape_only) return;  // no storage, nothing to fill
    const size_t P = static_cast<size_t>(p), M = static_cast<size_t>(me);
    switch (c.collective) {
      case Collective::all_reduce:
      case Collective::reduce:
      case Collective::reduce_scatter:
      case Collective::all_to_all:
      case Collective::send_recv: fill_own(send, 0, send_n); break;
      case Collective::broadcast:
        // Poison what must be overwritten: the receive buffer, and on non-roots the (unused) send buffer too.
        if (me != c.root) std::fill(a.begin(), a.end(), 0xEE);
        std::fill(b.begin(), b.end(), 0xEE);
        if (me == c.root) fill_own(send, 0, n);
        break;
      case Collective::all_gather:
      case Collective::all_gatherv:
        if (!c.in_place) std::fill(recv, recv + recv_n * es, 0xEE);  // poison: must be overwritten
        fill_own(send, layout.offset[M], layout.size[M]);
        break;
      case Collective::all_to_allv:
        for (size_t j = 0; j < P; ++j) fill_own(send + sdispl[j] * es, sdispl[j], scount[j]);
        std::fill(b.begin(), b.end(), 0xEE);
        break;
      case Collective::gather: fill_own(send, M * block, block); break;
      case Collective::scatter:
        if (me == c.root) fill_own(send, 0, n);
        break;
      case Collective::barrier: break;
    }
  }

  CollectiveResult execute(sim::TimeNs ready) {
    // The case's mode on the transport for this call (shared by its family: restored afterwards).
    struct Mode {
      runtime::Transport& tp;
      bool saved;
      Mode(runtime::Transport& t, bool on) : tp(t), saved(t.shape_only()) { tp.set_shape_only(on); }
      ~Mode() { tp.set_shape_only(saved); }
    } mode(tp, c.shape_only);
    CollectiveOptions o;
    o.algorithm = c.algorithm;
    o.chunk_bytes = c.chunk_bytes;
    o.root = c.root;
    if (c.inject_count_mismatch && me == 0 && c.collective == Collective::all_reduce && n > 0)
      return all_reduce(tp, send, recv, n - 1, c.dtype, c.op, ready, o);
    switch (c.collective) {
      case Collective::all_reduce: return all_reduce(tp, send, recv, n, c.dtype, c.op, ready, o);
      case Collective::reduce_scatter: return reduce_scatter(tp, send, recv, n, c.dtype, c.op, ready, o);
      case Collective::all_gather: return all_gather(tp, send, recv, n, c.dtype, ready, o);
      case Collective::all_gatherv: return all_gatherv(tp, send, recv, layout.size, c.dtype, ready, o);
      case Collective::broadcast: return broadcast(tp, send, recv, n, c.dtype, ready, o);
      case Collective::reduce: return reduce(tp, send, recv, n, c.dtype, c.op, ready, o);
      case Collective::all_to_all: return all_to_all(tp, send, recv, n, c.dtype, ready, o);
      case Collective::all_to_allv:
        return all_to_allv(tp, send, scount, sdispl, recv, rcount, rdispl, c.dtype, ready, o);
      case Collective::gather: return gather(tp, send, recv, block, c.dtype, ready, o);
      case Collective::scatter: return scatter(tp, send, recv, block, c.dtype, ready, o);
      case Collective::send_recv: {
        if (p == 1) return {{ready, ready}, 0, "direct", ""};
        const int next = (me + 1) % p, prev = (me + p - 1) % p;
        if (me % 2 == 0) {
          send_op(next, ready);
          return recv_op(prev, ready);
        }
        auto r = recv_op(prev, ready);
        send_op(next, ready);
        return r;
      }
      case Collective::barrier: return barrier(tp, ready, o);
    }
    return {};
  }
  void send_op(int peer, sim::TimeNs ready) { collectives::send(tp, send, n, c.dtype, peer, ready); }
  CollectiveResult recv_op(int peer, sim::TimeNs ready) { return collectives::recv(tp, recv, n, c.dtype, peer, ready); }

  // How many output elements this rank checks, and whether they are reductions over every rank.
  size_t output_count() const {
    switch (c.collective) {
      case Collective::reduce:
      case Collective::gather: return me == c.root ? recv_n : 0;
      case Collective::send_recv: return p > 1 ? recv_n : 0;
      case Collective::barrier: return 0;
      default: return recv_n;
    }
  }
  bool is_reduce_output() const { return is_reduction(c.collective); }
  // Reductions: output element K is the reduction of every rank's input element first_input() + K.
  size_t first_input() const {
    return c.collective == Collective::reduce_scatter ? layout.offset[static_cast<size_t>(me)] : 0;
  }
  // Data movement: the output as runs of inputs. FN(AT, R, FIRST, N) for each: output elements [AT, AT + N) are
  // rank R's input elements [FIRST, FIRST + N).
  template <class Fn>
  void for_each_source_run(Fn&& fn) const {
    const size_t P = static_cast<size_t>(p), M = static_cast<size_t>(me);
    switch (c.collective) {
      case Collective::broadcast: return fn(0, c.root, 0, recv_n);
      case Collective::all_gather:
      case Collective::all_gatherv:
        for (size_t r = 0; r < P; ++r) fn(layout.offset[r], static_cast<int>(r), layout.offset[r], layout.size[r]);
        return;
      case Collective::all_to_all:
        for (size_t s = 0; s < P; ++s) fn(s * block, static_cast<int>(s), M * block, block);
        return;
      case Collective::all_to_allv:
        for (size_t s = 0; s < P; ++s) {
          size_t sd = 0;  // where rank s's block for me starts in s's send buffer
          for (size_t j = 0; j < M; ++j) sd += pair_count(s, j);
          fn(rdispl[s], static_cast<int>(s), sd, rcount[s]);
        }
        return;
      case Collective::gather:
        for (size_t s = 0; s < P; ++s) fn(s * block, static_cast<int>(s), s * block, block);
        return;
      case Collective::scatter: return fn(0, c.root, M * block, block);
      case Collective::send_recv: return fn(0, (me + p - 1) % p, 0, recv_n);
      default: return;
    }
  }

  // The reduction over every rank of input elements [FIRST, FIRST + N), and with TOLERANT the sums of their
  // magnitudes (the tolerance of rounded random sums). Shared by the chips of one process that check the same
  // elements (every chip of an all_reduce): computed once, not once per chip (p fills of the block each time).
  const ReferenceBlock& reduced_reference(size_t first, size_t n_blk, bool tolerant) const {
    thread_local ReferenceBlock cached;
    thread_local std::vector<unsigned char> tmp;
    const ReferenceKey key = case_key(first, n_blk);
    if (cached.key == key) return cached;
    cached.key = {};  // invalid until complete
    cached.want.resize(n_blk * es);
    tmp.resize(n_blk * es);
    cached.scale.assign(tolerant ? n_blk : 0, 0.0);
    for (int r = 0; r < p; ++r) {
      unsigned char* dst = r == 0 ? cached.want.data() : tmp.data();
      fill_from(dst, r, first, n_blk);
      if (tolerant)
        for (size_t k = 0; k < n_blk; ++k) cached.scale[k] += std::fabs(runtime::load_as_double(dst, k, c.dtype));
      if (r > 0) reduce_into(cached.want.data(), tmp.data(), n_blk, c.dtype, c.op);
    }
    if (c.op == ReduceOp::avg) finish_avg(cached.want.data(), n_blk, c.dtype, static_cast<size_t>(p));
    cached.key = key;
    return cached;
  }

  // Compares the output block by block (bounded memory: the reference is rebuilt per block of 1 Mi elements).
  Outcome check() const {
    Outcome o;
    if (c.shape_only) return o;  // nothing to check: checked = 0
    const size_t total = output_count();
    const double u = runtime::unit_roundoff(c.dtype);
    // Smallest positive subnormal of the type (the encoding 0...01): products that underflow lose this much.
    unsigned char tiny[8] = {1, 0, 0, 0, 0, 0, 0, 0};
    const double eta = runtime::is_floating(c.dtype) ? runtime::load_as_double(tiny, 0, c.dtype) : 0.0;
    constexpr size_t kBlock = size_t{1} << 20;
    std::vector<unsigned char> moved;  // data movement: the expected block
    // Rounded results are compared within a tolerance (random inputs, floating types, reductions); every other
    // case is exact: equal bytes, or both NaN.
    const bool tolerant = c.random_input && is_reduce_output() && runtime::is_floating(c.dtype);
    for (size_t k0 = 0; k0 < total; k0 += kBlock) {
      const size_t n_blk = std::min(kBlock, total - k0);
      const unsigned char* want = nullptr;
      const double* scale = nullptr;
      if (is_reduce_output()) {
        const ReferenceBlock& ref = reduced_reference(first_input() + k0, n_blk, tolerant);
        want = ref.want.data();
        scale = ref.scale.data();
      } else {
        moved.resize(n_blk * es);
        for_each_source_run([&](size_t at, int r, size_t first, size_t len) {
          const size_t lo = std::max(at, k0), hi = std::min(at + len, k0 + n_blk);
          if (lo < hi) fill_from(moved.data() + (lo - k0) * es, r, first + (lo - at), hi - lo);
        });
        want = moved.data();
      }
      const unsigned char* got = recv + k0 * es;
      if (std::memcmp(got, want, n_blk * es) == 0) {  // the whole block is right: nothing to look at
        o.checked += n_blk;
        continue;
      }
      for (size_t k = 0; k < n_blk; ++k) {
        ++o.checked;
        if (std::memcmp(got + k * es, want + k * es, es) == 0) continue;
        bool ok = false;
        const double g = runtime::load_as_double(got, k, c.dtype), w = runtime::load_as_double(want, k, c.dtype);
        if (is_reduce_output() && std::isnan(g) && std::isnan(w)) ok = true;  // any NaN matches any NaN
        if (!ok && tolerant && std::isfinite(g)) {
          double tol = 0;
          switch (c.op) {
            case ReduceOp::sum: tol = 2 * (p - 1) * u * scale[k]; break;
            case ReduceOp::avg: tol = 2 * (p - 1) * u * scale[k] / p + 2 * u * std::fabs(w); break;
            case ReduceOp::prod: tol = 2 * p * (u * std::fabs(w) + eta); break;
            default: tol = 0;  // min/max are exact
          }
          const double err = std::fabs(g - w);
          o.max_error = std::max(o.max_error, err);
          ok = err <= tol;
        }
        if (!ok) {
          if (o.wrong == 0) {
            std::ostringstream os;
            os.precision(9);
            os << "chip " << tp.chip() << " element " << k0 + k << ": got " << g << " want " << w;
            o.first_wrong = os.str();
          }
          ++o.wrong;
        }
      }
    }
    return o;
  }
};

CaseRunner::CaseRunner(runtime::Transport& tp, const Case& c) : impl_(new Impl(tp, c)) {}
CaseRunner::~CaseRunner() { delete impl_; }
void CaseRunner::prepare() { impl_->prepare(); }
CollectiveResult CaseRunner::execute(sim::TimeNs ready) { return impl_->execute(ready); }
Outcome CaseRunner::check_local() const { return impl_->check(); }
void* CaseRunner::send_buffer() { return impl_->send; }
void* CaseRunner::recv_buffer() { return impl_->recv; }
size_t CaseRunner::send_count() const { return impl_->send_n; }
size_t CaseRunner::recv_count() const { return impl_->recv_n; }

Outcome run_case(runtime::Transport& tp, const Case& c) {
  if (c.special_input && c.random_input) throw UsageError("special-value input is verifiable, not random");
  CaseRunner runner(tp, c);
  runner.prepare();
  tp.timeline().reset();
  const CollectiveResult r = runner.execute(0.0);
  if (c.inject_wrong_result && tp.rank() == 0 && runner.recv_count() > 0)
    static_cast<unsigned char*>(runner.recv_buffer())[0] ^= 0x10;
  Outcome local = runner.check_local();
  // Aggregate over the group in two reductions: counts summed; times, errors and (negated) the lowest rank
  // with a wrong element maxed. The first wrong element's text is fetched only when there is one.
  unsigned long long fnv = 1469598103934665603ull;
  {
    const auto* p = static_cast<const unsigned char*>(runner.recv_buffer());
    const size_t n = p && !c.shape_only ? runner.recv_count() * runtime::dtype_size(c.dtype) : 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {  // a word per step (a byte per step was 5% of validate's time)
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      fnv = (fnv ^ w) * 1099511628211ull;
      fnv ^= fnv >> 29;  // the high bits of W reach the low bits of the state
    }
    for (; i < n; ++i) fnv = (fnv ^ p[i]) * 1099511628211ull;
  }
  const unsigned long long digest = fnv * (2ull * static_cast<unsigned long long>(tp.rank()) + 1);
  unsigned long long counts[3] = {local.checked, local.wrong, digest}, sums[3] = {0, 0, 0};
  double maxes[4] = {r.span.end, r.bytes_sent, local.max_error, local.wrong ? -double(tp.rank()) : -1e300};
  double out[4] = {0, 0, 0, 0};
  if (tp.chip_mode()) {  // the chip router; with one chip per rank plain MPI_Allreduce as before
    std::copy(counts, counts + 3, sums);
    std::copy(maxes, maxes + 4, out);
    tp.allreduce(std::span<unsigned long long>(sums, 3), runtime::Reduce::sum, "validate");
    tp.allreduce(std::span<double>(out, 4), runtime::Reduce::max, "validate");
  } else {
    const MPI_Comm comm = tp.comm();
    runtime::check_mpi(MPI_Allreduce(counts, sums, 3, MPI_UNSIGNED_LONG_LONG, MPI_SUM, comm), tp.chip(), "validate");
    runtime::check_mpi(MPI_Allreduce(maxes, out, 4, MPI_DOUBLE, MPI_MAX, comm), tp.chip(), "validate");
  }
  Outcome o;
  o.checked = sums[0];
  o.wrong = sums[1];
  o.digest = sums[2];
  o.sim_time_ns = out[0];
  o.bytes_sent = out[1];
  o.max_error = out[2];
  if (o.wrong) o.first_wrong = tp.broadcast(local.first_wrong, static_cast<int>(-out[3]), "validate");
  o.explanation = r.explanation;  // this rank's view (identical on every rank: estimates use global data)
  o.algorithm = r.algorithm;
  o.bytes = static_cast<double>(c.count * runtime::dtype_size(c.dtype));
  return o;
}

}  // namespace shardsim::verification
