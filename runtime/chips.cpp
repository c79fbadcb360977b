#include "runtime/chips.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include <boost/context/fiber.hpp>
#include <boost/context/protected_fixedsize_stack.hpp>
#include <sched.h>
#include <sys/resource.h>
#include <fstream>

#include "common/error.h"
#include "common/text.h"
#include "runtime/chip_split.h"
#include "runtime/host_memory.h"
#include "runtime/engine.h"
#include "runtime/transport.h"
#include "runtime/world.h"
#include "runtime/chips_sched.h"

namespace shardsim::runtime {

namespace ctx = boost::context;

namespace chips_detail {
Sched* g = nullptr;
}  // namespace chips_detail
using namespace chips_detail;

namespace {
std::string g_fold_fallback_reason;  // chips::fold_fallback_reason()
// Thrown by fold_broken in a folded attempt with a fallback: no std::exception, so no catch of shardsim's takes it
// on its way out of the chip's body (as a forced unwind); the chip's fiber entry does.
struct FoldFallback {};

std::string chip_list(const std::vector<int>& v) {
  std::string s;
  for (int c : v) s += (s.empty() ? "" : ", ") + std::to_string(c);
  return s;
}

double watchdog_limit() {
  try {
    return watchdog_seconds_from_env(300);
  } catch (const Error&) {
    return 300.0;
  }
}

// Back to the scheduler; the chip's call signature (thread-local, runtime/transport.h) is saved and restored
// around the switch, so each chip keeps its own.
void switch_out(Chip& c) {
  const CallSignature saved = SignatureScope::current();
  c.sink = std::move(c.sink).resume();
  SignatureScope::set_current(saved);
}

extern "C" void quiet_exit(int) { std::_Exit(kExitRuntimeFault); }

[[noreturn]] void watchdog_fire(double idle, double limit) {
  // The outcome is decided: mpirun's SIGTERM (after another rank's abort) must not add a second line.
  std::signal(SIGTERM, quiet_exit);
  std::signal(SIGINT, quiet_exit);
  // Targets: chips the waiting chips of this rank wait on, each with its waiters. A local chip that is neither
  // waiting nor finished while nothing moves is stalled (busy or hung outside communication).
  std::string op;
  std::map<int, std::vector<int>> waiters_of;  // target chip -> local chips waiting on it
  std::vector<int> waiters;
  for (size_t i = 0; i < g->chips.size(); ++i) {
    const Chip& c = g->chips[i];
    if (!c.waiting) continue;
    if (op.empty()) op = c.op;
    const int me = g->world_of(static_cast<int>(i));
    waiters.push_back(me);
    for (int p : c.peers) {
      auto& w = waiters_of[p];
      if (std::find(w.begin(), w.end(), me) == w.end()) w.push_back(me);
    }
  }
  auto described = [&](int c) { return "chip " + std::to_string(c) + " (rank " + std::to_string(g->rank_of(c)) + ")"; };
  char head[512];
  std::snprintf(head, sizeof head, "shardsim: watchdog: %s made no progress for %.0f s (limit "
                "SHARDSIM_WATCHDOG_S=%g); ", op.empty() ? "chip" : op.c_str(), idle, limit);
  std::string line = head, sep;
  bool local_finding = false;
  for (size_t i = 0; i < g->chips.size(); ++i) {
    const Chip& c = g->chips[i];
    if (c.done || c.waiting) continue;
    const int chip = g->world_of(static_cast<int>(i));
    line += sep + "stalled: " + described(chip) + ", not waiting for any message (busy or hung outside communication)";
    auto it = waiters_of.find(chip);
    line += it != waiters_of.end() ? "; waiting on it: chip(s) " + chip_list(it->second)
                                   : "; waited on from other ranks";
    sep = "; ";
    local_finding = true;
  }
  for (const auto& [target, w] : waiters_of) {
    if (g->local(target) && g->chips[static_cast<size_t>(g->slot_of(target))].done) {
      line += sep + "chip(s) " + chip_list(w) + " wait on " + described(target) +
              ", which already finished (a chip that skipped a collective?)";
      sep = "; ";
      local_finding = true;
    }
  }
  const bool all_local_waiting = !waiters_of.empty() &&
      std::all_of(waiters_of.begin(), waiters_of.end(), [](const auto& kv) {
        return g->local(kv.first) && g->chips[static_cast<size_t>(g->slot_of(kv.first))].waiting;
      });
  if (sep.empty() && all_local_waiting) {
    line += "deadlock: chip(s) " + chip_list(waiters) +
            " all wait on each other (chips calling different collectives, or in different orders?)";
    local_finding = true;
  } else if (sep.empty()) {
    for (const auto& [target, w] : waiters_of)
      if (!g->local(target)) {
        line += sep + "chip(s) " + chip_list(w) + " wait on " + described(target) + " on another rank";
        sep = "; ";
      }
  }
  // The rank that sees the stalled chip itself speaks; a rank that only waits on other ranks gives it time.
  if (!local_finding) std::this_thread::sleep_for(std::chrono::seconds(10));
  if (!wait_board::available() || wait_board::claim()) {
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(30));
  }
  MPI_Abort(MPI_COMM_WORLD, kExitRuntimeFault);
  std::_Exit(kExitRuntimeFault);
}

[[noreturn]] void host_memory_exhausted(int k, int rank) {
  std::fprintf(stderr, "shardsim: error: host memory: out of host memory on rank %d hosting %d chips (estimated at "
               "least %.2f GiB; use more ranks, fewer chips or a host with more memory)\n", rank, k,
               chip_host_bytes(k) / 1073741824.0);
  std::fflush(stderr);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, kExitRuntimeFault);
  std::_Exit(kExitRuntimeFault);
}

