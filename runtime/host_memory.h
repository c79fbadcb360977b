// Host memory of hosting several chips per rank (runtime/chips.h), planned before any chip starts. Its own header,
// not chips.h, because chips.h reaches nearly every file through world.h: this is for main and the chips' scheduler.
#pragma once

#include <cstddef>
#include <string>

namespace shardsim::runtime {

// Each chip's fiber stack (runtime/chips.cpp): reserved address space, touched only as used.
constexpr size_t kFiberStackBytes = size_t{1} << 20;

// Host memory planned before any chip starts (issue 31 item 4): K chips on this rank need about
// chip_host_bytes(K) resident (measured floor per chip: its fiber's touched stack, timeline, transport and
// mailboxes in shape-only mode; a workload adds its own) and K fiber stacks of address space (1 MiB + a guard page
// each, reserved, touched only as used). Returns "" when both fit this host (MemAvailable in /proc/meminfo, and
// RLIMIT_AS, `ulimit -v`), else one line naming the estimate, what is available and the limit on chips per rank.
double chip_host_bytes(int k);
// This host's available memory (MemAvailable in /proc/meminfo, bytes); 0 when unknown (then nothing is checked).
double mem_available_bytes();
std::string host_memory_check(int k, long max_chips_per_rank);

}  // namespace shardsim::runtime
