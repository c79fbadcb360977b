// The control-plane collectives of chip mode (runtime/chips.h): over a VComm's members, hosted by this rank's
// scheduler (runtime/chips_sched.h) and the chip router's control-plane messages.
#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/error.h"
#include "runtime/chip_split.h"
#include "runtime/chips_sched.h"
#include "runtime/world.h"

namespace shardsim::runtime {

using namespace chips_detail;

namespace chips {

namespace {
// Folded run: the rank in C of each member's mirror in replica 0 (its own rank for a simulated member), or -1 for a
// member whose mirror is not in C (then nothing about it can be mirrored).
std::vector<int> mirror_ranks(const VComm& c) {
  std::vector<int> out(static_cast<size_t>(c.size()));
  std::unordered_map<int, int> rank_of;
  for (int r = 0; r < c.size(); ++r)
    if (g->simulated(c.member(r))) rank_of[c.member(r)] = r;
  for (int r = 0; r < c.size(); ++r) {
    auto it = rank_of.find(mirror_of(c.member(r)));
    out[static_cast<size_t>(r)] = it == rank_of.end() ? -1 : it->second;
  }
  return out;
}
bool has_mirrored(const VComm& c) {
  if (!g || !g->folded()) return false;
  for (int r = 0; r < c.size(); ++r)
    if (!g->simulated(c.member(r))) return true;
  return false;
}
}  // namespace

// Control plane of a folded run: a mirrored member contributes what its mirror in replica 0 contributes (the
// replicas are identical: docs/performance/fold.md) and is sent nothing. Member 0 (the root) must be simulated.
std::vector<unsigned char> allgather(const VComm& c, const void* mine, size_t n, const std::string& op) {
  const int me = c.member(c.rank);
  const uint64_t cx = c.ctx | kControl;
  const int root = c.member(0);
  const bool mirrored = has_mirrored(c);
  if (mirrored && !g->simulated(root)) fold_broken(op + ": a control-plane root outside replica 0");
  if (c.rank != 0) {
    static const unsigned char none = 0;
    post(cx, me, root, nullptr, 0, n ? mine : &none, n);
    size_t got = 0;
    wait_until([&] { return peek(cx, root, me, nullptr, 0, &got); }, op, {root});
    if (got != n * static_cast<size_t>(c.size()))  // the members disagree on N: the answer would overrun ALL
      throw std::logic_error(op + ": allgather: chip " + std::to_string(me) + " contributed " + std::to_string(n) +
                             " bytes, chip " + std::to_string(root) + " " + std::to_string(got / size_t(c.size())));
    // Allocated once the answer is here, not across the wait (every chip would hold chips x N bytes at once).
    std::vector<unsigned char> all(n * static_cast<size_t>(c.size()));
    take(cx, root, me, all.data());
    return all;
  }
  std::vector<unsigned char> all(n * static_cast<size_t>(c.size()));
  if (n) std::memcpy(all.data(), mine, n);
  for (int r = 1; r < c.size(); ++r) {
    const int src = c.member(r);
    if (!g->simulated(src)) continue;
    size_t got = 0;
    wait_until([&] { return peek(cx, src, me, nullptr, 0, &got); }, op, {src});
    if (got != n)  // every member contributes N bytes: a longer message would overrun ALL
      throw std::logic_error(op + ": allgather: chip " + std::to_string(src) + " contributed " + std::to_string(got) +
                             " bytes, chip " + std::to_string(me) + " " + std::to_string(n));
    take(cx, src, me, all.data() + static_cast<size_t>(r) * n);
  }
  if (mirrored) {
    const auto m = mirror_ranks(c);
    for (int r = 1; r < c.size(); ++r) {
      if (g->simulated(c.member(r))) continue;
      if (m[static_cast<size_t>(r)] < 0) fold_broken(op + ": a member whose mirror is not in its group");
      if (n) std::memcpy(all.data() + static_cast<size_t>(r) * n, all.data() + static_cast<size_t>(m[static_cast<size_t>(r)]) * n, n);
    }
  }
  // One shared copy for the receivers on this MPI rank (a folded run's replica holds thousands of them).
  const auto shared = std::make_shared<const std::vector<unsigned char>>(std::move(all));
  for (int r = 1; r < c.size(); ++r)
    if (g->simulated(c.member(r))) post_shared(cx, me, c.member(r), shared);
  return *shared;
}

std::shared_ptr<VComm> split(VComm& parent, int color, int key, const std::string& op, std::vector<int>* parent_ranks,
                             const ColorKeyOf& color_key_of) {
  std::vector<std::pair<int, int>> members;  // (key, parent rank)
  const bool mirrored = has_mirrored(parent);
  if (mirrored) {
    // Folded run: the mirrored members make no call; their (color, key) come from the caller's rule (the same
    // rule every member's own arguments follow: checked for this one).
    if (!color_key_of) fold_broken(op + ": a split over mirrored chips without a rule for their colors");
    if (color_key_of(parent.rank) != std::pair{color, key})
      throw RuntimeFault(op + ": the split's rule disagrees with this chip's own (color, key)");
    for (int r = 0; r < parent.size(); ++r)
      if (const auto [c, k] = color_key_of(r); c == color) members.emplace_back(k, r);
  } else {
    // Every member learns every (color, key).
    const int64_t mine = (static_cast<int64_t>(color) << 32) | static_cast<uint32_t>(key);
    const auto bytes = allgather(parent, &mine, sizeof mine, op);
    std::vector<int64_t> all(static_cast<size_t>(parent.size()));
    std::memcpy(all.data(), bytes.data(), bytes.size());
    for (int r = 0; r < parent.size(); ++r) {
      const int64_t v = all[static_cast<size_t>(r)];
      if (static_cast<int>(v >> 32) == color) members.emplace_back(static_cast<int>(static_cast<int32_t>(v)), r);
    }
  }
  std::stable_sort(members.begin(), members.end());
  auto vc = std::make_shared<VComm>();
  uint64_t h = parent.ctx ^ (0x9e3779b97f4a7c15ull * (parent.splits + 1)) ^ (static_cast<uint64_t>(color) << 20);
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  vc->ctx = (h ^ (h >> 31)) & ~kControl;
  ++parent.splits;
  std::vector<int> world_ranks;
  if (parent_ranks) parent_ranks->clear();
  for (const auto& [k, r] : members) {
    if (r == parent.rank) vc->rank = static_cast<int>(world_ranks.size());
    world_ranks.push_back(parent.member(r));
    if (parent_ranks) parent_ranks->push_back(r);
  }
  if (mirrored) {
    // A group with mirrored members must map onto itself under the shift by one replica: a message to a mirrored
    // member is delivered to its mirror under this group's context (post).
    const bool any = std::any_of(world_ranks.begin(), world_ranks.end(), [](int w) { return !g->simulated(w); });
    const std::unordered_set<int> in(world_ranks.begin(), world_ranks.end());
    if (any && !std::all_of(world_ranks.begin(), world_ranks.end(), [&](int w) { return in.count(g->shift(w, 1)) != 0; }))
      fold_broken(op + ": a group of simulated and mirrored chips that the replica shift does not map onto itself");
  }
  vc->members = shared_ints(std::move(world_ranks));
  return vc;
}

void reduce_to_all(const VComm& c, void* data, size_t n, const std::function<void(void*, const void*)>& combine,
                   const std::string& op) {
  const int me = c.member(c.rank);
  const uint64_t cx = c.ctx | kControl;
  const int root = c.member(0);
  unsigned char dummy = 0;
  void* buf = n ? data : &dummy;
  const bool mirrored = has_mirrored(c);
  if (mirrored && !g->simulated(root)) fold_broken(op + ": a control-plane root outside replica 0");
  if (c.rank != 0) {
    post(cx, me, root, nullptr, 0, buf, n);
    wait_until([&] { return peek(cx, root, me, nullptr, 0, nullptr); }, op, {root});
    take(cx, root, me, n ? data : nullptr);
    return;
  }
  // The root waits once for every (simulated) member's contribution: one resume, not one per member.
  {
    std::vector<int> peers;
    std::vector<std::pair<uint64_t, int>> missing;
    for (int r = 1; r < c.size(); ++r) {
      const int src = c.member(r);
      if (mirrored && !g->simulated(src)) continue;
      peers.push_back(src);
      if (!peek(cx, src, me, nullptr, 0, nullptr)) missing.push_back({cx, src});
    }
    wait_until_all(
        [&] {
          for (const int src : peers)
            if (!peek(cx, src, me, nullptr, 0, nullptr)) return false;
          return true;
        },
        op, peers, missing);
  }
  if (mirrored) {  // every contribution first (the mirrored ones copy a simulated one), then folded in member order
    const auto m = mirror_ranks(c);
    std::unordered_map<int, std::vector<unsigned char>> got;
    got[0].assign(static_cast<unsigned char*>(buf), static_cast<unsigned char*>(buf) + n);
    for (int r = 1; r < c.size(); ++r) {
      const int src = c.member(r);
      if (!g->simulated(src)) continue;
      auto& v = got[r];
      v.resize(n);
      take(cx, src, me, n ? v.data() : nullptr);
    }
    for (int r = 1; r < c.size(); ++r) {
      const int from = m[static_cast<size_t>(r)];
      if (from < 0) fold_broken(op + ": a member whose mirror is not in its group");
      if (n) combine(data, got.at(from).data());
    }
    for (int r = 1; r < c.size(); ++r)
      if (g->simulated(c.member(r))) post(cx, me, c.member(r), nullptr, 0, buf, n);
    return;
  }
  std::vector<unsigned char> other(n);
  for (int r = 1; r < c.size(); ++r) {
    take(cx, c.member(r), me, n ? other.data() : nullptr);
    if (n) combine(data, other.data());
  }
  for (int r = 1; r < c.size(); ++r) post(cx, me, c.member(r), nullptr, 0, buf, n);
}

std::vector<std::vector<unsigned char>> gather(const VComm& c, const void* mine, size_t n, int root,
                                               const std::string& op) {
  const int me = c.member(c.rank);
  const uint64_t cx = c.ctx | kControl;
  if (has_mirrored(c)) fold_broken(op + ": a gather over mirrored chips");
  std::vector<std::vector<unsigned char>> all;
  if (c.rank != root) {
    unsigned char dummy = 0;
    post(cx, me, c.member(root), nullptr, 0, n ? mine : &dummy, n);
    return all;
  }
  all.resize(static_cast<size_t>(c.size()));
  if (n) all[static_cast<size_t>(root)].assign(static_cast<const unsigned char*>(mine),
                                               static_cast<const unsigned char*>(mine) + n);
  for (int r = 0; r < c.size(); ++r) {
    if (r == root) continue;
    const int src = c.member(r);
    size_t bytes = 0;
    wait_until([&] { return peek(cx, src, me, nullptr, 0, &bytes); }, op, {src});
    auto& out = all[static_cast<size_t>(r)];
    out.resize(bytes);
    take(cx, src, me, bytes ? out.data() : nullptr);
  }
  return all;
}

void rank_handover(void* mine, const std::function<void(const std::vector<void*>&)>& fn, const std::string& op) {
  if (!g || g->cur < 0) throw std::logic_error("rank_handover: not on a chip fiber");
  const VComm& c = *g->locals.at(static_cast<size_t>(g->cur));
  // Each chip sends its pointer and the name of the hand-over it is in (chips that diverged are an error, never a
  // pointer taken for another kind of contribution).
  std::vector<unsigned char> me(sizeof mine + op.size());
  std::memcpy(me.data(), &mine, sizeof mine);
  std::memcpy(me.data() + sizeof mine, op.data(), op.size());
  const auto got = gather(c, me.data(), me.size(), 0, op);
  // The outcome, "" or "<class>:<exit code>:<message>", sent from slot 0 to the others.
  std::string outcome;
  if (c.rank == 0) {
    std::vector<void*> ptrs(got.size());
    char cls = 0;
    int code = 0;
    std::string what;
    for (size_t i = 0; i < got.size(); ++i) {
      std::memcpy(&ptrs[i], got[i].data(), sizeof(void*));
      const std::string theirs(got[i].begin() + sizeof(void*), got[i].end());
      if (theirs != op && !cls) {
        cls = 'R', code = kExitRuntimeFault;
        what = "internal error: chip " + std::to_string(c.member(static_cast<int>(i))) + " is in hand-over '" +
               theirs + "' while chip " + std::to_string(c.member(0)) + " is in '" + op + "'";
      }
    }
    try {
      if (!cls) fn(ptrs);
    } catch (const AgreedError& e) {
      cls = 'A', code = e.exit_code(), what = e.what();
    } catch (const ConfigError& e) {
      cls = 'C', code = e.exit_code(), what = e.what();
    } catch (const UsageError& e) {
      cls = 'U', code = e.exit_code(), what = e.what();
    } catch (const RuntimeFault& e) {
      cls = 'R', code = e.exit_code(), what = e.what();
    } catch (const Error& e) {
      cls = 'A', code = e.exit_code(), what = e.what();
    } catch (const std::exception& e) {
      cls = 'R', code = kExitRuntimeFault, what = std::string("internal error: ") + e.what();
    }
    if (cls) outcome = std::string(1, cls) + ":" + std::to_string(code) + ":" + what;
  }
  const auto out = broadcast(c, std::vector<unsigned char>(outcome.begin(), outcome.end()), 0, op);
  if (out.empty()) return;
  outcome.assign(out.begin(), out.end());
  const size_t colon = outcome.find(':', 2);
  const int code = std::atoi(outcome.substr(2, colon - 2).c_str());
  const std::string what = outcome.substr(colon + 1);
  switch (outcome[0]) {
    case 'C': throw ConfigError(what);
    case 'U': throw UsageError(what);
    case 'R': throw RuntimeFault(what);
    default: throw AgreedError(what, code);
  }
}

std::vector<unsigned char> broadcast(const VComm& c, const std::vector<unsigned char>& value, int root,
                                     const std::string& op) {
  const int me = c.member(c.rank);
  const uint64_t cx = c.ctx | kControl;
  const int rg = c.member(root);
  if (g->folded() && !g->simulated(rg)) fold_broken(op + ": a broadcast from a mirrored chip");
  if (c.rank == root) {
    const uint64_t len = value.size();
    for (int r = 0; r < c.size(); ++r)
      if (r != root && g->simulated(c.member(r))) post(cx, me, c.member(r), &len, sizeof len, value.data(), value.size());
    return value;
  }
  size_t bytes = 0;
  uint64_t len = 0;
  wait_until([&] { return peek(cx, rg, me, &len, sizeof len, &bytes); }, op, {rg});
  std::vector<unsigned char> out(len);
  take(cx, rg, me, out.data());
  return out;
}
}  // namespace chips

}  // namespace shardsim::runtime
