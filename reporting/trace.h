// Chrome trace-event JSON (loads in Perfetto / chrome://tracing) of the simulated timelines.
// Format: Google's "Trace Event Format" document (the JSON Object Format: {"traceEvents": [...], ...}).
//
// Layout:
//   - one process per chip: pid = chip + 1 (Perfetto treats pid 0 as the kernel's idle process), named
//     "chip N" (process_name) and ordered by chip (process_sort_index);
//   - one thread (track) per engine: "compute", one per outgoing link port ("link->D (dimK±)", the names of
//     sim::Timeline::engine_name), then "collectives" for op-level regions (engine -1). Regions that overlap
//     without nesting cannot share a track, so each region goes to the first collectives track that is free
//     at its start ("collectives", "collectives 2", ...). Every track has thread_name and thread_sort_index;
//   - tid = pid * kTraceTidStride + track index, so a tid is unique across the whole file: Perfetto's JSON
//     importer keys threads (and thread names) by tid alone, and would mix chips' tracks up otherwise.
// Events: each span is a complete event ("ph":"X", "cat" = the event's category) with args
//   compute:    {flops, bytes}      (bytes = HBM traffic)
//   send:       {bytes, peer}       (peer = destination chip; the span is the time the port is busy)
//   collective: {bytes}
// Times: ts/dur are microseconds of SIMULATED time (the format's unit; "displayTimeUnit":"ns" only changes how
// chrome://tracing displays them). Start and end are rounded to the nearest picosecond first and dur is
// end - start in picoseconds, so the numbers print short (0.08192, not 0.08192000000000001), rounding is
// deterministic, and spans that touch or do not overlap in ns still do so in the file. Spans on one track
// never overlap.
// With dependency recording (sim::Timeline::set_record_dependencies; `run`/`train` turn it on for --trace and
// --profile) the file also has:
//   - receives: "recv" slices (cat "recv", args {bytes, peer = source chip}) from the sender's port becoming free to
//     the arrival, on "receives" tracks after the collectives tracks (greedy lanes as for regions);
//   - an arrow from every send to its receive on the other chip: the Trace Event Format's flow binding on the
//     slices themselves ("bind_id" = the send's event id as a hex string, "flow_out": true on the send's X event,
//     "flow_in": true on the receive's), which Perfetto binds to those slices whatever the file's order; ids are the
//     simulation's event ids, unique across chips and never reused (Perfetto ties arrows by id);
//   - the critical path (sim/critical_path.h): args "critical_path": true on its events, and a last process
//     "critical path" (pid = chips + 1) with one slice per step, "chip N: OP", and "waiting" slices.
// A receive of a send that was not recorded (none today) has no arrow.
// Filters (reporting/trace_filter.h: --trace-chips, --trace-axis, --trace-window) keep the events of some chips that
// overlap a window; an arrow is drawn when both of its slices are kept, the critical path process keeps its steps
// on kept chips in the window, and otherData.filter says what was kept.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "reporting/trace_filter.h"
#include "runtime/world.h"
#include "sim/critical_path.h"
#include "sim/timeline.h"

namespace shardsim::reporting {

inline constexpr int kTraceTidStride = 10000;  // tracks per chip at most (compute + ports + collectives)

// The events of one chip's timeline (metadata + spans), as a JSON array.
// Throws RuntimeFault if an event has a non-finite or negative time, or the chip needs more than
// kTraceTidStride tracks.
nlohmann::json trace_events(const sim::Timeline& timeline);
// The same for one chip's gathered events (events then receives, as gather_events returns them) on TOPO, the
// events FILTER keeps (its window; the caller chooses the chips); events whose index is in CRITICAL get args
// "critical_path": true; sends whose id is in PAIRED (sorted) get "flow_out" and receives whose producer is in
// PAIRED "flow_in" (both with "bind_id").
nlohmann::json trace_events(const sim::ChipEvents& chip, const topology::Topology& topo,
                            const std::vector<size_t>& critical, const std::vector<std::uint64_t>& paired,
                            const TraceFilter& filter);

// Collective: every chip's events (Timeline::events() then receives()) on rank 0, in chip order; empty elsewhere.
// Through MPI_Gatherv with one chip per rank (AgreedError, exit 3, beyond 2 GiB), the chip router's gather with
// several. The events leave TIMELINE (Timeline::release_events): serialized compactly (a name table per chip,
// 65 bytes an event) and decoded into sim::ProfileEvent (96 bytes, names interned), each chip's part freed as it
// is decoded.
std::vector<sim::ChipEvents> gather_events(const runtime::World& world, sim::Timeline& timeline);

// The trace's size before anything is gathered (collective: every chip counts the events FILTER keeps).
struct TraceSize {
  double events = 0;
  double bytes = 0;  // estimated bytes of the JSON file (about 160 + the name's length per event)
  int chips = 0;     // chips kept
};
TraceSize trace_size(const runtime::World& world, const sim::Timeline& timeline, const TraceFilter& filter);

// Collective (World::agree): rank 0 writes the trace of ALL (gather_events' result) on TOPO to PATH, the chips and
// events FILTER keeps, the critical path PROFILE (may be null: computed here from ALL) marked; AgreedError (exit
// 3) on every rank if it cannot.
void write_trace_file(const runtime::World& world, const std::vector<sim::ChipEvents>& all,
                      const topology::Topology& topo, const sim::Profile* profile, const std::string& path,
                      const TraceFilter& filter);

// Collective: gathers every chip's events on rank 0 (MPI_Gatherv with one chip per rank, the chip router's gather
// with several), which writes PATH (the same file at any chips per rank). Throws AgreedError (exit code 3) on every
// rank if rank 0 cannot write PATH or the events exceed 2 GiB; RuntimeFault as trace_events does.
void write_trace(const runtime::World& world, sim::Timeline& timeline, const std::string& path);

}  // namespace shardsim::reporting
