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

namespace shardsim::runtime {

namespace ctx = boost::context;

namespace {

constexpr int kChipTag = 7101;
constexpr size_t kPiece = size_t{1} << 30;   // payload bytes per MPI message (int counts)
constexpr size_t kMaxHeader = 128;
constexpr uint64_t kControl = uint64_t{1} << 63;  // context bit of control-plane messages
// Context of the per-rank hand-over communicators (rank_handover; "ChkpHand" without the top bit). Split contexts
// are 63-bit hashes (Transport::split) and the world's is 1: a collision is as unlikely as one between two splits.
constexpr uint64_t kHandoverCtx = 0x43686b7048616e64ull & ~kControl;
// Fiber stacks: collectives, kernels and the CLI run on them. Guard page below (overflow faults, never corrupts).
constexpr size_t kStackBytes = kFiberStackBytes;

// What travels in front of every piece over MPI.
struct Wire {
  uint64_t ctx;
  int32_t src, dst;
  uint64_t bytes;     // payload bytes of the whole message (0: header only)
  uint32_t piece, npieces;
  uint32_t hlen;
  uint32_t pad;
  unsigned char header[kMaxHeader];
};

struct Msg {
  unsigned char header[kMaxHeader];
  size_t hlen = 0;
  size_t bytes = 0;                     // payload bytes
  std::vector<unsigned char> storage;   // payload at storage.data() + offset
  size_t offset = 0;
};

struct Key {
  uint64_t ctx;
  int src, dst;
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = k.ctx * 0x9e3779b97f4a7c15ull;
    h ^= (static_cast<uint64_t>(static_cast<uint32_t>(k.src)) << 32 | static_cast<uint32_t>(k.dst)) +
         0x7f4a7c159e3779b9ull + (h << 6) + (h >> 2);
    return static_cast<size_t>(h);
  }
};

struct Chip {
  ctx::fiber fib;
  ctx::fiber sink;  // the scheduler while this chip runs
  bool started = false, done = false, waiting = false, busy = false;
  bool queued = false;  // in Sched::ready
  std::string op;
  std::vector<int> peers;
  // wait_until_all: the (context, source) messages this chip still misses; it is queued only when the last of
  // them is delivered (a woken chip whose wait is still unmet would cost a resume for nothing). Empty: any
  // delivery to the chip queues it.
  std::vector<std::pair<uint64_t, int>> missing;
  int code = 0;
};

struct Sched {
  int k = 1, wrank = 0, wsize = 1;
  MPI_Comm comm = MPI_COMM_NULL;
  std::vector<Chip> chips;
  int cur = -1;
  uint64_t events = 0;
  std::vector<int> ready, running;  // chips to resume: not started yet, or every awaited message arrived
  using Mail = std::unordered_map<Key, std::deque<Msg>, KeyHash>;
  Mail mail;
  // Emptied mailboxes kept for reuse (map node and deque storage): each message would otherwise allocate a map
  // node, a deque map and a deque block, and free them again when it is taken. Bounded, so an all_to_all's p^2
  // keys do not stay allocated.
  std::vector<Mail::node_type> spare_boxes;
  static constexpr size_t kMaxSpareBoxes = 4096;
  std::map<int, Msg> assembling;  // source rank -> message whose pieces are still arriving
  std::map<int, Key> assembling_key;
  std::vector<MPI_Request> send_reqs;
  std::vector<std::vector<unsigned char>> send_bufs;
  std::vector<int> done_idx;
  std::vector<std::shared_ptr<VComm>> worlds;
  std::vector<std::shared_ptr<VComm>> locals;  // per chip: this rank's K chips (rank_handover)
  // chips::shared_ints: hash of the contents -> the shared copies (weak: a copy goes with its last holder).
  std::unordered_map<uint64_t, std::vector<std::weak_ptr<const std::vector<int>>>> shared_ints;
  int stall_chip = -1;
  std::function<void(uint64_t, double)> progress_fn;
  double progress_every_s = 0;
  std::chrono::steady_clock::time_point progress_since, progress_last;

