#include "checkpoint/inspect.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <stdexcept>

#include "checkpoint/h5util.h"
#include "common/text.h"

namespace shardsim::checkpoint::detail {

namespace {

// A checkpoint names at most this many objects (groups and datasets); a crafted file with more is refused before
// its manifest is read.
constexpr size_t kMaxObjects = 1u << 20;
// Deflate's best ratio is about 1032:1; a compressed dataset declaring more raw bytes than this many times its
// stored bytes (plus one chunk's worth) cannot have been written by a save.
constexpr uint64_t kMaxDeflateRatio = 1100;

// Names and string attributes a save writes are printable text (the saved config may hold newlines and tabs); a
// crafted file's control characters (terminal escapes, forged lines) are refused before anything echoes them.
void check_text(const std::string& at, const std::string& what, const std::string& v, bool lines = false) {
  for (size_t i = 0; i < v.size(); ++i) {
    const auto c = static_cast<unsigned char>(v[i]);
    if ((c < 0x20 && !(lines && (c == '\n' || c == '\t' || c == '\r'))) || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "%02X", c);
      throw ConfigError(at + "refused: " + what + " contains a control character U+00" + hex + " at position " +
                        std::to_string(i));
    }
  }
}

struct LinkWalk {
  std::set<std::string> datasets;
  std::string bad;  // the first link that is not a hard link, or the overflow
  size_t count = 0;
};

// Every link of the file, visited without following any: the datasets' paths (no leading '/'), or ConfigError
// when a link is soft or external (it would make the reader read another object or another file), or when the
// file holds more than kMaxObjects objects.
std::set<std::string> list_datasets(hid_t file, const std::string& at) {
  LinkWalk walk;
  const herr_t rc = H5Lvisit(
      file, H5_INDEX_NAME, H5_ITER_NATIVE,
      [](hid_t g, const char* name, const H5L_info_t* info, void* data) -> herr_t {
        auto& w = *static_cast<LinkWalk*>(data);
        if (++w.count > kMaxObjects) {
          w.bad = "it holds more than " + std::to_string(kMaxObjects) + " objects";
          return 1;
        }
        if (info->type != H5L_TYPE_HARD) {
          w.bad = std::string(info->type == H5L_TYPE_SOFT ? "a soft" : info->type == H5L_TYPE_EXTERNAL ? "an external"
                                                                                                     : "a user-defined") +
                  " link at '" + name + "' (a checkpoint reads only its own datasets)";
          return 1;
        }
        H5O_info_t oi{};
        if (H5Oget_info_by_name2(g, name, &oi, H5O_INFO_BASIC, H5P_DEFAULT) < 0) {
          w.bad = "object '" + std::string(name) + "' cannot be read" + h5_detail();
          return 1;
        }
        if (oi.type == H5O_TYPE_DATASET) w.datasets.insert(name);
        return 0;
      },
      &walk);
  if (!walk.bad.empty()) throw ConfigError(at + "refused: " + walk.bad);
  if (rc < 0) throw ConfigError(at + "its group structure cannot be read (corrupted?)" + h5_detail());
  return walk.datasets;
}

// The manifest: a JSON array of unique dataset paths that names exactly DATASETS.
std::vector<std::string> read_manifest(hid_t file, const std::string& path, const std::set<std::string>& datasets) {
  const std::string at = where(path);
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(read_string_attr(file, "tensors"));
    if (!manifest.is_array()) throw std::invalid_argument("not an array");
  } catch (const std::exception&) {
    throw ConfigError(at + "the 'tensors' manifest attribute is missing or not a JSON array");
  }
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const auto& m : manifest) {
    if (!m.is_string()) throw ConfigError(at + "the 'tensors' manifest holds a non-string entry");
    std::string name = m.get<std::string>();
    check_text(at, "the tensor name '" + escape_control(name) + "'", name);
    if (!seen.insert(name).second) throw ConfigError(at + "the 'tensors' manifest lists '" + name + "' twice");
    if (!datasets.count(name)) throw ConfigError(tensor_where(path, name) + "listed in the manifest but missing from the file");
    names.push_back(std::move(name));
  }
  for (const auto& d : datasets)
    if (!seen.count(d))
      throw ConfigError(at + "dataset '" + d + "' is not listed in the 'tensors' manifest (the manifest lists " +
                        std::to_string(names.size()) + " of the file's " + std::to_string(datasets.size()) +
                        " datasets)");
  return names;
}

// Chunk dimensions (empty: contiguous) and gzip level of dataset D; ConfigError for a layout a save never writes
// that would make the reader leave the file or trust undeclared storage: virtual datasets, external raw data,
// filters other than deflate, shuffle and fletcher32.
void read_layout(hid_t d, size_t rank, const std::string& tat, nlohmann::json& chunk, int& gzip) {
  Id dcpl{H5Dget_create_plist(d), H5Pclose};
  const H5D_layout_t layout = H5Pget_layout(dcpl.id);
  if (layout == H5D_VIRTUAL) throw ConfigError(tat + "refused: a virtual dataset (it reads other datasets or files)");
  if (H5Pget_external_count(dcpl.id) > 0)
    throw ConfigError(tat + "refused: its data is stored in an external file");
  if (layout != H5D_CHUNKED) return;
  std::vector<hsize_t> cd(rank);
  H5Pget_chunk(dcpl.id, static_cast<int>(cd.size()), cd.data());
  for (hsize_t c : cd) chunk.push_back(static_cast<int64_t>(c));
  const int nf = H5Pget_nfilters(dcpl.id);
  for (int k = 0; k < nf; ++k) {
    unsigned flags = 0, cd_values[8] = {};
    size_t ncd = 8;
    unsigned config = 0;
    char fname[64];
    const H5Z_filter_t id =
        H5Pget_filter2(dcpl.id, static_cast<unsigned>(k), &flags, &ncd, cd_values, sizeof fname, fname, &config);
    if (id == H5Z_FILTER_DEFLATE) gzip = ncd > 0 ? static_cast<int>(cd_values[0]) : 1;
    else if (id != H5Z_FILTER_SHUFFLE && id != H5Z_FILTER_FLETCHER32)
      throw ConfigError(tat + "refused: HDF5 filter " + std::to_string(id) + " (checkpoints use deflate only)");
  }
}

