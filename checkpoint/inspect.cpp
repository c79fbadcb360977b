#include "checkpoint/inspect.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "checkpoint/h5util.h"

namespace shardsim::sharding::detail {

nlohmann::json inspect_serial(const std::string& path) {
  const std::string at = where(path);
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) throw ConfigError(at + "cannot open: " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw ConfigError(at + "is a directory, not a checkpoint file");
  if (FILE* fp = std::fopen(path.c_str(), "rb")) {
    std::fclose(fp);
  } else {
    throw ConfigError(at + "cannot open: " + std::strerror(errno));
  }
  if (st.st_size < 8 || H5Fis_hdf5(path.c_str()) <= 0)
    throw ConfigError(at + "not an HDF5 file (empty, truncated before the superblock, or another format)");
  Id f{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  if (f.id < 0)
    throw ConfigError(at + "HDF5 cannot open it: truncated or corrupted (" + std::to_string(st.st_size) + " bytes)" +
                      h5_detail());
  bool found = false;
  if (read_string_attr(f.id, "format", &found) != kFormat)
    throw ConfigError(at + "not a shardsim checkpoint (no format = \"" + kFormat + "\" attribute)");
  std::vector<int64_t> v;
  if (!read_int_attr(f.id, "format_version", H5T_NATIVE_INT64, v) || v.size() != 1 || v[0] != kFormatVersion)
    throw ConfigError(at + "unsupported format_version (this shardsim reads version " +
                      std::to_string(kFormatVersion) + ")");
  if (!read_int_attr(f.id, "complete", H5T_NATIVE_INT64, v) || v.size() != 1 || v[0] != 1)
    throw ConfigError(at + "incomplete checkpoint: the save that wrote it did not finish (no 'complete' marker)");
  nlohmann::json out;
  out["step"] = read_int_attr(f.id, "step", H5T_NATIVE_INT64, v) && v.size() == 1 ? v[0] : 0;
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(read_string_attr(f.id, "tensors"));
    if (!manifest.is_array()) throw std::invalid_argument("not an array");
  } catch (const std::exception&) {
    throw ConfigError(at + "the 'tensors' manifest attribute is missing or not a JSON array");
  }
  // Root string attributes.
  nlohmann::json attrs = nlohmann::json::object();
  H5Aiterate2(
      f.id, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr,
      [](hid_t obj, const char* name, const H5A_info_t*, void* data) -> herr_t {
        bool ok = false;
        std::string s = read_string_attr(obj, name, &ok);
        if (ok) (*static_cast<nlohmann::json*>(data))[name] = s;
        return 0;
      },
      &attrs);
  out["attrs"] = attrs;
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& m : manifest) {
    if (!m.is_string()) throw ConfigError(at + "the 'tensors' manifest holds a non-string entry");
    const std::string name = m.get<std::string>();
    const std::string tat = tensor_where(path, name);
    if (!link_exists(f.id, name)) throw ConfigError(tat + "listed in the manifest but missing from the file");
    Id d{H5Dopen2(f.id, name.c_str(), H5P_DEFAULT), H5Dclose};
    if (d.id < 0) throw ConfigError(tat + "cannot open the dataset" + h5_detail());
    const std::string dts = read_string_attr(d.id, "dtype", &found);
    DType dt;
    try {
      dt = runtime::parse_dtype(dts);
    } catch (const std::invalid_argument&) {
      throw ConfigError(tat + (found ? "unknown dtype attribute '" + dts + "'" : std::string("no dtype attribute")));
    }
    std::vector<int64_t> gshape;
    if (!read_int_attr(d.id, "global_shape", H5T_NATIVE_INT64, gshape))
      throw ConfigError(tat + "no global_shape attribute");
    std::vector<uint64_t> sum;
    if (!read_int_attr(d.id, "checksum", H5T_NATIVE_UINT64, sum) || sum.size() != 1)
      throw ConfigError(tat + "no checksum attribute");
    Id space{H5Dget_space(d.id), H5Sclose};
    const int nd = H5Sget_simple_extent_ndims(space.id);
    std::vector<hsize_t> dims(static_cast<size_t>(std::max(nd, 0)));
    if (nd > 0) H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
    const Shape ds(dims.begin(), dims.end());
    if (nd < 0 || ds != Shape(gshape.begin(), gshape.end()))
      throw ConfigError(tat + "its dataspace " + runtime::shape_str(ds) + " differs from its global_shape attribute " +
                        runtime::shape_str(Shape(gshape.begin(), gshape.end())));
    Id ftype{H5Dget_type(d.id), H5Tclose};
    Id want{h5_type(dt), H5Tclose};
    if (H5Tequal(ftype.id, want.id) <= 0)
      throw ConfigError(tat + "its HDF5 element type does not match its dtype attribute '" + dts + "'");
    Id dcpl{H5Dget_create_plist(d.id), H5Pclose};
    nlohmann::json chunk = nlohmann::json::array();
    int gzip = 0;
    if (H5Pget_layout(dcpl.id) == H5D_CHUNKED) {
      std::vector<hsize_t> cd(dims.size());
      H5Pget_chunk(dcpl.id, static_cast<int>(cd.size()), cd.data());
      for (hsize_t c : cd) chunk.push_back(static_cast<int64_t>(c));
      const int nf = H5Pget_nfilters(dcpl.id);
      for (int k = 0; k < nf; ++k) {
        unsigned flags = 0, cd_values[8] = {};
        size_t ncd = 8;
        unsigned config = 0;
        char fname[64];
        const H5Z_filter_t id = H5Pget_filter2(dcpl.id, static_cast<unsigned>(k), &flags, &ncd, cd_values,
                                               sizeof fname, fname, &config);
        if (id == H5Z_FILTER_DEFLATE) gzip = ncd > 0 ? static_cast<int>(cd_values[0]) : 1;
      }
    }
    tensors.push_back({{"name", name},
                       {"dtype", runtime::dtype_name(dt)},
                       {"shape", gshape},
                       {"sharding", read_string_attr(d.id, "sharding")},
                       {"mesh", read_string_attr(d.id, "mesh")},
                       {"checksum", sum[0]},
                       {"chunk", chunk},
                       {"gzip", gzip},
                       {"storage_bytes", static_cast<uint64_t>(H5Dget_storage_size(d.id))}});
  }
  out["tensors"] = tensors;
  return out;
}

}  // namespace shardsim::sharding::detail