  // Folded run (run_chips' FoldSpec): replicas > 1. World ranks g with replica(g) == 0 run (slot_of), the others
  // are mirrored.
  int fold_stride = 1, fold_size = 1, fold_period = 0, fold_replicas = 1;
  bool fold_fallback = false;  // FoldSpec::fallback
  std::string fold_failed;     // why the folded attempt fell back ("": it did not)
  bool folded() const { return fold_replicas > 1; }
  int dpc(int g) const { return (g / fold_stride) % fold_size; }
  int replica(int g) const { return dpc(g) / fold_period; }
  int shift(int g, int d) const {  // the chip D replicas on (sigma^D)
    const int c = dpc(g);
    return g + (((c + d * fold_period) % fold_size + fold_size) % fold_size - c) * fold_stride;
  }
  int slot_of(int g) const {
    if (!folded()) return g % k;
    const int block = fold_stride * fold_size;
    return (g / block) * (fold_stride * fold_period) + g % block;
  }
  int world_of(int slot) const {
    if (!folded()) return wrank * k + slot;
    const int run = fold_stride * fold_period;
    return (slot / run) * fold_stride * fold_size + slot % run;
  }
  bool simulated(int g) const { return !folded() || replica(g) == 0; }
  bool local(int g) const { return folded() || g / k == wrank; }
  int rank_of(int g) const { return folded() ? 0 : g / k; }

  std::deque<Msg>& box(const Key& key) {
    auto it = mail.find(key);
    if (it != mail.end()) return it->second;
    if (spare_boxes.empty()) return mail[key];
    Mail::node_type n = std::move(spare_boxes.back());
    spare_boxes.pop_back();
    n.key() = key;
    return mail.insert(std::move(n)).position->second;
  }

  void retire(Mail::iterator it) {
    if (spare_boxes.size() < kMaxSpareBoxes) spare_boxes.push_back(mail.extract(it));
    else mail.erase(it);
  }

  void deliver(const Key& key, Msg&& m) {
    box(key).push_back(std::move(m));
    ++events;
    // Only the destination can be waiting for it (every wait is for messages to the waiting chip).
    Chip& c = chips[static_cast<size_t>(slot_of(key.dst))];
    if (!c.waiting || c.queued) return;
    if (!c.missing.empty()) {
      auto it = std::find(c.missing.begin(), c.missing.end(), std::pair{key.ctx, key.src});
      if (it == c.missing.end()) return;
      *it = c.missing.back();
      c.missing.pop_back();
      if (!c.missing.empty()) return;
    }
    c.queued = true;
    ready.push_back(slot_of(key.dst));
  }

