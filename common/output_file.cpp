#include "common/output_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <unordered_set>

#include "common/error.h"

namespace shardsim::inline common {

namespace {

std::string cause(int err) { return std::strerror(err); }

// dirname / basename without touching the file system ("a/b" -> "a","b"; "b" -> ".","b"; "/b" -> "/","b").
std::pair<std::string, std::string> split_path(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return {".", path};
  size_t end = slash;  // drop repeated slashes before the basename ("a//b" -> "a")
  while (end > 0 && path[end - 1] == '/') --end;
  return {end == 0 ? std::string("/") : std::string(path, 0, end), std::string(path, slash + 1)};
}

mode_t file_mode() {
  static const mode_t mode = [] {
    static std::mutex m;
    std::lock_guard<std::mutex> lock(m);
    const mode_t mask = ::umask(0);
    ::umask(mask);
    return static_cast<mode_t>(0666 & ~mask);
  }();
  return mode;
}

void fsync_dir(const std::string& dir, const std::string& path) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw RuntimeFault("cannot write " + path + ": opening its directory to sync it: " + cause(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory (EINVAL); the rename is still atomic there.
  if (rc != 0 && err != EINVAL && err != EROFS)
    throw RuntimeFault("cannot write " + path + ": syncing its directory: " + cause(err));
}

// The registry of temporaries: fixed slots, so the signal handler reads it without locks or allocation.
constexpr int kSlots = 16;
char g_temp[kSlots][PATH_MAX];
std::atomic<int> g_used[kSlots];
// Set by unlink_registered_temps (the signal handler, on whichever thread the signal reached) before it scans.
std::atomic<int> g_dying{0};

}  // namespace

void register_temp(const std::string& name) {
  if (name.size() >= PATH_MAX) return;
  for (int i = 0; i < kSlots; ++i) {
    int expected = 0;
    if (g_used[i].compare_exchange_strong(expected, 2)) {  // 2: being filled
      std::memcpy(g_temp[i], name.c_str(), name.size() + 1);
      g_used[i].store(1);
      return;
    }
  }
}

void unregister_temp(const std::string& name) {
  for (int i = 0; i < kSlots; ++i)
    if (g_used[i].load() == 1 && name == g_temp[i]) {
      g_used[i].store(0);
      return;
    }
}

void unlink_registered_temps() noexcept {
  g_dying.store(1);
  for (int i = 0; i < kSlots; ++i)
    if (g_used[i].load() == 1) ::unlink(g_temp[i]);
}

std::string output_identity(const std::string& path, const std::string& flag) {
  if (path.empty()) throw UsageError(flag + ": empty path");
  auto [dir, base] = split_path(path);
  if (base.empty() || base == "." || base == "..")
    throw UsageError(flag + " " + path + ": is a directory, need a file path");
  char buf[PATH_MAX];
  if (!::realpath(dir.c_str(), buf))
    throw UsageError(flag + " " + path + ": directory '" + dir + "': " + cause(errno));
  std::string real = buf;
  return real == "/" ? "/" + base : real + "/" + base;
}

void check_replaceable(const std::string& path, const std::string& flag) {
  struct stat st{};
  if (::lstat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode) || S_ISLNK(st.st_mode) || S_ISDIR(st.st_mode)) return;
  throw UsageError(flag + " " + path + ": exists and is not a regular file (a device, FIFO or socket); refusing to "
                   "replace it");
}

namespace {

// Once an output writes to standard output, the text a command prints moves off it (move_text_off_stdout): the
// descriptor of the original standard output (outputs are written through it) and the paths that named it
// (/dev/stdout now names where the text went, so they are remembered as given).
std::atomic<int> g_stdout_fd{-1};
std::mutex g_stdout_mutex;
std::set<std::string> g_stdout_paths;

// The descriptor writing to what standard output was when the command started.
int original_stdout() {
  const int fd = g_stdout_fd.load();
  return fd >= 0 ? fd : STDOUT_FILENO;
}

// STDOUT_FILENO or STDERR_FILENO when ST is the file this process's standard output or error is (standard
// output: as it was before the text moved off it), else -1.
int std_stream_of(const struct stat& st) {
  for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    struct stat s{};
    if (::fstat(fd == STDOUT_FILENO ? original_stdout() : fd, &s) == 0 && s.st_dev == st.st_dev && s.st_ino == st.st_ino)
      return fd;
  }
  return -1;
}

// Character devices an output may be written through: the sinks /dev/null, /dev/zero (major 1; /dev/full, where
// every write fails, is refused before) and
// terminals (/dev/ttyN, /dev/tty, /dev/console, pseudo-terminals). Others (a watchdog, /dev/mem, /dev/kmsg) act
// when opened or written, so they are refused without being opened.
bool writable_char_device(dev_t rdev) {
  const unsigned ma = major(rdev), mi = minor(rdev);
  return (ma == 1 && (mi == 3 || mi == 5 || mi == 7)) || ma == 4 || (ma == 5 && mi <= 1) || (ma >= 136 && ma <= 143);
}

// Stream outputs opened so far, by the path given, kept open until the process ends: a FIFO's reader sees one
// writer from the check before the run to the end (closing after each GrowingOutput row would end its read).
std::mutex g_streams_mutex;
std::map<std::string, int> g_streams;

int stream_fd(const OutputTarget& t, const std::string& flag, bool usage) {
  if (t.std_fd == STDOUT_FILENO) return original_stdout();
  if (t.std_fd >= 0) return t.std_fd;
  std::lock_guard<std::mutex> lock(g_streams_mutex);
  if (auto it = g_streams.find(t.path); it != g_streams.end()) return it->second;
  // Non-blocking, so a FIFO without a reader fails (ENXIO) instead of waiting; blocking again for the writes.
  const int fd = ::open(t.path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    const std::string why = err == ENXIO ? "no process has it open for reading (start the reader first)" : cause(err);
    if (usage) throw UsageError(flag + " " + t.path + ": cannot open it for writing: " + why);
    throw RuntimeFault("cannot write " + t.path + ": " + why);
  }
  if (const int fl = ::fcntl(fd, F_GETFL); fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  g_streams[t.path] = fd;
  return fd;
}

// Every byte of DATA to FD (short writes, EINTR and a non-blocking descriptor's EAGAIN retried). RuntimeFault.
void write_all(int fd, std::string_view data, const std::string& path) {
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd pfd{fd, POLLOUT, 0};
        ::poll(&pfd, 1, -1);
        continue;
      }
      throw RuntimeFault("cannot write " + path + ": " + cause(errno));
    }
    if (n == 0) throw RuntimeFault("cannot write " + path + ": " + cause(ENOSPC));
    p += n;
    left -= static_cast<size_t>(n);
  }
}

