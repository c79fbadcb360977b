#include "runtime/host_memory.h"

#include <sys/resource.h>

#include <cstdio>
#include <fstream>

namespace shardsim::runtime {

namespace {
// Resident host bytes per chip in shape-only mode, measured (docs/performance/scale.md: peak RSS over chips of
// the 405B-shaped step, 512..2,048 chips, minus the rank's base); a floor, the workload adds to it.
constexpr double kChipResidentBytes = 160.0 * 1024;
constexpr double kRankBaseBytes = 96.0 * 1024 * 1024;  // MPI, libraries, the topology and the config: one rank

std::string gib_text(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GiB", bytes / 1073741824.0);
  return b;
}
}  // namespace

double mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  double kb = 0;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024.0;
  return 0;  // unknown: not checked
}

double chip_host_bytes(int k) { return kRankBaseBytes + double(k) * kChipResidentBytes; }

std::string host_memory_check(int k, long max_chips_per_rank) {
  if (k <= 1) return "";
  const std::string limit = " (at most " + std::to_string(max_chips_per_rank) + " chips per rank; use more ranks or fewer chips)";
  const double resident = chip_host_bytes(k);
  const double avail = mem_available_bytes();
  if (avail > 0 && resident > 0.9 * avail)
    return "host memory: " + std::to_string(k) + " chips on this rank need at least " + gib_text(resident) +
           " of host memory (" + std::to_string(int(kChipResidentBytes / 1024)) + " KiB per chip), but only " +
           gib_text(avail) + " is available" + limit;
  rlimit rl{};
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    const double page = 4096;
    const double address = resident + double(k) * (double(kFiberStackBytes) + page);
    if (address > double(rl.rlim_cur))
      return "host memory: " + std::to_string(k) + " chips on this rank need about " + gib_text(address) +
             " of address space (" + gib_text(resident) + " resident and a 1 MiB stack per chip), but the address-space "
             "limit (ulimit -v) is " + gib_text(double(rl.rlim_cur)) + limit;
  }
  return "";
}

}  // namespace shardsim::runtime
