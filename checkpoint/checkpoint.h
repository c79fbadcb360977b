// HDF5 checkpoints in the global layout, written and read collectively with parallel HDF5 (MPI-IO).
//
// ---- File format ("shardsim-checkpoint", format_version 1) ----
// One HDF5 file per checkpoint (file format bounds: HDF5 1.10, so object headers, the superblock and the chunk
// index carry HDF5's own metadata checksums). One dataset per tensor at its path (e.g. "/weights/w_gate") with
// the tensor's GLOBAL shape; each rank writes only the hyperslab it owns (a Shard(d) block; a replicated
// tensor is written by one rank). Layout: chunked (see Chunking; default without compression: each writer's block
// is its own chunk when the blocks tile the tensor, else chunks of whole trailing rows up to ~4 MiB) with optional
// gzip compression; zero-size and rank-0 tensors are contiguous. Data of unfiltered datasets is written and read
// with independent MPI-IO when no chunk has two writers; compressed data collectively.
//
// Root attributes: format = "shardsim-checkpoint", format_version (int64 1), step (int64), complete (int64 1,
// written last, just before the file is closed), tensors (JSON array of the dataset paths, the manifest),
// checksum_algorithm (text of the definition below), plus the caller's string attributes (the producing
// version "shardsim_version", the config text "config", the device mesh, ...).
// Dataset attributes: dtype (string, runtime/dtype.h name), global_shape (int64[]), sharding (e.g.
// "Shard(1) over tp=8"), mesh (the device mesh at save, e.g. "tp=8 on chips [0..7] of ring 8"), checksum (uint64).
//
// Element types (HDF5 types chosen so h5dump / h5py show real values):
//   int8..uint64 -> H5T_STD_{I,U}{8,32,64}LE;  fp32/fp64 -> H5T_IEEE_F{32,64}LE;
//   fp16  -> 16-bit IEEE half (sign 15, exponent 10..14 bias 15, mantissa 0..9);
//   bf16  -> 16-bit float with bfloat16's layout (sign 15, exponent 7..14 bias 127, mantissa 0..6), which
//            h5py reads as float16 by default: read it with ds.astype('f4') to get exact values;
//   fp8_e5m2 -> 8-bit float (sign 7, exponent 2..6 bias 15, mantissa 0..1), IEEE-like, exact;
//   fp8_e4m3 -> H5T_STD_U8LE holding the raw OCP E4M3FN bits (HDF5 floats cannot express E4M3FN's
//               "no infinities, only S.1111.111 is NaN" encoding); the dtype attribute says fp8_e4m3.
//
// Checksum (per tensor; layout-independent, so any mesh can verify it):
//   checksum = SUM over all elements i of fmix64( bits_i XOR (i * 0x9E3779B97F4A7C15) )   (mod 2^64)
//   i = the element's row-major linear index in the GLOBAL tensor; bits_i = the element's stored bytes read as
//   a little-endian unsigned integer, zero-extended to 64 bits; fmix64 = MurmurHash3's 64-bit finalizer
//   (x ^= x>>33; x *= 0xff51afd7ed558ccd; x ^= x>>33; x *= 0xc4ceb9fe1a85ec53; x ^= x>>33).
//   Every term depends only on (global index, value), and addition commutes, so each rank sums the terms of its
//   own hyperslab and an MPI_Allreduce(sum) gives the same value for every sharding. fmix64 is a bijection, so
//   changing any single element always changes the checksum; moving an element to another index changes it too.
//
// ---- Crash safety, full disks, reproducibility (docs/RELIABILITY.md) ----
// save_checkpoint first reserves the space the save needs (rank 0, fallocate(2); statvfs where fallocate is not
// supported): a full disk or quota is one agreed RuntimeFault ("... No space left on device (the checkpoint needs
// about N MiB, M MiB free)") before anything collective touches the disk, so no I/O error can reach some ranks in
// the middle of a collective MPI-IO write. It then writes PATH.partial.XXXXXX (a fresh random name, created by
// H5Fcreate with H5F_ACC_EXCL: a planted file or symlink is never followed), closes it (collective), trims the
// reservation's unused tail, fsyncs it, renames it to PATH atomically and fsyncs PATH's directory. PATH is
// therefore always either the previous complete checkpoint or the new one; a crash leaves at most a
// PATH.partial.XXXXXX, which the reader rejects (it lacks `complete`). Every collective HDF5 step runs under a
// last-resort watchdog (SHARDSIM_WATCHDOG_S, default 300 s): a step that does not return in time aborts the job
// with exit code 3 and one line naming the file, the step and the chip. The same data saved twice gives
// byte-identical files (object timestamps off). Test hooks: SHARDSIM_TEST_CKPT_CRASH="RANK:N" makes rank RANK
// SIGKILL itself right after writing its part of tensor N (0-based) of a save; SHARDSIM_TEST_CKPT_STALL=RANK makes
// rank RANK stop forever inside the first tensor's write step (the watchdog ends the job).
//
// ---- Several chips per rank (runtime/chips.h) ----
// The World overloads below work at any K. With K = 1 they are the MPI_Comm functions on world.comm(). With K > 1
// every chip of a rank calls them (same arguments apart from its own blocks), and the rank's chip 0 makes the
// collective HDF5 calls for all K chips through runtime::chips::rank_handover: a save hands the K chips' entries
// over; an unfiltered tensor with one writer per chunk is written with one independent H5Dwrite per chip block (as
// at K = 1, independent transfers are not collective), any other (compressed, shared chunks: collective) with one
// H5Dwrite per rank whose file selection is the union of the K chips' hyperslabs, from one buffer holding their
// elements in the union's row-major order (HDF5 transfers a selection in that order); the checksum is each rank's
// fold of its chips' terms, then the same MPI_Allreduce. A read is the same in reverse (a block that several chips
// of a rank ask for is read once). Every rank thus makes the same
// collective calls in the same order as with one chip per rank, and the file has the same datasets, chunks,
// attributes and checksums as the file of the same run at K = 1, so either resumes the other.
//
// ---- Errors (never a hang: every decision that precedes a collective HDF5 call is agreed across ranks) ----
// Bad checkpoint (exit 2, ConfigError on EVERY rank, message names the file and the tensor): missing/unreadable
// file, not HDF5, truncated, incomplete (interrupted save), not a shardsim checkpoint, a manifest tensor that
// is missing, an HDF5 type or shape that disagrees with its attributes, checksum mismatch, a dtype or shape
// that differs from what the caller expects, a block out of bounds. I/O failures while saving: RuntimeFault
// (exit 3) on every rank. Bad --chunk/--compression text: UsageError (exit 2).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace shardsim::runtime {
class World;
}

