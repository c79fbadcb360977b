#include "checkpoint/h5util.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace shardsim::checkpoint::detail {

std::string where(const std::string& path) { return "checkpoint " + path + ": "; }
std::string tensor_where(const std::string& path, const std::string& t) {
  return "checkpoint " + path + ": tensor '" + t + "': ";
}

// The innermost HDF5 error message of the current error stack (why an HDF5 call failed), or "".
std::string h5_detail() {
  std::string msg;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* e, void* out) -> herr_t {
        if (n == 0 && e->desc) *static_cast<std::string*>(out) = e->desc;
        return 0;
      },
      &msg);
  return msg.empty() ? msg : " (HDF5: " + msg + ")";
}

namespace {
hid_t custom_float(int bits, size_t spos, size_t epos, size_t esize, size_t mpos, size_t msize, size_t bias) {
  hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  H5Tset_fields(t, spos, epos, esize, mpos, msize);
  H5Tset_offset(t, 0);
  H5Tset_precision(t, static_cast<size_t>(bits));
  H5Tset_size(t, static_cast<size_t>(bits / 8));
  H5Tset_ebias(t, bias);
  return t;
}
}  // namespace

// The HDF5 type a dtype is stored as (file and memory: no conversion on read or write). Caller closes it.
hid_t h5_type(DType t) {
  switch (t) {
    case DType::int8: return H5Tcopy(H5T_STD_I8LE);
    case DType::uint8: return H5Tcopy(H5T_STD_U8LE);
    case DType::int32: return H5Tcopy(H5T_STD_I32LE);
    case DType::uint32: return H5Tcopy(H5T_STD_U32LE);
    case DType::int64: return H5Tcopy(H5T_STD_I64LE);
    case DType::uint64: return H5Tcopy(H5T_STD_U64LE);
    case DType::fp16: return custom_float(16, 15, 10, 5, 0, 10, 15);
    case DType::bf16: return custom_float(16, 15, 7, 8, 0, 7, 127);
    case DType::fp32: return H5Tcopy(H5T_IEEE_F32LE);
    case DType::fp64: return H5Tcopy(H5T_IEEE_F64LE);
    case DType::fp8_e4m3: return H5Tcopy(H5T_STD_U8LE);  // raw E4M3FN bits (see checkpoint.h)
    case DType::fp8_e5m2: return custom_float(8, 7, 2, 5, 0, 2, 15);
  }
  return H5Tcopy(H5T_STD_U8LE);
}

