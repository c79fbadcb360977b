#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <thread>

#include "common/error.h"
#include "common/output_file.h"
#include "runtime/chips.h"
#include "runtime/engine.h"
#include "runtime/world.h"

namespace shardsim::sharding {

using runtime::DType;
using runtime::Shape;
using runtime::Tensor;

namespace {

constexpr const char* kFormat = "shardsim-checkpoint";
constexpr int64_t kFormatVersion = 1;
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr const char* kChecksumDefinition =
    "sum mod 2^64 over elements i of fmix64(bits_i xor (i * 0x9E3779B97F4A7C15)); i = row-major index in the "
    "global tensor, bits_i = the element's stored bytes as a little-endian unsigned integer, fmix64 = "
    "MurmurHash3 64-bit finalizer";

inline uint64_t fmix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

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

// ---- the last-resort watchdog over collective HDF5 / MPI-IO calls ----
// Every collective HDF5 step of a save or a read runs under a Watch: if it has not returned after
// SHARDSIM_WATCHDOG_S seconds (default 300, 0 = never), one thread of the stuck process prints one line naming the
// file, the step, the chip and the I/O error this rank saw (if any), and aborts the job with exit code 3. It only
// fires when ranks disagree inside HDF5 (e.g. an I/O error that reached some ranks mid-collective); the space
// reservation below makes that rare. A rank that saw an error fires at the limit, the others 2 s later, so the
// line that names the cause is usually the one printed.
class IoWatchdog {
 public:
  static IoWatchdog& get() {
    static IoWatchdog* w = new IoWatchdog();  // never destroyed: its thread may outlive main's statics
    return *w;
  }
  void arm(const std::string& what) {
    std::lock_guard<std::mutex> lock(m_);
    if (limit_s_ <= 0) return;
    what_ = what;
    k_ = runtime::chips_per_rank();  // read here, on the rank's thread (chip mode's state is not for other threads)
    error_.clear();
    deadline_ = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                       std::chrono::duration<double>(limit_s_));
    armed_ = true;
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    cv_.notify_all();
  }
  void note_error(const std::string& e) {
    std::lock_guard<std::mutex> lock(m_);
    if (error_.empty()) error_ = e;
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(m_);
    armed_ = false;
  }