// Written through to a stream: stdio's buffers first when it is our standard output or error, so the output
// lands in order with what the command printed.
void write_stream(const OutputTarget& t, std::string_view data) {
  const int fd = stream_fd(t, "output", false);
  if (t.std_fd >= 0) {
    std::cout.flush();
    std::fflush(stdout);
    std::cerr.flush();
    std::fflush(stderr);
  }
  write_all(fd, data, t.path);
}

// The text the command prints (its report, progress rows) moves to standard error: standard output is an output
// now (PATHS name it). The outputs keep writing to the original descriptor.
void move_text_off_stdout(const std::vector<std::string>& paths) {
  std::lock_guard<std::mutex> lock(g_stdout_mutex);
  g_stdout_paths.insert(paths.begin(), paths.end());
  if (g_stdout_fd.load() >= 0) return;
  std::cout.flush();
  std::fflush(stdout);
  const int keep = ::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (keep < 0) throw RuntimeFault("cannot keep standard output for the outputs: " + cause(errno));
  if (::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
    const int err = errno;
    ::close(keep);
    throw RuntimeFault("cannot move the report to standard error: " + cause(err));
  }
  g_stdout_fd.store(keep);
}

// The temporary the write will use can be created next to FILE, now: /proc and /sys pass access(2) and refuse
// creation, and a name within the file system's limit can have a temporary beyond it; both were found after the
// whole run (exit 3). UsageError naming FLAG and PATH.
void probe_temporary(const std::string& file, const std::string& flag, const std::string& path) {
  const std::string base = file + ".partial." + temp_owner_tag() + ".";  // a real temporary's name and length
  int err = EEXIST;
  for (int i = 0; i < 10 && err == EEXIST; ++i) {
    const std::string name = base + "probe" + std::to_string(i);
    const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd >= 0) {
      ::close(fd);
      ::unlink(name.c_str());
      return;
    }
    err = errno;
  }
  throw UsageError(flag + " " + path + ": cannot create a file next to it: " + cause(err) +
                   (err == ENAMETOOLONG ? " (the file name and its temporary's suffix of " +
                                              std::to_string(base.size() + 6 - file.size()) +
                                              " characters must fit the file system's limit, usually 255)"
                                        : std::string()));
}

