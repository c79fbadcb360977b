// `shardsim bench`: nccl-tests-style bandwidth tables, simulated (the modelled hardware) and wall (this host)
// side by side, optionally against MPI's own collective on the same buffers (--vs-mpi).
//
// algbw = size / time; busbw = algbw * factor with nccl-tests' factors (verification/verify.h busbw_factor).
// Wall time = mean over -n iterations after -w warm-up iterations, the slowest rank's. Simulated time = the
// latest chip's completion of one run on a fresh clock (identical on every run).
#include <mpi.h>

#include <chrono>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <nlohmann/json.hpp>

#include "apps/cli_common.h"
#include "apps/commands.h"
#include "collectives/registry.h"
#include "verification/verify.h"
#include "common/error.h"
#include "common/number.h"
#include "common/output_file.h"
#include "common/text.h"
#include "runtime/chips.h"

namespace shardsim::apps {

namespace {

using collectives::Collective;
using runtime::DType;

struct BenchFlags {
  NetFlags net;
  std::string collective = "all_reduce";
  std::string min_bytes = "8", max_bytes = "32M", step_factor = "2", step_bytes, dtypes = "fp32", ops = "sum";
  std::string algo = "auto", chunk_bytes = "0", csv, json;
  int iters = 20, warmup = 5, check = 1, root = 0;
  bool vs_mpi = false, explain = false, list = false;
  bool choose_only = false;  // --choose-only: print auto's choice per size (the cost model only), run nothing
  bool shape_only = false;  // --shape-only: timing headers only, no storage, not checked
  bool csv_given = false, json_given = false;  // an empty path given explicitly is an error, not "no file"
  int gpus = 1;                                // nccl-tests' -g: one simulated chip per rank, so only 1
};

struct Measure {
  double sim_us = 0, wall_us = 0, mpi_us = -1;
  size_t wrong = 0;
  std::string algorithm;
  std::string explanation;
};

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::int8: return MPI_INT8_T;
    case DType::uint8: return MPI_UINT8_T;
    case DType::int32: return MPI_INT32_T;
    case DType::uint32: return MPI_UINT32_T;
    case DType::int64: return MPI_INT64_T;
    case DType::uint64: return MPI_UINT64_T;
    case DType::fp32: return MPI_FLOAT;
    case DType::fp64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;  // fp16, bf16, fp8: MPI has no such type
  }
}

MPI_Op mpi_op(collectives::ReduceOp op) {
  switch (op) {
    case collectives::ReduceOp::sum: return MPI_SUM;
    case collectives::ReduceOp::prod: return MPI_PROD;
    case collectives::ReduceOp::min: return MPI_MIN;
    case collectives::ReduceOp::max: return MPI_MAX;
    default: return MPI_OP_NULL;
  }
}

// One call of MPI's own collective on the runner's buffers; false when MPI has no equivalent.
bool mpi_call(Collective c, verification::CaseRunner& r, const verification::Case& cs, MPI_Comm comm, int p,
              bool run) {
  const MPI_Datatype t = mpi_type(cs.dtype);
  const bool reduction = collectives::is_reduction(c);
  if (t == MPI_DATATYPE_NULL || (reduction && mpi_op(cs.op) == MPI_OP_NULL) || cs.count > INT_MAX) return false;
  const int n = static_cast<int>(cs.count);
  void* s = r.send_buffer();
  void* d = r.recv_buffer();
  const MPI_Op op = reduction ? mpi_op(cs.op) : MPI_OP_NULL;
  if (!run) {
    switch (c) {
      case Collective::all_reduce:
      case Collective::broadcast:
      case Collective::reduce: return true;
      case Collective::reduce_scatter:
      case Collective::all_gather:
      case Collective::all_to_all:
      case Collective::gather:
      case Collective::scatter: return cs.count % static_cast<size_t>(p) == 0;
      default: return false;
    }
  }
  int rc = MPI_SUCCESS;
  switch (c) {
    case Collective::all_reduce: rc = MPI_Allreduce(s, d, n, t, op, comm); break;
    case Collective::broadcast: rc = MPI_Bcast(d, n, t, cs.root, comm); break;
    case Collective::reduce: rc = MPI_Reduce(s, d, n, t, op, cs.root, comm); break;
    case Collective::reduce_scatter: rc = MPI_Reduce_scatter_block(s, d, n / p, t, op, comm); break;
    case Collective::all_gather: rc = MPI_Allgather(s, n / p, t, d, n / p, t, comm); break;
    case Collective::all_to_all: rc = MPI_Alltoall(s, n / p, t, d, n / p, t, comm); break;
    case Collective::gather: rc = MPI_Gather(s, n / p, t, d, n / p, t, cs.root, comm); break;
    case Collective::scatter: rc = MPI_Scatter(s, n / p, t, d, n / p, t, cs.root, comm); break;
    default: return false;
  }
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  runtime::check_mpi(rc, rank, "--vs-mpi " + collectives::collective_name(c));
  return true;
}

