// `shardsim validate`: every collective x dtype x op x algorithm x size, in place and out of place, checked
// against a single-device reference on the configured topology (see verification/verify.h).
#include <mpi.h>

#include <cstdio>
#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/cli_common.h"
#include "apps/commands.h"
#include "verification/verify.h"
#include "common/error.h"

namespace shardsim::apps {

namespace {

using collectives::Collective;
using runtime::DType;

struct ValidateFlags {
  NetFlags net;
  std::string collectives = "all", dtypes = "all", ops = "all", algos = "all", sizes, json;
  std::string min_bytes = "0", max_bytes = "16G", chunk_bytes = "4K";
  int root = -1;
  uint64_t seed = 1;
  bool no_random = false, verbose = false, explain = false;
  bool special = false, only_special = false, no_in_place = false;
  bool shape_only_check = false;  // also run each case shape-only and compare its simulated time and bytes
  bool inject_count_mismatch = false, inject_wrong_result = false;  // hidden test hooks
};

struct Plan {
  std::vector<Collective> collectives;
  std::vector<DType> dtypes;
  std::vector<collectives::ReduceOp> ops;
  std::map<Collective, std::vector<std::string>> algorithms;
  std::vector<std::string> skipped;  // "all_reduce torus: why"
  std::vector<size_t> counts;
  size_t min_bytes = 0, max_bytes = 0, chunk_bytes = 0;
};

// Everything the flags ask for, checked before any work (no communication).
Plan make_plan(const ValidateFlags& f, const runtime::Transport* group_probe, int group_size) {
  Plan p;
  p.collectives = parse_list<Collective>(f.collectives, collectives::all_collectives(), collectives::parse_collective,
                                         "-c/--collective");
  p.dtypes = parse_list<DType>(f.dtypes, runtime::all_dtypes(), runtime::parse_dtype, "-d/--dtype");
  p.ops = parse_list<collectives::ReduceOp>(f.ops, collectives::all_reduce_ops(), collectives::parse_reduce_op,
                                            "-o/--op");
  p.min_bytes = parse_bytes(f.min_bytes, "-b/--minbytes");
  p.max_bytes = parse_bytes(f.max_bytes, "-e/--maxbytes");
  p.chunk_bytes = parse_bytes(f.chunk_bytes, "--chunk-bytes");
  if (p.min_bytes > p.max_bytes) throw UsageError("-b/--minbytes is larger than -e/--maxbytes");
  if (f.root >= group_size) throw UsageError("--root " + std::to_string(f.root) + " is outside the group of " +
                                             std::to_string(group_size) + " ranks");
  if (f.sizes.empty()) {
    p.counts = verification::default_validate_counts();
  } else {
    for (const auto& s : split_list(f.sizes)) p.counts.push_back(parse_bytes(s, "--counts"));
  }
  const auto wanted = f.algos == "all" ? std::vector<std::string>{} : split_list(f.algos);
  std::vector<bool> used(wanted.size(), false);
  for (Collective c : p.collectives) {
    std::vector<std::string> names;
    if (wanted.empty()) {
      names = collectives::algorithm_names(c);
    } else {
      for (size_t i = 0; i < wanted.size(); ++i) {
        if (wanted[i] == "auto") {
          if (std::find(names.begin(), names.end(), "auto") == names.end()) names.push_back("auto");
          used[i] = true;
        } else if (const auto a = collectives::canonical_algorithm(c, wanted[i]); !a.empty()) {
          if (std::find(names.begin(), names.end(), a) == names.end()) names.push_back(a);
          used[i] = true;
        }
      }
    }
    std::vector<std::string> runnable;
    for (const auto& a : names) {
      const std::string why = a == "auto" ? "" : collectives::obstacle(c, a, *group_probe);
      if (why.empty()) {
        runnable.push_back(a);
      } else if (!wanted.empty()) {  // forced explicitly: refuse, say why
        throw UsageError(collectives::collective_name(c) + ": algorithm '" + a + "' cannot run here: " + why);
      } else {
        p.skipped.push_back(collectives::collective_name(c) + " " + a + ": " + why);
      }
    }
    if (!runnable.empty()) p.algorithms[c] = runnable;
  }
  for (size_t i = 0; i < wanted.size(); ++i) {
    if (used[i]) continue;
    if (p.collectives.size() == 1)  // say what it is for and what this collective takes
      throw UsageError("--algo: " + collectives::collective_name(p.collectives[0]) + ": " +
                       collectives::not_an_algorithm_of(p.collectives[0], wanted[i]));
    throw UsageError("--algo: unknown algorithm '" + wanted[i] + "' for the selected collectives");
  }
  return p;
}

struct Row {
  std::string collective, algorithm, dtype, op;
  size_t cases = 0, checked = 0, wrong = 0;
  double max_error = 0;
  unsigned long long digest = 0;  // sum of the cases' output digests (verification::Outcome::digest)
  double sim_ns = 0;              // sum of the cases' simulated times
  double shape_only_sim_ns = 0;   // the same in shape-only mode (--shape-only-check)
};

// Checks PLAN against the group (inside World::agree): the outputs, that something is selected, the host memory
// of the largest case of every collective.
void check_validate_plan(const ValidateFlags& f, const Plan& plan, Net& net) {
  runtime::Transport& g = *net.group;
  if (!f.json.empty()) check_outputs({{"--json", f.json}});
  size_t widest = 1, largest = 0, selected = 0;
  for (DType dt : plan.dtypes) widest = std::max(widest, runtime::dtype_size(dt));
  for (size_t count : plan.counts)
    for (DType dt : plan.dtypes) {
      const size_t bytes = count * runtime::dtype_size(dt);
      if (bytes < plan.min_bytes || bytes > plan.max_bytes) continue;
      ++selected;
      largest = std::max(largest, count);
    }
  if (selected == 0 || plan.algorithms.empty())
    throw UsageError("nothing to validate: no count x dtype lies within -b/-e, or no algorithm can run here");
  for (Collective c : plan.collectives) {
    verification::Case big;
    big.collective = c;
    big.count = largest;
    big.dtype = widest == 1 ? DType::uint8 : widest == 2 ? DType::fp16 : widest == 4 ? DType::fp32 : DType::fp64;
    const double need = verification::host_bytes_needed(big, g.size());
    check_memory(net, need, need, "validate " + collectives::collective_name(c) + " count " + std::to_string(largest));
  }
}

// Input passes: 0 verifiable, 1 random (floating reductions), 2 special values (verification/verify.h).
const char* const kPassName[] = {"verifiable", "random", "special"};

// One case on the group; with --shape-only-check also without storage (its simulated time and bytes must equal the
// real run's); with several groups, the checked and wrong counts of all of them. SHAPE_ONLY_NS gets the shape-only
// run's time.
verification::Outcome validate_case(Net& net, const runtime::World& world, const ValidateFlags& f,
                                   const verification::Case& cs, double* shape_only_ns) {
  runtime::Transport& g = *net.group;
  auto o = verification::run_case(g, cs);
  if (f.shape_only_check) {
    // The same case without storage (runtime/transport.h): its simulated time and bytes sent must equal the real
    // run's exactly (both are maxima over the group, so every rank decides alike).
    verification::Case so = cs;
    so.shape_only = true;
    so.inject_wrong_result = false;
    const auto s = verification::run_case(g, so);
    *shape_only_ns += s.sim_time_ns;
    if (s.sim_time_ns != o.sim_time_ns || s.bytes_sent != o.bytes_sent) {
      std::ostringstream os;
      os.precision(17);
      os << "shape-only differs from real data: simulated " << s.sim_time_ns << " ns vs " << o.sim_time_ns
         << " ns, bytes sent " << s.bytes_sent << " vs " << o.bytes_sent;
      if (!o.wrong) o.first_wrong = os.str();
      ++o.wrong;
    }
  }
  if (g.size() != world.size()) {  // every group ran this case: count all of them
    unsigned long long all[2] = {g.rank() == 0 ? o.checked : 0, g.rank() == 0 ? o.wrong : 0};
    net.world->allreduce(std::span<unsigned long long>(all, 2), runtime::Reduce::sum, "validate");
    if (all[1] && !o.wrong) o.first_wrong = "(in another group)";
    o.checked = all[0];
    o.wrong = all[1];
  }
  return o;
}

// What one table row (collective x algorithm x dtype x op) runs: every selected count, out of place and in place,
// every input pass. Failures are appended to FAILURES.
Row validate_row(Net& net, const runtime::World& world, const ValidateFlags& f, const Plan& plan, Collective c,
                 const std::string& algo, DType dt, collectives::ReduceOp op, int root, const std::vector<int>& passes,
                 std::vector<std::string>& failures) {
  const bool root0 = world.rank() == 0;
  const bool reduction = collectives::is_reduction(c);
  const bool has_in_place = c != Collective::all_to_allv && c != Collective::send_recv && c != Collective::barrier;
  Row row{collectives::collective_name(c), algo, c == Collective::barrier ? "-" : runtime::dtype_name(dt),
          reduction ? collectives::reduce_op_name(op) : "-"};
  for (size_t count : plan.counts) {
    const size_t bytes = count * runtime::dtype_size(dt);
    if (bytes < plan.min_bytes || bytes > plan.max_bytes) continue;
    for (int in_place = 0; in_place <= (has_in_place && !f.no_in_place ? 1 : 0); ++in_place)
      for (int pass : passes) {
        const bool random = pass == 1;
        if (random && !(reduction && runtime::is_floating(dt))) continue;
        if (pass == 2 && c == Collective::barrier) continue;
        verification::Case cs;
        cs.collective = c;
        cs.dtype = dt;
        cs.op = op;
        cs.algorithm = algo;
        cs.count = c == Collective::barrier ? 0 : count;
        cs.in_place = in_place;
        cs.root = root;
        cs.random_input = random;
        cs.special_input = pass == 2;
        cs.chunk_bytes = plan.chunk_bytes;
        cs.seed = f.seed;
        cs.inject_count_mismatch = f.inject_count_mismatch;
        cs.inject_wrong_result = f.inject_wrong_result;
        const auto o = validate_case(net, world, f, cs, &row.shape_only_sim_ns);
        ++row.cases;
        row.checked += o.checked;
        row.wrong += o.wrong;
        row.max_error = std::max(row.max_error, o.max_error);
        row.digest += o.digest;
        row.sim_ns += o.sim_time_ns;
        if (f.explain && root0 && !o.explanation.empty() && !in_place && pass == passes.front())
          std::printf("#   %s count %zu: %s\n", row.collective.c_str(), count, o.explanation.c_str());
        if (o.wrong) {
          std::ostringstream os;
          os << row.collective << " " << o.algorithm << " " << row.dtype << " " << row.op << " count " << count
             << (in_place ? " in-place" : " out-of-place") << " " << kPassName[pass] << ": " << o.wrong
             << " wrong, first: " << o.first_wrong;
          failures.push_back(os.str());
        }
        if (f.verbose && root0)
          std::printf("    %-15s %-17s %-9s %-5s count %-9zu %-12s %-10s %s sim %.3f us\n", row.collective.c_str(),
                      o.algorithm.c_str(), row.dtype.c_str(), row.op.c_str(), count,
                      in_place ? "in-place" : "out-of-place", kPassName[pass], o.wrong ? "WRONG" : "ok",
                      o.sim_time_ns / 1e3);
        if (c == Collective::barrier) break;
      }
    if (c == Collective::barrier) break;
  }
  return row;
}

void print_validate_header(const Net& net, const Plan& plan, int root, const std::vector<int>& passes) {
  std::printf("# shardsim validate: %s\n", net.describe().c_str());
  std::string inputs;
  for (int ps : passes)
    inputs += std::string(inputs.empty() ? "" : " and ") +
              (ps == 0   ? "verifiable (bit-exact check)"
               : ps == 1 ? "random (tolerance 2(p-1)u sum|x|)"
                         : "special (NaN, +-Inf, -0, subnormals, largest finite; bit-exact, NaN matches NaN)");
  std::printf("# inputs: %s; chunk %zu B; root %d; counts", inputs.c_str(), plan.chunk_bytes, root);
  for (size_t c : plan.counts) std::printf(" %zu", c);
  std::printf("\n#\n# %-15s %-17s %-9s %-5s %7s %11s %7s\n", "collective", "algorithm", "dtype", "op", "cases",
              "checked", "#wrong");
}

void write_validate_json(const ValidateFlags& f, const Net& net, const Plan& plan, const std::vector<Row>& rows,
                         const std::vector<std::string>& failures, const std::vector<int>& passes) {
  size_t cases = 0, checked = 0, wrong = 0;
  for (const auto& r : rows) cases += r.cases, checked += r.checked, wrong += r.wrong;
  nlohmann::json j;
  j["topology"] = net.describe();
  j["cases"] = cases;
  j["checked"] = checked;
  j["wrong"] = wrong;
  j["skipped"] = plan.skipped;
  for (int ps : passes) j["inputs"].push_back(kPassName[ps]);
  j["failures"] = failures;
  for (const auto& r : rows) {
    j["rows"].push_back({{"collective", r.collective}, {"algorithm", r.algorithm}, {"dtype", r.dtype}, {"op", r.op},
                         {"cases", r.cases}, {"checked", r.checked}, {"wrong", r.wrong}, {"max_error", r.max_error},
                         {"output_digest", r.digest}, {"sim_ns", r.sim_ns}});
    if (f.shape_only_check) j["rows"].back()["shape_only_sim_ns"] = r.shape_only_sim_ns;
  }
  write_file(f.json, j.dump(2) + "\n");
}

int run_validate(const runtime::World& world, const ValidateFlags& f) {
  std::unique_ptr<Net> net;
  world.agree([&] { net = build_net(f.net, world); });
  connect(*net, world);
  runtime::Transport& g = *net->group;
  Plan plan;
  world.agree([&] {
    plan = make_plan(f, &g, g.size());
    check_validate_plan(f, plan, *net);
  });
  const bool root0 = world.rank() == 0;
  const int root = f.root >= 0 ? f.root : g.size() - 1;
  std::vector<int> passes;
  if (!f.only_special) passes.push_back(0);
  if (!f.only_special && !f.no_random) passes.push_back(1);
  if (f.special || f.only_special) passes.push_back(2);
  if (root0) print_validate_header(*net, plan, root, passes);
  std::vector<Row> rows;
  std::vector<std::string> failures;
  size_t total_cases = 0, total_checked = 0, total_wrong = 0;
  for (Collective c : plan.collectives) {
    if (!plan.algorithms.count(c)) continue;
    const std::vector<DType> dtypes = c == Collective::barrier ? std::vector<DType>{DType::fp32} : plan.dtypes;
    const std::vector<collectives::ReduceOp> ops =
        collectives::is_reduction(c) ? plan.ops : std::vector<collectives::ReduceOp>{collectives::ReduceOp::sum};
    for (const auto& algo : plan.algorithms[c])
      for (DType dt : dtypes)
        for (auto op : ops) {
          const Row row = validate_row(*net, world, f, plan, c, algo, dt, op, root, passes, failures);
          if (row.cases == 0) continue;
          total_cases += row.cases;
          total_checked += row.checked;
          total_wrong += row.wrong;
          if (root0) {
            std::printf("  %-15s %-17s %-9s %-5s %7zu %11zu %7zu\n", row.collective.c_str(), row.algorithm.c_str(),
                        row.dtype.c_str(), row.op.c_str(), row.cases, row.checked, row.wrong);
            std::fflush(stdout);
          }
          rows.push_back(row);
        }
  }
  if (root0) {
    for (const auto& s : plan.skipped) std::printf("# skipped %s\n", s.c_str());
    for (size_t i = 0; i < failures.size() && i < 20; ++i) std::printf("# WRONG %s\n", failures[i].c_str());
    std::printf("# %zu cases, %zu elements checked, %zu wrong: %s\n", total_cases, total_checked, total_wrong,
                total_wrong ? "FAIL" : "PASS");
    if (!f.json.empty()) write_validate_json(f, *net, plan, rows, failures, passes);
  }
  return total_wrong ? kExitValidationFailed : kExitOk;
}

}  // namespace

Command add_validate(CLI::App& app, const runtime::World& world) {
  auto* sub = app.add_subcommand("validate", "check every collective against a single-device reference");
  auto f = std::make_shared<ValidateFlags>();
  f->net.add_to(sub);
  sub->add_option("-c,--collective", f->collectives, "comma list or 'all' (default)");
  sub->add_option("-d,--dtype", f->dtypes, "comma list or 'all' (default)");
  sub->add_option("-o,--op", f->ops, "comma list of sum,prod,min,max,avg or 'all' (default)");
  sub->add_option("-a,--algo", f->algos, "comma list of algorithms (and/or auto) or 'all' (default)");
  sub->add_option("--counts", f->sizes, "comma list of element counts (default: 0,1,2,7,31,256,1000,1031,4099,65537)");
  sub->add_option("-b,--minbytes", f->min_bytes, "skip sizes below this many bytes (e.g. 1K)");
  sub->add_option("-e,--maxbytes", f->max_bytes, "skip sizes above this many bytes (e.g. 4M)");
  sub->add_option("--chunk-bytes", f->chunk_bytes, "pipelining piece size (default 4K, so large counts are pipelined)");
  sub->add_option("--root", f->root, "root rank of rooted collectives (default: the group's last rank)");
  sub->add_option("--seed", f->seed, "input seed");
  sub->add_flag("--no-random", f->no_random, "no random-input pass (verifiable, and special with --special)");
  sub->add_flag("--special", f->special,
                "also a special-values pass: NaN, +-Inf, -0, subnormals and the largest finite value, placed so the "
                "result is exact in any reduction order; checked bit-exactly (any NaN matches any NaN)");
  sub->add_flag("--only-special", f->only_special, "only the special-values pass");
  sub->add_flag("--no-in-place", f->no_in_place, "out-of-place cases only (in-place aliasing is not exercised)");
  sub->add_flag("-v,--verbose", f->verbose, "one line per case");
  sub->add_flag("--shape-only-check", f->shape_only_check,
                "also run every case in shape-only mode (no storage, timing headers only) and count it wrong unless "
                "its simulated time and bytes sent equal the real-data run's exactly");
  sub->add_flag("--explain", f->explain, "print why 'auto' chose each algorithm");
  sub->add_option("--json", f->json, "also write the results as JSON");
  sub->add_flag("--inject-count-mismatch", f->inject_count_mismatch)->group("");  // test hook
  sub->add_flag("--inject-wrong-result", f->inject_wrong_result)->group("");      // test hook
  return {sub, [f, &world] { return run_validate(world, *f); }};
}

}  // namespace shardsim::apps
