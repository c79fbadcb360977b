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
std::set<int> replica_links(const Server& s, int r) {
  const topology::Topology& topo = s.tl.topology();
  const ServeGroup& G = s.phases->group[r < s.phases->group[1].first_replica ? 0 : 1];
  std::vector<int> chips;
  for (const int w : G.replica_ranks(r - G.first_replica)) chips.push_back(s.tp.chip_of(w));
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

// The messages of a KV cache transfer of request ID from prefill replica FROM to decode replica TO (their chips'
// layouts; with ep, a sequence's cache is on the ep chip of its request id mod ep in each group).
struct CacheRoute {
  models::KvLayout from, to;
  std::vector<models::KvMessage> messages;
};
CacheRoute cache_route(const Server& s, int from, int to, int64_t id) {
  const ServeGroup &P = s.phases->group[0], &D = s.phases->group[1];
  CacheRoute c{P.layout(from - P.first_replica, int(id % P.plan.ep)), D.layout(to - D.first_replica, int(id % D.plan.ep)), {}};
  c.messages = models::kv_transfer_messages(s.layers, s.kv_heads, s.head_dim, s.element_bytes, c.from, c.to);
  return c;
}

// Whether a KV cache message from a chip of replica FROM to one of replica TO uses a link of either replica's
// iterations (else the transfers and the iterations never meet, and no shortcut needs to stop for them).
bool transfers_meet_iterations(const Server& s, int from, int to) {
  const std::set<int> a = replica_links(s, from), b = replica_links(s, to);
  const int eps = std::max(s.phases->group[0].plan.ep, s.phases->group[1].plan.ep);
  for (int e = 0; e < eps; ++e)
    for (const models::KvMessage& m : cache_route(s, from, to, e).messages)
      for (const int l : s.tl.topology().route(s.tp.chip_of(m.from), s.tp.chip_of(m.to)))
        if (a.count(l) || b.count(l)) return true;
  return false;
}

}  // namespace

// One disaggregated run on this chip (Server::disaggregated): what every chip knows alike (each replica's next
// batch and the end of the flows booked on its chips, the first tokens, the transfers waiting to start and the
// caches on their way) and the steps of the event loop over it.
class DisaggRun {
 public:
  DisaggRun(Server& s, const std::vector<serving::Request>& reqs, const DisaggOptions& o, Transfers& xfer);
  // Runs the trace; this replica's run and the requests it prefilled or decoded (handled()).
  serving::ServeRun run();
  const std::vector<int64_t>& handled() const { return handled_; }

 private:
  // One KV cache on its way: request X.id's cache from prefill replica X.replica to decode replica TO.
  struct Move {
    Pending x;
    int to = 0;
  };

  std::vector<serving::StageSpan> stage(const std::vector<serving::BatchEntry>& batch, double start);
  void agree_max(std::vector<double>& v, const char* what);
  int least_loaded(int from, int to, const std::vector<double>& in_flight);
  double own_arrival() const;
  void agree_next();
  void transfer();
  void send_and_receive(const std::vector<Move>& moves);
  void advance_prefill(double t_arr);
  void advance_decode(double bound_dec);

  Server& s_;
  const std::vector<serving::Request>& reqs_;
  const DisaggOptions& o_;
  Transfers& xfer_;
  const int K_, dp_;
  const size_t n_;
  const bool prefill_;
  std::vector<double> ready_, quiet_, first_token_;
  std::set<Pending> transfers_, arrivals_;
  size_t next_ = 0;          // the trace's next arrival
  int64_t round_robin_ = 0;  // transfers handed out round-robin so far
  double horizon_ = kInf, foreign_end_ns_ = -1;
  std::vector<int64_t> handled_;
  bool meet_ = false;  // do the transfers share a link with the iterations at all (else they cannot delay each other)
  serving::Simulation* sim_ = nullptr;
  std::vector<int64_t> made_;  // this prefill replica's first tokens since the last round (requests to decode)
  double made_at_ = 0;         // their time (the batch's end)
  size_t own_ = 0;             // round-robin: this prefill replica's next arrival it has not handed over
};

DisaggRun::DisaggRun(Server& s, const std::vector<serving::Request>& reqs, const DisaggOptions& o, Transfers& xfer)
    : s_(s), reqs_(reqs), o_(o), xfer_(xfer), K_(o.prefill_replicas), dp_(s.dp), n_(reqs.size()),
      prefill_(s.replica < o.prefill_replicas), ready_(size_t(s.dp), kInf), quiet_(size_t(s.dp), 0.0),
      first_token_(reqs.size(), 0.0), own_(size_t(s.replica)) {
  for (int p = 0; p < K_ && !meet_; ++p)
    for (int d = K_; d < dp_ && !meet_; ++d) meet_ = transfers_meet_iterations(s, p, d);
}