// What a stream output writes to, for messages.
std::string stream_words(const OutputTarget& t, const struct stat& st) {
  if (t.std_fd == STDOUT_FILENO) return "standard output";
  if (t.std_fd == STDERR_FILENO) return "standard error";
  if (S_ISFIFO(st.st_mode)) return "one pipe";
  return "one device";
}

// /dev/null and /dev/zero: written-through outputs that keep nothing, so two of them cannot interleave.
bool discards(const struct stat& st) {
  return S_ISCHR(st.st_mode) && major(st.st_rdev) == 1 && (minor(st.st_rdev) == 3 || minor(st.st_rdev) == 5);
}

}  // namespace

OutputTarget resolve_output(const std::string& path, const std::string& flag) {
  if (path.empty()) throw UsageError(flag + ": empty path");
  OutputTarget t;
  t.path = path;
  if (g_stdout_fd.load() >= 0) {  // a path that named standard output before the text moved off it still does
    std::lock_guard<std::mutex> lock(g_stdout_mutex);
    if (g_stdout_paths.count(path)) {
      t.stream = true;
      t.std_fd = STDOUT_FILENO;
      return t;
    }
  }
  struct stat lst{};
  if (::lstat(path.c_str(), &lst) != 0) {
    if (errno == ENOTDIR)
      throw UsageError(flag + " " + path + ": '" + split_path(path).first + "' is not a directory");
    return t;  // a new file (a missing or unwritable directory is reported by the caller's checks)
  }
  struct stat st = lst;
  const bool link = S_ISLNK(lst.st_mode);
  if (link && ::stat(path.c_str(), &st) != 0)
    throw UsageError(flag + " " + path + ": a symbolic link to a missing file (" + cause(errno) +
                     "); refusing to replace the link: name the target, or remove the link");
  if (S_ISDIR(st.st_mode)) throw UsageError(flag + " " + path + ": is a directory, need a file path");
  if ((t.std_fd = std_stream_of(st)) >= 0) {
    t.stream = true;
    return t;
  }
  if (S_ISREG(st.st_mode)) {
    if (!link) return t;
    char buf[PATH_MAX];
    if (!::realpath(path.c_str(), buf)) throw UsageError(flag + " " + path + ": resolving the symbolic link: " + cause(errno));
    t.path = buf;  // the link's final target is replaced; the link stays
    return t;
  }
  if (S_ISCHR(st.st_mode) && major(st.st_rdev) == 1 && minor(st.st_rdev) == 7)  // found after the run, exit 3
    throw UsageError(flag + " " + path + (link ? ": links to" : ": is") +
                     " /dev/full, where every write fails (No space left on device)");
  if (S_ISFIFO(st.st_mode) || (S_ISCHR(st.st_mode) && writable_char_device(st.st_rdev))) {
    t.stream = true;
    return t;
  }
  throw UsageError(flag + " " + path + (link ? ": links to " : ": is ") +
                   (S_ISBLK(st.st_mode)    ? "a block device"
                    : S_ISSOCK(st.st_mode) ? "a socket"
                    : S_ISCHR(st.st_mode)  ? "a device other than a terminal or /dev/null"
                                           : "not a regular file") +
                   "; refusing to write to it");
}

std::string resolve_file_output(const std::string& path, const std::string& flag) {
  const OutputTarget t = resolve_output(path, flag);
  if (t.stream)
    throw UsageError(flag + " " + path + ": is (or links to) a stream (standard output, a pipe, a FIFO or a "
                     "device); this output must be a regular file");
  return t.path;
}

