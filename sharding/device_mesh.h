// DeviceMesh: the chips of a job as an n-dimensional grid of named parallelism axes (PyTorch DeviceMesh,
// torchtitan's ParallelDims), and where that grid lies on the topology.
//
// Axes, innermost first (Megatron-LM's rank order tp-cp-ep-dp-pp): tp (tensor), cp (context / sequence: ring
// attention or Ulysses), ep (experts, reserved), dp (data), pp (pipeline). A missing axis has size 1; the
// product of the sizes is the chip count. Mesh rank r has coordinates
//     tp = r % TP,  cp = (r / TP) % CP,  ep = ...,  dp = ...,  pp = r / (TP·CP·EP·DP)
// so consecutive ranks differ in tp first. The ranks that share every coordinate but AXIS form AXIS's sub-group
// (its Transport: mesh["tp"]), ordered by their AXIS coordinate.
//
// Placement on the topology (which chip mesh rank r runs on): the mesh fills the topology's dimensions in an
// order, innermost axis first, as one mixed-radix number: mesh rank r = x[o0] + k[o0]·(x[o1] + k[o1]·(...)),
// where o0, o1, ... is the dimension order and x[d] / k[d] a chip's coordinate / the size along dimension d. So
// the innermost axis (tp) lies on dimension o0; an axis larger than a dimension spans the next one too, and an
// axis smaller than a dimension takes a factor of it (its ranks are then neighbours along that dimension).
//   default order: the fastest dimension first (highest link bandwidth); among equally fast dimensions the order
//     whose axis boundaries fall on dimension boundaries (tp=2 x cp=4 on a 2x4 torus: tp on the size-2 dimension,
//     cp on the size-4 one), else the last (row-major fastest-varying) dimension first, which makes a one-axis
//     mesh the identity placement (rank r on chip r).
//   parallel.mesh_dims: [d0, d1, ...]  the order, given explicitly (a permutation of the dimensions of size > 1).
//   topology.placement: an explicit rank -> chip list in the topology wins over both (reported as such).
// Graph topologies have one dimension (the chip ids).
// Errors: std::invalid_argument for sizes whose product differs from the chip count, unknown axes, a bad order
// (config parsers turn them into ConfigError naming FILE:LINE).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "runtime/transport.h"
#include "topology/topology.h"

namespace shardsim::sharding {

struct ParallelPlan;  // sharding/model_spec.h

// A factor SIZE of topology dimension DIM that an axis occupies.
struct MeshDimPiece {
  int dim = 0;
  int size = 1;
};

struct MeshAxis {
  std::string name;
  int size = 1;
  int stride = 1;                   // mesh-rank distance between neighbours along this axis
  std::vector<MeshDimPiece> on;     // where it lies on the topology (empty for size 1)
};

class DeviceMesh {
 public:
  // The axis names, innermost first.
  static const std::vector<std::string>& axis_names();

  DeviceMesh() = default;
  // SIZES: axis -> size (absent: 1). DIM_ORDER: the topology dimensions in fill order (empty: the default above).
  DeviceMesh(const std::map<std::string, int>& sizes, const topology::Topology& topology,
             const std::vector<int>& dim_order = {});

  int size() const { return size_; }                 // chips
  int size(const std::string& axis) const;           // 1 for an absent axis; invalid_argument for an unknown name
  int coordinate(const std::string& axis, int rank) const;
  const std::vector<MeshAxis>& axes() const { return axes_; }  // every axis, innermost first (sizes 1 included)
  // Mesh rank -> chip. Equals the topology's own placement when it sets one.
  const std::vector<int>& placement() const { return placement_; }
  const std::vector<int>& dim_order() const { return dim_order_; }
  bool explicit_placement() const { return explicit_placement_; }

  // "tp=2 x cp=4" (axes of size > 1, innermost first; "1 chip" / "tp=1" for one chip).
  std::string describe() const;
  // How the mesh lies on the topology, e.g. "tp -> dim 0 (2 chips, 100 GB/s links), cp -> dim 1 (4 chips,
  // 100 GB/s links); rank order tp innermost".
  std::string mapping_text() const;

  // Binds the mesh to this rank's world transport (mesh rank = transport rank); then mesh["tp"] is this rank's
  // tp sub-group (collective on first use of each axis: every rank must ask for the same axes in the same order).
  void bind(runtime::Transport& world) { world_ = &world; }
  runtime::Transport& operator[](const std::string& axis) const;
  // The ranks with this rank's AXIS coordinate: every other axis, in mesh rank order (for "dp": one data-parallel
  // replica, its tp x cp x pp chips). Collective on first use, like operator[].
  runtime::Transport& excluding(const std::string& axis) const;
  int rank() const;  // this rank's mesh rank (needs bind)

  // "" when shifting every rank by PERIOD along AXIS (its coordinate + PERIOD, mod the size) is a symmetry of
  // TOPOLOGY (one map per dimension: translations of rings, permutations of switch and fully connected dimensions,
  // lines fixed), else why not. O(chips x dims). replica_fold_period: the smallest such PERIOD < the axis size
  // (0: none). A folded run needs it (docs/performance/fold.md).
  std::string replica_shift_check(const std::string& axis, int period, const topology::Topology& topology) const;
  int replica_fold_period(const std::string& axis, const topology::Topology& topology) const;

 private:
  const MeshAxis& axis(const std::string& name) const;
  std::vector<MeshAxis> axes_;
  std::vector<int> placement_;
  std::vector<int> dim_order_;
  std::vector<int> dim_sizes_;
  std::vector<std::string> dim_text_;  // per topology dimension: "dim 0 (2 chips, 100 GB/s links)"
  int size_ = 0;
  bool explicit_placement_ = false;
  runtime::Transport* world_ = nullptr;
};

// THE mesh of a plan, for `run` and `train` alike: the plan registry's axis sizes (sharding/plans/registry.h,
// mesh_axis_sizes: tp, cp x ulysses on cp, dp, pp) on TOPOLOGY, filling PLAN.mesh_dims when given (each a dimension
// of TOPOLOGY, a grid). std::invalid_argument for a mesh that does not fit: messages about mesh_dims start with
// "parallel.mesh_dims: ", others say what does not fit (sharding/engine_config.h's checked_mesh turns them into
// ConfigError at the key).
DeviceMesh build_mesh(const ParallelPlan& plan, const topology::Topology& topology);

}  // namespace shardsim::sharding
