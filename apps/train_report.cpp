// The training report of `train` and of `run` (the executor's forward mode), apps/train.cpp's run_train_dp: its
// head before the first step (the model, mesh, plan and data lines), the summary of the last step and its tail
// figures (the memory rows beside ZeRO's formulas, the pipeline's stages, the per-chip tables, the MoE rows).
#include "apps/train_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "models/lm_model.h"
#include "sharding/plans/expert_parallel_config.h"
#include "sharding/plans/registry.h"
#include "sim/kernel_model.h"

namespace shardsim::apps::train_detail {

namespace {

// The report's fields every training run has (reporting/report.h).
reporting::RunReport train_report(const TrainFlags& f, const TrainSetup& s, int chips) {
  const auto& c = s.model;
  reporting::RunReport r;
  r.run_mode = f.forward ? "forward" : "train";
  r.train.forward = f.forward;
  r.name = s.name.empty() ? std::filesystem::path(f.config).stem().string() : s.name;
  r.config_file = s.config_name;
  r.device = sim::describe(s.device);
  r.dtype = runtime::dtype_name(c.dtype);
  r.chips = chips;
  r.layers = static_cast<int>(c.layers);  // the JSON's "layers" (the model's; it said 1 for every training run)
  r.shape_only = s.shape_only;
  r.peak_tflops_per_chip = s.device.peak_flops_per_ns(runtime::precision_of(c.dtype)) / 1e3;
  r.peak_tflops = r.peak_tflops_per_chip * chips;
  r.hbm_capacity_bytes = s.device.hbm_bytes();
  r.hbm_reserve_bytes = s.device.hbm_reserve_bytes();
  r.trace = f.trace_path;
  char b[512];
  std::snprintf(b, sizeof b, "vocab %lld, hidden %lld, %lld layers, %lld/%lld heads of %lld, ffn %lld; %lld parameters "
                "(%lld in GEMMs); %s", (long long)c.vocab, (long long)c.hidden, (long long)c.layers,
                (long long)c.heads, (long long)c.kv_heads, (long long)c.head_dim, (long long)c.ffn,
                (long long)models::lm_param_count(c), (long long)models::lm_matmul_param_count(c),
                c.dtype == runtime::DType::fp32 ? "fp32" : "bf16 compute, fp32 master weights and AdamW state");
  r.train.model = b;
  if (c.vocab == 0) {  // a stack of blocks: no embedding or head
    std::snprintf(b, sizeof b, "a stack of %lld transformer blocks (no embedding or head), hidden %lld, %lld/%lld heads "
                  "of %lld, ffn %lld; %lld parameters; loss: mean squared error to a seeded target (kernels/mse_loss.h); %s",
                  (long long)c.layers, (long long)c.hidden, (long long)c.heads, (long long)c.kv_heads,
                  (long long)c.head_dim, (long long)c.ffn, (long long)models::lm_param_count(c),
                  c.dtype == runtime::DType::fp32 ? "fp32" : "bf16 compute, fp32 master weights and AdamW state");
    r.train.model = b;
  }
  if (c.vocab == 0 && !c.attention) {  // model.kind mlp: the block without its attention half
    std::snprintf(b, sizeof b, "a stack of %lld MLP blocks x + mlp(rmsnorm(x)) (no attention, no embedding or head), "
                  "hidden %lld, ffn %lld; %lld parameters; loss: mean squared error to a seeded target "
                  "(kernels/mse_loss.h); %s", (long long)c.layers, (long long)c.hidden, (long long)c.ffn,
                  (long long)models::lm_param_count(c),
                  c.dtype == runtime::DType::fp32 ? "fp32" : "bf16 compute, fp32 master weights and AdamW state");
    r.train.model = b;
  }
  if (!c.gated() || c.layernorm() || c.position != sharding::PositionKind::rope || c.tied_embeddings)
    r.train.model += std::string("; ") + sharding::norm_name(c.norm) + ", " + sharding::mlp_name(c.mlp) + " MLP, " +
                     sharding::position_name(c.position) + " positions" + (c.tied_embeddings ? ", tied embeddings" : "");
  if (c.unfused_attention()) r.train.model += "; unfused attention core";
  if (c.dropout > 0 || c.linear_bias) {
    char x[160];
    std::snprintf(x, sizeof x, "; charged, not computed: %s%s", c.dropout > 0 ? "dropout" : "",
                  c.linear_bias ? (c.dropout > 0 ? ", linear biases" : "linear biases") : "");
    r.train.model += x;
    if (c.dropout > 0) {
      std::snprintf(x, sizeof x, " (dropout %g)", c.dropout);
      r.train.model += x;
    }
  }
  r.train.log_vocab = c.vocab > 0 ? std::log(double(c.vocab)) : NAN;  // none for a block stack
  r.train.tokens_per_step = double(c.batch) * double(c.seq);
  // A forward is a third of a training step's model FLOPs (the backward's two GEMMs per forward GEMM).
  r.train.model_flops_per_step =
      models::lm_model_flops_per_token(c) * r.train.tokens_per_step / (f.forward ? 3.0 : 1.0);
  return r;
}

void resumed_into(reporting::RunReport& r, const TrainFlags& f, const std::optional<models::LmTrainSnapshot>& snap) {
  if (!snap) return;
  r.resumed_from = r.train.resumed_from = f.resume;
  r.train.resumed_step = snap->step;
  r.train.resumed_mesh = snap->mesh + (snap->weights_only && !f.forward ? "; weights only (a forward's checkpoint): "
                                                                          "AdamW's moments start at zero" : "");
}


std::string zero_rule(const char* what, int zero, bool mixed, const char* psi) {
  const std::string w = what;
  const int per = w == "optimizer state" ? (mixed ? 12 : 8) : (mixed ? 2 : 4);
  const int from = w == "parameters" ? 3 : w == "gradients" ? 2 : 1;
  return std::to_string(per) + "*" + psi + (zero >= from ? "/N_d" : "");
}

// A MoE model's section (reporting/report.h, TrainMoe): every MoE layer of the last step (collective: gathered
// from the stages that hold them) and chip 0's expert state.
void moe_report(models::LmTpTrainer& trainer, const TrainSetup& s, const sharding::ModelSpec& c,
                reporting::RunReport& rep) {
  reporting::TrainMoe m;
  const kernels::MoeSpec& spec = c.moe->spec;
  m.spec = sharding::plans::moe_text(*c.moe);
  m.total_params = double(models::lm_param_count(c));
  const kernels::MoeParams one = kernels::moe_params(spec);
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.layers; ++l) moe_layers += c.moe_layer(l) ? 1 : 0;
  m.active_params = m.total_params - double(moe_layers) * (one.total - one.active);
  m.expert_params_chip = trainer.expert_param_count();
  // ZeRO over the experts' data-parallel group (dp): parameters P, gradients P, optimizer state K per weight, the
  // stage's parts divided by dp.
  const double P = double(runtime::dtype_size(c.dtype)), K = c.dtype == runtime::DType::fp32 ? 8 : 12;
  const double nd = s.plan.dp;
  const int z = s.dp.zero;
  m.expert_state_bytes = m.expert_params_chip * (P / (z >= 3 ? nd : 1) + P / (z >= 2 ? nd : 1) + K / (z >= 1 ? nd : 1));
  char b[200];
  std::snprintf(b, sizeof b, "ZeRO stage %d over the experts' dp = %.0f replicas: %g + %g + %g bytes per weight", z, nd,
                P / (z >= 3 ? nd : 1), P / (z >= 2 ? nd : 1), K / (z >= 1 ? nd : 1));
  m.expert_state_rule = b;
  // The memory section's formulas take each bucket over its own group: say which N_d the experts have.
  if (rep.train.has_memory && s.plan.ep > 1) {
    std::snprintf(b, sizeof b, "; of them %.0f expert weights (%lld of %lld experts per MoE layer) on N_d = dp = %d, "
                  "the rest on N_d = dp x ep x cp = %d", m.expert_params_chip,
                  (long long)(spec.experts() / s.plan.ep), (long long)spec.experts(), s.plan.dp,
                  s.plan.dp * s.plan.ep * s.cp);
    rep.train.memory.basis += b;
  }
  const sharding::ModelSpec& local = trainer.local_config();
  const double T = double(local.batch * local.seq), ep = s.plan.ep;
  for (const auto& st : trainer.moe_layer_table()) {
    reporting::TrainMoeLayer l;
    l.layer = st.layer;
    l.max_tokens = st.max_tokens;
    l.mean_tokens = st.mean_tokens;
    l.received_rows = double(st.received);
    l.aux = st.aux;
    l.dispatch_bytes = st.dispatch_bytes;
    l.dispatch_closed_form = T * double(spec.router.top_k) * double(c.hidden) * P * (ep - 1) / ep;
    l.dispatch_ns = st.dispatch_ns;
    l.buffer_bytes = st.buffer_bytes;
    l.expert_ns = st.expert_ns;
    l.balanced_expert_ns = st.balanced_expert_ns;
    l.busiest_link = st.link_name;
    l.link_bytes = st.link_bytes;
    l.link_bound_ns = st.link_bound_ns;
    l.remote_nodes_per_token = st.remote_nodes;
    m.layers.push_back(l);
  }
  rep.train.has_moe = true;
  rep.train.moe = std::move(m);
}

// The report's pipeline section (collective: every chip's stage summary) and chip 0's activations: its peak over
// the micro-batches it holds at once (models/lm_tp.h, LmStageSummary).
void pipeline_report(models::LmTpTrainer& trainer, reporting::RunReport& rep) {
  using namespace sharding::plans;
  const PipelineSchedule& sch = trainer.schedule();
  const std::vector<models::LmStageSummary> stages = trainer.pipeline_summary();
  reporting::TrainPipeline& p = rep.train.pipeline;
  rep.train.has_pipeline = true;
  p.schedule = schedule_name(sch.kind);
  p.p = sch.p;
  p.m = sch.m;
  p.v = sch.v;
  // ZB-H1's closed form needs the actions' costs: the stages' mean F, BI and W spans (uniform stages assumed).
  p.closed_form = closed_form_bubble(sch.kind, sch.p, sch.m, sch.v, models::lm_stage_costs(stages));
  p.closed_form_rule = sch.kind == ScheduleKind::interleaved ? "(p-1)/(v*m+p-1)"
                       : sch.kind == ScheduleKind::zb_h1
                           ? "(p-1)(F+B-W)/((p-1)(F+B-W)+m(F+B+W)), F B W the mean F, BI, W spans"
                           : "(p-1)/(m+p-1)";
  for (const auto& st : stages) {
    p.pipeline_ns = st.pipeline_ns;
    p.bubble_fraction += st.bubble_fraction() / double(stages.size());
    p.stages.push_back({st.busy_ns, st.bubble_ns, st.bubble_fraction(), st.peak_activation_bytes,
                        st.peak_microbatches, st.bytes_forward, st.bytes_backward, st.peak_pending_w_bytes});
  }
  // The largest stage's peak (the first under 1F1B and interleaving; the last can be larger under GPipe, which
  // holds m micro-batches everywhere and the head's logits there, and under ZB-H1, whose last stage keeps up to p
  // pending weight gradients), so the HBM check holds for every stage.
  size_t top = 0;
  for (size_t i = 1; i < stages.size(); ++i)
    if (stages[i].peak_activation_bytes > stages[top].peak_activation_bytes) top = i;
  rep.train.memory.activations = stages[top].peak_activation_bytes;
  char note[200];
  std::snprintf(note, sizeof note, "the largest stage's peak, stage %zu: %.2f micro-batches of its layers held at once "
                "under %s%s", top, stages[top].peak_microbatches, p.schedule.c_str(),
                stages[top].peak_pending_w_bytes > 0 ? " with its pending weight gradients" : "");
  rep.train.memory.activations_note = note;
}

}  // namespace

