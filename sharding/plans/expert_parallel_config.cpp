#include "sharding/plans/expert_parallel_config.h"

#include <algorithm>
#include <functional>
#include <cmath>
#include <map>
#include <sstream>

#include "common/csv.h"
#include "common/error.h"
#include "common/input_file.h"
#include "common/number.h"
#include "common/text.h"
#include "sharding/plans/block.h"

namespace shardsim::sharding::plans {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

std::vector<int64_t> expert_ffn(const ConfigNode& moe, int64_t experts, const std::string& w) {
  const ConfigNode node = moe.child("expert_ffn");
  if (node.yaml().IsSequence()) {
    std::vector<int64_t> v = moe.get_int_list("expert_ffn");
    if (int64_t(v.size()) != experts)
      node.fail(w + "expert_ffn: a list of " + str(int64_t(v.size())) + " sizes for " + str(experts) +
                " experts (give one size, or one per expert)");
    for (int64_t f : v)
      if (f < 1 || f > MoeBounds::ffn)
        node.fail(w + "expert_ffn: every size must be between 1 and " + str(MoeBounds::ffn) + " (got " + str(f) + ")");
    return v;
  }
  return std::vector<int64_t>(size_t(experts), moe.get_int_in("expert_ffn", 1, MoeBounds::ffn));
}

// Bound of a routing histogram file (a row per layer and expert: DeepSeek-V3's 58 x 256 rows are ~200 KB).
constexpr size_t kMaxHistogramBytes = size_t(64) << 20;
constexpr double kMaxHistogramWeight = 1e18;

// The routing histogram of model.moe.routing_file (KEY): a CSV with the header "layer,expert,tokens" and one record
// per (layer, expert) pair: LAYER a global layer index of a MoE layer, or "all" (every MoE layer without records of
// its own); EXPERT in [0, E); TOKENS a finite decimal >= 0 (any unit: tokens routed in a measured run, or a share).
// Experts a layer does not list weigh 0. Errors: ConfigError "CSV:LINE: model.moe.routing_file: ..." (exit 2).
std::vector<std::vector<double>> read_routing_histogram(const ConfigNode& moe, const kernels::MoeConfig& c,
                                                        int64_t layers) {
  const std::string file = moe.get_string("routing_file");
  const std::string shown = escape_control(file), k = moe.path() + ".routing_file";
  if (const std::string why = unreadable_input(file); !why.empty()) moe.child("routing_file").fail(k + ": " + shown + ": " + why);
  std::string text = read_input_file(file, kMaxHistogramBytes, "a routing histogram");
  // At most a record per (MoE layer or 'all', expert), the header and as many blank lines: checked before the
  // records are split (a file of blank lines within the byte limit would otherwise take gigabytes).
  const int64_t E = c.spec.experts();
  const int64_t most = 2 * ((layers + 1) * E + 1);
  if (int64_t(std::count(text.begin(), text.end(), '\n')) > most)
    throw ConfigError(shown + ": " + k + ": more than " + str(most) + " lines: 2 x ((layers + 1) x experts + 1) at most");
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);  // a UTF-8 byte order mark (spreadsheet exports)
  if (!text.empty() && text.back() != '\n') text += '\n';  // a last line without its newline is still a record
  const CsvRecords recs = csv_records(text);
  auto fail = [&](int line, const std::string& what) -> void {
    throw ConfigError(shown + ":" + std::to_string(line) + ": " + k + ": " + what);
  };
  if (recs.truncated) fail(int(recs.records.empty() ? 1 : recs.records.back().line + 1), "a quoted field is not closed");
  size_t i = 0;
  while (i < recs.records.size() && recs.records[i].fields.size() == 1 && recs.records[i].fields[0].empty()) ++i;
  if (i == recs.records.size()) fail(1, "empty file (expected the header layer,expert,tokens)");
  const std::vector<std::string> header = {"layer", "expert", "tokens"};
  if (recs.records[i].fields != header) fail(recs.records[i].line, "the header must be layer,expert,tokens");
  std::map<int64_t, std::vector<double>> rows;  // layer (-1: all) -> weights
  std::map<std::pair<int64_t, int64_t>, int> seen;
  for (++i; i < recs.records.size(); ++i) {
    const CsvRecord& r = recs.records[i];
    if (r.fields.size() == 1 && r.fields[0].empty()) continue;
    if (r.fields.size() != 3) fail(r.line, "expected 3 fields (layer,expert,tokens), got " + std::to_string(r.fields.size()));
    int64_t layer = -1;
    if (r.fields[0] != "all") {
      const auto l = decimal_int(r.fields[0]);
      if (!l || *l < 0 || *l >= layers)
        fail(r.line, "layer '" + escape_control(r.fields[0]) + "' is not 'all' or a layer index 0.." + str(layers - 1));
      if (!c.is_moe_layer(*l)) fail(r.line, "layer " + str(*l) + " is a dense layer (model.moe.dense_layers, layer_step)");
      layer = *l;
    }
    const auto e = decimal_int(r.fields[1]);
    if (!e || *e < 0 || *e >= E)
      fail(r.line, "expert '" + escape_control(r.fields[1]) + "' is not an expert index 0.." + str(E - 1));
    const auto t = decimal_double(r.fields[2]);
    if (!t || *t < 0 || *t > kMaxHistogramWeight)
      fail(r.line, "tokens '" + escape_control(r.fields[2]) + "' must be a decimal number between 0 and 1e18");
    const auto [it, fresh] = seen.emplace(std::pair{layer, *e}, r.line);
    if (!fresh)
      fail(r.line, "layer " + (layer < 0 ? std::string("all") : str(layer)) + ", expert " + str(*e) +
                       " given twice (first on line " + std::to_string(it->second) + ")");
    auto& w = rows[layer];
    w.resize(size_t(E), 0.0);
    w[size_t(*e)] = *t;
  }
  std::vector<std::vector<double>> out(static_cast<size_t>(layers));
  const int end = recs.records.back().line;
  for (int64_t l = 0; l < layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    auto it = rows.find(l);
    if (it == rows.end()) it = rows.find(-1);
    if (it == rows.end()) fail(end, "MoE layer " + str(l) + " has no records and there is no 'all' layer");
    double sum = 0;
    for (double v : it->second) sum += v;
    if (!(sum > 0)) fail(end, "the tokens of " + (it->first < 0 ? std::string("layer all") : "layer " + str(l)) + " sum to 0");
    out[size_t(l)] = it->second;
  }
  return out;
}

}  // namespace