namespace {

// The files this process reads (note_input) and those its outputs replace (check_outputs_distinct), each with the
// words or flag that named it; compared live (stat now, so a file since removed or replaced matches nothing).
struct Named {
  std::string name, path, given;  // "a config file" / "--json"; the file; the path as the user gave it
};
std::mutex g_io_mutex;
std::vector<Named> g_inputs, g_outputs;

// A and B are one file now: the same inode of the same device (by a hard link, a bind mount, ../ or a symlink).
bool same_file_now(const std::string& a, const std::string& b) {
  struct stat sa{}, sb{};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  return false;
}

}  // namespace

void note_input(const std::string& path, const std::string& what) {
  std::lock_guard<std::mutex> lock(g_io_mutex);
  for (const Named& o : g_outputs)
    if (same_file_now(path, o.path))
      throw UsageError(o.name + " " + o.given + ": would overwrite " + what + " this command reads (" + path +
                       "); an output never replaces an input");
  g_inputs.push_back({what, path, path});
}

void check_outputs_distinct(const std::vector<std::pair<std::string, std::string>>& outputs,
                            const std::vector<std::pair<std::string, std::string>>& inputs) {
  std::vector<std::string> ids;
  std::vector<size_t> owner;  // which output each id belongs to
  std::vector<std::pair<struct stat, size_t>> streams;  // each stream output's file, its output
  std::vector<std::string> to_stdout;
  for (size_t k = 0; k < outputs.size(); ++k) {
    const auto& [flag, path] = outputs[k];
    const OutputTarget t = resolve_output(path, flag);
    if (t.stream) {  // written through: nothing is replaced; a FIFO must have its reader now
      const int fd = stream_fd(t, flag, true);
      struct stat st{};
      if (::fstat(fd, &st) != 0 || discards(st)) continue;
      for (const auto& [other, j] : streams)  // the same pipe, terminal or standard stream by two names
        if (other.st_dev == st.st_dev && other.st_ino == st.st_ino)
          throw UsageError(flag + " " + path + " and " + outputs[j].first + " " + outputs[j].second + " both write " +
                           stream_words(t, st) + ": two outputs would interleave in one stream; give one of them a file");
      streams.emplace_back(st, k);
      if (t.std_fd == STDOUT_FILENO) to_stdout.push_back(path);
      continue;
    }
    const std::string& file = t.path;
    const std::string dir = split_path(file).first;
    struct stat ds{};
    if (::stat(dir.c_str(), &ds) != 0)
      throw UsageError(flag + " " + path + ": directory '" + dir + "': " + cause(errno));
    if (!S_ISDIR(ds.st_mode)) throw UsageError(flag + " " + path + ": '" + dir + "' is not a directory");
    if (::access(dir.c_str(), W_OK) != 0)
      throw UsageError(flag + " " + path + ": directory '" + dir + "' is not writable: " + cause(errno));
    // A read-only file says "do not replace me" (rename could, since only the directory's permission counts).
    struct stat st{};
    if (::stat(file.c_str(), &st) == 0 && ::access(file.c_str(), W_OK) != 0)
      throw UsageError(flag + " " + path + ": not writable: " + cause(errno));
    probe_temporary(file, flag, path);
    const std::string id = output_identity(file, flag);
    // An existing file is also known by its inode: a hard link (or a bind mount) names the same file by another path.
    struct stat fs{};
    const bool exists = ::stat(file.c_str(), &fs) == 0;
    auto same_inode = [&](const std::string& other) {
      struct stat os{};
      return exists && ::stat(other.c_str(), &os) == 0 && os.st_dev == fs.st_dev && os.st_ino == fs.st_ino;
    };
    for (size_t j = 0; j < ids.size(); ++j)
      if (ids[j] == id || same_inode(ids[j]))
        throw UsageError(flag + " and " + outputs[owner[j]].first + " both write " + id +
                         (ids[j] == id ? "" : " (hard links to one file)"));
    for (const auto& [what, in] : inputs) {
      if (in.empty()) continue;
      char buf[PATH_MAX];
      bool same = ::realpath(in.c_str(), buf) && id == buf;  // the file the input names
      try {
        same = same || output_identity(in, what) == id;  // or the very same name (a symlink to elsewhere)
      } catch (const UsageError&) {
        // the input's directory does not exist: it cannot be this output
      }
      if (same || same_inode(in))
        throw UsageError(flag + " " + path + ": would overwrite " + what + " " + in +
                         (same ? "" : " (the same file: a hard link to it)"));
    }
    {
      std::lock_guard<std::mutex> lock(g_io_mutex);
      for (const Named& in : g_inputs)  // a file this command already read (a config's topology file, a trace)
        if (same_inode(in.path))
          throw UsageError(flag + " " + path + ": would overwrite " + in.name + " this command reads (" + in.given +
                           "); an output never replaces an input");
      g_outputs.push_back({flag, file, path});
    }
    ids.push_back(id);
    owner.push_back(k);
  }
  if (!to_stdout.empty()) move_text_off_stdout(to_stdout);
}

