// save_checkpoint: the collective save of one checkpoint (see "Crash safety, full disks" in checkpoint.h). The
// steps, in order: arguments agreed, each tensor's layout decided from every rank's blocks, the space reserved and
// the temporary created, the tensors written, the checksums and root attributes written (`complete` last), the file
// closed, trimmed, fsynced and renamed over PATH.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checksum.h"
#include "checkpoint/h5util.h"
#include "checkpoint/layout.h"
#include "checkpoint/space.h"
#include "checkpoint/watchdog.h"
#include "common/error.h"
#include "common/output_file.h"
#include "common/text.h"
#include "runtime/chips.h"
#include "runtime/world.h"

namespace shardsim::checkpoint {

using namespace detail;

namespace {

using Parts = std::vector<std::vector<const CheckpointEntry*>>;

// Test hook: "RANK:N" -> rank RANK kills itself after writing its part of tensor N.
std::pair<int, long> crash_hook() {
  const char* v = std::getenv("SHARDSIM_TEST_CKPT_CRASH");
  if (!v) return {-1, -1};
  int r = -1;
  long n = -1;
  if (std::sscanf(v, "%d:%ld", &r, &n) != 2) return {-1, -1};
  return {r, n};
}

// Test hook: SHARDSIM_TEST_CKPT_STALL=RANK makes rank RANK stop forever inside the first tensor's write step, so the
// I/O watchdog's bounded exit can be tested. -1 when unset.
int stall_hook() {
  const char* v = std::getenv("SHARDSIM_TEST_CKPT_STALL");
  return v && *v ? std::atoi(v) : -1;
}

// Arguments, checked on every rank before anything collective.
void check_arguments(MPI_Comm comm, const std::string& at, const Parts& parts, const SaveOptions& opt,
                     const std::string& mismatch) {
  agree(comm, [&] {
    if (!mismatch.empty()) throw RuntimeFault(at + mismatch);
    if (opt.gzip_level > 0 && opt.chunking.kind == Chunking::Kind::contiguous)
      throw UsageError(at + "compression needs a chunked layout (got --chunk contiguous)");
    if (opt.gzip_level > 0 && H5Zfilter_avail(H5Z_FILTER_DEFLATE) <= 0)
      throw RuntimeFault(at + "this HDF5 library has no deflate (gzip) filter");
    for (const auto& p : parts)
      for (const CheckpointEntry* ep : p) {
        const CheckpointEntry& e = *ep;
        const Shape& ls = e.local->shape();
        if (ls.size() != e.global_shape.size() || e.offset.size() != ls.size())
          throw RuntimeFault(at + "tensor '" + e.path + "': block rank differs from the global shape");
        for (size_t d = 0; d < ls.size() && e.write; ++d)
          if (e.offset[d] < 0 || e.offset[d] + ls[d] > e.global_shape[d])
            throw RuntimeFault(at + "tensor '" + e.path + "': block " + runtime::shape_str(ls) + " at " +
                               runtime::shape_str(e.offset) + " is outside " + runtime::shape_str(e.global_shape));
      }
  });
}

// Each tensor's chunk dimensions (empty: contiguous) and whether its data is written independently.
struct Layouts {
  std::vector<Shape> chunks;
  std::vector<char> independent;
};

// Every rank's block of every tensor, so each tensor's layout and transfer mode are decided the same way
// everywhere: chunks aligned to the writers' blocks when they tile it (see aligned_chunk), and independent
// writes when no chunk has two writers (no collective in the data path; compression needs collective writes).
Layouts plan_layouts(MPI_Comm comm, const Parts& parts, const std::vector<const CheckpointEntry*>& entries,
                     const SaveOptions& opt) {
  const size_t k_parts = parts.empty() ? 1 : parts.front().size();
  int nranks = 1;
  MPI_Comm_size(comm, &nranks);
  Layouts out{std::vector<Shape>(entries.size()), std::vector<char>(entries.size(), 0)};
  // Every rank has the same number of parts per tensor (chips per rank), so the records have one size.
  std::vector<int64_t> mine;
  for (const auto& p : parts)
    for (const CheckpointEntry* ep : p) {
      const CheckpointEntry& e = *ep;
      const size_t r = p.front()->global_shape.size();
      mine.push_back(e.write && e.local->numel() > 0 ? 1 : 0);
      for (size_t d = 0; d < r; ++d) mine.push_back(d < e.offset.size() ? e.offset[d] : 0);
      for (size_t d = 0; d < r; ++d) mine.push_back(d < e.local->shape().size() ? e.local->shape()[d] : 0);
    }
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(nranks));
  MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, all.data(), static_cast<int>(mine.size()),
                MPI_INT64_T, comm);
  size_t pos = 0;
  std::string bad_cover;  // Chunking::Kind::whole: a tensor whose written blocks do not add up to it
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = *entries[i];
    const size_t r = e.global_shape.size(), esize = runtime::dtype_size(e.local->dtype());
    std::vector<Block> writers;
    for (int q = 0; q < nranks; ++q)
      for (size_t j = 0; j < k_parts; ++j) {
        const int64_t* p = all.data() + static_cast<size_t>(q) * mine.size() + pos + j * (1 + 2 * r);
        if (p[0]) writers.push_back({Shape(p + 1, p + 1 + r), Shape(p + 1 + r, p + 1 + 2 * r)});
      }
    pos += k_parts * (1 + 2 * r);
    out.chunks[i] = chunk_dims(opt.chunking, e.global_shape, esize);
    const bool whole = opt.chunking.kind == Chunking::Kind::whole;
    if (whole) {  // the writers' blocks must cover the tensor once (same verdict on every rank: all blocks known)
      int64_t covered = 0;
      for (const auto& w : writers) covered += runtime::shape_numel(w.shape);
      if (covered != runtime::shape_numel(e.global_shape)) bad_cover = e.path;
    }
    if ((opt.chunking.kind == Chunking::Kind::auto_ || whole) && opt.gzip_level == 0 && !out.chunks[i].empty())
      if (Shape a = aligned_chunk(e.global_shape, esize,
                                  whole ? std::vector<Block>{{Shape(e.global_shape.size(), 0), e.global_shape}} : writers);
          !a.empty())
        out.chunks[i] = a;
    out.independent[i] = opt.gzip_level == 0 && single_writer_per_chunk(out.chunks[i], e.global_shape, writers);
  }
  if (!bad_cover.empty())  // every rank saw every block: the same verdict everywhere
    throw RuntimeFault("checkpoint: tensor '" + bad_cover + "': the written blocks do not cover it exactly once");
  return out;
}