kernels::MoeConfig parse_moe_config(const ConfigNode& moe, const ModelSpec& model) {
  const std::string w = moe.path() + ".";
  if (!moe.is_map()) moe.fail(moe.path() + ": expected a map of MoE keys");
  moe.expect_keys(kMoeKeys);
  kernels::MoeConfig c;
  kernels::MoeSpec& s = c.spec;
  s.hidden = model.hidden;
  s.dtype = model.dtype;
  s.gated = model.mlp != MlpKind::gelu;
  s.activation = model.mlp == MlpKind::swiglu ? kernels::Activation::silu : kernels::Activation::gelu;
  s.router.experts = moe.get_int_in("experts", 1, MoeBounds::experts);
  s.router.top_k = moe.get_int_in("top_k", 1, s.router.experts);
  s.expert_ffn = expert_ffn(moe, s.router.experts, w);
  const int64_t shared = moe.get_int_in("shared_experts", 0, MoeBounds::experts, 0);
  s.shared_ffn = moe.get_int_in("shared_ffn", 0, MoeBounds::ffn, 0);
  if (s.shared_ffn == 0) s.shared_ffn = shared * s.expert_ffn.front();
  if (s.shared_ffn > MoeBounds::ffn)
    moe.child("shared_experts").fail(w + "shared_experts: shared_experts x expert_ffn above " + str(MoeBounds::ffn));
  const std::string router = moe.get_string("router", "softmax");
  if (router != "softmax" && router != "sigmoid") moe.child("router").fail(w + "router: '" + router + "' (softmax | sigmoid)");
  s.router.score = kernels::parse_router_score(router);
  s.router.normalize = moe.get_bool("normalize", true);
  s.router.scale = moe.get_double_in("scale", 1e-6, 1e6, 1.0);
  c.bias_update = moe.get_double_in("bias_update", 0, 1, 0.0);
  if (c.bias_update > 0) s.router.bias.assign(size_t(s.router.experts), 0.0f);
  s.capacity.factor = moe.get_double_in("capacity_factor", 0, double(MoeBounds::experts), 0.0);
  const std::string policy = moe.get_string("drop_policy", "probs");
  if (policy != "probs" && policy != "position")
    moe.child("drop_policy").fail(w + "drop_policy: '" + policy + "' (probs | position)");
  s.capacity.policy = kernels::parse_drop_policy(policy);
  s.aux_coef = moe.get_double_in("aux_loss_coef", 0, 1e3, 0.0);
  c.dense_layers = moe.get_int_in("dense_layers", 0, model.layers, 0);
  c.layer_step = moe.get_int_in("layer_step", 1, std::max<int64_t>(model.layers, 1), 1);
  const std::string routing = moe.get_string("routing", "uniform");
  if (routing != "uniform" && routing != "zipf" && routing != "histogram")
    moe.child("routing").fail(w + "routing: '" + routing + "' (uniform | zipf | histogram)");
  c.routing.skew = routing == "zipf" ? moe.get_double_in("skew", 0, 100, 1.0) : 0.0;
  if (routing != "zipf" && moe.has("skew")) moe.child("skew").fail(w + "skew: only used with routing: zipf");
  c.routing.seed = uint64_t(moe.get_int_in("routing_seed", 0, INT64_MAX, int64_t(model.seed)));
  if (routing == "histogram" && !moe.has("routing_file"))
    moe.child("routing").fail(w + "routing: histogram needs model.moe.routing_file (a CSV: layer,expert,tokens)");
  if (routing != "histogram" && moe.has("routing_file"))
    moe.child("routing_file").fail(w + "routing_file: only used with routing: histogram");
  s.router.groups = moe.get_int_in("expert_groups", 1, s.router.experts, 1);
  if (s.router.experts % s.router.groups != 0)
    moe.child("expert_groups").fail(w + "expert_groups: " + str(s.router.experts) + " experts do not split into " +
                                    str(s.router.groups) + " equal groups");
  const int64_t per_group = s.router.experts / s.router.groups;
  s.router.group_limit = moe.get_int_in("group_limit", 0, s.router.groups, 0);
  if (s.router.group_limit > 0 && s.router.top_k > s.router.group_limit * per_group)
    moe.child("group_limit").fail(w + "group_limit: top_k " + str(s.router.top_k) + " needs more than the " +
                                  str(s.router.group_limit * per_group) + " experts of " + str(s.router.group_limit) +
                                  " groups");
  s.router.group_top = moe.get_int_in("group_top", 0, per_group, 0);
  if (moe.has("group_top") && !s.router.group_limited())
    moe.child("group_top").fail(w + "group_top: only used with 0 < group_limit < expert_groups");
  const std::string placement = moe.get_string("placement", "contiguous");
  if (placement != "contiguous" && placement != "balanced")
    moe.child("placement").fail(w + "placement: '" + placement + "' (contiguous | balanced)");
  c.balance_placement = placement == "balanced";
  if (c.balance_placement && std::adjacent_find(s.expert_ffn.begin(), s.expert_ffn.end(), std::not_equal_to<>()) !=
                                 s.expert_ffn.end())
    moe.child("placement").fail(w + "placement: balanced moves experts between chips: it needs experts of one "
                                "inner size (model.moe.expert_ffn lists several)");
  if (routing == "histogram") c.routing.histogram = read_routing_histogram(moe, c, model.layers);
  return c;
}

