// Prefill/decode disaggregation as it runs (docs/SERVING.md; DistServe, Zhong et al. OSDI 2024, arXiv 2401.09670;
// Splitwise, Patel et al. ISCA 2024): the prefill replicas' and the decode replicas' batches and the KV cache
// transfers between them are simulated together, in the order of their start times, on one simulated network:
// every chip's timeline runs on the run's clock (no reset between the groups), so a transfer's flow meets the
// iterations' collectives on the links and ports they share (the sender's port and route, the receiver's
// incoming links: sim/timeline.h) and each waits for the other as the flows booked first dictate.
//
// Exact shortcuts kept where nothing can meet: an iteration that starts after every flow booked on its replica's
// chips has ended (quiet) runs on a fresh timeline from its start, and takes a memoised shape's time when that also
// ends before the earliest flow that may still be booked on them (the horizon: a pending transfer, a prefill
// replica's next batch, the trace's next arrival); a repeated block period stops at the same bounds
// (models/lm_tp.h LmServeBatch).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <tuple>
#include <vector>

#include "apps/serve_server.h"
#include "common/error.h"

namespace shardsim::apps::serve_detail {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A pending event: its time, the request, the replica it comes from or goes to. Ordered by (time, request).
struct Pending {
  double t = 0;
  int64_t id = 0;
  int replica = 0;
  bool operator<(const Pending& o) const { return std::tie(t, id, replica) < std::tie(o.t, o.id, o.replica); }
};

// The lowest index of V's least element in [FROM, TO).
int argmin(const std::vector<double>& v, int from, int to) {
  int pick = from;
  for (int r = from + 1; r < to; ++r)
    if (v[size_t(r)] < v[size_t(pick)]) pick = r;
  return pick;
}

// The links replica R's iterations may use: every route between two of its chips, and its chips' links to and
// from the switches on those routes (in-switch collectives).
std::set<int> replica_links(const sharding::DeviceMesh& mesh, const topology::Topology& topo, int r) {
  std::vector<int> chips;
  for (int rank = 0; rank < mesh.size(); ++rank)
    if (mesh.coordinate("dp", rank) == r) chips.push_back(mesh.placement()[size_t(rank)]);
  std::set<int> links, switches;
  for (const int a : chips)
    for (const int b : chips)
      for (const int l : topo.route(a, b)) {
        links.insert(l);
        if (topo.is_switch(topo.link(l).dst)) switches.insert(topo.link(l).dst);
      }
  for (const int a : chips)
    for (const int l : topo.out_links(a)) {
      const int sw = topo.link(l).dst;
      if (!switches.count(sw)) continue;
      links.insert(l);
      for (const int back : topo.out_links(sw))
        if (topo.link(back).dst == a) links.insert(back);
    }
  return links;
}

// Whether a KV cache flow from a chip of replica FROM to its peer in replica TO (the same coordinates on every
// other axis) uses a link of either replica's iterations (else the transfers and the iterations never meet, and
// no shortcut needs to stop for them).
bool transfers_meet_iterations(const sharding::DeviceMesh& mesh, const topology::Topology& topo, int from, int to) {
  const std::set<int> a = replica_links(mesh, topo, from), b = replica_links(mesh, topo, to);
  auto peers = [&](int x, int y) {
    for (const auto& axis : mesh.axes())
      if (axis.name != "dp" && mesh.coordinate(axis.name, x) != mesh.coordinate(axis.name, y)) return false;
    return true;
  };
  for (int rank = 0; rank < mesh.size(); ++rank) {
    if (mesh.coordinate("dp", rank) != from) continue;
    for (int dst = 0; dst < mesh.size(); ++dst) {
      if (mesh.coordinate("dp", dst) != to || !peers(rank, dst)) continue;
      for (const int l : topo.route(mesh.placement()[size_t(rank)], mesh.placement()[size_t(dst)]))
        if (a.count(l) || b.count(l)) return true;
    }
  }
  return false;
}

}  // namespace