namespace shardsim::checkpoint {

struct CheckpointEntry {
  std::string path;                  // dataset path, e.g. "weights/w_gate"
  const runtime::Tensor* local;      // this rank's block
  runtime::Shape global_shape;       // shape of the whole tensor
  runtime::Shape offset;             // where the local block starts in the global tensor
  std::string sharding;              // human-readable spec, stored as an attribute
  bool write = true;                 // false: this rank contributes nothing (replicated tensors)
};

// Dataset layout. auto_: chunked; without compression, when the writers' blocks all have one shape and tile the
// tensor (Shard(d) over equal shards, one rank writing a replicated tensor), the chunk is that block (split along
// dim 0 to at most 64 MiB), so every chunk has one writer; otherwise chunks of whole trailing rows up to `bytes`
// (default 4 MiB);
// bytes: the same with another target; dims: these chunk dimensions (clamped to the tensor; the rank must
// match, else auto_); contiguous: no chunks (no compression possible); whole: the chunks `auto` gives one writer of
// the whole tensor, whatever the blocks (a file the same byte for byte for every mesh; the blocks must tile each
// tensor exactly, else RuntimeFault).
struct Chunking {
  enum class Kind { auto_, bytes, dims, contiguous, whole } kind = Kind::auto_;
  uint64_t bytes = 4u << 20;
  runtime::Shape dims;
};
// "auto" | "contiguous" | a byte size with K/M/G suffix ("1M") | dims "64x128". UsageError otherwise.
Chunking parse_chunking(const std::string& text);

// "none" | "gzip" (level 4) | "gzip:N" (N = 1..9). UsageError otherwise. Returns the gzip level, 0 for none.
int parse_compression(const std::string& text);

struct SaveOptions {
  Chunking chunking;
  int gzip_level = 0;          // 0: no compression; 1..9: deflate (needs chunking; collective writes)
  int64_t step = 0;
  std::string mesh;            // device mesh at save, stored on every dataset
};

// Collective over COMM: every rank passes the same entries (paths, shapes, attributes) in the same order.
void save_checkpoint(MPI_Comm comm, const std::string& path, const std::vector<CheckpointEntry>& entries,
                     const std::map<std::string, std::string>& root_attributes, const SaveOptions& options = {});
// The same over the chips of WORLD, at any number of chips per rank (see "Several chips per rank" above): every chip
// passes the same entries (paths, global shapes, dtypes, attributes) in the same order, each with its own block.
void save_checkpoint(const runtime::World& world, const std::string& path, const std::vector<CheckpointEntry>& entries,
                     const std::map<std::string, std::string>& root_attributes, const SaveOptions& options = {});

// The checksum terms of one block: SUM of the terms (see above) of the elements of BLOCK, whose first element
// sits at OFFSET of a tensor of shape GLOBAL. Add the results of disjoint blocks to get a tensor's checksum.
uint64_t checksum_block(const runtime::Tensor& block, const runtime::Shape& offset, const runtime::Shape& global);

// What the file says about one tensor (read and cross-checked when the reader opens the file).
struct TensorInfo {
  std::string name;               // dataset path without the leading '/'
  runtime::DType dtype = runtime::DType::fp32;
  runtime::Shape shape;           // global
  std::string sharding, mesh;     // as saved
  uint64_t checksum = 0;
  runtime::Shape chunk;           // empty: contiguous
  int gzip_level = 0;             // 0: no compression
  uint64_t storage_bytes = 0;     // bytes on disk (after compression)
};

class CheckpointReader {
 public:
  // Collective. Rank 0 first opens the file serially and checks its structure (HDF5 signature and size,
  // `complete`, the manifest, every tensor's type and shape against its attributes); the verdict is broadcast,
  // and only a file that passed is opened collectively. ConfigError on every rank otherwise.
  CheckpointReader(MPI_Comm comm, const std::string& path);
  // The same over the chips of WORLD (any chips per rank; with K > 1 every chip of a rank holds a reader sharing the
  // rank's one open file, and every collective call below goes through the rank's chip 0). Collective per chip.
  CheckpointReader(const runtime::World& world, const std::string& path);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  bool has(const std::string& dataset) const;
  const TensorInfo& info(const std::string& dataset) const;  // ConfigError naming file and tensor if missing
  runtime::Shape global_shape(const std::string& dataset) const { return info(dataset).shape; }
  runtime::DType dtype(const std::string& dataset) const { return info(dataset).dtype; }
  int64_t step() const { return step_; }
  // A root string attribute ("" when absent); all of them.
  std::string root_attribute(const std::string& name) const;
  const std::map<std::string, std::string>& root_attributes() const { return root_attrs_; }

