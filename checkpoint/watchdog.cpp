#include "checkpoint/watchdog.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "common/output_file.h"
#include "runtime/chips.h"
#include "runtime/engine.h"

namespace shardsim::checkpoint::detail {

namespace {

// ---- the last-resort watchdog over collective HDF5 / MPI-IO calls ----
// Every collective HDF5 step of a save or a read runs under a Watch: if it has not returned after
// SHARDSIM_WATCHDOG_S seconds (default 300, 0 = never), one thread of the stuck process prints one line naming the
// file, the step, the chip and the I/O error this rank saw (if any), and aborts the job with exit code 3. It only
// fires when ranks disagree inside HDF5 (e.g. an I/O error that reached some ranks mid-collective); the space
// reservation below makes that rare. A rank that saw an error fires at the limit, the others 2 s later, so the
// line that names the cause is usually the one printed.
class IoWatchdog {
 public:
  static IoWatchdog& get() {
    static IoWatchdog* w = new IoWatchdog();  // never destroyed: its thread may outlive main's statics
    return *w;
  }
  void arm(const std::string& what) {
    std::lock_guard<std::mutex> lock(m_);
    if (limit_s_ <= 0) return;
    what_ = what;
    k_ = runtime::chips_per_rank();  // read here, on the rank's thread (chip mode's state is not for other threads)
    error_.clear();
    deadline_ = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                       std::chrono::duration<double>(limit_s_));
    armed_ = true;
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    cv_.notify_all();
  }
  void note_error(const std::string& e) {
    std::lock_guard<std::mutex> lock(m_);
    if (error_.empty()) error_ = e;
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(m_);
    armed_ = false;
  }

 private:
  IoWatchdog() {
    try {
      limit_s_ = runtime::watchdog_seconds_from_env(300);
    } catch (const Error&) {
      limit_s_ = 300;  // a bad value is reported up front by the CLI
    }
  }
  void loop() {
    std::unique_lock<std::mutex> lock(m_);
    while (true) {
      if (!armed_) {
        cv_.wait(lock);
        continue;
      }
      const auto fire_at = deadline_ + (error_.empty() ? std::chrono::seconds(2) : std::chrono::seconds(0));
      if (cv_.wait_until(lock, fire_at) != std::cv_status::timeout) continue;
      if (!armed_ || std::chrono::steady_clock::now() < fire_at) continue;
      int rank = 0, level = MPI_THREAD_SINGLE;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      MPI_Query_thread(&level);
      // With several chips per rank the rank's chip 0 does the I/O for all of them: name the rank and its chips.
      char who[96];
      if (k_ > 1)
        std::snprintf(who, sizeof who, "rank %d (chips %d..%d)", rank, rank * k_, rank * k_ + k_ - 1);
      else
        std::snprintf(who, sizeof who, "chip %d", rank);
      std::fprintf(stderr,
                   "shardsim: error: %s: no progress for %.0f s on %s (limit SHARDSIM_WATCHDOG_S=%g)%s%s; "
                   "aborting\n",
                   what_.c_str(), limit_s_, who, limit_s_, error_.empty() ? "" : ": ", error_.c_str());
      std::fflush(stderr);
      unlink_registered_temps();  // the final names are untouched anyway; drop the temporaries too
      if (level >= MPI_THREAD_MULTIPLE) MPI_Abort(MPI_COMM_WORLD, kExitRuntimeFault);
      std::_Exit(kExitRuntimeFault);
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::thread thread_;
  double limit_s_ = 300;
  int k_ = 1;
  bool armed_ = false;
  std::string what_, error_;
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace

Watch::Watch(const std::string& what) { IoWatchdog::get().arm(what); }
Watch::~Watch() { IoWatchdog::get().disarm(); }

// Runs F on every rank of COMM; if it throws on any rank, every rank throws the lowest failing rank's error
// with the same class (ConfigError for exit 2, RuntimeFault otherwise). Callers use it before every collective
// HDF5 call whose arguments depend on rank-local checks, so no rank enters a collective the others skip.
void agree(MPI_Comm comm, const std::function<void()>& f) {
  std::string msg;
  int code = 0;
  try {
    f();
  } catch (const Error& e) {
    msg = e.what();
    code = e.exit_code();
  } catch (const std::exception& e) {
    msg = e.what();
    code = kExitRuntimeFault;
  }
  if (code != 0) IoWatchdog::get().note_error(msg);
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int mine = code != 0 ? rank : size, first = size;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == size) return;
  MPI_Bcast(&code, 1, MPI_INT, first, comm);
  long long n = static_cast<long long>(msg.size());
  MPI_Bcast(&n, 1, MPI_LONG_LONG, first, comm);
  msg.resize(static_cast<size_t>(n));
  if (n > 0) MPI_Bcast(msg.data(), static_cast<int>(n), MPI_CHAR, first, comm);
  if (code == kExitBadInput) throw ConfigError(msg);
  throw RuntimeFault(msg);
}

}  // namespace shardsim::checkpoint::detail
