#include "common/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/output_file.h"

namespace shardsim::inline common {

namespace {

// "" when ST is a regular file, else why not.
std::string not_regular(const struct stat& st) {
  if (S_ISREG(st.st_mode)) return "";
  if (S_ISDIR(st.st_mode)) return "is a directory";
  return "is not a regular file (a FIFO, device or socket)";
}

}  // namespace

std::string not_a_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? not_regular(st) : "";
}

std::string unreadable_input(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::string("cannot open: ") + std::strerror(errno);
  if (const std::string why = not_regular(st); !why.empty()) return why;
  if (::access(path.c_str(), R_OK) != 0) return std::string("cannot open: ") + std::strerror(errno);
  return "";
}

std::string read_input_file(const std::string& path, size_t max_bytes, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw ConfigError(path + ": cannot open: " + std::strerror(errno));
  if (const std::string why = not_regular(st); !why.empty()) throw ConfigError(path + ": " + why);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw ConfigError(path + ": cannot open: " + std::strerror(errno));
  note_input(path, what);  // never also an output of this command (common/output_file.h)
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  // The name may have been replaced between stat and open: the descriptor is what is read.
  if (::fstat(fd, &st) != 0) throw ConfigError(path + ": cannot open: " + std::strerror(errno));
  if (const std::string why = not_regular(st); !why.empty()) throw ConfigError(path + ": " + why);
  auto too_big = [&] {
    return ConfigError(path + ": larger than " + std::to_string(max_bytes) + " bytes, the limit for " + what);
  };
  if (static_cast<unsigned long long>(st.st_size) > max_bytes) throw too_big();
  std::string out;
  out.reserve(static_cast<size_t>(st.st_size));
  char buf[65536];
  for (;;) {  // reads to the end even if the file grew since fstat, but never past the limit
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw ConfigError(path + ": read error: " + std::strerror(errno));
    if (n == 0) break;
    if (out.size() + static_cast<size_t>(n) > max_bytes) throw too_big();
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace shardsim::common