// The summary of the last step (or the mean step on one chip): step time, tokens/s, MFU.
void finish_simulated(reporting::RunReport& r, const sim::Breakdown& b) {
  auto& t = r.train;
  r.critical = b;
  r.critical_chip = 0;
  t.step_ns = b.total;
  r.tokens_per_s = b.total > 0 ? t.tokens_per_step / b.total * 1e9 : 0;
  r.total_flops = t.model_flops_per_step;
  r.sim_tflops = b.total > 0 ? t.model_flops_per_step / b.total / 1e3 : 0;
  t.mfu = r.peak_tflops > 0 ? r.sim_tflops / r.peak_tflops : 0;
  r.peak_fraction = t.mfu;
}

// FORWARD (the forward mode): the parameters alone (no gradients or optimizer state are needed for a forward) and
// the tensors one micro-batch's forward produces (held only until the next layer has read them: an upper bound).
reporting::TrainMemory memory_of(const models::LmDpMemory& mem, const TrainSetup& s, const std::string& basis,
                                const char* psi, int dp_size, bool forward) {
  reporting::TrainMemory m;
  const bool mixed = s.model.dtype != runtime::DType::fp32;
  m.basis = basis;
  if (mem.padding > 0)  // sharding/plans/data_parallel.h, "Padding"
    m.basis += "; measured bytes include " + std::to_string(static_cast<long long>(mem.padding)) +
               " elements of padding per flat buffer (Megatron's distributed-optimizer alignment)";
  m.rows = {{"parameters", mem.params, mem.formula_params, zero_rule("parameters", s.dp.zero, mixed, psi)}};
  if (!forward)
    m.rows.insert(m.rows.end(),
                  {{"gradients", mem.grads, mem.formula_grads, zero_rule("gradients", s.dp.zero, mixed, psi)},
                   {"optimizer state", mem.optimizer, mem.formula_optimizer,
                    zero_rule("optimizer state", s.dp.zero, mixed, psi)}});
  m.activations = mem.activations;
  m.activations_note = std::string(forward ? "one micro-batch's forward tensors (an upper bound: nothing is kept for "
                                             "a backward)"
                                   : s.dp.recompute ? "recompute per block: the block inputs, one block's and the "
                                                      "head's saved tensors"
                                                    : "the forward's saved tensors") +
                       " for " + std::to_string(s.model.batch / dp_size) + " sequences" +
                       (s.cp > 1 ? " (this chip's 1/cp of each)" : "");
  return m;
}

