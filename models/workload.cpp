#include "models/workload.h"

#include "collectives/algorithms.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "collectives/algorithms.h"
#include "collectives/registry.h"
#include "common/error.h"
#include "runtime/chips.h"
#include "kernels/gemm.h"
#include "checkpoint/checkpoint.h"
#include "sharding/engine_config.h"
#include "models/trace.h"
#include "topology/topology_yaml.h"

namespace shardsim::sharding {

using runtime::Tensor;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

RunConfig parse(const ConfigNode& root) {
  RunConfig c;
  c.file = root.file();
  c.text = root.text();
  root.expect_keys(kMlpRootKeys);
  c.name = root.get_string("name", "");
  c.topology = load_workload_topology(root);
  c.device = load_workload_device(root);

  const auto w = root.child("workload");
  w.expect_keys(kMlpModelKeys);
  const std::string kind = w.get_string("kind");
  if (kind != "mlp") w.child("kind").fail(w.path() + ".kind: unknown workload '" + kind + "' (known: mlp)");
  c.model = w.get_string("model", "");
  c.mlp.hidden = w.get_positive_int("hidden");
  c.mlp.ffn = w.get_positive_int("ffn");
  c.mlp.tokens = w.get_positive_int("tokens");
  try {
    c.mlp.activation = kernels::parse_activation(w.get_string("activation", "silu"));
  } catch (const std::invalid_argument& e) {
    w.child("activation").fail(w.path() + ".activation: " + e.what());
  }
  try {
    c.mlp.dtype = runtime::parse_dtype(w.get_string("dtype", "fp32"));
  } catch (const std::invalid_argument& e) {
    w.child("dtype").fail(w.path() + ".dtype: " + e.what());
  }
  const int64_t seed = w.get_int("seed", 1234);
  if (seed < 0) w.child("seed").fail(w.path() + ".seed: must be >= 0");
  c.mlp.seed = static_cast<uint64_t>(seed);

  if (root.has("parallel")) {
    const auto p = root.child("parallel");
    p.expect_keys(kMlpParallelKeys);
    c.tp = static_cast<int>(p.get_positive_int("tp", c.topology.num_chips()));
    if (p.has("all_reduce")) {
      const std::string a = p.get_string("all_reduce");
      if (const auto why = collectives::algorithm_name_error(collectives::Collective::all_reduce, a); !why.empty())
        p.child("all_reduce").fail("parallel.all_reduce: " + why);
      c.all_reduce_algorithm = a;
    }
    c.fused = parse_fused_plan(p, c.tp, c.mlp.tokens, c.mlp.hidden);  // the output y [tokens, hidden]
  } else {
    c.tp = c.topology.num_chips();
  }
  if (c.tp != c.topology.num_chips())
    root.child("parallel").fail("parallel.tp: " + std::to_string(c.tp) + " must equal the topology's chip count (" +
                                std::to_string(c.topology.num_chips()) +
                                "): so far the MLP is sharded by tensor parallelism over all chips");
  c.mesh = mesh_from_config(root, {{"tp", c.tp}}, c.topology);
  if (c.mlp.ffn < c.tp)
    root.child("workload").fail(w.path() + ".ffn: " + std::to_string(c.mlp.ffn) + " is smaller than tp=" +
                                std::to_string(c.tp) + ": some chips would hold no FFN column");

  try {
    check_mlp_fits(c.mlp, c.tp, c.device.hbm_gib);
  } catch (const ConfigError& e) {
    root.child("workload").fail(std::string(e.what()) + " (device " + c.device.name + ")");
  }

  c.tolerance = c.mlp.dtype == runtime::DType::fp32 ? 1e-5 : 1.0 / 64.0;
  if (root.has("validate")) {
    const auto v = root.child("validate");
    v.expect_keys(kValidateKeys);
    c.validate = v.get_bool("enabled", true);
    if (v.has("tolerance")) c.tolerance = v.get_positive_double("tolerance");
  }
  c.checkpoint_path = (c.name.empty() ? std::string("shardsim_run") : c.name) + ".h5";
  if (root.has("checkpoint")) {
    const auto k = root.child("checkpoint");
    k.expect_keys(kCheckpointKeys);
    c.checkpoint = k.get_bool("enabled", true);
    c.checkpoint_path = k.get_string("path", c.checkpoint_path);
  }
  return c;
}

// Generated from the placements: the style of each weight on the tp axis and the reduction of the partial output.
std::string plan_text(const RunConfig& c) {
  const MlpTensorSpecs t = mlp_tensor_specs(c.mlp);
  const Placement up = t.w_gate.on("tp"), down = t.w_down.on("tp"), y = t.y_partial.on("tp");
  std::ostringstream os;
  os << "tensor parallel tp=" << c.tp << " (Megatron MLP: gate/up " << parallel_style(up) << " " << to_string(up)
     << ", down " << parallel_style(down) << " " << to_string(down) << ", all_reduce("
     << collectives::reduce_op_name(std::get<Partial>(y).op) << ") of the output)";
  if (c.fused.enabled)
    os << "; fused: down projection + all_reduce as one gemm_all_reduce (" << c.fused.describe() << ")";
  return os.str();
}

// Collective read of the full tensor onto rank 0 only (others read an empty block).
Tensor read_full_on_root(const CheckpointReader& rd, const std::string& ds, runtime::DType dt, runtime::Shape shape,
                         bool root) {
  Tensor t(dt, root ? shape : runtime::Shape(shape.size(), 0));
  rd.read_block(ds, runtime::Shape(shape.size(), 0), t);
  return t;
}

void expect_shape(const CheckpointReader& rd, const std::string& path, const std::string& ds,
                  const runtime::Shape& want) {
  const auto got = rd.global_shape(ds);
  if (got != want)
    throw ConfigError("checkpoint " + path + ": dataset '" + ds + "' has shape " + runtime::shape_str(got) +
                      " but the config's workload needs " + runtime::shape_str(want));
}

}  // namespace

