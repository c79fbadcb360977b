// A Transport's waits (runtime/transport.h): the wait modes (SHARDSIM_WAIT), the collective call signature each
// message carries (CallSignature, SignatureScope: checked against the receiver's own call), waiting for a set of
// requests, and the synchronous watchdog that names the peers a stuck wait is waiting on (SHARDSIM_WATCHDOG_S).
// The messages themselves (exchange, headers, arrivals): runtime/transport.cpp.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <sched.h>

#include "common/error.h"
#include "runtime/chips.h"
#include "runtime/engine.h"
#include "runtime/transport.h"
#include "runtime/world.h"

namespace shardsim::runtime {

namespace {

using Clock = std::chrono::steady_clock;

// SHARDSIM_WATCHDOG_S for synchronous waits, read once (a bad value is reported by the first engine or, for
// runs without async ops, treated as the default so a wait never throws from here).
double sync_watchdog_s() {
  static const double s = [] {
    try {
      return watchdog_seconds_from_env(300);
    } catch (const Error&) {
      return 300.0;
    }
  }();
  return s;
}

// Test hook: SHARDSIM_TEST_STALL_SYNC_RANK=R makes world rank R sleep forever at its first synchronous wait.
void maybe_stall(const std::string& op) {
  static const int stall_rank = [] {
    const char* v = std::getenv("SHARDSIM_TEST_STALL_SYNC_RANK");
    return v && *v ? std::atoi(v) : -1;
  }();
  static bool fired = false;
  if (fired || stall_rank < 0) return;
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  if (world_rank != stall_rank) return;
  fired = true;
  std::fprintf(stderr, "shardsim: test hook SHARDSIM_TEST_STALL_SYNC_RANK: rank %d stalls in %s\n", world_rank,
               op.c_str());
  std::fflush(stderr);
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

thread_local CallSignature t_signature;

std::string chip_list(const std::vector<int>& chips) {
  std::string s;
  for (int c : chips) s += (s.empty() ? "" : ", ") + std::to_string(c);
  return s;
}

}  // namespace

uint64_t CallSignature::hash() const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
  for (uint64_t v : {static_cast<uint64_t>(static_cast<uint32_t>(collective)), static_cast<uint64_t>(dtype),
                     static_cast<uint64_t>(static_cast<uint32_t>(op)),
                     static_cast<uint64_t>(static_cast<uint32_t>(root)),
                     count, algorithm, static_cast<uint64_t>(static_cast<uint32_t>(shape_only))})
    for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  return h;
}

SignatureScope::SignatureScope(const CallSignature& sig) : saved_(t_signature) { t_signature = sig; }
SignatureScope::~SignatureScope() { t_signature = saved_; }
const CallSignature& SignatureScope::current() { return t_signature; }
void SignatureScope::set_current(const CallSignature& sig) { t_signature = sig; }

const char* wait_mode_name(WaitMode m) {
  switch (m) {
    case WaitMode::spin: return "spin";
    case WaitMode::yield: return "yield";
    case WaitMode::sleep: return "sleep";
  }
  return "?";
}

WaitMode wait_mode() {
  static const WaitMode m = [] {
    const char* v = std::getenv("SHARDSIM_WAIT");
    const std::string s = v ? v : "";
    if (s == "spin") return WaitMode::spin;
    if (s == "yield") return WaitMode::yield;
    if (s == "sleep") return WaitMode::sleep;
    int initialized = 0, world_rank = 0;
    MPI_Initialized(&initialized);
    if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    // Warn once per job (world rank 0) and carry on: a wait strategy never changes results.
    if (!s.empty() && s != "auto" && world_rank == 0)
      std::fprintf(stderr, "shardsim: warning: SHARDSIM_WAIT='%s' is not spin, yield, sleep or auto; using auto\n",
                   s.c_str());
    return WaitMode::spin;  // measured best on this 2-core host also with 4 oversubscribed ranks (docs/performance/host.md)
  }();
  return m;
}

int Transport::world_rank_of(int r) const {
  if (vc_) return vc_->members->at(static_cast<size_t>(r)) / chips_per_rank();
  return rank_to_world_.at(static_cast<size_t>(r));
}

void Transport::wait_requests(std::vector<MPI_Request>& reqs, const std::vector<int>& peers, const std::string& op) {
  wait(reqs, peers, op, nullptr);
}

void Transport::publish_wait(const std::vector<MPI_Request>& reqs, const std::vector<int>& peers) {
  std::vector<int> worlds, chips;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (reqs[i] == MPI_REQUEST_NULL) continue;
    for (int r = 0; r < size_; ++r) {
      if (!(peers[i] == r || (peers[i] < 0 && r != rank_))) continue;
      const int w = world_rank_of(r);
      if (std::find(worlds.begin(), worlds.end(), w) != worlds.end()) continue;
      worlds.push_back(w);
      chips.push_back(chip_of(r));
    }
  }
  wait_board::publish(world_rank_of(rank_), chip(), worlds, chips);
}