[[noreturn]] void chip_failed(int chip, int code, const std::string& what) {
  if (code == kExitBadInput)  // bad input is the user's, not a chip's fault
    std::fprintf(stderr, "shardsim: error: %s\n", escape_control(what).c_str());
  else
    std::fprintf(stderr, "shardsim: error on chip %d: %s\n", chip, escape_control(what).c_str());
  std::fflush(stderr);
  exit_job(code);
}

}  // namespace

int chips_per_rank() { return g ? g->k : 1; }
bool chip_mode() { return g != nullptr; }

namespace chips {

int current() { return g && g->cur >= 0 ? g->world_of(g->cur) : -1; }

std::shared_ptr<VComm> world_comm(int chip) { return g->worlds.at(static_cast<size_t>(g->slot_of(chip))); }

bool folded() { return g && g->folded(); }
uint64_t events() { return g ? g->events : 0; }

void set_progress(std::function<void(uint64_t, double)> fn, double every_s) {
  if (!g) return;
  g->progress_fn = std::move(fn);
  g->progress_every_s = every_s;
  g->progress_since = g->progress_last = std::chrono::steady_clock::now();
}

void fold_verify(const std::string& op) {
  if (!g || !g->folded()) return;
  for (const auto& [key, box] : g->mail)
    if (!box.empty() && !(key.ctx & kControl))
      fold_broken(op + ": a message mirrored to chip " + std::to_string(key.dst) + " as from chip " +
                  std::to_string(key.src) + " was never received (a pattern the replica shift does not map onto "
                  "itself, e.g. a tree rooted at one replica)");
}
std::string fold_fallback_reason() { return g_fold_fallback_reason; }
bool simulated(int chip) { return !g || g->simulated(chip); }
int mirror_of(int chip) { return g && g->folded() ? g->shift(chip, -g->replica(chip)) : chip; }
int replica_image(int chip) { return g && g->folded() ? g->shift(chip, 1) : chip; }

[[noreturn]] void fold_broken(const std::string& why) {
  if (g && g->fold_fallback) {
    if (g->fold_failed.empty()) g->fold_failed = why;
    throw FoldFallback{};
  }
  throw RuntimeFault("fold: " + why + " (the data-parallel replicas of this run are not provably identical; "
                     "run it unfolded with --no-fold or fold: off, docs/performance/fold.md)");
}

[[noreturn]] void fold_refused(const std::string& why) {
  if (g && g->fold_fallback) fold_broken(why);
  throw UsageError("fold: this run does not fold: " + why + " (decided before its first step; run it unfolded with "
                   "--no-fold or fold: off, docs/performance/fold.md)");
}

std::shared_ptr<const std::vector<int>> shared_ints(std::vector<int> v) {
  if (!g) return std::make_shared<const std::vector<int>>(std::move(v));
  uint64_t h = 1469598103934665603ull ^ v.size();  // FNV-1a over the values
  for (int x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
  if (g->shared_ints.size() > 4096)
    for (auto it = g->shared_ints.begin(); it != g->shared_ints.end();) {
      std::erase_if(it->second, [](const auto& w) { return w.expired(); });
      it = it->second.empty() ? g->shared_ints.erase(it) : std::next(it);
    }
  auto& slots = g->shared_ints[h];  // equal hashes: compare the contents
  std::erase_if(slots, [](const auto& w) { return w.expired(); });
  for (const auto& w : slots)
    if (auto p = w.lock(); p && *p == v) return p;
  auto p = std::make_shared<const std::vector<int>>(std::move(v));
  slots.push_back(p);
  return p;
}

void wait_until(const std::function<bool()>& done, const std::string& op, const std::vector<int>& peers) {
  if (done()) return;
  Chip& c = g->chips.at(static_cast<size_t>(g->cur));
  if (g->stall_chip == current()) {
    std::fprintf(stderr, "shardsim: test hook SHARDSIM_TEST_STALL_CHIP: chip %d stalls in %s\n", current(),
                 op.c_str());
    std::fflush(stderr);
    g->stall_chip = -1;
    c.busy = true;
    while (true) switch_out(c);
  }
  c.waiting = true;
  c.op = op;
  c.peers = peers;
  while (!done()) switch_out(c);
  c.waiting = false;
  c.peers.clear();
}

void wait_until_all(const std::function<bool()>& done, const std::string& op, std::span<const int> peers,
                    std::span<const std::pair<uint64_t, int>> missing) {
  if (done()) return;
  Chip& c = g->chips.at(static_cast<size_t>(g->cur));
  if (g->stall_chip == current() || missing.empty())
    return wait_until(done, op, std::vector<int>(peers.begin(), peers.end()));
  c.waiting = true;
  c.op = op;  // (assign: keeps the string's and the vectors' storage from the last wait)
  c.peers.assign(peers.begin(), peers.end());
  c.missing.assign(missing.begin(), missing.end());
  switch_out(c);
  // Woken by the last missing message, or by the watchdog's view of things; if DONE() still does not hold (it
  // should not happen: every missing message is here), fall back to waking on any delivery.
  c.missing.clear();
  while (!done()) switch_out(c);
  c.waiting = false;
  c.peers.clear();
}

void post(uint64_t cx, int src, int dst, const void* header, size_t hlen, const void* buf, size_t bytes) {
  if (hlen > kMaxHeader) throw RuntimeFault("chip router: header of " + std::to_string(hlen) + " bytes");
  if (!g->simulated(dst)) {
    // Folded run: what this chip sends to the chip R replicas on is, by the replicas' symmetry, what the chip R
    // replicas back sends to this one's image in replica 0 (docs/performance/fold.md): deliver it there.
    if (cx & kControl) fold_broken("a control-plane message to a mirrored chip");
    const int r = g->replica(dst);
    src = g->shift(src, -r);
    dst = g->shift(dst, -r);
  }
  if (g->local(dst)) {
    Msg m;
    std::memcpy(m.header, header, hlen);
    m.hlen = hlen;
    m.bytes = buf ? bytes : 0;
    if (buf && bytes) m.storage.assign(static_cast<const unsigned char*>(buf),
                                       static_cast<const unsigned char*>(buf) + bytes);
    g->deliver(Key{cx, src, dst}, std::move(m));
    return;
  }
  const size_t payload = buf ? bytes : 0;
  const uint32_t npieces = payload <= kPiece ? 1u : static_cast<uint32_t>((payload + kPiece - 1) / kPiece);
  for (uint32_t p = 0; p < npieces; ++p) {
    const size_t off = static_cast<size_t>(p) * kPiece;
    const size_t n = payload ? std::min(kPiece, payload - off) : 0;
    std::vector<unsigned char> wire(sizeof(Wire) + n);
    Wire w{};
    w.ctx = cx;
    w.src = src;
    w.dst = dst;
    w.bytes = payload;
    w.piece = p;
    w.npieces = npieces;
    w.hlen = static_cast<uint32_t>(hlen);
    std::memcpy(w.header, header, hlen);
    std::memcpy(wire.data(), &w, sizeof(Wire));
    if (n) std::memcpy(wire.data() + sizeof(Wire), static_cast<const unsigned char*>(buf) + off, n);
    g->send_reqs.emplace_back();
    check_mpi(MPI_Isend(wire.data(), static_cast<int>(wire.size()), MPI_BYTE, g->rank_of(dst), kChipTag, g->comm,
                        &g->send_reqs.back()),
              src, "chip router");
    g->send_bufs.push_back(std::move(wire));
  }
}

void post_shared(uint64_t cx, int src, int dst, const std::shared_ptr<const std::vector<unsigned char>>& payload) {
  if (!g->simulated(dst) || !g->local(dst)) {
    post(cx, src, dst, nullptr, 0, payload->data(), payload->size());
    return;
  }
  Msg m;
  m.hlen = 0;
  m.bytes = payload->size();
  m.shared = payload;
  g->deliver(Key{cx, src, dst}, std::move(m));
}

bool peek(uint64_t cx, int src, int dst, void* header, size_t hlen, size_t* bytes) {
  auto it = g->mail.find(Key{cx, src, dst});
  if (it == g->mail.end() || it->second.empty()) return false;
  const Msg& m = it->second.front();
  if (header && hlen) std::memcpy(header, m.header, std::min(hlen, m.hlen));
  if (bytes) *bytes = m.bytes;
  return true;
}

void take(uint64_t cx, int src, int dst, void* buf) {
  auto it = g->mail.find(Key{cx, src, dst});
  Msg& m = it->second.front();
  if (buf && m.bytes) std::memcpy(buf, m.payload(), m.bytes);
  it->second.pop_front();
  if (it->second.empty()) g->retire(it);
}

}  // namespace chips

namespace {

// The scheduler's MPI side and the fold's parameters (run_chips: K chips on this rank).
void open_sched(Sched& s, int k, const FoldSpec& fold) {
  s.k = k;
  MPI_Comm_rank(MPI_COMM_WORLD, &s.wrank);
  MPI_Comm_size(MPI_COMM_WORLD, &s.wsize);
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &s.comm), s.wrank, "chip router");
  MPI_Comm_set_errhandler(s.comm, MPI_ERRORS_RETURN);
  if (const char* v = std::getenv("SHARDSIM_TEST_STALL_CHIP"); v && *v) s.stall_chip = std::atoi(v);
  if (fold.on()) {
    if (s.wsize != 1 || fold.chips % (fold.stride * fold.size) != 0 || fold.size % fold.period != 0)
      throw RuntimeFault("fold: needs one MPI rank, chips a multiple of stride x size and size of period");
    s.fold_stride = fold.stride;
    s.fold_size = fold.size;
    s.fold_period = fold.period;
    s.fold_replicas = fold.size / fold.period;
    s.fold_fallback = fold.fallback;
  }
}

