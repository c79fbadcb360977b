// The shardsim command line. Thin: parses arguments, calls the libraries, prints, maps errors to exit codes
// (0 ok, 1 validation failed, 2 bad input/usage, 3 runtime fault; see common/error.h).
#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <cctype>
#include <map>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <filesystem>
#include <new>
#include <vector>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "apps/commands.h"
#include "apps/profile.h"
#include "common/error.h"
#include "common/number.h"
#include "common/text.h"
#include "kernels/gemm.h"
#include "runtime/chips.h"
#include "runtime/host_memory.h"
#include "runtime/engine.h"
#include "runtime/world.h"
#include "apps/cli_common.h"
#include "common/config.h"
#include "common/output_file.h"
#include "sharding/engine_config.h"

namespace {

// SIGINT / SIGTERM (Ctrl-C, `kill`, mpirun or a batch system passing a signal on): every output lands atomically,
// so there is nothing half written to repair; the handler removes the temporaries in flight, one rank prints one
// line (the first signalled on rank 0's node), and the process exits with 128 + the signal number, as shells report it (130 for SIGINT, 143 for SIGTERM).
int g_world_rank = 0;
// Set once the command has its outcome: a signal after that (mpirun taking the other ranks down when one of them
// has already exited non-zero) must not add a second line or change the exit code.
volatile sig_atomic_t g_decided_exit = -1;

// The standard output a folded attempt holds back (StdoutHold below): the temporary file's descriptor and the saved
// standard output, -1 when nothing is held. unhold_stdout puts standard output back and, with KEEP, writes what was
// held to it; system calls only (async-signal-safe), so the signal handler and exit_job's hook use it too and an
// interrupted or failing run keeps what it printed. False if that failed (a closed pipe, a full disk).
volatile sig_atomic_t g_held_fd = -1, g_saved_stdout = -1;
bool unhold_stdout(bool keep) {
  const int held = g_held_fd, saved = g_saved_stdout;
  if (held < 0 || saved < 0) return true;
  g_held_fd = -1;
  g_saved_stdout = -1;
  bool ok = ::dup2(saved, STDOUT_FILENO) >= 0;
  ::close(saved);
  if (!keep || !ok || ::lseek(held, 0, SEEK_SET) != 0) return ok && !keep;
  char buf[1 << 14];
  for (ssize_t n; (n = ::read(held, buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    for (ssize_t off = 0; off < n;) {
      const ssize_t w = ::write(STDOUT_FILENO, buf + off, static_cast<size_t>(n - off));
      if (w > 0) off += w;
      else if (w < 0 && errno != EINTR) return false;
    }
  }
  return true;
}
extern "C" void release_held_stdout() { (void)unhold_stdout(true); }
// exit_job's hook (runtime/world.h): stdio's buffer into the held file first, then out.
void release_held_stdout_at_exit() {
  if (g_held_fd < 0) return;
  std::cout.flush();
  std::fflush(stdout);
  release_held_stdout();
}

extern "C" void on_terminating_signal(int sig) {
  release_held_stdout();
  shardsim::unlink_registered_temps();
  if (g_decided_exit >= 0) ::_exit(g_decided_exit);
  namespace board = shardsim::runtime::wait_board;
  // The first rank of the node to be signalled (or to fail) claims the one report line. A later signal is mpirun
  // taking the other ranks down after that: quiet, with the claimer's code (a watchdog or an error: exit 3), so
  // SIGINT to one rank of four reports "SIGINT ... 130" once, not rank 0's SIGTERM from mpirun.
  // Only rank 0's node speaks (one line per job, not per node).
  const bool use_board = board::available() && board::on_this_node(0);
  const bool speak = use_board ? board::claim(128 + sig) : g_world_rank == 0;
  if (!speak && use_board) {
    const int reason = board::claim_reason();
    ::_exit(reason > 128 ? reason : shardsim::kExitRuntimeFault);
  }
  if (speak) {
    const char* msg = sig == SIGINT   ? "shardsim: interrupted by SIGINT; exiting with code 130 (outputs are left as "
                                        "they were before the interrupted write)\n"
                      : sig == SIGHUP ? "shardsim: hung up (SIGHUP); exiting with code 129 (outputs are left as "
                                        "they were before the interrupted write)\n"
                                      : "shardsim: terminated by SIGTERM; exiting with code 143 (outputs are left as "
                                        "they were before the interrupted write)\n";
    ssize_t rc = ::write(STDERR_FILENO, msg, std::strlen(msg));
    (void)rc;
  }
  ::_exit(128 + sig);
}

// A flag given as '' (`--json ''`, `--trace-window ''`) was ignored as if absent, and `--checkpoint ''` fell back to
// the config's path: every flag given must have a value (issue 46, kinds 7 and 8). Positionals (a config path) too.
void refuse_empty_values(const CLI::App& app) {
  static const std::set<std::string> kPathFlags = {"--json", "--trace", "--plots", "--checkpoint", "--resume",
                                                   "--csv", "--out", "--output", "--requests"};
  for (const CLI::App* sub : app.get_subcommands()) {
    for (const CLI::Option* o : sub->get_options())
      if (o->count() > 0 && o->get_expected_min() > 0)
        for (const std::string& r : o->results())
          if (r.empty())
            throw CLI::ValidationError(o->get_name(), kPathFlags.count(o->get_name()) ? "an empty path" : "an empty value");
    refuse_empty_values(*sub);
  }
}

// Flags that set one config key twice: the later one won silently (`--set model.seq=4 --set model.seq=8`, `--plan
// tp=2 --set parallel.tp=4`, `--bandwidth 10 --set topology.bandwidth_gbps=50`). The user's flags only: a --what-if
// change is applied over them on purpose.
void refuse_repeated_keys(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) {
    std::vector<std::pair<std::string, std::string>> given;  // key path (model. read as workload.), the flag
    auto add = [&](std::string path, const std::string& flag) {
      if (path.rfind("model.", 0) == 0) path = "workload." + path.substr(6);
      for (const auto& [k, f] : given)
        if (k == path)
          throw CLI::ValidationError(f + " and " + flag + " both set " +
                                     (path.rfind("workload.", 0) == 0 ? "model." + path.substr(9) : path) +
                                     "; give it once");
      given.emplace_back(std::move(path), flag);
    };
    auto results = [&](const char* name) {
      const CLI::Option* o = sub->get_option_no_throw(name);
      return o && o->count() > 0 ? o->results() : std::vector<std::string>();
    };
    const auto sets = results("--set");
    if (!sets.empty()) {
      if (!results("--bandwidth").empty()) add("topology.bandwidth_gbps", "--bandwidth");
      if (!results("--latency").empty()) add("topology.latency_ns", "--latency");
      for (const std::string& plan : results("--plan")) {
        std::vector<std::string> keys;  // each once (a key twice in the plan is --plan's own "given twice")
        try {
          for (const std::string& item : shardsim::split_items(plan))
            if (const size_t eq = item.find('='); eq != std::string::npos && eq > 0 &&
                std::find(keys.begin(), keys.end(), item.substr(0, eq)) == keys.end())
              keys.push_back(item.substr(0, eq));
        } catch (const std::invalid_argument&) {
          keys.clear();  // --plan says what is wrong with it
        }
        for (const std::string& k : keys) add("parallel." + k, "--plan " + shardsim::escape_control(plan));
      }
      for (const std::string& item : sets)
        if (const size_t eq = item.find('='); eq != std::string::npos && eq > 0)
          add(item.substr(0, eq), "--set " + shardsim::escape_control(item));
    }
    refuse_repeated_keys(*sub);
  }
}

void install_signal_handlers(int world_rank) {
  g_world_rank = world_rank;
  struct sigaction sa{};
  sa.sa_handler = on_terminating_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);  // a closed terminal: the same clean end (temporaries removed, one line)
}

constexpr const char* kDefaultConfig = SHARDSIM_CONFIG_DIR "/workloads/llama2_7b_mlp_tp8.yaml";

// The default config lives in the source tree this binary was built from. Reports name it relative to the working
// directory when that lies inside the tree (configs/... from the root, ../configs/... from out/), else by the path
// it is read from.
std::string default_config_path() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  const fs::path tree = fs::path(SHARDSIM_CONFIG_DIR).parent_path();
  if (ec || cwd.lexically_relative(tree).empty() || *cwd.lexically_relative(tree).begin() == "..") return kDefaultConfig;
  return fs::path(kDefaultConfig).lexically_relative(cwd).string();
}

