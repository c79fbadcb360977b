#include "checkpoint/space.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include "checkpoint/h5util.h"
#include "checkpoint/layout.h"

namespace shardsim::checkpoint::detail {

uint64_t space_needed(const std::vector<const CheckpointEntry*>& entries,
                      const std::map<std::string, std::string>& attrs, const SaveOptions& opt,
                      const std::vector<Shape>& chunks) {
  uint64_t total = kBaseMetadata;
  for (const auto& [k, v] : attrs) total += k.size() + v.size() + kPerAttribute;
  std::set<std::string> groups;
  for (size_t i = 0; i < entries.size(); ++i) {
    const CheckpointEntry& e = *entries[i];
    for (size_t pos = e.path.find('/'); pos != std::string::npos; pos = e.path.find('/', pos + 1))
      groups.insert(e.path.substr(0, pos));
    const size_t esize = runtime::dtype_size(e.local->dtype());
    const uint64_t raw = static_cast<uint64_t>(runtime::shape_numel(e.global_shape)) * esize;
    // The data, the dataset's header and attributes, its link and its manifest entry.
    total += raw + kPerTensor + e.path.size() * 4 + e.sharding.size() + opt.mesh.size();
    const Shape& chunk = i < chunks.size() ? chunks[i] : Shape{};
    if (!chunk.empty()) {
      uint64_t nchunks = 1;  // chunks per dimension, rounded up (edge chunks are stored whole)
      for (size_t d = 0; d < chunk.size(); ++d)
        nchunks *= static_cast<uint64_t>((e.global_shape[d] + chunk[d] - 1) / std::max<int64_t>(chunk[d], 1));
      const uint64_t cbytes = static_cast<uint64_t>(runtime::shape_numel(chunk)) * esize;
      total += nchunks * 64;                         // chunk index entries
      total += nchunks * cbytes > raw ? nchunks * cbytes - raw : 0;  // edge chunks' padding
      if (opt.gzip_level > 0) total += raw / 500 + nchunks * 1024;  // deflate never grows data more than this
    }
  }
  return total + groups.size() * kPerGroup;
}

std::string mib(uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f MiB", static_cast<double>(bytes) / 1048576.0);
  return b;
}

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
  throw RuntimeFault(where(path) + std::strerror(rc) + " (the save reserves " + mib(shown) +
                     " for the data and a bound on its metadata" + free_text + ")");
}

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

}  // namespace shardsim::checkpoint::detail