double slowest(double v, runtime::Transport& g) {
  double out = v;
  g.allreduce(std::span<double>(&out, 1), runtime::Reduce::max, "bench");
  return out;
}

template <class F>
double time_us(runtime::Transport& g, int warmup, int iters, F&& f) {
  for (int i = 0; i < warmup; ++i) f();
  g.barrier("bench");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  const auto t1 = std::chrono::steady_clock::now();
  return slowest(std::chrono::duration<double, std::micro>(t1 - t0).count() / std::max(iters, 1), g);
}

Measure measure(runtime::Transport& g, const verification::Case& cs, const BenchFlags& f) {
  Measure m;
  verification::CaseRunner runner(g, cs);
  runner.prepare();
  g.timeline().reset();
  const auto first = runner.execute(0.0);
  m.sim_us = slowest(first.span.end, g) / 1e3;
  m.algorithm = first.algorithm;
  m.explanation = first.explanation;
  if (f.check) {
    const auto o = runner.check_local();
    unsigned long long total = o.wrong;
    g.allreduce(std::span<unsigned long long>(&total, 1), runtime::Reduce::sum, "bench");
    m.wrong = total;
  }
  m.wall_us = time_us(g, f.warmup, f.iters, [&] {
    g.timeline().reset();
    runner.execute(0.0);
  });
  // MPI only out of place: its in-place form needs MPI_IN_PLACE, and aliased buffers are erroneous in MPI.
  // (Not in chip mode: MPI's collectives run between ranks, not between the chips of a rank.)
  if (f.vs_mpi && !cs.in_place && !g.chip_mode() && mpi_call(cs.collective, runner, cs, g.comm(), g.size(), false))
    m.mpi_us = time_us(g, f.warmup, f.iters, [&] { mpi_call(cs.collective, runner, cs, g.comm(), g.size(), true); });
  return m;
}

// The parsed command line of a bench run (every rank agrees on it).
struct BenchPlan {
  std::unique_ptr<Net> net;
  Collective c{};
  std::vector<DType> dtypes;
  std::vector<collectives::ReduceOp> ops;
  size_t lo = 0, hi = 0, step_bytes = 0;
  double factor = 2;
};

