#include "common/gnuplot.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

extern char** environ;

namespace shardsim::inline common {

namespace fs = std::filesystem;

std::string gp_quote(const std::string& s) {
  std::string o = "'";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    o += c == '\'' ? std::string("''") : (u < 0x20 || u == 0x7f) ? std::string("?") : std::string(1, c);
  }
  return o + "'";
}

std::string gp_data_string(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    o += c == '"' ? '\'' : (u < 0x20 || u == 0x7f) ? '?' : c;
  }
  return o + "\"";
}

std::string gnuplot_program() {
  const char* env = std::getenv("SHARDSIM_GNUPLOT");
  return env && *env ? env : "gnuplot";
}

int run_gnuplot(const std::string& gnuplot, const std::string& dir, const std::string& script, const std::string& log,
                std::string* why) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addchdir_np(&fa, dir.c_str());
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0644);
  std::vector<std::string> args = {gnuplot, script};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, gnuplot.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    *why = std::strerror(rc);
    return 127;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);  // 127: the child could not exec it (not found)
  *why = "killed by signal " + std::to_string(WTERMSIG(status));
  return -1;
}

std::string draw_gnuplot_scripts(const std::string& dir, const std::vector<std::string>& scripts,
                                 std::vector<std::string>* pngs) {
  const std::string gnuplot = gnuplot_program();
  for (const auto& s : scripts) {
    std::string why;
    const int rc = run_gnuplot(gnuplot, dir, s, s + ".log", &why);
    if (rc == 127) {
      std::error_code ec;
      fs::remove(fs::path(dir) / (s + ".log"), ec);  // the child opened it before it failed to start gnuplot
      return "gnuplot not found ('" + gnuplot + "'" + (why.empty() ? "" : ": " + why) +
             "; apt-get install gnuplot-nox): " + std::to_string(scripts.size()) +
             " plot(s) not drawn; the scripts and data are in " + dir;
    }
    if (rc != 0)
      return "gnuplot failed on " + (fs::path(dir) / s).string() + (why.empty() ? "" : " (" + why + ")") + " (see " +
             (fs::path(dir) / (s + ".log")).string() + ")";
    std::error_code ec;
    fs::remove(fs::path(dir) / (s + ".log"), ec);
    pngs->push_back((fs::path(dir) / (fs::path(s).stem().string() + ".png")).string());
  }
  return "";
}

}  // namespace shardsim::common