 private:
  IoWatchdog() {
    try {
      limit_s_ = runtime::watchdog_seconds_from_env(300);
    } catch (const Error&) {
      limit_s_ = 300;  // a bad value is reported up front by the CLI
    }
  }
  void loop() {
    std::unique_lock<std::mutex> lock(m_);
    while (true) {
      if (!armed_) {
        cv_.wait(lock);
        continue;
      }
      const auto fire_at = deadline_ + (error_.empty() ? std::chrono::seconds(2) : std::chrono::seconds(0));
      if (cv_.wait_until(lock, fire_at) != std::cv_status::timeout) continue;
      if (!armed_ || std::chrono::steady_clock::now() < fire_at) continue;
      int rank = 0, level = MPI_THREAD_SINGLE;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      MPI_Query_thread(&level);
      // With several chips per rank the rank's chip 0 does the I/O for all of them: name the rank and its chips.
      char who[96];
      if (k_ > 1)
        std::snprintf(who, sizeof who, "rank %d (chips %d..%d)", rank, rank * k_, rank * k_ + k_ - 1);
      else
        std::snprintf(who, sizeof who, "chip %d", rank);
      std::fprintf(stderr,
                   "shardsim: error: %s: no progress for %.0f s on %s (limit SHARDSIM_WATCHDOG_S=%g)%s%s; "
                   "aborting\n",
                   what_.c_str(), limit_s_, who, limit_s_, error_.empty() ? "" : ": ", error_.c_str());
      std::fflush(stderr);
      unlink_registered_temps();  // the final names are untouched anyway; drop the temporaries too
      if (level >= MPI_THREAD_MULTIPLE) MPI_Abort(MPI_COMM_WORLD, kExitRuntimeFault);
      std::_Exit(kExitRuntimeFault);
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::thread thread_;
  double limit_s_ = 300;
  int k_ = 1;
  bool armed_ = false;
  std::string what_, error_;
  std::chrono::steady_clock::time_point deadline_;
};

struct Watch {
  explicit Watch(const std::string& what) { IoWatchdog::get().arm(what); }
  ~Watch() { IoWatchdog::get().disarm(); }
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;
};

// Runs F on every rank of COMM; if it throws on any rank, every rank throws the lowest failing rank's error
// with the same class (ConfigError for exit 2, RuntimeFault otherwise). Callers use it before every collective
// HDF5 call whose arguments depend on rank-local checks, so no rank enters a collective the others skip.
void agree(MPI_Comm comm, const std::function<void()>& f) {
  std::string msg;
  int code = 0;
  try {
    f();
  } catch (const Error& e) {
    msg = e.what();
    code = e.exit_code();
  } catch (const std::exception& e) {
    msg = e.what();
    code = kExitRuntimeFault;
  }
  if (code != 0) IoWatchdog::get().note_error(msg);
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int mine = code != 0 ? rank : size, first = size;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == size) return;
  MPI_Bcast(&code, 1, MPI_INT, first, comm);
  long long n = static_cast<long long>(msg.size());
  MPI_Bcast(&n, 1, MPI_LONG_LONG, first, comm);
  msg.resize(static_cast<size_t>(n));
  if (n > 0) MPI_Bcast(msg.data(), static_cast<int>(n), MPI_CHAR, first, comm);
  if (code == kExitBadInput) throw ConfigError(msg);
  throw RuntimeFault(msg);
}

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

hid_t custom_float(int bits, size_t spos, size_t epos, size_t esize, size_t mpos, size_t msize, size_t bias) {
  hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  H5Tset_fields(t, spos, epos, esize, mpos, msize);
  H5Tset_offset(t, 0);
  H5Tset_precision(t, static_cast<size_t>(bits));
  H5Tset_size(t, static_cast<size_t>(bits / 8));
  H5Tset_ebias(t, bias);
  return t;
}

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

// Reads a string attribute; nullopt-like "" with *found = false when absent.
std::string read_string_attr(hid_t obj, const std::string& name, bool* found = nullptr) {
  if (found) *found = false;
  if (H5Aexists(obj, name.c_str()) <= 0) return "";
  Id attr{H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose};
  if (attr.id < 0) return "";
  Id ftype{H5Aget_type(attr.id), H5Tclose};
  if (H5Tget_class(ftype.id) != H5T_STRING || H5Tis_variable_str(ftype.id) > 0) return "";
  const size_t n = H5Tget_size(ftype.id);
  std::string out(n, '\0');
  Id mtype{H5Tcopy(H5T_C_S1), H5Tclose};
  H5Tset_size(mtype.id, n);
  if (H5Aread(attr.id, mtype.id, out.data()) < 0) return "";
  out.resize(out.find('\0') == std::string::npos ? n : out.find('\0'));
  if (found) *found = true;
  return out;
}

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

bool link_exists(hid_t file, const std::string& dataset) {
  for (size_t pos = 0; pos != std::string::npos;) {
    pos = dataset.find('/', pos + 1);
    const std::string part = dataset.substr(0, pos);
    if (H5Lexists(file, part.c_str(), H5P_DEFAULT) <= 0) return false;
  }
  return true;
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

// Chunk dimensions for a tensor of shape G (empty: contiguous).
Shape chunk_dims(const Chunking& c, const Shape& g, size_t esize) {
  if (c.kind == Chunking::Kind::contiguous || g.empty() || runtime::shape_numel(g) == 0) return {};
  Shape chunk = g;
  if (c.kind == Chunking::Kind::dims && c.dims.size() == g.size()) {
    for (size_t d = 0; d < g.size(); ++d) chunk[d] = std::clamp<int64_t>(c.dims[d], 1, g[d]);
    return chunk;
  }
  const uint64_t target = std::max<uint64_t>(c.bytes, 1);
  for (size_t d = 0; d < g.size(); ++d) {
    uint64_t row = esize;  // bytes of one index of dim d (the trailing dims whole)
    for (size_t k = d + 1; k < g.size(); ++k) row *= static_cast<uint64_t>(chunk[k]);
    if (row <= target) {
      chunk[d] = std::clamp<int64_t>(static_cast<int64_t>(target / row), 1, g[d]);
      break;
    }
    chunk[d] = 1;
  }
  // HDF5 limits a chunk to 4 GiB and 2^32-1 elements.
  return chunk;
}


// One rank's block of a tensor, as every rank learns it before a save (the layout and the transfer mode of each
// tensor are decided from all the blocks, identically on every rank).
struct Block {
  Shape offset, shape;
};

// `auto` layout without compression: when the writers' blocks all have one shape and tile the tensor on a grid
// (Shard(d) over equal shards, or one rank writing a replicated tensor), the chunk IS that block, split along
// dim 0 (by a divisor of its rows) to at most kMaxAlignedChunk: every chunk then has exactly one writer, who
// writes it independently, as one contiguous piece of the file, with no shuffle between ranks. Empty: no such
// layout (uneven shards); the caller falls back to chunk_dims.
constexpr uint64_t kMaxAlignedChunk = 64u << 20, kMinAlignedChunk = 256u << 10;
Shape aligned_chunk(const Shape& g, size_t esize, const std::vector<Block>& writers) {
  if (g.empty() || writers.empty() || runtime::shape_numel(g) == 0) return {};
  const Shape& b = writers.front().shape;
  int64_t covered = 0;
  for (const auto& w : writers) {
    if (w.shape != b) return {};
    for (size_t d = 0; d < g.size(); ++d)
      if (b[d] == 0 || w.offset[d] % b[d] != 0) return {};
    covered += runtime::shape_numel(w.shape);
  }
  if (covered != runtime::shape_numel(g)) return {};
  const uint64_t row = static_cast<uint64_t>(runtime::shape_numel(b) / b[0]) * esize;
  if (row > kMaxAlignedChunk) return {};
  int64_t rows = b[0];
  while (rows > 1 && static_cast<uint64_t>(rows) * row > kMaxAlignedChunk) {
    int64_t next = rows - 1;  // the largest proper divisor of b[0] below rows
    while (next > 1 && b[0] % next != 0) --next;
    rows = next;
  }
  Shape c = b;
  c[0] = rows;
  if (static_cast<uint64_t>(rows) * row < kMinAlignedChunk && static_cast<uint64_t>(runtime::shape_numel(g)) * esize >
                                                                      kMinAlignedChunk)
    return {};  // tiny blocks of a big tensor: fewer, bigger chunks (chunk_dims) read back faster
  return c;
}

// True when every chunk of CHUNK (empty: contiguous) is written by at most one of WRITERS, so independent writes
// never touch a chunk two ranks share.
bool single_writer_per_chunk(const Shape& chunk, const Shape& g, const std::vector<Block>& writers) {
  if (chunk.empty()) return true;  // contiguous: disjoint byte ranges
  for (const auto& w : writers)
    for (size_t d = 0; d < g.size(); ++d) {
      if (w.offset[d] % chunk[d] != 0) return false;
      if (w.shape[d] % chunk[d] != 0 && w.offset[d] + w.shape[d] != g[d]) return false;
    }
  return true;
}

// Several blocks of one tensor moved by one HDF5 transfer (several chips per rank, runtime/chips.h): the file
// selection is the union of the blocks' hyperslabs, and memory is one buffer holding the union's elements in the
// order HDF5 transfers a selection, row-major in the dataset. The blocks are cut into runs (their rows along the
// last dimension: contiguous in memory and in the global row-major index); the union is the merged runs, and each
// run's place in the buffer is its merged interval's offset plus its distance from the interval's start.
// Overlapping blocks (chips of a rank reading the same replicated block) are transferred once.
struct Piece {
  unsigned char* data;
  Shape offset, shape;
};
class Packed {
 public:
  Packed(const std::vector<Piece>& pieces, const Shape& g, size_t esize) : pieces_(pieces), g_(g), esize_(esize) {
    const size_t r = g.size();
    std::vector<uint64_t> gstride(r, 1);
    for (size_t d = r; d-- > 1;) gstride[d - 1] = gstride[d] * static_cast<uint64_t>(g[d]);
    for (const auto& p : pieces) {
      const int64_t n = runtime::shape_numel(p.shape);
      if (n <= 0) continue;
      if (r == 0) {
        runs_.push_back({0, 1, p.data});
        continue;
      }
      const int64_t inner = p.shape[r - 1], rows = n / inner;
      std::vector<int64_t> idx(r, 0);
      for (int64_t row = 0; row < rows; ++row) {
        uint64_t start = static_cast<uint64_t>(p.offset[r - 1]);
        for (size_t d = 0; d + 1 < r; ++d) start += static_cast<uint64_t>(p.offset[d] + idx[d]) * gstride[d];
        runs_.push_back({start, static_cast<uint64_t>(inner), p.data + static_cast<size_t>(row * inner) * esize});
        for (size_t d = r - 1; d-- > 0;) {
          if (++idx[d] < p.shape[d]) break;
          idx[d] = 0;
        }
      }
    }
    std::vector<Run> sorted = runs_;
    std::sort(sorted.begin(), sorted.end(), [](const Run& a, const Run& b) { return a.start < b.start; });
    for (const auto& run : sorted) {
      if (!merged_.empty() && run.start <= merged_.back().start + merged_.back().len) {
        auto& m = merged_.back();
        m.len = std::max(m.len, run.start + run.len - m.start);
      } else {
        merged_.push_back({run.start, run.len, 0});
      }
    }
    for (auto& m : merged_) {
      m.packed = elements_;
      elements_ += m.len;
    }
  }
  uint64_t elements() const { return elements_; }
  // FSPACE's selection becomes the union of the pieces (none when they are all empty).
  void select(hid_t fspace) const {
    H5Sselect_none(fspace);
    if (elements_ == 0) return;
    if (g_.empty()) {
      H5Sselect_all(fspace);
      return;
    }
    bool first = true;
    for (const auto& p : pieces_) {
      if (runtime::shape_numel(p.shape) <= 0) continue;
      std::vector<hsize_t> start(p.offset.begin(), p.offset.end()), cnt(p.shape.begin(), p.shape.end());
      H5Sselect_hyperslab(fspace, first ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), nullptr, cnt.data(), nullptr);
      first = false;
    }
  }
  void pack(unsigned char* buf) const {
    for (const auto& run : runs_) std::memcpy(buf + place(run.start) * esize_, run.p, run.len * esize_);
  }
  void unpack(const unsigned char* buf) const {
    for (const auto& run : runs_) std::memcpy(run.p, buf + place(run.start) * esize_, run.len * esize_);
  }

 private:
  struct Run {
    uint64_t start, len;
    unsigned char* p;
  };
  struct Interval {
    uint64_t start, len, packed;
  };
  uint64_t place(uint64_t start) const {
    auto it = std::upper_bound(merged_.begin(), merged_.end(), start,
                               [](uint64_t v, const Interval& m) { return v < m.start; });
    --it;  // the interval holding START (runs never straddle two: merged intervals are maximal)
    return it->packed + (start - it->start);
  }
  std::vector<Piece> pieces_;
  Shape g_;
  size_t esize_;
  std::vector<Run> runs_;
  std::vector<Interval> merged_;
  uint64_t elements_ = 0;
};

// Test hook: "RANK:N" -> rank RANK kills itself after writing its part of tensor N.
std::pair<int, long> crash_hook() {
  const char* v = std::getenv("SHARDSIM_TEST_CKPT_CRASH");
  if (!v) return {-1, -1};
  int r = -1;
  long n = -1;
  if (std::sscanf(v, "%d:%ld", &r, &n) != 2) return {-1, -1};
  return {r, n};
}

std::string bcast_string(MPI_Comm comm, std::string s) {
  long long n = static_cast<long long>(s.size());
  MPI_Bcast(&n, 1, MPI_LONG_LONG, 0, comm);
  s.resize(static_cast<size_t>(n));
  if (n > 0) MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, 0, comm);
  return s;
}

// Space kept free beyond a save's estimate while the HDF5 file is created, so that even a failed save can close it
// (the close writes the superblock and the root group).
constexpr uint64_t kCloseSlack = 1u << 20;

// Test hook: SHARDSIM_TEST_CKPT_STALL=RANK makes rank RANK stop forever inside the first tensor's write step, so the
// I/O watchdog's bounded exit can be tested. -1 when unset.
int stall_hook() {
  const char* v = std::getenv("SHARDSIM_TEST_CKPT_STALL");
  return v && *v ? std::atoi(v) : -1;
}

// Bytes a save needs on disk at most: the raw data (+0.2% and 1 KiB per chunk for deflate's worst case), the
// attributes, and per-object metadata. Reserved before the first collective write, see save_checkpoint.
uint64_t space_needed(const std::vector<const CheckpointEntry*>& entries,
                      const std::map<std::string, std::string>& attrs, const SaveOptions& opt) {
  uint64_t total = 256u << 10;  // superblock, root group, root attributes' headers, the manifest's slack
  for (const auto& [k, v] : attrs) total += k.size() + v.size() + 256;
  for (const auto* ep : entries) {
    const CheckpointEntry& e = *ep;
    const size_t esize = runtime::dtype_size(e.local->dtype());
    const uint64_t raw = static_cast<uint64_t>(runtime::shape_numel(e.global_shape)) * esize;
    total += raw + (32u << 10) + e.path.size() * 4 + e.sharding.size() + opt.mesh.size();
    const Shape chunk = chunk_dims(opt.chunking, e.global_shape, esize);
    if (!chunk.empty()) {
      const uint64_t cbytes = static_cast<uint64_t>(runtime::shape_numel(chunk)) * esize;
      const uint64_t nchunks = cbytes ? (raw + cbytes - 1) / cbytes : 0;
      total += nchunks * 64;                                            // chunk index entries
      if (opt.gzip_level > 0) total += raw / 500 + nchunks * 1024;  // deflate never grows data more than this
    }
  }
  return total;
}

std::string mib(uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MiB", static_cast<double>(bytes) / 1048576.0);
  return b;
}

// Rank 0: reserves BYTES for FILE (fallocate(2): the blocks are the file's from now on, so no later write of this
// save can meet a full disk or a quota). File systems without fallocate: compares with statvfs instead.
// RuntimeFault naming PATH and the cause ("No space left on device") when the space is not there; the message
// quotes SHOWN bytes as what the checkpoint needs (BYTES may include slack).
void reserve_space(const std::string& file, const std::string& path, uint64_t bytes, uint64_t shown) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) throw RuntimeFault(where(path) + "cannot open " + file + ": " + std::strerror(errno));
  int rc = ::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
  ::close(fd);
  if (rc == EOPNOTSUPP || rc == ENOSYS || rc == EINVAL) {
    struct statvfs vfs{};
    rc = 0;
    if (::statvfs(file.c_str(), &vfs) == 0 && static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize < bytes) rc = ENOSPC;
  }
  if (rc == 0) return;
  std::string free_text;
  struct statvfs vfs{};
  if (::statvfs(file.c_str(), &vfs) == 0)
    free_text = ", " + mib(static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize) + " free";
  throw RuntimeFault(where(path) + std::strerror(rc) + " (the checkpoint needs about " + mib(shown) + free_text + ")");
}