std::string make_output_dir(const std::string& dir) {
  if (dir.empty()) return cause(ENOENT);
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    const std::string prefix = dir.substr(0, slash);  // npos: DIR itself
    if (prefix.back() != '/' && ::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) return cause(errno);
    if (slash == std::string::npos) break;
  }
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) return cause(errno);
  return S_ISDIR(st.st_mode) ? "" : cause(ENOTDIR);
}

TempFile create_temp_for(const std::string& path) {
  for (int attempt = 0;; ++attempt) {
    std::string name = temp_name_for(path);
    const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
      const int err = errno;
      if (err == EEXIST && attempt < 100) continue;  // another writer took the name since temp_name_for looked
      throw RuntimeFault("cannot write " + path + ": creating a temporary file next to it: " + cause(err));
    }
    if (::fchmod(fd, file_mode()) != 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(name.c_str());
      throw RuntimeFault("cannot write " + path + ": " + cause(err));
    }
    return TempFile{fd, std::move(name)};
  }
}

namespace {
// "h" + 8 hex digits of a hash of this host's name: which host a temporary's writer ran on.
std::string host_tag() {
  static const std::string tag = [] {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) host[0] = 0;
    uint32_t h = 2166136261u;  // FNV-1a
    for (const char* c = host; *c; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 16777619u;
    char out[16];
    std::snprintf(out, sizeof out, "h%08x", h);
    return std::string(out);
  }();
  return tag;
}
}  // namespace

std::string temp_owner_tag() {
  std::string tag(1, 'p');
  tag += std::to_string(::getpid());
  tag += host_tag();
  return tag;
}

std::vector<std::string> sweep_stale_temps(const std::string& path) {
  std::vector<std::string> removed;
  const auto [dir, base] = split_path(path);
  const std::string prefix = base + ".partial.p";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return removed;  // the writer reports an unusable directory itself
  const std::string mine = host_tag();
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    // PREFIX <pid> h<8 hex> . <suffix>[.space]
    size_t i = prefix.size(), j = i;
    while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
    if (j == i || j - i > 9 || name.compare(j, mine.size(), mine) != 0 || name.size() <= j + mine.size() ||
        name[j + mine.size()] != '.')
      continue;  // another host's writer, or not our name: never touched
    const pid_t pid = static_cast<pid_t>(std::stol(name.substr(i, j - i)));
    if (pid <= 0 || pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (or unknown)
    const std::string full = (dir == "/" ? "/" : dir + "/") + name;
    struct stat st{};
    if (::lstat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;  // only plain files, never a link
    if (::unlink(full.c_str()) == 0) removed.push_back(full);
  }
  ::closedir(d);
  return removed;
}

std::string temp_name_for(const std::string& path) {
  static const char chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::random_device rd;
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string name = path + ".partial." + temp_owner_tag() + ".";
    for (int i = 0; i < 6; ++i) name += chars[rd() % (sizeof chars - 1)];
    struct stat st{};
    if (::lstat(name.c_str(), &st) == 0) continue;
    if (errno == ENOENT) return name;
    throw RuntimeFault("cannot write " + path + ": " + cause(errno));  // e.g. its "directory" is a regular file
  }
  throw RuntimeFault("cannot write " + path + ": no free temporary name next to it");
}

