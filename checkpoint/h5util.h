// Internal to checkpoint/: the HDF5 helpers every part of the checkpoint code uses (ids, element types, attributes,
// dataspaces, groups, the MPI-IO file access list) and the names of the format's root attributes. Not installed;
// include only from checkpoint/*.cpp (it pulls in hdf5.h).
#pragma once

#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "runtime/tensor.h"

namespace shardsim::checkpoint::detail {

using runtime::DType;
using runtime::Shape;
using runtime::Tensor;

inline constexpr const char* kFormat = "shardsim-checkpoint";
inline constexpr int64_t kFormatVersion = 1;

// Message prefixes: "checkpoint PATH: " and "checkpoint PATH: tensor 'T': ".
std::string where(const std::string& path);
std::string tensor_where(const std::string& path, const std::string& t);

// The innermost HDF5 error message of the current error stack (why an HDF5 call failed), or "".
std::string h5_detail();

// RAII for HDF5 ids.
struct Id {
  hid_t id;
  herr_t (*close)(hid_t);
  Id(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  ~Id() {
    if (id >= 0) close(id);
  }
};

// The HDF5 type a dtype is stored as (file and memory: no conversion on read or write). Caller closes it.
hid_t h5_type(DType t);

// Attributes. write_*: RuntimeFault when HDF5 refuses.
void write_string_attr(hid_t obj, const std::string& name, const std::string& value);

template <typename T>
void write_array_attr(hid_t obj, const std::string& name, hid_t file_type, hid_t mem_type, const std::vector<T>& v) {
  hsize_t n = v.size();
  Id space{n == 0 ? H5Screate(H5S_NULL) : H5Screate_simple(1, &n, nullptr), H5Sclose};
  Id attr{H5Acreate2(obj, name.c_str(), file_type, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
  if (attr.id < 0) throw RuntimeFault("create attribute " + name + " failed" + h5_detail());
  if (n > 0 && H5Awrite(attr.id, mem_type, v.data()) < 0) throw RuntimeFault("write attribute " + name + " failed");
}

template <typename T>
void write_scalar_attr(hid_t obj, const std::string& name, hid_t file_type, hid_t mem_type, T v) {
  Id space{H5Screate(H5S_SCALAR), H5Sclose};
  Id attr{H5Acreate2(obj, name.c_str(), file_type, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
  if (attr.id < 0) throw RuntimeFault("create attribute " + name + " failed" + h5_detail());
  if (H5Awrite(attr.id, mem_type, &v) < 0) throw RuntimeFault("write attribute " + name + " failed");
}

// The longest fixed-length string attribute read (the manifest of a very large model is a few MiB).
inline constexpr size_t kMaxStringAttr = 64u << 20;

// Reads a string attribute in any of HDF5's string forms (fixed length with NULLTERM, NULLPAD or SPACEPAD
// padding, or variable length; ASCII or UTF-8; scalar or one element); "" with *found = false when absent, not a
// string, or not one element.
std::string read_string_attr(hid_t obj, const std::string& name, bool* found = nullptr);

// Reads a numeric attribute (any size) into int64/uint64 values; false when absent or not an integer.
template <typename T>
bool read_int_attr(hid_t obj, const std::string& name, hid_t mem_type, std::vector<T>& out) {
  if (H5Aexists(obj, name.c_str()) <= 0) return false;
  Id attr{H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose};
  if (attr.id < 0) return false;
  Id ftype{H5Aget_type(attr.id), H5Tclose};
  if (H5Tget_class(ftype.id) != H5T_INTEGER) return false;
  Id space{H5Aget_space(attr.id), H5Sclose};
  const hssize_t n = H5Sget_simple_extent_npoints(space.id);
  if (n < 0) return false;
  out.assign(static_cast<size_t>(n), 0);
  if (n > 0 && H5Aread(attr.id, mem_type, out.data()) < 0) return false;
  return true;
}

// Creates the intermediate groups of "a/b/c" (collective in parallel HDF5).
void ensure_groups(hid_t file, const std::string& dataset);
// SPACE's selection: the block COUNT at OFFSET, or none when !ANY.
void select_block(hid_t space, const Shape& offset, const Shape& count, bool any);
// A simple dataspace of shape S (scalar when S is empty). Caller closes it.
hid_t make_space(const Shape& s);

// Closes every HDF5 object still open in this process (after a failed H5Fclose, so nothing is left for HDF5's
// shutdown inside MPI_Finalize to flush into an MPI file that is already in an error state).
void close_everything(hid_t);
// Why an I/O call failed, in the C library's words when errno says so, else FALLBACK.
std::string last_os_error(const std::string& fallback);
// A file access list for parallel HDF5 over COMM (file format bounds HDF5 1.10). Caller closes it.
hid_t mpio_fapl(MPI_Comm comm, bool write = false);
// Rank 0's S on every rank of COMM.
std::string bcast_string(MPI_Comm comm, std::string s);

}  // namespace shardsim::checkpoint::detail