// Each chip's world communicator (N chips in all) and the rank's hand-over communicator of its K chips.
void make_comms(Sched& s, int n) {
  const int k = s.k;
  for (int i = 0; i < k; ++i) {
    auto w = std::make_shared<VComm>();
    w->ctx = 1;
    std::vector<int> members(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) members[static_cast<size_t>(j)] = j;
    w->members = chips::shared_ints(std::move(members));
    w->rank = s.world_of(i);
    s.worlds.push_back(std::move(w));
  }
  std::vector<int> mine(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) mine[static_cast<size_t>(i)] = s.world_of(i);
  const auto members = std::make_shared<const std::vector<int>>(std::move(mine));
  for (int i = 0; i < k; ++i) {
    auto l = std::make_shared<VComm>();
    l->ctx = kHandoverCtx;
    l->members = members;
    l->rank = i;
    s.locals.push_back(std::move(l));
  }
}

// Each chip's fiber running BODY on its world (its exit code, or its error reported by chip_failed), all queued.
void spawn_chips(Sched& s, const std::function<int(const World&)>& body) {
  for (int i = 0; i < s.k; ++i) {
    Chip& c = s.chips[static_cast<size_t>(i)];
    const int chip = s.world_of(i);
    c.fib = ctx::fiber(std::allocator_arg, ctx::protected_fixedsize_stack(kStackBytes),
                       [&c, chip, &body](ctx::fiber&& sink) {
                         c.sink = std::move(sink);
                         int code = 0;
                         std::string what;
                         try {
                           const World world(chips::world_comm(chip));
                           c.code = body(world);
                         } catch (const ctx::detail::forced_unwind&) {
                           throw;
                         } catch (const FoldFallback&) {  // the scheduler ends the attempt (run_chips)
                           c.done = true;
                           return std::move(c.sink);
                         } catch (const Error& e) {
                           code = e.exit_code();
                           what = e.what();
                         } catch (const std::bad_alloc&) {
                           host_memory_exhausted(g->k, g->wrank);
                         } catch (const std::exception& e) {
                           code = kExitRuntimeFault;
                           what = std::string("internal error: ") + e.what();
                         }
                         if (code) chip_failed(chip, code, what);
                         c.done = true;
                         return std::move(c.sink);
                       });
  }
  for (int i = 0; i < s.k; ++i) {
    s.ready.push_back(i);
    s.chips[static_cast<size_t>(i)].queued = true;
  }
}