void commit_temp(const std::string& temp, const std::string& path, bool fsync_temp) {
  auto fail = [&](const std::string& what, int err) {
    ::unlink(temp.c_str());
    throw RuntimeFault("cannot write " + path + ": " + what + cause(err));
  };
  if (fsync_temp) {
    const int fd = ::open(temp.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) fail("", errno);
    const int rc = ::fsync(fd);
    const int err = errno;
    if (::close(fd) != 0 && rc == 0) fail("", errno);
    if (rc != 0) fail("", err);
  }
  try {
    check_replaceable(path, "cannot write");  // the last line of defence for writers that did not check first
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) fail("renaming " + temp + " over it: ", errno);
  fsync_dir(split_path(path).first, path);
}

void settle_registered_temp(const std::string& name) noexcept {
  if (g_dying.load() == 0) return;
  // The handler is removing temporaries and about to end the process; it may have scanned before NAME was
  // registered, so remove it here and wait for the end.
  ::unlink(name.c_str());
  for (;;) ::pause();
}

namespace {
// Registered before it exists and unregistered after it is gone (no signal masks: a process-directed signal may
// run the handler on any thread, e.g. one of MPI's). With settle_registered_temp after the file exists, every
// order of "handler scans" and "this thread registers / creates" removes the file: either the scan sees the
// registration after the file exists, or this thread sees g_dying after creating it.
// The first write of PATH in this process sweeps its dead writers' temporaries (GrowingOutput rewrites PATH per
// row: one directory scan per path, not per row), with a note per removed file.
void sweep_once(const std::string& path) {
  static std::mutex m;
  static std::unordered_set<std::string> swept;
  {
    std::lock_guard<std::mutex> lock(m);
    if (!swept.insert(path).second) return;
  }
  for (const auto& f : sweep_stale_temps(path))
    std::fprintf(stderr, "shardsim: note: removed %s, the temporary of a writer that is gone\n", f.c_str());
}

TempFile create_registered_temp(const std::string& path) {
  sweep_once(path);
  for (int attempt = 0;; ++attempt) {
    std::string name = temp_name_for(path);
    register_temp(name);
    const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
      const int err = errno;
      unregister_temp(name);
      if (err == EEXIST && attempt < 100) continue;  // another writer took the name since temp_name_for looked
      throw RuntimeFault("cannot write " + path + ": creating a temporary file next to it: " + cause(err));
    }
    settle_registered_temp(name);
    if (::fchmod(fd, file_mode()) != 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(name.c_str());
      unregister_temp(name);
      throw RuntimeFault("cannot write " + path + ": " + cause(err));
    }
    TempFile t;
    t.fd = fd;
    t.name = std::move(name);
    return t;
  }
}
}  // namespace

OutputFile::OutputFile(std::string path) : path_(std::move(path)), target_(resolve_output(path_, "output")) {
  if (target_.stream) tmp_.fd = stream_fd(target_, "output", false);
  else tmp_ = create_registered_temp(target_.path);
}

OutputFile::~OutputFile() {
  if (target_.stream) return;  // the stream stays open (stream_fd) and nothing is left to remove
  if (!committed_) {  // removed first, then unregistered (a signal in between unlinks a name that is gone)
    if (tmp_.fd >= 0) ::close(tmp_.fd);
    ::unlink(tmp_.name.c_str());
  }
  unregister_temp(tmp_.name);
}

void OutputFile::write(std::string_view data) {
  if (target_.stream) write_stream(target_, data);
  else write_all(tmp_.fd, data, path_);
}

void OutputFile::commit() {
  if (committed_) return;
  if (target_.stream) {
    committed_ = true;
    return;
  }
  const int fd = tmp_.fd;
  tmp_.fd = -1;
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    throw RuntimeFault("cannot write " + path_ + ": " + cause(err));
  }
  if (::close(fd) != 0) throw RuntimeFault("cannot write " + path_ + ": " + cause(errno));
  commit_temp(tmp_.name, target_.path, false);
  committed_ = true;
}

void write_file_atomic(const std::string& path, std::string_view text) {
  OutputFile f(path);
  f.write(text);
  f.commit();
}

void GrowingOutput::land() const {
  const OutputTarget t = resolve_output(path_, "output");
  if (!t.stream) return write_file_atomic(path_, text_);
  write_stream(t, std::string_view(text_).substr(std::min(landed_, text_.size())));
  landed_ = text_.size();
}

}  // namespace shardsim::common
