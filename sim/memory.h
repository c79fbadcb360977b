// Simulated device memory (HBM) of one chip: named allocations against a capacity, with peak tracking.
//
// Pure bookkeeping, no data and no MPI: allocate(name, bytes) records an allocation and returns its id,
// free(id) drops it; in_use() is the sum of live allocations, peak() the highest in_use() seen, and
// peak_allocation() names the allocation whose arrival set that peak. Deterministic: the same sequence of calls
// gives the same numbers and the same messages on every run and every rank.
//
// Units: bytes (integers); capacity given in bytes or GiB (2^30 B). Messages print GiB with 3 decimals.
//
// Errors:
//   OutOfMemory (a ConfigError, exit code 2) when an allocation would take in_use() above the capacity:
//     "simulated out of memory on chip N: needs X GiB, has Y GiB (allocating 'NAME' of S; in use before: U;
//      largest live: 'A' S_A, 'B' S_B, 'C' S_C)"
//     X = in_use() after the allocation, Y = capacity. The failed allocation is not recorded.
//   std::invalid_argument for free() of an unknown or already freed id, and for a negative or non-finite
//   capacity.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace shardsim::sim {

class OutOfMemory : public ConfigError {
 public:
  OutOfMemory(const std::string& what, int chip, uint64_t needed_bytes, double capacity_bytes, std::string allocation)
      : ConfigError(what),
        chip_(chip),
        needed_bytes_(needed_bytes),
        capacity_bytes_(capacity_bytes),
        allocation_(std::move(allocation)) {}
  int chip() const { return chip_; }
  uint64_t needed_bytes() const { return needed_bytes_; }  // in use after the allocation that failed
  double capacity_bytes() const { return capacity_bytes_; }
  const std::string& allocation() const { return allocation_; }  // name of the allocation that failed

 private:
  int chip_;
  uint64_t needed_bytes_;
  double capacity_bytes_;
  std::string allocation_;
};

class Memory {
 public:
  using Id = int64_t;
  struct Allocation {
    Id id = -1;
    std::string name;
    uint64_t bytes = 0;
  };

  // Move-only handle that frees its allocation when destroyed (or on release()).
  class Scoped {
   public:
    Scoped() = default;
    Scoped(Memory* memory, Id id) : memory_(memory), id_(id) {}
    Scoped(Scoped&& o) noexcept : memory_(o.memory_), id_(o.id_) { o.memory_ = nullptr; }
    Scoped& operator=(Scoped&& o) noexcept;
    Scoped(const Scoped&) = delete;
    Scoped& operator=(const Scoped&) = delete;
    ~Scoped() { release(); }
    void release() noexcept;
    Id id() const { return memory_ ? id_ : -1; }

   private:
    Memory* memory_ = nullptr;
    Id id_ = -1;
  };

  Memory(int chip, double capacity_bytes);
  static Memory with_capacity_gib(int chip, double capacity_gib) { return Memory(chip, capacity_gib * kGiB); }
  static constexpr double kGiB = 1073741824.0;

  // Records NAME of BYTES; throws OutOfMemory if in_use() + BYTES exceeds the capacity. Zero bytes is allowed.
  Id allocate(const std::string& name, uint64_t bytes);
  // The same, freed when the returned handle goes out of scope. The Memory must outlive the handle and must
  // not be moved while handles point at it.
  Scoped scoped(const std::string& name, uint64_t bytes) { return Scoped(this, allocate(name, bytes)); }
  void free(Id id);

  int chip() const { return chip_; }
  double capacity_bytes() const { return capacity_; }
  uint64_t in_use() const { return in_use_; }
  uint64_t peak() const { return peak_; }
  // The allocation whose arrival set the peak ("" while nothing was ever allocated).
  const std::string& peak_allocation() const { return peak_name_; }
  // The live allocations at the moment of the peak, largest first (ties: earlier first).
  const std::vector<Allocation>& live_at_peak() const { return live_at_peak_; }
  // Live allocations now, largest first (ties: earlier first).
  std::vector<Allocation> live() const;
  size_t live_count() const { return live_.size(); }

 private:
  int chip_;
  double capacity_;
  uint64_t in_use_ = 0;
  uint64_t peak_ = 0;
  bool peaked_ = false;  // any allocation yet (the first one sets the peak even at 0 bytes)
  std::string peak_name_;
  std::vector<Allocation> live_at_peak_;
  std::map<Id, Allocation> live_;  // ordered by id: deterministic iteration
  Id next_id_ = 0;
};

// "0.085 GiB" style (3 decimals) and a human size for the details of a message ("12.5 KiB", "3.000 MiB").
std::string format_gib(double bytes);
std::string format_bytes(double bytes);

}  // namespace shardsim::sim
