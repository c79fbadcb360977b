#include "common/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace shardsim {

namespace {
std::string kind_of(mode_t m) {
  if (S_ISDIR(m)) return "is a directory";
  if (S_ISFIFO(m)) return "is not a regular file (a FIFO)";
  if (S_ISSOCK(m)) return "is not a regular file (a socket)";
  if (S_ISCHR(m) || S_ISBLK(m)) return "is not a regular file (a device)";
  return S_ISREG(m) ? "" : "is not a regular file";
}
std::string mib_text(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }
}  // namespace

std::string not_a_regular_file(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return "";
  return kind_of(st.st_mode);
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes, const std::string& what) {
  const std::string at = what + " " + path + ": ";
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw ConfigError(at + "cannot open: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0) throw ConfigError(at + "cannot stat: " + std::strerror(errno));
  if (const std::string k = kind_of(st.st_mode); !k.empty()) throw ConfigError(at + k);
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    throw ConfigError(at + "is " + std::to_string(st.st_size) + " bytes, more than the " + mib_text(max_bytes) +
                      " an input of this kind may have");
  std::string out;
  out.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (true) {
    if (got == out.size()) {
      if (out.size() >= max_bytes) break;  // a file that grew while read: keep the limit
      out.resize(std::min<uint64_t>(max_bytes, out.size() + 65536));
    }
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw ConfigError(at + "cannot read: " + std::strerror(errno));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

}  // namespace shardsim