void write_string_attr(hid_t obj, const std::string& name, const std::string& value) {
  Id type{H5Tcopy(H5T_C_S1), H5Tclose};
  H5Tset_size(type.id, value.empty() ? 1 : value.size());
  H5Tset_strpad(type.id, H5T_STR_NULLTERM);
  Id space{H5Screate(H5S_SCALAR), H5Sclose};
  Id attr{H5Acreate2(obj, name.c_str(), type.id, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
  if (attr.id < 0) throw RuntimeFault("create attribute " + name + " failed" + h5_detail());
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  if (H5Awrite(attr.id, type.id, padded.data()) < 0) throw RuntimeFault("write attribute " + name + " failed");
}

// Every HDF5 string form h5py or h5dump may leave (the checkpoint stays h5py-editable): fixed length with
// NULLTERM, NULLPAD or SPACEPAD padding, variable length, ASCII or UTF-8, scalar or a one-element array.
std::string read_string_attr(hid_t obj, const std::string& name, bool* found) {
  if (found) *found = false;
  if (H5Aexists(obj, name.c_str()) <= 0) return "";
  Id attr{H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose};
  if (attr.id < 0) return "";
  Id ftype{H5Aget_type(attr.id), H5Tclose};
  if (H5Tget_class(ftype.id) != H5T_STRING) return "";
  Id space{H5Aget_space(attr.id), H5Sclose};
  if (H5Sget_simple_extent_npoints(space.id) != 1) return "";
  std::string out;
  if (H5Tis_variable_str(ftype.id) > 0) {
    Id mtype{H5Tcopy(H5T_C_S1), H5Tclose};
    H5Tset_size(mtype.id, H5T_VARIABLE);
    H5Tset_cset(mtype.id, H5Tget_cset(ftype.id));
    char* p = nullptr;
    if (H5Aread(attr.id, mtype.id, &p) < 0) return "";
    if (p) out = p;
    H5Dvlen_reclaim(mtype.id, space.id, H5P_DEFAULT, &p);
  } else {
    // Read the bytes as stored (the file type as memory type: no conversion, which would cut a NULLPAD or
    // SPACEPAD string that fills its size to make room for a terminator), then drop the padding.
    const size_t n = H5Tget_size(ftype.id);
    if (n == 0 || n > kMaxStringAttr) return "";
    out.assign(n, '\0');
    if (H5Aread(attr.id, ftype.id, out.data()) < 0) return "";
    const H5T_str_t pad = H5Tget_strpad(ftype.id);
    if (pad == H5T_STR_SPACEPAD) {
      const size_t last = out.find_last_not_of(' ');
      out.resize(last == std::string::npos ? 0 : last + 1);
    } else {
      out.resize(std::min(out.find('\0'), n));
    }
  }
  if (found) *found = true;
  return out;
}

// Creates the intermediate groups of "a/b/c" (collective in parallel HDF5).
void ensure_groups(hid_t file, const std::string& dataset) {
  for (size_t pos = dataset.find('/'); pos != std::string::npos; pos = dataset.find('/', pos + 1)) {
    const std::string group = dataset.substr(0, pos);
    if (group.empty()) continue;
    if (H5Lexists(file, group.c_str(), H5P_DEFAULT) > 0) continue;
    Id gcpl{H5Pcreate(H5P_GROUP_CREATE), H5Pclose};
    H5Pset_obj_track_times(gcpl.id, false);  // no timestamps: the same data gives the same bytes
    Id g{H5Gcreate2(file, group.c_str(), H5P_DEFAULT, gcpl.id, H5P_DEFAULT), H5Gclose};
    if (g.id < 0) throw RuntimeFault("create group " + group + " failed" + h5_detail());
  }
}

void select_block(hid_t space, const Shape& offset, const Shape& count, bool any) {
  if (!any || count.empty()) {
    if (!any) H5Sselect_none(space);
    return;
  }
  std::vector<hsize_t> start(offset.begin(), offset.end()), cnt(count.begin(), count.end());
  H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, cnt.data(), nullptr);
}

hid_t make_space(const Shape& s) {
  if (s.empty()) return H5Screate(H5S_SCALAR);
  std::vector<hsize_t> d(s.begin(), s.end());
  return H5Screate_simple(static_cast<int>(d.size()), d.data(), nullptr);
}

// Closes every HDF5 object still open in this process (after a failed H5Fclose, so nothing is left for HDF5's
// shutdown inside MPI_Finalize to flush into an MPI file that is already in an error state).
void close_everything(hid_t) {
  const ssize_t n = H5Fget_obj_count(static_cast<hid_t>(H5F_OBJ_ALL), H5F_OBJ_ALL);
  if (n <= 0) return;
  std::vector<hid_t> ids(static_cast<size_t>(n));
  const ssize_t got = H5Fget_obj_ids(static_cast<hid_t>(H5F_OBJ_ALL), H5F_OBJ_ALL, static_cast<size_t>(n), ids.data());
  for (ssize_t i = 0; i < got; ++i) {
    switch (H5Iget_type(ids[static_cast<size_t>(i)])) {
      case H5I_DATASET: H5Dclose(ids[static_cast<size_t>(i)]); break;
      case H5I_GROUP: H5Gclose(ids[static_cast<size_t>(i)]); break;
      case H5I_ATTR: H5Aclose(ids[static_cast<size_t>(i)]); break;
      case H5I_DATATYPE: H5Tclose(ids[static_cast<size_t>(i)]); break;
      default: break;
    }
  }
  for (ssize_t i = 0; i < got; ++i)
    if (H5Iget_type(ids[static_cast<size_t>(i)]) == H5I_FILE) H5Fclose(ids[static_cast<size_t>(i)]);
}

// Why an I/O call failed, in the C library's words when errno says so, else FALLBACK.
std::string last_os_error(const std::string& fallback) {
  const int e = errno;
  if (e == ENOSPC || e == EDQUOT || e == EFBIG || e == EROFS || e == EIO || e == EACCES || e == EPERM)
    return std::strerror(e);
  return fallback;
}

hid_t mpio_fapl(MPI_Comm comm, bool /*write*/) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110);
  return fapl;
}

std::string bcast_string(MPI_Comm comm, std::string s) {
  long long n = static_cast<long long>(s.size());
  MPI_Bcast(&n, 1, MPI_LONG_LONG, 0, comm);
  s.resize(static_cast<size_t>(n));
  if (n > 0) MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, 0, comm);
  return s;
}

}  // namespace shardsim::checkpoint::detail
