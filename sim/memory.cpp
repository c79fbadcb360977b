#include "sim/memory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace shardsim::sim {

std::string format_bytes(double bytes);

std::string format_gib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f GiB", bytes / Memory::kGiB);
  // Below 0.01 GiB three decimals say little ("0.000 GiB"): add the size in a readable unit.
  if (bytes > 0 && bytes < 0.01 * Memory::kGiB) return std::string(buf) + " (" + format_bytes(bytes) + ")";
  return buf;
}

std::string format_bytes(double bytes) {
  char buf[64];
  if (bytes >= Memory::kGiB) {
    std::snprintf(buf, sizeof buf, "%.3f GiB", bytes / Memory::kGiB);
  } else if (bytes >= 1048576.0) {
    std::snprintf(buf, sizeof buf, "%.3f MiB", bytes / 1048576.0);
  } else if (bytes >= 1024.0) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  }
  return buf;
}

Memory::Scoped& Memory::Scoped::operator=(Scoped&& o) noexcept {
  if (this != &o) {
    release();
    memory_ = o.memory_;
    id_ = o.id_;
    o.memory_ = nullptr;
  }
  return *this;
}

void Memory::Scoped::release() noexcept {
  if (!memory_) return;
  Memory* m = memory_;
  memory_ = nullptr;
  const auto it = m->live_.find(id_);
  if (it == m->live_.end()) return;  // freed by hand already: nothing to do (never throw from a destructor)
  m->in_use_ -= it->second.bytes;
  m->live_.erase(it);
}

Memory::Memory(int chip, double capacity_bytes) : chip_(chip), capacity_(capacity_bytes) {
  if (!std::isfinite(capacity_bytes) || capacity_bytes < 0)
    throw std::invalid_argument("simulated memory of chip " + std::to_string(chip) +
                                ": capacity must be a finite number of bytes >= 0");
}

std::vector<Memory::Allocation> Memory::live() const {
  std::vector<Allocation> out;
  out.reserve(live_.size());
  for (const auto& [id, a] : live_) out.push_back(a);
  std::stable_sort(out.begin(), out.end(), [](const Allocation& a, const Allocation& b) { return a.bytes > b.bytes; });
  return out;
}

Memory::Id Memory::allocate(const std::string& name, uint64_t bytes) {
  const uint64_t after = in_use_ + bytes;
  if (static_cast<double>(after) > capacity_) {
    std::string msg = "simulated out of memory on chip " + std::to_string(chip_) + ": needs " +
                      format_gib(static_cast<double>(after)) + ", has " + format_gib(capacity_) + " (allocating '" +
                      name + "' of " + format_bytes(static_cast<double>(bytes)) + "; in use before: " +
                      format_bytes(static_cast<double>(in_use_));
    const auto now = live();
    if (!now.empty()) {
      msg += "; largest live: ";
      for (size_t i = 0; i < now.size() && i < 3; ++i)
        msg += (i ? ", '" : "'") + now[i].name + "' " + format_bytes(static_cast<double>(now[i].bytes));
    }
    msg += ")";
    throw OutOfMemory(msg, chip_, after, capacity_, name);
  }
  const Id id = next_id_++;
  live_.emplace(id, Allocation{id, name, bytes});
  in_use_ = after;
  if (!peaked_ || in_use_ > peak_) {
    peaked_ = true;
    peak_ = in_use_;
    peak_name_ = name;
    live_at_peak_ = live();
  }
  return id;
}

void Memory::free(Id id) {
  const auto it = live_.find(id);
  if (it == live_.end())
    throw std::invalid_argument("simulated memory of chip " + std::to_string(chip_) + ": free of allocation " +
                                std::to_string(id) + ", which is not live (never allocated or already freed)");
  in_use_ -= it->second.bytes;
  live_.erase(it);
}

}  // namespace shardsim::sim