RunConfig parse_run_config(const std::string& text, const std::string& file) {
  return parse(workload_config_from_text(text, file));
}

RunConfig parse_run_config(const ConfigNode& root) { return parse(root); }

RunConfig load_run_config(const std::string& file) {
  return parse(load_workload_config(file));
}

MlpTensorSpecs mlp_tensor_specs(const MlpShape& s) {
  MlpTensorSpecs t;
  t.x = {"activations/input", {s.tokens, s.hidden}, {}};
  t.w_gate = {"weights/w_gate", {s.hidden, s.ffn}, {{"tp", Shard{1}}}};
  t.w_up = {"weights/w_up", {s.hidden, s.ffn}, {{"tp", Shard{1}}}};
  t.w_down = {"weights/w_down", {s.ffn, s.hidden}, {{"tp", Shard{0}}}};
  t.y_partial = {"y (before the all_reduce)", {s.tokens, s.hidden}, {{"tp", Partial{collectives::ReduceOp::sum}}}};
  t.y = {"activations/output", {s.tokens, s.hidden}, {}};
  return t;
}

std::optional<std::string> checkpoint_target(const RunConfig& cfg, const RunOptions& opt) {
  if (opt.no_checkpoint || (!cfg.checkpoint && !opt.checkpoint_path)) return std::nullopt;
  return opt.checkpoint_path.value_or(cfg.checkpoint_path);
}

void check_world_size(const RunConfig& cfg, int world_size) {
  const int chips = cfg.topology.num_chips();
  if (world_size != chips)
    throw ConfigError(cfg.file + ": the topology has " + std::to_string(chips) + " chips but the job has " +
                      std::to_string(world_size) + " ranks; run it with mpirun -np " + std::to_string(chips));
}

ErrorStats compare(const Tensor& y, const Tensor& ref) {
  ErrorStats e;
  for (int64_t i = 0; i < y.numel(); ++i) {
    const double a = y.get(i), b = ref.get(i);
    e.max_abs_error = std::isfinite(a) ? std::max(e.max_abs_error, std::fabs(a - b)) : INFINITY;
    e.max_abs_reference = std::max(e.max_abs_reference, std::fabs(b));
  }
  return e;
}