// A batch on this replica's chips at START on the run's clock (see the header comment for the shortcuts).
std::vector<serving::StageSpan> DisaggRun::stage(const std::vector<serving::BatchEntry>& batch, double start) {
  const bool alone = start >= quiet_[size_t(s_.replica)];  // no transfer booked on these chips reaches past START
  const bool clear = alone || !meet_;                       // none that it can meet
  std::vector<int64_t> key = Server::shape_key(batch);
  const auto it = s_.memo.find(key);
  if (clear && it != s_.memo.end() && start + it->second.back().end_s <= horizon_) return it->second;
  if (alone) {  // the same as a fresh timeline from START, in the batch's launch mode
    s_.tl.reset();
    s_.set_launch_mode(s_.graphed(batch));
  } else if (s_.graph_now != s_.graphed(batch)) {
    ++xfer_.other_mode;  // flows in flight on the timeline: a switch would drop them, the batch keeps its mode
  }
  models::LmServeBatch mb;
  mb.repeat_blocks = true;
  mb.origin_ns = start * 1e9;
  mb.quiet_after_ns = meet_ ? quiet_[size_t(s_.replica)] * 1e9 : 0.0;
  mb.horizon_ns = horizon_ < kInf ? horizon_ * 1e9 : 1e300;
  mb.foreign_end_ns = alone ? -1.0 : foreign_end_ns_;
  for (const auto& b : batch) mb.seqs.push_back({b.request, b.past, b.rows});
  std::vector<serving::StageSpan> st;
  for (const sim::Span& sp : s_.exec.serve_step(mb, s_.kv).stages) st.push_back({sp.start * 1e-9, sp.end * 1e-9});
  ++s_.simulated;
  if (!st.empty()) s_.note_longest(batch, st.back().end_s);
  // Memoised only as it runs alone in its own launch mode (a batch whose start found flows in flight keeps the
  // timeline's mode: switching would drop them).
  if (clear && s_.graph_now == s_.graphed(batch) && !st.empty() && start + st.back().end_s <= horizon_)
    s_.memo.emplace(std::move(key), st);
  return st;
}

// Every lead's value at its replica's index (others V0), max-reduced over every chip.
void DisaggRun::agree_max(std::vector<double>& v, const char* what) {
  s_.tp.allreduce(std::span<double>(v), runtime::Reduce::max, std::string("serve disaggregated: ") + what);
}

// The replica with the fewest outstanding tokens in [FROM, TO) (IN_FLIGHT: each replica's caches on their way, as
// tokens still to decode), the lowest on a tie.
int DisaggRun::least_loaded(int from, int to, const std::vector<double>& in_flight) {
  std::vector<double> load(size_t(dp_), -kInf);
  if (s_.lead) load[size_t(s_.replica)] = double(sim_->outstanding_tokens());
  agree_max(load, "outstanding tokens");
  for (int r = 0; r < dp_; ++r) load[size_t(r)] += in_flight.empty() ? 0.0 : in_flight[size_t(r)];
  return argmin(load, from, to);
}

// Round-robin arrivals are a prefill replica's own business: the next one it has not handed over.
double DisaggRun::own_arrival() const {
  return prefill_ && !o_.least_tokens && own_ < n_ ? reqs_[own_].arrival_s : kInf;
}

// Every replica's next batch (a prefill replica's next arrival, if earlier) and every prefill replica's new first
// tokens, as its lead knows them: into ready_ and transfers_.
void DisaggRun::agree_next() {
  std::vector<double> v(size_t(dp_ + 2 * K_), -kInf);
  if (s_.lead) v[size_t(s_.replica)] = -std::min(sim_->next_ready(), own_arrival());
  if (s_.lead && prefill_) {
    v[size_t(dp_ + s_.replica)] = double(made_.size());
    v[size_t(dp_ + K_ + s_.replica)] = made_at_;
  }
  agree_max(v, "next batches");
  for (int r = 0; r < dp_; ++r) ready_[size_t(r)] = -v[size_t(r)];
  std::vector<size_t> offset(size_t(K_) + 1, 0);
  for (int p = 0; p < K_; ++p) offset[size_t(p) + 1] = offset[size_t(p)] + size_t(std::max(0.0, v[size_t(dp_ + p)]));
  if (offset.back() > 0) {
    std::vector<double> ids(offset.back(), 0.0);
    if (s_.lead && prefill_)
      for (size_t i = 0; i < made_.size(); ++i) ids[offset[size_t(s_.replica)] + i] = double(made_[i]);
    agree_max(ids, "first tokens");
    for (int p = 0; p < K_; ++p)
      for (size_t i = offset[size_t(p)]; i < offset[size_t(p) + 1]; ++i) {
        const int64_t id = int64_t(ids[i]);
        first_token_[size_t(id)] = v[size_t(dp_ + K_ + p)];
        transfers_.insert({first_token_[size_t(id)], id, p});
      }
  }
  made_.clear();
}

