#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checksum.h"
#include "checkpoint/h5util.h"
#include "checkpoint/inspect.h"
#include "checkpoint/layout.h"
#include "checkpoint/watchdog.h"
#include "common/error.h"
#include "runtime/chips.h"
#include "runtime/world.h"

namespace shardsim::checkpoint {

using namespace detail;

CheckpointReader::CheckpointReader(MPI_Comm comm, const std::string& path) : comm_(comm), path_(path) { open(path); }

CheckpointReader::CheckpointReader(const runtime::World& world, const std::string& path)
    : comm_(world.comm()), path_(path) {
  if (!world.vcomm()) {
    open(path);
    return;
  }
  // Several chips per rank: the rank's chip 0 opens the file for all of them; they share that reader.
  std::shared_ptr<CheckpointReader> mine;
  runtime::chips::rank_handover(&mine, [&](const std::vector<void*>& all) {
    auto r = std::make_shared<CheckpointReader>(world.comm(), path);
    for (void* p : all) *static_cast<std::shared_ptr<CheckpointReader>*>(p) = r;
  }, "checkpoint open");
  rank_ = std::move(mine);
  tensors_ = rank_->tensors_;
  root_attrs_ = rank_->root_attrs_;
  step_ = rank_->step_;
}

void CheckpointReader::open(const std::string& path) {
  MPI_Comm comm = comm_;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  // 1. rank 0 checks the structure serially; everyone learns the verdict before any collective HDF5 call.
  std::string desc;
  agree(comm, [&] {
    if (rank == 0) desc = inspect_serial(path).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  });
  const nlohmann::json j = nlohmann::json::parse(bcast_string(comm, desc));
  step_ = j.at("step").get<int64_t>();
  for (const auto& [k, v] : j.at("attrs").items()) root_attrs_[k] = v.get<std::string>();
  for (const auto& t : j.at("tensors")) {
    TensorInfo ti;
    ti.name = t.at("name").get<std::string>();
    ti.dtype = runtime::parse_dtype(t.at("dtype").get<std::string>());
    ti.shape = t.at("shape").get<Shape>();
    ti.sharding = t.at("sharding").get<std::string>();
    ti.mesh = t.at("mesh").get<std::string>();
    ti.checksum = t.at("checksum").get<uint64_t>();
    ti.chunk = t.at("chunk").get<Shape>();
    ti.gzip_level = t.at("gzip").get<int>();
    ti.storage_bytes = t.at("storage_bytes").get<uint64_t>();
    tensors_.push_back(std::move(ti));
  }
  // 2. the collective open of a file that passed.
  Watch w(where(path) + "collective open");
  agree(comm, [&] {
    Id fapl{mpio_fapl(comm), H5Pclose};
    file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.id);
    if (file_ < 0) throw ConfigError(where(path) + "cannot open it collectively" + h5_detail());
  });
}

CheckpointReader::~CheckpointReader() {
  if (file_ >= 0) H5Fclose(static_cast<hid_t>(file_));
}

bool CheckpointReader::has(const std::string& dataset) const {
  return std::any_of(tensors_.begin(), tensors_.end(), [&](const TensorInfo& t) { return t.name == dataset; });
}

const TensorInfo& CheckpointReader::info(const std::string& dataset) const {
  for (const auto& t : tensors_)
    if (t.name == dataset) return t;
  throw ConfigError(tensor_where(path_, dataset) + "missing (the checkpoint has no such tensor)");
}

std::string CheckpointReader::root_attribute(const std::string& name) const {
  const auto it = root_attrs_.find(name);
  return it == root_attrs_.end() ? "" : it->second;
}

void CheckpointReader::read_block(const std::string& dataset, const Shape& offset, Tensor& out) const {
  read_raw(dataset, offset, out.shape(), out.dtype(), out.data());
}