std::string moe_text(const kernels::MoeConfig& c) {
  const kernels::MoeSpec& s = c.spec;
  std::ostringstream o;
  o << "moe " << s.experts() << " experts top-" << s.router.top_k << " (expert ffn " << s.expert_ffn.front();
  bool uniform = true;
  for (int64_t f : s.expert_ffn) uniform = uniform && f == s.expert_ffn.front();
  if (!uniform) o << " .. (per expert)";
  if (s.shared_ffn > 0) o << ", shared ffn " << s.shared_ffn;
  o << ", " << kernels::router_score_name(s.router.score) << " router";
  if (s.capacity.factor > 0)
    o << ", capacity factor " << s.capacity.factor << " (" << kernels::drop_policy_name(s.capacity.policy) << ")";
  else o << ", dropless";
  if (s.aux_coef > 0) o << ", aux loss " << s.aux_coef;
  if (s.router.group_limited())
    o << ", node-limited: " << s.router.group_limit << " of " << s.router.groups << " expert groups";
  if (c.balance_placement) o << ", placement by load";
  if (c.dense_layers > 0) o << ", first " << c.dense_layers << " layers dense";
  if (c.layer_step > 1) o << ", every " << c.layer_step << "th layer";
  o << ")";
  return o.str();
}

void split_capacity_over_chips(kernels::CapacityOptions& c, int64_t seq, int64_t seqs, int cp, bool zigzag, int sp_tp) {
  c.split = 1;
  c.order.clear();
  if (c.factor <= 0 || (cp <= 1 && sp_tp <= 1)) return;
  std::vector<int64_t> order;
  order.reserve(size_t(seq * seqs));
  for (int r = 0; r < cp; ++r) {  // cp rank r's rows: its chunks of every sequence, in its local row order
    const TokenLayout l = token_layout(seq, seqs, cp, r, zigzag && cp > 1);
    for (size_t i = 0; i < l.pos.size(); ++i) order.push_back(int64_t(i) / l.seq_local * seq + l.pos[i]);
  }
  const int64_t pieces = int64_t(std::max(cp, 1)) * std::max(sp_tp, 1);
  if (int64_t(order.size()) != seq * seqs || order.size() % size_t(pieces) != 0)
    throw std::invalid_argument("model.moe.capacity_factor: " + std::to_string(seqs) + " sequences of " +
                                std::to_string(seq) + " tokens do not split evenly over " + std::to_string(pieces) +
                                " chips");
  c.split = pieces;  // sp: tp rank t holds the t-th slice of its cp rank's rows, so the order is already piece-major
  c.order = std::move(order);
}