// Parses and checks F (inside World::agree: a bad flag is one line and exit 2 on every rank).
BenchPlan parse_bench(const runtime::World& world, const BenchFlags& f) {
  BenchPlan b;
  b.net = build_net(f.net, world);
  try {
    b.c = collectives::parse_collective(f.collective);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const Collective c = b.c;
  b.dtypes = parse_list<DType>(f.dtypes, runtime::all_dtypes(), runtime::parse_dtype, "-d/--datatype");
  b.ops = collectives::is_reduction(c)
              ? parse_list<collectives::ReduceOp>(f.ops, collectives::all_reduce_ops(), collectives::parse_reduce_op,
                                                  "-o/--op")
              : std::vector<collectives::ReduceOp>{collectives::ReduceOp::sum};
  b.lo = parse_bytes(f.min_bytes, "-b/--minbytes");
  b.hi = parse_bytes(f.max_bytes, "-e/--maxbytes");
  if (b.lo > b.hi) throw UsageError("-b/--minbytes is larger than -e/--maxbytes");
  if (!f.step_bytes.empty()) b.step_bytes = parse_bytes(f.step_bytes, "-i/--stepbytes");
  const auto factor = decimal_double(f.step_factor);  // "2abc", "0x2" and "inf" were read (as 2, 2 and forever)
  if (!factor || *factor > 1e6)
    throw UsageError("-f/--stepfactor: '" + escape_control(f.step_factor) + "' is not a decimal number up to 1e6");
  b.factor = *factor;
  if (b.step_bytes == 0 && !(b.factor > 1)) throw UsageError("-f/--stepfactor must be > 1");
  if (f.iters < 1 || f.warmup < 0) throw UsageError("-n must be >= 1 and -w >= 0");
  if (f.check != 0 && f.check != 1) throw UsageError("-c/--check: 0 or 1 (got " + std::to_string(f.check) + ")");
  if (f.gpus != 1 && f.gpus != runtime::chips_per_rank())
    throw UsageError("-g/--ngpus: chips per rank are set with --chips-per-rank K (before the command); got -g " +
                     std::to_string(f.gpus) + " with " + std::to_string(runtime::chips_per_rank()) +
                     " chip(s) per rank");
  if (!f.step_bytes.empty() && b.step_bytes == 0) throw UsageError("-i/--stepbytes: must be > 0");
  if (f.shape_only && f.vs_mpi) throw UsageError("--shape-only moves no data: it cannot be timed against MPI (--vs-mpi)");
  if (f.algo != "auto" && collectives::canonical_algorithm(c, f.algo).empty())
    throw UsageError(collectives::collective_name(c) + ": " + collectives::not_an_algorithm_of(c, f.algo));
  return b;
}

// Checks what needs the connected group (inside World::agree): the outputs, the host memory for the largest size,
// the root and the named algorithm's applicability. Returns the chunk size.
size_t check_bench_group(const BenchFlags& f, const BenchPlan& b, Net& net) {
  runtime::Transport& g = *net.group;
  const Collective c = b.c;
  const size_t chunk = parse_bytes(f.chunk_bytes, "--chunk-bytes");
  std::vector<std::pair<std::string, std::string>> outs;
  if (!f.csv.empty() || f.csv_given) outs.emplace_back("--csv", f.csv);
  if (!f.json.empty() || f.json_given) outs.emplace_back("--json", f.json);
  check_outputs(outs);
  size_t widest = 1;
  for (DType dt : b.dtypes) widest = std::max(widest, runtime::dtype_size(dt));
  verification::Case big;
  big.collective = c;
  big.count = b.hi / widest;
  big.dtype = widest == 1 ? DType::uint8 : widest == 2 ? DType::fp16 : widest == 4 ? DType::fp32 : DType::fp64;
  double need = verification::host_bytes_needed(big, g.size());
  // Its fixed 64 MiB (reference blocks, process) is per rank; in chip mode the K chips of a rank share it.
  if (g.chip_mode()) need -= 64.0 * (1 << 20) * (1.0 - 1.0 / runtime::chips_per_rank());
  // Shape-only: no host storage proportional to the size; the simulated device still holds the buffers
  // (--choose-only allocates none: nothing runs).
  check_memory(net, f.shape_only || f.choose_only ? 0.0 : need, f.choose_only ? 0.0 : need,
               "bench " + collectives::collective_name(c) + " -e " + f.max_bytes);
  if (collectives::is_rooted(c) && (f.root < 0 || f.root >= g.size()))
    throw UsageError("-r/--root " + std::to_string(f.root) + " is outside the group of " + std::to_string(g.size()) +
                     " ranks");
  if (f.algo != "auto") {
    const std::string a = collectives::canonical_algorithm(c, f.algo);
    if (const auto why = collectives::obstacle(c, a, g); !why.empty())
      throw UsageError(collectives::collective_name(c) + ": algorithm '" + a + "' cannot run here: " + why);
  }
  return chunk;
}

// What a bench table's columns need to know.
struct BenchShape {
  Collective c{};
  int p = 0;
  double busf = 0;
  bool blocky = false;        // counts rounded down to a multiple of the ranks
  bool has_in_place = false;  // an in-place column
  bool checked = false;       // values checked (#wrong column)
};

void print_bench_header(const BenchFlags& f, const BenchShape& sh, const Net& net, size_t chunk, bool part_of_world) {
  std::printf("# shardsim bench %s: %s\n", collectives::collective_name(sh.c).c_str(), net.describe().c_str());
  // The canonical name (an alias given with -a is shown as the algorithm it names).
  const std::string algo = f.algo == "auto" ? f.algo : collectives::canonical_algorithm(sh.c, f.algo);
  std::printf("# algorithm %s, chunk %zu B; -n %d -w %d -c %d; sim = simulated hardware, wall = this host%s\n",
              (algo.empty() ? f.algo : algo).c_str(), chunk, f.iters, f.warmup, sh.checked ? 1 : 0,
              f.vs_mpi ? ", mpi = MPI's own collective" : "");
  if (f.shape_only) std::printf("# shape-only: buffers carry no data, messages only their timing headers; not validated\n");
  std::printf("# busbw = algbw x %.4f (nccl-tests factor for %d ranks); GB/s with GB = 1e9 B; on links both ways\n"
              "# (bidir_ring, torus) busbw can reach twice the per-direction link bandwidth\n", sh.busf, sh.p);
  if (part_of_world)
    std::printf("# rows: the group of world rank 0 (all groups run at once); the #wrong verdict covers every group\n");
  std::printf("#\n");
  std::printf("# %10s %12s %8s %6s %4s %-16s | %-61s | %-61s |%s\n", "", "", "", "", "", "", "out-of-place",
              sh.has_in_place ? "in-place" : "", f.vs_mpi ? " MPI, out-of-place" : "");
  std::printf("# %10s %12s %8s %6s %4s %-16s |", "size", "count", "type", "redop", "root", "algorithm");
  for (int k = 0; k < 2; ++k)
    std::printf(" %10s %8s %8s %10s %8s %6s |", "sim time", "algbw", "busbw", "wall time", "busbw", "#wrong");
  if (f.vs_mpi) std::printf(" %10s %8s |", "wall time", "busbw");
  std::printf("\n# %10s %12s %8s %6s %4s %-16s |", "(B)", "(elements)", "", "", "", "");
  for (int k = 0; k < 2; ++k) std::printf(" %10s %8s %8s %10s %8s %6s |", "(us)", "(GB/s)", "(GB/s)", "(us)", "(GB/s)", "");
  if (f.vs_mpi) std::printf(" %10s %8s |", "(us)", "(GB/s)");
  std::printf("\n");
}

// --csv / --json: landed atomically after every size (common/output_file.h), so an interrupted bench keeps every
// row it printed; a failed write (e.g. a full disk) stops every rank with one line and exit 3.
class BenchOutputs {
 public:
  BenchOutputs(const runtime::World& world, const BenchFlags& f, std::string topology)
      : world_(world), f_(f), topology_(std::move(topology)), root0_(world.rank() == 0),
        // A stream (--json /dev/stdout, a pipe) cannot be rewritten per size: it gets the whole JSON once, at the end.
        json_stream_(!f.json.empty() && resolve_output(f.json, "--json").stream) {
    if (root0_ && !f.csv.empty()) {
      std::string head;
      for (size_t i = 0; i < kCols.size(); ++i) head += (i ? "," : "") + kCols[i];
      csv_.reset(f.csv, head + "\n");
    }
    if (!f.csv.empty() || !f.json.empty()) land(0);  // the header (and an empty JSON) before the first row
  }
  nlohmann::json rows = nlohmann::json::array();
  // Collective: lands the rows from FIRST_NEW_ROW on.
  void land(size_t first_new_row) {
    if (f_.csv.empty() && f_.json.empty()) return;
    world_.agree([&] {
      if (!root0_) return;
      if (!f_.csv.empty()) {
        std::string text;
        for (size_t i = first_new_row; i < rows.size(); ++i) text += csv_row(rows[i]);
        csv_.append(text);
      }
      if (!f_.json.empty() && !json_stream_)
        write_file_atomic(f_.json, nlohmann::json{{"topology", topology_}, {"rows", rows}}.dump(2) + "\n");
    });
  }
  // Collective, after the last size: a --json stream gets its one copy.
  void finish() {
    if (!json_stream_) return;
    world_.agree([&] {
      if (root0_) write_file_atomic(f_.json, nlohmann::json{{"topology", topology_}, {"rows", rows}}.dump(2) + "\n");
    });
  }

 private:
  inline static const std::vector<std::string> kCols = {
      "collective", "size_bytes", "count",         "dtype",           "op",    "root",        "placement",
      "algorithm",  "ranks",      "sim_time_us",   "sim_algbw_gbps",  "sim_busbw_gbps", "wall_time_us",
      "wall_busbw_gbps", "wrong", "mpi_time_us",   "mpi_busbw_gbps"};
  static std::string csv_row(const nlohmann::json& r) {
    std::string line;
    for (size_t i = 0; i < kCols.size(); ++i) {
      if (i) line += ',';
      if (!r.contains(kCols[i]) || r[kCols[i]].is_null()) continue;
      line += r[kCols[i]].is_string() ? r[kCols[i]].get<std::string>() : r[kCols[i]].dump();
    }
    return line + "\n";
  }
  const runtime::World& world_;
  const BenchFlags& f_;
  std::string topology_;
  bool root0_;
  bool json_stream_;
  GrowingOutput csv_;
};

// Running sums of the summary line.
struct BenchTotals {
  double sim_busbw = 0, wall_busbw = 0, mpi_busbw = 0;
  int n_bw = 0, n_mpi = 0;
  size_t wrong = 0;
};

// One size of the table: measures it (out of place, then in place), prints its line on rank 0 and appends its
// rows to OUT.
void bench_size(runtime::Transport& g, const BenchFlags& f, const BenchShape& sh, verification::Case cs, size_t chunk,
                bool root0, BenchOutputs& out, BenchTotals& tot) {
  const size_t es = runtime::dtype_size(cs.dtype);
  const size_t size = cs.count * es;
  const Collective c = sh.c;
  cs.chunk_bytes = chunk;
  cs.shape_only = f.shape_only;
  Measure m[2];
  const size_t first_new_row = out.rows.size();
  const int columns = sh.has_in_place ? 2 : 1;
  for (int k = 0; k < columns; ++k) {
    cs.in_place = k == 1;
    m[k] = measure(g, cs, f);
    tot.wrong += m[k].wrong;
  }
  const std::string op = collectives::is_reduction(c) ? collectives::reduce_op_name(cs.op) : "none";
  const int root = collectives::is_rooted(c) ? f.root : -1;
  if (root0) {
    if (f.explain && !m[0].explanation.empty()) std::printf("#   %s\n", m[0].explanation.c_str());
    std::printf("  %10zu %12zu %8s %6s %4d %-16s |", size, cs.count, runtime::dtype_name(cs.dtype).c_str(), op.c_str(),
                root, m[0].algorithm.c_str());
  }
  for (int k = 0; k < columns; ++k) {
    const double algbw = m[k].sim_us > 0 ? size / (m[k].sim_us * 1e3) : 0;
    const double walg = m[k].wall_us > 0 ? size / (m[k].wall_us * 1e3) : 0;
    tot.sim_busbw += algbw * sh.busf;
    tot.wall_busbw += walg * sh.busf;
    ++tot.n_bw;
    if (root0)
      std::printf(" %10.2f %8.2f %8.2f %10.2f %8.2f %6s |", m[k].sim_us, algbw, algbw * sh.busf, m[k].wall_us,
                  walg * sh.busf, sh.checked ? std::to_string(m[k].wrong).c_str() : "N/A");
    nlohmann::json row = {{"collective", collectives::collective_name(c)},
                          {"size_bytes", size},
                          {"count", cs.count},
                          {"dtype", runtime::dtype_name(cs.dtype)},
                          {"op", op},
                          {"root", root},
                          {"placement", k ? "in-place" : "out-of-place"},
                          {"algorithm", m[k].algorithm},
                          {"ranks", sh.p},
                          {"sim_time_us", m[k].sim_us},
                          {"sim_algbw_gbps", algbw},
                          {"sim_busbw_gbps", algbw * sh.busf},
                          {"wall_time_us", m[k].wall_us},
                          {"wall_busbw_gbps", walg * sh.busf},
                          {"wrong", sh.checked ? nlohmann::json(m[k].wrong) : nlohmann::json(nullptr)}};
    if (f.shape_only) row["shape_only"] = true;
    if (f.vs_mpi && k == 0) {
      row["mpi_time_us"] = m[0].mpi_us >= 0 ? nlohmann::json(m[0].mpi_us) : nlohmann::json(nullptr);
      row["mpi_busbw_gbps"] = m[0].mpi_us > 0 ? nlohmann::json(size / (m[0].mpi_us * 1e3) * sh.busf) : nlohmann::json(nullptr);
      if (m[0].mpi_us > 0) {
        tot.mpi_busbw += size / (m[0].mpi_us * 1e3) * sh.busf;
        ++tot.n_mpi;
      }
    }
    out.rows.push_back(row);
  }
  if (root0) {
    if (!sh.has_in_place) std::printf(" %10s %8s %8s %10s %8s %6s |", "", "", "", "", "", "");
    if (f.vs_mpi && m[0].mpi_us >= 0) std::printf(" %10.2f %8.2f |", m[0].mpi_us, size / (m[0].mpi_us * 1e3) * sh.busf);
    else if (f.vs_mpi) std::printf(" %10s %8s |", "n/a", "n/a");
  }
  // The rows land in the files before their line is finished and flushed on stdout, so whatever a signal
  // interrupts, every row printed is in --csv / --json.
  out.land(first_new_row);
  if (root0) {
    std::printf("\n");
    std::fflush(stdout);
  }
}

// --choose-only: what the algorithm rule picks at each size of the sweep and its estimate (collectives/algorithms.h:
// the cost model's replay on this group's routes), from rank 0 of the group alone; nothing runs, so it reaches
// group sizes a run could not (scripts/auto_vs_nccl.py builds docs/performance/collectives.md's table from it).
int choose_only(runtime::Transport& g, const BenchFlags& f, const BenchPlan& b, size_t chunk) {
  if (g.rank() != 0) return kExitOk;
  std::printf("# shardsim bench --choose-only: %s on %d chips, algorithm %s, chunk %zu B\n# %12s %10s %-18s %14s\n",
              collectives::collective_name(b.c).c_str(), g.size(), f.algo.c_str(), chunk, "size", "count",
              "algorithm", "estimate_us");
  collectives::CollectiveOptions o;
  o.algorithm = f.algo;
  o.chunk_bytes = chunk;
  for (size_t bytes = b.lo; bytes <= b.hi;) {
    const DType dt = b.dtypes.front();
    size_t count = bytes / runtime::dtype_size(dt);
    if (b.c == Collective::reduce_scatter || b.c == Collective::all_gather)
      count = count / static_cast<size_t>(g.size()) * static_cast<size_t>(g.size());
    const double sized = static_cast<double>(count * runtime::dtype_size(dt));
    const collectives::Choice ch = collectives::choose(b.c, o, g, sized);
    std::printf("  %12zu %10zu %-18s %14.3f\n", bytes, count, ch.algorithm.c_str(),
                collectives::estimate_ns(b.c, ch.algorithm, g, sized, chunk) / 1e3);
    if (f.explain && !ch.explanation.empty()) std::printf("#   %s\n", ch.explanation.c_str());
    std::fflush(stdout);
    const size_t next = b.step_bytes ? bytes + b.step_bytes
                                     : static_cast<size_t>(std::ceil(std::max<double>(bytes, 1) * b.factor));
    if (next <= bytes || next > b.hi) break;
    bytes = next;
  }
  return kExitOk;
}

int run_bench(const runtime::World& world, const BenchFlags& f) {
  BenchPlan b;
  world.agree([&] { b = parse_bench(world, f); });
  const Collective c = b.c;
  // Shape-only runs aim at thousands of chips per rank: no per-message event list (nothing here reads it).
  b.net->record_events = !f.shape_only;
  connect(*b.net, world);
  runtime::Transport& g = *b.net->group;
  if (f.list) {  // the registry's catalogue, with applicability and estimates on this group
    size_t list_chunk = 0;
    world.agree([&] { list_chunk = parse_bytes(f.chunk_bytes, "--chunk-bytes"); });
    if (world.rank() == 0)
      std::printf("# shardsim bench --list: collective algorithms on %s; estimates for %zu B per rank, chunk %zu B\n%s",
                  b.net->describe().c_str(), b.hi, list_chunk,
                  collectives::catalogue_text(&g, static_cast<double>(b.hi), list_chunk).c_str());
    return kExitOk;
  }
  size_t chunk = 0;
  world.agree([&] { chunk = check_bench_group(f, b, *b.net); });
  if (f.choose_only) return choose_only(g, f, b, chunk);
  const bool root0 = world.rank() == 0;
  BenchShape sh;
  sh.c = c;
  sh.p = g.size();
  sh.busf = verification::busbw_factor(c, sh.p);
  sh.blocky = c == Collective::reduce_scatter || c == Collective::all_gather || c == Collective::all_to_all ||
              c == Collective::all_to_allv || c == Collective::gather || c == Collective::scatter ||
              c == Collective::all_gatherv;
  // Shape-only: no in-place column (no buffers: the same schedule and simulated time as out of place).
  sh.has_in_place = !f.shape_only && c != Collective::all_to_allv && c != Collective::send_recv && c != Collective::barrier;
  sh.checked = f.check && !f.shape_only;
  if (root0) print_bench_header(f, sh, *b.net, chunk, g.size() != world.size());
  BenchOutputs out(world, f, b.net->describe());
  BenchTotals tot;
  for (DType dt : b.dtypes)
    for (auto op : b.ops)
      for (size_t bytes = b.lo; bytes <= b.hi;) {
        verification::Case cs;
        cs.collective = c;
        cs.dtype = dt;
        cs.op = op;
        cs.algorithm = f.algo;
        cs.count = c == Collective::barrier ? 0 : bytes / runtime::dtype_size(dt);  // a barrier moves no data
        if (sh.blocky) cs.count = cs.count / static_cast<size_t>(sh.p) * static_cast<size_t>(sh.p);
        cs.root = f.root;
        bench_size(g, f, sh, cs, chunk, root0, out, tot);
        if (c == Collective::barrier) break;  // no data: one row says it all
        // Next size as nccl-tests steps: b, b*f, b*f^2, ... (or b, b+i, ...) while <= e; never the same size twice.
        const size_t next = b.step_bytes ? bytes + b.step_bytes
                                         : static_cast<size_t>(std::ceil(std::max<double>(bytes, 1) * b.factor));
        if (next <= bytes || next > b.hi) break;
        bytes = next;
      }
  out.finish();
  {  // every group checked its own results; the verdict covers all of them
    unsigned long long all = g.rank() == 0 ? tot.wrong : 0;
    b.net->world->allreduce(std::span<unsigned long long>(&all, 1), runtime::Reduce::sum, "bench");
    tot.wrong = all;
  }
  if (root0) {
    if (f.shape_only)
      std::printf("# Out of bounds values : N/A (not validated: shape-only)\n");
    else if (f.check)
      std::printf("# Out of bounds values : %zu %s\n", tot.wrong, tot.wrong ? "FAILED" : "OK");
    else
      std::printf("# Out of bounds values : N/A (not checked: -c 0)\n");
    std::printf("# Avg bus bandwidth    : %.4f GB/s simulated, %.4f GB/s wall%s\n",
                tot.n_bw ? tot.sim_busbw / tot.n_bw : 0.0, tot.n_bw ? tot.wall_busbw / tot.n_bw : 0.0,
                tot.n_mpi ? (", " + std::to_string(tot.mpi_busbw / tot.n_mpi) + " GB/s MPI (out-of-place)").c_str() : "");
  }
  return tot.wrong ? kExitValidationFailed : kExitOk;
}

}  // namespace