void CheckpointReader::read_block_verified(const std::string& dataset, const Shape& offset, Tensor& out,
                                           bool counts) const {
  Part part{offset, out.shape(), out.data(), counts, &dataset, out.dtype(), nullptr};
  if (rank_) {  // several chips per rank: the rank's chip 0 reads for all of them
    runtime::chips::rank_handover(&part, [&](const std::vector<void*>& all) {
      std::vector<Part> parts;
      for (void* p : all) parts.push_back(*static_cast<Part*>(p));
      rank_->read_parts_verified(dataset, out.dtype(), parts);
    }, "checkpoint verified read");
    return;
  }
  read_parts_verified(dataset, out.dtype(), {part});
}

void CheckpointReader::read_parts_verified(const std::string& dataset, DType dtype, const std::vector<Part>& parts) const {
  read_parts(dataset, dtype, parts);
  const TensorInfo& ti = info(dataset);  // read_parts agreed that it exists
  uint64_t v[2] = {0, 0};
  for (const Part& p : parts)
    if (p.counts) {
      v[0] += checksum_raw(p.data, dtype, p.shape, p.offset, ti.shape);
      v[1] += static_cast<uint64_t>(runtime::shape_numel(p.shape));
    }
  MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_UINT64_T, MPI_SUM, comm_);
  const auto numel = static_cast<uint64_t>(runtime::shape_numel(ti.shape));  // 1 for a scalar
  if (v[1] != numel) {
    verify({dataset});
    return;
  }
  if (v[0] != ti.checksum) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "checksum mismatch (stored 0x%016llx, data gives 0x%016llx): the data is corrupted",
                  static_cast<unsigned long long>(ti.checksum), static_cast<unsigned long long>(v[0]));
    throw ConfigError(tensor_where(path_, dataset) + buf);
  }
}

void CheckpointReader::read_raw(const std::string& dataset, const Shape& offset, const Shape& shape, DType dtype,
                                void* data) const {
  Part part{offset, shape, data, false, &dataset, dtype, nullptr};
  if (rank_) {  // several chips per rank: the rank's chip 0 reads for all of them
    runtime::chips::rank_handover(&part, [&](const std::vector<void*>& all) {
      std::vector<Part> parts;
      for (void* p : all) parts.push_back(*static_cast<Part*>(p));
      rank_->read_parts(dataset, dtype, parts);
    }, "checkpoint read");
    return;
  }
  read_parts(dataset, dtype, {part});
}

