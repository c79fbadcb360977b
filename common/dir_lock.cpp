#include "common/dir_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/output_file.h"
#include "common/text.h"

namespace shardsim::inline common {

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

// Takes flock(LOCK_EX | LOCK_NB) on the open lock file FD (waiting for a dying holder of this host, up to 10 s).
// Returns 0, or the errno of the failure; HOLDER gets the holder's text when another process holds it.
int take(int fd, std::string& holder) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    const pid_t pid = local_holder(read_holder(fd));
    if (pid <= 0 || !dying(pid) || std::chrono::steady_clock::now() > deadline) break;
    ::usleep(20 * 1000);
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return 0;
  const int err = errno;
  holder = read_holder(fd);
  if (holder.empty()) holder = "a process that is starting";
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
  return err;
}

// Writes "pid 123 on host h, since T: HOLDER_TEXT" into the held lock file FD.
void write_holder(int fd, const std::string& holder_text) {
  char when[32] = {};
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  const std::string text = "pid " + std::to_string(::getpid()) + " on host " + this_host() + ", since " + when +
                           ": " + holder_text + "\n";
  if (::ftruncate(fd, 0) == 0) {
    const ssize_t w = ::pwrite(fd, text.data(), text.size(), 0);
    (void)w;  // the text only helps the message of a second locker
  }
}

}  // namespace

DirLock::DirLock(const std::string& dir, const std::string& holder_text) {
  const std::string file = dir + "/.shardsim.lock";
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0) throw UsageError("output folder " + dir + ": cannot open its lock file " + file + ": " + std::strerror(errno));
  std::string holder;
  if (const int err = take(fd_, holder)) {
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK)
      throw UsageError("output folder " + dir + ": cannot lock " + file + ": " + std::strerror(err));
    throw UsageError("output folder " + dir + " is in use by another command (" + holder +
                     "); wait for it to finish or choose another output folder");
  }
  write_holder(fd_, holder_text);
}

FileLock::FileLock(const std::string& target, const std::string& flag, const std::string& holder_text) {
  const std::string path = resolve_file_output(target, flag);
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  file_ = (slash == std::string::npos ? std::string() : dir) + "." +
          (slash == std::string::npos ? path : path.substr(slash + 1)) + ".lock";
  for (int attempt = 0;; ++attempt) {
    fd_ = ::open(file_.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw UsageError(flag + " " + escape_control(target) + ": cannot open the lock file " + escape_control(file_) +
                       ": " + std::strerror(errno));
    std::string holder;
    if (const int err = take(fd_, holder)) {
      ::close(fd_);
      fd_ = -1;
      if (err != EWOULDBLOCK)
        throw UsageError(flag + " " + escape_control(target) + ": cannot lock " + escape_control(file_) + ": " +
                         std::strerror(err));
      throw UsageError(flag + " " + escape_control(target) + " is in use by another command (" +
                       escape_control(holder) + "); wait for it to finish or choose another file");
    }
    // The holder before us may have removed the lock file after we opened it: then ours is no longer the file
    // the name holds, and a third locker could take the new one. Lock the name again.
    struct stat held {}, named {};
    if (::fstat(fd_, &held) == 0 && ::stat(file_.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
        held.st_ino == named.st_ino)
      break;
    ::close(fd_);
    fd_ = -1;
    if (attempt > 100) throw UsageError(flag + " " + escape_control(target) + ": cannot lock " + escape_control(file_));
  }
  write_holder(fd_, holder_text);
}

FileLock::~FileLock() {
  if (fd_ < 0) return;
  ::unlink(file_.c_str());  // still held: a locker that opened it re-checks the name after its flock
  ::close(fd_);
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace shardsim::common