// One round: every ready chip resumed once, in queue order; LIVE counts down as chips finish. (Resuming the
// last-woken chip first keeps caches hot and halves a bidirectional ring's wall time at 512 chips, but it runs a
// one-way ring one step per resume where rounds let chip i run i steps in one resume: 3-4x slower there, and in
// the control plane's reductions; measured, not kept.)
void run_round(Sched& s, int& live) {
  s.running.swap(s.ready);
  s.ready.clear();
  for (const int i : s.running) {
    Chip& c = s.chips[static_cast<size_t>(i)];
    c.queued = false;
    if (c.done || c.busy) continue;
    s.cur = i;
    c.fib = std::move(c.fib).resume();
    s.cur = -1;
    if (c.done) {
      --live;
      ++s.events;
    }
    if (!s.fold_failed.empty()) return;
  }
}

// A folded run (one rank) with nothing in flight and nobody to run: the waiting chips wait on messages from
// mirrored chips that no simulated chip sends (an exchange the replica shift does not map onto itself, e.g. a XOR
// partner). With a fallback the attempt ends (s.fold_failed); without, the run fails naming the chips.
void fold_stuck(Sched& s) {
  std::string who, op;
  for (size_t i = 0; i < s.chips.size(); ++i)
    if (s.chips[i].waiting) {
      if (op.empty()) op = s.chips[i].op;
      who += (who.empty() ? "" : ", ") + std::to_string(s.world_of(static_cast<int>(i)));
    }
  const std::string why = op + ": chip(s) " + who + " wait on messages from mirrored chips that no simulated "
                          "chip sends";
  if (s.fold_fallback) {
    s.fold_failed = why;
    return;
  }
  chip_failed(s.world_of(0), kExitRuntimeFault,
              "fold: " + why + " (the data-parallel replicas of this run are not provably identical; run it "
              "unfolded with --no-fold or fold: off, docs/performance/fold.md)");
}

