#include "sharding/checkpoint.h"

#include <hdf5.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "common/error.h"

namespace shardsim::sharding {

using runtime::DType;
using runtime::Shape;
using runtime::Tensor;

namespace {

[[noreturn]] void io_fail(const std::string& path, const std::string& what) {
  throw RuntimeFault("checkpoint " + path + ": " + what);
}

void ok(herr_t rc, const std::string& path, const std::string& what) {
  if (rc < 0) io_fail(path, what + " failed");
}
hid_t ok_id(hid_t id, const std::string& path, const std::string& what) {
  if (id < 0) io_fail(path, what + " failed");
  return id;
}

// RAII for HDF5 ids.
struct Id {
  hid_t id;
  herr_t (*close)(hid_t);
  ~Id() {
    if (id >= 0) close(id);
  }
};

hid_t bf16_type() {
  hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  H5Tset_fields(t, 15, 7, 8, 0, 7);
  H5Tset_offset(t, 0);
  H5Tset_precision(t, 16);
  H5Tset_size(t, 2);
  H5Tset_ebias(t, 127);
  return t;
}

hid_t mem_type(DType t) { return t == DType::fp32 ? H5Tcopy(H5T_NATIVE_FLOAT) : bf16_type(); }

void write_string_attr(hid_t obj, const std::string& name, const std::string& value, const std::string& path) {
  Id type{H5Tcopy(H5T_C_S1), H5Tclose};
  H5Tset_size(type.id, value.empty() ? 1 : value.size());
  H5Tset_strpad(type.id, H5T_STR_NULLTERM);
  Id space{H5Screate(H5S_SCALAR), H5Sclose};
  Id attr{ok_id(H5Acreate2(obj, name.c_str(), type.id, space.id, H5P_DEFAULT, H5P_DEFAULT), path,
                "create attribute " + name),
          H5Aclose};
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  ok(H5Awrite(attr.id, type.id, padded.data()), path, "write attribute " + name);
}

std::string read_string_attr(hid_t obj, const std::string& name, const std::string& path) {
  if (H5Aexists(obj, name.c_str()) <= 0) return "";
  Id attr{ok_id(H5Aopen(obj, name.c_str(), H5P_DEFAULT), path, "open attribute " + name), H5Aclose};
  Id ftype{H5Aget_type(attr.id), H5Tclose};
  const size_t n = H5Tget_size(ftype.id);
  std::string out(n, '\0');
  Id mtype{H5Tcopy(H5T_C_S1), H5Tclose};
  H5Tset_size(mtype.id, n);
  ok(H5Aread(attr.id, mtype.id, out.data()), path, "read attribute " + name);
  out.resize(out.find('\0') == std::string::npos ? n : out.find('\0'));
  return out;
}

void write_dims_attr(hid_t obj, const Shape& shape, const std::string& path) {
  hsize_t n = shape.size();
  Id space{H5Screate_simple(1, &n, nullptr), H5Sclose};
  Id attr{ok_id(H5Acreate2(obj, "global_shape", H5T_STD_I64LE, space.id, H5P_DEFAULT, H5P_DEFAULT), path,
                "create attribute global_shape"),
          H5Aclose};
  ok(H5Awrite(attr.id, H5T_NATIVE_INT64, shape.data()), path, "write attribute global_shape");
}

// Creates intermediate groups of "a/b/c" (collective in parallel HDF5).
void ensure_groups(hid_t file, const std::string& dataset, const std::string& path) {
  for (size_t pos = dataset.find('/'); pos != std::string::npos; pos = dataset.find('/', pos + 1)) {
    const std::string group = dataset.substr(0, pos);
    if (group.empty()) continue;
    if (H5Lexists(file, group.c_str(), H5P_DEFAULT) > 0) continue;
    Id g{ok_id(H5Gcreate2(file, group.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path, "create group " + group),
         H5Gclose};
  }
}

hid_t selection(hid_t space, const Shape& offset, const Shape& count, bool any) {
  if (!any) {
    H5Sselect_none(space);
    return space;
  }
  std::vector<hsize_t> start(offset.begin(), offset.end()), cnt(count.begin(), count.end());
  H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, cnt.data(), nullptr);
  return space;
}

}  // namespace

void save_checkpoint(MPI_Comm comm, const std::string& path, const std::vector<CheckpointEntry>& entries,
                     const std::map<std::string, std::string>& root_attributes) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // our errors, not HDF5's stack dumps
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const std::string partial = path + ".partial";
  {
    Id fapl{H5Pcreate(H5P_FILE_ACCESS), H5Pclose};
    H5Pset_fapl_mpio(fapl.id, comm, MPI_INFO_NULL);
    Id file{H5Fcreate(partial.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id), H5Fclose};
    if (file.id < 0) io_fail(path, "cannot create " + partial + " (is the directory writable?)");
    for (const auto& [k, v] : root_attributes) write_string_attr(file.id, k, v, path);
    Id dxpl{H5Pcreate(H5P_DATASET_XFER), H5Pclose};
    H5Pset_dxpl_mpio(dxpl.id, H5FD_MPIO_COLLECTIVE);
    for (const auto& e : entries) {
      ensure_groups(file.id, e.path, path);
      const DType dt = e.local->dtype();
      std::vector<hsize_t> gdims(e.global_shape.begin(), e.global_shape.end());
      Id fspace{H5Screate_simple(static_cast<int>(gdims.size()), gdims.data(), nullptr), H5Sclose};
      Id ftype{mem_type(dt), H5Tclose};
      Id dset{ok_id(H5Dcreate2(file.id, e.path.c_str(), ftype.id, fspace.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                    path, "create dataset " + e.path),
              H5Dclose};
      write_string_attr(dset.id, "dtype", runtime::dtype_name(dt), path);
      write_string_attr(dset.id, "sharding", e.sharding, path);
      write_dims_attr(dset.id, e.global_shape, path);
      const bool any = e.write && e.local->numel() > 0;
      std::vector<hsize_t> ldims(e.local->shape().begin(), e.local->shape().end());
      Id mspace{H5Screate_simple(static_cast<int>(ldims.size()), ldims.data(), nullptr), H5Sclose};
      selection(fspace.id, e.offset, e.local->shape(), any);
      if (!any) H5Sselect_none(mspace.id);
      ok(H5Dwrite(dset.id, ftype.id, mspace.id, fspace.id, dxpl.id, e.local->data()), path, "write " + e.path);
    }
    ok(H5Fflush(file.id, H5F_SCOPE_GLOBAL), path, "flush");
  }  // file closed (collective) here
  MPI_Barrier(comm);
  int failed = 0;
  if (rank == 0 && std::rename(partial.c_str(), path.c_str()) != 0) {
    failed = 1;
    std::remove(partial.c_str());  // never leave a half-named copy behind
  }
  MPI_Bcast(&failed, 1, MPI_INT, 0, comm);
  if (failed) io_fail(path, "cannot rename " + partial + " to " + path);
}

CheckpointReader::CheckpointReader(MPI_Comm comm, const std::string& path) : path_(path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  Id fapl{H5Pcreate(H5P_FILE_ACCESS), H5Pclose};
  H5Pset_fapl_mpio(fapl.id, comm, MPI_INFO_NULL);
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    std::fclose(f);
  } else {
    throw ConfigError("checkpoint " + path + ": cannot open: " + std::strerror(errno));
  }
  if (H5Fis_hdf5(path.c_str()) <= 0) throw ConfigError("checkpoint " + path + ": not an HDF5 file");
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.id);
  if (file_ < 0) throw ConfigError("checkpoint " + path + ": cannot open");
}

