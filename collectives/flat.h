// Internal: what every collective does once its algorithm has run.
#pragma once

#include <string>

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives::flat {

// Records the op-level region on the timeline and fills a result.
CollectiveResult finish(runtime::Transport& tp, const std::string& name, const std::string& algorithm,
                        const std::string& explanation, sim::Span span, double bytes, double sent_before);

}  // namespace shardsim::collectives::flat
