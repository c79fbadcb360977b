// Point-to-point transport between chips: real bytes over MPI, simulated time with them.
//
// Every message carries a header {simulated arrival time, byte count, the sender's call signature}. A payload of
// at most kPackBytes travels inside the header's message (one MPI message, packed through a reusable staging
// buffer); a larger one follows in pieces of at most 1 GiB (so sizes beyond MPI's int counts work), received
// straight into the caller's buffer and posted together with the header receive (no round trip between them).
// The sender books the transfer on its own Timeline (injection port busy for S/B, arrival after
// sum(alpha) + S/B, see sim/cost.h) and ships its start and arrival time; the receiver books the flow on the links
// of its route against the other flows addressed to it (sim::Timeline::receive: per exchange in (start, source
// chip) order, exchanges in program order), which can only delay it, and takes the result as the time the data
// exists at its chip. Simulated time thus crosses ranks only through messages (Lamport clocks) and never depends
// on host timing.
//
// Ranks here are ranks of this transport's communicator; rank_to_chip maps them to topology chips. split()
// makes a transport over a subgroup (MPI_Comm_split semantics) that shares the chip's Timeline.
// Errors: UsageError (exit 2) "chip C: OP: expected N bytes from chip D, got M" when sender and receiver
// disagree on a size (mismatched counts across ranks), or "chip C: OP: ranks disagree on FIELD: ..." when the
// signatures of the collective calls (CallSignature, set by SignatureScope) differ; RuntimeFault
// "chip C: OP: MPI error: ..." otherwise.
//
// Waiting (wait_requests): see WaitMode. Hot path: exchange() allocates nothing once its reusable vectors and
// staging buffers have grown to the largest exchange seen.
#pragma once

#include <mpi.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <unordered_set>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "sim/timeline.h"

namespace shardsim::runtime {

class Engine;
struct EngineOptions;
class World;
struct VComm;

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

// What a collective call was asked to do, as each rank sees it (collectives::check_args fills it). Carried in
// every message header sent while a SignatureScope is active on the sending thread, and compared on receipt with
// the receiver's own: a mismatch is a UsageError naming the field and both chips (exit 2). collective < 0: no
// signature (plain point-to-point traffic), never compared.
struct CallSignature {
  int32_t collective = -1;
  int32_t dtype = 0;
  int32_t op = 0;
  int32_t root = 0;
  uint64_t count = 0;
  uint64_t algorithm = 0;  // hash of the algorithm name as given
  int32_t shape_only = 0;  // 1: the call runs in shape-only mode (Transport::shape_only)
  uint64_t hash() const;
  bool operator==(const CallSignature&) const = default;
};

// Sets the calling thread's current call signature for the scope's lifetime (restores the previous one after).
class SignatureScope {
 public:
  explicit SignatureScope(const CallSignature& sig);
  ~SignatureScope();
  SignatureScope(const SignatureScope&) = delete;
  SignatureScope& operator=(const SignatureScope&) = delete;
  static const CallSignature& current();
  // Replaces the calling thread's current signature (runtime/chips: each chip fiber keeps its own).
  static void set_current(const CallSignature& sig);

