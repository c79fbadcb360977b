// common/output_file.h: atomic outputs, exclusive temporaries, output identity.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/error.h"
#include "common/output_file.h"

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

TEST(OutputFile, PlantedSymlinksAreNotFollowed) {
  Scratch s;
  const std::string victim = s / "victim.txt";
  write_file_atomic(victim, "precious\n");
  const std::string p = s / "out.json";
  // A link at the final name and at the old predictable temporary name.
  fs::create_symlink(victim, p + ".partial");
  fs::create_symlink(victim, p);
  write_file_atomic(p, "report\n");
  EXPECT_EQ(slurp(victim), "precious\n");
  EXPECT_FALSE(fs::is_symlink(p)) << "the final name is replaced, not written through";
  EXPECT_EQ(slurp(p), "report\n");
  EXPECT_TRUE(fs::is_symlink(p + ".partial")) << "a planted file is left alone";
}

TEST(OutputFile, SpecialFilesAreNeverReplaced) {
  // As root, rename(2) replaced /dev/full with a YAML file (calibrate --out /dev/full, exit 0). A FIFO stands in
  // for a device here: the up-front check and the commit both refuse with exit 2, naming the path.
  Scratch s;
  const std::string fifo = s / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    check_outputs_distinct({{"--out", fifo}});
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--out " + fifo + ": exists and is not a regular file"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(write_file_atomic(fifo, "data\n"), UsageError);
  struct stat st{};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO is still there";
  EXPECT_EQ(temporaries(s.dir), 0u) << "the refused write left no temporary";
  // Regular files and symlinks (replaced, not followed) are still fine.
  const std::string plain = s / "plain.txt";
  write_file_atomic(plain, "x\n");
  EXPECT_NO_THROW(check_outputs_distinct({{"--out", plain}}));
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
