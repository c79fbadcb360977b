#include "common/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "common/error.h"

namespace shardsim {

DirLock::DirLock(const std::string& dir, const std::string& holder_text) {
  const std::string file = dir + "/.shardsim.lock";
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0) throw UsageError("output folder " + dir + ": cannot open its lock file " + file + ": " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[512] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK)
      throw UsageError("output folder " + dir + ": cannot lock " + file + ": " + std::strerror(err));
    std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("a process that is starting");
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    throw UsageError("output folder " + dir + " is in use by another command (" + holder +
                     "); wait for it to finish or choose another output folder");
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  char when[32] = {};
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  const std::string text = "pid " + std::to_string(::getpid()) + " on host " + host + ", since " + when + ": " +
                           holder_text + "\n";
  if (::ftruncate(fd_, 0) == 0) {
    const ssize_t w = ::pwrite(fd_, text.data(), text.size(), 0);
    (void)w;  // the text only helps the message of a second locker
  }
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace shardsim
