// Point-to-point transport between chips: real bytes over MPI, simulated time with them.
//
// Every message is a header {simulated arrival time, byte count} followed by the payload, sent in pieces of
// at most 1 GiB so sizes beyond MPI's int counts work. The sender books the transfer on its own Timeline
// (injection port busy for S/B, arrival after sum(alpha) + S/B, see sim/cost.h) and ships the arrival time;
// the receiver takes it as the time the data exists at its chip. Simulated time thus crosses ranks only
// through messages (Lamport clocks) and never depends on host timing.
//
// Ranks here are ranks of this transport's communicator; rank_to_chip maps them to topology chips. split()
// makes a transport over a subgroup (MPI_Comm_split semantics) that shares the chip's Timeline.
// Errors: UsageError (exit 2) "chip C: OP: expected N bytes from chip D, got M" when sender and receiver
// disagree on a size (mismatched counts across ranks); RuntimeFault "chip C: OP: MPI error: ..." otherwise.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sim/timeline.h"

namespace shardsim::runtime {

class Engine;
struct EngineOptions;

// Watches a transport's MPI waits (the async Engine sets one on its own transport, for its watchdog). With an
// observer set, waits become polling loops (MPI_Testsome, then a short sleep that backs off to 250 us) that
// report the ranks still pending and every completion; without one (the default) they are plain MPI waits.
class WaitObserver {
 public:
  virtual ~WaitObserver() = default;
  // RANKS (of COMM, the waiting transport's communicator) that still have requests pending.
  virtual void pending(MPI_Comm comm, const std::vector<int>& ranks) = 0;
  virtual void progressed() = 0;                            // at least one request completed
};

// One outgoing message of an exchange: BYTES at BUF to rank DST, data ready at READY (simulated).
struct SendOp {
  const void* buf = nullptr;
  size_t bytes = 0;
  int dst = 0;
  sim::TimeNs ready = 0;
};
// One incoming message: BYTES into BUF from rank SRC. exchange() fills ARRIVAL (simulated time it is here).
struct RecvOp {
  void* buf = nullptr;
  size_t bytes = 0;
  int src = 0;
  sim::TimeNs arrival = 0;
};

class Transport {
 public:
  Transport(MPI_Comm comm, sim::Timeline& timeline, std::vector<int> rank_to_chip);

  int rank() const { return rank_; }
  int size() const { return size_; }
  int chip_of(int rank) const { return rank_to_chip_.at(rank); }
  int chip() const { return chip_of(rank_); }
  const std::vector<int>& rank_to_chip() const { return rank_to_chip_; }
  MPI_Comm comm() const { return comm_; }
  sim::Timeline& timeline() { return *timeline_; }
  const topology::Topology& topology() const { return timeline_->topology(); }

  // Subgroup transport: ranks with the same COLOR form a group ordered by (KEY, rank). Collective over this
  // transport's communicator. The new transport owns its communicator.
  Transport split(int color, int key) const;
  // split(color, key), made once and cached under NAME (collective: every rank must ask for the same NAMEs in
  // the same order). Sub-transports of e.g. torus dimensions are reused across calls this way.
  Transport& subgroup(const std::string& name, int color, int key);

  // Posts every send and every receive at once and waits for all (no ordering deadlock is possible).
  // Sends are booked on the timeline in the order given. Self-messages (dst/src == rank) are allowed.
  void exchange(std::span<const SendOp> sends, std::span<RecvOp> recvs, const std::string& op);

  // Sends SBYTES at SBUF to rank DST (data ready at READY) and receives RBYTES into RBUF from rank SRC, both at
  // once (a ring step never deadlocks). Returns the simulated time the received data is at this chip.
  sim::TimeNs sendrecv(const void* sbuf, size_t sbytes, int dst, void* rbuf, size_t rbytes, int src,
                       sim::TimeNs ready, const std::string& op);
  sim::TimeNs send(const void* buf, size_t bytes, int dst, sim::TimeNs ready, const std::string& op);
  sim::TimeNs recv(void* buf, size_t bytes, int src, const std::string& op);

  // Reusable host scratch memory: SLOT (0..4) grows to at least BYTES and is kept for later calls, so large
  // collectives do not pay for fresh pages every call (page faults dominate large-message wall time otherwise).
  // The pointer stays valid until the next scratch() call on the same slot. Shared with split() transports.
  unsigned char* scratch(int slot, size_t bytes);

  // Bytes this chip has injected so far through this transport and its splits (communication-volume reports).
  double bytes_sent() const { return *bytes_sent_; }

  // The chip's asynchronous communication engine for this communicator (runtime/engine.h), made on first use:
  // that first call is collective (it duplicates the communicator). Copies of this transport share it; split()
  // transports get their own.
  Engine& engine();

  // Waits for every request in REQS (PEERS[i]: the rank REQS[i] talks to), through the observer if one is set.
  // Without one (synchronous collectives) it polls with a short spin then growing sleeps, and aborts the job with
  // exit code 3 and "shardsim: watchdog: chip C (rank R): OP made no progress for S s ...; still waiting on
  // chip(s) ..." when nothing completes for SHARDSIM_WATCHDOG_S seconds (default 300, 0 = never). Test hook:
  // SHARDSIM_TEST_STALL_SYNC_RANK=R makes world rank R sleep forever at its first such wait.
  void wait_requests(std::vector<MPI_Request>& reqs, const std::vector<int>& peers, const std::string& op);

 private:
  struct Header {
    double arrival_ns;
    unsigned long long bytes;
  };
  void check_header(const Header& h, size_t bytes, int src, const std::string& op) const;
  friend class Engine;
  // A transport over a duplicate of this communicator, on TIMELINE, with its own scratch, byte counter and
  // subgroups (nothing shared with this one: the engine's thread uses it while the main thread uses this).
  Transport duplicate(sim::Timeline& timeline) const;

  std::shared_ptr<MPI_Comm> owned_;  // set when this transport owns its (split) communicator
  MPI_Comm comm_;
  sim::Timeline* timeline_;
  std::vector<int> rank_to_chip_;
  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<double> bytes_sent_ = std::make_shared<double>(0.0);
  std::shared_ptr<std::vector<std::vector<unsigned char>>> scratch_ =
      std::make_shared<std::vector<std::vector<unsigned char>>>(5);
  std::shared_ptr<WaitObserver> observer_;  // inherited by split()
  std::shared_ptr<std::shared_ptr<Engine>> engine_ = std::make_shared<std::shared_ptr<Engine>>();
  std::shared_ptr<std::map<std::string, Transport>> subgroups_ = std::make_shared<std::map<std::string, Transport>>();
};

}  // namespace shardsim::runtime
