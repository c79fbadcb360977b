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
// Not included: arrival times and send->receive flow arrows (sim::Event records neither the arrival nor the
// receive).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "runtime/world.h"
#include "sim/timeline.h"

namespace shardsim::sharding {

inline constexpr int kTraceTidStride = 10000;  // tracks per chip at most (compute + ports + collectives)

// The events of one chip's timeline (metadata + spans), as a JSON array.
// Throws RuntimeFault if an event has a non-finite or negative time, or the chip needs more than
// kTraceTidStride tracks.
nlohmann::json trace_events(const sim::Timeline& timeline);

// Collective: gathers every chip's events on rank 0 (MPI_Gatherv with one chip per rank, the chip router's gather
// with several), which writes PATH (the same file at any chips per rank). Throws AgreedError (exit code 3) on every
// rank if rank 0 cannot write PATH or the events exceed 2 GiB; RuntimeFault as trace_events does.
void write_trace(const runtime::World& world, const sim::Timeline& timeline, const std::string& path);

}  // namespace shardsim::sharding
