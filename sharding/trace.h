// Chrome trace-event JSON (loads in Perfetto / chrome://tracing) of the simulated timelines.
//
// One process per chip ("chip N"), one thread (track) per engine: "compute", one per link port
// ("link->D (dimK±)"), and "collectives" for op-level regions. Each span is a complete event ("ph":"X") with
// ts/dur in microseconds of SIMULATED time and args {flops, bytes, peer}. Spans on one engine never overlap
// (engines serialize); the collectives track may nest.
// Format: Google's "Trace Event Format" document (the JSON Object Format with a traceEvents array).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "runtime/world.h"
#include "sim/timeline.h"

namespace shardsim::sharding {

// The events of one chip's timeline (metadata + spans), as a JSON array.
nlohmann::json trace_events(const sim::Timeline& timeline);

// Collective: gathers every chip's events on rank 0, which writes PATH. Throws RuntimeFault if it cannot write.
void write_trace(const runtime::World& world, const sim::Timeline& timeline, const std::string& path);

}  // namespace shardsim::sharding