std::string ep_obstacle(int64_t experts, int ep) {
  if (ep >= 1 && experts % ep == 0) return "";
  return std::to_string(experts) + " experts do not split over ep = " + std::to_string(ep) +
         " (model.moe.experts must be a multiple of parallel.ep)";
}

namespace {

// The registry's test model with four experts of inner size 8, top-2 (tests/unit/plan_registry_test.cpp).
std::string moe_case(const std::string& par, const std::string& ffn = "8") {
  return "model: {vocab: 32, hidden: 16, layers: 2, heads: 4, kv_heads: 2, head_dim: 4, ffn: 32, seq: 8, batch: 4, "
         "moe: {experts: 4, top_k: 2, expert_ffn: " + ffn + "}}\nparallel: {" + par + "}\n";
}

void needs_moe(const PlanParse& c, const char* key) {
  if (!c.model.moe) c.fail(key, "needs model.moe (expert parallelism shards a mixture-of-experts model's experts)");
}

}  // namespace

PlanDescriptor ep_plan_descriptor() {
  PlanDescriptor d;
  d.name = "ep";
  d.title = "expert parallel";
  d.summary = "the routed experts of model.moe sharded over the mesh's ep axis (between cp and dp): tokens "
              "dispatched to their experts' chips and combined back by all_to_allv, the shared experts overlapping "
              "the dispatch; for attention ep is one more data-parallel axis; expert gradients averaged over dp, "
              "the router's and the dense weights' over dp x ep (sharding/plans/expert_parallel.h)";
  d.axis = "ep";
  d.size = &ParallelPlan::ep;
  d.keys = {{"ep", PlanValue::size, kPlanSizes, "1", "expert-parallel size (divides model.moe.experts)", true}};
  d.read = [](const PlanParse& c, ParallelPlan& p) {
    if (p.ep > 1) needs_moe(c, "ep");
    // A MoE layer routes each chip's rows of its micro-batch: the tp group's replicated rows, or with sp, cp or
    // Ulysses the chip's share of the sequence (capacity over those rows), the aux loss then over the sequence's
    // chips (EpGroups::span).
  };
  d.check = [](const PlanParse& c, const ParallelPlan& p) {
    if (p.ep == 1) return;
    const std::string why = ep_obstacle(c.model.moe->spec.experts(), p.ep);
    if (!why.empty()) c.fail("ep", why);
    // For attention ep is one more data-parallel axis: the batch splits over dp x ep replicas.
    const ModelSpec& s = c.model;
    const int64_t replicas = int64_t{p.dp} * p.ep;
    if (c.train() && s.batch % replicas != 0)
      c.fail("ep", "the global batch (model.batch " + std::to_string(s.batch) + " sequences) must be a multiple of "
                   "dp x ep (" + std::to_string(replicas) + ": each ep rank holds its own sequences)");
    if (c.train() && s.micro_batch > 0 && (s.batch / replicas) % s.micro_batch != 0)
      c.fail("ep", "model.micro_batch " + std::to_string(s.micro_batch) + " must divide the " +
                   std::to_string(s.batch / replicas) + " sequences of each dp x ep replica");
  };
  d.text = [](const ModelSpec& s, const ParallelPlan& p, bool train) {
    const int64_t e = s.moe ? s.moe->spec.experts() : 0;
    return "expert parallel ep=" + std::to_string(p.ep) + " (" + std::to_string(e / p.ep) +
           " experts per chip; tokens dispatched and combined by all_to_allv over ep" +
           (train ? "; expert gradients averaged over dp, the others over dp x ep)" : ")");
  };
  d.example = {moe_case("ep: 2"), SpecUse::train, 2, ""};
  d.bad_cases = {{moe_case("ep: 3"), SpecUse::train, 3, "ep"},
                 {"model: {vocab: 32, hidden: 16, layers: 2, heads: 4, kv_heads: 2, head_dim: 4, ffn: 32, seq: 8, "
                  "batch: 4}\nparallel: {ep: 2}\n", SpecUse::train, 2, "ep"}};
  return d;
}