 private:
  CallSignature saved_;
};

// How synchronous waits (no WaitObserver) wait for MPI requests. Chosen once per process from SHARDSIM_WAIT
// (spin | yield | sleep | auto; default auto). Every mode polls MPI_Testsome; while nothing completes it
//   spin:  polls back to back for 50 us, then calls sched_yield() between polls up to 1 ms of idleness;
//   yield: calls sched_yield() between polls from the start (a rank sharing a core hands it to the peer it waits
//          for), up to 200 us of idleness;
//   sleep: polls for 20 us, then sleeps (the behaviour before issue 15);
//   auto:  spin. Measured side by side against yield with 4 ranks on 2 shared cores (docs/performance/host.md, "Waiting on a shared core"),
//          spin's short spin-then-yield phases won at 4-64 KiB, so auto does not switch on node_ranks() > cores.
//          (On an oversubscribed node Open MPI turns on mpi_yield_when_idle, so every MPI_Testsome that completes
//          nothing already yields the core; a futex doorbell that slept in the kernel instead measured no better.)
// After those phases every mode sleeps, with pauses growing from 20 us (sleep: 5 us) to 500 us, so ranks waiting
// on a long serial job (a reference computation) do not steal its core.
enum class WaitMode { spin, yield, sleep };
WaitMode wait_mode();
const char* wait_mode_name(WaitMode m);

// One outgoing message of an exchange: BYTES at BUF to rank DST, data ready at READY (simulated).
// TIMED false: the message carries data whose simulated movement the caller books itself (the in-switch
// collectives, collectives/in_switch.h: the data goes up to a switch and the reduced result comes down, booked with
// send_to_switch and Timeline::receive); it books nothing on the timeline, adds nothing to bytes_sent() and
// arrives at READY (its header still carries the call signature and byte count, checked as usual). The receiver's
// RecvOp must say TIMED false too.
struct SendOp {
  const void* buf = nullptr;
  size_t bytes = 0;
  int dst = 0;
  sim::TimeNs ready = 0;
  bool timed = true;
};
// One incoming message: BYTES into BUF from rank SRC. exchange() fills ARRIVAL (simulated time it is here; an
// untimed message: its sender's READY).
struct RecvOp {
  void* buf = nullptr;
  size_t bytes = 0;
  int src = 0;
  sim::TimeNs arrival = 0;
  bool timed = true;
};

// The global flow pattern of one exchange step (crossing-flow contention, docs/MODEL.md "Links and contention"):
// the (source rank, destination rank) pairs of every rank's sends in the step, identical on every rank and known
// without communication (SPMD algorithms: ring shift r -> r +- 1 (collective and fused rings), all_to_all r ->
// every other rank, halving-doubling's / recursive doubling's XOR partner and Thakur's fold / unfold, one level of
// a binomial tree). A pair listed N times is N flows: list one per message the step sends on that pair, since a
// step's flows are charged together (sim::Timeline::begin_step), not one after the other. KEY names the pattern
// uniquely within a communicator (the memo key: the link sharing is computed once per communicator and key);
// EXPAND(p, out) appends the pairs for a group of P ranks. Keys: shift 1 (mod 4), all_pairs 2, halving_doubling
// 3 (mod 4), binomial 4 (mod 16).
struct FlowPattern {
  uint64_t key = 0;
  void (*expand)(int p, uint64_t arg, std::vector<std::pair<int, int>>& out) = nullptr;
  uint64_t arg = 0;  // passed to EXPAND (the pattern's parameters)
  // Every rank r sends LANES flows to r + d for each d of D1 and (if nonzero) D2, mod p (ring steps).
  static FlowPattern shift(int d1, int d2, int lanes);
  // Every rank sends one flow to every other rank (all_to_all as one step).
  static FlowPattern all_pairs();
  // Halving-doubling: virtual rank v and v ^ DIST exchange, virtual ranks mapped to ranks by Thakur's fold
  // (the first 2*(p - pow2) ranks pair up; v < rem is rank 2v + 1, else v + rem); DIST == 0: the fold step
  // (rank 2i -> 2i + 1 for i < rem) and, with REVERSE, the unfold (2i + 1 -> 2i).
  static FlowPattern halving_doubling(int dist, bool reverse);
  // One level of a binomial tree rooted at rank ROOT (collectives/tree.cpp), in root-relative ranks
  // v = (r - ROOT) mod p: every v with v % (2 MASK) == 0 and v + MASK < p sends one flow to v + MASK (broadcast:
  // the level at which v + MASK receives); UP: v + MASK sends to v instead (reduce). MASK: a power of two < p;
  // ROOT: 0 <= ROOT < p (p <= 2^24).
  static FlowPattern binomial(int mask, int root, bool up);
  std::vector<std::pair<int, int>> pairs(int p) const;
  // The link sharing of this pattern on a group whose rank r is chip RANK_TO_CHIP[r] of TOPO (sim::StepShare);
  // nullptr when no two senders' flows meet on any link (the pattern changes nothing). Used by
  // Transport::step_share and the cost model's replay, which memoize it by KEY.
  std::shared_ptr<const sim::StepShare> share_on(const topology::Topology& topo,
                                                 const std::vector<int>& rank_to_chip) const;
};

// Reduction of the control-plane helpers (Transport::allreduce).
enum class Reduce { sum, max, min };

// The receive side's tie order (Transport::book_arrivals, collectives' Replay): flows into member ME of a group of
// P that start together are booked by their sender's offset (SRC - ME) mod P, then in program order.
inline int group_offset(int src, int me, int p) { return ((src - me) % p + p) % p; }

class Transport {
 public:
  Transport(MPI_Comm comm, sim::Timeline& timeline, std::vector<int> rank_to_chip);
  // Over WORLD's communicator: MPI (as above) with one chip per rank; in chip mode (runtime/chips.h) the chip-level
  // world communicator, messages between chips of one rank through memory, to other ranks through MPI.
  Transport(const World& world, sim::Timeline& timeline, std::vector<int> rank_to_chip);