// The temporary: "PATH.partial.p<PID>h<HOST>.XXXXXX", a fresh random name chosen by rank 0 and created by H5Fcreate with
// H5F_ACC_EXCL (O_CREAT|O_EXCL: nothing that already exists under that name, e.g. a planted symlink, is ever
// opened or followed).
//
// Space first, before HDF5 or MPI-IO touch the disk: rank 0 reserves what the save needs (plus slack for the
// close) in a side file "TEMP.space" with fallocate(2). A full disk or quota is then one agreed error before
// anything collective. Once the HDF5 file exists (H5Fcreate writes nothing yet), rank 0 releases the side file
// and at once reserves the same space in the HDF5 file itself (save_parts): no later write of this save can run
// out of space, so no error can reach some ranks in the middle of a collective MPI-IO write (which would hang the
// others). Returns the temporary's name on every rank; SPACE: the side file's name, TARGET: the file the commit
// replaces (rank 0).
std::string reserve_side_file(MPI_Comm comm, int rank, const std::string& path, uint64_t need, std::string& space,
                              std::string& target) {
  std::string partial;
  Watch w(where(path) + "reserving space");
  agree(comm, [&] {
    if (rank != 0) return;
    // The file replaced: PATH, or a symlink's target (the link stays; common/output_file.h).
    target = resolve_file_output(path, "checkpoint");
    // Temporaries of earlier saves whose rank 0 was killed (kill -9: no handler ran) are removed first.
    for (const auto& f : sweep_stale_temps(target))
      std::fprintf(stderr, "shardsim: note: removed %s, the temporary of a save whose writer is gone\n",
                   escape_control(f).c_str());
    partial = temp_name_for(target);
    space = partial + ".space";
    register_temp(space);  // before it exists (common/output_file.h, settle_registered_temp)
    const int fd = ::open(space.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
      const int err = errno;
      unregister_temp(space);
      throw RuntimeFault("cannot write " + path + ": creating " + space + ": " + std::strerror(err));
    }
    settle_registered_temp(space);
    ::close(fd);
    try {
      reserve_space(space, path, need + kCloseSlack, need + kCloseSlack);
    } catch (...) {
      ::unlink(space.c_str());
      unregister_temp(space);
      throw;
    }
  });
  return bcast_string(comm, partial);
}

