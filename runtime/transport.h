// Point-to-point transport between chips: real bytes over MPI, simulated time with them.
//
// Every message is a header {simulated arrival time, byte count} followed by the payload, sent in pieces of
// at most 1 GiB so sizes beyond MPI's int counts work. The sender books the transfer on its own Timeline
// (injection port busy for S/B, arrival after sum(alpha) + S/B, see sim/cost.h) and ships the arrival time;
// the receiver takes it as the time the data exists at its chip. Simulated time thus crosses ranks only
// through messages (Lamport clocks) and never depends on host timing.
//
// Ranks here are ranks of this transport's communicator; rank_to_chip maps them to topology chips.
// Errors: RuntimeFault "chip C: OP: ..." on MPI failure or on a size mismatch between sender and receiver.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

#include "sim/timeline.h"

namespace shardsim::runtime {

class Transport {
 public:
  Transport(MPI_Comm comm, sim::Timeline& timeline, std::vector<int> rank_to_chip);

  int rank() const { return rank_; }
  int size() const { return size_; }
  int chip_of(int rank) const { return rank_to_chip_.at(rank); }
  int chip() const { return chip_of(rank_); }
  MPI_Comm comm() const { return comm_; }
  sim::Timeline& timeline() { return *timeline_; }

  // Sends SBYTES at SBUF to rank DST (data ready at READY) and receives RBYTES into RBUF from rank SRC, both at
  // once (a ring step never deadlocks). Returns the simulated time the received data is at this chip.
  sim::TimeNs sendrecv(const void* sbuf, size_t sbytes, int dst, void* rbuf, size_t rbytes, int src,
                       sim::TimeNs ready, const std::string& op);
  sim::TimeNs send(const void* buf, size_t bytes, int dst, sim::TimeNs ready, const std::string& op);
  sim::TimeNs recv(void* buf, size_t bytes, int src, const std::string& op);

  // Bytes this chip has injected so far (for communication-volume reports).
  double bytes_sent() const { return bytes_sent_; }

 private:
  struct Header {
    double arrival_ns;
    unsigned long long bytes;
  };
  void post_send(const void* buf, size_t bytes, int dst, sim::TimeNs ready, const std::string& op, Header& h,
                 std::vector<MPI_Request>& reqs);
  void post_recv(void* buf, size_t bytes, int src, Header& h, std::vector<MPI_Request>& reqs,
                 const std::string& op);
  void check_header(const Header& h, size_t bytes, int src, const std::string& op) const;

  MPI_Comm comm_;
  sim::Timeline* timeline_;
  std::vector<int> rank_to_chip_;
  int rank_ = 0;
  int size_ = 1;
  double bytes_sent_ = 0;
};

}  // namespace shardsim::runtime
