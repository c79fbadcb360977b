#include "checkpoint/space.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "checkpoint/h5util.h"
#include "checkpoint/layout.h"

namespace shardsim::sharding::detail {

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

}  // namespace shardsim::sharding::detail
