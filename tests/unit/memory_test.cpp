#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "sim/memory.h"

using namespace shardsim;
using sim::Memory;

namespace {
constexpr uint64_t kMiB = 1024 * 1024;
constexpr uint64_t kGiB = 1024 * kMiB;
}  // namespace

TEST(Memory, TracksInUseAndPeak) {
  Memory m(3, 4.0 * kGiB);
  EXPECT_EQ(m.in_use(), 0u);
  EXPECT_EQ(m.peak(), 0u);
  EXPECT_EQ(m.peak_allocation(), "");
  const auto a = m.allocate("weights", 1 * kGiB);
  const auto b = m.allocate("activations", 2 * kGiB);
  EXPECT_EQ(m.in_use(), 3 * kGiB);
  EXPECT_EQ(m.peak(), 3 * kGiB);
  EXPECT_EQ(m.peak_allocation(), "activations");
  m.free(b);
  EXPECT_EQ(m.in_use(), 1 * kGiB);
  EXPECT_EQ(m.peak(), 3 * kGiB);  // the peak stays
  const auto c = m.allocate("scratch", 512 * kMiB);
  EXPECT_EQ(m.in_use(), 1 * kGiB + 512 * kMiB);
  EXPECT_EQ(m.peak_allocation(), "activations");  // below the old peak: does not move it
  // Freed memory is reusable: 4 GiB exactly fits (the capacity is inclusive).
  const auto d = m.allocate("big", 2 * kGiB + 512 * kMiB);
  EXPECT_EQ(m.in_use(), 4 * kGiB);
  EXPECT_EQ(m.peak(), 4 * kGiB);
  EXPECT_EQ(m.peak_allocation(), "big");
  ASSERT_EQ(m.live_at_peak().size(), 3u);  // largest first
  EXPECT_EQ(m.live_at_peak()[0].name, "big");
  EXPECT_EQ(m.live_at_peak()[1].name, "weights");
  EXPECT_EQ(m.live_at_peak()[2].name, "scratch");
  m.free(a);
  m.free(c);
  m.free(d);
  EXPECT_EQ(m.in_use(), 0u);
  EXPECT_EQ(m.live_count(), 0u);
  EXPECT_EQ(m.peak(), 4 * kGiB);
}

TEST(Memory, FreeOfUnknownOrFreedIdThrows) {
  Memory m(0, 1e9);
  const auto a = m.allocate("x", 10);
  m.free(a);
  EXPECT_THROW(m.free(a), std::invalid_argument);
  EXPECT_THROW(m.free(12345), std::invalid_argument);
  EXPECT_EQ(m.in_use(), 0u);
}

TEST(Memory, ScopedFreesAtEndOfScope) {
  Memory m(0, 1e9);
  {
    auto x = m.scoped("x", 100);
    EXPECT_EQ(m.in_use(), 100u);
    auto y = m.scoped("y", 50);
    Memory::Scoped moved = std::move(y);  // moving does not free
    EXPECT_EQ(m.in_use(), 150u);
    moved.release();
    EXPECT_EQ(m.in_use(), 100u);
    moved.release();  // twice is harmless
    EXPECT_EQ(m.in_use(), 100u);
  }
  EXPECT_EQ(m.in_use(), 0u);
  EXPECT_EQ(m.peak(), 150u);
  EXPECT_EQ(m.peak_allocation(), "y");
  // A handle whose allocation was freed by hand does not free twice.
  auto z = m.scoped("z", 7);
  m.free(z.id());
  z.release();
  EXPECT_EQ(m.in_use(), 0u);
}

TEST(Memory, OutOfMemoryMessageIsExact) {
  Memory m = Memory::with_capacity_gib(2, 1.0);
  m.allocate("w_gate", 600 * kMiB);
  m.allocate("x", 100 * kMiB);
  m.allocate("w_up", 200 * kMiB);
  try {
    m.allocate("activations", 512 * kMiB);
    FAIL() << "no error";
  } catch (const sim::OutOfMemory& e) {
    // 1412 MiB = 1.379 GiB
    EXPECT_STREQ(e.what(),
                 "simulated out of memory on chip 2: needs 1.379 GiB, has 1.000 GiB (allocating 'activations' of "
                 "512.000 MiB; in use before: 900.000 MiB; largest live: 'w_gate' 600.000 MiB, 'w_up' 200.000 MiB, "
                 "'x' 100.000 MiB)");
    EXPECT_EQ(e.exit_code(), kExitBadInput);
    EXPECT_EQ(e.chip(), 2);
    EXPECT_EQ(e.needed_bytes(), 1412 * kMiB);
    EXPECT_EQ(e.allocation(), "activations");
  }
  // The failed allocation left nothing behind.
  EXPECT_EQ(m.in_use(), 900 * kMiB);
  EXPECT_EQ(m.live_count(), 3u);
  // It is a ConfigError (exit code 2) for code that catches those.
  EXPECT_THROW(m.allocate("again", kGiB), ConfigError);
}

TEST(Memory, OutOfMemoryOnTheFirstAllocation) {
  Memory m(0, 0.0);
  m.allocate("empty", 0);  // zero bytes fit even in nothing
  try {
    m.allocate("x", 3 * kGiB / 2);
    FAIL() << "no error";
  } catch (const sim::OutOfMemory& e) {
    EXPECT_STREQ(e.what(),
                 "simulated out of memory on chip 0: needs 1.500 GiB, has 0.000 GiB (allocating 'x' of 1.500 GiB; "
                 "in use before: 0 B; largest live: 'empty' 0 B)");
  }
  EXPECT_EQ(m.peak_allocation(), "empty");
  EXPECT_THROW(Memory(0, -1.0), std::invalid_argument);
}

TEST(Memory, Deterministic) {
  auto run = [] {
    Memory m(1, 10000);
    std::vector<Memory::Id> ids;
    for (int i = 0; i < 20; ++i) {
      ids.push_back(m.allocate(std::string("a").append(std::to_string(i)), uint64_t(37 * (i % 7) + 1)));
      if (i % 3 == 2) m.free(ids[size_t(i - 1)]);
    }
    std::string out = std::to_string(m.in_use()) + " " + std::to_string(m.peak()) + " " + m.peak_allocation();
    for (const auto& a : m.live()) out += " " + a.name;
    return out;
  };
  EXPECT_EQ(run(), run());
}
