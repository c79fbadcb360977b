#include "models/row_gather.h"

#include <mpi.h>

#include <cstring>

#include "runtime/transport.h"

namespace shardsim::sharding {

GatheredRows gather_owner_rows(const runtime::World& world, bool owner, const std::vector<int64_t>& rows,
                               const runtime::Tensor& out, int64_t hidden) {
  GatheredRows g;
  const int rank = world.rank(), chips = world.size(), h = static_cast<int>(hidden);
  if (!world.vcomm()) {  // one chip per rank: MPI gathers to rank 0
    std::vector<float> mine;
    std::vector<double> mine_rows;
    if (owner) {
      mine = out.to_float();
      mine_rows.assign(rows.begin(), rows.end());
    }
    int nrows = static_cast<int>(mine_rows.size());
    std::vector<int> counts(static_cast<size_t>(chips)), displs(static_cast<size_t>(chips));
    runtime::check_mpi(MPI_Gather(&nrows, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, world.comm()), rank, "block gather");
    for (int r = 0; r < chips; ++r) {
      displs[static_cast<size_t>(r)] = g.total;
      g.total += counts[static_cast<size_t>(r)];
    }
    g.rows.resize(rank == 0 ? static_cast<size_t>(g.total) : 0);
    runtime::check_mpi(MPI_Gatherv(mine_rows.data(), nrows, MPI_DOUBLE, g.rows.data(), counts.data(), displs.data(),
                                   MPI_DOUBLE, 0, world.comm()), rank, "block gather");
    std::vector<int> vcounts(counts), vdispls(displs);
    for (int r = 0; r < chips; ++r) {
      vcounts[static_cast<size_t>(r)] *= h;
      vdispls[static_cast<size_t>(r)] *= h;
    }
    g.vals.resize(rank == 0 ? static_cast<size_t>(g.total) * static_cast<size_t>(h) : 0);
    runtime::check_mpi(MPI_Gatherv(mine.data(), nrows * h, MPI_FLOAT, g.vals.data(), vcounts.data(), vdispls.data(),
                                   MPI_FLOAT, 0, world.comm()), rank, "block gather");
  } else {
    // Several chips per rank: every chip holds the same number of rows, so one fixed-size allgather through the
    // chip router carries [owner flag, row ids, values] per chip; rank 0 keeps the owners'.
    const size_t n = rows.size(), per = sizeof(double) * (1 + n) + sizeof(float) * n * size_t(h);
    std::vector<unsigned char> mine(per, 0);
    const double flag = owner ? 1.0 : 0.0;
    std::memcpy(mine.data(), &flag, sizeof flag);
    if (owner) {
      for (size_t i = 0; i < n; ++i) {
        const double r = static_cast<double>(rows[i]);
        std::memcpy(mine.data() + sizeof(double) * (1 + i), &r, sizeof r);
      }
      const auto vals = out.to_float();
      std::memcpy(mine.data() + sizeof(double) * (1 + n), vals.data(), sizeof(float) * vals.size());
    }
    const auto all = world.allgather(mine.data(), per, "block gather");
    if (rank == 0)
      for (int r = 0; r < chips; ++r) {
        const unsigned char* b = all.data() + per * static_cast<size_t>(r);
        double f;
        std::memcpy(&f, b, sizeof f);
        if (f == 0) continue;
        for (size_t i = 0; i < n; ++i) {
          double row;
          std::memcpy(&row, b + sizeof(double) * (1 + i), sizeof row);
          g.rows.push_back(row);
        }
        const size_t v0 = g.vals.size();
        g.vals.resize(v0 + n * size_t(h));
        std::memcpy(g.vals.data() + v0, b + sizeof(double) * (1 + n), sizeof(float) * n * size_t(h));
        g.total += static_cast<int>(n);
      }
  }
  return g;
}

}  // namespace shardsim::sharding
