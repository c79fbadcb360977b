// A disaggregated run's two groups of chips (apps/serve_server.h Phases): which world ranks prefill and which
// decode, each group's plan, and a replica's chips as a KV cache layout for models::kv_transfer.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "apps/serve_server.h"
#include "serving/config_keys.h"

namespace shardsim::apps::serve_detail {

namespace {

// Group rank of (tp T, ep E, dp D, pp S) in PLAN's mesh order (sharding/device_mesh.h: tp, cp, ep, dp, pp; serving
// runs cp 1).
int group_rank(const sharding::ParallelPlan& p, int t, int e, int d, int s) {
  return t + p.tp * (e + p.ep * (d + p.dp * s));
}

int chips_of(const sharding::ParallelPlan& p) { return p.tp * p.ep * p.dp * p.pp; }

}  // namespace

models::KvLayout ServeGroup::layout(int r, int e) const {
  models::KvLayout l{plan.tp, plan.pp, {}, plan.pp_layers};
  for (int s = 0; s < plan.pp; ++s)
    for (int t = 0; t < plan.tp; ++t) l.ranks.push_back(ranks.at(size_t(group_rank(plan, t, e, r, s))));
  return l;
}

std::vector<int> ServeGroup::replica_ranks(int r) const {
  std::vector<int> out;
  for (int s = 0; s < plan.pp; ++s)
    for (int e = 0; e < plan.ep; ++e)
      for (int t = 0; t < plan.tp; ++t) out.push_back(ranks.at(size_t(group_rank(plan, t, e, r, s))));
  return out;
}

std::string ServeGroup::describe() const {
  std::string out;
  for (const auto& [name, size] : {std::pair<const char*, int>{"tp", plan.tp}, {"pp", plan.pp}, {"ep", plan.ep},
                                   {"dp", plan.dp}})
    if (size > 1) out += (out.empty() ? "" : " x ") + std::string(name) + "=" + std::to_string(size);
  return out.empty() ? "tp=1" : out;
}

std::pair<int, int> Phases::of(int world_rank) const {
  for (int g = 0; g < 2; ++g) {
    const auto& r = group[g].ranks;
    const auto it = std::find(r.begin(), r.end(), world_rank);
    if (it != r.end()) return {g, int(it - r.begin())};
  }
  throw std::logic_error("serve: world rank " + std::to_string(world_rank) + " in neither group");
}

Phases phases_of_replicas(const sharding::DeviceMesh& mesh, const sharding::ParallelPlan& plan, int K) {
  Phases ph;
  for (int g = 0; g < 2; ++g) {
    ph.group[g].name = g == 0 ? "prefill" : "decode";
    ph.group[g].plan = plan;
    ph.group[g].plan.dp = g == 0 ? K : plan.dp - K;
    ph.group[g].first_replica = g == 0 ? 0 : K;
    ph.group[g].ranks.assign(size_t(chips_of(ph.group[g].plan)), -1);
  }
  for (int w = 0; w < mesh.size(); ++w) {
    const int d = mesh.coordinate("dp", w), g = d < K ? 0 : 1;
    ServeGroup& G = ph.group[g];
    G.ranks.at(size_t(group_rank(G.plan, mesh.coordinate("tp", w), mesh.coordinate("ep", w), d - G.first_replica,
                                 mesh.coordinate("pp", w)))) = w;
  }
  return ph;
}

Phases phases_of_plans(const sharding::ParallelPlan& prefill, const sharding::ParallelPlan& decode) {
  Phases ph;
  ph.per_phase = true;
  int next = 0;
  for (int g = 0; g < 2; ++g) {
    ServeGroup& G = ph.group[g];
    G.name = g == 0 ? "prefill" : "decode";
    G.plan = g == 0 ? prefill : decode;
    G.first_replica = g == 0 ? 0 : prefill.dp;
    for (int i = 0; i < chips_of(G.plan); ++i) G.ranks.push_back(next++);
  }
  return ph;
}

// serve.disaggregation.prefill and .decode (D's): each group's parallel: section by the one plan parser, in the
// serving mode, on as many chips as its axes take; together they take the launch's CHIPS, and the config has no
// parallel: of its own (each group's is its plan). Dense and MoE models (a group's ep: its sequences' caches on
// their ep chips, request id mod its ep).
std::pair<sharding::ParallelPlan, sharding::ParallelPlan> read_phase_plans(const ConfigNode& root, const ConfigNode& d,
                                                                      const sharding::ModelSpec& spec, int chips) {
  sharding::ParallelPlan plans[2];
  for (const char* g : {"prefill", "decode"})
    if (!d.has(g))
      d.fail(std::string("serve.disaggregation.") + g + ": missing (per-phase plans give both groups theirs: " +
             "prefill: {parallel: {...}} and decode: {parallel: {...}})");
  if (root.has("parallel"))
    root.child("parallel").fail("parallel: with serve.disaggregation.prefill and decode each group's plan is its own "
                                "parallel: section there; remove this one");
  int taken[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const std::string name = i == 0 ? "prefill" : "decode";
    const ConfigNode g = d.child(name);
    g.expect_keys(serving::kServeDisaggGroupKeys);
    if (!g.has("parallel")) g.fail("serve.disaggregation." + name + ".parallel: missing (the group's plan: tp, pp, dp)");
    const ConfigNode par = g.child("parallel");
    // The group's chips: the product of its axes (each 1 unless given; the parser checks them again).
    int64_t n = 1;
    for (const char* axis : {"tp", "cp", "ulysses", "ep", "dp", "pp"}) {
      if (par.is_map() && par.has(axis)) n *= par.get_int_in(axis, 1, sharding::SpecBounds::axis);
      if (n > chips)  // checked as it grows (six axes of up to 2^20 each would overflow)
        par.fail("serve.disaggregation." + name + ".parallel: " + std::to_string(n) + " chips or more, more than the " +
                 "launch's " + std::to_string(chips));
    }
    taken[i] = int(n);
    sharding::ModelSpec model = spec;
    model.batch = 0;  // serving's batches come from its scheduler (as models/executor_config.h reads a serve config)
    sharding::ParallelPlan p = sharding::parse_parallel_plan(g, model, sharding::SpecUse::train, n, false, false, true);
    plans[i] = p;
  }
  if (taken[0] + taken[1] != chips)
    d.fail("serve.disaggregation: the prefill group's plan takes " + std::to_string(taken[0]) + " chips and the decode "
           "group's " + std::to_string(taken[1]) + ": " + std::to_string(taken[0] + taken[1]) + ", but the launch has " +
           std::to_string(chips) + " (the groups split the launch's chips)");
  return {plans[0], plans[1]};
}

}  // namespace shardsim::apps::serve_detail
