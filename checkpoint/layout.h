// Internal to checkpoint/: a tensor's dataset layout (chunk dimensions, which rank writes which chunk) and the
// packing of several chips' blocks into one HDF5 transfer. Include only from checkpoint/*.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/h5util.h"

namespace shardsim::checkpoint::detail {

// Chunk dimensions for a tensor of shape G (empty: contiguous).
Shape chunk_dims(const Chunking& c, const Shape& g, size_t esize);

// One rank's block of a tensor, as every rank learns it before a save (the layout and the transfer mode of each
// tensor are decided from all the blocks, identically on every rank).
struct Block {
  Shape offset, shape;
};

// `auto` layout without compression: when the writers' blocks all have one shape and tile the tensor on a grid
// (Shard(d) over equal shards, or one rank writing a replicated tensor), the chunk IS that block, split along
// dim 0 (by a divisor of its rows) to at most kMaxAlignedChunk: every chunk then has exactly one writer, who
// writes it independently, as one contiguous piece of the file, with no shuffle between ranks. Empty: no such
// layout (uneven shards); the caller falls back to chunk_dims.
Shape aligned_chunk(const Shape& g, size_t esize, const std::vector<Block>& writers);

// True when every chunk of CHUNK (empty: contiguous) is written by at most one of WRITERS, so independent writes
// never touch a chunk two ranks share.
bool single_writer_per_chunk(const Shape& chunk, const Shape& g, const std::vector<Block>& writers);

// Several blocks of one tensor moved by one HDF5 transfer (several chips per rank, runtime/chips.h): the file
// selection is the union of the blocks' hyperslabs, and memory is one buffer holding the union's elements in the
// order HDF5 transfers a selection, row-major in the dataset. The blocks are cut into runs (their rows along the
// last dimension: contiguous in memory and in the global row-major index); the union is the merged runs, and each
// run's place in the buffer is its merged interval's offset plus its distance from the interval's start.
// Overlapping blocks (chips of a rank reading the same replicated block) are transferred once.
struct Piece {
  unsigned char* data;
  Shape offset, shape;
};
class Packed {
 public:
  Packed(const std::vector<Piece>& pieces, const Shape& g, size_t esize) : pieces_(pieces), g_(g), esize_(esize) {
    const size_t r = g.size();
    std::vector<uint64_t> gstride(r, 1);
    for (size_t d = r; d-- > 1;) gstride[d - 1] = gstride[d] * static_cast<uint64_t>(g[d]);
    for (const auto& p : pieces) {
      const int64_t n = runtime::shape_numel(p.shape);
      if (n <= 0) continue;
      if (r == 0) {
        runs_.push_back({0, 1, p.data});
        continue;
      }
      const int64_t inner = p.shape[r - 1], rows = n / inner;
      std::vector<int64_t> idx(r, 0);
      for (int64_t row = 0; row < rows; ++row) {
        uint64_t start = static_cast<uint64_t>(p.offset[r - 1]);
        for (size_t d = 0; d + 1 < r; ++d) start += static_cast<uint64_t>(p.offset[d] + idx[d]) * gstride[d];
        runs_.push_back({start, static_cast<uint64_t>(inner), p.data + static_cast<size_t>(row * inner) * esize});
        for (size_t d = r - 1; d-- > 0;) {
          if (++idx[d] < p.shape[d]) break;
          idx[d] = 0;
        }
      }
    }
    std::vector<Run> sorted = runs_;
    std::sort(sorted.begin(), sorted.end(), [](const Run& a, const Run& b) { return a.start < b.start; });
    for (const auto& run : sorted) {
      if (!merged_.empty() && run.start <= merged_.back().start + merged_.back().len) {
        auto& m = merged_.back();
        m.len = std::max(m.len, run.start + run.len - m.start);
      } else {
        merged_.push_back({run.start, run.len, 0});
      }
    }
    for (auto& m : merged_) {
      m.packed = elements_;
      elements_ += m.len;
    }
  }
  uint64_t elements() const { return elements_; }
  // FSPACE's selection becomes the union of the pieces (none when they are all empty).
  void select(hid_t fspace) const {
    H5Sselect_none(fspace);
    if (elements_ == 0) return;
    if (g_.empty()) {
      H5Sselect_all(fspace);
      return;
    }
    bool first = true;
    for (const auto& p : pieces_) {
      if (runtime::shape_numel(p.shape) <= 0) continue;
      std::vector<hsize_t> start(p.offset.begin(), p.offset.end()), cnt(p.shape.begin(), p.shape.end());
      H5Sselect_hyperslab(fspace, first ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), nullptr, cnt.data(), nullptr);
      first = false;
    }
  }
  void pack(unsigned char* buf) const {
    for (const auto& run : runs_) std::memcpy(buf + place(run.start) * esize_, run.p, run.len * esize_);
  }
  void unpack(const unsigned char* buf) const {
    for (const auto& run : runs_) std::memcpy(run.p, buf + place(run.start) * esize_, run.len * esize_);
  }

 private:
  struct Run {
    uint64_t start, len;
    unsigned char* p;
  };
  struct Interval {
    uint64_t start, len, packed;
  };
  uint64_t place(uint64_t start) const {
    auto it = std::upper_bound(merged_.begin(), merged_.end(), start,
                               [](uint64_t v, const Interval& m) { return v < m.start; });
    --it;  // the interval holding START (runs never straddle two: merged intervals are maximal)
    return it->packed + (start - it->start);
  }
  std::vector<Piece> pieces_;
  Shape g_;
  size_t esize_;
  std::vector<Run> runs_;
  std::vector<Interval> merged_;
  uint64_t elements_ = 0;
};

}  // namespace shardsim::checkpoint::detail