RunReport run_workload(const runtime::World& world, const RunConfig& cfg, const RunOptions& opt) {
  const auto t_start = std::chrono::steady_clock::now();
  const int chips = cfg.topology.num_chips();
  check_world_size(cfg, world.size());
  const int rank = world.rank();
  const bool root = rank == 0;
  const MlpShape& s = cfg.mlp;
  const auto part = ffn_partition(s, cfg.tp);
  const auto off = static_cast<int64_t>(part.offset(static_cast<size_t>(rank)));
  const auto len = static_cast<int64_t>(part.size(static_cast<size_t>(rank)));

  RunReport rep;
  rep.name = cfg.name;
  rep.model = cfg.model;
  rep.config_file = cfg.file;
  rep.topology = cfg.topology.describe();
  rep.device = sim::describe(cfg.device);
  rep.plan = plan_text(cfg);
  rep.mesh = cfg.mesh.mapping_text();
  rep.chips = chips;
  rep.dtype = runtime::dtype_name(s.dtype);
  rep.tolerance = cfg.tolerance;

  // ---- this chip's simulated HBM: x and the weight shards stay resident for the whole run ----
  // (check_mlp_fits already replayed these allocations for every chip while parsing, so they fit.)
  const auto& placement = cfg.topology.placement();  // rank r (tensor-parallel shard r) runs on chip placement[r]
  const int chip = placement.at(static_cast<size_t>(rank));
  sim::Memory memory(chip, cfg.device.hbm_bytes());
  const MlpResident resident = allocate_mlp_resident(memory, s, len);

  // ---- inputs and this chip's weights: from the seed, or from a checkpoint ----
  Tensor x;
  MlpWeights w;
  std::unique_ptr<CheckpointReader> reader;
  if (!opt.resume_from.empty()) {
    // Every rank checks the file; a bad checkpoint fails the job once, with one message (World::agree).
    world.agree([&] {
      reader = std::make_unique<CheckpointReader>(world.comm(), opt.resume_from);
      expect_shape(*reader, opt.resume_from, "activations/input", {s.tokens, s.hidden});
      expect_shape(*reader, opt.resume_from, "weights/w_gate", {s.hidden, s.ffn});
      expect_shape(*reader, opt.resume_from, "weights/w_up", {s.hidden, s.ffn});
      expect_shape(*reader, opt.resume_from, "weights/w_down", {s.ffn, s.hidden});
      for (const auto& ds : {"activations/input", "weights/w_gate", "weights/w_up", "weights/w_down"})
        if (reader->dtype(ds) != s.dtype)
          throw ConfigError("checkpoint " + opt.resume_from + ": dataset '" + ds + "' is " +
                            runtime::dtype_name(reader->dtype(ds)) + " but the config's workload.dtype is " +
                            runtime::dtype_name(s.dtype));
      const std::string act = reader->root_attribute("activation");
      if (!act.empty() && act != kernels::activation_name(s.activation))
        throw ConfigError("checkpoint " + opt.resume_from + ": written with activation '" + act +
                          "' but the config's workload.activation is '" + kernels::activation_name(s.activation) + "'");
      // The file is read once: each rank reads its own blocks, and every tensor's checksum is verified from
      // those blocks (the weights' shards partition them; the replicated input counts on rank 0 only). A
      // corrupted tensor fails here, on every rank, before the data is used.
      x = Tensor(s.dtype, {s.tokens, s.hidden});
      reader->read_block_verified("activations/input", {0, 0}, x, root);
      w.ffn_offset = off;
      w.ffn_size = len;
      w.w_gate = Tensor(s.dtype, {s.hidden, len});
      w.w_up = Tensor(s.dtype, {s.hidden, len});
      w.w_down = Tensor(s.dtype, {len, s.hidden});
      reader->read_block_verified("weights/w_gate", {0, off}, w.w_gate, true);
      reader->read_block_verified("weights/w_up", {0, off}, w.w_up, true);
      reader->read_block_verified("weights/w_down", {off, 0}, w.w_down, true);
    });
    rep.resumed_from = opt.resume_from;
  } else {
    x = make_mlp_input(s);
    w = make_mlp_weights(s, off, len);
  }

  // ---- the sharded forward ----
  sim::Timeline tl(chip, cfg.topology, cfg.device);
  runtime::Transport tp(world, tl, placement);
  world.sleepy_barrier();
  rep.wall_init_s = seconds_since(t_start);
  const auto t_fwd = std::chrono::steady_clock::now();
  MlpTiming timing;
  Tensor y = mlp_forward_tp(tp, s, x, w, 0.0, &timing, cfg.all_reduce_algorithm, &memory, cfg.fused);
  world.sleepy_barrier();
  rep.wall_forward_s = seconds_since(t_fwd);

  // ---- validation against one device (rank 0) ----
  if (cfg.validate) {
    const auto t_ref = std::chrono::steady_clock::now();
    MlpWeights full;
    if (reader) {
      full.ffn_offset = 0;
      full.ffn_size = root ? s.ffn : 0;
      full.w_gate = read_full_on_root(*reader, "weights/w_gate", s.dtype, {s.hidden, s.ffn}, root);
      full.w_up = read_full_on_root(*reader, "weights/w_up", s.dtype, {s.hidden, s.ffn}, root);
      full.w_down = read_full_on_root(*reader, "weights/w_down", s.dtype, {s.ffn, s.hidden}, root);
    }
    int ok = 1;
    if (root) {
      if (!reader) full = make_mlp_weights(s, 0, s.ffn);
      const auto one_chip = topology::Topology::ring(1, topology::LinkSpec{1.0, 0.0});
      sim::Timeline ref_tl(0, one_chip, cfg.device);
      kernels::set_blas_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
      MlpTiming ref_timing;
      const Tensor y_ref = mlp_forward(s, x, full, &ref_tl, &ref_timing);
      kernels::set_blas_threads(1);
      rep.single_device_ns = ref_timing.end;
      const ErrorStats e = compare(y, y_ref);
      rep.max_abs_error = e.max_abs_error;
      rep.max_abs_reference = e.max_abs_reference;
      rep.relative_error = e.relative();
      rep.passed = rep.relative_error <= cfg.tolerance;
      ok = rep.passed ? 1 : 0;
    }
    world.sleepy_barrier();
    ok = world.broadcast(ok ? "1" : "0", 0) == "1";
    rep.validated = true;
    rep.passed = ok != 0;
    rep.wall_reference_s = seconds_since(t_ref);
  }

  // ---- resumed runs must reproduce the stored output bit for bit ----
  if (reader) {
    if (reader->has("activations/output")) {
      Tensor stored(s.dtype, {s.tokens, s.hidden});
      world.agree([&] {
        expect_shape(*reader, opt.resume_from, "activations/output", {s.tokens, s.hidden});
        reader->read_block_verified("activations/output", {0, 0}, stored, root);
      });
      const std::string saved_tp = reader->root_attribute("tp");
      rep.resume_saved_tp = std::atoi(saved_tp.c_str());  // 0 when missing or not a number: treated as resharded
      rep.resume_same_layout = rep.resume_saved_tp == cfg.tp;
      rep.resume_compared = true;
      if (rep.resume_same_layout) {
        // Same sharding, same kernels, same reduction order: the output must be bit-identical.
        rep.resume_bit_exact = !world.any(!stored.bit_equal(y));
      } else {
        // Resharded: the all_reduce sums the partials in another order, so only the tolerance applies.
        rep.resume_relative_error = compare(y, stored).relative();
        rep.resume_bit_exact = !world.any(!(rep.resume_relative_error <= cfg.tolerance));
      }
    }
    reader.reset();
  }

  // ---- checkpoint ----
  if (const auto target = checkpoint_target(cfg, opt)) {
    const auto t_ck = std::chrono::steady_clock::now();
    const std::string& path = *target;
    // Global shapes, this chip's offsets and the placement attributes all come from the tensor specs.
    const MlpTensorSpecs ts = mlp_tensor_specs(s);
    auto entry = [&](const TensorSpec& spec, const Tensor* t, bool writer) {
      std::vector<int64_t> offset;
      (void)spec.local_shape(cfg.mesh, rank, &offset);
      return CheckpointEntry{spec.name, t, spec.shape, offset, spec.describe(cfg.mesh), writer};
    };
    std::vector<CheckpointEntry> entries = {
        entry(ts.w_gate, &w.w_gate, true), entry(ts.w_up, &w.w_up, true), entry(ts.w_down, &w.w_down, true),
        entry(ts.x, &x, root),             entry(ts.y, &y, root),
    };
    std::map<std::string, std::string> attrs = {
        {"shardsim_version", "0.1.0"},
        {"config", cfg.text},
        {"config_file", cfg.file},
        {"workload", "mlp"},
        {"model", cfg.model},
        {"parallel_plan", rep.plan},
        {"tp", std::to_string(cfg.tp)},
        {"activation", kernels::activation_name(s.activation)},
        {"topology", rep.topology},
    };
    SaveOptions so;
    std::ostringstream mesh;
    mesh << cfg.mesh.describe() << " (rank r holds shard r; ranks on chips";
    for (int c : placement) mesh << ' ' << c;
    mesh << ") of " << rep.topology << "; " << rep.mesh;
    so.mesh = mesh.str();
    // save_checkpoint's errors are the same on every rank (it agrees them): one line from rank 0, not an abort.
    world.agree([&] { save_checkpoint(world.comm(), path, entries, attrs, so); });
    rep.checkpoint = path;
    rep.wall_checkpoint_s = seconds_since(t_ck);
  }

  if (!opt.trace_path.empty()) {
    write_trace(world, tl, opt.trace_path);
    rep.trace = opt.trace_path;
  }

  // ---- gather every chip's simulated breakdown on rank 0 ----
  const sim::Breakdown b = tl.breakdown();
  rep.ops = ops_of_rank(world, op_breakdown(tl), critical_rank(world, b.total));
  rep.all_reduce_algorithm = timing.all_reduce_algorithm;  // the same on every chip (auto decides globally)
  constexpr int kFields = 9;
  const double mine[kFields] = {b.total,      b.compute,    b.communication,        b.exposed_comm,
                                b.flops,      b.bytes_sent, timing.all_reduce_ns,   timing.all_reduce_bytes_sent,
                                static_cast<double>(memory.peak())};
  // Fused runs append the fused op's figures (the same count on every rank).
  std::vector<FusedOp> fused_ops;
  if (timing.fused_used) fused_ops.push_back({"gemm.down + all_reduce", timing.fused});
  std::vector<double> mine_v(mine, mine + kFields);
  for (double v : pack(fused_ops)) mine_v.push_back(v);
  const int nf = static_cast<int>(mine_v.size());
  std::vector<double> all(root ? static_cast<size_t>(nf) * static_cast<size_t>(chips) : 0);
  {  // every chip's figures (through the chip router in chip mode); rank 0 keeps them
    const auto bytes = world.allgather(mine_v.data(), mine_v.size() * sizeof(double), "report");
    if (root) std::memcpy(all.data(), bytes.data(), all.size() * sizeof(double));
  }
  if (root) {
    for (int c = 0; c < chips; ++c) {
      const double* v = &all[static_cast<size_t>(nf) * static_cast<size_t>(c)];
      ChipReport cr;
      cr.chip = placement.at(static_cast<size_t>(c));
      cr.breakdown = sim::Breakdown{v[0], v[1], v[2], v[3], v[4], v[5]};
      cr.peak_memory_bytes = v[8];  // from the chip's sim::Memory
      rep.per_chip.push_back(cr);
      rep.total_flops += v[4];
      if (v[0] > rep.critical.total) {
        rep.critical = cr.breakdown;
        rep.critical_chip = cr.chip;
        rep.all_reduce_ns = v[6];
        rep.all_reduce_bytes_per_chip = v[7];
        rep.fused = unpack(v + kFields, fused_ops);
      }
    }
    const double p = chips;
    const double m = double(s.tokens * s.hidden) * double(runtime::dtype_size(s.dtype));
    rep.all_reduce_expected_bytes = 2.0 * (p - 1.0) / p * m;
    if (cfg.tp > 1)
      rep.comm["tp all_reduce"] = CommStat{rep.all_reduce_bytes_per_chip, rep.all_reduce_expected_bytes, 1, rep.all_reduce_ns, rep.all_reduce_algorithm};
    rep.sim_tflops = rep.critical.total > 0 ? rep.total_flops / rep.critical.total / 1e3 : 0;
    rep.peak_tflops = p * cfg.device.peak_tflops(runtime::precision_of(s.dtype));
    rep.peak_fraction = rep.peak_tflops > 0 ? rep.sim_tflops / rep.peak_tflops : 0;
    rep.peak_tflops_per_chip = cfg.device.peak_tflops(runtime::precision_of(s.dtype));
    rep.tokens_per_s = rep.critical.total > 0 ? double(s.tokens) / rep.critical.total * 1e9 : 0;
    rep.hbm_capacity_bytes = cfg.device.hbm_bytes();
  }
  rep.wall_total_s = seconds_since(t_start);
  return rep;
}

}  // namespace shardsim::sharding