CheckpointReader::~CheckpointReader() {
  if (file_ >= 0) H5Fclose(static_cast<hid_t>(file_));
}

bool CheckpointReader::has(const std::string& dataset) const {
  const hid_t f = static_cast<hid_t>(file_);
  for (size_t pos = 0; pos != std::string::npos;) {
    pos = dataset.find('/', pos + 1);
    const std::string part = dataset.substr(0, pos);
    if (H5Lexists(f, part.c_str(), H5P_DEFAULT) <= 0) return false;
  }
  return true;
}

Shape CheckpointReader::global_shape(const std::string& dataset) const {
  if (!has(dataset)) throw ConfigError("checkpoint " + path_ + ": no dataset '" + dataset + "'");
  Id dset{ok_id(H5Dopen2(static_cast<hid_t>(file_), dataset.c_str(), H5P_DEFAULT), path_, "open " + dataset), H5Dclose};
  Id space{H5Dget_space(dset.id), H5Sclose};
  const int nd = H5Sget_simple_extent_ndims(space.id);
  std::vector<hsize_t> dims(static_cast<size_t>(std::max(nd, 0)));
  H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
  return Shape(dims.begin(), dims.end());
}

DType CheckpointReader::dtype(const std::string& dataset) const {
  if (!has(dataset)) throw ConfigError("checkpoint " + path_ + ": no dataset '" + dataset + "'");
  Id dset{ok_id(H5Dopen2(static_cast<hid_t>(file_), dataset.c_str(), H5P_DEFAULT), path_, "open " + dataset), H5Dclose};
  const std::string name = read_string_attr(dset.id, "dtype", path_);
  try {
    return runtime::parse_dtype(name);
  } catch (const std::invalid_argument&) {
    throw ConfigError("checkpoint " + path_ + ": dataset '" + dataset + "' has unknown dtype attribute '" + name + "'");
  }
}

