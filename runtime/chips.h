// Several chips per MPI rank (issue 17): each chip runs in its own cooperative execution context (a
// Boost.Context fiber) and talks to the other chips through chip-level virtual communicators.
//
// Numbering: with K chips per rank, chip-level world rank g = world_rank * K + slot (slot 0..K-1 on that rank);
// the chip-level world has ranks * K members. Subgroups (Transport::split) are chip-level too.
//
// Messages: a chip's Transport (runtime/transport.h) in chip mode hands every message to the rank's Router.
// A message to a chip of the same rank is appended to an in-memory mailbox keyed by (communicator context,
// source chip, destination chip); one to a chip of another rank goes over MPI (one MPI message per piece of at
// most 1 GiB, tag kChipTag on the router's duplicate of MPI_COMM_WORLD) whose wire header names the context and
// both chips, and lands in the same kind of mailbox on arrival. Mailboxes are FIFO per key, which keeps MPI's
// non-overtaking order per (sender, receiver, communicator). The payload is copied into the mailbox (buffered
// send), so a send never waits; a receive waits until its message is in the mailbox.
//
// Waiting: a chip that waits yields to the scheduler (never blocks the OS thread in MPI while a local chip could
// run). The scheduler, on the rank's main context, resumes the chips whose wait may have ended and runs the one
// progress loop of the rank (MPI_Improbe/MPI_Mrecv for arrivals, MPI_Testsome for sends). Only the scheduler
// calls MPI for chip traffic. When a whole round changes nothing it backs off (spin, sched_yield, then sleeps up
// to 500 us), and when nothing changes for SHARDSIM_WATCHDOG_S seconds it prints one line naming the stalled
// chip(s) and the chips waiting on them, and aborts the job with exit code 3.
//
// Simulated time is untouched by any of this: a chip books its sends on its own Timeline in the order the code
// issues them and ships the arrival time in the header, exactly as with one chip per rank, so data and simulated
// times never depend on K.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <memory>
#include <string>
#include <vector>