// The prefills that ended at the earliest time: each cache goes to a decode replica (round-robin, or the one with
// the fewest outstanding tokens counting the caches already on their way, this round's included).
void DisaggRun::transfer() {
  const double t = transfers_.begin()->t;
  std::vector<double> in_flight(size_t(dp_), 0.0);
  for (const Pending& a : arrivals_) in_flight[size_t(a.replica)] += double(reqs_[size_t(a.id)].output);
  std::vector<Move> moves;
  while (!transfers_.empty() && transfers_.begin()->t == t) {
    const Pending x = *transfers_.begin();
    transfers_.erase(transfers_.begin());
    const int to = o_.least_tokens ? least_loaded(K_, dp_, in_flight) : K_ + int(round_robin_++ % (dp_ - K_));
    in_flight[size_t(to)] += double(reqs_[size_t(x.id)].output);
    moves.push_back({x, to});
  }
  send_and_receive(moves);
}

// MOVES (every cache whose prefill ended at one time) as one exchange of the network model, each through
// models::kv_transfer between its prefill replica's and its decode replica's layouts (one message per chip pair
// whose layers and KV heads meet; equal plans: each chip to its peer with the same tp and pp coordinates), every
// sender booking its messages from the prefill's end, every receiver against the flows booked on its links before
// (sim/timeline.h); when flows of two or more senders meet on a link (two prefill replicas' caches into one decode
// chip), every flow of the exchange shares its links' bandwidth (StepShare, as the collectives' crossing flows do)
// instead of queueing behind the other. With ep, a sequence's cache is on the ep chip of its request id mod ep in
// each group (data-parallel attention, models/lm_tp.h LmServeBatch), so only that chip's pairs move it.
void DisaggRun::send_and_receive(const std::vector<Move>& moves) {
  const size_t g = moves.size();
  std::vector<CacheRoute> routes;
  std::vector<std::pair<int, int>> pairs;
  for (const Move& m : moves) {
    routes.push_back(cache_route(s_, m.x.replica, m.to, m.x.id));
    for (const models::KvMessage& x : routes.back().messages) pairs.emplace_back(s_.tp.chip_of(x.from), s_.tp.chip_of(x.to));
  }
  sim::StepShare share;
  if (g > 1) share = sim::StepShare::make(s_.tl.topology(), pairs);
  std::vector<double> at(2 * g, 0.0);  // each cache's arrival, its senders' links free
  const int me = s_.tp.rank();
  s_.tl.begin_step(g > 1 ? &share : nullptr);
  for (size_t i = 0; i < g; ++i) {
    const CacheRoute& c = routes[i];
    const int64_t id = moves[i].x.id;
    const sim::TimeNs t = models::kv_transfer(s_.tp, s_.kv, s_.layers, s_.kv_heads, c.from, c.to,
                                              {id, id, reqs_[size_t(id)].prompt, moves[i].x.t * 1e9});
    const auto in = [me](const models::KvLayout& l) { return std::count(l.ranks.begin(), l.ranks.end(), me) > 0; };
    if (in(c.to)) at[2 * i] = t * 1e-9;
    if (in(c.from)) {
      at[2 * i + 1] = t * 1e-9;
      foreign_end_ns_ = std::max(foreign_end_ns_, t);
    }
  }
  s_.tl.end_step();
  s_.tp.allreduce(std::span<double>(at), runtime::Reduce::max, "serve disaggregated: KV cache arrival");
  for (size_t i = 0; i < g; ++i) {
    const Move& m = moves[i];
    quiet_[size_t(m.x.replica)] = std::max(quiet_[size_t(m.x.replica)], at[2 * i + 1]);
    quiet_[size_t(m.to)] = std::max(quiet_[size_t(m.to)], at[2 * i]);
    arrivals_.insert({at[2 * i], m.x.id, m.to});
    double bytes = 0;
    for (const models::KvMessage& x : routes[i].messages) bytes += x.bytes_per_token * double(reqs_[size_t(m.x.id)].prompt);
    ++xfer_.count;
    xfer_.total_bytes += bytes;
    xfer_.pairs = int64_t(routes[i].messages.size());
    xfer_.bytes += bytes / double(std::max<size_t>(routes[i].messages.size(), 1));
    xfer_.time_s.push_back(at[2 * i] - m.x.t);
  }
}