// `run`: the forward mode of the one executor (apps/commands.h's run_forward) for every model config: a language
// model, a block stack (kind: transformer_block) or the MLP-only block stack (kind: mlp). Every rank loads and
// checks the same config inside World::agree, so a bad input is one line from rank 0 and exit 2 on every rank;
// after that point the run's own failures are exit 3. WHAT_IF (--what-if): after the run, each change
// re-simulated in shape-only mode (apps/profile.h).
int cmd_run(const shardsim::runtime::World& world, const std::string& config_path, const std::string& json_path,
            const shardsim::apps::RunOptions& opt, const shardsim::sharding::ConfigOverrides& overrides,
            const std::string& what_if) {
  return shardsim::apps::run_forward(world, config_path, json_path, opt, overrides, what_if);
}

// The most chips one rank hosts (docs/SECURITY.md): the chips' fibers and their per-peer state grow with the
// square of the chip count (1,024 chips: 7.6 s for an 8-byte all_reduce; 2,048: 31 s).
constexpr long kMaxChipsPerRank = 4096;
// The most chips of a folded run on one rank (of which only one data-parallel replica runs; the rest is mirrored).
constexpr long kMaxFoldedChips = 262144;

std::string gib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GiB", bytes / 1073741824.0);
  return b;
}

// --chips-per-rank K / --chips N (anywhere on the command line): how many chips each rank hosts
// (runtime/chips.h). Taken out of ARGS before the command line is parsed, because the chips must exist before
// the command runs on each of them. Returns K, or -1 after rank 0 printed why the flags are bad.
int take_chip_flags(std::vector<std::string>& args, int ranks, int world_rank, long max_per_rank = kMaxChipsPerRank) {
  long per_rank = 0, total = 0;
  std::string bad;
  auto number = [&](const std::string& flag, const std::string& v, long& out) {
    const long n = static_cast<long>(std::clamp<int64_t>(shardsim::decimal_int(v).value_or(0), 0, INT32_MAX));
    if (n < 1 || n > max_per_rank * static_cast<long>(flag == "--chips" ? ranks : 1))
      bad = flag + ": '" + v + "' is not a positive chip count of at most " + std::to_string(kMaxChipsPerRank) +
            " per rank (" + std::to_string(kMaxChipsPerRank * static_cast<long>(ranks)) + " in all with " +
            std::to_string(ranks) + " rank(s); the limit keeps a run's host memory and time bounded)";
    else out = n;
  };
  std::map<std::string, std::string> seen;  // flag -> the value it was first given (each flag once)
  for (size_t i = 1; i < args.size();) {
    const std::string a = args[i];
    std::string flag, value;
    bool two = false;
    for (const char* f : {"--chips-per-rank", "--chips"}) {
      if (a == f) {
        flag = f;
        two = true;
      } else if (a.rfind(std::string(f) + "=", 0) == 0) {
        flag = f;
        value = a.substr(std::string(f).size() + 1);
      }
      if (!flag.empty()) break;
    }
    if (flag.empty()) {
      ++i;
      continue;
    }
    if (two) {
      if (i + 1 >= args.size()) {
        bad = flag + " needs a number";
        break;
      }
      value = args[i + 1];
    }
    if (const auto it = seen.find(flag); it != seen.end() && bad.empty())
      bad = flag + " given twice ('" + it->second + "' and '" + value + "'); give it once";
    seen.emplace(flag, value);
    if (bad.empty()) number(flag, value, flag == "--chips" ? total : per_rank);
    args.erase(args.begin() + static_cast<long>(i), args.begin() + static_cast<long>(i + (two ? 2 : 1)));
  }
  if (bad.empty() && total && total % ranks != 0)
    bad = "--chips " + std::to_string(total) + ": must be a multiple of the " + std::to_string(ranks) +
          " MPI ranks (each rank hosts --chips / ranks chips)";
  if (bad.empty() && total && per_rank && total != per_rank * ranks)
    bad = "--chips " + std::to_string(total) + " and --chips-per-rank " + std::to_string(per_rank) + " disagree with " +
          std::to_string(ranks) + " ranks";
  if (!bad.empty()) {
    if (world_rank == 0) std::fprintf(stderr, "shardsim: error: %s (see shardsim --help)\n", shardsim::escape_control(bad).c_str());
    return -1;
  }
  return total ? static_cast<int>(total / ranks) : per_rank ? static_cast<int>(per_rank) : 1;
}

