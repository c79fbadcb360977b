// Per-chip simulated timeline: engines that are busy until some time, and the events that ran on them.
//
// Engines: engine 0 is the compute engine; engine 1+i is the injection port of the chip's i-th outgoing link
// (Topology::out_links order). An op becomes ready at some time (its inputs' ready times, computed by the
// caller) and starts at max(ready, engine free time); the engine is then busy until start + duration.
// Ops on different engines overlap freely; ops on one engine serialize in the order they were issued.
//
// Contention the timeline sees, on two sides (docs/MODEL.md, "Links and contention"):
// - Send side: the flows this chip injects. A transfer over links l_1..l_h is cut-through: its head reaches l_i
//   at start + (alpha_1 + ... + alpha_{i-1}) and it occupies every l_i for S / min_j B_j. The timeline keeps a
//   busy-until time for every link *as used by this chip's own flows*, and a transfer starts at the earliest
//   time at which all of its links are free when its head gets there (send()).
// - Receive side: the flows addressed to this chip, whoever sent them (receive()). The receiver books each
//   incoming flow on every link of its route, as a busy interval, at the earliest time >= the sender's start at
//   which the flow fits into the gaps left by the flows it booked before; the data arrives that much later. The
//   receiver books in a deterministic order (Transport: per exchange sorted by (sender start, sender's group offset),
//   across exchanges in program order), so incast into a chip (every flow that shares a switch down-link or
//   any link near the receiver) queues, independently of MPI timing and of how chips are grouped on ranks. One
//   sender's flows never overlap each other (send() serialized them), so where no two senders' flows overlap
//   on a link nothing moves, bit for bit.
// - Crossing flows (steps, begin_step()): an exchange whose global flow pattern is known to every chip (SPMD
//   algorithms know it without communication) runs as a step with a StepShare: how many of the step's flows use
//   each link. When flows of two or more senders meet on some link of the step, every flow of the step is charged
//   at B_l / k_l on every link l of its route (occupancy max_l k_l * S / B_l: the time its busiest link needs for
//   the step's flows of its size), starts when its port and links were free before the step (the step's other
//   flows, its own included, are in k_l) and, on the receive side, waits only for bookings of earlier exchanges;
//   what it leaves busy is applied at end_step(). A step where no two senders meet changes nothing, bit for bit.
//
// Host issue (DeviceSpec::host_launch_ns, eager launch mode): the chip's host thread issues its kernels in program
// order, host_launch_ns each, running ahead of the device; a kernel starts no earlier than the host has issued it:
// start = max(ready, compute engine free, host issue end). So kernels shorter than host_launch_ns leave the device
// idle between them (a launch-bound step), longer ones hide the host entirely. A host synchronisation (host_sync:
// a value the host reads back, such as the gradient norm's .item()) makes the host wait for the device. Under
// cuda_graph, or with host_launch_ns 0, the host never delays a kernel.
//
// Simulated time never comes from the host clock: it is advanced only by cost functions and by the
// timestamps carried in messages (Lamport-style), so it is bit-identical from run to run.
// Units: ns of simulated time (double).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sim/cost.h"
#include "sim/device_spec.h"
#include "sim/kernel_model.h"
#include "topology/topology.h"

