// gtest main for multi-rank tests: every rank runs every test; only rank 0 prints progress (other ranks print
// failures only), and all ranks agree on the verdict so mpiexec's exit code is the job's verdict. MPI starts and
// ends as in shardsim itself (runtime::MpiSession): a singleton run (the binary started without mpirun) ends
// without MPI_Finalize, whose Open MPI 4.1 singleton form can crash after the verdict is printed
// (docs/RELIABILITY.md, section 2).
#include <gtest/gtest.h>
#include <mpi.h>

#include "kernels/gemm.h"
#include "runtime/world.h"

namespace {
class QuietListener : public ::testing::EmptyTestEventListener {
 public:
  explicit QuietListener(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.summary());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  shardsim::kernels::set_blas_threads(1);
  shardsim::runtime::MpiSession mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new QuietListener(rank));
  }
  const int local = RUN_ALL_TESTS();
  int global = 0;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && global != local) std::fprintf(stderr, "FAILED on another rank (see its messages above)\n");
  return mpi.finish(global);
}
