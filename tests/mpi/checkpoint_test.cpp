// Parallel HDF5 checkpoints: every rank writes its shard; any layout reads back the same global tensor.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "collectives/types.h"
#include "mpi_util.h"
#include "common/error.h"
#include "checkpoint/checkpoint.h"
#include "models/init.h"

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
  models::fill_uniform_block(x, models::InitSpec{77, id, -2, 2}, gcols, r0, c0);
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
  checkpoint::save_checkpoint(MPI_COMM_WORLD, path,
                            {{"w/a", &a, {R, C}, {0, c0}, "Shard(1)", true},
                             {"w/b", &b, {R, C}, {r0, 0}, "Shard(0)", true},
                             {"act/rep", &rep, {3, 4}, {0, 0}, "Replicate", rank == 0}},
                            {{"note", "test"}});
  if (rank == 0) {
    const std::filesystem::path dir = std::filesystem::path(path).parent_path();
    const std::string stem = std::filesystem::path(path).filename().string() + ".partial";
    for (const auto& e : std::filesystem::directory_iterator(dir.empty() ? "." : dir))
      EXPECT_NE(e.path().filename().string().rfind(stem, 0), 0u) << "temporary left behind: " << e.path();
  }
  {
    checkpoint::CheckpointReader rd(MPI_COMM_WORLD, path);
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
  EXPECT_THROW(checkpoint::CheckpointReader(MPI_COMM_WORLD, "/nonexistent/ckpt.h5"), ConfigError);
}

// ---------------------------------------------------------------------------------------------------------
// Format v1: resharding onto other chip counts, checksums, chunking/compression, integrity errors.
#include <hdf5.h>

#include <filesystem>

#include "checkpoint/checkpoint.h"