// A prefill replica's arrivals and batches up to a balanced arrival (T_ARR) and its own next transfer; it stops
// after a batch that makes first tokens to decode (their transfers come next).
void DisaggRun::advance_prefill(double t_arr) {
  horizon_ = kInf;  // a prefill chip receives nothing
  double bound = t_arr;
  for (const Pending& x : transfers_)
    if (x.replica == s_.replica) bound = std::min(bound, x.t);
  while (made_.empty()) {
    const double a = own_arrival(), b = sim_->next_ready();
    if (std::min(a, b) >= bound) break;
    if (a <= b) {
      sim_->arrive(reqs_[own_].id);
      handled_.push_back(reqs_[own_].id);
      own_ += size_t(K_);
      continue;
    }
    sim_->step();
    for (const int64_t id : sim_->finished_last())
      if (reqs_[size_t(id)].output > 1) made_.push_back(id);
    made_at_ = sim_->last_end();
  }
}

// A decode replica's caches' arrivals and batches up to BOUND_DEC (no cache can arrive earlier).
void DisaggRun::advance_decode(double bound_dec) {
  horizon_ = meet_ ? bound_dec : kInf;
  for (;;) {
    auto a = arrivals_.begin();
    while (a != arrivals_.end() && a->replica != s_.replica) ++a;
    const double ta = a == arrivals_.end() ? kInf : a->t, b = sim_->next_ready();
    if (std::min(ta, b) >= bound_dec) break;
    if (ta <= b) {
      sim_->arrive_prefilled(a->id, a->t, first_token_[size_t(a->id)]);
      handled_.push_back(a->id);
      arrivals_.erase(a);
      continue;
    }
    sim_->step();
  }
}

serving::ServeRun DisaggRun::run() {
  std::vector<serving::Request> mine = reqs_;
  if (prefill_)
    for (auto& r : mine) r.output = 1;  // the prefill instance makes the first token
  serving::PagedKvCache paged(s_.cap);
  serving::Simulation sim(mine, s_.sched, paged,
                          [this](const std::vector<serving::BatchEntry>& b, double start) { return stage(b, start); });
  sim_ = &sim;
  for (;;) {
    agree_next();
    const double t_arr = o_.least_tokens && next_ < n_ ? reqs_[next_].arrival_s : kInf;  // a balanced arrival
    const double t_dec = arrivals_.empty() ? kInf : arrivals_.begin()->t;
    const double t_xfer = transfers_.empty() ? kInf : transfers_.begin()->t;
    const double t_it = *std::min_element(ready_.begin(), ready_.end());
    if (std::min({t_arr, t_dec, t_xfer, t_it}) == kInf) break;
    if (t_arr <= std::min({t_dec, t_xfer, t_it})) {  // a request arrives at a prefill replica
      const int64_t id = reqs_[next_++].id;
      const int to = o_.least_tokens ? least_loaded(0, K_, {}) : int(id % K_);
      if (s_.replica == to) {
        sim.arrive(id);
        handled_.push_back(id);
      }
    } else if (t_xfer <= std::min(t_dec, t_it)) {  // prefills ended: their caches go to decode replicas
      transfer();
    } else {  // every replica on its own up to where anything can reach its chips or its scheduler
      const double h_prefill = *std::min_element(ready_.begin(), ready_.begin() + K_);
      const double bound_dec = std::min({t_xfer, t_arr, h_prefill});  // no cache can arrive earlier
      if (prefill_)
        advance_prefill(t_arr);
      else
        advance_decode(bound_dec);
      std::erase_if(arrivals_, [&](const Pending& a) { return a.t < bound_dec; });  // as every decode replica did
    }
  }
  serving::ServeRun out = sim.finish();
  sim_ = nullptr;
  return out;
}

serving::ServeRun Server::disaggregated(const std::vector<serving::Request>& reqs, const DisaggOptions& o,
                                        Transfers& xfer) {
  DisaggRun d(*this, reqs, o, xfer);
  serving::ServeRun run;
  world.agree([&] {
    try {
      run = d.run();
    } catch (const std::invalid_argument& e) {
      throw UsageError(config_name + ": " + e.what());
    }
  });
  std::vector<double> other{lead ? double(xfer.other_mode) : 0.0};  // every replica's, on every chip
  tp.allreduce(std::span<double>(other), runtime::Reduce::sum, "serve disaggregated: launch modes");
  xfer.other_mode = int64_t(other[0]);
  serving::ServeRun sub = run;  // this replica's requests only
  sub.requests.clear();
  for (const int64_t id : d.handled()) sub.requests.push_back(run.requests[size_t(id)]);
  serving::ServeRun out = gather_replicas(tp, dp, replica, lead, sub, d.handled(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {  // a decode replica's record (later in replica order) carries the prefill's first token
    out.requests[i].arrival_s = reqs[i].arrival_s;
    out.requests[i].output = reqs[i].output;
  }
  return out;
}

}  // namespace shardsim::apps::serve_detail