serving::ServeRun Server::disaggregated(const std::vector<serving::Request>& reqs, const DisaggOptions& o,
                                        Transfers& xfer) {
  const int K = o.prefill_replicas;
  const size_t n = reqs.size();
  const bool prefill = replica < K;
  std::vector<serving::Request> mine = reqs;
  if (prefill)
    for (auto& r : mine) r.output = 1;  // the prefill instance makes the first token
  runtime::Transport& dpt = mesh["dp"];
  const int ep = mesh.size("ep"), ep_rank = mesh.coordinate("ep", mesh.rank());
  // Known alike on every chip: each replica's next batch and the end of the flows booked on its chips, the
  // first tokens, the transfers waiting to start and the caches on their way.
  std::vector<double> ready(size_t(dp), kInf), quiet(size_t(dp), 0.0), first_token(n, 0.0);
  std::set<Pending> transfers, arrivals;
  size_t next = 0;          // the trace's next arrival
  int64_t round_robin = 0;  // transfers handed out round-robin so far
  double horizon = kInf, foreign_end_ns = -1;
  std::vector<int64_t> handled;  // the requests this replica prefilled or decoded
  serving::ServeRun run;
  bool meet = false;  // do the transfers share a link with the iterations at all (else they cannot delay each other)
  for (int p = 0; p < K && !meet; ++p)
    for (int d = K; d < dp && !meet; ++d) meet = transfers_meet_iterations(mesh, tl.topology(), p, d);

  // A batch on this replica's chips at START on the run's clock (see the header comment for the shortcuts).
  const serving::StageFn stage = [&](const std::vector<serving::BatchEntry>& batch,
                                     double start) -> std::vector<serving::StageSpan> {
    const bool alone = start >= quiet[size_t(replica)];  // no transfer booked on these chips reaches past START
    const bool clear = alone || !meet;                     // none that it can meet
    std::vector<int64_t> key = shape_key(batch);
    const auto it = memo.find(key);
    if (clear && it != memo.end() && start + it->second.back().end_s <= horizon) return it->second;
    if (alone) {  // the same as a fresh timeline from START, in the batch's launch mode
      tl.reset();
      set_launch_mode(graphed(batch));
    }
    models::LmServeBatch mb;
    mb.repeat_blocks = true;
    mb.origin_ns = start * 1e9;
    mb.quiet_after_ns = meet ? quiet[size_t(replica)] * 1e9 : 0.0;
    mb.horizon_ns = horizon < kInf ? horizon * 1e9 : 1e300;
    mb.foreign_end_ns = alone ? -1.0 : foreign_end_ns;
    for (const auto& b : batch) mb.seqs.push_back({b.request, b.past, b.rows});
    std::vector<serving::StageSpan> st;
    for (const sim::Span& sp : exec.serve_step(mb, kv).stages) st.push_back({sp.start * 1e-9, sp.end * 1e-9});
    ++simulated;
    if (!st.empty()) note_longest(batch, st.back().end_s);
    // Memoised only as it runs alone in its own launch mode (a batch whose start found flows in flight keeps the
    // timeline's mode: switching would drop them).
    if (clear && graph_now == graphed(batch) && !st.empty() && start + st.back().end_s <= horizon)
      memo.emplace(std::move(key), st);
    return st;
  };

  // Every lead's value at its replica's index (others V0), max-reduced over every chip.
  auto agree_max = [&](std::vector<double>& v, const char* what) {
    tp.allreduce(std::span<double>(v), runtime::Reduce::max, std::string("serve disaggregated: ") + what);
  };
  world.agree([&] {
    try {
      serving::PagedKvCache paged(cap);
      serving::Simulation sim(mine, sched, paged, stage);
      // The replicas with the fewest outstanding tokens in [FROM, TO) (IN_FLIGHT: each replica's caches on their
      // way, as tokens still to decode), the lowest on a tie.
      auto least_loaded = [&](int from, int to, const std::vector<double>& in_flight) {
        std::vector<double> load(size_t(dp), -kInf);
        if (lead) load[size_t(replica)] = double(sim.outstanding_tokens());
        agree_max(load, "outstanding tokens");
        for (int r = 0; r < dp; ++r) load[size_t(r)] += in_flight.empty() ? 0.0 : in_flight[size_t(r)];
        return argmin(load, from, to);
      };
      std::vector<int64_t> made;  // this prefill replica's first tokens since the last round (requests to decode)
      double made_at = 0;          // their time (the batch's end)
      // Round-robin arrivals are this prefill replica's own business: the next one it has not handed over.
      size_t own = size_t(replica);
      auto own_arrival = [&] {
        return prefill && !o.least_tokens && own < n ? reqs[own].arrival_s : kInf;
      };
      for (;;) {
        // Every replica's next batch (a prefill replica's next arrival, if earlier) and every prefill replica's
        // new first tokens, as its lead knows them.
        std::vector<double> v(size_t(dp + 2 * K), -kInf);
        if (lead) v[size_t(replica)] = -std::min(sim.next_ready(), own_arrival());
        if (lead && prefill) {
          v[size_t(dp + replica)] = double(made.size());
          v[size_t(dp + K + replica)] = made_at;
        }
        agree_max(v, "next batches");
        for (int r = 0; r < dp; ++r) ready[size_t(r)] = -v[size_t(r)];
        std::vector<size_t> offset(size_t(K) + 1, 0);
        for (int p = 0; p < K; ++p) offset[size_t(p) + 1] = offset[size_t(p)] + size_t(std::max(0.0, v[size_t(dp + p)]));
        if (offset.back() > 0) {
          std::vector<double> ids(offset.back(), 0.0);
          if (lead && prefill)
            for (size_t i = 0; i < made.size(); ++i) ids[offset[size_t(replica)] + i] = double(made[i]);
          agree_max(ids, "first tokens");
          for (int p = 0; p < K; ++p)
            for (size_t i = offset[size_t(p)]; i < offset[size_t(p) + 1]; ++i) {
              const int64_t id = int64_t(ids[i]);
              first_token[size_t(id)] = v[size_t(dp + K + p)];
              transfers.insert({first_token[size_t(id)], id, p});
            }
        }
        made.clear();
        const double t_arr = o.least_tokens && next < n ? reqs[next].arrival_s : kInf;  // a balanced arrival
        const double t_dec = arrivals.empty() ? kInf : arrivals.begin()->t;
        const double t_xfer = transfers.empty() ? kInf : transfers.begin()->t;
        const double t_it = *std::min_element(ready.begin(), ready.end());
        if (std::min({t_arr, t_dec, t_xfer, t_it}) == kInf) break;
        if (t_arr <= std::min({t_dec, t_xfer, t_it})) {  // a request arrives at a prefill replica
          const int64_t id = reqs[next++].id;
          const int to = o.least_tokens ? least_loaded(0, K, {}) : int(id % K);
          if (replica == to) {
            sim.arrive(id);
            handled.push_back(id);
          }
        } else if (t_xfer <= std::min(t_dec, t_it)) {  // a prefill ended: its cache goes to a decode replica
          const Pending x = *transfers.begin();
          transfers.erase(transfers.begin());
          std::vector<double> in_flight(size_t(dp), 0.0);
          for (const Pending& a : arrivals) in_flight[size_t(a.replica)] += double(reqs[size_t(a.id)].output);
          const int to = o.least_tokens ? least_loaded(K, dp, in_flight) : K + int(round_robin++ % (dp - K));
          const double bytes = double(reqs[size_t(x.id)].prompt) * cap.bytes_per_token;
          // One flow per chip pair (the same tp and pp coordinates): the sender books it from the prefill's end,
          // the receiver against the flows booked on its links before (sim/timeline.h).
          // With ep, the sequence's cache is on one ep chip of each replica (request id mod ep: data-parallel
          // attention, models/lm_tp.h LmServeBatch), so only that chip's pairs move it.
          const bool home = x.id % ep == ep_rank;
          std::vector<double> sent(2, 0.0);
          if (replica == x.replica && home) {
            const sim::Span s = tl.send("serve.kv_transfer", dpt.chip_of(to), bytes, x.t * 1e9);
            sent = {s.start, s.end};
            foreign_end_ns = std::max(foreign_end_ns, tl.end_time());
          }
          dpt.allreduce(std::span<double>(sent), runtime::Reduce::sum, "serve disaggregated: KV cache send");
          std::vector<double> at(2, 0.0);  // the cache's arrival, the sender's links free
          if (replica == to && home) at[0] = tl.receive(dpt.chip_of(x.replica), bytes, sent[0], sent[1]) * 1e-9;
          if (replica == x.replica && home) at[1] = sent[1] * 1e-9;
          tp.allreduce(std::span<double>(at), runtime::Reduce::max, "serve disaggregated: KV cache arrival");
          quiet[size_t(x.replica)] = std::max(quiet[size_t(x.replica)], at[1]);
          quiet[size_t(to)] = std::max(quiet[size_t(to)], at[0]);
          arrivals.insert({at[0], x.id, to});
          ++xfer.count;
          xfer.bytes += bytes;
          xfer.time_s.push_back(at[0] - x.t);
        } else {  // every replica on its own up to where anything can reach its chips or its scheduler
          const double h_prefill = *std::min_element(ready.begin(), ready.begin() + K);
          const double bound_dec = std::min({t_xfer, t_arr, h_prefill});  // no cache can arrive earlier
          if (prefill) {  // its arrivals and batches up to a balanced arrival and its own next transfer; it stops
                          // after a batch that makes first tokens to decode (their transfers come next)
            horizon = kInf;  // a prefill chip receives nothing
            double bound = t_arr;
            for (const Pending& x : transfers)
              if (x.replica == replica) bound = std::min(bound, x.t);
            while (made.empty()) {
              const double a = own_arrival(), b = sim.next_ready();
              if (std::min(a, b) >= bound) break;
              if (a <= b) {
                sim.arrive(reqs[own].id);
                handled.push_back(reqs[own].id);
                own += size_t(K);
                continue;
              }
              sim.step();
              for (const int64_t id : sim.finished_last())
                if (reqs[size_t(id)].output > 1) made.push_back(id);
              made_at = sim.last_end();
            }
          } else {  // its caches' arrivals and batches up to the earliest flow that may still come
            horizon = meet ? bound_dec : kInf;
            for (;;) {
              auto a = arrivals.begin();
              while (a != arrivals.end() && a->replica != replica) ++a;
              const double ta = a == arrivals.end() ? kInf : a->t, b = sim.next_ready();
              if (std::min(ta, b) >= bound_dec) break;
              if (ta <= b) {
                sim.arrive_prefilled(a->id, a->t, first_token[size_t(a->id)]);
                handled.push_back(a->id);
                arrivals.erase(a);
                continue;
              }
              sim.step();
            }
          }
          std::erase_if(arrivals, [&](const Pending& a) { return a.t < bound_dec; });  // as every decode replica did
        }
      }
      run = sim.finish();
    } catch (const std::invalid_argument& e) {
      throw UsageError(config_name + ": " + e.what());
    }
  });
  serving::ServeRun sub = run;  // this replica's requests only
  sub.requests.clear();
  for (const int64_t id : handled) sub.requests.push_back(run.requests[size_t(id)]);
  serving::ServeRun out = gather_replicas(tp, dp, replica, lead, sub, handled, n);
  for (size_t i = 0; i < n; ++i) {  // a decode replica's record (later in replica order) carries the prefill's first token
    out.requests[i].arrival_s = reqs[i].arrival_s;
    out.requests[i].output = reqs[i].output;
  }
  return out;
}

}  // namespace shardsim::apps::serve_detail
