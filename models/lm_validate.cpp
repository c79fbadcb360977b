#include "models/lm_validate.h"

#include <mpi.h>

#include <algorithm>
#include <cstring>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "models/lm_checkpoint.h"
#include "runtime/transport.h"

namespace shardsim::models {

LossTolerance loss_tolerance(runtime::DType dtype, int64_t step, kernels::Fp8Scaling fp8) {
  if (dtype != runtime::DType::fp32 && dtype != runtime::DType::bf16)
    throw std::invalid_argument("loss_tolerance: fp32 or bf16 only");
  if (fp8 != kernels::Fp8Scaling::none)
    return {0.03, true, "fp8: 3 % relative, FP8's bound against bf16 (docs/MODEL.md); each chip scales its own shard"};
  if (dtype == runtime::DType::fp32) return {1e-5, false, "fp32: 1e-5 absolute, summation order only"};
  return {std::ldexp(1.0, -9) * double(std::max<int64_t>(step, 1)), true,
          "bf16: 2^-9 x step relative, one rounding compounding per update"};
}

std::vector<double> reference_losses(const ModelSpec& c, const LmTrainConfig& t, const LmTrainSnapshot* resumed) {
  std::vector<double> out;
  LmTrainState ref = resumed ? lm_train_state_from(c, *resumed) : lm_train_init(c);
  LmTrainConfig rest = t;  // lm_train runs STEPS updates from the state's step
  rest.steps = t.steps - ref.step;
  out.assign(static_cast<size_t>(std::max<int64_t>(ref.step, 0)), std::numeric_limits<double>::quiet_NaN());
  if (rest.steps > 0)
    for (const auto& x : lm_train(c, rest, ref)) out.push_back(x.loss);
  return out;
}

LossCheck check_losses(runtime::DType dtype, const std::vector<std::pair<int64_t, double>>& losses,
                       const std::vector<double>& reference, kernels::Fp8Scaling fp8) {
  LossCheck out;
  double worst_ratio = -1;
  for (const auto& [step, loss] : losses) {
    const double want = reference.at(size_t(step - 1));
    const LossTolerance tol = loss_tolerance(dtype, step, fp8);
    const double e = std::fabs(loss - want) / (tol.relative ? std::fabs(want) : 1.0);
    const double ratio = std::isnan(e) ? INFINITY : e / tol.limit;
    ++out.steps;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      out.error = e;
      out.tolerance = tol;
      out.step = step;
    }
    if (!(e <= tol.limit)) out.passed = false;
  }
  return out;
}

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
    // Several chips per rank: the owner flags (8 bytes per chip) through the chip router, then each owner's
    // [row ids, values] broadcast from it: the chips hold one owner's rows at a time, not every chip's.
    const double flag = owner ? 1.0 : 0.0;
    const auto flags = world.allgather(&flag, sizeof flag, "block gather");
    const size_t n = rows.size();
    for (int r = 0; r < chips; ++r) {
      double f;
      std::memcpy(&f, flags.data() + sizeof f * static_cast<size_t>(r), sizeof f);
      if (f == 0) continue;
      std::string mine;
      if (r == rank) {
        const auto vals = out.to_float();
        mine.resize(sizeof(double) * n + sizeof(float) * vals.size());
        for (size_t i = 0; i < n; ++i) {
          const double row = static_cast<double>(rows[i]);
          std::memcpy(mine.data() + sizeof(double) * i, &row, sizeof row);
        }
        std::memcpy(mine.data() + sizeof(double) * n, vals.data(), sizeof(float) * vals.size());
      }
      const std::string b = world.broadcast(mine, r);
      if (rank != 0) continue;
      const size_t nr = b.size() / (sizeof(double) + sizeof(float) * size_t(h));  // that owner's rows
      for (size_t i = 0; i < nr; ++i) {
        double row;
        std::memcpy(&row, b.data() + sizeof(double) * i, sizeof row);
        g.rows.push_back(row);
      }
      const size_t v0 = g.vals.size();
      g.vals.resize(v0 + nr * size_t(h));
      std::memcpy(g.vals.data() + v0, b.data() + sizeof(double) * nr, sizeof(float) * nr * size_t(h));
      g.total += static_cast<int>(nr);
    }
  }
  return g;
}

RowCheck check_rows(const GatheredRows& got, const runtime::Tensor& ref, double tolerance) {
  RowCheck c;
  c.tolerance = tolerance;
  const int64_t n = ref.dim(0), h = ref.dim(1);
  const std::vector<float> want = ref.to_float();
  std::vector<int> seen(static_cast<size_t>(n), 0);
  bool rows_ok = true;
  for (int i = 0; i < got.total; ++i) {
    const auto row = static_cast<int64_t>(got.rows[static_cast<size_t>(i)]);
    if (row < 0 || row >= n) {
      rows_ok = false;
      continue;
    }
    ++seen[static_cast<size_t>(row)];
    for (int64_t k = 0; k < h; ++k) {
      const double y = got.vals[static_cast<size_t>(i * h + k)], r = want[static_cast<size_t>(row * h + k)];
      c.max_abs_error = std::max(c.max_abs_error, std::isfinite(y) ? std::fabs(y - r) : INFINITY);
      c.max_abs_reference = std::max(c.max_abs_reference, std::fabs(r));
    }
  }
  rows_ok = rows_ok && std::all_of(seen.begin(), seen.end(), [](int k) { return k == 1; });
  c.relative_error = c.max_abs_reference > 0 ? c.max_abs_error / c.max_abs_reference : c.max_abs_error;
  if (!rows_ok) c.max_abs_error = c.relative_error = INFINITY;
  c.passed = rows_ok && c.relative_error <= tolerance;
  return c;
}

}  // namespace shardsim::models
