#include "runtime/transport.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "runtime/engine.h"
#include "runtime/world.h"

namespace shardsim::runtime {

namespace {
constexpr int kHeaderTag = 7001;
constexpr int kPayloadTag = 7002;
constexpr size_t kPiece = size_t{1} << 30;  // bytes per MPI message: keeps counts within int
}  // namespace

Transport::Transport(MPI_Comm comm, sim::Timeline& timeline, std::vector<int> rank_to_chip)
    : comm_(comm), timeline_(&timeline), rank_to_chip_(std::move(rank_to_chip)) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  if (static_cast<int>(rank_to_chip_.size()) != size_)
    throw RuntimeFault("transport: rank_to_chip has " + std::to_string(rank_to_chip_.size()) +
                       " entries for a communicator of " + std::to_string(size_));
}

Transport Transport::split(int color, int key) const {
  MPI_Comm sub = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm_, color, key, &sub), chip(), "communicator split");
  MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
  int n = 0;
  MPI_Comm_size(sub, &n);
  // The subgroup's rank -> chip map: every member contributes its chip.
  std::vector<int> chips(static_cast<size_t>(n));
  const int mine = chip();
  check_mpi(MPI_Allgather(&mine, 1, MPI_INT, chips.data(), 1, MPI_INT, sub), chip(), "communicator split");
  Transport t(sub, *timeline_, std::move(chips));
  t.owned_ = std::shared_ptr<MPI_Comm>(new MPI_Comm(sub), [](MPI_Comm* c) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(c);
    delete c;
  });
  t.bytes_sent_ = bytes_sent_;
  t.scratch_ = scratch_;
  t.observer_ = observer_;
  return t;
}

Transport Transport::duplicate(sim::Timeline& timeline) const {
  MPI_Comm dup = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(comm_, &dup), chip(), "communicator dup");
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  Transport t(dup, timeline, rank_to_chip_);
  t.owned_ = std::shared_ptr<MPI_Comm>(new MPI_Comm(dup), [](MPI_Comm* c) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(c);
    delete c;
  });
  return t;
}

Engine& Transport::engine() {
  if (!*engine_) *engine_ = std::make_shared<Engine>(*this);
  return **engine_;
}

namespace {

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
  static bool fired = false;
  const char* v = std::getenv("SHARDSIM_TEST_STALL_SYNC_RANK");
  if (fired || !v || !*v) return;
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  if (world_rank != std::atoi(v)) return;
  fired = true;
  std::fprintf(stderr, "shardsim: test hook SHARDSIM_TEST_STALL_SYNC_RANK: rank %d stalls in %s\n", world_rank,
               op.c_str());
  std::fflush(stderr);
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace

void Transport::wait_requests(std::vector<MPI_Request>& reqs, const std::vector<int>& peers, const std::string& op) {
  // One polling loop for both kinds of wait. Synchronous waits (no observer) spin for the first 20 us (low
  // latency when the peer is there), then sleep with a growing pause (up to 500 us) so that ranks sharing a core
  // hand it to the peer they wait for, and carry the watchdog: no request completing for SHARDSIM_WATCHDOG_S
  // seconds (default 300; 0 = never) aborts the job (exit 3) naming the op and the chips still pending. The
  // engine's waits report progress to its observer instead (its own watchdog thread watches them).
  using us = std::chrono::microseconds;
  const bool sync = !observer_;
  if (sync) maybe_stall(op);
  const double limit = sync ? sync_watchdog_s() : 0;
  const us spin = sync ? us(20) : us(0), min_pause = sync ? us(5) : us(2), max_pause = sync ? us(500) : us(250);
  auto pending = [&] {  // distinct ranks with a request still active
    std::vector<int> ranks;
    for (size_t i = 0; i < reqs.size(); ++i)
      if (reqs[i] != MPI_REQUEST_NULL && std::find(ranks.begin(), ranks.end(), peers[i]) == ranks.end())
        ranks.push_back(peers[i]);
    return ranks;
  };
  if (observer_) observer_->pending(comm_, pending());
  std::vector<int> done(reqs.size());
  auto last_progress = std::chrono::steady_clock::now();
  us pause = min_pause;
  while (true) {
    int n = 0;
    check_mpi(MPI_Testsome(static_cast<int>(reqs.size()), reqs.data(), &n, done.data(), MPI_STATUSES_IGNORE), chip(),
              op);
    if (n == MPI_UNDEFINED) break;  // no active request left
    const auto now = std::chrono::steady_clock::now();
    if (n > 0) {
      last_progress = now;
      pause = min_pause;
      if (observer_) {
        observer_->progressed();
        observer_->pending(comm_, pending());
      }
      continue;
    }
    if (now - last_progress < spin) continue;
    const double idle = std::chrono::duration<double>(now - last_progress).count();
    if (limit > 0 && idle >= limit) {
      std::string chips;
      for (int r : pending()) chips += (chips.empty() ? " " : ", ") + std::to_string(chip_of(r));
      int world_rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
      std::fprintf(stderr,
                   "shardsim: watchdog: chip %d (rank %d): %s made no progress for %.0f s (limit "
                   "SHARDSIM_WATCHDOG_S=%g); still waiting on chip(s)%s\n",
                   chip(), world_rank, op.c_str(), idle, limit, chips.c_str());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, kExitRuntimeFault);
    }
    std::this_thread::sleep_for(pause);
    if (pause < max_pause) pause *= 2;
  }
  if (observer_) observer_->pending(comm_, {});
}

