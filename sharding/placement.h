// Placements as types (PyTorch DTensor's vocabulary): how a tensor is laid out over one mesh axis.
//
//   Shard(d)     the tensor is split along its dimension d over the axis's chips (collectives::Partition: the
//                first size % n chips get one extra row/column when n does not divide it)
//   Replicate    every chip of the axis holds all of it
//   Partial(op)  every chip holds a full-shaped partial value; the tensor is their reduction with op (the output
//                of a row-parallel GEMM before its all_reduce / reduce_scatter)
//
// A TensorSpec gives a tensor's global shape and its placement on each mesh axis (absent axes: Replicate). The
// reports' plan lines, the checkpoint's per-dataset "placement" attributes and the GEMM labels of the traces are
// generated from these (describe, parallel_style), never written by hand.
// Header-only; no MPI.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "collectives/types.h"
#include "sharding/device_mesh.h"

namespace shardsim::sharding {

struct Shard {
  int dim = 0;
  bool operator==(const Shard&) const = default;
};
struct Replicate {
  bool operator==(const Replicate&) const = default;
};
struct Partial {
  collectives::ReduceOp op = collectives::ReduceOp::sum;
  bool operator==(const Partial&) const = default;
};
using Placement = std::variant<Shard, Replicate, Partial>;

// "Shard(1)", "Replicate", "Partial(sum)".
inline std::string to_string(const Placement& p) {
  if (const auto* s = std::get_if<Shard>(&p)) return "Shard(" + std::to_string(s->dim) + ")";
  if (std::holds_alternative<Replicate>(p)) return "Replicate";
  return "Partial(" + collectives::reduce_op_name(std::get<Partial>(p).op) + ")";
}

// Megatron-LM's name for a GEMM whose weight [in, out] has placement W on the tensor-parallel axis:
// Shard(1) column-parallel, Shard(0) row-parallel, anything else "replicated" (every chip holds the whole weight).
inline std::string parallel_style(const Placement& w) {
  if (const auto* s = std::get_if<Shard>(&w)) return s->dim == 1 ? "column-parallel" : "row-parallel";
  return "replicated";
}

struct TensorSpec {
  std::string name;                          // e.g. "weights/w_gate"
  std::vector<int64_t> shape;                // global shape
  std::map<std::string, Placement> placements;  // mesh axis -> placement; absent: Replicate

  Placement on(const std::string& axis) const {
    const auto it = placements.find(axis);
    return it == placements.end() ? Placement{Replicate{}} : it->second;
  }
  // "Shard(1) over tp=8", "Shard(0) over tp=2, Shard(0) over cp=4", "Replicate" (axes of size > 1 of MESH).
  std::string describe(const DeviceMesh& mesh) const {
    std::string out;
    for (const auto& a : mesh.axes()) {
      if (a.size <= 1) continue;
      const Placement p = on(a.name);
      if (std::holds_alternative<Replicate>(p)) continue;
      out += (out.empty() ? "" : ", ") + to_string(p) + " over " + a.name + "=" + std::to_string(a.size);
    }
    return out.empty() ? "Replicate" : out;
  }
  // Local shape and offset of mesh rank RANK's piece (Shards split with collectives::Partition; Partial and
  // Replicate pieces are full-sized).
  std::vector<int64_t> local_shape(const DeviceMesh& mesh, int rank, std::vector<int64_t>* offset = nullptr) const {
    std::vector<int64_t> len = shape, off(shape.size(), 0);
    for (const auto& a : mesh.axes()) {
      const Placement p = on(a.name);
      const auto* s = std::get_if<Shard>(&p);
      if (!s || a.size <= 1) continue;
      const auto d = static_cast<size_t>(s->dim);
      const collectives::Partition part{static_cast<size_t>(len[d]), static_cast<size_t>(a.size)};
      const auto c = static_cast<size_t>(mesh.coordinate(a.name, rank));
      off[d] += static_cast<int64_t>(part.offset(c));
      len[d] = static_cast<int64_t>(part.size(c));
    }
    if (offset) *offset = off;
    return len;
  }
  // Bytes of mesh rank RANK's piece at ELEMENT_BYTES per element (the byte accounting of reports and memory).
  double local_bytes(const DeviceMesh& mesh, int rank, double element_bytes) const {
    double n = element_bytes;
    for (int64_t v : local_shape(mesh, rank)) n *= static_cast<double>(v);
    return n;
  }
};

}  // namespace shardsim::sharding