namespace shardsim::runtime {

class World;

// A chip-level communicator: CTX is the same on every member; MEMBERS maps member rank -> chip-level world rank.
// The map is immutable and shared by the members of this rank that hold an equal one (chips::shared_ints), so a
// rank hosting K chips of an N-chip group keeps one copy, not K.
struct VComm {
  uint64_t ctx = 0;
  std::shared_ptr<const std::vector<int>> members = std::make_shared<const std::vector<int>>();
  int rank = 0;
  uint64_t splits = 0;  // splits made from this communicator so far (the same on every member)
  int size() const { return static_cast<int>(members->size()); }
  int member(int r) const { return (*members)[static_cast<size_t>(r)]; }
};

// Chips per rank of the running job (1 outside run_chips or with K = 1).
int chips_per_rank();
// True while chips run as fibers (K > 1): Transport and World then use chip-level communicators.
bool chip_mode();

// A folded run (docs/performance/fold.md): CHIPS chip-level world ranks whose dp coordinate is
// c(g) = (g / STRIDE) % SIZE (a tp-cp-dp-pp mesh: STRIDE = tp * cp, SIZE = dp), in SIZE / PERIOD identical blocks of
// PERIOD consecutive dp coordinates (the replica of g: c(g) / PERIOD). Only replica 0 runs (CHIPS * PERIOD / SIZE
// fibers on one MPI rank); a message to a chip r replicas on is delivered to the chip r replicas back as if sent by
// this chip's image r replicas back (the mirror), and a mirrored chip's control-plane contribution is its
// mirror's. PERIOD < 1: not folded.
// FALLBACK (fold: auto): a break of the symmetry ends the folded attempt instead of the job: run_chips unwinds
// every chip and returns kFoldFellBack, and the caller runs the job again unfolded (apps/main.cpp).
struct FoldSpec {
  int chips = 0;
  int stride = 1;
  int size = 1;
  int period = 0;
  bool fallback = false;
  bool on() const { return period >= 1 && period < size; }
};
// run_chips' code for a folded attempt that fell back (FoldSpec::fallback); chips::fold_fallback_reason() says why.
constexpr int kFoldFellBack = -1;

// Runs BODY once per chip of this rank, each in its own fiber, and returns the first non-zero code any chip
// returned (0 if none). With K == 1 BODY runs directly on World(MPI_COMM_WORLD) (no fibers, no router): nothing
// changes. An exception escaping BODY is printed with its chip and takes the job down with its exit code
// (shardsim::Error) or 3. Collective over MPI_COMM_WORLD; every rank passes the same K >= 1.
// FOLD (one MPI rank only; FoldSpec::on): K is ignored; the chips of replica 0 run, in a world of FOLD.chips.
int run_chips(int k, const std::function<int(const World&)>& body, const FoldSpec& fold = {});

namespace chips {
// The chip-level world rank of the chip running now (-1 outside chip mode).
int current();
// Folded run (FoldSpec): whether this run is folded, whether world rank CHIP runs (replica 0; always true when not
// folded), and the chip of replica 0 that CHIP mirrors (CHIP itself when not folded).
bool folded();
bool simulated(int chip);
int mirror_of(int chip);
// Folded run: the chip one replica on from CHIP (the replica shift sigma; CHIP itself when not folded). A collective
// over mirrored chips is exact when sigma maps its program onto itself (collectives/algorithms.cpp, choose).
int replica_image(int chip);
// Ends a folded run whose replicas turned out not to be provably identical: RuntimeFault (exit 3) "fold: WHY ...",
// or with FoldSpec::fallback the folded attempt: it then throws a private type that no catch of shardsim's takes
// (none catches (...) without rethrowing on a chip's path), and run_chips returns kFoldFellBack.
[[noreturn]] void fold_broken(const std::string& why);
// The same decided from the plan before the run's first step (collectives::fold_obstacle over the plan's calls):
// under fold: on (no fallback) a UsageError, exit 2, "fold: this run does not fold: WHY" (the setting cannot
// hold and nothing ran: bad input, not a fault of the run; issue 46 kind 7); with the fallback, as fold_broken.
[[noreturn]] void fold_refused(const std::string& why);
// Why the last folded attempt fell back ("" if it did not).
std::string fold_fallback_reason();
// A folded run, at a point where every chip has received every message of the work before it (after an agreement
// over all chips): fold_broken if a mirrored message is still waiting (nobody received it: the replicas were not
// identical). No-op otherwise.
void fold_verify(const std::string& op);
// A progress report for long runs (chip mode): the scheduler calls FN(events so far, seconds since set) every
// EVERY_S seconds of wall time from the main context (between chip resumes; FN must not touch a chip's state).
// An empty FN stops it. No-op outside chip mode.
void set_progress(std::function<void(uint64_t events, double elapsed_s)> fn, double every_s);
// Chip-level scheduler events so far on this rank (messages delivered, chips finished): the report's host line.
uint64_t events();
// Waits (yielding to the other chips) until DONE() is true. OP and PEERS (chip-level world ranks) describe the
// wait for the watchdog.
void wait_until(const std::function<bool()>& done, const std::string& op, const std::vector<int>& peers);
// As wait_until, for a wait that DONE() ends exactly when one message from each (context, source chip) in MISSING
// has been posted to this chip: the chip is resumed once, when the last of them arrives, not on every delivery.
void wait_until_all(const std::function<bool()>& done, const std::string& op, std::span<const int> peers,
                    std::span<const std::pair<uint64_t, int>> missing);

// One message between chips (chip mode only): posts BYTES at BUF (nullptr: header only, the byte count still
// travels) with HEADER (opaque, HEADER_BYTES <= 128) from chip SRC to chip DST under communicator context CTX.
void post(uint64_t ctx, int src, int dst, const void* header, size_t header_bytes, const void* buf, size_t bytes);
// The oldest message from SRC to DST under CTX, if it is here: copies its header to HEADER (HEADER_BYTES) and
// returns true; BYTES gets its payload size (0 for a header-only message). take() then copies the payload to
// BUF (nullptr: drops it) and removes the message.
// As post without a header, for a payload several chips receive: a chip of this MPI rank gets PAYLOAD itself (no
// copy, kept until the last receiver takes it), a chip of another rank a copy.
void post_shared(uint64_t ctx, int src, int dst, const std::shared_ptr<const std::vector<unsigned char>>& payload);
bool peek(uint64_t ctx, int src, int dst, void* header, size_t header_bytes, size_t* bytes);
void take(uint64_t ctx, int src, int dst, void* buf);

// Control-plane collectives over a chip-level communicator (no simulated time, no byte counts): every member
// contributes N bytes, every member gets all of them in member order (allgather through member 0).
std::vector<unsigned char> allgather(const VComm& c, const void* mine, size_t n, const std::string& op);
// Every member contributes N bytes at DATA; member 0 folds them in member order (COMBINE(acc, other): member 0's
// bytes first, then member 1's, ...) and every member gets the result in DATA. O(members x N) bytes per call for
// the whole rank (an allgather would be O(members^2 x N)): the control-plane reductions (agreement, verdicts).
void reduce_to_all(const VComm& c, void* data, size_t n, const std::function<void(void*, const void*)>& combine,
                   const std::string& op);
// ROOT's VALUE on every member.
std::vector<unsigned char> broadcast(const VComm& c, const std::vector<unsigned char>& value, int root,
                                     const std::string& op);
// Every member's bytes on ROOT, in member order (other members get an empty result). Members may contribute
// different sizes (MINE, N): a variable-length gather through the router (one message per member, no reply).
std::vector<std::vector<unsigned char>> gather(const VComm& c, const void* mine, size_t n, int root,
                                               const std::string& op);
// The chip-level world communicator of this rank's chips (chip mode only).
std::shared_ptr<VComm> world_comm(int chip);

// Per-rank hand-over (chip mode only), for work that must be done once per MPI rank for all K chips of the rank,
// such as the collective calls of parallel HDF5 (MPI-IO is collective per MPI rank, and the chips are fibers of
// one rank). Every chip of the rank calls rank_handover with its own contribution MINE (any pointer; it must stay
// valid until the call returns), in the same order as its other rank-level work. The rank's chip 0 (slot 0) waits
// until all K chips have arrived (a gather of the K pointers through the router), then runs FN once with the K
// pointers in slot order (FN may write results through them), then tells every chip the outcome. Every chip then
// returns, or throws an error of the same class and message as the one FN threw (shardsim::Error subclasses keep
// their class and exit code; any other exception becomes RuntimeFault "internal error: ...").
// Why it cannot deadlock: FN runs only after every chip of the rank reached the same point, so every message
// these chips send before that point has been posted; while FN blocks the OS thread in an MPI call, MPI's progress
// rule completes those posted sends (and the other ranks' routers keep receiving), so a chip of another rank that
// still needs one of them reaches its own hand-over. The other ranks' FNs make the same MPI calls in the same order,
// since every rank's chips make the same hand-over calls in the same order.
void rank_handover(void* mine, const std::function<void(const std::vector<void*>&)>& fn, const std::string& op);
// V as an immutable vector shared with every earlier call on this rank that passed an equal one and whose result is
// still held (chip mode: the chips of a rank are fibers of one thread, so no locking; outside chip mode a fresh
// copy). For per-chip maps of a group's size (Transport's rank -> chip map, VComm::members): one copy per rank.
std::shared_ptr<const std::vector<int>> shared_ints(std::vector<int> v);
}  // namespace chips

}  // namespace shardsim::runtime