unsigned char* Transport::scratch(int slot, size_t bytes) {
  auto& buf = scratch_->at(static_cast<size_t>(slot));
  if (buf.size() < bytes) {
    buf.clear();
    buf.shrink_to_fit();
    buf.resize(bytes);
  }
  return buf.data();
}

Transport& Transport::subgroup(const std::string& name, int color, int key) {
  auto it = subgroups_->find(name);
  if (it == subgroups_->end()) it = subgroups_->emplace(name, split(color, key)).first;
  return it->second;
}

void Transport::check_header(const Header& h, size_t bytes, int src, const std::string& op) const {
  if (h.bytes != bytes)
    throw UsageError("chip " + std::to_string(chip()) + ": " + op + ": expected " + std::to_string(bytes) +
                     " bytes from chip " + std::to_string(chip_of(src)) + ", got " + std::to_string(h.bytes) +
                     " (counts differ across ranks?)");
}

void Transport::exchange(std::span<const SendOp> sends, std::span<RecvOp> recvs, const std::string& op) {
  std::vector<Header> out(sends.size()), in(recvs.size());
  std::vector<MPI_Request> reqs;
  std::vector<int> peers;  // rank of each request
  for (size_t i = 0; i < sends.size(); ++i) {
    const SendOp& s = sends[i];
    const sim::Span span = timeline_->send(op, chip_of(s.dst), static_cast<double>(s.bytes), s.ready);
    *bytes_sent_ += s.dst == rank_ ? 0.0 : static_cast<double>(s.bytes);
    out[i] = {span.end, s.bytes};
    reqs.emplace_back();
    peers.push_back(s.dst);
    check_mpi(MPI_Isend(&out[i], sizeof(Header), MPI_BYTE, s.dst, kHeaderTag, comm_, &reqs.back()), chip(), op);
    const auto* p = static_cast<const unsigned char*>(s.buf);
    for (size_t off = 0; off < s.bytes; off += kPiece) {
      reqs.emplace_back();
      peers.push_back(s.dst);
      check_mpi(MPI_Isend(p + off, static_cast<int>(std::min(kPiece, s.bytes - off)), MPI_BYTE, s.dst, kPayloadTag,
                          comm_, &reqs.back()),
                chip(), op);
    }
  }
  // Each header is received and checked before its payload is posted: a size mismatch must become a clear
  // error, not a truncation fault inside MPI. Every send above is already posted, so this cannot deadlock.
  for (size_t i = 0; i < recvs.size(); ++i) {
    RecvOp& r = recvs[i];
    std::vector<MPI_Request> h(1);  // through wait_requests: the watchdog sees this wait too
    check_mpi(MPI_Irecv(&in[i], sizeof(Header), MPI_BYTE, r.src, kHeaderTag, comm_, h.data()), chip(), op);
    wait_requests(h, {r.src}, op);
    check_header(in[i], r.bytes, r.src, op);
    auto* p = static_cast<unsigned char*>(r.buf);
    for (size_t off = 0; off < r.bytes; off += kPiece) {
      reqs.emplace_back();
      peers.push_back(r.src);
      check_mpi(MPI_Irecv(p + off, static_cast<int>(std::min(kPiece, r.bytes - off)), MPI_BYTE, r.src, kPayloadTag,
                          comm_, &reqs.back()),
                chip(), op);
    }
  }
  wait_requests(reqs, peers, op);
  for (size_t i = 0; i < recvs.size(); ++i) recvs[i].arrival = in[i].arrival_ns;
}

sim::TimeNs Transport::sendrecv(const void* sbuf, size_t sbytes, int dst, void* rbuf, size_t rbytes, int src,
                                sim::TimeNs ready, const std::string& op) {
  if (dst == rank_ && src == rank_) {
    if (sbytes != rbytes) check_header(Header{0, sbytes}, rbytes, src, op);
    if (sbytes && sbuf != rbuf) std::memmove(rbuf, sbuf, sbytes);
    return ready;
  }
  const SendOp s{sbuf, sbytes, dst, ready};
  RecvOp r{rbuf, rbytes, src, 0};
  exchange({&s, 1}, {&r, 1}, op);
  return std::max(ready, r.arrival);
}

sim::TimeNs Transport::send(const void* buf, size_t bytes, int dst, sim::TimeNs ready, const std::string& op) {
  const SendOp s{buf, bytes, dst, ready};
  exchange({&s, 1}, {}, op);
  return ready;
}

sim::TimeNs Transport::recv(void* buf, size_t bytes, int src, const std::string& op) {
  RecvOp r{buf, bytes, src, 0};
  exchange({}, {&r, 1}, op);
  return r.arrival;
}

}  // namespace shardsim::runtime