// Collective: creates PARTIAL (H5F_ACC_EXCL) on every rank, or throws the agreed error with nothing left open.
hid_t create_temp(MPI_Comm comm, int rank, const std::string& path, const std::string& partial) {
  const std::string at = where(path);
  hid_t file = -1;
  Watch w(at + "creating " + partial);
  try {
    agree(comm, [&] {
      Id fapl{mpio_fapl(comm, true), H5Pclose};
      Id fcpl{H5Pcreate(H5P_FILE_CREATE), H5Pclose};
      H5Pset_obj_track_times(fcpl.id, false);  // the root group without timestamps either
      file = H5Fcreate(partial.c_str(), H5F_ACC_EXCL, fcpl.id, fapl.id);
      if (file < 0)
        throw RuntimeFault(at + "cannot create " + partial + ": " + last_os_error("is the directory writable?") +
                           h5_detail());
      if (rank == 0) settle_registered_temp(partial);
    });
  } catch (...) {
    if (file >= 0) H5Fclose(file);  // created here but not on another rank
    throw;
  }
  return file;
}

// The transfer property lists of a save: collective and independent.
struct Transfers {
  hid_t collective, independent;
};

// Creates tensor E's dataset (CHUNK, OPT's compression) with its attributes and writes this rank's PARTS of it (the
// rank's chips' blocks; INDEPENDENT: no chunk has two writers). RuntimeFault on an HDF5 or I/O error.
void write_tensor(hid_t file, const CheckpointEntry& e, const std::vector<const CheckpointEntry*>& parts,
                  const Shape& chunk, bool independent, const SaveOptions& opt, const Transfers& xfer) {
  ensure_groups(file, e.path);
  const DType dt = e.local->dtype();
  Id fspace{make_space(e.global_shape), H5Sclose};
  Id ftype{h5_type(dt), H5Tclose};
  Id dcpl{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
  H5Pset_fill_time(dcpl.id, H5D_FILL_TIME_NEVER);
  H5Pset_obj_track_times(dcpl.id, false);
  if (!chunk.empty()) {
    std::vector<hsize_t> cd(chunk.begin(), chunk.end());
    H5Pset_chunk(dcpl.id, static_cast<int>(cd.size()), cd.data());
    if (opt.gzip_level > 0) H5Pset_deflate(dcpl.id, static_cast<unsigned>(opt.gzip_level));
  }
  Id dset{H5Dcreate2(file, e.path.c_str(), ftype.id, fspace.id, H5P_DEFAULT, dcpl.id, H5P_DEFAULT), H5Dclose};
  if (dset.id < 0) throw RuntimeFault("create dataset failed" + h5_detail());
  write_string_attr(dset.id, "dtype", runtime::dtype_name(dt));
  write_array_attr(dset.id, "global_shape", H5T_STD_I64LE, H5T_NATIVE_INT64,
                   std::vector<int64_t>(e.global_shape.begin(), e.global_shape.end()));
  write_string_attr(dset.id, "sharding", e.sharding);
  write_string_attr(dset.id, "mesh", opt.mesh);
  // The parts that write something. One (or none) is written straight from its tensor, as with one chip
  // per rank. Several (chips of one rank): with independent writes (no chunk has two writers) one H5Dwrite
  // per part, each straight from its tensor (independent transfers are not collective, so the count per
  // rank is free; one call per block also keeps HDF5 off its element-wise path for irregular selections);
  // with collective writes (compression, shared chunks) one H5Dwrite per rank of the union of the blocks
  // from a packed buffer, so every rank makes the one collective call.
  std::vector<const CheckpointEntry*> active;
  for (const CheckpointEntry* p : parts)
    if (p->write && p->local->numel() > 0) active.push_back(p);
  if (active.size() > 1 && independent) {
    for (const CheckpointEntry* p : active) {
      Id ms{make_space(p->local->shape()), H5Sclose};
      select_block(fspace.id, p->offset, p->local->shape(), true);
      if (H5Dwrite(dset.id, ftype.id, ms.id, fspace.id, xfer.independent, p->local->data()) < 0)
        throw RuntimeFault("write failed: " + last_os_error("") + h5_detail());
    }
    return;
  }
  const CheckpointEntry& b = active.empty() ? e : *active.front();
  const bool any = !active.empty();
  std::vector<unsigned char> packed;
  const void* src = b.local->data();
  Id mspace{-1, H5Sclose};
  if (active.size() <= 1) {
    mspace.id = make_space(b.local->shape());
    select_block(fspace.id, b.offset, b.local->shape(), any);
    if (!any) H5Sselect_none(mspace.id);
  } else {
    std::vector<Piece> pieces;
    for (const CheckpointEntry* p : active)
      pieces.push_back({static_cast<unsigned char*>(const_cast<void*>(p->local->data())), p->offset,
                        p->local->shape()});
    const Packed pk(pieces, e.global_shape, runtime::dtype_size(dt));
    pk.select(fspace.id);
    if (H5Sget_select_npoints(fspace.id) != static_cast<hssize_t>(pk.elements()))
      throw RuntimeFault("internal: the union of the chips' blocks has " +
                         std::to_string(H5Sget_select_npoints(fspace.id)) + " elements, packed " +
                         std::to_string(pk.elements()));
    packed.resize(static_cast<size_t>(pk.elements()) * runtime::dtype_size(dt));
    pk.pack(packed.data());
    mspace.id = make_space(Shape{static_cast<int64_t>(pk.elements())});
    src = packed.data();
  }
  if (H5Dwrite(dset.id, ftype.id, mspace.id, fspace.id, independent ? xfer.independent : xfer.collective, src) < 0)
    throw RuntimeFault("write failed: " + last_os_error("") + h5_detail());
}

// The test hooks after tensor I of a save (SHARDSIM_TEST_CKPT_STALL, SHARDSIM_TEST_CKPT_CRASH).
void test_hooks_after(size_t i, int rank, const std::string& path, const std::string& tensor,
                      const std::string& partial) {
  const auto [crash_rank, crash_after] = crash_hook();
  if (i == 0 && stall_hook() == rank) {  // test hook: a rank that never returns from the write step
    Watch stalled(tensor_where(path, tensor) + "collective write (SHARDSIM_TEST_CKPT_STALL)");
    std::fprintf(stderr, "shardsim: SHARDSIM_TEST_CKPT_STALL: rank %d stops inside a checkpoint write\n", rank);
    std::fflush(stderr);
    while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (rank == crash_rank && static_cast<long>(i) == crash_after) {
    std::fprintf(stderr, "shardsim: SHARDSIM_TEST_CKPT_CRASH: rank %d kills itself after tensor %zu of %s\n", rank,
                 i, partial.c_str());
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
}

// The checksums (SUMS, reduced) on the datasets, then the root attributes; `complete` last.
void write_attributes(hid_t file, const std::string& path, const std::vector<const CheckpointEntry*>& entries,
                      const std::vector<uint64_t>& sums, const std::map<std::string, std::string>& root_attributes,
                      const SaveOptions& opt) {
  nlohmann::json manifest = nlohmann::json::array();
  for (const auto* e : entries) manifest.push_back(e->path);
  for (size_t i = 0; i < entries.size(); ++i) {
    Id dset{H5Dopen2(file, entries[i]->path.c_str(), H5P_DEFAULT), H5Dclose};
    if (dset.id < 0) throw RuntimeFault(tensor_where(path, entries[i]->path) + "reopening failed" + h5_detail());
    write_scalar_attr(dset.id, "checksum", H5T_STD_U64LE, H5T_NATIVE_UINT64, sums[i]);
  }
  write_string_attr(file, "format", kFormat);
  write_scalar_attr(file, "format_version", H5T_STD_I64LE, H5T_NATIVE_INT64, kFormatVersion);
  write_scalar_attr(file, "step", H5T_STD_I64LE, H5T_NATIVE_INT64, opt.step);
  write_string_attr(file, "tensors", manifest.dump());
  write_string_attr(file, "checksum_algorithm", kChecksumDefinition);
  for (const auto& [k, v] : root_attributes) {
    if (k == "format" || k == "format_version" || k == "step" || k == "tensors" || k == "checksum_algorithm" ||
        k == "complete")
      continue;
    write_string_attr(file, k, v);
  }
  // Last: the marker a reader requires. A save that dies before this point leaves no `complete`.
  write_scalar_attr(file, "complete", H5T_STD_I64LE, H5T_NATIVE_INT64, int64_t{1});
}

// The save of one MPI rank. PARTS[i] holds the rank's blocks of tensor i: one with one chip per rank, one per chip
// (in slot order) with several; PARTS[i][0] gives the tensor's path, global shape, dtype and sharding. MISMATCH
// (when not empty): the chips of this rank passed different entries, an agreed RuntimeFault before any I/O.
void save_parts(MPI_Comm comm, const std::string& path, const Parts& parts,
                const std::map<std::string, std::string>& root_attributes, const SaveOptions& opt,
                const std::string& mismatch) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // our errors, not HDF5's stack dumps
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const std::string at = where(path);
  std::vector<const CheckpointEntry*> entries;  // the tensors (each one's first part)
  for (const auto& p : parts) entries.push_back(p.front());
  check_arguments(comm, at, parts, opt, mismatch);

  // Checksums while writing: a thread sums this rank's elements' terms (memory-bound) while the main thread writes
  // (I/O-bound); the sums are reduced and stored as attributes after the data. No MPI and no HDF5 in the thread.
  std::vector<uint64_t> sums(entries.size(), 0);
  std::thread summer([&] {
    for (size_t i = 0; i < parts.size(); ++i)
      for (const CheckpointEntry* e : parts[i])
        if (e->write) sums[i] += checksum_block(*e->local, e->offset, e->global_shape);
  });
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join_summer{summer};

  const Layouts layouts = plan_layouts(comm, parts, entries, opt);
  const uint64_t need = space_needed(entries, root_attributes, opt, layouts.chunks);
  std::string space, target;
  const std::string partial = reserve_side_file(comm, rank, path, need, space, target);
  struct Cleanup {  // rank 0: the side file and the temporary never outlive the save
    int rank;
    const std::string &space, &partial;
    bool keep_partial = false;
    ~Cleanup() {
      if (rank != 0) return;
      ::unlink(space.c_str());
      unregister_temp(space);
      if (!keep_partial) ::unlink(partial.c_str());
      unregister_temp(partial);
    }
  } cleanup{rank, space, partial};
  if (rank == 0) register_temp(partial);  // a SIGINT/SIGTERM handler removes it (apps/main.cpp)
  const hid_t file = create_temp(comm, rank, path, partial);
  try {
    Id f{file, H5Fclose};
    {
      Watch w(at + "reserving space");
      agree(comm, [&] {
        if (rank != 0) return;
        ::unlink(space.c_str());  // hand the side file's blocks over to the HDF5 file
        reserve_space(partial, path, need, need);
      });
    }
    Id dxpl{H5Pcreate(H5P_DATASET_XFER), H5Pclose};
    H5Pset_dxpl_mpio(dxpl.id, H5FD_MPIO_COLLECTIVE);
    Id indep{H5Pcreate(H5P_DATASET_XFER), H5Pclose};
    H5Pset_dxpl_mpio(indep.id, H5FD_MPIO_INDEPENDENT);
    for (size_t i = 0; i < entries.size(); ++i) {
      const auto& e = *entries[i];
      Watch w(tensor_where(path, e.path) + "collective write");
      agree(comm, [&] {
        try {
          write_tensor(f.id, e, parts[i], layouts.chunks[i], layouts.independent[i], opt, {dxpl.id, indep.id});
        } catch (const RuntimeFault& err) {
          throw RuntimeFault(tensor_where(path, e.path) + err.what());
        }
      });
      test_hooks_after(i, rank, path, e.path, partial);
    }
    summer.join();
    if (!sums.empty())
      MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()), MPI_UINT64_T, MPI_SUM, comm);
    {
      Watch w(at + "writing the checksums and the root attributes");
      agree(comm, [&] { write_attributes(f.id, path, entries, sums, root_attributes, opt); });
    }
    {
      Watch w(at + "closing " + partial);
      agree(comm, [&] {
        const hid_t id = f.id;
        f.id = -1;
        if (H5Fclose(id) < 0) {
          const std::string why = last_os_error("") + h5_detail();
          close_everything(id);
          throw RuntimeFault(at + "closing " + partial + " failed: " + why);
        }
      });
    }
  } catch (...) {
    // Every rank is here (errors are agreed) and the file is closed by Id's destructor; Cleanup drops the
    // temporary once every rank has closed it.
    MPI_Barrier(comm);
    throw;
  }
  // Durable, then visible: trim the reservation, fsync the data, rename over PATH atomically, fsync the directory.
  agree(comm, [&] {
    if (rank != 0) return;
    trim_to_superblock_eoa(partial, path);
    commit_temp(partial, target);
    cleanup.keep_partial = true;  // renamed: nothing to remove
  });
}

}  // namespace