  // Reads the block of DATASET starting at OFFSET with OUT's shape. Collective (every rank calls it for the
  // same dataset; ranks may ask for different or empty blocks). Checks dtype and bounds on every rank first.
  void read_block(const std::string& dataset, const runtime::Shape& offset, runtime::Tensor& out) const;

  // read_block, and the tensor's checksum verified from the blocks just read (no second pass over the file):
  // collective; COUNTS is true on the ranks whose blocks together hold every element exactly once (Shard(d)
  // blocks on every rank, or one rank's whole copy of a replicated tensor). When the counted blocks do not add up
  // to the tensor's element count it falls back to verify({DATASET}). ConfigError on every rank on a mismatch.
  void read_block_verified(const std::string& dataset, const runtime::Shape& offset, runtime::Tensor& out,
                           bool counts) const;

  // Collective: recomputes the checksum of each of DATASETS (all when empty) from the file, each rank reading
  // a slice of dim 0 of at most `slab_bytes`, and compares it with the stored one. ConfigError on every rank
  // naming the first mismatching tensor. Returns the computed checksums in the order of DATASETS.
  std::vector<uint64_t> verify(const std::vector<std::string>& datasets = {}, uint64_t slab_bytes = 64u << 20) const;

  // One block of a rank-level read (internal: with K chips per rank, one per chip).
  struct Part {
    runtime::Shape offset, shape;
    void* data = nullptr;
    bool counts = false;             // read_block_verified: this block counts for the checksum
    const std::string* dataset = nullptr;
    runtime::DType dtype = runtime::DType::fp32;
    std::vector<uint64_t>* verified = nullptr;  // verify(): where the result goes
  };

 private:
  void open(const std::string& path);
  void read_raw(const std::string& dataset, const runtime::Shape& offset, const runtime::Shape& shape,
                runtime::DType dtype, void* data) const;
  // Rank level: reads every part of DATASET (one collective read of their union).
  void read_parts(const std::string& dataset, runtime::DType dtype, const std::vector<Part>& parts) const;
  void read_parts_verified(const std::string& dataset, runtime::DType dtype, const std::vector<Part>& parts) const;
  // Chip mode: the rank's reader, shared by the rank's chips (null with one chip per rank).
  std::shared_ptr<CheckpointReader> rank_;
  MPI_Comm comm_;
  std::string path_;
  long long file_ = -1;  // hid_t, kept opaque here so callers need no HDF5 headers
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> root_attrs_;
  int64_t step_ = 0;
};

}  // namespace shardsim::checkpoint