// Rank 0 after the file is closed: cuts the reservation's unused tail, i.e. the file becomes exactly as long as
// HDF5's end-of-file address in the superblock (version 2/3, 8-byte addresses: bytes 28..35). A superblock it
// does not recognise is left alone (the file is valid either way; only the size differs).
void trim_to_superblock_eoa(const std::string& file, const std::string& path) {
  const int fd = ::open(file.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) throw RuntimeFault(where(path) + "cannot open " + file + ": " + std::strerror(errno));
  unsigned char sb[48] = {};
  static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  struct stat st{};
  const bool ok = ::pread(fd, sb, sizeof sb, 0) == static_cast<ssize_t>(sizeof sb) && ::fstat(fd, &st) == 0 &&
                  std::memcmp(sb, sig, 8) == 0 && (sb[8] == 2 || sb[8] == 3) && sb[9] == 8;
  uint64_t base = 0, eoa = 0;
  for (int i = 7; i >= 0; --i) {
    base = (base << 8) | sb[12 + i];
    eoa = (eoa << 8) | sb[28 + i];
  }
  int rc = 0;
  if (ok && base == 0 && eoa > 0 && eoa < static_cast<uint64_t>(st.st_size) && ::ftruncate(fd, static_cast<off_t>(eoa)) != 0)
    rc = errno;
  ::close(fd);
  if (rc != 0) throw RuntimeFault(where(path) + "cannot trim " + file + ": " + std::strerror(rc));
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

hid_t mpio_fapl(MPI_Comm comm, bool /*write*/ = false) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110);
  return fapl;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