  // Receives what has arrived and retires finished sends. True if anything happened.
  bool progress() {
    bool any = false;
    while (true) {
      int flag = 0;
      MPI_Message mh;
      MPI_Status st;
      check_mpi(MPI_Improbe(MPI_ANY_SOURCE, kChipTag, comm, &flag, &mh, &st), wrank, "chip router");
      if (!flag) break;
      int count = 0;
      MPI_Get_count(&st, MPI_BYTE, &count);
      std::vector<unsigned char> buf(static_cast<size_t>(count));
      check_mpi(MPI_Mrecv(buf.data(), count, MPI_BYTE, &mh, &st), wrank, "chip router");
      any = true;
      Wire w;
      std::memcpy(&w, buf.data(), sizeof(Wire));
      const Key key{w.ctx, w.src, w.dst};
      const size_t piece_bytes = buf.size() - sizeof(Wire);
      if (w.npieces <= 1) {
        Msg m;
        std::memcpy(m.header, w.header, w.hlen);
        m.hlen = w.hlen;
        m.bytes = w.bytes;
        m.offset = sizeof(Wire);
        m.storage = std::move(buf);
        deliver(key, std::move(m));
        continue;
      }
      // Pieces of one message come back to back from one source rank (posted without a yield in between).
      if (w.piece == 0) {
        Msg m;
        std::memcpy(m.header, w.header, w.hlen);
        m.hlen = w.hlen;
        m.bytes = w.bytes;
        m.storage.resize(w.bytes);
        assembling[st.MPI_SOURCE] = std::move(m);
        assembling_key[st.MPI_SOURCE] = key;
      }
      Msg& m = assembling.at(st.MPI_SOURCE);
      std::memcpy(m.storage.data() + static_cast<size_t>(w.piece) * kPiece, buf.data() + sizeof(Wire), piece_bytes);
      if (w.piece + 1 == w.npieces) {
        deliver(assembling_key.at(st.MPI_SOURCE), std::move(m));
        assembling.erase(st.MPI_SOURCE);
        assembling_key.erase(st.MPI_SOURCE);
      }
    }
    if (!send_reqs.empty()) {
      int n = 0;
      done_idx.resize(send_reqs.size());
      check_mpi(MPI_Testsome(static_cast<int>(send_reqs.size()), send_reqs.data(), &n, done_idx.data(),
                             MPI_STATUSES_IGNORE),
                wrank, "chip router");
      if (n > 0 && n != MPI_UNDEFINED) {
        size_t j = 0;
        for (size_t i = 0; i < send_reqs.size(); ++i) {
          if (send_reqs[i] == MPI_REQUEST_NULL) continue;
          send_reqs[j] = send_reqs[i];
          if (j != i) send_bufs[j] = std::move(send_bufs[i]);
          ++j;
        }
        send_reqs.resize(j);
        send_bufs.resize(j);
      } else if (n == MPI_UNDEFINED) {
        send_reqs.clear();
        send_bufs.clear();
      }
    }
    return any;
  }
};

Sched* g = nullptr;
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

[[noreturn]] void fold_broken(const std::string& why) {
  if (g && g->fold_fallback) {
    if (g->fold_failed.empty()) g->fold_failed = why;
    throw FoldFallback{};
  }
  throw RuntimeFault("fold: " + why + " (the data-parallel replicas of this run are not provably identical; "
                     "run it unfolded with --no-fold or fold: off, docs/performance/fold.md)");
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
  if (buf && m.bytes) std::memcpy(buf, m.storage.data() + m.offset, m.bytes);
  it->second.pop_front();
  if (it->second.empty()) g->retire(it);
}

namespace {
// Folded run: the rank in C of each member's mirror in replica 0 (its own rank for a simulated member), or -1 for a
// member whose mirror is not in C (then nothing about it can be mirrored).
std::vector<int> mirror_ranks(const VComm& c) {
  std::vector<int> out(static_cast<size_t>(c.size()));
  std::unordered_map<int, int> rank_of;
  for (int r = 0; r < c.size(); ++r)
    if (g->simulated(c.member(r))) rank_of[c.member(r)] = r;
  for (int r = 0; r < c.size(); ++r) {
    auto it = rank_of.find(mirror_of(c.member(r)));
    out[static_cast<size_t>(r)] = it == rank_of.end() ? -1 : it->second;
  }
  return out;
}
bool has_mirrored(const VComm& c) {
  if (!g || !g->folded()) return false;
  for (int r = 0; r < c.size(); ++r)
    if (!g->simulated(c.member(r))) return true;
  return false;
}
}  // namespace

// Control plane of a folded run: a mirrored member contributes what its mirror in replica 0 contributes (the
// replicas are identical: docs/performance/fold.md) and is sent nothing. Member 0 (the root) must be simulated.
std::vector<unsigned char> allgather(const VComm& c, const void* mine, size_t n, const std::string& op) {
  const int me = c.member(c.rank);
  const uint64_t cx = c.ctx | kControl;
  const int root = c.member(0);
  const bool mirrored = has_mirrored(c);
  if (mirrored && !g->simulated(root)) fold_broken(op + ": a control-plane root outside replica 0");
  std::vector<unsigned char> all(n * static_cast<size_t>(c.size()));
  if (c.rank != 0) {
    post(cx, me, root, nullptr, 0, n ? mine : all.data(), n);
    wait_until([&] { return peek(cx, root, me, nullptr, 0, nullptr); }, op, {root});
    take(cx, root, me, all.data());
    return all;
  }
  if (n) std::memcpy(all.data(), mine, n);
  for (int r = 1; r < c.size(); ++r) {
    const int src = c.member(r);
    if (!g->simulated(src)) continue;
    wait_until([&] { return peek(cx, src, me, nullptr, 0, nullptr); }, op, {src});
    take(cx, src, me, all.data() + static_cast<size_t>(r) * n);
  }
  if (mirrored) {
    const auto m = mirror_ranks(c);
    for (int r = 1; r < c.size(); ++r) {
      if (g->simulated(c.member(r))) continue;
      if (m[static_cast<size_t>(r)] < 0) fold_broken(op + ": a member whose mirror is not in its group");
      if (n) std::memcpy(all.data() + static_cast<size_t>(r) * n, all.data() + static_cast<size_t>(m[static_cast<size_t>(r)]) * n, n);
    }
  }
  for (int r = 1; r < c.size(); ++r)
    if (g->simulated(c.member(r))) post(cx, me, c.member(r), nullptr, 0, all.data(), all.size());
  return all;
}

std::shared_ptr<VComm> split(VComm& parent, int color, int key, const std::string& op, std::vector<int>* parent_ranks,
                             const ColorKeyOf& color_key_of) {
  std::vector<std::pair<int, int>> members;  // (key, parent rank)
  const bool mirrored = has_mirrored(parent);
  if (mirrored) {
    // Folded run: the mirrored members make no call; their (color, key) come from the caller's rule (the same
    // rule every member's own arguments follow: checked for this one).
    if (!color_key_of) fold_broken(op + ": a split over mirrored chips without a rule for their colors");
    if (color_key_of(parent.rank) != std::pair{color, key})
      throw RuntimeFault(op + ": the split's rule disagrees with this chip's own (color, key)");
    for (int r = 0; r < parent.size(); ++r)
      if (const auto [c, k] = color_key_of(r); c == color) members.emplace_back(k, r);
  } else {
    // Every member learns every (color, key).
    const int64_t mine = (static_cast<int64_t>(color) << 32) | static_cast<uint32_t>(key);
    const auto bytes = allgather(parent, &mine, sizeof mine, op);
    std::vector<int64_t> all(static_cast<size_t>(parent.size()));
    std::memcpy(all.data(), bytes.data(), bytes.size());
    for (int r = 0; r < parent.size(); ++r) {
      const int64_t v = all[static_cast<size_t>(r)];
      if (static_cast<int>(v >> 32) == color) members.emplace_back(static_cast<int>(static_cast<int32_t>(v)), r);
    }
  }
  std::stable_sort(members.begin(), members.end());
  auto vc = std::make_shared<VComm>();
  uint64_t h = parent.ctx ^ (0x9e3779b97f4a7c15ull * (parent.splits + 1)) ^ (static_cast<uint64_t>(color) << 20);
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  vc->ctx = (h ^ (h >> 31)) & ~kControl;
  ++parent.splits;
  std::vector<int> world_ranks;
  if (parent_ranks) parent_ranks->clear();
  for (const auto& [k, r] : members) {
    if (r == parent.rank) vc->rank = static_cast<int>(world_ranks.size());
    world_ranks.push_back(parent.member(r));
    if (parent_ranks) parent_ranks->push_back(r);
  }
  if (mirrored) {
    // A group with mirrored members must map onto itself under the shift by one replica: a message to a mirrored
    // member is delivered to its mirror under this group's context (post).
    const bool any = std::any_of(world_ranks.begin(), world_ranks.end(), [](int w) { return !g->simulated(w); });
    const std::unordered_set<int> in(world_ranks.begin(), world_ranks.end());
    if (any && !std::all_of(world_ranks.begin(), world_ranks.end(), [&](int w) { return in.count(g->shift(w, 1)) != 0; }))
      fold_broken(op + ": a group of simulated and mirrored chips that the replica shift does not map onto itself");
  }
  vc->members = shared_ints(std::move(world_ranks));
  return vc;
}

void reduce_to_all(const VComm& c, void* data, size_t n, const std::function<void(void*, const void*)>& combine,
                   const std::string& op) {
  const int me = c.member(c.rank);
  const uint64_t cx = c.ctx | kControl;
  const int root = c.member(0);
  unsigned char dummy = 0;
  void* buf = n ? data : &dummy;
  const bool mirrored = has_mirrored(c);
  if (mirrored && !g->simulated(root)) fold_broken(op + ": a control-plane root outside replica 0");
  if (c.rank != 0) {
    post(cx, me, root, nullptr, 0, buf, n);
    wait_until([&] { return peek(cx, root, me, nullptr, 0, nullptr); }, op, {root});
    take(cx, root, me, n ? data : nullptr);
    return;
  }
  if (mirrored) {  // every contribution first (the mirrored ones copy a simulated one), then folded in member order
    const auto m = mirror_ranks(c);
    std::unordered_map<int, std::vector<unsigned char>> got;
    got[0].assign(static_cast<unsigned char*>(buf), static_cast<unsigned char*>(buf) + n);
    for (int r = 1; r < c.size(); ++r) {
      const int src = c.member(r);
      if (!g->simulated(src)) continue;
      auto& v = got[r];
      v.resize(n);
      wait_until([&] { return peek(cx, src, me, nullptr, 0, nullptr); }, op, {src});
      take(cx, src, me, n ? v.data() : nullptr);
    }
    for (int r = 1; r < c.size(); ++r) {
      const int from = m[static_cast<size_t>(r)];
      if (from < 0) fold_broken(op + ": a member whose mirror is not in its group");
      if (n) combine(data, got.at(from).data());
    }
    for (int r = 1; r < c.size(); ++r)
      if (g->simulated(c.member(r))) post(cx, me, c.member(r), nullptr, 0, buf, n);
    return;
  }
  std::vector<unsigned char> other(n);
  for (int r = 1; r < c.size(); ++r) {
    const int src = c.member(r);
    wait_until([&] { return peek(cx, src, me, nullptr, 0, nullptr); }, op, {src});
    take(cx, src, me, n ? other.data() : nullptr);
    if (n) combine(data, other.data());
  }
  for (int r = 1; r < c.size(); ++r) post(cx, me, c.member(r), nullptr, 0, buf, n);
}

std::vector<std::vector<unsigned char>> gather(const VComm& c, const void* mine, size_t n, int root,
                                               const std::string& op) {
  const int me = c.member(c.rank);
  const uint64_t cx = c.ctx | kControl;
  if (has_mirrored(c)) fold_broken(op + ": a gather over mirrored chips");
  std::vector<std::vector<unsigned char>> all;
  if (c.rank != root) {
    unsigned char dummy = 0;
    post(cx, me, c.member(root), nullptr, 0, n ? mine : &dummy, n);
    return all;
  }
  all.resize(static_cast<size_t>(c.size()));
  if (n) all[static_cast<size_t>(root)].assign(static_cast<const unsigned char*>(mine),
                                               static_cast<const unsigned char*>(mine) + n);
  for (int r = 0; r < c.size(); ++r) {
    if (r == root) continue;
    const int src = c.member(r);
    size_t bytes = 0;
    wait_until([&] { return peek(cx, src, me, nullptr, 0, &bytes); }, op, {src});
    auto& out = all[static_cast<size_t>(r)];
    out.resize(bytes);
    take(cx, src, me, bytes ? out.data() : nullptr);
  }
  return all;
}

void rank_handover(void* mine, const std::function<void(const std::vector<void*>&)>& fn, const std::string& op) {
  if (!g || g->cur < 0) throw std::logic_error("rank_handover: not on a chip fiber");
  const VComm& c = *g->locals.at(static_cast<size_t>(g->cur));
  // Each chip sends its pointer and the name of the hand-over it is in (chips that diverged are an error, never a
  // pointer taken for another kind of contribution).
  std::vector<unsigned char> me(sizeof mine + op.size());
  std::memcpy(me.data(), &mine, sizeof mine);
  std::memcpy(me.data() + sizeof mine, op.data(), op.size());
  const auto got = gather(c, me.data(), me.size(), 0, op);
  // The outcome, "" or "<class>:<exit code>:<message>", sent from slot 0 to the others.
  std::string outcome;
  if (c.rank == 0) {
    std::vector<void*> ptrs(got.size());
    char cls = 0;
    int code = 0;
    std::string what;
    for (size_t i = 0; i < got.size(); ++i) {
      std::memcpy(&ptrs[i], got[i].data(), sizeof(void*));
      const std::string theirs(got[i].begin() + sizeof(void*), got[i].end());
      if (theirs != op && !cls) {
        cls = 'R', code = kExitRuntimeFault;
        what = "internal error: chip " + std::to_string(c.member(static_cast<int>(i))) + " is in hand-over '" +
               theirs + "' while chip " + std::to_string(c.member(0)) + " is in '" + op + "'";
      }
    }
    try {
      if (!cls) fn(ptrs);
    } catch (const AgreedError& e) {
      cls = 'A', code = e.exit_code(), what = e.what();
    } catch (const ConfigError& e) {
      cls = 'C', code = e.exit_code(), what = e.what();
    } catch (const UsageError& e) {
      cls = 'U', code = e.exit_code(), what = e.what();
    } catch (const RuntimeFault& e) {
      cls = 'R', code = e.exit_code(), what = e.what();
    } catch (const Error& e) {
      cls = 'A', code = e.exit_code(), what = e.what();
    } catch (const std::exception& e) {
      cls = 'R', code = kExitRuntimeFault, what = std::string("internal error: ") + e.what();
    }
    if (cls) outcome = std::string(1, cls) + ":" + std::to_string(code) + ":" + what;
  }
  const auto out = broadcast(c, std::vector<unsigned char>(outcome.begin(), outcome.end()), 0, op);
  if (out.empty()) return;
  outcome.assign(out.begin(), out.end());
  const size_t colon = outcome.find(':', 2);
  const int code = std::atoi(outcome.substr(2, colon - 2).c_str());
  const std::string what = outcome.substr(colon + 1);
  switch (outcome[0]) {
    case 'C': throw ConfigError(what);
    case 'U': throw UsageError(what);
    case 'R': throw RuntimeFault(what);
    default: throw AgreedError(what, code);
  }
}

std::vector<unsigned char> broadcast(const VComm& c, const std::vector<unsigned char>& value, int root,
                                     const std::string& op) {
  const int me = c.member(c.rank);
  const uint64_t cx = c.ctx | kControl;
  const int rg = c.member(root);
  if (g->folded() && !g->simulated(rg)) fold_broken(op + ": a broadcast from a mirrored chip");
  if (c.rank == root) {
    const uint64_t len = value.size();
    for (int r = 0; r < c.size(); ++r)
      if (r != root && g->simulated(c.member(r))) post(cx, me, c.member(r), &len, sizeof len, value.data(), value.size());
    return value;
  }
  size_t bytes = 0;
  uint64_t len = 0;
  wait_until([&] { return peek(cx, rg, me, &len, sizeof len, &bytes); }, op, {rg});
  std::vector<unsigned char> out(len);
  take(cx, rg, me, out.data());
  return out;
}

}  // namespace chips