void Transport::watchdog_fire(const std::vector<MPI_Request>& reqs, const std::vector<int>& peers,
                              const std::string& op, double idle, double limit) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  publish_wait(reqs, peers);  // so the others see this rank as waiting, whatever its wait's age
  std::vector<int> pending_chips, pending_worlds;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (reqs[i] == MPI_REQUEST_NULL) continue;
    for (int r = 0; r < size_; ++r)
      if ((peers[i] == r || (peers[i] < 0 && r != rank_)) &&
          std::find(pending_worlds.begin(), pending_worlds.end(), world_rank_of(r)) == pending_worlds.end()) {
        pending_worlds.push_back(world_rank_of(r));
        pending_chips.push_back(chip_of(r));
      }
  }
  char head[512];
  std::snprintf(head, sizeof head, "shardsim: watchdog: chip %d (rank %d): %s made no progress for %.0f s (limit "
                "SHARDSIM_WATCHDOG_S=%g); ", chip(), world_rank, op.c_str(), idle, limit);
  std::string line = head;
  if (!wait_board::available()) {
    line += "still waiting on chip(s) " + chip_list(pending_chips);
  } else {
    const wait_board::Finding f = wait_board::follow(world_rank, pending_worlds);
    auto described = [&](const std::vector<int>& worlds) {
      std::string s;
      for (int w : worlds) {
        const int c = f.chip_of(w);
        s += (s.empty() ? "" : ", ") + (c >= 0 ? "chip " + std::to_string(c) + " " : std::string()) + "(rank " +
             std::to_string(w) + ")";
      }
      return s;
    };
    std::vector<int> waiters;
    for (int w : f.waiting) waiters.push_back(f.chip_of(w));
    if (!f.stalled.empty())
      line += "stalled: " + described(f.stalled) +
              ", not waiting for any message (busy or hung outside communication); waiting on it: chip(s) " +
              chip_list(waiters);
    if (!f.remote.empty())
      line += std::string(f.stalled.empty() ? "" : "; ") + "waiting on " + described(f.remote) +
              " on another host (not inspectable from here)";
    if (f.cycle)
      line += "deadlock: chip(s) " + chip_list(waiters) +
              " all wait on each other (ranks calling different collectives, or in different orders?)";
    if (!wait_board::claim()) {
      // Another rank of this node reports and takes the job down; wait for that, then make sure of it.
      std::this_thread::sleep_for(std::chrono::seconds(30));
      MPI_Abort(MPI_COMM_WORLD, kExitRuntimeFault);
      std::_Exit(kExitRuntimeFault);
    }
  }
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, kExitRuntimeFault);
  std::_Exit(kExitRuntimeFault);
}