void CheckpointReader::read_parts(const std::string& dataset, DType dtype, const std::vector<Part>& parts) const {
  const TensorInfo* ti = nullptr;
  agree(comm_, [&] {
    ti = &info(dataset);
    const Shape& g = ti->shape;
    const std::string at = tensor_where(path_, dataset);
    for (const Part& p : parts) {
      const Shape &offset = p.offset, &shape = p.shape;
      if ((p.dataset && *p.dataset != dataset) || p.dtype != dtype)
        throw RuntimeFault(at + "internal: the chips of a rank read different tensors at one place");
      if (ti->dtype != dtype)
        throw ConfigError(at + "is " + runtime::dtype_name(ti->dtype) + ", the workload expects " +
                          runtime::dtype_name(dtype));
      if (g.size() != shape.size() || offset.size() != shape.size())
        throw ConfigError(at + "has shape " + runtime::shape_str(g) + ", the workload expects rank " +
                          std::to_string(shape.size()));
      for (size_t d = 0; d < g.size(); ++d)
        if (offset[d] < 0 || offset[d] + shape[d] > g[d])
          throw ConfigError(at + "has shape " + runtime::shape_str(g) + ", the workload needs block " +
                            runtime::shape_str(shape) + " at " + runtime::shape_str(offset));
    }
  });
  // One part that reads something (or none): straight into it, as with one chip per rank. Several (chips of one
  // rank) of an unfiltered tensor (independent reads, not collective): each distinct block read straight into its
  // chip's tensor, one H5Dread each, and copied to the chips that ask for the same block. Several of a compressed
  // tensor (collective reads): one read of the union of their blocks into a packed buffer, then each block copied
  // out, so every rank makes the one collective call.
  std::vector<Piece> pieces;
  for (const Part& p : parts)
    if (runtime::shape_numel(p.shape) > 0) pieces.push_back({static_cast<unsigned char*>(p.data), p.offset, p.shape});
  if (pieces.size() > 1 && ti->gzip_level == 0) {
    Watch w(tensor_where(path_, dataset) + "read");
    const size_t esize = runtime::dtype_size(dtype);
    agree(comm_, [&] {
      Id dset{H5Dopen2(static_cast<hid_t>(file_), dataset.c_str(), H5P_DEFAULT), H5Dclose};
      if (dset.id < 0) throw ConfigError(tensor_where(path_, dataset) + "cannot open the dataset" + h5_detail());
      Id fspace{H5Dget_space(dset.id), H5Sclose};
      Id mtype{h5_type(ti->dtype), H5Tclose};
      Id dxpl{H5Pcreate(H5P_DATASET_XFER), H5Pclose};
      H5Pset_dxpl_mpio(dxpl.id, H5FD_MPIO_INDEPENDENT);
      for (size_t j = 0; j < pieces.size(); ++j) {
        const Piece& pc = pieces[j];
        const auto same = std::find_if(pieces.begin(), pieces.begin() + static_cast<std::ptrdiff_t>(j),
                                       [&](const Piece& o) { return o.offset == pc.offset && o.shape == pc.shape; });
        if (same != pieces.begin() + static_cast<std::ptrdiff_t>(j)) {
          std::memcpy(pc.data, same->data, static_cast<size_t>(runtime::shape_numel(pc.shape)) * esize);
          continue;
        }
        Id ms{make_space(pc.shape), H5Sclose};
        select_block(fspace.id, pc.offset, pc.shape, true);
        if (H5Dread(dset.id, mtype.id, ms.id, fspace.id, dxpl.id, pc.data) < 0)
          throw ConfigError(tensor_where(path_, dataset) + "reading the data failed (corrupted or truncated file?)" +
                            h5_detail());
      }
    });
    return;
  }
  const Part& one = pieces.size() == 1 ? *std::find_if(parts.begin(), parts.end(), [](const Part& p) {
    return runtime::shape_numel(p.shape) > 0;
  }) : parts.front();
  const Shape &offset = one.offset, &shape = one.shape;
  void* data = one.data;
  std::unique_ptr<Packed> packed;
  std::vector<unsigned char> buffer;
  if (pieces.size() > 1) {
    packed = std::make_unique<Packed>(pieces, ti->shape, runtime::dtype_size(dtype));
    buffer.resize(static_cast<size_t>(packed->elements()) * runtime::dtype_size(dtype));
  }
  Watch w(tensor_where(path_, dataset) + "collective read");
  agree(comm_, [&] {
    Id dset{H5Dopen2(static_cast<hid_t>(file_), dataset.c_str(), H5P_DEFAULT), H5Dclose};
    if (dset.id < 0) throw ConfigError(tensor_where(path_, dataset) + "cannot open the dataset" + h5_detail());
    Id fspace{H5Dget_space(dset.id), H5Sclose};
    Id mtype{h5_type(ti->dtype), H5Tclose};
    Id mspace{-1, H5Sclose};
    if (packed) {
      packed->select(fspace.id);
      if (H5Sget_select_npoints(fspace.id) != static_cast<hssize_t>(packed->elements()))
        throw RuntimeFault(tensor_where(path_, dataset) + "internal: the union of the chips' blocks has " +
                           std::to_string(H5Sget_select_npoints(fspace.id)) + " elements, packed " +
                           std::to_string(packed->elements()));
      mspace.id = make_space(Shape{static_cast<int64_t>(packed->elements())});
      data = buffer.data();
    } else {
      mspace.id = make_space(shape);
      const bool any = runtime::shape_numel(shape) > 0;
      select_block(fspace.id, offset, shape, any);
      if (!any) H5Sselect_none(mspace.id);
    }
    // Unfiltered data: each rank reads its own block independently (no shuffle through aggregators, and an error
    // stays local until agreed); compressed chunks: collectively.
    Id dxpl{H5Pcreate(H5P_DATASET_XFER), H5Pclose};
    H5Pset_dxpl_mpio(dxpl.id, ti->gzip_level > 0 ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT);
    if (H5Dread(dset.id, mtype.id, mspace.id, fspace.id, dxpl.id, data) < 0)
      throw ConfigError(tensor_where(path_, dataset) + "reading the data failed (corrupted or truncated file?)" +
                        h5_detail());
  });
  if (packed) packed->unpack(buffer.data());
}