namespace shardsim::sim {

using TimeNs = double;

struct Span {
  TimeNs start = 0;
  TimeNs end = 0;
  TimeNs duration() const { return end - start; }
};

// What bounds an op's duration, from its own cost terms (sim/cost.h), decided when it is booked:
//   compute: flops / peak >= bytes / hbm_bandwidth and that exceeds the launch overhead;  hbm: the bytes term wins;
//   latency: the launch overhead (a kernel) or the route's latencies plus the per-message overhead (a message)
//            exceed the op's own work;  link: a message's occupancy S / B exceeds its latencies, or a receive
//            queued behind other senders' flows longer than its latencies;  none: regions (annotations).
enum class Bound : std::uint8_t { none, compute, hbm, link, latency };
const char* bound_name(Bound b);  // "none", "compute-bound", "HBM-bound", "link-bandwidth-bound", "latency-bound"

// Event ids (dependency recording, Timeline::set_record_dependencies): unique across the whole machine and never
// reused: the chip + 1 in the top 24 bits, a per-timeline count below (an async job's events: bit 39 set, the
// job's sequence number in bits 20..38, its count in bits 0..19). 0 = none.
inline int chip_of_event(std::uint64_t id) { return static_cast<int>(id >> 40) - 1; }

struct Event {
  std::string name;      // "gemm", "all_reduce.ring.step3", ...
  std::string category;  // "compute" | "send" | "collective" | "recv" (receives(), with dependencies only)
  int engine = 0;        // -1 for op-level regions (collectives) that are not on one engine; -2 for receives;
                         // -3 (kHostEngine) for the host's kernel issue (eager launch, dependency recording only)
  Span span;             // receives: from the sender's port becoming free (its send's end) to the arrival here
  double flops = 0;
  double bytes = 0;
  int peer = -1;  // chip on the other end: the destination of a send, the source of a receive
  // Dependency recording only (0 otherwise): this event's id and the id of the event that bound its start (the
  // previous op on its engine or port, the op whose result it waited for, the send of a receive). A region's
  // producer is the event that ended it.
  std::uint64_t id = 0;
  std::uint64_t producer = 0;
  Bound bound = Bound::none;
};

// Where a chip's simulated time went; see Timeline::breakdown.
struct Breakdown {
  TimeNs total = 0;           // end of the chip's last event
  TimeNs compute = 0;         // busy time of the compute engine
  TimeNs communication = 0;   // union of collective regions
  TimeNs exposed_comm = 0;    // part of `communication` during which the compute engine was idle
  double flops = 0;           // FLOPs executed on this chip
  double bytes_sent = 0;      // bytes injected into links
};

// One row of a timeline's op totals (Timeline::op_totals): the compute events ("kernel") and collective regions
// ("collective") of one name, digit runs replaced by N ("all_gather.layerN"), summed in event order.
struct OpTotal {
  std::string kind;   // "kernel" | "collective"
  std::string name;
  int calls = 0;
  TimeNs time_ns = 0;
  double flops = 0;
  double bytes = 0;
};

// How the flows of one step (an exchange with a known global pattern) share the links: per topology link id,
// the number of the step's flows whose route uses it. Built identically on every chip from the step's
// (source chip, destination chip) pairs (make()).
struct StepShare {
  std::vector<uint32_t> flows;   // per link: flows of the step on it
  bool any_shared = false;       // flows of >= 2 senders meet on some link; false: the step changes nothing
  // PAIRS: (source chip, destination chip) of every flow of the step (self-pairs are ignored; a pair listed
  // twice is two flows).
  static StepShare make(const topology::Topology& topo, const std::vector<std::pair<int, int>>& pairs);
};

class Timeline {
 public:
  // RECORD_EVENTS false: keep only the engines' and links' busy times (for cost estimates that replay
  // schedules; events() stays empty).
  Timeline(int chip, const topology::Topology& topo, DeviceSpec device, bool record_events = true);

  int chip() const { return chip_; }
  const DeviceSpec& device() const { return device_; }
  const topology::Topology& topology() const { return *topo_; }
  static constexpr int kComputeEngine = 0;
  // Not an engine of the chip: the lane of "host_launch" events (category "host"). With dependency recording and
  // the host issue model on, a kernel that started when the host issued it (the host, not data or the device, bound
  // its start) gets as producer the host's issue since the host's last such event, or since the host_sync that
  // started it (whose producer is the device event the host waited for): the critical path then runs through the
  // host thread instead of stopping there as unexplained waiting. Nothing of the simulated time depends on them.
  static constexpr int kHostEngine = -3;
  int num_engines() const { return static_cast<int>(free_.size()); }
  std::string engine_name(int engine) const;
  // The name of ENGINE of CHIP on TOPO ("compute", "link->3 (dim0+)", ...), as engine_name.
  static std::string engine_name(const topology::Topology& topo, int chip, int engine);
  TimeNs free_at(int engine) const { return free_.at(engine); }

