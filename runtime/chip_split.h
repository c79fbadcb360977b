// Splitting a chip-level communicator (runtime/chips.h, several chips per rank). Its own header, not chips.h,
// because chips.h reaches nearly every file through world.h: this is for the two callers that make groups,
// Transport::split and the sweep's group scheduler (experiments/scheduler.cpp).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/chips.h"

namespace shardsim::runtime::chips {

// MPI_Comm_split for a chip-level communicator: the members of PARENT with the same COLOR form a new communicator,
// ordered by (KEY, parent rank). Collective over PARENT (one allgather of (color, key) through the router); every
// color, negative ones included, makes a group (there is no MPI_UNDEFINED: callers ignore the groups they do not
// use). The new context mixes PARENT's context, its split count and the color, so it is the same on every member
// of a group and differs between groups and between successive splits of PARENT (PARENT.splits is incremented on
// every member). PARENT_RANKS (optional) gets the new group's members as ranks of PARENT, in new-rank order. OP
// names the call in errors and watchdog lines.
// COLOR_KEY_OF (optional): every member's (color, key) as a function of its PARENT rank. A folded run
// (run_chips' FoldSpec) needs it to split a communicator with mirrored members (they make no call); without
// mirrored members it is not used.
using ColorKeyOf = std::function<std::pair<int, int>(int parent_rank)>;
std::shared_ptr<VComm> split(VComm& parent, int color, int key, const std::string& op,
                             std::vector<int>* parent_ranks = nullptr, const ColorKeyOf& color_key_of = {});

}  // namespace shardsim::runtime::chips