Chunking parse_chunking(const std::string& text) {
  Chunking c;
  if (text == "auto" || text.empty()) return c;
  if (text == "contiguous" || text == "none") {
    c.kind = Chunking::Kind::contiguous;
    return c;
  }
  const auto bad = [&] {
    return UsageError("--chunk '" + text + "': expected auto, contiguous, a byte size (256K, 4M) or dims (64x128)");
  };
  if (text.find('x') != std::string::npos) {
    c.kind = Chunking::Kind::dims;
    size_t pos = 0;
    while (pos <= text.size()) {
      const size_t end = std::min(text.find('x', pos), text.size());
      const std::string part = text.substr(pos, end - pos);
      if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos || part.size() > 12) throw bad();
      const int64_t v = std::stoll(part);
      if (v <= 0) throw bad();
      c.dims.push_back(v);
      pos = end + 1;
    }
    return c;
  }
  size_t digits = text.find_first_not_of("0123456789");
  if (digits == 0 || text.size() > 14) throw bad();
  uint64_t v = std::stoull(text.substr(0, digits));
  const std::string suffix = digits == std::string::npos ? "" : text.substr(digits);
  if (suffix == "K" || suffix == "k") v <<= 10;
  else if (suffix == "M" || suffix == "m") v <<= 20;
  else if (suffix == "G" || suffix == "g") v <<= 30;
  else if (!suffix.empty() && suffix != "B") throw bad();
  if (v == 0) throw bad();
  c.kind = Chunking::Kind::bytes;
  c.bytes = v;
  return c;
}