  // A compute op of FLOPS and BYTES (HBM traffic) at precision P and SHAPE (sim/kernel_model.h: the kernel
  // model charges it), ready at READY. Returns its span.
  // Under device.kernel_fusion: eager, a fused element-wise kernel PyTorch eager splits (sim/eager_kernels.h) is
  // charged as its eager sequence, back to back; the span covers them all.
  Span compute(const std::string& name, double flops, double bytes, Precision p, TimeNs ready,
               const KernelShape& shape);
  // A fixed cost an op pays before it may start (a collective call's launch: topology protocol call_overhead_ns,
  // collectives/algorithms.h Choice::start). Returns READY + NS and books no engine. With dependency recording it is
  // an event NAME on the host lane (kHostEngine, category "host", latency-bound) whose producer is the event that
  // ended at READY, so the critical path runs through the cost instead of calling it waiting. NS >= 0, ns.
  TimeNs fixed_cost(const std::string& name, TimeNs ready, double ns);
  // The host waits until simulated time T (it reads back a value the device produced at T): the next kernel's
  // host issue starts no earlier than T. No effect unless the host issue model is on (see the header).
  void host_sync(TimeNs t);
  // When the host has issued the last kernel (0 after reset(), and always 0 when host issue is not modelled).
  TimeNs host_time() const { return host_; }
  // Kernels that started when the host issued them, later than their inputs and the engine were ready (the host
  // gated them; never without host issue). Not reset by reset(): callers take differences.
  std::int64_t host_gated() const { return host_gated_; }

  // Injects BYTES towards chip DST at READY (DST may also be this chip's own switch: its up-link, as the in-switch
  // collectives use it; receive() takes that switch as SRC for the down-link). The first link of the route is the
  // injection port and is busy for the transfer's occupancy; returns {start, arrival at DST}. Self-sends are free
  // and instantaneous.
  Span send(const std::string& name, int dst, double bytes, TimeNs ready);

  // Books send event E (recorded on another timeline of this chip, e.g. the async engine's) exactly as recorded:
  // the port and the route's links busy from E's start for its occupancy (end - start: the share a step charged it,
  // if any), E recorded with the same span. Returns E's span.
  Span replay_send(const Event& e);

  // Receive side: books the flow of BYTES from chip SRC that its sender started at START and that would arrive
  // here at ARRIVAL without other senders' flows (the sender's send().start / .end). Returns the arrival after
  // queueing behind the flows this chip booked before on any link of the route: ARRIVAL itself (bit for bit)
  // when the flow fits where the sender put it, else ARRIVAL + the delay. Self-messages and empty messages are
  // not booked. Call it in a deterministic order (see above).
  // SEND_ID / SEND_END (dependency recording): the sender's send event and its end, recorded as the receive's
  // producer and span start. SRC may be a switch node (an in-switch reduction's down-link): the recorded event's
  // peer is then the chip of SEND_ID (the chip whose send produced the data), not the switch.
  TimeNs receive(int src, double bytes, TimeNs start, TimeNs arrival, std::uint64_t send_id = 0,
                 TimeNs send_end = -1);

  // Crossing-flow contention: the sends and receives until end_step() are the flows of one step whose global
  // pattern SHARE describes (see the header comment). SHARE == nullptr or !SHARE->any_shared: nothing changes.
  // SHARE must outlive the step. Steps do not nest.
  void begin_step(const StepShare* share);
  // Ends the step: applies the shared flows' port / link times and receive-side bookings deferred until now.
  void end_step();

  // Records an op-level region (e.g. a whole all_reduce) for the breakdown and the trace.
  void record_region(const std::string& name, const std::string& category, Span span, double bytes = 0);
  // Records region E (from another timeline of this chip) with its id and producer kept.
  void replay_region(const Event& e);
  // Records receive E (from another timeline of this chip, receives()) as it was; no booking.
  void replay_receive(const Event& e);

  // Dependency recording (off by default; the profiler and the trace's arrows turn it on): every event gets an id
  // and its producer, and every booked receive becomes an event in receives(). Only bookkeeping: no simulated
  // time changes. Producers are found by the value that bound an op's start: each recorded event's end and each
  // arrival is entered in a table keyed by that time (open addressing, grown as it fills: 32 bytes per distinct
  // time at most, beside the events recording keeps anyway; cleared by reset()), a newer event with the same time
  // replacing the older one. Nothing is evicted, so every start that some recorded event's end or arrival bound
  // finds it (a bounded table of 4,096 slots used to evict them in long steps, and the critical path stopped at
  // the first lost producer: issue 46 kind 13).
  // Test hook: the environment variable SHARDSIM_RECORD_DEPENDENCIES (any value) turns it on for every timeline
  // that records events.
  void set_record_dependencies(bool on);
  bool records_dependencies() const { return deps_; }
  // Id of the last send() / replay_send() event (0 without dependency recording or for a self-send).
  std::uint64_t last_send_id() const { return last_send_id_; }
  TimeNs last_send_end() const { return last_send_end_; }  // and the end of its span (the port free again)
  // The events of this timeline's sends run from an async job number SEQ (runtime/engine.h) take ids from their
  // own range, so they never collide with the chip timeline's.
  void set_async_id_space(std::uint64_t seq);
  const std::vector<Event>& receives() const { return receives_; }

