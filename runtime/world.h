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
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace shardsim::runtime {

// MpiSession also learns which ranks share this node (MPI_COMM_TYPE_SHARED) and sets up the node's WaitBoard.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  // The process's exit with CODE, once every output is written: a job started by a launcher (mpirun, srun) returns
  // CODE and the destructor finalizes MPI; a singleton (started without one) flushes standard output and error and
  // ends with _Exit(CODE) without MPI_Finalize, as exit_job ends a failed one. Open MPI 4.1's singleton finalize
  // can crash in its progress thread after the output is written (exit 139 about once in 100-400 runs, seen in the
  // suite: the thread calls into a component already unloaded, the pattern of open-mpi/ompi#10117); a singleton
  // has no peer to finalize with.
  int finish(int code);

 private:
  bool singleton_ = false;  // no launcher's environment (OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_RANK) at start
};

// Ranks of this job on this node: from MpiSession (MPI_COMM_TYPE_SHARED), else the launcher's environment
// (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS), else 1. Cores: std::thread::hardware_concurrency().
int node_ranks();
int node_cores();

// The node's board of synchronous waits, for the watchdog (one MPI shared-memory window per node, made by
// MpiSession; without a session every call is a no-op and available() is false). A rank that has waited a while
// publishes what it waits on (world ranks); a rank whose watchdog fires follows that wait-for graph from its own
// pending peers to the ranks that are NOT waiting (busy or hung outside communication: the stalled ones), or finds
// a cycle of waiters (a deadlock), and exactly one rank per node (claim()) prints the one line. Reads and writes
// are lock-free atomics: nothing here can block.
namespace wait_board {
bool available();
// World rank ME (chip CHIP) now waits on WORLD_PEERS (chips PEER_CHIPS).
void publish(int me, int chip, const std::vector<int>& world_peers, const std::vector<int>& peer_chips);
void clear();                                                 // ... and no longer
struct Finding {
  std::vector<int> stalled;  // world ranks reached that are not waiting
  std::vector<int> waiting;  // world ranks reached (incl. this one) that are waiting
  std::vector<int> remote;   // world ranks reached on other nodes (not inspectable)
  bool cycle = false;        // every rank reached is waiting: a deadlock among them
  std::vector<std::pair<int, int>> chips;  // (world rank, chip) as the waiters published them
  int chip_of(int world_rank) const;       // -1 if unknown
};
Finding follow(int my_world_rank, const std::vector<int>& world_peers);
// The claim carries its reason: kClaimFault (a watchdog or an error taking the job down, exit 3) or 128 + a signal
// number (a rank interrupted by the user: the other ranks, taken down by mpirun's SIGTERM, exit quietly with the
// same code). Async-signal-safe: one lock-free compare-and-swap / load.
constexpr int kClaimFault = 1;
bool claim(int reason = kClaimFault);  // true for exactly one caller per node, ever
bool claimed();                        // whether some rank of this node claimed
int claim_reason();                    // the claimer's reason, 0 if none (or no board)
bool on_this_node(int world_rank);     // whether WORLD_RANK shares this node's board (async-signal-safe)
}  // namespace wait_board

// Throws RuntimeFault "chip R: OP: MPI error: ..." when RC is not MPI_SUCCESS.
void check_mpi(int rc, int rank, const std::string& op);

struct VComm;

// In chip mode (runtime/chips.h, K > 1 chips per rank) a World is one chip's view: rank() is the chip-level world
// rank, size() the number of chips, the helpers below run over the chip-level communicator, and comm() is
// MPI_COMM_WORLD (for abort only: raw MPI collectives on it are not chip-aware).
class World {
 public:
  explicit World(MPI_Comm comm = MPI_COMM_WORLD);
  explicit World(std::shared_ptr<VComm> chips);
  MPI_Comm comm() const { return comm_; }
  // The chip-level communicator in chip mode, else null.
  const std::shared_ptr<VComm>& vcomm() const { return vc_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // True on every rank if FLAG is true on any rank.
  bool any(bool flag) const;
  // Barrier that sleeps between polls instead of spinning: while one rank does a long serial job
  // (the single-device reference) the others must not steal its core on an oversubscribed host.
  void sleepy_barrier() const;
  // Broadcasts a string from ROOT (sleepy as above).
  std::string broadcast(const std::string& value, int root) const;
  // Every rank's N bytes at MINE, in rank order, on every rank (sleepy as above; through the chip router in chip
  // mode). N must be the same on every rank. OP names the call in errors.
  std::vector<unsigned char> allgather(const void* mine, size_t n, const std::string& op) const;

  // Runs CHECK on every rank. If it throws a shardsim::Error on any rank, every rank throws AgreedError with
  // the message and exit code of the lowest failing rank, so the job fails once, cleanly, with one message.
  void agree(const std::function<void()>& check) const;

  // Prints MESSAGE to stderr and takes the whole job down with exit code CODE. Never returns.
  [[noreturn]] void abort(int code, const std::string& message) const;

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<VComm> vc_;
};

// Ends the job with exit code CODE after its one line was printed: MPI_Abort when there are other processes to
// take down, else (a singleton, any number of chips) the temporaries in flight are removed and the process exits
// without Open MPI's MPI_ABORT banner. Never returns.
[[noreturn]] void exit_job(int code);
// A function exit_job calls before the process ends (apps/main.cpp: writes out the standard output a folded attempt
// held back). Null: none.
void set_exit_hook(void (*hook)());

}  // namespace shardsim::runtime
