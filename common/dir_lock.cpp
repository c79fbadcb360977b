#include "common/dir_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include "common/error.h"

namespace shardsim {

namespace {

std::string this_host() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}

// True when the process PID of this host is gone or on its way out: no such process, a zombie, exiting (PF_EXITING
// in /proc/PID/stat's flags) or with SIGKILL pending. Its flock is then about to be dropped by the kernel: a killed
// sweep's lock is still taken for the moment between the signal and the process closing its files.
bool dying(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t close = line.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 1));
  std::string state, f;
  unsigned long flags = 0;
  rest >> state;
  for (int field = 4; field <= 9 && rest >> f; ++field)
    if (field == 9) flags = std::stoul(f);
  if (state == "Z" || state == "X" || (flags & 0x4)) return true;  // 0x4: PF_EXITING
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string l; std::getline(status, l);)
    if (l.rfind("SigPnd:", 0) == 0 || l.rfind("ShdPnd:", 0) == 0)
      if (std::stoull(l.substr(7), nullptr, 16) & (1ull << (SIGKILL - 1))) return true;
  return false;
}

// The holder text's pid when it names this host ("pid 123 on host h, ..."), else 0.
pid_t local_holder(const std::string& text) {
  long pid = 0;
  char host[256] = {};
  if (std::sscanf(text.c_str(), "pid %ld on host %255[^,]", &pid, host) != 2 || pid <= 0) return 0;
  return host == this_host() ? static_cast<pid_t>(pid) : 0;
}

std::string read_holder(int fd) {
  char buf[512] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

}  // namespace

DirLock::DirLock(const std::string& dir, const std::string& holder_text) {
  const std::string file = dir + "/.shardsim.lock";
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0) throw UsageError("output folder " + dir + ": cannot open its lock file " + file + ": " + std::strerror(errno));
  // A holder of this host that is dying (killed a moment ago) is waited for, up to 10 s; a live one is not.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    const pid_t pid = local_holder(read_holder(fd_));
    if (pid <= 0 || !dying(pid) || std::chrono::steady_clock::now() > deadline) break;
    ::usleep(20 * 1000);
  }
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
  const std::string host = this_host();
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
