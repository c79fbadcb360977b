#include "checkpoint/checksum.h"

#include <cstring>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace shardsim::checkpoint {

using runtime::DType;
using runtime::Shape;
using runtime::Tensor;

namespace detail {

namespace {
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

inline uint64_t fmix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}
}  // namespace

const char* const kChecksumDefinition =
    "sum mod 2^64 over elements i of fmix64(bits_i xor (i * 0x9E3779B97F4A7C15)); i = row-major index in the "
    "global tensor, bits_i = the element's stored bytes as a little-endian unsigned integer, fmix64 = "
    "MurmurHash3 64-bit finalizer";

// checksum_block over raw memory: BLOCK_SHAPE elements of DT at P.
uint64_t checksum_raw(const void* data, DType dt, const Shape& block_shape, const Shape& off, const Shape& g) {
  const int64_t n = runtime::shape_numel(block_shape);
  if (n == 0) return 0;
  const size_t esz = runtime::dtype_size(dt);
  const auto* p = static_cast<const unsigned char*>(data);
  const size_t r = g.size();
  if (r == 0) {
    uint64_t bits = 0;
    std::memcpy(&bits, p, esz);
    return fmix64(bits);
  }
  std::vector<uint64_t> gstride(r, 1);
  for (size_t d = r - 1; d > 0; --d) gstride[d - 1] = gstride[d] * static_cast<uint64_t>(g[d]);
  const int64_t inner = block_shape[r - 1];
  const int64_t rows = n / inner;
  std::vector<int64_t> idx(r, 0);  // local index of the current row (dims 0..r-2)
  uint64_t sum = 0;
  auto run = [&](auto tag) {
    using U = decltype(tag);
    for (int64_t row = 0; row < rows; ++row) {
      uint64_t base = static_cast<uint64_t>(off[r - 1]);
      for (size_t d = 0; d + 1 < r; ++d) base += static_cast<uint64_t>(off[d] + idx[d]) * gstride[d];
      const unsigned char* q = p + static_cast<size_t>(row * inner) * sizeof(U);
      uint64_t s = 0;
      for (int64_t j = 0; j < inner; ++j) {
        U v;
        std::memcpy(&v, q + static_cast<size_t>(j) * sizeof(U), sizeof(U));
        s += fmix64(static_cast<uint64_t>(v) ^ ((base + static_cast<uint64_t>(j)) * kGolden));
      }
      sum += s;
      for (size_t d = r - 1; d-- > 0;) {  // next row: odometer over dims r-2..0
        if (++idx[d] < block_shape[d]) break;
        idx[d] = 0;
      }
    }
  };
  switch (esz) {
    case 1: run(uint8_t{}); break;
    case 2: run(uint16_t{}); break;
    case 4: run(uint32_t{}); break;
    default: run(uint64_t{}); break;
  }
  return sum;
}

}  // namespace detail

uint64_t checksum_block(const Tensor& b, const Shape& off, const Shape& g) {
  return detail::checksum_raw(b.data(), b.dtype(), b.shape(), off, g);
}

}  // namespace shardsim::checkpoint