  int rank() const { return rank_; }
  int size() const { return size_; }
  int chip_of(int rank) const { return rank_to_chip_->at(static_cast<size_t>(rank)); }
  // A folded run (docs/performance/fold.md): whether this group has members that are mirrored, not simulated
  // (false outside a folded run). O(members).
  bool spans_mirrored() const;
  int chip() const { return chip_of(rank_); }
  const std::vector<int>& rank_to_chip() const { return *rank_to_chip_; }
  // The MPI communicator (MPI_COMM_NULL in chip mode: use the helpers below instead of raw MPI collectives).
  MPI_Comm comm() const { return comm_; }
  bool chip_mode() const { return static_cast<bool>(vc_); }

  // Control-plane collectives over this communicator (no simulated time, no byte counts), for agreement, verdicts
  // and wall-clock maxima: V becomes the element-wise reduction over all ranks. MPI: MPI_Iallreduce waited for as
  // wait_requests() does (watchdog included); chip mode: through the chip router.
  void allreduce(std::span<int64_t> v, Reduce r, const std::string& op);
  void allreduce(std::span<unsigned long long> v, Reduce r, const std::string& op);
  void allreduce(std::span<double> v, Reduce r, const std::string& op);
  // Every rank's V, in rank order.
  std::vector<int64_t> allgather(int64_t v, const std::string& op);
  // ROOT's VALUE on every rank (World::broadcast over this communicator).
  std::string broadcast(const std::string& value, int root, const std::string& op);
  // MPI_Barrier (chip mode: an empty allgather).
  void barrier(const std::string& op);
  sim::Timeline& timeline() { return *timeline_; }
  const topology::Topology& topology() const { return timeline_->topology(); }

  // Subgroup transport: ranks with the same COLOR form a group ordered by (KEY, rank). Collective over this
  // transport's communicator. The new transport owns its communicator.
  // COLOR_KEY_OF (optional): every rank's (color, key) as a function of its rank here, the rule this rank's own
  // arguments follow; a folded run (runtime/chips.h, FoldSpec) needs it to split a communicator with mirrored
  // chips, which make no call (docs/performance/fold.md). Unused otherwise.
  Transport split(int color, int key,
                  const std::function<std::pair<int, int>(int rank)>& color_key_of = {}) const;
  // split(color, key), made once and cached under NAME (collective: every rank must ask for the same NAMEs in
  // the same order). Sub-transports of e.g. torus dimensions are reused across calls this way.
  Transport& subgroup(const std::string& name, int color, int key,
                      const std::function<std::pair<int, int>(int rank)>& color_key_of = {});

  // Posts every send and every receive at once and waits for all (no ordering deadlock is possible).
  // Sends are booked on the timeline in the order given. Self-messages (dst/src == rank) are allowed.
  // PATTERN (optional): the step's global flow pattern; flows that meet flows of other senders on a link are then
  // charged their share of it (sim::Timeline::begin_step). Every rank of the step must pass the same pattern.
  void exchange(std::span<const SendOp> sends, std::span<RecvOp> recvs, const std::string& op,
                const FlowPattern* pattern = nullptr);
  // The link sharing of PATTERN on this communicator's chips (memoized per key; nullptr when no two senders'
  // flows meet on any link, i.e. the pattern changes nothing).
  const sim::StepShare* step_share(const FlowPattern& pattern) const;