namespace {

// Element (r, c) of the test tensor: a value that depends only on its global position (exact per dtype).
float value_at(int64_t r, int64_t c, uint32_t id) {
  return static_cast<float>(((r * 131 + c * 17 + id * 7) % 97)) * 0.375f - 17.0f;
}
Tensor global_block(DType t, const runtime::Shape& shape, const runtime::Shape& off, uint32_t id) {
  Tensor x(t, shape);
  for (int64_t i = 0; i < shape[0]; ++i)
    for (int64_t j = 0; j < shape[1]; ++j) x.set(i * shape[1] + j, value_at(off[0] + i, off[1] + j, id));
  return x;
}
// Rows (dim 0) or columns (dim 1) of a [R, C] tensor split over P parts: part K's offset and shape.
std::pair<runtime::Shape, runtime::Shape> part(int dim, int64_t R, int64_t C, int k, int P) {
  const collectives::Partition p{size_t(dim == 0 ? R : C), size_t(P)};
  const auto o = int64_t(p.offset(size_t(k))), n = int64_t(p.size(size_t(k)));
  return dim == 0 ? std::pair{runtime::Shape{o, 0}, runtime::Shape{n, C}}
                  : std::pair{runtime::Shape{0, o}, runtime::Shape{R, n}};
}
bool same_message_everywhere(const std::string& msg) {
  // Every rank threw; all must carry the same text (agreed), so compare lengths and a hash.
  unsigned long h = std::hash<std::string>{}(msg), lo = h, hi = h;
  MPI_Allreduce(&h, &lo, 1, MPI_UNSIGNED_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UNSIGNED_LONG, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}
template <typename F>
std::string config_error_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

const DType kTypes[] = {DType::fp32, DType::bf16, DType::fp16, DType::fp64, DType::int32, DType::fp8_e4m3,
                        DType::fp8_e5m2, DType::uint8};

}  // namespace

TEST(CheckpointV1, SavedAtPReshardsOntoEveryOtherChipCountBitExactly) {
  const int rank = world_rank(), p = world_size();
  const std::string path = temp_path("reshard");
  // 5 rows over up to 8 ranks: uneven splits, and zero-size shards on ranks >= 5. 11 columns: uneven too.
  const int64_t R = 5, C = 11;
  std::vector<Tensor> blocks;
  std::vector<checkpoint::CheckpointEntry> entries;
  blocks.reserve(std::size(kTypes) * 2);
  uint32_t id = 0;
  for (DType t : kTypes) {
    ++id;
    const auto [o0, s0] = part(0, R, C, rank, p);  // Shard(0): zero rows on ranks >= 5
    blocks.push_back(global_block(t, s0, o0, id));
    entries.push_back({"rows/" + runtime::dtype_name(t), &blocks.back(), {R, C}, o0, "Shard(0)", true});
    const auto [o1, s1] = part(1, R, C, rank, p);  // Shard(1)
    blocks.push_back(global_block(t, s1, o1, id + 100));
    entries.push_back({"cols/" + runtime::dtype_name(t), &blocks.back(), {R, C}, o1, "Shard(1)", true});
  }
  checkpoint::SaveOptions so;
  so.chunking = checkpoint::parse_chunking("2x4");  // chunks straddle the shards
  so.step = 42;
  so.mesh = "test mesh";
  checkpoint::save_checkpoint(MPI_COMM_WORLD, path, entries, {{"note", "v1"}}, so);

  // Load on every chip count k = 1..p (the first k ranks), in the other layout, and check bit-exactness.
  for (int k = 1; k <= p; ++k) {
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, rank < k ? 0 : 1, rank, &sub);
    if (rank < k) {
      checkpoint::CheckpointReader rd(sub, path);
      EXPECT_EQ(rd.step(), 42);
      EXPECT_EQ(rd.root_attribute("note"), "v1");
      const auto sums = rd.verify();
      ASSERT_EQ(sums.size(), entries.size());
      id = 0;
      for (DType t : kTypes) {
        ++id;
        const std::string n = runtime::dtype_name(t);
        EXPECT_EQ(rd.info("rows/" + n).mesh, "test mesh");
        EXPECT_EQ(rd.info("rows/" + n).chunk, (runtime::Shape{2, 4}));
        // The checksum of the whole tensor computed in one piece equals the stored one.
        EXPECT_EQ(checkpoint::checksum_block(global_block(t, {R, C}, {0, 0}, id), {0, 0}, {R, C}),
                  rd.info("rows/" + n).checksum) << n;
        const auto [o1, s1] = part(1, R, C, rank, k);  // saved by rows, loaded by columns
        Tensor a(t, s1);
        rd.read_block("rows/" + n, o1, a);
        EXPECT_TRUE(a.bit_equal(global_block(t, s1, o1, id))) << n << " k=" << k;
        const auto [o0, s0] = part(0, R, C, rank, k);  // saved by columns, loaded by rows (zero rows for k > 5)
        Tensor b(t, s0);
        rd.read_block("cols/" + n, o0, b);
        EXPECT_TRUE(b.bit_equal(global_block(t, s0, o0, id + 100))) << n << " k=" << k;
      }
    }
    MPI_Comm_free(&sub);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (rank == 0) std::remove(path.c_str());
}

TEST(CheckpointV1, ChecksumIsLayoutIndependentAndSeesEveryChange) {
  const int64_t R = 6, C = 7;
  const Tensor full = global_block(DType::bf16, {R, C}, {0, 0}, 3);
  const uint64_t whole = checkpoint::checksum_block(full, {0, 0}, {R, C});
  for (int P : {2, 3, 4}) {
    for (int dim : {0, 1}) {
      uint64_t sum = 0;
      for (int k = P - 1; k >= 0; --k) {  // any order
        const auto [o, s] = part(dim, R, C, k, P);
        sum += checkpoint::checksum_block(global_block(DType::bf16, s, o, 3), o, {R, C});
      }
      EXPECT_EQ(sum, whole) << "P=" << P << " dim=" << dim;
    }
  }
  Tensor flipped = full;
  static_cast<unsigned char*>(flipped.data())[9] ^= 0x10;  // one bit of one element
  EXPECT_NE(checkpoint::checksum_block(flipped, {0, 0}, {R, C}), whole);
  Tensor swapped = full;  // two different elements trade places
  const float a = swapped.get(0), b = swapped.get(1);
  ASSERT_NE(a, b);
  swapped.set(0, b);
  swapped.set(1, a);
  EXPECT_NE(checkpoint::checksum_block(swapped, {0, 0}, {R, C}), whole);
}

TEST(CheckpointV1, GzipAndContiguousLayoutsRoundTrip) {
  const int rank = world_rank(), p = world_size();
  for (const char* layout : {"gzip", "contiguous"}) {
    const std::string path = temp_path(layout);
    const int64_t R = 33, C = 20;
    const auto [o, s] = part(1, R, C, rank, p);
    const Tensor mine = global_block(DType::fp32, s, o, 9);
    checkpoint::SaveOptions so;
    if (std::string(layout) == "gzip") {
      so.chunking = checkpoint::parse_chunking("1K");
      so.gzip_level = checkpoint::parse_compression("gzip:6");
    } else {
      so.chunking = checkpoint::parse_chunking("contiguous");
    }
    checkpoint::save_checkpoint(MPI_COMM_WORLD, path, {{"t", &mine, {R, C}, o, "Shard(1)", true}}, {}, so);
    checkpoint::CheckpointReader rd(MPI_COMM_WORLD, path);
    const auto& info = rd.info("t");
    if (so.gzip_level) {
      EXPECT_EQ(info.gzip_level, 6);
      EXPECT_EQ(info.chunk, (runtime::Shape{12, 20}));  // 1 KiB / 80 B per row = 12 rows
    } else {
      EXPECT_TRUE(info.chunk.empty());
    }
    rd.verify();
    const auto [o0, s0] = part(0, R, C, rank, p);
    Tensor back(DType::fp32, s0);
    rd.read_block("t", o0, back);
    EXPECT_TRUE(back.bit_equal(global_block(DType::fp32, s0, o0, 9))) << layout;
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) std::remove(path.c_str());
  }
  EXPECT_THROW(checkpoint::parse_compression("gzip:0"), UsageError);
  EXPECT_THROW(checkpoint::parse_compression("lz4"), UsageError);
  EXPECT_THROW(checkpoint::parse_chunking("12y"), UsageError);
  EXPECT_THROW(checkpoint::parse_chunking("0x4"), UsageError);
}