  // The recorded events, in the order they were recorded: every event while events are kept (the default, and
  // always with dependency recording), else empty.
  const std::vector<Event>& events() const { return events_; }
  // KEEP false: events are folded into the summary that breakdown(), end_time() and op_totals() read, and not kept
  // (host memory per chip then grows with the chip's distinct busy intervals and op names, not with its sends: a
  // ring of N members sends N - 1 times per collective). The summary is the same either way and is folded in event
  // order, so every figure is bit-identical with and without kept events (tests/unit/sim_test.cpp). Dependency
  // recording keeps events whatever KEEP says (the trace and the profiler read them).
  void set_keep_events(bool keep) { keep_ = keep; }
  // Frees the kept events and receives (their memory too); the summary stays, so breakdown(), end_time() and
  // op_totals() read the same (the trace's gather takes a chip's events this way: reporting/trace.h).
  void release_events();
  bool keeps_events() const { return record_ && (keep_ || deps_); }
  // Back to time zero: every engine free, no events (a fresh clock for the next measurement).
  void reset();
  TimeNs end_time() const;
  Breakdown breakdown() const;
  // Per (kind, name) totals of the compute events and collective regions since the last reset(), ordered by
  // (kind, name).
  std::vector<OpTotal> op_totals() const;
  // Events recorded since construction (kept or not; reset() does not clear it): the report's host-side count.
  std::uint64_t events_recorded() const { return recorded_; }

 private:
  Span compute_one(const std::string& name, double flops, double bytes, Precision p, TimeNs ready,
                   const KernelShape& shape);
  int chip_;
  const topology::Topology* topo_;
  DeviceSpec device_;
  // One hop of a route: topology link id, this chip's slot for it (link_free_, in_busy_) and the head's arrival
  // at the link relative to the start (sum of the earlier links' latencies).
  struct Hop {
    int link = 0;
    int slot = 0;
    double offset = 0;
  };
  struct Route {
    int port = 0;                 // engine of the first link
    std::vector<Hop> hops;
    double bottleneck_gbps = 0;   // min bandwidth over the route
    double latency_ns = 0;        // sum of latencies
  };
  // Receive-side busy intervals of one link: sorted, disjoint, v[head..) live (dropping the earliest one is O(1)
  // amortized: the dead prefix is erased once it is as long as the live part).
  struct Intervals {
    std::vector<Span> v;
    size_t head = 0;
    size_t size() const { return v.size() - head; }
    void drop_front();
  };
  void fill_route(Route& r, const std::vector<int>& links);  // hops, bottleneck and latency of LINKS
  int slot_of(int link);                                      // this chip's slot of LINK, made on first use
  const Route& route_to(int dst);
  const Route& route_from(int src);
  void book_interval(int slot, Span s);
  double shared_occupancy(const Route& r, double bytes) const;  // in a step: max_l k_l * S / (B_l * efficiency)
  // At most this many busy intervals are kept per link on the receive side: beyond it the two earliest are merged
  // (the gap between them counts as busy), so memory stays bounded on long runs; deterministic.
  static constexpr size_t kMaxIntervals = 256;