// The command line as one chip runs it (every chip of every rank parses the same arguments).
int run_cli(const shardsim::runtime::World& world, std::vector<std::string> args);

// Holds what this process writes to standard output in an anonymous temporary file while a folded attempt with a
// fallback runs (fold: auto, docs/performance/fold.md), so that a fallback runs again without printing twice.
// Nothing is held (output goes straight through) when ON is false (main: also when standard output is closed) or
// the temporary file cannot be made.
class StdoutHold {
 public:
  explicit StdoutHold(bool on) {
    if (!on) return;
    std::cout.flush();
    std::fflush(stdout);
    tmp_ = std::tmpfile();
    if (!tmp_) return;
    const int saved = ::dup(STDOUT_FILENO);
    if (saved < 0 || ::dup2(::fileno(tmp_), STDOUT_FILENO) < 0) {
      if (saved >= 0) ::close(saved);
      std::fclose(tmp_);
      tmp_ = nullptr;
      return;
    }
    g_saved_stdout = saved;
    g_held_fd = ::fileno(tmp_);
    shardsim::runtime::set_exit_hook(release_held_stdout_at_exit);
  }
  StdoutHold(const StdoutHold&) = delete;
  StdoutHold& operator=(const StdoutHold&) = delete;
  ~StdoutHold() { (void)restore(true); }
  // Standard output back where it was; KEEP: what was held is written to it. False if holding or copying failed
  // (a full temporary directory, a closed pipe).
  bool restore(bool keep) {
    if (!tmp_) return true;
    shardsim::runtime::set_exit_hook(nullptr);
    std::cout.flush();
    const bool flushed = std::fflush(stdout) == 0 && !std::ferror(stdout);
    std::clearerr(stdout);
    const bool ok = unhold_stdout(keep && flushed) && flushed;
    std::fclose(tmp_);
    tmp_ = nullptr;
    return ok;
  }