TEST(CheckpointV1, EveryIntegrityFailureIsAConfigErrorOnEveryRankNamingFileAndTensor) {
  const int rank = world_rank(), p = world_size();
  const std::string path = temp_path("integrity");
  const int64_t R = 16, C = 9;
  const auto [o, s] = part(0, R, C, rank, p);
  const Tensor a = global_block(DType::fp32, s, o, 1), b = global_block(DType::bf16, s, o, 2);
  checkpoint::SaveOptions so;
  so.chunking = checkpoint::parse_chunking("contiguous");  // so the test can find the raw bytes
  checkpoint::save_checkpoint(MPI_COMM_WORLD, path,
                            {{"w/a", &a, {R, C}, o, "Shard(0)", true}, {"w/b", &b, {R, C}, o, "Shard(0)", true}}, {},
                            so);
  const std::string bad = path + ".bad.h5";
  auto damage = [&](const std::function<void()>& f) {
    if (rank == 0) {
      std::filesystem::copy_file(path, bad, std::filesystem::copy_options::overwrite_existing);
      f();
    }
    MPI_Barrier(MPI_COMM_WORLD);
  };
  auto expect_error = [&](const char* what, const std::function<void()>& f, const std::string& needle) {
    const std::string msg = config_error_of(f);
    EXPECT_NE(msg.find("checkpoint " + bad), std::string::npos) << what << ": " << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << what << ": " << msg;
    EXPECT_TRUE(same_message_everywhere(msg)) << what;
  };
  auto raw_offset = [&](const char* ds) {
    const hid_t f = H5Fopen(bad.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    const hid_t d = H5Dopen2(f, ds, H5P_DEFAULT);
    const haddr_t off = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
    return off;
  };

  // Flipped bytes in w/b's data: the structure is fine, the checksum is not.
  damage([&] {
    const haddr_t off = raw_offset("w/b");
    std::fstream io(bad, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(off + 37));
    const char junk[3] = {'\x5a', '\x13', '\x77'};
    io.write(junk, 3);
  });
  expect_error("flipped", [&] { checkpoint::CheckpointReader(MPI_COMM_WORLD, bad).verify(); },
               "tensor 'w/b': checksum mismatch");
  // Truncated to 60%.
  damage([&] { std::filesystem::resize_file(bad, std::filesystem::file_size(bad) * 6 / 10); });
  expect_error("truncated", [&] { checkpoint::CheckpointReader(MPI_COMM_WORLD, bad); }, "truncated");
  // A manifest tensor deleted.
  damage([&] {
    const hid_t f = H5Fopen(bad.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(f, "w/a", H5P_DEFAULT);
    H5Fclose(f);
  });
  expect_error("missing", [&] { checkpoint::CheckpointReader(MPI_COMM_WORLD, bad); }, "tensor 'w/a': listed in the manifest but missing");
  // No `complete` marker: what an interrupted save leaves.
  damage([&] {
    const hid_t f = H5Fopen(bad.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    H5Adelete(f, "complete");
    H5Fclose(f);
  });
  expect_error("incomplete", [&] { checkpoint::CheckpointReader(MPI_COMM_WORLD, bad); }, "incomplete checkpoint");
  // dtype and shape mismatches against what the caller expects, and a bad block on ONE rank only.
  damage([] {});
  {
    checkpoint::CheckpointReader rd(MPI_COMM_WORLD, bad);
    Tensor wrong_type(DType::fp32, {0, C});
    expect_error("dtype", [&] { rd.read_block("w/b", {0, 0}, wrong_type); }, "tensor 'w/b': is bf16");
    Tensor wrong_shape(DType::fp32, {R, C + 1});
    expect_error("shape", [&] { rd.read_block("w/a", {0, 0}, wrong_shape); }, "tensor 'w/a': has shape [16, 9]");
    Tensor mine(DType::fp32, {1, C});
    const int64_t row = rank == p - 1 ? R : 0;  // out of bounds on the last rank only: nobody may hang
    expect_error("one rank", [&] { rd.read_block("w/a", {row, 0}, mine); }, "tensor 'w/a'");
    expect_error("no such tensor", [&] { rd.info("w/zzz"); }, "tensor 'w/zzz': missing");
    rd.verify();  // the reader still works after agreed errors
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    std::remove(path.c_str());
    std::remove(bad.c_str());
  }
}

// ---------------------------------------------------------------------------------------------------------
// Several chips per rank (runtime/chips.h): the rank's chip 0 writes and reads the union of its K chips' blocks.
#include "runtime/chips.h"
#include "runtime/world.h"

TEST(CheckpointChips, KChipsPerRankWriteAndReadTheUnionOfTheirBlocks) {
  const int rank = world_rank();
  constexpr int K = 3;
  const int64_t R = 7, C = 10;  // with 12 or 24 chips some chips hold no column of the Shard(1) tensor
  for (const char* comp : {"none", "gzip:1"}) {
    const std::string path = temp_path((std::string("chips_") + comp[0]).c_str());
    const int code = runtime::run_chips(K, [&](const runtime::World& w) {
      const int me = w.rank(), n = w.size();
      const auto [ao, as] = part(1, R, C, me, n);  // Shard(1) over the chips: rows cut into runs per chip
      const auto [bo, bs] = part(0, R, C, me, n);  // Shard(0), bf16
      const Tensor a = global_block(DType::fp32, as, ao, 1);
      const Tensor b = global_block(DType::bf16, bs, bo, 2);
      const Tensor rep = global_block(DType::fp32, {3, 4}, {0, 0}, 3);  // replicated, written by the last chip
      Tensor scalar(DType::fp32, runtime::Shape{});
      scalar.set(0, 2.5f);
      checkpoint::SaveOptions so;
      so.gzip_level = checkpoint::parse_compression(comp);
      checkpoint::save_checkpoint(w, path,
                                {{"w/a", &a, {R, C}, ao, "Shard(1)", true},
                                 {"w/b", &b, {R, C}, bo, "Shard(0)", true},
                                 {"rep", &rep, {3, 4}, {0, 0}, "Replicate", me == n - 1},
                                 {"scalar", &scalar, {}, {}, "Replicate", me == 1}},
                                {{"note", "chips"}}, so);
      checkpoint::CheckpointReader rd(w, path);
      EXPECT_EQ(rd.root_attribute("note"), "chips");
      EXPECT_EQ(rd.info("w/a").gzip_level, so.gzip_level);
      // Windows that overlap partly between the chips of a rank (read once as a union, copied to each chip).
      const runtime::Shape wo{me % (R - 2), (me * 3) % (C - 3)};
      Tensor win(DType::fp32, {3, 4});
      rd.read_block("w/a", wo, win);
      EXPECT_TRUE(win.bit_equal(global_block(DType::fp32, {3, 4}, wo, 1))) << "chip " << me << " " << comp;
      // The Shard(0) blocks, verified: they partition the tensor, so their checksum terms give its checksum.
      Tensor b_back(DType::bf16, bs);
      rd.read_block_verified("w/b", bo, b_back, true);
      EXPECT_TRUE(b_back.bit_equal(b)) << "chip " << me;
      // A replicated tensor every chip reads whole (one chip counts), and the scalar.
      Tensor rep_back(DType::fp32, {3, 4});
      rd.read_block_verified("rep", {0, 0}, rep_back, me == 0);
      EXPECT_TRUE(rep_back.bit_equal(rep));
      Tensor s_back(DType::fp32, runtime::Shape{});
      rd.read_block_verified("scalar", {}, s_back, me == n - 1);
      EXPECT_EQ(s_back.get(0), 2.5f);
      // verify(): every chip gets the same sums, equal to the stored ones.
      const auto sums = rd.verify();
      EXPECT_EQ(sums.size(), 4u);
      for (size_t i = 0; i < sums.size() && i < rd.tensors().size(); ++i) EXPECT_EQ(sums[i], rd.tensors()[i].checksum);
      // One chip's block out of bounds: a ConfigError on every chip (agreed), no hang.
      Tensor oob(DType::fp32, {me == n - 1 ? R + 1 : 1, C});
      EXPECT_THROW(rd.read_block("w/a", {0, 0}, oob), ConfigError) << "chip " << me;
      return ::testing::Test::HasFailure() ? 1 : 0;
    });
    EXPECT_EQ(code, 0) << comp;
    // Read back at one chip per rank: the whole tensors and their stored checksums.
    {
      checkpoint::CheckpointReader rd(MPI_COMM_WORLD, path);
      Tensor a_all(DType::fp32, {R, C}), b_all(DType::bf16, {R, C});
      rd.read_block("w/a", {0, 0}, a_all);
      rd.read_block("w/b", {0, 0}, b_all);
      const Tensor a_ref = global_block(DType::fp32, {R, C}, {0, 0}, 1);
      const Tensor b_ref = global_block(DType::bf16, {R, C}, {0, 0}, 2);
      EXPECT_TRUE(a_all.bit_equal(a_ref)) << comp;
      EXPECT_TRUE(b_all.bit_equal(b_ref)) << comp;
      EXPECT_EQ(rd.info("w/a").checksum, checkpoint::checksum_block(a_ref, {0, 0}, {R, C}));
      EXPECT_EQ(rd.info("w/b").checksum, checkpoint::checksum_block(b_ref, {0, 0}, {R, C}));
      rd.verify();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) std::remove(path.c_str());
  }
}