Command add_bench(CLI::App& app, const runtime::World& world) {
  auto* sub = app.add_subcommand("bench", "nccl-tests-style bandwidth tables (simulated and wall)");
  auto f = std::make_shared<BenchFlags>();
  f->net.add_to(sub);
  sub->add_option("collective", f->collective, "all_reduce (default), reduce_scatter, all_gather, broadcast, ...");
  sub->add_option("-b,--minbytes", f->min_bytes, "smallest size (default 8; K/M/G suffixes)");
  sub->add_option("-e,--maxbytes", f->max_bytes, "largest size (default 32M)");
  sub->add_option("-f,--stepfactor", f->step_factor, "multiply the size by this each step (default 2)");
  sub->add_option("-i,--stepbytes", f->step_bytes, "add this many bytes each step instead");
  sub->add_option("-n,--iters", f->iters, "timed iterations per size (default 20)");
  sub->add_option("-w,--warmup_iters", f->warmup, "warm-up iterations (default 5)");
  sub->add_option("-c,--check", f->check, "check results against the reference (1, default) or not (0)");
  sub->add_option("-d,--datatype", f->dtypes, "dtype list or 'all' (default fp32)");
  sub->add_option("-o,--op", f->ops, "reduction op list or 'all' (default sum)");
  sub->add_option("-r,--root", f->root, "root rank for broadcast/reduce/gather/scatter (default 0)");
  sub->add_option("-a,--algo", f->algo, "algorithm (default auto)");
  sub->add_option("--chunk-bytes", f->chunk_bytes, "pipelining piece size (default 0: none)");
  sub->add_flag("--vs-mpi", f->vs_mpi, "also time MPI's own collective on the same buffers");
  sub->add_flag("--shape-only", f->shape_only,
                "buffers without storage: every algorithm runs its schedule moving only timing headers (same simulated "
                "times as real data, no host memory per byte, nothing checked); for 1,000s of chips use -n 1 -w 0");
  sub->add_flag("--explain", f->explain, "print why 'auto' chose the algorithm at each size");
  sub->add_flag("--choose-only", f->choose_only, "print the algorithm 'auto' (or -a) picks at each size and its "
                                                 "estimate (the cost model only: nothing runs, not timed) and exit");
  sub->add_flag("--list", f->list, "print the algorithm catalogue (aliases, collectives, applicability and estimate "
                                   "at -e bytes on this topology) and exit");
  sub->add_option("-g,--ngpus", f->gpus, "nccl-tests habit: chips per rank, always 1 here");
  sub->add_option("--csv", f->csv, "also write the rows as CSV")->each([f](const std::string&) { f->csv_given = true; });
  sub->add_option("--json", f->json, "also write the rows as JSON")->each([f](const std::string&) { f->json_given = true; });
  return {sub, [f, &world] { return run_bench(world, *f); }};
}

}  // namespace shardsim::apps