std::string CheckpointReader::root_attribute(const std::string& name) const {
  return read_string_attr(static_cast<hid_t>(file_), name, path_);
}

void CheckpointReader::read_block(const std::string& dataset, const Shape& offset, Tensor& out) const {
  const Shape g = global_shape(dataset);
  const DType dt = dtype(dataset);
  if (dt != out.dtype())
    throw ConfigError("checkpoint " + path_ + ": dataset '" + dataset + "' is " + runtime::dtype_name(dt) +
                      ", the workload expects " + runtime::dtype_name(out.dtype()));
  if (g.size() != out.rank() || offset.size() != out.rank())
    throw ConfigError("checkpoint " + path_ + ": dataset '" + dataset + "' has shape " + runtime::shape_str(g));
  for (size_t d = 0; d < g.size(); ++d)
    if (offset[d] < 0 || offset[d] + out.dim(d) > g[d])
      throw ConfigError("checkpoint " + path_ + ": dataset '" + dataset + "' has shape " + runtime::shape_str(g) +
                        ", the workload needs block " + runtime::shape_str(out.shape()) + " at " +
                        runtime::shape_str(offset));
  Id dset{ok_id(H5Dopen2(static_cast<hid_t>(file_), dataset.c_str(), H5P_DEFAULT), path_, "open " + dataset), H5Dclose};
  Id fspace{H5Dget_space(dset.id), H5Sclose};
  Id mtype{mem_type(dt), H5Tclose};
  std::vector<hsize_t> ldims(out.shape().begin(), out.shape().end());
  Id mspace{H5Screate_simple(static_cast<int>(ldims.size()), ldims.data(), nullptr), H5Sclose};
  const bool any = out.numel() > 0;
  selection(fspace.id, offset, out.shape(), any);
  if (!any) H5Sselect_none(mspace.id);
  Id dxpl{H5Pcreate(H5P_DATASET_XFER), H5Pclose};
  H5Pset_dxpl_mpio(dxpl.id, H5FD_MPIO_COLLECTIVE);
  ok(H5Dread(dset.id, mtype.id, mspace.id, fspace.id, dxpl.id, out.data()), path_, "read " + dataset);
}

}  // namespace shardsim::sharding
