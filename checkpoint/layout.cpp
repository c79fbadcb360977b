#include "checkpoint/layout.h"

#include <algorithm>
#include <string>

#include "common/error.h"

namespace shardsim::checkpoint {

namespace detail {

// Chunk dimensions for a tensor of shape G (empty: contiguous).
Shape chunk_dims(const Chunking& c, const Shape& g, size_t esize) {
  if (c.kind == Chunking::Kind::contiguous || g.empty() || runtime::shape_numel(g) == 0) return {};
  Shape chunk = g;
  if (c.kind == Chunking::Kind::dims && c.dims.size() == g.size()) {
    for (size_t d = 0; d < g.size(); ++d) chunk[d] = std::clamp<int64_t>(c.dims[d], 1, g[d]);
    return chunk;
  }
  const uint64_t target = std::max<uint64_t>(c.bytes, 1);
  for (size_t d = 0; d < g.size(); ++d) {
    uint64_t row = esize;  // bytes of one index of dim d (the trailing dims whole)
    for (size_t k = d + 1; k < g.size(); ++k) row *= static_cast<uint64_t>(chunk[k]);
    if (row <= target) {
      chunk[d] = std::clamp<int64_t>(static_cast<int64_t>(target / row), 1, g[d]);
      break;
    }
    chunk[d] = 1;
  }
  // HDF5 limits a chunk to 4 GiB and 2^32-1 elements.
  return chunk;
}

// `auto` layout without compression: when the writers' blocks all have one shape and tile the tensor on a grid
// (Shard(d) over equal shards, or one rank writing a replicated tensor), the chunk IS that block, split along
// dim 0 (by a divisor of its rows) to at most kMaxAlignedChunk: every chunk then has exactly one writer, who
// writes it independently, as one contiguous piece of the file, with no shuffle between ranks. Empty: no such
// layout (uneven shards); the caller falls back to chunk_dims.
constexpr uint64_t kMaxAlignedChunk = 64u << 20, kMinAlignedChunk = 256u << 10;
Shape aligned_chunk(const Shape& g, size_t esize, const std::vector<Block>& writers) {
  if (g.empty() || writers.empty() || runtime::shape_numel(g) == 0) return {};
  const Shape& b = writers.front().shape;
  int64_t covered = 0;
  for (const auto& w : writers) {
    if (w.shape != b) return {};
    for (size_t d = 0; d < g.size(); ++d)
      if (b[d] == 0 || w.offset[d] % b[d] != 0) return {};
    covered += runtime::shape_numel(w.shape);
  }
  if (covered != runtime::shape_numel(g)) return {};
  const uint64_t row = static_cast<uint64_t>(runtime::shape_numel(b) / b[0]) * esize;
  if (row > kMaxAlignedChunk) return {};
  int64_t rows = b[0];
  while (rows > 1 && static_cast<uint64_t>(rows) * row > kMaxAlignedChunk) {
    int64_t next = rows - 1;  // the largest proper divisor of b[0] below rows
    while (next > 1 && b[0] % next != 0) --next;
    rows = next;
  }
  Shape c = b;
  c[0] = rows;
  if (static_cast<uint64_t>(rows) * row < kMinAlignedChunk && static_cast<uint64_t>(runtime::shape_numel(g)) * esize >
                                                                      kMinAlignedChunk)
    return {};  // tiny blocks of a big tensor: fewer, bigger chunks (chunk_dims) read back faster
  return c;
}

// True when every chunk of CHUNK (empty: contiguous) is written by at most one of WRITERS, so independent writes
// never touch a chunk two ranks share.
bool single_writer_per_chunk(const Shape& chunk, const Shape& g, const std::vector<Block>& writers) {
  if (chunk.empty()) return true;  // contiguous: disjoint byte ranges
  for (const auto& w : writers)
    for (size_t d = 0; d < g.size(); ++d) {
      if (w.offset[d] % chunk[d] != 0) return false;
      if (w.shape[d] % chunk[d] != 0 && w.offset[d] + w.shape[d] != g[d]) return false;
    }
  return true;
}

}  // namespace detail

Chunking parse_chunking(const std::string& text) {
  Chunking c;
  if (text == "auto" || text.empty()) return c;
  if (text == "contiguous" || text == "none") {
    c.kind = Chunking::Kind::contiguous;
    return c;
  }
  const auto bad = [&] {
    return UsageError("--chunk '" + text + "': expected auto, contiguous, a byte size (256K, 4M) or dims (64x128)");
  };
  if (text.find('x') != std::string::npos) {
    c.kind = Chunking::Kind::dims;
    size_t pos = 0;
    while (pos <= text.size()) {
      const size_t end = std::min(text.find('x', pos), text.size());
      const std::string part = text.substr(pos, end - pos);
      if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos || part.size() > 12) throw bad();
      const int64_t v = std::stoll(part);
      if (v <= 0) throw bad();
      c.dims.push_back(v);
      pos = end + 1;
    }
    return c;
  }
  size_t digits = text.find_first_not_of("0123456789");
  if (digits == 0 || text.size() > 14) throw bad();
  uint64_t v = std::stoull(text.substr(0, digits));
  const std::string suffix = digits == std::string::npos ? "" : text.substr(digits);
  if (suffix == "K" || suffix == "k") v <<= 10;
  else if (suffix == "M" || suffix == "m") v <<= 20;
  else if (suffix == "G" || suffix == "g") v <<= 30;
  else if (!suffix.empty() && suffix != "B") throw bad();
  if (v == 0) throw bad();
  c.kind = Chunking::Kind::bytes;
  c.bytes = v;
  return c;
}

int parse_compression(const std::string& text) {
  if (text == "none" || text.empty()) return 0;
  if (text == "gzip") return 4;
  if (text.size() == 6 && text.rfind("gzip:", 0) == 0 && text[5] >= '1' && text[5] <= '9') return text[5] - '0';
  throw UsageError("--compression '" + text + "': expected none, gzip or gzip:N with N = 1..9");
}

}  // namespace shardsim::checkpoint