// Runs the chips until every one has finished (or a folded attempt fell back): rounds of resumes, the progress
// callback, MPI progress, and while nothing moves a backing-off idle wait under the watchdog.
void schedule(Sched& s) {
  using Clock = std::chrono::steady_clock;
  const double limit = watchdog_limit();
  bool idle = false;
  Clock::time_point idle_since;
  auto pause = std::chrono::microseconds(20);
  int live = s.k;
  unsigned polls = 0, progress_polls = 0;
  while (live > 0) {
    const uint64_t before = s.events;
    run_round(s, live);
    if (!s.fold_failed.empty()) return;
    if (s.progress_fn && (++progress_polls & 63) == 0) {
      const auto now = Clock::now();
      if (std::chrono::duration<double>(now - s.progress_last).count() >= s.progress_every_s) {
        s.progress_last = now;
        s.progress_fn(s.events, std::chrono::duration<double>(now - s.progress_since).count());
      }
    }
    if (s.progress() || s.events != before) {
      idle = false;
      pause = std::chrono::microseconds(20);
      continue;
    }
    if (live == 0) return;
    if (s.folded() && s.ready.empty()) {
      fold_stuck(s);
      if (!s.fold_failed.empty()) return;
    }
    if (idle && (++polls & 63) != 0) continue;
    const auto now = Clock::now();
    if (!idle) {
      idle = true;
      idle_since = now;
    }
    const auto waited = now - idle_since;
    const double idle_s = std::chrono::duration<double>(waited).count();
    if (limit > 0 && idle_s >= limit) watchdog_fire(idle_s, limit);
    if (waited < std::chrono::microseconds(50)) continue;
    if (waited < std::chrono::milliseconds(1)) {
      sched_yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::microseconds(500)) pause *= 2;
  }
}