// The report's mesh attribute of a checkpoint: "pp=2 x dp=2 x tp=2 (sequence parallel), ZeRO stage 1".
std::string mesh_text_of(const TrainSetup& s, int dp_size) {
  // DP_SIZE: the dense weights' replicas, dp x ep (ep an axis of its own in the text).
  const int ep = std::max(1, s.plan.ep);
  const std::string dp = "dp=" + std::to_string(dp_size / ep) + (ep > 1 ? " x ep=" + std::to_string(ep) : "");
  if (!(s.tp > 1 || s.cp > 1 || s.pp > 1)) return dp + ", ZeRO stage " + std::to_string(s.dp.zero);
  return (s.pp > 1 ? "pp=" + std::to_string(s.pp) + " x " : std::string()) + dp +
         (s.cp > 1 ? (s.ulysses ? " x ulysses=" : " x cp=") + std::to_string(s.cp) : std::string()) +
         " x tp=" + std::to_string(s.tp) + (s.plan.etp > 1 ? " (etp=" + std::to_string(s.plan.etp) + ")" : "") +
         (s.sp ? (s.fused ? " (sequence parallel, fused)" : " (sequence parallel)") : "") +
         (s.dp.zero > 0 ? ", ZeRO stage " + std::to_string(s.dp.zero) : "");
}