 private:
  std::FILE* tmp_ = nullptr;  // the held file (its descriptor is g_held_fd while held)
};

}  // namespace

namespace {

// The command line once MPI runs; STDOUT_OPEN: whether standard output was open before MPI_Init.
int run_main(int argc, char** argv, bool stdout_open) {
  using namespace shardsim;
  int world_rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  install_signal_handlers(world_rank);
  std::vector<std::string> args(argv, argv + argc);
  // A folded train run (docs/performance/fold.md) hosts only one data-parallel replica's chips, so --chips may
  // exceed the per-rank limit there: the limit applies to the chips that run.
  std::vector<std::string> probe = args;
  const int k_all = take_chip_flags(probe, ranks, -1, kMaxFoldedChips);
  const apps::FoldDecision decided = k_all >= 1 ? apps::train_fold(probe, k_all * ranks, ranks) : apps::FoldDecision{};
  runtime::FoldSpec fold = decided.spec;
  const long chips_all = static_cast<long>(k_all) * ranks;
  // `sweep` on one MPI rank with several chips: the sweep itself runs on one chip and starts each point's chips
  // for that point alone, so a training point folds as the same run under `train` does (apps/sweep.cpp,
  // docs/performance/fold.md); the per-rank limit then applies to each point that does not fold.
  if (ranks == 1 && k_all > 1 && probe.size() > 1 && probe[1] == "sweep") {
    const int n = take_chip_flags(args, ranks, world_rank, kMaxFoldedChips);
    if (n < 0) return kExitBadInput;
    apps::set_sweep_point_launch(n, static_cast<int>(kMaxChipsPerRank));
    const int code = runtime::run_chips(1, [&](const runtime::World& world) { return run_cli(world, args); });
    g_decided_exit = code;
    return code;
  }
  // Decided before any chip starts: fold: on that cannot fold is refused, as is a run past the chips one rank may
  // host unfolded; auto says in one note why a shape-only run with replicas is simulated in full.
  if (!fold.on() && !decided.why_not.empty() && (decided.on || decided.expected)) {
    const std::string why = escape_control(decided.why_not);
    const std::string cost = "simulating all " + std::to_string(chips_all) + " chips needs at least " +
                             gib(runtime::chip_host_bytes(static_cast<int>(std::min<long>(chips_all, 1L << 30)))) +
                             " of host memory and every chip's events";
    if (decided.on || k_all > kMaxChipsPerRank) {
      const std::string tail = k_all > kMaxChipsPerRank ? ", past the " + std::to_string(kMaxChipsPerRank) +
                                                              " chips one rank may host: use more ranks or fewer chips"
                                                        : std::string(", fold: auto or off runs it");
      if (world_rank == 0)
        std::fprintf(stderr, "shardsim: error: fold: %s: this run does not fold: %s (%s%s; docs/performance/fold.md)\n",
                     decided.on ? "on" : "auto", why.c_str(), cost.c_str(), tail.c_str());
      return kExitBadInput;
    }
    if (world_rank == 0)
      std::fprintf(stderr, "shardsim: note: fold: auto simulates every chip: %s (%s; docs/performance/fold.md)\n",
                   why.c_str(), cost.c_str());
  }
  // fold: auto past the chips one rank may host unfolded: no fallback is possible, so a break ends the run with
  // exit 3 naming it (as fold: on), not after a second start that the chip limit refuses.
  if (fold.fallback && k_all > kMaxChipsPerRank) fold.fallback = false;
  const std::vector<std::string> args_in = args;
  int k = take_chip_flags(args, ranks, world_rank, fold.on() ? kMaxFoldedChips : kMaxChipsPerRank);
  if (k < 0) return kExitBadInput;
  // Host memory planned before any chip starts (every rank checks its own K; one line from rank 0).
  auto memory_fits = [&](int k_run) {
    const std::string why = runtime::host_memory_check(k_run, kMaxChipsPerRank);
    if (!why.empty() && world_rank == 0) std::fprintf(stderr, "shardsim: error: %s\n", why.c_str());
    return why.empty();
  };
  if (!memory_fits(fold.on() ? fold.chips / fold.size * fold.period : k)) return kExitRuntimeFault;
  const auto body = [&](const runtime::World& world) { return run_cli(world, args); };
  int code = 0;
  {
    StdoutHold hold(fold.on() && fold.fallback && stdout_open);
    code = runtime::run_chips(k, body, fold);
    if (!hold.restore(code != runtime::kFoldFellBack) && code != runtime::kFoldFellBack) {
      std::fprintf(stderr, "shardsim: error: could not write the report to standard output (%s)\n",
                   std::strerror(errno));
      code = kExitRuntimeFault;
    }
  }
  if (code == runtime::kFoldFellBack) {  // fold: auto could not prove the replicas identical: every chip runs
    const int folded_chips = fold.chips / fold.size * fold.period;
    std::fprintf(stderr,
                 "shardsim: note: fold: auto simulates every chip: %s (all %d chips "
                 "instead of %d: about %dx the folded run's events, at least %s of host memory; "
                 "docs/performance/fold.md)\n",
                 escape_control(runtime::chips::fold_fallback_reason()).c_str(), fold.chips, folded_chips,
                 fold.chips / std::max(1, folded_chips), gib(runtime::chip_host_bytes(fold.chips)).c_str());
    args = args_in;
    k = take_chip_flags(args, ranks, world_rank, kMaxChipsPerRank);
    if (k < 0) return kExitBadInput;
    if (!memory_fits(k)) return kExitRuntimeFault;
    code = runtime::run_chips(k, body);
  }
  g_decided_exit = code;
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace shardsim;
  if (!std::getenv("OPENBLAS_NUM_THREADS")) kernels::set_blas_threads(1);  // one core per rank by default
  // Whether standard output was open before MPI could take descriptor 1 (a singleton's MPI_Init opens files).
  const bool stdout_open = ::fcntl(STDOUT_FILENO, F_GETFD) >= 0;
  runtime::MpiSession mpi(&argc, &argv);
  return mpi.finish(run_main(argc, argv, stdout_open));
}

namespace {

// CLI11 reads an integer with a leading zero as octal (`--steps 010` ran 8 steps, `--steps 09` was "not in range"):
// every integer option reads decimal, as config keys do (leading zeros dropped before any other check).
void read_integers_as_decimal(CLI::App& app) {
  for (CLI::Option* o : app.get_options()) {
    const std::string t = o->get_type_name();
    if (t != "INT" && t != "UINT" && t.rfind("INT:", 0) != 0 && t.rfind("UINT:", 0) != 0) continue;
    o->transform(
        [](std::string v) {
          size_t i = 0;
          while (i + 1 < v.size() && v[i] == '0' && std::isdigit(static_cast<unsigned char>(v[i + 1]))) ++i;
          return v.substr(i);
        },
        "", "decimal");
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) read_integers_as_decimal(*sub);
}

// CLI11's "The following arguments were not expected: m2.h5 --resume" when a command is given another command's
// flag (`serve ... --resume F`): "serve takes no --resume (an option of run, train)". "" otherwise.
std::string foreign_flag(CLI::App& app, const std::vector<std::string>& args, const CLI::ParseError& e) {
  if (!dynamic_cast<const CLI::ExtrasError*>(&e)) return "";
  const auto parsed = app.get_subcommands();
  if (parsed.empty()) return "";
  CLI::App* cmd = parsed.front();
  for (const std::string& a : args) {
    if (a.rfind("--", 0) != 0 || a.size() < 3) continue;
    const std::string name = a.substr(0, a.find('='));
    if (cmd->get_option_no_throw(name) || app.get_option_no_throw(name)) continue;
    std::string owners;
    for (const CLI::App* c : app.get_subcommands([](CLI::App*) { return true; }))
      if (c != cmd && c->get_option_no_throw(name)) owners += (owners.empty() ? "" : ", ") + c->get_name();
    if (owners.empty()) continue;
    return cmd->get_name() + " takes no " + shardsim::escape_control(name) + " (an option of " + owners + "; see shardsim " +
           cmd->get_name() + " --help)";
  }
  return "";
}

// The first word of ARGS (after the program) that is neither an option nor an option's value: the command the user
// meant, or "" when there is none.
std::string first_word(const CLI::App& app, const std::vector<std::string>& args) {
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.empty()) continue;
    if (a[0] != '-') return a;
    if (a.find('=') != std::string::npos) continue;
    const CLI::Option* o = app.get_option_no_throw(a);
    if (o && o->get_type_size() > 0) ++i;  // its value
  }
  return "";
}