int parse_compression(const std::string& text) {
  if (text == "none" || text.empty()) return 0;
  if (text == "gzip") return 4;
  if (text.size() == 6 && text.rfind("gzip:", 0) == 0 && text[5] >= '1' && text[5] <= '9') return text[5] - '0';
  throw UsageError("--compression '" + text + "': expected none, gzip or gzip:N with N = 1..9");
}

namespace {
// checksum_block over raw memory: BLOCK_SHAPE elements of DT at P.
uint64_t checksum_raw(const void* data, DType dt, const Shape& block_shape, const Shape& off, const Shape& g) {
  const int64_t n = runtime::shape_numel(block_shape);
  if (n == 0) return 0;
  const size_t esz = runtime::dtype_size(dt);
  const auto* p = static_cast<const unsigned char*>(data);
  const size_t r = g.size();
  if (r == 0) {
    uint64_t bits = 0;
    std::memcpy(&bits, p, esz);
    return fmix64(bits);
  }
  std::vector<uint64_t> gstride(r, 1);
  for (size_t d = r - 1; d > 0; --d) gstride[d - 1] = gstride[d] * static_cast<uint64_t>(g[d]);
  const int64_t inner = block_shape[r - 1];
  const int64_t rows = n / inner;
  std::vector<int64_t> idx(r, 0);  // local index of the current row (dims 0..r-2)
  uint64_t sum = 0;
  auto run = [&](auto tag) {
    using U = decltype(tag);
    for (int64_t row = 0; row < rows; ++row) {
      uint64_t base = static_cast<uint64_t>(off[r - 1]);
      for (size_t d = 0; d + 1 < r; ++d) base += static_cast<uint64_t>(off[d] + idx[d]) * gstride[d];
      const unsigned char* q = p + static_cast<size_t>(row * inner) * sizeof(U);
      uint64_t s = 0;
      for (int64_t j = 0; j < inner; ++j) {
        U v;
        std::memcpy(&v, q + static_cast<size_t>(j) * sizeof(U), sizeof(U));
        s += fmix64(static_cast<uint64_t>(v) ^ ((base + static_cast<uint64_t>(j)) * kGolden));
      }
      sum += s;
      for (size_t d = r - 1; d-- > 0;) {  // next row: odometer over dims r-2..0
        if (++idx[d] < block_shape[d]) break;
        idx[d] = 0;
      }
    }
  };
  switch (esz) {
    case 1: run(uint8_t{}); break;
    case 2: run(uint16_t{}); break;
    case 4: run(uint32_t{}); break;
    default: run(uint64_t{}); break;
  }
  return sum;
}
}  // namespace