// After the chips: every send has left, the router goes away; the first chip's nonzero code (kFoldFellBack when
// a folded attempt fell back, after unwinding every chip's stack so their destructors run).
int close_sched(Sched& s) {
  while (!s.send_reqs.empty()) {
    s.progress();
    if (!s.send_reqs.empty()) sched_yield();
  }
  if (!s.fold_failed.empty()) {
    for (size_t i = 0; i < s.chips.size(); ++i) {
      s.cur = static_cast<int>(i);
      s.chips[i].fib = ctx::fiber{};
    }
    s.cur = -1;
    g_fold_fallback_reason = s.fold_failed;
    g = nullptr;
    MPI_Comm_free(&s.comm);
    return kFoldFellBack;
  }
  int code = 0;
  for (const Chip& c : s.chips)
    if (c.code && !code) code = c.code;
  g = nullptr;
  MPI_Comm_free(&s.comm);
  return code;
}

}  // namespace

int run_chips(int k, const std::function<int(const World&)>& body, const FoldSpec& fold) {
  if (fold.on()) k = fold.chips / fold.size * fold.period;
  if (k <= 1 && !fold.on()) {
    const World world(MPI_COMM_WORLD);
    return body(world);
  }
  Sched s;
  open_sched(s, k, fold);
  const int n = fold.on() ? fold.chips : k * s.wsize;
  try {  // out of host memory in the scheduler (stacks, mailboxes, maps): one line, exit 3, no unwinding of fibers
    s.chips.resize(static_cast<size_t>(k));
    g = &s;  // shared_ints in make_comms shares the world's member map among this rank's chips
    make_comms(s, n);
    spawn_chips(s, body);
    schedule(s);
  } catch (const std::bad_alloc&) {
    host_memory_exhausted(k, s.wrank);
  }
  return close_sched(s);
}

}  // namespace shardsim::runtime