  // Sends SBYTES at SBUF to rank DST (data ready at READY) and receives RBYTES into RBUF from rank SRC, both at
  // once (a ring step never deadlocks). Returns the simulated time the received data is at this chip.
  sim::TimeNs sendrecv(const void* sbuf, size_t sbytes, int dst, void* rbuf, size_t rbytes, int src,
                       sim::TimeNs ready, const std::string& op, const FlowPattern* pattern = nullptr);
  // One message each way as an exchange of its own; PATTERN as in exchange() (the sender and the receiver of a
  // step both pass it).
  sim::TimeNs send(const void* buf, size_t bytes, int dst, sim::TimeNs ready, const std::string& op,
                   const FlowPattern* pattern = nullptr);
  sim::TimeNs recv(void* buf, size_t bytes, int src, const std::string& op, const FlowPattern* pattern = nullptr);
  // In-switch collectives: BYTES from this chip up to NODE, a switch its up-link reaches directly, at READY, booked
  // on the timeline (Timeline::send to the switch: the port and the up-link) and counted in bytes_sent(). Returns
  // {start, arrival at the switch}. No message: the data travels in untimed messages (SendOp::timed).
  sim::Span send_to_switch(int node, double bytes, sim::TimeNs ready, const std::string& op);

  // Shape-only mode (issue 17; PyTorch's "meta device" idea): while set, every message of exchange()/send()/
  // recv()/sendrecv() moves only its timing header. The sender still books its full byte count on the Timeline
  // and in bytes_sent(), the header still carries the byte count and call signature (and a receiver still checks
  // them), so simulated times equal those of real data exactly; no payload is read or written, whatever the
  // buffer pointers (they may be null or point nowhere), and scratch() allocates nothing and returns nullptr.
  // Collectives skip their reductions and copies (collectives/types.h: data_ops). Shared by copies, split() and
  // subgroup() transports of this communicator (set it before or after making them: one flag for the family).
  // Every rank must set the same mode: it is part of each collective's CallSignature, so a mismatch is a
  // UsageError (exit 2) rather than a hang.
  bool shape_only() const { return *shape_only_; }
  void set_shape_only(bool on) { *shape_only_ = on; }
  // A plan's collectives (docs/CONFIG.md, parallel.algorithm): while set, a named algorithm that a collective does
  // not implement, or any name on a group of one chip (nothing moves), runs as auto (collectives::plan_algorithm);
  // a name the collective implements still runs, or is refused where it cannot (UsageError, exit 2). Shared by
  // copies, split() and subgroup() transports as shape_only is. Off: the name is taken as given (bench, validate).
  bool plan_algorithms() const { return *plan_algorithms_; }
  void set_plan_algorithms(bool on) { *plan_algorithms_ = on; }

  // Reusable host scratch memory: SLOT (0..4) grows to at least BYTES and is kept for later calls, so large
  // collectives do not pay for fresh pages every call (page faults dominate large-message wall time otherwise).
  // The pointer stays valid until the next scratch() call on the same slot. Shared with split() transports.
  unsigned char* scratch(int slot, size_t bytes);