// The declared size of a dataset against what the file stores: the raw bytes (overflow-checked) must be stored
// (unfiltered: at least that many bytes; deflate: within its best ratio) and the storage must fit in the file. A
// crafted file declaring huge dimensions is refused here, before any read.
void check_declared_size(hid_t d, const Shape& dims, size_t esize, int gzip, const Shape& chunk, uint64_t file_bytes,
                         const std::string& tat) {
  uint64_t raw = esize;
  for (int64_t x : dims) {
    if (x < 0 || (x > 0 && raw > UINT64_MAX / static_cast<uint64_t>(x)) || raw * static_cast<uint64_t>(x) > (1ull << 62))
      throw ConfigError(tat + "refused: its declared shape " + runtime::shape_str(dims) + " is too large");
    raw *= static_cast<uint64_t>(x);
  }
  const uint64_t stored = H5Dget_storage_size(d);
  uint64_t chunk_bytes = esize;
  for (int64_t x : chunk) chunk_bytes *= static_cast<uint64_t>(x);
  const bool fits = gzip > 0 ? raw <= stored * kMaxDeflateRatio + chunk_bytes : stored >= raw;
  if (!fits || stored > file_bytes)
    throw ConfigError(tat + "its declared shape " + runtime::shape_str(dims) + " holds " + std::to_string(raw) +
                      " bytes, but the file stores " + std::to_string(stored) + " for it (" +
                      std::to_string(file_bytes) + "-byte file): truncated or crafted");
}

// One tensor's description, its attributes cross-checked with its dataspace and type.
nlohmann::json describe_tensor(hid_t file, const std::string& path, const std::string& name, uint64_t file_bytes) {
  const std::string tat = tensor_where(path, name);
  Id d{H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose};
  if (d.id < 0) throw ConfigError(tat + "cannot open the dataset" + h5_detail());
  bool found = false;
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
  nlohmann::json chunk = nlohmann::json::array();
  int gzip = 0;
  read_layout(d.id, dims.size(), tat, chunk, gzip);
  check_declared_size(d.id, ds, runtime::dtype_size(dt), gzip, chunk.get<Shape>(), file_bytes, tat);
  const std::string sharding = read_string_attr(d.id, "sharding"), mesh = read_string_attr(d.id, "mesh");
  check_text(tat, "its 'sharding' attribute", sharding);
  check_text(tat, "its 'mesh' attribute", mesh);
  return {{"name", name},
          {"dtype", runtime::dtype_name(dt)},
          {"shape", gshape},
          {"sharding", sharding},
          {"mesh", mesh},
          {"checksum", sum[0]},
          {"chunk", chunk},
          {"gzip", gzip},
          {"storage_bytes", static_cast<uint64_t>(H5Dget_storage_size(d.id))}};
}

}  // namespace

nlohmann::json inspect_serial(const std::string& path) {
  const std::string at = where(path);
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) throw ConfigError(at + "cannot open: " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw ConfigError(at + "is a directory, not a checkpoint file");
  if (!S_ISREG(st.st_mode)) throw ConfigError(at + "is not a regular file (a FIFO, device or socket)");
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
  v.clear();
  const bool marker = read_int_attr(f.id, "complete", H5T_NATIVE_INT64, v);
  if (!marker || v.size() != 1 || v[0] != 1) {
    // A marker that is there but cannot be read is a damaged file, not an unfinished save.
    const htri_t exists = H5Aexists(f.id, "complete");
    if (exists < 0 || (exists > 0 && !marker))
      throw ConfigError(at + "corrupted: the root's attributes cannot be read (the 'complete' marker is unreadable)" +
                        h5_detail());
    throw ConfigError(at + "incomplete checkpoint: the save that wrote it did not finish (no 'complete' marker)");
  }
  nlohmann::json out;
  out["step"] = read_int_attr(f.id, "step", H5T_NATIVE_INT64, v) && v.size() == 1 ? v[0] : 0;
  const std::vector<std::string> manifest = read_manifest(f.id, path, list_datasets(f.id, at));
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
  for (const auto& [k, v] : attrs.items()) {
    check_text(at, "an attribute name", k);
    check_text(at, "the root attribute '" + k + "'", v.get<std::string>(), k == "config");
  }
  out["attrs"] = attrs;
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& name : manifest)
    tensors.push_back(describe_tensor(f.id, path, name, static_cast<uint64_t>(st.st_size)));
  out["tensors"] = tensors;
  return out;
}

}  // namespace shardsim::checkpoint::detail