void save_checkpoint(MPI_Comm comm, const std::string& path, const std::vector<CheckpointEntry>& entries,
                     const std::map<std::string, std::string>& root_attributes, const SaveOptions& opt) {
  std::vector<std::vector<const CheckpointEntry*>> parts;
  for (const auto& e : entries) parts.push_back({&e});
  save_parts(comm, path, parts, root_attributes, opt, "");
}

void save_checkpoint(const runtime::World& world, const std::string& path, const std::vector<CheckpointEntry>& entries,
                     const std::map<std::string, std::string>& root_attributes, const SaveOptions& opt) {
  if (!world.vcomm()) return save_checkpoint(world.comm(), path, entries, root_attributes, opt);
  // Several chips per rank: the rank's chip 0 saves for all of them (runtime/chips.h, rank_handover).
  runtime::chips::rank_handover(const_cast<std::vector<CheckpointEntry>*>(&entries), [&](const std::vector<void*>& all) {
    std::vector<const std::vector<CheckpointEntry>*> chips;
    for (void* p : all) chips.push_back(static_cast<const std::vector<CheckpointEntry>*>(p));
    std::string mismatch;
    std::vector<std::vector<const CheckpointEntry*>> parts(entries.size());
    for (size_t c = 0; c < chips.size(); ++c) {
      const auto& theirs = *chips[c];
      if (theirs.size() != entries.size()) {
        mismatch = "internal: the chips of a rank save different tensor lists";
        break;
      }
      for (size_t i = 0; i < entries.size(); ++i) {
        const CheckpointEntry& a = theirs[i];
        const CheckpointEntry& b = entries[i];
        if (a.path != b.path || a.global_shape != b.global_shape || a.local->dtype() != b.local->dtype())
          mismatch = "internal: the chips of a rank save tensor '" + a.path + "' and '" + b.path + "' at one place";
        parts[i].push_back(&a);
      }
    }
    if (!mismatch.empty())  // still one save (with its agreed error): the other ranks must not wait
      for (size_t i = 0; i < entries.size(); ++i) parts[i].resize(1);
    save_parts(world.comm(), path, parts, root_attributes, opt, mismatch);
  }, "checkpoint save");
}

}  // namespace shardsim::checkpoint