  // ---- Argument agreement of collective calls (collectives::check_args; issue 15) ----
  // Every check_args call on this communicator takes the next call number (program order: the same on every rank
  // that makes the same calls). A call whose signature HASH every rank agreed on before (agreed(HASH)) skips the
  // round: note_skipped(FIELDS, NAMES) only records the call's fields (no communication). A new signature is agreed
  // by agree_max(V, ...): V becomes the element-wise max over all ranks, by recursive doubling over point-to-point
  // messages on a duplicate of the communicator (made by the first agreement, which every rank makes), tagged with
  // the call number (for a size p that is not a power of two, each of the p - 2^k extra ranks first swaps values
  // with its partner below 2^k, both ways, and gets the result from it at the end).
  // The mixed case: some ranks call with a signature agreed before (they skip the round) while others call with a
  // new one (they wait in the round). A skipping rank that, while it waits on this communicator (wait_requests),
  // finds an agreement message for its current call, or for an earlier one, throws UsageError (exit 2) "chip C: OP:
  // ranks disagree on FIELD: chip C V (agreed before), chip D W (new)": in the smallest aligned block of 2^j ranks
  // that holds both kinds, an agreeing rank always sends to a skipping one before it waits, so a skipping rank that
  // waits on this communicator during or after the call is told. It ends the job (apps abort on Error), also
  // releasing the agreeing ranks. A skipping rank that never waits on this communicator again still ends by the
  // watchdog (exit 3). Chip mode (K > 1 chips per rank) agrees every call through the chip router's fold
  // (collectives::check_args never skips there), so the mixed case cannot arise: a changed signature is an
  // ordinary disagreement (exit 2). Call numbers are compared modulo 2^15 (MPI's minimum tag bound): ranks
  // may drift apart by up to 16,383 calls.
  bool agreed(uint64_t hash) const { return agree_->agreed.count(hash) != 0; }
  int64_t calls() const { return agree_->calls; }  // argument checks so far on this communicator
  void mark_agreed(uint64_t hash) const;
  void note_skipped(std::span<const int64_t> fields, const char* const* names);
  void agree_max(std::span<int64_t> v, const char* const* names, const std::string& op);
  // Memo of per-communicator decisions that depend only on the group and its topology (collectives::choose keys
  // the auto algorithm by collective, bytes, chunk size and option hash). Shared by copies; split() gets its own.
  // In chip mode one memo per (communicator, rank -> chip map, topology links) is shared by all chips of this
  // rank, so a group's candidates are replayed once per rank, not once per chip.
  using ChoiceMemo = std::map<std::array<uint64_t, 4>, std::pair<std::string, std::string>>;
  ChoiceMemo& choice_memo() const { return *choices_; }
  // The world rank of rank R of this transport.
  int world_rank_of(int r) const;

  // Bytes this chip has injected so far through this transport and its splits (communication-volume reports).
  double bytes_sent() const { return *bytes_sent_; }

  // The chip's asynchronous communication engine for this communicator (runtime/engine.h), made on first use:
  // that first call is collective (it duplicates the communicator). Copies of this transport share it; split()
  // transports get their own.
  Engine& engine();

  // Waits for every request in REQS (PEERS[i]: the rank REQS[i] talks to), through the observer if one is set.
  // Without one (synchronous collectives) it polls as wait_mode() says, and when nothing completes for
  // SHARDSIM_WATCHDOG_S seconds (default 300, 0 = never) aborts the job with exit code 3 and ONE line for the
  // whole job (runtime/world.h, WaitBoard): "shardsim: watchdog: OP made no progress for S s (limit ...);
  // stalled: chip C (rank R) ...; waiting on it: chips ...". Test hook: SHARDSIM_TEST_STALL_SYNC_RANK=R makes
  // world rank R sleep forever at its first such wait.
  void wait_requests(std::vector<MPI_Request>& reqs, const std::vector<int>& peers, const std::string& op);

 private:
  struct Header {
    double arrival_ns;  // at the receiver, without other senders' flows (sim::Timeline::send().end)
    unsigned long long bytes;
    CallSignature sig;
    double start_ns = 0;  // the sender's start (send().start): the receiver books the flow from here
    // Dependency recording (sim::Timeline::set_record_dependencies on the sender): the send event's id and the end
    // of its span, which the receiver records as its receive's producer and span start. 0 / -1 otherwise.
    std::uint64_t send_id = 0;
    double send_end_ns = -1;
  };
  // Largest payload packed into its header's message.
  static constexpr size_t kPackBytes = 4096;
  void check_header(const Header& h, size_t bytes, int src, const std::string& op) const;
  // Receive side of the contention model: books the received flows (headers in_[0..n)) on this chip's timeline
  // in the deterministic order (sender start, the sender's offset in the group, program order) and sets every recvs[i].arrival.
  void book_arrivals(std::span<RecvOp> recvs);
  void exchange_impl(std::span<const SendOp> sends, std::span<RecvOp> recvs, const std::string& op);
  void exchange_chips(std::span<const SendOp> sends, std::span<RecvOp> recvs, const std::string& op);
  template <class T>
  void allreduce_impl(std::span<T> v, Reduce r, MPI_Datatype t, const std::string& op);
  // Called by wait() when request I completes (e.g. to check a header early, so a size mismatch cannot leave the
  // receiver waiting for a payload that never comes).
  struct WaitHook {
    virtual void completed(size_t index) = 0;
    virtual void failed(size_t index, int error) = 0;  // request INDEX completed with MPI error ERROR
    virtual ~WaitHook() = default;
  };
  void wait(std::vector<MPI_Request>& reqs, const std::vector<int>& peers, const std::string& op, WaitHook* hook);
  void publish_wait(const std::vector<MPI_Request>& reqs, const std::vector<int>& peers);
  [[noreturn]] void watchdog_fire(const std::vector<MPI_Request>& reqs, const std::vector<int>& peers,
                                  const std::string& op, double idle, double limit);
  friend class Engine;
  // A transport over a duplicate of this communicator, on TIMELINE, with its own scratch, byte counter and
  // subgroups (nothing shared with this one: the engine's thread uses it while the main thread uses this).
  Transport duplicate(sim::Timeline& timeline) const;

