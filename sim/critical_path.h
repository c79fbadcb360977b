// The critical path across chips and the profile built on it (docs/PROFILE.md).
//
// Input: every chip's recorded events with dependency recording on (sim::Timeline::set_record_dependencies):
// kernels, sends, receives and collective regions, each with its id and its producer (the event that bound its
// start: the previous op on its engine or port, the receive whose data it waited for, the send of a receive).
// These are the simulation's own dependencies, recorded as each op was booked, not inferred afterwards.
//
// The critical path is the chain of producers walked back from the event that finishes last (kernels, sends and
// receives; regions are annotations). Walked forward from time 0 it tiles [0, end]: each step covers its event
// from the later of its start and the previous step's end; time before an event's start that no recorded event
// explains (a producer of 0, or before the first step) is "waiting". A receive's part is the message's flight after
// the sender's port became free (the route's latencies, plus queueing behind other senders' flows), so a chain
// across chips adds up to the end time exactly.
//
// Units: ns of simulated time. Pure functions, no MPI.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sim/timeline.h"

namespace shardsim::sim {

// NAME's copy in a process-wide pool of op names (thread-safe, append-only: a run has some thousands of distinct
// names however many events carry them); the view stays valid until the process ends.
std::string_view intern_name(std::string_view name);

// An event as the profiler and the trace keep it (an Event with its name and category interned: 96 bytes and no
// allocation per event, where an Event holds two strings). Implicitly made from an Event.
struct ProfileEvent {
  std::string_view name;      // intern_name'd
  std::string_view category;  // intern_name'd
  int engine = 0;
  Span span;
  double flops = 0;
  double bytes = 0;
  int peer = -1;
  std::uint64_t id = 0;
  std::uint64_t producer = 0;
  Bound bound = Bound::none;
  ProfileEvent() = default;
  ProfileEvent(const Event& e)  // NOLINT(google-explicit-constructor): a chip's events convert as a whole
      : name(intern_name(e.name)), category(intern_name(e.category)), engine(e.engine), span(e.span),
        flops(e.flops), bytes(e.bytes), peer(e.peer), id(e.id), producer(e.producer), bound(e.bound) {}
};

// One chip's events as the profiler reads them: Timeline::events() followed by Timeline::receives().
struct ChipEvents {
  int chip = 0;
  std::vector<ProfileEvent> events;
  ChipEvents() = default;
  ChipEvents(int c, const std::vector<Event>& e) : chip(c), events(e.begin(), e.end()) {}
};

// Where each event id lies (position in CHIPS, event index): sorted by id, looked up by binary search (16 bytes
// per event; a hash map took about 4 times that).
class EventIndex {
 public:
  explicit EventIndex(const std::vector<ChipEvents>& chips);
  // The event with ID, or nullptr.
  const ProfileEvent* find(std::uint64_t id) const;
  // (position in CHIPS, index) of ID; false if none.
  bool locate(std::uint64_t id, int& chip_pos, size_t& index) const;
  size_t size() const { return ids_.size(); }

 private:
  const std::vector<ChipEvents>* chips_;
  struct Entry {
    std::uint64_t id;
    std::uint32_t chip_pos;
    std::uint32_t index;
  };
  std::vector<Entry> ids_;
};

struct PathStep {
  int chip = 0;
  size_t index = 0;     // into that chip's ChipEvents::events
  TimeNs from = 0;      // the part of the event on the path: [from, event end]
  TimeNs waiting = 0;   // unexplained time just before `from` (no recorded producer covers it)
};

struct CriticalPath {
  std::vector<PathStep> steps;  // in time order; empty when no chip recorded an event
  TimeNs end = 0;               // the last event's end (the run's end time)
  TimeNs waiting = 0;           // sum of the steps' waiting
};

// Throws std::invalid_argument if an event's producer chain loops (a producer that does not end before its
// consumer's start, which the recording never makes). INDEX: CHIPS' index (made here when null).
CriticalPath critical_path(const std::vector<ChipEvents>& chips, const EventIndex* index = nullptr);

// Classes of simulated time: an event's Bound (sim/timeline.h), plus waiting.
enum class TimeClass { compute, hbm, link, latency, waiting };
inline constexpr std::array<TimeClass, 5> kTimeClasses = {TimeClass::compute, TimeClass::hbm, TimeClass::link,
                                                          TimeClass::latency, TimeClass::waiting};
const char* time_class_name(TimeClass c);  // "compute-bound", ..., "waiting"
TimeClass time_class_of(Bound b);          // Bound::none (regions) -> waiting

// "all_reduce.ring.step3" -> "all_reduce.ring.stepN": digit runs become N (one row per op, as the report's time by
// op table groups them).
std::string op_family(std::string_view name);

// A bottleneck: the time one op family of one class takes on the critical path.
struct Bottleneck {
  std::string op;       // op_family of the events
  std::string category; // "compute" | "send" | "recv"
  TimeClass cls = TimeClass::waiting;
  TimeNs time = 0;      // on the critical path
  int steps = 0;
  int first_chip = 0;   // the chip of its first step on the path
  int chips = 0;        // distinct chips among its steps
};

// Time an op on one chip's compute engine sat idle waiting for data from another chip.
struct Wait {
  int chip = 0;             // the waiting chip
  std::string op;           // op_family of the waiting kernel or send
  int on_chip = 0;          // the chip whose send it waited for
  std::string on_op;        // op_family of that send
  TimeNs time = 0;          // summed idle time of the engine before the waiting ops
  int count = 0;
};

struct Profile {
  CriticalPath path;
  std::vector<ChipEvents> chips;                 // the input (the path's indices point here)
  std::vector<Bottleneck> bottlenecks;           // by time on the path, largest first
  std::vector<std::pair<int, TimeNs>> chip_time; // time on the path per chip, largest first (ties: lower chip)
  std::array<TimeNs, 5> path_by_class{};         // indexed by TimeClass: the path's time (sums to path.end)
  std::array<TimeNs, 5> all_by_class{};          // every kernel, send and receive of every chip (durations)
  std::vector<Wait> waits;                       // largest first
  size_t events = 0;                             // kernels, sends and receives recorded
};

// The profile of CHIPS (moved in). Waits are those of compute and port engines whose producer is a receive.
Profile profile(std::vector<ChipEvents> chips);

}  // namespace shardsim::sim
