#include "runtime/world.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "common/error.h"
#include "common/output_file.h"
#include "common/text.h"
#include "runtime/chips.h"

namespace shardsim::runtime {

namespace {

int g_node_ranks = 0;  // from MpiSession; 0 = unknown

// The wait board: a header and one slot per node-local rank in an MPI shared-memory window.
constexpr int kMaxPeers = 16;
struct Slot {
  std::atomic<long long> since{0};  // steady-clock ns when the wait was published; 0 = not waiting
  std::atomic<int> chip{-1};
  std::atomic<int> npeers{0};
  std::atomic<int> peers[kMaxPeers];
  std::atomic<int> peer_chips[kMaxPeers];
};
struct Board {
  MPI_Win win = MPI_WIN_NULL;
  MPI_Comm node = MPI_COMM_NULL;
  std::atomic<int>* claim = nullptr;
  Slot* slots = nullptr;
  std::vector<int> world_to_local;  // -1 for ranks on other nodes
  int local = -1;
};
Board g_board;

static_assert(std::atomic<long long>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "the wait board needs address-free atomics");

void board_init() {
  int wr = 0, ws = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm_size(MPI_COMM_WORLD, &ws);
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, wr, MPI_INFO_NULL, &g_board.node) != MPI_SUCCESS)
    return;
  int n = 1, me = 0;
  MPI_Comm_size(g_board.node, &n);
  MPI_Comm_rank(g_board.node, &me);
  g_node_ranks = n;
  std::vector<int> worlds(static_cast<size_t>(n));
  if (MPI_Allgather(&wr, 1, MPI_INT, worlds.data(), 1, MPI_INT, g_board.node) != MPI_SUCCESS) return;
  const MPI_Aint bytes = me == 0 ? static_cast<MPI_Aint>(64 + sizeof(Slot) * static_cast<size_t>(n)) : 0;
  void* base = nullptr;
  if (MPI_Win_allocate_shared(bytes, 1, MPI_INFO_NULL, g_board.node, &base, &g_board.win) != MPI_SUCCESS) {
    g_board.win = MPI_WIN_NULL;
    return;
  }
  MPI_Aint size = 0;
  int disp = 1;
  if (MPI_Win_shared_query(g_board.win, 0, &size, &disp, &base) != MPI_SUCCESS || !base) return;
  auto* p = static_cast<unsigned char*>(base);
  if (me == 0) {
    new (p) std::atomic<int>(0);
    for (int i = 0; i < n; ++i) {
      auto* slot = new (p + 64 + sizeof(Slot) * static_cast<size_t>(i)) Slot;
      for (auto& q : slot->peers) q.store(-1);
      for (auto& q : slot->peer_chips) q.store(-1);
    }
  }
  MPI_Barrier(g_board.node);
  g_board.claim = reinterpret_cast<std::atomic<int>*>(p);
  g_board.slots = reinterpret_cast<Slot*>(p + 64);
  g_board.world_to_local.assign(static_cast<size_t>(ws), -1);
  for (int i = 0; i < n; ++i) g_board.world_to_local[static_cast<size_t>(worlds[static_cast<size_t>(i)])] = i;
  g_board.local = me;
}

void board_free() {
  // Forget the board before its memory goes away, so nothing in this process can touch it after the unmap.
  Board b = std::move(g_board);
  g_board = Board{};
  if (b.win != MPI_WIN_NULL) MPI_Win_free(&b.win);
  if (b.node != MPI_COMM_NULL) MPI_Comm_free(&b.node);
}

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Slot* slot_of(int world_rank) {
  if (!g_board.slots || world_rank < 0 || world_rank >= static_cast<int>(g_board.world_to_local.size())) return nullptr;
  const int l = g_board.world_to_local[static_cast<size_t>(world_rank)];
  return l < 0 ? nullptr : &g_board.slots[l];
}

}  // namespace

int node_ranks() {
  if (g_node_ranks > 0) return g_node_ranks;
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const char* s = std::getenv(v); s && std::atoi(s) > 0) return std::atoi(s);
  return 1;
}

int node_cores() { return std::max(1u, std::thread::hardware_concurrency()); }