  std::shared_ptr<MPI_Comm> owned_;  // set when this transport owns its (split) communicator
  std::shared_ptr<VComm> vc_;        // chip mode: the chip-level communicator (comm_ is MPI_COMM_NULL)
  MPI_Comm comm_;
  sim::Timeline* timeline_;
  // Immutable; in chip mode shared by the chips of this rank that hold an equal map (chips::shared_ints).
  std::shared_ptr<const std::vector<int>> rank_to_chip_;
  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<double> bytes_sent_ = std::make_shared<double>(0.0);
  std::shared_ptr<bool> shape_only_ = std::make_shared<bool>(false);
  std::shared_ptr<bool> plan_algorithms_ = std::make_shared<bool>(false);
  std::shared_ptr<std::vector<std::vector<unsigned char>>> scratch_ =
      std::make_shared<std::vector<std::vector<unsigned char>>>(5);
  std::shared_ptr<WaitObserver> observer_;  // inherited by split()
  std::shared_ptr<std::shared_ptr<Engine>> engine_ = std::make_shared<std::shared_ptr<Engine>>();
  std::shared_ptr<std::map<std::string, Transport>> subgroups_ = std::make_shared<std::map<std::string, Transport>>();
  // This communicator's ranks as MPI_COMM_WORLD ranks (watchdog); chip mode: empty (member(r) / K instead).
  std::vector<int> rank_to_world_;
  // Argument agreement state of this communicator (see agreed()); shared by copies, split() gets its own.
  struct Agreement {
    std::unordered_set<uint64_t> agreed;  // signature hashes every rank has agreed on
    int64_t calls = 0;                    // check_args calls so far
    int64_t current = -1;                 // number of the latest call
    bool in_progress = false;             // this rank is agreeing on call `current`
    std::array<int64_t, 8> fields{};      // the latest skipped call's fields (for the error message)
    size_t n_fields = 0;
    const char* const* names = nullptr;
    MPI_Comm comm = MPI_COMM_NULL;        // the duplicate communicator of the agreement messages
    Agreement() = default;
    Agreement(const Agreement&) = delete;
    Agreement& operator=(const Agreement&) = delete;
    ~Agreement();
  };
  std::shared_ptr<Agreement> agree_ = std::make_shared<Agreement>();
  // wait()'s check for the mixed case (see agreed()); throws UsageError.
  void probe_agreement(const std::string& op);
  [[noreturn]] void report_skipped_mismatch(const MPI_Status& st, const std::string& op);
  std::shared_ptr<ChoiceMemo> choices_ = std::make_shared<ChoiceMemo>();
  // step_share()'s memo: pattern key -> link sharing (null: nothing shared). Shared by copies.
  std::shared_ptr<std::map<uint64_t, std::shared_ptr<const sim::StepShare>>> shares_ =
      std::make_shared<std::map<uint64_t, std::shared_ptr<const sim::StepShare>>>();
  // exchange()'s reusable state (not shared: each copy of a transport is used by one thread).
  std::vector<Header> out_, in_;
  std::vector<MPI_Request> reqs_;
  std::vector<int> peers_, recv_of_;  // recv_of_[i]: index of the receive whose header request I is, else -1
  std::vector<unsigned char> pack_out_, pack_in_;
  std::vector<int> done_;
  std::vector<size_t> order_;  // book_arrivals()' sort buffer
  std::vector<MPI_Status> statuses_;
};

}  // namespace shardsim::runtime
