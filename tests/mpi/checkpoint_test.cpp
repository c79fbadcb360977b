// Parallel HDF5 checkpoints: every rank writes its shard; any layout reads back the same global tensor.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "collectives/types.h"
#include "common/error.h"
#include "sharding/checkpoint.h"
#include "sharding/init.h"

using namespace shardsim;
using runtime::DType;
using runtime::Tensor;

namespace {
std::string temp_path(const char* name) {
  // Same path on every rank: rank 0 picks it from its pid and broadcasts it.
  int pid = static_cast<int>(getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return "/tmp/shardsim_test_" + std::to_string(pid) + "_" + name + ".h5";
}
Tensor block(DType t, int64_t rows, int64_t cols, int64_t gcols, int64_t r0, int64_t c0, uint32_t id) {
  Tensor x(t, {rows, cols});
  sharding::fill_uniform_block(x, sharding::InitSpec{77, id, -2, 2}, gcols, r0, c0);
  return x;
}
}  // namespace

TEST(Checkpoint, ShardedWriteReadsBackInAnyLayout) {
  int rank, p;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  const std::string path = temp_path("layout");
  const int64_t R = 7, C = 10;
  const collectives::Partition cols{size_t(C), size_t(p)}, rows{size_t(R), size_t(p)};
  const auto c0 = int64_t(cols.offset(size_t(rank))), cn = int64_t(cols.size(size_t(rank)));
  const auto r0 = int64_t(rows.offset(size_t(rank))), rn = int64_t(rows.size(size_t(rank)));
  const Tensor a = block(DType::fp32, R, cn, C, 0, c0, 1);   // Shard(1)
  const Tensor b = block(DType::bf16, rn, C, C, r0, 0, 2);   // Shard(0), bf16
  const Tensor rep = block(DType::fp32, 3, 4, 4, 0, 0, 3);   // replicated: rank 0 writes
  sharding::save_checkpoint(MPI_COMM_WORLD, path,
                            {{"w/a", &a, {R, C}, {0, c0}, "Shard(1)", true},
                             {"w/b", &b, {R, C}, {r0, 0}, "Shard(0)", true},
                             {"act/rep", &rep, {3, 4}, {0, 0}, "Replicate", rank == 0}},
                            {{"note", "test"}});
  {
    std::ifstream partial(path + ".partial");
    EXPECT_FALSE(partial.good()) << "the .partial file must be renamed away";
  }
  {
    sharding::CheckpointReader rd(MPI_COMM_WORLD, path);
    EXPECT_EQ(rd.root_attribute("note"), "test");
    EXPECT_EQ(rd.global_shape("w/a"), (runtime::Shape{R, C}));
    EXPECT_EQ(rd.dtype("w/b"), DType::bf16);
    EXPECT_FALSE(rd.has("w/zzz"));
    // Read the Shard(1) tensor by rows instead (a different layout), and the whole of each tensor.
    Tensor a_rows(DType::fp32, {rn, C});
    rd.read_block("w/a", {r0, 0}, a_rows);
    EXPECT_TRUE(a_rows.bit_equal(block(DType::fp32, rn, C, C, r0, 0, 1)));
    Tensor b_full(DType::bf16, {R, C});
    rd.read_block("w/b", {0, 0}, b_full);
    EXPECT_TRUE(b_full.bit_equal(block(DType::bf16, R, C, C, 0, 0, 2)));
    Tensor rep_back(DType::fp32, {3, 4});
    rd.read_block("act/rep", {0, 0}, rep_back);
    EXPECT_TRUE(rep_back.bit_equal(rep));
    // Mismatches are input errors, not crashes.
    Tensor wrong_type(DType::bf16, {R, C});
    EXPECT_THROW(rd.read_block("w/a", {0, 0}, wrong_type), ConfigError);
    Tensor too_big(DType::fp32, {R + 1, C});
    EXPECT_THROW(rd.read_block("w/a", {0, 0}, too_big), ConfigError);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::remove(path.c_str());
}

TEST(Checkpoint, MissingFileIsAConfigError) {
  EXPECT_THROW(sharding::CheckpointReader(MPI_COMM_WORLD, "/nonexistent/ckpt.h5"), ConfigError);
}
