// `train`'s setup: the config loader, the CLI options and the fold decision (apps/train_setup.h).
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "apps/cli_common.h"
#include "apps/commands.h"
#include "apps/train_setup.h"
#include "models/executor_config.h"
#include "collectives/rail_ring.h"
#include "common/error.h"
#include "runtime/chips.h"
#include "runtime/fold_shift.h"
#include "runtime/job_text.h"
#include "sharding/device_mesh.h"
#include "sharding/plans/pipeline_schedule.h"

namespace shardsim::apps {

namespace train_detail {

ConfigNode train_config(const TrainFlags& f) {
  return f.config_text.empty() ? sharding::load_workload_config(f.config, f.overrides)
                               : sharding::workload_config_from_text(f.config_text, f.config, f.overrides);
}

// The config through the one parser of every command (sharding/model_spec.h): the model:, parallel: and train:
// sections, the topology (a path relative to the config's folder) and the device as `run` reads them.
TrainSetup load(const TrainFlags& f, int ranks) {
  // run's loader: model: read as workload:, a topology path next to the config, run's overrides applied.
  const ConfigNode root = train_config(f);
  // train's root keys, run's validate: (and checkpoint: of an MLP config), serve's serve: (models/executor_config.h)
  models::check_executor_root_keys(root, f.serve);
  TrainSetup s;
  s.config_name = root.file();
  s.name = root.get_string("name", "");  // printable text, checked as run checks it (common/config.h)
  s.config_text = root.text();
  s.device = sharding::load_workload_device(root);
  s.shape_only = sharding::load_workload_shape_only(root) || f.shape_only;
  s.fold = sharding::load_workload_fold(root) && !f.no_fold;
  if (root.has("validate")) {
    const ConfigNode v = root.child("validate");
    v.expect_keys({"enabled", "tolerance"});
    if (v.has("tolerance")) s.row_tolerance = v.get_positive_double("tolerance");
    s.validate_off = !v.get_bool("enabled", true);
    s.validate_config = !s.validate_off && !s.shape_only;
  }
  // The topology first: a job of the wrong size says so before any plan rule does.
  if (root.has("topology")) {
    s.topology = per_rank_topology(sharding::load_workload_topology(root));
    if (s.topology->num_chips() != ranks)
      root.child("topology").fail("the topology has " + std::to_string(s.topology->num_chips()) +
                                  " chips but the job has " + runtime::job_size_text(ranks) + "; run it with " +
                                  runtime::resize_hint(s.topology->num_chips(), ranks));
  } else {
    s.topology = per_rank_topology(topology::Topology::ring(ranks, topology::LinkSpec{100, 1000}));
    s.default_topology = true;
  }
  // The model:, parallel: and train: sections by the one loader's rules (models/executor_config.h), as a sweep's
  // points read them.
  models::ExecutorConfig e = models::read_executor_config(root, ranks, f.forward, f.serve);
  if (f.steps > 0) e.train.steps = f.steps;
  // The one mesh builder of run and train (sharding/device_mesh.h): parallel.mesh_dims checked here, naming its line.
  (void)sharding::checked_mesh(root, e.plan, *s.topology);
  s.spec = e.spec;
  s.model = e.model;
  s.plan = e.plan;
  s.train = e.train;
  s.has_train_section = e.has_train_section;
  const sharding::ParallelPlan& plan = s.plan;
  const sharding::ModelSpec& spec = s.spec;
  s.tp = plan.tp;
  s.sp = plan.sp;
  s.ulysses = plan.ulysses > 1;
  s.cp = s.ulysses ? plan.ulysses : plan.cp;  // the trainer runs Ulysses on its cp axis
  s.cp_zigzag = plan.zigzag && !s.ulysses;
  s.fused = plan.fused.enabled;
  s.dp.fused_chunks = plan.fused.chunks;
  s.dp.zero = plan.zero;
  s.dp.bucket_bytes = plan.bucket_bytes;
  s.dp.recompute = plan.recompute;
  s.dp.selective = plan.selective_recompute;
  s.dp.overlap_grad_reduce = plan.overlap_grad_reduce;
  s.dp.overlap_param_gather = plan.overlap_param_gather;
  s.dp.forward_only = f.forward || f.serve;  // serving runs the forward only
  s.dp.micro_batch = spec.micro_batch;
  s.dp.etp = plan.etp;
  s.pp = plan.pp;
  s.dp.schedule = *sharding::plans::schedule_from_name(plan.schedule);
  s.dp.virtual_stages = plan.virtual_stages;
  s.dp.pp_layers = plan.pp_layers;
  // The trainer runs one algorithm for every collective: parallel.algorithm, else auto (sharding/model_spec.h's
  // ParallelPlan::algorithm_for is the rule the plan units follow).
  s.dp.algorithm = plan.algorithm.empty() ? "auto" : plan.algorithm;
  return s;
}

sharding::DeviceMesh run_mesh(const runtime::World& world, const TrainSetup& s) {
  std::optional<sharding::DeviceMesh> mesh;
  world.agree([&] {
    try {
      mesh.emplace(sharding::build_mesh(s.plan, *s.topology));
    } catch (const std::invalid_argument& e) {
      throw UsageError(s.config_name + ": " + e.what());
    }
  });
  return std::move(*mesh);
}

void train_options(CLI::App* sub, const std::shared_ptr<TrainFlags>& flags) {
  sub->add_option("config", flags->config, "training YAML (default: configs/lm_train.yaml)");
  sub->add_option("--steps", flags->steps, "steps to run instead of the config's train.steps")
      ->check(decimal_integer())
      ->check(CLI::Range(int64_t{1}, kMaxSteps));  // PositiveNumber said "0 not in range 0.000000 to 1.8e308"
  sub->add_flag("--shape-only", flags->shape_only,
                "no data (mode: shape_only): storage-less tensors, cost-only kernels and header-only collectives give "
                "the simulated step, tokens/s, MFU and memory of a real run at any size; nothing is validated");
  sub->add_flag("--validate", flags->validate,
                "compare the per-step losses with the single-device reference (chip 0 trains it); exit 1 on FAIL");
  sub->add_option("--checkpoint", flags->checkpoint,
                  "write the training state (HDF5: fp32 masters, AdamW moments, step, data position) to this file "
                  "after the last step and every --save-every steps");
  sub->add_flag("--no-checkpoint", flags->no_checkpoint,
                "write no checkpoint (train's default; run's and train's one flag: refused with --checkpoint)");
  sub->add_option("--save-every", flags->save_every, "also save after every K-th step (needs --checkpoint)")
      ->check(decimal_integer())
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  sub->add_option("--resume", flags->resume,
                  "continue from a training-state checkpoint (any dp / ZeRO stage); the run stops at step "
                  "train.steps (or --steps)");
  sub->add_option("--json", flags->json_path, "also write the report as JSON to this file (run's report fields)");
  sub->add_option("--trace", flags->trace_path, "write a Chrome trace (Perfetto) of the simulated timelines");
  add_trace_flags(sub, flags->trace, true);
  sub->add_flag("--profile", flags->profile,
                "add the profile of the last step: the critical path across chips, each op's class and the top "
                "bottlenecks (docs/PROFILE.md)");
  sub->add_option("--plots", flags->plots_dir,
                  "write a roofline and a utilisation plot of the last step into this directory (PNG + data + "
                  "gnuplot script; docs/PROFILE.md)");
  sub->add_option("--what-if", flags->what_if,
                  "re-simulate each change (shape-only) and print its speedup on the step, e.g. "
                  "link_bw=2x,hbm_bw=1.5x,peak=2x (docs/PROFILE.md)");
  sub->add_flag("--no-fold", flags->no_fold,
                "simulate every chip: never fold the data-parallel replicas (fold: auto, the default, folds shape-only runs "
                "on one rank where they are provably identical; docs/performance/fold.md)");
  add_config_override_flags(sub, flags->overrides);
}

}  // namespace train_detail

using namespace train_detail;

namespace {

// The replica shift by PERIOD dp coordinates on the physical chips: image[chip of mesh rank r] = chip of the rank
// PERIOD replicas on (chips::FoldSpec's shift, through the mesh's placement).
std::vector<int> chip_shift(const sharding::DeviceMesh& mesh, int stride, int dp, int period) {
  const auto& placement = mesh.placement();
  std::vector<int> image(placement.size(), -1);
  for (size_t r = 0; r < placement.size(); ++r) {
    const int c = (static_cast<int>(r) / stride) % dp;
    const size_t s = r + static_cast<size_t>(((c + period) % dp - c) * stride);
    image[static_cast<size_t>(placement[r])] = placement[s];
  }
  return image;
}

// The fold's period: the smallest shift of the replicas that is a symmetry of the topology (PERIOD), rounded up to
// one that also maps the rail rings onto themselves when the dp group is the whole topology and rail_ring could run
// on it (collectives/rail_ring.h: even nodes are visited upwards, odd ones downwards, so only a shift by an even
// number of nodes keeps each ring; a shift by one maps it onto its reverse). Unchanged when none does.
int rail_ring_period(const sharding::DeviceMesh& mesh, const topology::Topology& topo, int dp, int period) {
  if (dp != mesh.size() || !collectives::rail_ring::obstacle(topo, mesh.placement()).empty()) return period;
  const auto rings = collectives::rail_ring::cycles(topo, mesh.placement());
  for (int q = period; q < dp; q += period) {
    if (dp % q != 0 || !mesh.replica_shift_check("dp", q, topo).empty()) continue;
    const std::vector<int> shift = chip_shift(mesh, 1, dp, q);
    std::vector<int> image(shift.size());  // rank r (on chip placement[r]) -> the rank on its image chip
    std::vector<int> rank_on(shift.size());
    for (size_t r = 0; r < shift.size(); ++r) rank_on[static_cast<size_t>(mesh.placement()[r])] = static_cast<int>(r);
    for (size_t r = 0; r < shift.size(); ++r)
      image[r] = rank_on[static_cast<size_t>(shift[static_cast<size_t>(mesh.placement()[r])])];
    if (collectives::ring::maps_onto_itself(rings, image)) return q;
  }
  return period;
}

// The fold decision for the parsed flags F (train_fold's body; train_point_fold's too).
FoldDecision fold_of(const TrainFlags& f, int chips, int ranks) {
  // Folded only where every replica provably runs the same program at the same simulated times
  // (docs/performance/fold.md): one MPI rank, a shape-only train run of the data-parallel trainer with dp > 1
  // (any cp / Ulysses axis), nothing that records or compares per-chip events, and a placement whose shift by one
  // replica is a translation of the topology (sharding::DeviceMesh::replica_shift_check). The plan's own
  // collectives over the replicas (algorithms, chunk sizes) are decided when the trainer is built, before its
  // first step (sharding/plans/data_parallel.cpp, check_fold).
  FoldDecision d;
  std::string mode = "auto";
  bool shape_only = false;
  const auto no = [&](const std::string& why, bool expected) {
    d.why_not = why;
    d.expected = expected && mode != "off";
    return d;
  };
  try {
    const ConfigNode root = train_config(f);
    mode = root.has("fold") ? root.get_string("fold") : "auto";
    if (f.no_fold) mode = "off";  // --no-fold wins over fold: on
    d.on = mode == "on";
    if (mode == "off") return d;
    shape_only = f.shape_only || sharding::load_workload_shape_only(root);
    if (chips < 2) return no("one chip", false);
    // Before load(): a run that cannot fold builds its topology once.
    if (!shape_only) return no("it moves real data (a folded run is shape-only: --shape-only or mode: shape_only)", false);
    const TrainSetup s = load(f, chips);
    const int dp = s.plan.dp;
    if (dp < 2) return no("parallel.dp is " + std::to_string(dp) + " (no replicas to fold)", false);
    // From here on a shape-only run with replicas: auto says in one note why it is not folded.
    if (ranks != 1) return no("it runs on " + std::to_string(ranks) + " MPI ranks (a folded run needs one)", true);
    const char* flag = !f.trace_path.empty() ? "--trace" : f.profile ? "--profile" : !f.plots_dir.empty() ? "--plots"
                       : !f.what_if.empty()  ? "--what-if" : f.validate ? "--validate" : !f.checkpoint.empty()
                           ? "--checkpoint" : !f.resume.empty() ? "--resume" : nullptr;
    if (flag) return no(std::string(flag) + " records or compares every chip's events or data", true);
    if (s.plan.chips() != chips) return no("the plan's chips differ from --chips", false);
    // The mesh the run builds (sharding/device_mesh.h's build_mesh: mesh_dims honoured), so the fold agrees with it.
    const sharding::DeviceMesh mesh = sharding::build_mesh(s.plan, *s.topology);
    int period = mesh.replica_fold_period("dp", *s.topology);
    if (period < 1)
      return no("shifting the data-parallel replicas is not a symmetry of the topology: " +
                    mesh.replica_shift_check("dp", 1, *s.topology),
                true);
    period = rail_ring_period(mesh, *s.topology, dp, period);
    // The replicas' mesh-rank stride: every axis inside dp (tp, cp and ep: ep > 1 lies between cp and dp, so a
    // stride of tp x cp would take ep coordinates for replicas).
    int stride = 1;
    for (const auto& axis : mesh.axes())
      if (axis.name == "dp") stride = axis.stride;
    d.spec = runtime::FoldSpec{chips, stride, dp, period, mode != "on"};
    // What collectives::choose checks cycle algorithms against (runtime/fold_shift.h).
    runtime::set_fold_chip_shift(chip_shift(mesh, stride, dp, period));
    return d;
  } catch (...) {
    return no("the configuration does not load (the unfolded run says why)", false);
  }
}

}  // namespace

FoldDecision train_fold(const std::vector<std::string>& args, int chips, int ranks) {
  try {
    CLI::App app;
    app.allow_extras();
    auto* sub = app.add_subcommand("train");
    sub->allow_extras();
    auto f = std::make_shared<TrainFlags>();
    train_options(sub, f);
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    app.parse(static_cast<int>(argv.size()), argv.data());
    if (!sub->parsed()) return {};
    return fold_of(*f, chips, ranks);
  } catch (...) {
    FoldDecision d;
    d.why_not = "the configuration does not load (the unfolded run says why)";
    return d;
  }
}

FoldDecision train_point_fold(const std::string& config_text, const std::string& where, int chips, bool validate,
                              const std::string& what_if) {
  TrainFlags f;  // run_executor_point's flags for a training point (apps/train.cpp)
  f.config = where;
  f.config_text = config_text;
  f.validate = validate;
  f.what_if = what_if;
  return fold_of(f, chips, 1);
}
}  // namespace shardsim::apps