PlanDescriptor etp_plan_descriptor() {
  PlanDescriptor d;
  d.name = "etp";
  d.title = "expert tensor parallel";
  d.summary = "every expert's (and the shared experts') inner size split over the tp group, the experts' partial "
              "outputs summed by one all_reduce (Megatron-Core's --expert-tensor-parallel-size); 1: the experts "
              "whole on every tp chip (sharding/plans/expert_parallel.h)";
  d.keys = {{"etp", PlanValue::choice, "1 | tp (or tp's size)", "1", "expert tensor-parallel size (on the tp chips)",
             true}};
  d.needs = {"tp"};
  d.active = [](const ParallelPlan& p) { return p.etp > 1; };
  d.read = [](const PlanParse& c, ParallelPlan& p) {
    if (!c.has("etp")) return;
    // `tp` (the tp group's size, as help writes the choice) or the size itself.
    p.etp = c.par.get_string("etp") == "tp" ? p.tp : static_cast<int>(c.par.get_int_in("etp", 1, SpecBounds::axis, 1));
    if (p.etp == 1) return;
    needs_moe(c, "etp");
    if (p.etp != p.tp)
      c.fail("etp", std::to_string(p.etp) + " is neither 1 nor tp (" + std::to_string(p.tp) +
                        "): the experts' tensor-parallel group is the tp group");
  };
  d.check = [](const PlanParse& c, const ParallelPlan& p) {
    if (p.etp == 1) return;
    const kernels::MoeSpec& s = c.model.moe->spec;
    for (int64_t f : s.expert_ffn)
      if (f % p.etp != 0)
        c.fail("etp", "model.moe.expert_ffn " + std::to_string(f) + " is not a multiple of etp " +
                          std::to_string(p.etp) + " (whole columns per chip)");
    if (s.shared_ffn % p.etp != 0)
      c.fail("etp", "the shared experts' inner size " + std::to_string(s.shared_ffn) + " is not a multiple of etp " +
                        std::to_string(p.etp));
  };
  d.text = [](const ModelSpec&, const ParallelPlan& p, bool) {
    return "expert tensor parallel etp=" + std::to_string(p.etp) +
           " (experts' W_gate/W_up columns and W_down rows over tp; " +
           (p.sp ? "the tp group's rows sp all_gathered, the output etp reduce_scattered)"
                 : "etp all_reduce of the output)");
  };
  d.example = {moe_case("tp: 2, etp: tp"), SpecUse::train, 2, ""};
  d.bad_cases = {{moe_case("tp: 2, etp: 2", "[8, 8, 8, 7]"), SpecUse::train, 2, "etp"},
                 {moe_case("tp: 4, etp: 2"), SpecUse::train, 4, "etp"}};
  return d;
}

}  // namespace shardsim::sharding::plans
