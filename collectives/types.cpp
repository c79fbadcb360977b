#include "collectives/types.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <type_traits>

namespace shardsim::collectives {

std::string reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::prod: return "prod";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::avg: return "avg";
  }
  return "?";
}

const std::vector<ReduceOp>& all_reduce_ops() {
  static const std::vector<ReduceOp> v = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max,
                                          ReduceOp::avg};
  return v;
}

ReduceOp parse_reduce_op(const std::string& name) {
  for (auto op : all_reduce_ops())
    if (reduce_op_name(op) == name) return op;
  throw std::invalid_argument("unknown reduction op '" + name + "' (known: sum, prod, min, max, avg)");
}

namespace {

// max/min of floating types as IEEE 754-2019 maximum/minimum (sec. 9.6): NaN if either operand is NaN, and
// -0 < +0. std::max/std::min return their first argument when the comparison is false, so they drop a NaN in
// the second position and pick a zero's sign by argument order: an algorithm that folds in another order would
// then give another answer (issue 14: halving_doubling's non-power-of-two fold lost NaN this way).
template <class T>
inline T max_ieee(T a, T b) {
  if (a != a) return a + b;  // NaN (quiet); a + b keeps a NaN operand's payload
  if (b != b) return b + a;
  if (a == b) return std::signbit(a) ? b : a;  // equal, or +-0: +0 wins
  return a > b ? a : b;
}
template <class T>
inline T min_ieee(T a, T b) {
  if (a != a) return a + b;
  if (b != b) return b + a;
  if (a == b) return std::signbit(a) ? a : b;  // -0 wins
  return a < b ? a : b;
}

template <class T>
inline T apply(T a, T b, ReduceOp op) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;  // sum/prod wrap modulo 2^bits, like NCCL's integer kernels
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
      case ReduceOp::prod: return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      case ReduceOp::min: return std::min(a, b);
      case ReduceOp::max: return std::max(a, b);
    }
  } else {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: return a + b;
      case ReduceOp::prod: return a * b;
      case ReduceOp::min: return min_ieee(a, b);
      case ReduceOp::max: return max_ieee(a, b);
    }
  }
  return a;
}

// OUT[i] = A[i] op B[i]; OUT may alias A (the two-operand form) but not B partially.
template <class T>
void reduce_native(void* out, const void* a_, const void* b_, size_t n, ReduceOp op) {
  auto* o = static_cast<T*>(out);
  const auto* a = static_cast<const T*>(a_);
  const auto* b = static_cast<const T*>(b_);
  switch (op) {  // one loop per op so the compiler vectorises it
    case ReduceOp::sum:
    case ReduceOp::avg:
      for (size_t i = 0; i < n; ++i) o[i] = apply(a[i], b[i], ReduceOp::sum);
      break;
    case ReduceOp::prod:
      for (size_t i = 0; i < n; ++i) o[i] = apply(a[i], b[i], ReduceOp::prod);
      break;
    case ReduceOp::min:
      for (size_t i = 0; i < n; ++i) o[i] = apply(a[i], b[i], ReduceOp::min);
      break;
    case ReduceOp::max:
      for (size_t i = 0; i < n; ++i) o[i] = apply(a[i], b[i], ReduceOp::max);
      break;
  }
}

template <class S, float (*Dec)(S), S (*Enc)(float)>
void reduce_narrow(void* out, const void* a_, const void* b_, size_t n, ReduceOp op) {
  auto* o = static_cast<S*>(out);
  const auto* a = static_cast<const S*>(a_);
  const auto* b = static_cast<const S*>(b_);
  for (size_t i = 0; i < n; ++i) o[i] = Enc(apply(Dec(a[i]), Dec(b[i]), op));
}

