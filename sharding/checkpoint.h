// HDF5 checkpoints in the global layout, written and read collectively with parallel HDF5 (MPI-IO).
//
// File layout: one dataset per tensor at its path (e.g. "/weights/w_gate") with the GLOBAL shape; each rank
// writes the hyperslab it owns (a Shard(d) tensor: its block; a Replicate tensor: only the writer rank).
// Each dataset has attributes: dtype ("fp32"/"bf16"), global_shape (int64[]), sharding (e.g.
// "Shard(1) over tp=8"). bf16 is stored as an HDF5 16-bit float type with bfloat16's layout (sign bit 15,
// 8-bit exponent with bias 127, 7-bit mantissa), so h5dump and h5py show its values. The root group holds
// string attributes given by the caller (the config text, the version, ...).
//
// Crash safety: the file is written as PATH.partial and renamed to PATH by rank 0 only after every rank's
// data is written and the file is closed, so PATH is either the previous complete checkpoint or the new one.
//
// Reading a block (read_block) works for any layout at load time: a checkpoint saved with tp=8 can be loaded
// with tp=4 (each rank reads the hyperslab it needs).
// Errors: RuntimeFault "checkpoint PATH: ..." on I/O failure; ConfigError when a dataset is missing or its
// shape/dtype does not match what the workload expects (exit code 2).
#pragma once

#include <mpi.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace shardsim::sharding {

struct CheckpointEntry {
  std::string path;                  // dataset path, e.g. "weights/w_gate"
  const runtime::Tensor* local;      // this rank's block
  runtime::Shape global_shape;       // shape of the whole tensor
  runtime::Shape offset;             // where the local block starts in the global tensor
  std::string sharding;              // human-readable spec, stored as an attribute
  bool write = true;                 // false: this rank contributes nothing (replicated tensors)
};

// Collective over COMM: every rank passes the same entries (paths, shapes, attributes) in the same order.
void save_checkpoint(MPI_Comm comm, const std::string& path, const std::vector<CheckpointEntry>& entries,
                     const std::map<std::string, std::string>& root_attributes);

class CheckpointReader {
 public:
  CheckpointReader(MPI_Comm comm, const std::string& path);  // collective
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  bool has(const std::string& dataset) const;
  runtime::Shape global_shape(const std::string& dataset) const;
  runtime::DType dtype(const std::string& dataset) const;
  std::string root_attribute(const std::string& name) const;
  // Reads the block of DATASET starting at OFFSET with OUT's shape. Collective (every rank calls it for the
  // same dataset; ranks may ask for different or empty blocks). Checks dtype and bounds.
  void read_block(const std::string& dataset, const runtime::Shape& offset, runtime::Tensor& out) const;

 private:
  std::string path_;
  long long file_ = -1;  // hid_t, kept opaque here so callers need no HDF5 headers
};

}  // namespace shardsim::sharding