std::vector<uint64_t> CheckpointReader::verify(const std::vector<std::string>& datasets, uint64_t slab_bytes) const {
  if (rank_) {  // several chips per rank: the rank's chip 0 verifies (every rank's share), every chip gets the sums
    std::vector<uint64_t> out;
    Part part{};
    part.verified = &out;
    runtime::chips::rank_handover(&part, [&](const std::vector<void*>& all) {
      const auto sums = rank_->verify(datasets, slab_bytes);
      for (void* p : all) *static_cast<Part*>(p)->verified = sums;
    }, "checkpoint verify");
    return out;
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(comm_, &rank);
  MPI_Comm_size(comm_, &size);
  std::vector<std::string> names = datasets;
  if (names.empty())
    for (const auto& t : tensors_) names.push_back(t.name);
  std::vector<uint64_t> out;
  std::vector<unsigned char> buffer;
  for (const auto& name : names) {
    const TensorInfo* ti = nullptr;
    agree(comm_, [&] { ti = &info(name); });
    const Shape& g = ti->shape;
    uint64_t sum = 0;
    if (runtime::shape_numel(g) > 0) {
      // Rows (dim 0) split over the ranks; each rank reads its rows in slabs of at most slab_bytes. Every rank
      // makes the same number of (collective) reads: the largest part's slab count.
      const int64_t rows = g.empty() ? 1 : g[0];
      const uint64_t row_bytes = runtime::dtype_size(ti->dtype) * static_cast<uint64_t>(runtime::shape_numel(g) / rows);
      const int64_t per = rows / size, extra = rows % size;
      const int64_t my_rows = per + (rank < extra ? 1 : 0);
      const int64_t my_first = rank * per + std::min<int64_t>(rank, extra);
      const int64_t max_rows = per + (extra ? 1 : 0);
      const int64_t slab_rows = std::max<int64_t>(1, static_cast<int64_t>(slab_bytes / std::max<uint64_t>(row_bytes, 1)));
      const int64_t nslabs = (max_rows + slab_rows - 1) / slab_rows;
      for (int64_t s = 0; s < nslabs; ++s) {
        const int64_t r0 = std::min(my_rows, s * slab_rows);
        const int64_t rn = std::min(my_rows - r0, slab_rows);
        Shape bs = g, off(g.size(), 0);
        if (!g.empty()) {
          bs[0] = rn;
          off[0] = my_first + r0;
        }
        if (g.empty()) {  // a rank-0 tensor: one element; every rank reads it (collective), rank 0 counts it
          Tensor one(ti->dtype, Shape{});
          read_block(name, {}, one);
          if (rank == 0) sum += checksum_block(one, {}, {});
          break;
        }
        // One buffer for every slab of every tensor: fresh pages cost more than the reads on some hosts.
        const size_t need = static_cast<size_t>(rn) * row_bytes;
        if (buffer.size() < need) buffer.resize(need);
        read_raw(name, off, bs, ti->dtype, buffer.data());
        sum += checksum_raw(buffer.data(), ti->dtype, bs, off, g);
      }
    }
    MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_UINT64_T, MPI_SUM, comm_);
    if (sum != ti->checksum) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "checksum mismatch (stored 0x%016llx, data gives 0x%016llx): the data is corrupted",
                    static_cast<unsigned long long>(ti->checksum), static_cast<unsigned long long>(sum));
      throw ConfigError(tensor_where(path_, name) + buf);
    }
    out.push_back(sum);
  }
  return out;
}

}  // namespace shardsim::checkpoint