template <class T>
void divide_native(void* buf, size_t n, size_t ranks) {
  auto* a = static_cast<T*>(buf);
  if constexpr (std::is_integral_v<T>) {
    // Divide in a 64-bit type: the rank count need not fit in T (int8 over 200 ranks).
    using W = std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>;
    const W d = static_cast<W>(ranks);
    for (size_t i = 0; i < n; ++i) a[i] = static_cast<T>(static_cast<W>(a[i]) / d);
  } else {
    const double d = static_cast<double>(ranks);
    for (size_t i = 0; i < n; ++i) a[i] = static_cast<T>(static_cast<double>(a[i]) / d);
  }
}

}  // namespace

void reduce_to(void* out, const void* a, const void* b, size_t n, DType t, ReduceOp op) {
  using namespace runtime;
  switch (t) {
    case DType::int8: return reduce_native<int8_t>(out, a, b, n, op);
    case DType::uint8: return reduce_native<uint8_t>(out, a, b, n, op);
    case DType::int32: return reduce_native<int32_t>(out, a, b, n, op);
    case DType::uint32: return reduce_native<uint32_t>(out, a, b, n, op);
    case DType::int64: return reduce_native<int64_t>(out, a, b, n, op);
    case DType::uint64: return reduce_native<uint64_t>(out, a, b, n, op);
    case DType::fp32: return reduce_native<float>(out, a, b, n, op);
    case DType::fp64: return reduce_native<double>(out, a, b, n, op);
    case DType::bf16: return reduce_narrow<uint16_t, bf16_to_float, float_to_bf16>(out, a, b, n, op);
    case DType::fp16: return reduce_narrow<uint16_t, fp16_to_float, float_to_fp16>(out, a, b, n, op);
    case DType::fp8_e4m3: return reduce_narrow<uint8_t, e4m3_to_float, float_to_e4m3>(out, a, b, n, op);
    case DType::fp8_e5m2: return reduce_narrow<uint8_t, e5m2_to_float, float_to_e5m2>(out, a, b, n, op);
  }
}

void reduce_into(void* acc, const void* in, size_t n, DType t, ReduceOp op) { reduce_to(acc, acc, in, n, t, op); }

void finish_avg(void* buf, size_t n, DType t, size_t ranks) {
  using namespace runtime;
  switch (t) {
    case DType::int8: return divide_native<int8_t>(buf, n, ranks);
    case DType::uint8: return divide_native<uint8_t>(buf, n, ranks);
    case DType::int32: return divide_native<int32_t>(buf, n, ranks);
    case DType::uint32: return divide_native<uint32_t>(buf, n, ranks);
    case DType::int64: return divide_native<int64_t>(buf, n, ranks);
    case DType::uint64: return divide_native<uint64_t>(buf, n, ranks);
    case DType::fp32: return divide_native<float>(buf, n, ranks);
    case DType::fp64: return divide_native<double>(buf, n, ranks);
    default:
      for (size_t i = 0; i < n; ++i)
        store_from_double(buf, i, t, static_cast<double>(load_as_float(buf, i, t)) / static_cast<double>(ranks));
  }
}

}  // namespace shardsim::collectives

namespace shardsim::collectives {

Layout Layout::from(const Partition& p) {
  Layout l;
  l.offset.reserve(p.parts);  // one allocation per vector (this is on every collective call's path)
  l.size.reserve(p.parts);
  for (size_t i = 0; i < p.parts; ++i) {
    l.offset.push_back(p.offset(i));
    l.size.push_back(p.size(i));
  }
  return l;
}

Layout Layout::from_counts(const std::vector<size_t>& counts) {
  Layout l;
  l.offset.reserve(counts.size());
  l.size.reserve(counts.size());
  size_t off = 0;
  for (size_t c : counts) {
    l.offset.push_back(off);
    l.size.push_back(c);
    off += c;
  }
  return l;
}

size_t Layout::max_size() const { return size.empty() ? 0 : *std::max_element(size.begin(), size.end()); }
size_t Layout::total() const {
  size_t t = 0;
  for (size_t s : size) t += s;
  return t;
}

}  // namespace shardsim::collectives
