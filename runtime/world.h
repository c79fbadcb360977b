// The MPI world: one rank = one simulated chip.
//
// MpiSession initialises MPI asking for MPI_THREAD_MULTIPLE (the async engine's thread calls MPI while the main
// thread may too, see runtime/engine.h); it exits with code 3 and a message if MPI provides less than
// MPI_THREAD_FUNNELED (what the synchronous code needs; the engine checks for MULTIPLE when it starts). It sets
// MPI_ERRORS_RETURN so MPI failures become RuntimeFault exceptions that name the chip and op instead of
// silent aborts. World wraps a communicator with the few agreement helpers the CLI needs.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>

namespace shardsim::runtime {

class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
};

// Throws RuntimeFault "chip R: OP: MPI error: ..." when RC is not MPI_SUCCESS.
void check_mpi(int rc, int rank, const std::string& op);

class World {
 public:
  explicit World(MPI_Comm comm = MPI_COMM_WORLD);
  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // True on every rank if FLAG is true on any rank.
  bool any(bool flag) const;
  // Barrier that sleeps between polls instead of spinning: while one rank does a long serial job
  // (the single-device reference) the others must not steal its core on an oversubscribed host.
  void sleepy_barrier() const;
  // Broadcasts a string from ROOT (sleepy as above).
  std::string broadcast(const std::string& value, int root) const;

  // Runs CHECK on every rank. If it throws a shardsim::Error on any rank, every rank throws AgreedError with
  // the message and exit code of the lowest failing rank, so the job fails once, cleanly, with one message.
  void agree(const std::function<void()>& check) const;

  // Prints MESSAGE to stderr and takes the whole job down with exit code CODE. Never returns.
  [[noreturn]] void abort(int code, const std::string& message) const;

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace shardsim::runtime