  bool record_ = true;
  bool keep_ = true;
  // The summary every recorded event is folded into (fold()), in event order: what breakdown() reads.
  struct Summary {
    TimeNs end = 0;
    double flops = 0, bytes_sent = 0;
    // Busy intervals of the compute events and of the collective regions: MERGED holds the merged union of the
    // ones folded so far (sorted, disjoint), PENDING the ones since; merged in when PENDING grows past a bound. The
    // union of unions is the union, so the merged list, and every sum over it, is what one merge of all would give.
    std::vector<Span> compute, comm, compute_pending, comm_pending;
    std::vector<OpTotal> ops;  // in the order of their first event (op_totals() sorts them)
    // Per kind (0 kernel, 1 collective): the row in OPS (+ 1; 0: not seen yet) of each event name, by the name's
    // process-wide id (timeline.cpp, name_id), so an event is summed without building its row name (op_row_name)
    // or comparing strings; ROW_OF_ROW_NAME finds the row of a name seen for the first time.
    std::vector<std::uint32_t> row_of_id[2];
    struct NameHash {
      using is_transparent = void;
      size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    std::unordered_map<std::string, std::uint32_t, NameHash, std::equal_to<>> row_of_row_name[2];
  };
  Summary sum_;
  std::uint64_t recorded_ = 0;
  // Folds one event into sum_ (CATEGORY: "compute", "collective", "send", ...): what fold(E) does with E's fields,
  // without an Event when events are not kept.
  void fold_summary(const std::string& name, std::string_view category, Span span, double flops, double bytes);
  void fold(const Event& e);   // into sum_; then the event is dropped unless kept (commit())
  void commit();               // folds events_.back() and drops it unless events are kept
  std::vector<TimeNs> free_;
  TimeNs host_ = 0;  // the host thread's issue clock (Host issue, above)
  std::int64_t host_gated_ = 0;
  // Dependency recording of the host's issue (kHostEngine): where the host's current run of issue began (its last
  // host_sync, or 0) and the device event it waited for there; its last recorded host_launch event and end.
  TimeNs host_epoch_ = 0;
  std::uint64_t host_epoch_producer_ = 0;
  std::uint64_t host_last_id_ = 0;
  TimeNs host_last_end_ = 0;
  std::uint64_t note_host_issue(TimeNs issued);  // records a host_launch event ending at ISSUED; returns its id
  // Host memory grows with the links and peers this chip actually uses, not with the topology (issue 17: a rank
  // hosting 4,096 chips would otherwise hold O(chips) slots per chip). Slots are handed out on first use.
  std::unordered_map<int, int> slot_;  // topology link id -> slot
  std::vector<TimeNs> link_free_;      // per slot: busy-until by this chip's own flows
  std::vector<Intervals> in_busy_;     // per slot: the receive side's busy intervals
  std::unordered_map<int, Route> routes_;     // per destination chip used (send side)
  std::unordered_map<int, Route> in_routes_;  // per source chip used (receive side)
  std::vector<Event> events_;
  // Dependency recording (set_record_dependencies).
  static constexpr size_t kProducerSlots = 256;  // the table's first size (a power of two; doubled at half full)
  struct ProducerSlot {
    TimeNs t = -1;  // -1: empty (times are >= 0)
    std::uint64_t id = 0;
  };
  size_t producer_count_ = 0;  // filled slots of producers_
  bool deps_ = false;
  std::uint64_t next_id_ = 0;      // the next id (chip and range bits included)
  std::uint64_t last_send_id_ = 0;
  TimeNs last_send_end_ = -1;
  std::vector<std::uint64_t> last_on_engine_;  // per engine: its last event's id
  std::vector<std::uint64_t> link_last_;       // per slot: this chip's last send over the link
  std::vector<ProducerSlot> producers_;        // open addressing, linear probing; empty until deps_
  std::vector<Event> receives_;
  std::uint64_t new_id();
  int peer_of_receive(int src, std::uint64_t send_id) const;  // see receive()
  // Records a send event (and with dependencies its id, producer and bound) before the port and links move on.
  void note_send(const std::string& name, const Route& r, int dst, double bytes, TimeNs ready, TimeNs start,
                 Span span, double occupancy, double lat);
  void note_end(TimeNs t, std::uint64_t id);   // enters T -> ID in the producer table
  std::uint64_t producer_of(TimeNs t) const;   // the table's event for T, else 0
  const StepShare* step_ = nullptr;                  // the current step's sharing (begin_step), if any
  std::vector<std::pair<int, TimeNs>> step_free_;    // deferred: port engine (>= 0) or -1 - slot, busy until
  std::vector<std::pair<int, Span>> step_booked_;    // deferred receive-side bookings: slot, interval
};

}  // namespace shardsim::sim