namespace wait_board {

bool available() { return g_board.slots != nullptr; }

void publish(int me, int chip, const std::vector<int>& world_peers, const std::vector<int>& peer_chips) {
  Slot* sp = slot_of(me);
  if (!sp) return;
  Slot& s = *sp;
  s.since.store(0, std::memory_order_relaxed);
  const int n = static_cast<int>(std::min<size_t>(world_peers.size(), kMaxPeers));
  for (int i = 0; i < n; ++i) {
    s.peers[i].store(world_peers[static_cast<size_t>(i)], std::memory_order_relaxed);
    s.peer_chips[i].store(peer_chips[static_cast<size_t>(i)], std::memory_order_relaxed);
  }
  s.npeers.store(n, std::memory_order_relaxed);
  s.chip.store(chip, std::memory_order_relaxed);
  s.since.store(std::max(1LL, now_ns()), std::memory_order_release);
}

void clear() {
  if (g_board.slots) g_board.slots[g_board.local].since.store(0, std::memory_order_release);
}

int Finding::chip_of(int world_rank) const {
  for (const auto& [w, c] : chips)
    if (w == world_rank) return c;
  return -1;
}

Finding follow(int my_world_rank, const std::vector<int>& world_peers) {
  Finding f;
  std::vector<int> seen = {my_world_rank}, todo = world_peers;
  f.waiting.push_back(my_world_rank);
  auto note_peers = [&](const Slot& s) {
    const int n = std::min(s.npeers.load(std::memory_order_relaxed), kMaxPeers);
    for (int i = 0; i < n; ++i) {
      const int peer = s.peers[i].load(std::memory_order_relaxed);
      todo.push_back(peer);
      if (f.chip_of(peer) < 0) f.chips.emplace_back(peer, s.peer_chips[i].load(std::memory_order_relaxed));
    }
  };
  if (const Slot* me = slot_of(my_world_rank)) {
    f.chips.emplace_back(my_world_rank, me->chip.load(std::memory_order_relaxed));
    note_peers(*me);
  }
  while (!todo.empty()) {
    const int w = todo.back();
    todo.pop_back();
    if (std::find(seen.begin(), seen.end(), w) != seen.end()) continue;
    seen.push_back(w);
    const Slot* s = slot_of(w);
    if (!s) {
      f.remote.push_back(w);
      continue;
    }
    if (s->since.load(std::memory_order_acquire) == 0) {
      f.stalled.push_back(w);
      continue;
    }
    f.waiting.push_back(w);
    if (f.chip_of(w) < 0) f.chips.emplace_back(w, s->chip.load(std::memory_order_relaxed));
    note_peers(*s);
  }
  for (auto* v : {&f.stalled, &f.waiting, &f.remote}) std::sort(v->begin(), v->end());
  f.cycle = f.stalled.empty() && f.remote.empty();
  return f;
}

bool claim(int reason) {
  if (!g_board.claim) return true;
  int expected = 0;
  return g_board.claim->compare_exchange_strong(expected, reason);
}

bool claimed() { return claim_reason() != 0; }
int claim_reason() { return g_board.claim ? g_board.claim->load() : 0; }
bool on_this_node(int world_rank) {
  return world_rank >= 0 && static_cast<size_t>(world_rank) < g_board.world_to_local.size() &&
         g_board.world_to_local[static_cast<size_t>(world_rank)] >= 0;
}

}  // namespace wait_board

MpiSession::MpiSession(int* argc, char*** argv) {
  singleton_ = !std::getenv("OMPI_COMM_WORLD_SIZE") && !std::getenv("PMIX_RANK") && !std::getenv("PMI_RANK");
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "shardsim: MPI_Init_thread failed\n");
    std::exit(kExitRuntimeFault);
  }
  if (provided < MPI_THREAD_FUNNELED) {
    std::fprintf(stderr, "shardsim: MPI provides thread level %d, need at least MPI_THREAD_FUNNELED "
                         "(MPI_THREAD_MULTIPLE for async collectives)\n", provided);
    MPI_Abort(MPI_COMM_WORLD, kExitRuntimeFault);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  board_init();
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    board_free();
    MPI_Finalize();
  }
}

int MpiSession::finish(int code) {
  if (!singleton_) return code;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) board_free();
  std::fflush(nullptr);
  std::_Exit(code);
}

void check_mpi(int rc, int rank, const std::string& op) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw RuntimeFault("chip " + std::to_string(rank) + ": " + op + ": MPI error: " + std::string(text, len));
}

World::World(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

World::World(std::shared_ptr<VComm> chips)
    : comm_(MPI_COMM_WORLD), rank_(chips->rank), size_(chips->size()), vc_(std::move(chips)) {}

namespace {
void sleepy_wait(MPI_Request* req, int rank, const char* op) {
  int done = 0;
  auto pause = std::chrono::microseconds(50);
  while (true) {
    check_mpi(MPI_Test(req, &done, MPI_STATUS_IGNORE), rank, op);
    if (done) return;
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::milliseconds(5)) pause *= 2;
  }
}
}  // namespace