int run_chips(int k, const std::function<int(const World&)>& body, const FoldSpec& fold) {
  if (fold.on()) k = fold.chips / fold.size * fold.period;
  if (k <= 1 && !fold.on()) {
    const World world(MPI_COMM_WORLD);
    return body(world);
  }
  Sched s;
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
  const int n = fold.on() ? fold.chips : k * s.wsize;
  try {  // out of host memory in the scheduler (stacks, mailboxes, maps): one line, exit 3, no unwinding of fibers
  s.chips.resize(static_cast<size_t>(k));
  g = &s;  // shared_ints below shares the world's member map among this rank's chips
  for (int i = 0; i < k; ++i) {
    auto w = std::make_shared<VComm>();
    w->ctx = 1;
    std::vector<int> members(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) members[static_cast<size_t>(j)] = j;
    w->members = chips::shared_ints(std::move(members));
    w->rank = s.world_of(i);
    s.worlds.push_back(std::move(w));
  }
  {
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
  g = &s;
  for (int i = 0; i < k; ++i) {
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
  for (int i = 0; i < k; ++i) {
    s.ready.push_back(i);
    s.chips[static_cast<size_t>(i)].queued = true;
  }
  using Clock = std::chrono::steady_clock;
  const double limit = watchdog_limit();
  bool idle = false;
  Clock::time_point idle_since;
  auto pause = std::chrono::microseconds(20);
  int live = k;
  unsigned polls = 0, progress_polls = 0;
  while (live > 0) {
    const uint64_t before = s.events;
    // Rounds in queue order. (Resuming the last-woken chip first keeps caches hot and halves a bidirectional
    // ring's wall time at 512 chips, but it runs a one-way ring one step per resume where rounds let chip i run
    // i steps in one resume: 3-4x slower there, and in the control plane's reductions; measured, not kept.)
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
      if (!s.fold_failed.empty()) break;
    }
    if (!s.fold_failed.empty()) break;
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
    if (live == 0) break;
    if (s.folded() && s.ready.empty()) {
      // One rank, nothing in flight, nobody to run: the waiting chips wait on messages from mirrored chips that no
      // simulated chip sends (an exchange the replica shift does not map onto itself, e.g. a XOR partner).
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
        break;
      }
      chip_failed(s.world_of(0), kExitRuntimeFault,
                  "fold: " + why + " (the data-parallel replicas of this run are not provably identical; run it "
                  "unfolded with --no-fold or fold: off, docs/performance/fold.md)");
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
  } catch (const std::bad_alloc&) {
    host_memory_exhausted(k, s.wrank);
  }
  // Every send has left before the router goes away.
  while (!s.send_reqs.empty()) {
    s.progress();
    if (!s.send_reqs.empty()) sched_yield();
  }
  if (!s.fold_failed.empty()) {  // fold: auto fell back: unwind every chip's stack (their destructors run), done
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

}  // namespace shardsim::runtime
