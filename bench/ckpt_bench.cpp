// Checkpoint write/read wall bandwidth (not a test): every rank holds a Shard(1) block of TENSORS fp32 tensors
// [rows, cols] (TOTAL MiB in all), saves them with checkpoint::save_checkpoint (space reservation, checksums, HDF5
// writes through MPI-IO, fsync, rename, directory fsync) and loads them back with CheckpointReader (structure check on rank 0, each rank
// reads its own hyperslab), then verifies every checksum (each rank reads a slice of rows). Rank 0 prints one
// line per repetition; GB = 1e9 bytes of tensor data. bench/ckpt_bandwidth.sh compares it with dd.
//   mpirun -np 4 build/bench/shardsim_ckpt_bench --mib 512 --reps 3 --dir /tmp [--chunk auto] [--compression none]
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/types.h"
#include "checkpoint/checkpoint.h"
#include "runtime/world.h"

using namespace shardsim;

int main(int argc, char** argv) {
  runtime::MpiSession mpi(&argc, &argv);  // a singleton ends without MPI_Finalize (runtime/world.h)
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  long mib = 512;
  int reps = 3, tensors = 4;
  std::string dir = "/tmp", chunk = "auto", compression = "none";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mib") mib = std::atol(v.c_str());
    else if (k == "--reps") reps = std::atoi(v.c_str());
    else if (k == "--dir") dir = v;
    else if (k == "--chunk") chunk = v;
    else if (k == "--compression") compression = v;
    else if (k == "--tensors") tensors = std::atoi(v.c_str());
  }
  const int64_t cols = 4096;
  const int64_t rows = std::max<int64_t>(1, (mib << 20) / tensors / 4 / cols);
  const double bytes = double(rows) * double(cols) * 4.0 * tensors;
  const collectives::Partition part{size_t(cols), size_t(p)};
  const auto c0 = int64_t(part.offset(size_t(rank))), cn = int64_t(part.size(size_t(rank)));
  std::vector<runtime::Tensor> mine;
  std::vector<checkpoint::CheckpointEntry> entries;
  std::vector<std::string> names;
  for (int t = 0; t < tensors; ++t) {
    char name[16];
    std::snprintf(name, sizeof name, "t%d", t);
    names.emplace_back(name);
  }
  mine.reserve(size_t(tensors));
  for (int t = 0; t < tensors; ++t) {
    mine.emplace_back(runtime::DType::fp32, runtime::Shape{rows, cn});
    float* f = mine.back().f32();
    for (int64_t i = 0; i < rows * cn; ++i) f[i] = float((i * 2654435761u + t) % 1000003) * 1e-3f;
    entries.push_back({names[size_t(t)], &mine.back(), {rows, cols}, {0, c0}, "Shard(1)", true});
  }
  checkpoint::SaveOptions so;
  so.chunking = checkpoint::parse_chunking(chunk);
  so.gzip_level = checkpoint::parse_compression(compression);
  char file[64];
  std::snprintf(file, sizeof file, "/shardsim_ckpt_bench_%d.h5", p);
  const std::string path = dir + file;
  using clk = std::chrono::steady_clock;
  auto secs = [](clk::time_point a) { return std::chrono::duration<double>(clk::now() - a).count(); };
  if (rank == 0)
    std::printf("# ranks %d, %d tensors fp32 [%lld, %lld] Shard(1), %.3f GB, chunk %s, compression %s, file %s\n", p,
                tensors, (long long)rows, (long long)cols, bytes / 1e9, chunk.c_str(), compression.c_str(), path.c_str());
  if (rank == 0) std::printf("rep  write_s  write_GB/s  read_s  read_GB/s  verify_s  verify_GB/s\n");
  // Destination tensors are allocated (and touched) once, outside the timings: first-touch page faults cost more
  // than the I/O on some virtual machines, and a workload allocates its tensors whatever their source.
  std::vector<runtime::Tensor> back;
  for (int t = 0; t < tensors; ++t) back.emplace_back(runtime::DType::fp32, runtime::Shape{rows, cn});
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = clk::now();
    checkpoint::save_checkpoint(MPI_COMM_WORLD, path, entries, {{"bench", "1"}}, so);
    MPI_Barrier(MPI_COMM_WORLD);
    const double w = secs(t0);
    if (rank == 0 && std::getenv("SHARDSIM_BENCH_DROP_CACHES") && std::string(std::getenv("SHARDSIM_BENCH_DROP_CACHES")) == "yes")
      if (std::system("sync && echo 3 > /proc/sys/vm/drop_caches") != 0) std::fprintf(stderr, "could not drop caches\n");
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = clk::now();
    double rd_s = 0, vf_s = 0;
    {
      checkpoint::CheckpointReader rd(MPI_COMM_WORLD, path);
      for (int t = 0; t < tensors; ++t) rd.read_block(names[size_t(t)], {0, c0}, back[size_t(t)]);
      MPI_Barrier(MPI_COMM_WORLD);
      rd_s = secs(t0);
      for (int t = 0; t < tensors; ++t)
        if (std::memcmp(back[size_t(t)].data(), mine[size_t(t)].data(), mine[size_t(t)].nbytes()) != 0) {
          std::fprintf(stderr, "rank %d: tensor %d read back differently\n", rank, t);
          MPI_Abort(MPI_COMM_WORLD, 3);
        }
      if (rank == 0 && std::getenv("SHARDSIM_BENCH_DROP_CACHES") && std::string(std::getenv("SHARDSIM_BENCH_DROP_CACHES")) == "yes")
        if (std::system("sync && echo 3 > /proc/sys/vm/drop_caches") != 0) std::fprintf(stderr, "could not drop caches\n");
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = clk::now();
      rd.verify();
      MPI_Barrier(MPI_COMM_WORLD);
      vf_s = secs(t0);
    }
    if (rank == 0)
      std::printf("%-4d %8.3f %10.3f %8.3f %10.3f %9.3f %11.3f\n", r, w, bytes / w / 1e9, rd_s, bytes / rd_s / 1e9, vf_s,
                  bytes / vf_s / 1e9);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::remove(path.c_str());
  return mpi.finish(0);
}