bool World::any(bool flag) const {
  if (vc_) {
    unsigned char any = flag ? 1 : 0;
    chips::reduce_to_all(*vc_, &any, 1, [](void* acc, const void* in) {
      *static_cast<unsigned char*>(acc) |= *static_cast<const unsigned char*>(in);
    }, "agree");
    return any != 0;
  }
  int local = flag ? 1 : 0, global = 0;
  MPI_Request req;
  check_mpi(MPI_Iallreduce(&local, &global, 1, MPI_INT, MPI_MAX, comm_, &req), rank_, "agree");
  sleepy_wait(&req, rank_, "agree");
  return global != 0;
}

void World::sleepy_barrier() const {
  if (vc_) {
    chips::allgather(*vc_, nullptr, 0, "barrier");
    return;
  }
  MPI_Request req;
  check_mpi(MPI_Ibarrier(comm_, &req), rank_, "barrier");
  sleepy_wait(&req, rank_, "barrier");
}

std::string World::broadcast(const std::string& value, int root) const {
  if (vc_) {
    const auto out = chips::broadcast(*vc_, std::vector<unsigned char>(value.begin(), value.end()), root, "broadcast");
    return std::string(out.begin(), out.end());
  }
  long long n = static_cast<long long>(value.size());
  MPI_Request req;
  check_mpi(MPI_Ibcast(&n, 1, MPI_LONG_LONG, root, comm_, &req), rank_, "broadcast");
  sleepy_wait(&req, rank_, "broadcast");
  std::string out = rank_ == root ? value : std::string(static_cast<size_t>(n), '\0');
  if (n > 0) {
    check_mpi(MPI_Ibcast(out.data(), static_cast<int>(n), MPI_CHAR, root, comm_, &req), rank_, "broadcast");
    sleepy_wait(&req, rank_, "broadcast");
  }
  return out;
}

std::vector<unsigned char> World::allgather(const void* mine, size_t n, const std::string& op) const {
  if (vc_) return chips::allgather(*vc_, mine, n, op);
  std::vector<unsigned char> out(n * static_cast<size_t>(size_));
  if (n == 0) return out;
  MPI_Request req;
  check_mpi(MPI_Iallgather(mine, static_cast<int>(n), MPI_BYTE, out.data(), static_cast<int>(n), MPI_BYTE, comm_, &req),
            rank_, op);
  sleepy_wait(&req, rank_, op.c_str());
  return out;
}

void World::agree(const std::function<void()>& check) const {
  std::string message;
  int code = 0;
  try {
    check();
  } catch (const Error& e) {
    message = e.what();
    code = e.exit_code();
  }
  int mine = code != 0 ? rank_ : size_, first = size_;
  if (vc_) {
    first = mine;
    chips::reduce_to_all(*vc_, &first, sizeof first, [](void* acc, const void* in) {
      int& a = *static_cast<int*>(acc);
      a = std::min(a, *static_cast<const int*>(in));
    }, "agree");
    if (first == size_) return;
    std::string payload = std::to_string(code) + ":" + message;
    payload = broadcast(payload, first);
    const size_t colon = payload.find(':');
    throw AgreedError(payload.substr(colon + 1), std::atoi(payload.substr(0, colon).c_str()));
  }
  MPI_Request req;
  check_mpi(MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm_, &req), rank_, "agree");
  sleepy_wait(&req, rank_, "agree");
  if (first == size_) return;
  check_mpi(MPI_Bcast(&code, 1, MPI_INT, first, comm_), rank_, "agree");
  message = broadcast(message, first);
  throw AgreedError(message, code);
}

void World::abort(int code, const std::string& message) const {
  std::fprintf(stderr, "%s\n", escape_control(message).c_str());  // one line, whatever the message echoes
  std::fflush(stderr);
  exit_job(code);
}

namespace {
void (*g_exit_hook)() = nullptr;
}  // namespace

void set_exit_hook(void (*hook)()) { g_exit_hook = hook; }

void exit_job(int code) {
  if (g_exit_hook) g_exit_hook();
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);  // other processes may wait on this one: take them down
  // A singleton (one process, any number of chips) has nobody to take down: MPI_Abort would only add Open MPI's
  // MPI_ABORT banner (or an ORTE_ERROR_LOG line) under the one line. Remove the temporaries in flight and exit.
  unlink_registered_temps();
  std::_Exit(code);  // MPI_Abort should not return; make sure
}

}  // namespace shardsim::runtime