uint64_t checksum_block(const Tensor& b, const Shape& off, const Shape& g) {
  return checksum_raw(b.data(), b.dtype(), b.shape(), off, g);
}

// ---------------------------------------------------------------------------------------------------------
namespace {

// The save of one MPI rank. PARTS[i] holds the rank's blocks of tensor i: one with one chip per rank, one per chip
// (in slot order) with several; PARTS[i][0] gives the tensor's path, global shape, dtype and sharding. MISMATCH
// (when not empty): the chips of this rank passed different entries, an agreed RuntimeFault before any I/O.
void save_parts(MPI_Comm comm, const std::string& path, const std::vector<std::vector<const CheckpointEntry*>>& parts,
                const std::map<std::string, std::string>& root_attributes, const SaveOptions& opt,
                const std::string& mismatch) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // our errors, not HDF5's stack dumps
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const std::string at = where(path);
  std::vector<const CheckpointEntry*> entries;  // the tensors (each one's first part)
  for (const auto& p : parts) entries.push_back(p.front());
  size_t k_parts = parts.empty() ? 1 : parts.front().size();

  // Arguments, checked on every rank before anything collective.
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

  // Every rank's block of every tensor, so each tensor's layout and transfer mode are decided the same way
  // everywhere: chunks aligned to the writers' blocks when they tile it (see aligned_chunk), and independent
  // writes when no chunk has two writers (no collective in the data path; compression needs collective writes).
  const int nranks = [&] {
    int n = 1;
    MPI_Comm_size(comm, &n);
    return n;
  }();
  std::vector<Shape> chunks(entries.size());
  std::vector<char> independent(entries.size(), 0);
  {
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
      chunks[i] = chunk_dims(opt.chunking, e.global_shape, esize);
      if (opt.chunking.kind == Chunking::Kind::auto_ && opt.gzip_level == 0 && !chunks[i].empty())
        if (Shape a = aligned_chunk(e.global_shape, esize, writers); !a.empty()) chunks[i] = a;
      independent[i] = opt.gzip_level == 0 && single_writer_per_chunk(chunks[i], e.global_shape, writers);
    }
  }

  const auto [crash_rank, crash_after] = crash_hook();
  nlohmann::json manifest = nlohmann::json::array();
  for (const auto* e : entries) manifest.push_back(e->path);

  // The temporary: "PATH.partial.p<PID>h<HOST>.XXXXXX", a fresh random name chosen by rank 0 and created by H5Fcreate with
  // H5F_ACC_EXCL (O_CREAT|O_EXCL: nothing that already exists under that name, e.g. a planted symlink, is ever
  // opened or followed).
  //
  // Space first, before HDF5 or MPI-IO touch the disk: rank 0 reserves what the save needs (plus slack for the
  // close) in a side file "TEMP.space" with fallocate(2). A full disk or quota is then one agreed error before
  // anything collective. Once the HDF5 file exists (H5Fcreate writes nothing yet), rank 0 releases the side file
  // and at once reserves the same space in the HDF5 file itself: no later write of this save can run out of space,
  // so no error can reach some ranks in the middle of a collective MPI-IO write (which would hang the others).
  const uint64_t need = space_needed(entries, root_attributes, opt);
  std::string partial, space;
  {
    Watch w(at + "reserving space");
    agree(comm, [&] {
      if (rank != 0) return;
      // Temporaries of earlier saves whose rank 0 was killed (kill -9: no handler ran) are removed first.
      for (const auto& f : sweep_stale_temps(path))
        std::fprintf(stderr, "shardsim: note: removed %s, the temporary of a save whose writer is gone\n", f.c_str());
      partial = temp_name_for(path);
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
        reserve_space(space, path, need + kCloseSlack, need);
      } catch (...) {
        ::unlink(space.c_str());
        unregister_temp(space);
        throw;
      }
    });
    partial = bcast_string(comm, partial);
  }
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
  hid_t file = -1;
  {
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
  }
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
          ensure_groups(f.id, e.path);
          const DType dt = e.local->dtype();
          Id fspace{make_space(e.global_shape), H5Sclose};
          Id ftype{h5_type(dt), H5Tclose};
          Id dcpl{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
          H5Pset_fill_time(dcpl.id, H5D_FILL_TIME_NEVER);
          H5Pset_obj_track_times(dcpl.id, false);
          const Shape& chunk = chunks[i];
          if (!chunk.empty()) {
            std::vector<hsize_t> cd(chunk.begin(), chunk.end());
            H5Pset_chunk(dcpl.id, static_cast<int>(cd.size()), cd.data());
            if (opt.gzip_level > 0) H5Pset_deflate(dcpl.id, static_cast<unsigned>(opt.gzip_level));
          }
          Id dset{H5Dcreate2(f.id, e.path.c_str(), ftype.id, fspace.id, H5P_DEFAULT, dcpl.id, H5P_DEFAULT), H5Dclose};
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
          for (const CheckpointEntry* p : parts[i])
            if (p->write && p->local->numel() > 0) active.push_back(p);
          if (active.size() > 1 && independent[i]) {
            for (const CheckpointEntry* p : active) {
              Id ms{make_space(p->local->shape()), H5Sclose};
              select_block(fspace.id, p->offset, p->local->shape(), true);
              if (H5Dwrite(dset.id, ftype.id, ms.id, fspace.id, indep.id, p->local->data()) < 0)
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
          if (H5Dwrite(dset.id, ftype.id, mspace.id, fspace.id, independent[i] ? indep.id : dxpl.id, src) < 0)
            throw RuntimeFault("write failed: " + last_os_error("") + h5_detail());
        } catch (const RuntimeFault& err) {
          throw RuntimeFault(tensor_where(path, e.path) + err.what());
        }
      });
      if (i == 0 && stall_hook() == rank) {  // test hook: a rank that never returns from the write step
        Watch stalled(tensor_where(path, e.path) + "collective write (SHARDSIM_TEST_CKPT_STALL)");
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
    summer.join();
    if (!sums.empty())
      MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()), MPI_UINT64_T, MPI_SUM, comm);
    {
      Watch w(at + "writing the checksums and the root attributes");
      agree(comm, [&] {
        for (size_t i = 0; i < entries.size(); ++i) {
          Id dset{H5Dopen2(f.id, entries[i]->path.c_str(), H5P_DEFAULT), H5Dclose};
          if (dset.id < 0) throw RuntimeFault(tensor_where(path, entries[i]->path) + "reopening failed" + h5_detail());
          write_scalar_attr(dset.id, "checksum", H5T_STD_U64LE, H5T_NATIVE_UINT64, sums[i]);
        }
        write_string_attr(f.id, "format", kFormat);
        write_scalar_attr(f.id, "format_version", H5T_STD_I64LE, H5T_NATIVE_INT64, kFormatVersion);
        write_scalar_attr(f.id, "step", H5T_STD_I64LE, H5T_NATIVE_INT64, opt.step);
        write_string_attr(f.id, "tensors", manifest.dump());
        write_string_attr(f.id, "checksum_algorithm", kChecksumDefinition);
        for (const auto& [k, v] : root_attributes) {
          if (k == "format" || k == "format_version" || k == "step" || k == "tensors" || k == "checksum_algorithm" ||
              k == "complete")
            continue;
          write_string_attr(f.id, k, v);
        }
        // Last: the marker a reader requires. A save that dies before this point leaves no `complete`.
        write_scalar_attr(f.id, "complete", H5T_STD_I64LE, H5T_NATIVE_INT64, int64_t{1});
      });
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
    commit_temp(partial, path);
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

// ---------------------------------------------------------------------------------------------------------
namespace {

// Rank 0's serial structural check of a checkpoint. Returns the description as JSON or throws ConfigError.
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

}  // namespace

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
    if (rank == 0) desc = inspect_serial(path).dump();
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

}  // namespace shardsim::sharding