int run_cli(const shardsim::runtime::World& world, std::vector<std::string> args) {
  using namespace shardsim;
  CLI::App app{"shardsim: sharded workloads on simulated accelerator chips, one chip per MPI rank by default "
               "(--chips-per-rank K or --chips N before or after the command: K chips per rank, each in its own "
               "fiber; see docs/ARCHITECTURE.md)"};
  app.require_subcommand(1);
  auto* run = app.add_subcommand("run", "run a sharded workload, validate it against one device, checkpoint it");
  std::string config = default_config_path(), json_path;
  apps::RunOptions opt;
  std::string ckpt;
  run->add_option("config", config, "workload YAML (default: the Llama-2-7B MLP on an 8-chip ring)");
  run->add_option("--json", json_path, "also write the report as JSON to this file");
  run->add_option("--resume", opt.resume_from, "load weights and input from this HDF5 checkpoint");
  run->add_option("--checkpoint", ckpt, "write the checkpoint here (overrides checkpoint.path)");
  run->add_option("--trace", opt.trace_path, "write a Chrome trace (Perfetto) of the simulated timelines");
  apps::add_trace_flags(run, opt.trace, false);
  run->add_flag("--profile", opt.profile,
                "add the profile: the critical path across chips, each op's class and the top bottlenecks "
                "(docs/PROFILE.md)");
  run->add_option("--plots", opt.plots_dir,
                  "write a roofline and a utilisation plot into this directory (PNG + data + gnuplot script; "
                  "docs/PROFILE.md)");
  run->add_flag("--no-checkpoint", opt.no_checkpoint, "do not write a checkpoint");
  run->add_flag("--shape-only", opt.shape_only,
                "shape-only mode (as the config's mode: shape_only): no data, kernels and collectives only charge "
                "their cost; the same simulated figures, not validated");
  std::string what_if;
  run->add_option("--what-if", what_if,
                  "re-simulate each change and print its speedup, e.g. link_bw=2x,hbm_bw=1.5x,peak=2x,latency=0.5x,"
                  "dim1.bandwidth=2x (docs/PROFILE.md)");
  // Overrides of the config (sharding/engine_config.h); `train` takes the same ones.
  sharding::ConfigOverrides ov;
  apps::add_config_override_flags(run, ov);
  // `profile`: run in shape-only mode with the profile, no checkpoint (the same overrides and outputs as run's).
  auto* prof = app.add_subcommand("profile", "where the time goes: the critical path across chips, each op's class, "
                                             "the top bottlenecks, and --what-if speedups (docs/PROFILE.md)");
  std::string prof_config = default_config_path(), prof_json, prof_what_if;
  apps::RunOptions prof_opt;
  prof->add_option("config", prof_config, "workload YAML of `run` (default: the Llama-2-7B MLP on an 8-chip ring)");
  prof->add_option("--json", prof_json, "also write the report (with its profile section) as JSON to this file");
  prof->add_option("--trace", prof_opt.trace_path, "write a Chrome trace (Perfetto) with arrows and the critical path");
  apps::add_trace_flags(prof, prof_opt.trace, false);
  prof->add_option("--plots", prof_opt.plots_dir, "write a roofline and a utilisation plot into this directory");
  prof->add_option("--what-if", prof_what_if, "changes to re-simulate, as run's --what-if");
  sharding::ConfigOverrides prof_ov;
  apps::add_config_override_flags(prof, prof_ov);

  const apps::Command validate = apps::add_validate(app, world);
  const apps::Command bench = apps::add_bench(app, world);
  const apps::Command topo = apps::add_topo(app, world);
  const apps::Command ckpt_cmd = apps::add_ckpt(app, world);
  const apps::Command sweep = apps::add_sweep(app, world);
  const apps::Command calibrate = apps::add_calibrate(app, world);
  const apps::Command train = apps::add_train(app, world);
  const apps::Command serve = apps::add_serve(app, world);
  const apps::Command help = apps::add_help(app, world);
  const apps::Command import_cmd = apps::add_import(app, world), export_cmd = apps::add_export(app, world);

  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  read_integers_as_decimal(app);
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
    refuse_empty_values(app);
    refuse_repeated_keys(app);
  } catch (const CLI::ParseError& e) {
    // Every rank parsed the same command line; rank 0 speaks for all of them.
    // The outcome is decided here: a SIGTERM from mpirun (another rank already exited) must not add a line.
    if (e.get_exit_code() == 0) {
      g_decided_exit = kExitOk;
      if (world.rank() == 0) app.exit(e);  // --help
      return kExitOk;
    }
    g_decided_exit = kExitBadInput;
    if (world.rank() == 0) {
      // `shardsim srve x.yaml` said "A subcommand is required", as if no command had been given.
      const std::string word = dynamic_cast<const CLI::RequiredError*>(&e) ? first_word(app, args) : std::string();
      std::string known;
      for (const CLI::App* c : app.get_subcommands([](CLI::App*) { return true; }))
        known += (known.empty() ? "" : ", ") + c->get_name();
      // CLI11's "--plan: At Most 1 required but received 2" for a flag given twice.
      const std::string what = e.what(), most = ": At Most 1 required but received ";
      const size_t at = what.find(most);
      if (!word.empty() && app.get_subcommands([&](CLI::App* c) { return c->check_name(word); }).empty())
        std::fprintf(stderr, "shardsim: error: unknown command '%s' (commands: %s; see shardsim --help)\n",
                     escape_control(word).c_str(), known.c_str());
      else if (const std::string other = foreign_flag(app, args, e); !other.empty())
        std::fprintf(stderr, "shardsim: error: %s\n", other.c_str());
      else if (at != std::string::npos)
        std::fprintf(stderr, "shardsim: error: %s given %s times; give it once%s\n",
                     escape_control(what.substr(0, at)).c_str(), escape_control(what.substr(at + most.size())).c_str(),
                     what.rfind("--plan", 0) == 0 ? " (join its items with commas: --plan tp=2,cp=4)" : "");
      else
        std::fprintf(stderr, "shardsim: error: %s (see shardsim --help)\n", escape_control(e.what()).c_str());
    }
    return kExitBadInput;
  }
  if (!ckpt.empty()) opt.checkpoint_path = ckpt;

  // Raised after the agreement point: other ranks may be waiting on us, so take the job down. The rank that claims
  // the node's report line prints the one line; a rank that fails at the same moment and loses the claim (two
  // ranks out of host memory at once) ends without a second line, and the claim makes mpirun's SIGTERM to the
  // other ranks end them quietly.
  const auto take_job_down = [&world](int exit_code, const std::string& line) {
    if (!runtime::wait_board::available() || runtime::wait_board::claim()) world.abort(exit_code, line);
    runtime::exit_job(exit_code);
  };
  const int code = [&]() -> int {
    try {
      // The watchdog's limit is read by every message wait; a bad value is an error up front, not a silent default.
      world.agree([] { (void)runtime::watchdog_seconds_from_env(300); });
      if (run->parsed()) return cmd_run(world, config, json_path, opt, ov, what_if);
      if (prof->parsed()) {
        prof_opt.profile = prof_opt.shape_only = prof_opt.no_checkpoint = true;
        return cmd_run(world, prof_config, prof_json, prof_opt, prof_ov, prof_what_if);
      }
      for (const auto* c : {&validate, &bench, &topo, &ckpt_cmd, &sweep, &calibrate, &train, &serve, &help, &import_cmd, &export_cmd})
        if (c->app->parsed()) return c->run();
    } catch (const AgreedError& e) {
      if (world.rank() == 0) std::fprintf(stderr, "shardsim: error: %s\n", escape_control(e.what()).c_str());
      return e.exit_code();
    } catch (const Error& e) {
      // Bad input is the user's, not a chip's: no "on chip N" (which read as a fault of the simulated chip 0).
      take_job_down(e.exit_code(), (e.exit_code() == kExitBadInput ? std::string("shardsim: error: ")
                                                                   : "shardsim: error on chip " +
                                                                         std::to_string(world.rank()) + ": ") +
                                       e.what());
    } catch (const std::bad_alloc&) {
      take_job_down(kExitRuntimeFault, "shardsim: error on chip " + std::to_string(world.rank()) +
                                           ": out of host memory (a buffer of this command does not fit in this "
                                           "machine's RAM; use smaller sizes, fewer ranks per host, or shape-only mode)");
    } catch (const std::exception& e) {
      take_job_down(kExitRuntimeFault, "shardsim: internal error on chip " + std::to_string(world.rank()) + ": " + e.what());
    }
    return kExitOk;
  }();
  return code;
}

}  // namespace