void Transport::wait(std::vector<MPI_Request>& reqs, const std::vector<int>& peers, const std::string& op,
                     WaitHook* hook) {
  // Synchronous waits (no observer) poll as wait_mode() says and carry the watchdog: no request completing for
  // SHARDSIM_WATCHDOG_S seconds (default 300; 0 = never) aborts the job (exit 3) with one line naming the stalled
  // chips (watchdog_fire). A wait that lasts 10 ms is published on the node's wait board for that. The engine's
  // waits report progress to its observer instead (its own watchdog thread watches them) and sleep 2-250 us.
  using us = std::chrono::microseconds;
  const bool sync = !observer_;
  if (sync) maybe_stall(op);
  const WaitMode mode = sync ? wait_mode() : WaitMode::sleep;
  const double limit = sync ? sync_watchdog_s() : 0;
  // Phases of an idle wait: poll back to back until SPIN, poll with sched_yield() until YIELD, then sleep with a
  // pause growing from MIN_PAUSE to MAX_PAUSE (a rank waiting on a long serial job must not steal its core).
  const us spin = !sync ? us(0) : mode == WaitMode::spin ? us(50) : mode == WaitMode::sleep ? us(20) : us(0);
  const us yield = !sync ? us(0) : mode == WaitMode::spin ? us(1000) : mode == WaitMode::yield ? us(200) : us(0);
  const us min_pause = !sync ? us(2) : mode == WaitMode::sleep ? us(5) : us(20);
  const us max_pause = !sync ? us(250) : us(500);
  auto pending = [&] {  // distinct ranks with a request still active
    std::vector<int> ranks;
    for (size_t i = 0; i < reqs.size(); ++i)
      if (reqs[i] != MPI_REQUEST_NULL)
        for (int r = 0; r < size_; ++r)
          if ((peers[i] == r || (peers[i] < 0 && r != rank_)) &&
              std::find(ranks.begin(), ranks.end(), r) == ranks.end())
            ranks.push_back(r);
    return ranks;
  };
  if (observer_) observer_->pending(comm_, pending());
  const int n_reqs = static_cast<int>(reqs.size());
  if (done_.size() < reqs.size()) {
    done_.resize(reqs.size());
    statuses_.resize(reqs.size());
  }
  bool idle = false, published = false;
  Clock::time_point idle_since;
  us pause = min_pause;
  while (true) {
    int n = 0;
    const int rc = MPI_Testsome(n_reqs, reqs.data(), &n, done_.data(), statuses_.data());
    if (rc != MPI_SUCCESS) {
      if (hook && rc == MPI_ERR_IN_STATUS)
        for (int k = 0; k < n; ++k) hook->failed(static_cast<size_t>(done_[static_cast<size_t>(k)]),
                                                 statuses_[static_cast<size_t>(k)].MPI_ERROR);
      check_mpi(rc, chip(), op);
    }
    if (n == MPI_UNDEFINED) break;  // no active request left
    if (n > 0) {
      if (hook)
        for (int k = 0; k < n; ++k) hook->completed(static_cast<size_t>(done_[static_cast<size_t>(k)]));
      idle = false;
      pause = min_pause;
      if (published) {
        wait_board::clear();
        published = false;
      }
      if (observer_) {
        observer_->progressed();
        observer_->pending(comm_, pending());
      }
      continue;
    }
    if (mode == WaitMode::spin && sync && idle) {
      // cheap path: read the clock only every 64 polls while spinning
      static thread_local unsigned polls = 0;
      if ((++polls & 63) != 0) continue;
    }
    const auto now = Clock::now();
    if (!idle) {
      idle = true;
      idle_since = now;
    }
    const auto waited = now - idle_since;
    if (sync) {
      if (!published && waited >= std::chrono::milliseconds(10) && wait_board::available()) {
        publish_wait(reqs, peers);
        published = true;
      }
      if (!vc_) probe_agreement(op);  // the mixed agreed/new-signature case (see agreed())
      const double idle_s = std::chrono::duration<double>(waited).count();
      if (limit > 0 && idle_s >= limit) watchdog_fire(reqs, peers, op, idle_s, limit);
    }
    if (waited < spin) continue;
    if (waited < yield) {
      sched_yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    if (pause < max_pause) pause *= 2;
  }
  if (published) wait_board::clear();
  if (observer_) observer_->pending(comm_, {});
}

}  // namespace shardsim::runtime