// The report's head, printed before the first step: the model, topology, mesh, the plan line (the plan registry's
// one text for both modes, and in training the trainer's BUCKETS), the data line and the resumed state.
reporting::RunReport report_head(const TrainFlags& f, const TrainSetup& s, int n, int dp_size,
                              const sharding::DeviceMesh& mesh, int buckets,
                              const std::optional<models::LmTrainSnapshot>& resumed) {
  const auto& c = s.model;
  const topology::Topology& topo = *s.topology;
  reporting::RunReport r = train_report(f, s, n);
  r.topology = s.default_topology ? topo.describe() + " (default: 100 GB/s, 1 us per hop)" : topo.describe();
  r.mesh = mesh.mapping_text();
  r.plan = sharding::plans::plan_text(s.spec, s.plan, !f.forward);
  r.train.pipelined = s.pp > 1;
  if (!f.forward && dp_size * s.cp > 1 && s.dp.zero < 3)
    r.plan += "; " + std::to_string(buckets) + " gradient bucket" + (buckets == 1 ? "" : "s");
  char b[1024];
  const long long per_replica = (long long)(c.batch / dp_size);
  const std::string micro = s.dp.micro_batch > 0 ? ", " + std::to_string(per_replica / s.dp.micro_batch) +
                                                       " micro-batches of " + std::to_string(s.dp.micro_batch) +
                                                       (f.forward ? "" : ", gradients accumulated")
                                                 : std::string();
  if (f.forward)  // run reads no optimizer setting: a training config's train: section is accepted and unused
    std::snprintf(b, sizeof b, "global batch %lld x seq %lld = %.0f tokens in the forward (%lld sequences per "
                  "replica%s)%s", (long long)c.batch, (long long)c.seq, r.train.tokens_per_step, per_replica,
                  micro.c_str(), s.has_train_section ? "; the config's train: section is ignored by run (one "
                  "forward, no optimizer step)" : "");
  else
    std::snprintf(b, sizeof b, "global batch %lld x seq %lld = %.0f tokens per step (%lld sequences per replica%s); "
                  "AdamW lr %g, weight decay %g, clip %g", (long long)c.batch, (long long)c.seq,
                  r.train.tokens_per_step, per_replica, micro.c_str(), double(s.train.adamw.lr),
                  double(s.train.adamw.weight_decay), s.train.max_grad_norm);
  r.train.data = b;
  resumed_into(r, f, resumed);
  return r;
}

// The report's tail figures after the last step: the memory rows (ZeRO's formula beside the measured state), the
// pipeline's stages, the collected per-chip / per-collective / fused / per-op tables FIGS (the forward's headline is
// the critical chip's, the one that finishes last, in both modes) and the MoE rows.
void report_figures(models::LmTpTrainer& trainer, const TrainSetup& s, const TrainFlags& f,
                    const reporting::RunReport& figs, int n, int dp_size, reporting::RunReport& rep) {
  const auto& c = s.model;
  const bool tp_mesh = s.tp > 1 || s.cp > 1 || s.pp > 1;  // the tp-mesh wording whenever a tp, cp or pp axis exists
  const auto mem = trainer.memory();
  const double psi = double(models::lm_param_count(c));
  char b[1024];
  if (tp_mesh)
    std::snprintf(b, sizeof b, "Psi_tp = %.0f of Psi = %.0f parameters on this chip: its tp shards and the "
                  "replicated norms; ZeRO formula, N_d = %d, stage %d", trainer.local_param_count(), psi,
                  dp_size * s.cp, s.dp.zero);
  else
    std::snprintf(b, sizeof b, "ZeRO formula for Psi = %.0f, N_d = %d, stage %d", psi, n, s.dp.zero);
  rep.train.has_memory = true;
  rep.train.memory = memory_of(mem, s, b, tp_mesh ? "Psi_tp" : "Psi", dp_size, f.forward);
  if (s.pp > 1) pipeline_report(trainer, rep);
  if (!figs.per_chip.empty()) {
    rep.per_chip = figs.per_chip;
    rep.ops = figs.ops;
    rep.comm = figs.comm;
    rep.fused = figs.fused;
    rep.all_reduce_ns = figs.all_reduce_ns;
    rep.all_reduce_bytes_per_chip = figs.all_reduce_bytes_per_chip;
    rep.all_reduce_expected_bytes = figs.all_reduce_expected_bytes;
    rep.attention_ns = figs.attention_ns;  // the critical chip's (gather_chip_figures)
    // One rule for both modes: the summary is the critical chip's (the one that ends last), as the step rows.
    finish_simulated(rep, figs.critical);
    rep.critical_chip = figs.critical_chip;
    rep.bubble_ns = figs.bubble_ns;
  }
  if (c.moe) moe_report(trainer, s, c, rep);
}

}  // namespace shardsim::apps::train_detail
