#include "runtime/transport.h"

#include <algorithm>
#include <array>
#include <bit>
#include <unordered_map>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <sched.h>

#include "common/error.h"
#include "runtime/dtype.h"
#include "runtime/chip_split.h"
#include "runtime/chips.h"
#include "runtime/engine.h"
#include "runtime/world.h"

namespace shardsim::runtime {

namespace {
constexpr int kHeaderTag = 7001;
constexpr int kPayloadTag = 7002;
constexpr size_t kPiece = size_t{1} << 30;  // bytes per MPI message: keeps counts within int

// FNV-1a over a sequence of 64-bit words.
struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void add(uint64_t v) {
    for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  }
  void add(double v) { add(std::bit_cast<uint64_t>(v)); }
};

// Chip mode: a key for a chip-level communicator's group (CTX and its rank -> chip map) on a topology (its links).
uint64_t group_key(uint64_t ctx, const topology::Topology& topo, const std::vector<int>& rank_to_chip) {
  Fnv f;
  f.add(ctx);
  f.add(static_cast<uint64_t>(topo.num_chips()));
  for (const auto& l : topo.links()) {
    f.add((static_cast<uint64_t>(static_cast<uint32_t>(l.src)) << 32) | static_cast<uint32_t>(l.dst));
    f.add(l.bandwidth_gbps);
    f.add(l.latency_ns);
  }
  for (char ch : topo.describe()) f.add(static_cast<uint64_t>(static_cast<unsigned char>(ch)));
  for (int c : rank_to_chip) f.add(static_cast<uint64_t>(static_cast<uint32_t>(c)));
  return f.h;
}

// Chip mode: a memo shared by the chips of this rank that are members of one group (they are fibers of one thread:
// no locking). What it holds depends only on the group and the topology's links (group_key), so chips whose
// topologies differ never share. Without this every chip of a rank would recompute it (O(chips^3) per rank for
// the auto choice).
template <class Memo>
std::shared_ptr<Memo> rank_memo(uint64_t key) {
  static std::unordered_map<uint64_t, std::weak_ptr<Memo>> memos;
  auto& slot = memos[key];
  auto memo = slot.lock();
  if (!memo) {
    if (memos.size() > 4096) std::erase_if(memos, [](const auto& kv) { return kv.second.expired(); });
    memo = std::make_shared<Memo>();
    memos[key] = memo;
  }
  return memo;
}
using ShareMemo = std::map<uint64_t, std::shared_ptr<const sim::StepShare>>;
}  // namespace

Transport::Transport(MPI_Comm comm, sim::Timeline& timeline, std::vector<int> rank_to_chip)
    : comm_(comm), timeline_(&timeline), rank_to_chip_(std::make_shared<const std::vector<int>>(std::move(rank_to_chip))) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  if (static_cast<int>(rank_to_chip_->size()) != size_)
    throw RuntimeFault("transport: rank_to_chip has " + std::to_string(rank_to_chip_->size()) +
                       " entries for a communicator of " + std::to_string(size_));
  rank_to_world_.resize(static_cast<size_t>(size_));
  std::vector<int> mine(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) mine[static_cast<size_t>(r)] = r;
  MPI_Group g, wg;
  MPI_Comm_group(comm_, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  MPI_Group_translate_ranks(g, size_, mine.data(), wg, rank_to_world_.data());
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
}

Transport::Transport(const World& world, sim::Timeline& timeline, std::vector<int> rank_to_chip)
    : comm_(world.comm()), timeline_(&timeline) {
  if (!world.vcomm()) {
    *this = Transport(world.comm(), timeline, std::move(rank_to_chip));
    return;
  }
  vc_ = world.vcomm();
  comm_ = MPI_COMM_NULL;
  rank_ = vc_->rank;
  size_ = vc_->size();
  if (static_cast<int>(rank_to_chip.size()) != size_)
    throw RuntimeFault("transport: rank_to_chip has " + std::to_string(rank_to_chip.size()) +
                       " entries for a communicator of " + std::to_string(size_) + " chips");
  rank_to_chip_ = chips::shared_ints(std::move(rank_to_chip));
  const uint64_t key = group_key(vc_->ctx, timeline.topology(), *rank_to_chip_);
  choices_ = rank_memo<ChoiceMemo>(key);
  shares_ = rank_memo<ShareMemo>(key);
}

Transport Transport::split(int color, int key, const std::function<std::pair<int, int>(int)>& color_key_of) const {
  if (vc_) {
    // Chip mode (runtime/chip_split.h): the new context is the same on every member of the group.
    std::vector<int> parent_ranks;
    auto vc = chips::split(*vc_, color, key, "communicator split", &parent_ranks, color_key_of);
    std::vector<int> chips;
    for (int r : parent_ranks) chips.push_back(chip_of(r));
    Transport t(*this);
    t.vc_ = vc;
    t.rank_ = vc->rank;
    t.size_ = vc->size();
    t.rank_to_chip_ = chips::shared_ints(std::move(chips));
    t.owned_.reset();
    t.engine_ = std::make_shared<std::shared_ptr<Engine>>();
    t.subgroups_ = std::make_shared<std::map<std::string, Transport>>();
    t.agree_ = std::make_shared<Agreement>();
    const uint64_t key = group_key(vc->ctx, timeline_->topology(), *t.rank_to_chip_);
    t.choices_ = rank_memo<ChoiceMemo>(key);
    t.shares_ = rank_memo<ShareMemo>(key);
    return t;
  }
  MPI_Comm sub = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm_, color, key, &sub), chip(), "communicator split");
  MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
  int n = 0;
  MPI_Comm_size(sub, &n);
  // The subgroup's rank -> chip map: every member contributes its chip.
  std::vector<int> chips(static_cast<size_t>(n));
  const int mine = chip();
  check_mpi(MPI_Allgather(&mine, 1, MPI_INT, chips.data(), 1, MPI_INT, sub), chip(), "communicator split");
  Transport t(sub, *timeline_, std::move(chips));
  t.owned_ = std::shared_ptr<MPI_Comm>(new MPI_Comm(sub), [](MPI_Comm* c) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(c);
    delete c;
  });
  t.bytes_sent_ = bytes_sent_;
  t.scratch_ = scratch_;
  t.observer_ = observer_;
  t.shape_only_ = shape_only_;
  t.plan_algorithms_ = plan_algorithms_;
  return t;
}

Transport Transport::duplicate(sim::Timeline& timeline) const {
  MPI_Comm dup = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(comm_, &dup), chip(), "communicator dup");
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  Transport t(dup, timeline, *rank_to_chip_);
  t.shape_only_ = shape_only_;
  t.plan_algorithms_ = plan_algorithms_;
  t.owned_ = std::shared_ptr<MPI_Comm>(new MPI_Comm(dup), [](MPI_Comm* c) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(c);
    delete c;
  });
  return t;
}

Engine& Transport::engine() {
  if (vc_)
    throw UsageError("chip " + std::to_string(chip()) + ": async collectives need one chip per rank "
                     "(--chips-per-rank 1)");
  if (!*engine_) *engine_ = std::make_shared<Engine>(*this);
  return **engine_;
}

unsigned char* Transport::scratch(int slot, size_t bytes) {
  if (*shape_only_) return nullptr;  // shape-only: no storage proportional to bytes
  auto& buf = scratch_->at(static_cast<size_t>(slot));
  if (buf.size() < bytes) {
    buf.clear();
    buf.shrink_to_fit();
    buf.resize(bytes);
  }
  return buf.data();
}

Transport& Transport::subgroup(const std::string& name, int color, int key,
                               const std::function<std::pair<int, int>(int)>& color_key_of) {
  auto it = subgroups_->find(name);
  if (it == subgroups_->end()) it = subgroups_->emplace(name, split(color, key, color_key_of)).first;
  return it->second;
}

bool Transport::spans_mirrored() const {
  if (!vc_ || !chips::folded()) return false;
  for (int r = 0; r < size_; ++r)
    if (!chips::simulated(vc_->member(r))) return true;
  return false;
}

void Transport::check_header(const Header& h, size_t bytes, int src, const std::string& op) const {
  const CallSignature& mine = SignatureScope::current();
  if (h.sig.collective >= 0 && mine.collective >= 0 && !(h.sig == mine)) {
    const char* field = h.sig.collective != mine.collective ? "collective"
                        : h.sig.count != mine.count         ? "count"
                        : h.sig.dtype != mine.dtype         ? "dtype"
                        : h.sig.op != mine.op               ? "op"
                        : h.sig.root != mine.root           ? "root"
                        : h.sig.shape_only != mine.shape_only ? "shape_only"
                                                            : "algorithm";
    auto value = [&](const CallSignature& s) -> std::string {
      if (std::string(field) == "count") return std::to_string(s.count);
      if (std::string(field) == "dtype") return dtype_name(static_cast<DType>(s.dtype));
      if (std::string(field) == "op") return std::to_string(s.op);
      if (std::string(field) == "root") return std::to_string(s.root);
      if (std::string(field) == "shape_only") return std::to_string(s.shape_only);
      if (std::string(field) == "collective") return "#" + std::to_string(s.collective);
      return "(another name)";
    };
    throw UsageError("chip " + std::to_string(chip()) + ": " + op + ": ranks disagree on " + field + ": chip " +
                     std::to_string(chip()) + " " + value(mine) + ", chip " + std::to_string(chip_of(src)) + " " +
                     value(h.sig) + " (every rank must call the collective with the same arguments)");
  }
  if (h.bytes != bytes && vc_ && !chips::simulated(vc_->member(src)))
    chips::fold_broken(op + ": " + std::to_string(bytes) + " bytes expected from mirrored chip " +
                       std::to_string(chip_of(src)) + ", its mirror sent " + std::to_string(h.bytes) +
                       " (chunks that differ by rank)");
  if (h.bytes != bytes)
    throw UsageError("chip " + std::to_string(chip()) + ": " + op + ": expected " + std::to_string(bytes) +
                     " bytes from chip " + std::to_string(chip_of(src)) + ", got " + std::to_string(h.bytes) +
                     " (counts differ across ranks?)");
}

void Transport::exchange_chips(std::span<const SendOp> sends, std::span<RecvOp> recvs, const std::string& op) {
  // Chip mode: the same bookings and headers as the MPI path, carried by the chip router (runtime/chips.h).
  const CallSignature& sig = SignatureScope::current();
  const int me = vc_->member(rank_);
  for (const SendOp& s : sends) {
    const sim::Span span = s.timed ? timeline_->send(op, chip_of(s.dst), static_cast<double>(s.bytes), s.ready)
                                   : sim::Span{s.ready, s.ready};
    *bytes_sent_ += s.dst == rank_ || !s.timed ? 0.0 : static_cast<double>(s.bytes);
    const bool dep = timeline_->records_dependencies() && s.dst != rank_ && s.timed;
    const Header h{span.end, s.bytes, sig, span.start, dep ? timeline_->last_send_id() : 0,
                   dep ? timeline_->last_send_end() : -1.0};
    chips::post(vc_->ctx, me, vc_->member(s.dst), &h, sizeof h, *shape_only_ ? nullptr : s.buf,
                s.bytes);
  }
  const size_t nr = recvs.size();
  if (nr == 0) return;
  done_.assign(nr, 0);
  in_.resize(nr);
  size_t left = nr;
  auto poll = [&] {
    for (size_t i = 0; i < nr; ++i) {
      if (done_[i]) continue;
      RecvOp& r = recvs[i];
      const int src = vc_->member(r.src);
      Header h{};
      if (!chips::peek(vc_->ctx, src, me, &h, sizeof h, nullptr)) continue;
      check_header(h, r.bytes, r.src, op);
      chips::take(vc_->ctx, src, me, r.bytes && !*shape_only_ ? r.buf : nullptr);
      in_[i] = h;
      done_[i] = 1;
      --left;
    }
    return left == 0;
  };
  if (!poll()) {
    // On the stack for up to 8 receives (ring steps have 1 or 2): no allocation per wait.
    constexpr size_t kInline = 8;
    std::array<int, kInline> peers_inline;
    std::array<std::pair<uint64_t, int>, kInline> missing_inline;
    std::vector<int> peers_heap;
    std::vector<std::pair<uint64_t, int>> missing_heap;
    if (nr > kInline) {
      peers_heap.resize(nr);
      missing_heap.resize(nr);
    }
    int* peers = nr > kInline ? peers_heap.data() : peers_inline.data();
    auto* missing = nr > kInline ? missing_heap.data() : missing_inline.data();
    size_t nm = 0;
    for (size_t i = 0; i < nr; ++i) {
      peers[i] = vc_->member(recvs[i].src);
      if (!done_[i]) missing[nm++] = {vc_->ctx, peers[i]};
    }
    // One resume, when the last missing message is here.
    chips::wait_until_all(poll, op, std::span<const int>(peers, nr), std::span(missing, nm));
  }
  book_arrivals(recvs);
}

void Transport::book_arrivals(std::span<RecvOp> recvs) {
  const size_t nr = recvs.size();
  if (nr == 1) {  // the common case (ring steps): no sort
    const Header& h = in_[0];
    recvs[0].arrival = !recvs[0].timed ? h.arrival_ns
                                       : timeline_->receive(chip_of(recvs[0].src), static_cast<double>(h.bytes),
                                                            h.start_ns, h.arrival_ns, h.send_id, h.send_end_ns);
    return;
  }
  order_.resize(nr);
  for (size_t i = 0; i < nr; ++i) order_[i] = i;
  // By sender start; flows that start together by the sender's offset in the group, (src - me) mod p, then in
  // program order: an order every member of a rotation-symmetric pattern shares (ring neighbours r - 1 and r + 1
  // are offsets p - 1 and 1 on every member), so a replica shift keeps it (docs/performance/fold.md). The
  // estimates replay the same rule (collectives/cost/cost_model.cpp, Replay::flush).
  const int p = size_;
  std::stable_sort(order_.begin(), order_.end(), [&](size_t a, size_t b) {
    if (in_[a].start_ns != in_[b].start_ns) return in_[a].start_ns < in_[b].start_ns;
    return group_offset(recvs[a].src, rank_, p) < group_offset(recvs[b].src, rank_, p);
  });
  for (size_t i : order_) {
    const Header& h = in_[i];
    recvs[i].arrival = !recvs[i].timed ? h.arrival_ns
                                       : timeline_->receive(chip_of(recvs[i].src), static_cast<double>(h.bytes),
                                                            h.start_ns, h.arrival_ns, h.send_id, h.send_end_ns);
  }
}

template <class T>
void Transport::allreduce_impl(std::span<T> v, Reduce r, MPI_Datatype t, const std::string& op) {
  if (vc_) {  // folded in member order on member 0 (as before: element i = ((a_0 op a_1) op a_2) ...)
    const size_t n = v.size();
    chips::reduce_to_all(*vc_, v.data(), v.size_bytes(), [n, r](void* acc, const void* in) {
      T* x = static_cast<T*>(acc);
      const T* y = static_cast<const T*>(in);
      for (size_t i = 0; i < n; ++i)
        x[i] = r == Reduce::sum ? x[i] + y[i] : r == Reduce::max ? std::max(x[i], y[i]) : std::min(x[i], y[i]);
    }, op);
    return;
  }
  std::vector<T> out(v.size());
  const MPI_Op mop = r == Reduce::sum ? MPI_SUM : r == Reduce::max ? MPI_MAX : MPI_MIN;
  std::vector<MPI_Request> req(1);
  check_mpi(MPI_Iallreduce(v.data(), out.data(), static_cast<int>(v.size()), t, mop, comm_, req.data()), chip(), op);
  wait_requests(req, {-1}, op);
  std::copy(out.begin(), out.end(), v.begin());
}

void Transport::allreduce(std::span<int64_t> v, Reduce r, const std::string& op) {
  allreduce_impl(v, r, MPI_INT64_T, op);
}
void Transport::allreduce(std::span<unsigned long long> v, Reduce r, const std::string& op) {
  allreduce_impl(v, r, MPI_UNSIGNED_LONG_LONG, op);
}
void Transport::allreduce(std::span<double> v, Reduce r, const std::string& op) {
  allreduce_impl(v, r, MPI_DOUBLE, op);
}

std::vector<int64_t> Transport::allgather(int64_t v, const std::string& op) {
  std::vector<int64_t> all(static_cast<size_t>(size_));
  if (vc_) {
    const auto bytes = chips::allgather(*vc_, &v, sizeof v, op);
    std::memcpy(all.data(), bytes.data(), bytes.size());
    return all;
  }
  check_mpi(MPI_Allgather(&v, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, comm_), chip(), op);
  return all;
}

std::string Transport::broadcast(const std::string& value, int root, const std::string& op) {
  if (vc_) {
    const auto out = chips::broadcast(*vc_, std::vector<unsigned char>(value.begin(), value.end()), root, op);
    return std::string(out.begin(), out.end());
  }
  return World(comm_).broadcast(value, root);
}

void Transport::barrier(const std::string& op) {
  if (vc_) {
    chips::allgather(*vc_, nullptr, 0, op);
    return;
  }
  check_mpi(MPI_Barrier(comm_), chip(), op);
}


const sim::StepShare* Transport::step_share(const FlowPattern& pattern) const {
  auto it = shares_->find(pattern.key);
  if (it == shares_->end()) it = shares_->emplace(pattern.key, pattern.share_on(topology(), *rank_to_chip_)).first;
  return it->second.get();
}

void Transport::exchange(std::span<const SendOp> sends, std::span<RecvOp> recvs, const std::string& op,
                         const FlowPattern* pattern) {
  const sim::StepShare* share = pattern ? step_share(*pattern) : nullptr;
  if (!share) {
    exchange_impl(sends, recvs, op);
    return;
  }
  timeline_->begin_step(share);
  try {
    exchange_impl(sends, recvs, op);
  } catch (...) {
    timeline_->end_step();
    throw;
  }
  timeline_->end_step();
}

void Transport::exchange_impl(std::span<const SendOp> sends, std::span<RecvOp> recvs, const std::string& op) {
  if (vc_) {
    exchange_chips(sends, recvs, op);
    return;
  }
  // Receives first (an eager message then lands in a posted buffer), then sends. Each receive is one header
  // message into this transport's staging area (the payload packed behind it when it is at most kPackBytes) and,
  // for a larger payload, its pieces straight into the caller's buffer, all posted at once. A header is checked
  // as soon as it is here, so a size mismatch is an error even if the payload it announces never comes.
  constexpr size_t kH = sizeof(Header), kSlot = kH + kPackBytes;
  const size_t ns = sends.size(), nr = recvs.size();
  const CallSignature& sig = SignatureScope::current();
  const bool header_only = *shape_only_;  // shape-only: every message is its header alone
  out_.resize(ns);
  in_.resize(nr);
  reqs_.clear();
  peers_.clear();
  recv_of_.clear();
  size_t packed = 0;
  for (const SendOp& s : sends) packed += header_only ? kH : s.bytes <= kPackBytes ? kH + s.bytes : 0;
  if (pack_out_.size() < packed) pack_out_.resize(packed);
  if (pack_in_.size() < nr * kSlot) pack_in_.resize(nr * kSlot);
  for (size_t i = 0; i < nr; ++i) {
    RecvOp& r = recvs[i];
    reqs_.emplace_back();
    peers_.push_back(r.src);
    recv_of_.push_back(static_cast<int>(i));
    check_mpi(MPI_Irecv(pack_in_.data() + i * kSlot, static_cast<int>(kSlot), MPI_BYTE, r.src, kHeaderTag, comm_,
                        &reqs_.back()),
              chip(), op);
    if (r.bytes <= kPackBytes || header_only) continue;
    auto* p = static_cast<unsigned char*>(r.buf);
    for (size_t off = 0; off < r.bytes; off += kPiece) {
      reqs_.emplace_back();
      peers_.push_back(r.src);
      recv_of_.push_back(-2 - static_cast<int>(i));
      check_mpi(MPI_Irecv(p + off, static_cast<int>(std::min(kPiece, r.bytes - off)), MPI_BYTE, r.src, kPayloadTag,
                          comm_, &reqs_.back()),
                chip(), op);
    }
  }
  unsigned char* stage = pack_out_.data();
  for (size_t i = 0; i < ns; ++i) {
    const SendOp& s = sends[i];
    const sim::Span span = s.timed ? timeline_->send(op, chip_of(s.dst), static_cast<double>(s.bytes), s.ready)
                                   : sim::Span{s.ready, s.ready};
    *bytes_sent_ += s.dst == rank_ || !s.timed ? 0.0 : static_cast<double>(s.bytes);
    const bool dep = timeline_->records_dependencies() && s.dst != rank_ && s.timed;
    out_[i] = {span.end, s.bytes, sig, span.start, dep ? timeline_->last_send_id() : 0,
               dep ? timeline_->last_send_end() : -1.0};
    reqs_.emplace_back();
    peers_.push_back(s.dst);
    recv_of_.push_back(-1);
    if (s.bytes <= kPackBytes || header_only) {
      const size_t payload = header_only ? 0 : s.bytes;
      std::memcpy(stage, &out_[i], kH);
      if (payload) std::memcpy(stage + kH, s.buf, payload);
      check_mpi(MPI_Isend(stage, static_cast<int>(kH + payload), MPI_BYTE, s.dst, kHeaderTag, comm_, &reqs_.back()),
                chip(), op);
      stage += kH + payload;
      continue;
    }
    check_mpi(MPI_Isend(&out_[i], static_cast<int>(kH), MPI_BYTE, s.dst, kHeaderTag, comm_, &reqs_.back()), chip(),
              op);
    const auto* p = static_cast<const unsigned char*>(s.buf);
    for (size_t off = 0; off < s.bytes; off += kPiece) {
      reqs_.emplace_back();
      peers_.push_back(s.dst);
      recv_of_.push_back(-1);
      check_mpi(MPI_Isend(p + off, static_cast<int>(std::min(kPiece, s.bytes - off)), MPI_BYTE, s.dst, kPayloadTag,
                          comm_, &reqs_.back()),
                chip(), op);
    }
  }
  struct Hook : WaitHook {
    Transport& t;
    std::span<RecvOp> recvs;
    const std::string& op;
    Hook(Transport& tt, std::span<RecvOp> r, const std::string& o) : t(tt), recvs(r), op(o) {}
    void completed(size_t index) override {
      const int i = t.recv_of_[index];
      if (i < 0) return;
      const unsigned char* slot = t.pack_in_.data() + static_cast<size_t>(i) * kSlot;
      Header& h = t.in_[static_cast<size_t>(i)];
      std::memcpy(&h, slot, kH);
      RecvOp& r = recvs[static_cast<size_t>(i)];
      t.check_header(h, r.bytes, r.src, op);
      if (r.bytes && r.bytes <= kPackBytes && !t.shape_only()) std::memcpy(r.buf, slot + kH, r.bytes);
    }
    void failed(size_t index, int error) override {
      int cls = error;
      MPI_Error_class(error, &cls);
      const int i = t.recv_of_[index];
      if (cls != MPI_ERR_TRUNCATE || i >= -1) return;
      const RecvOp& r = recvs[static_cast<size_t>(-2 - i)];
      throw UsageError("chip " + std::to_string(t.chip()) + ": " + op + ": expected " + std::to_string(r.bytes) +
                       " bytes from chip " + std::to_string(t.chip_of(r.src)) +
                       ", got more (counts differ across ranks?)");
    }
  } hook(*this, recvs, op);
  wait(reqs_, peers_, op, &hook);
  if (nr) book_arrivals(recvs);
}

sim::Span Transport::send_to_switch(int node, double bytes, sim::TimeNs ready, const std::string& op) {
  *bytes_sent_ += bytes;
  return timeline_->send(op, node, bytes, ready);
}

sim::TimeNs Transport::sendrecv(const void* sbuf, size_t sbytes, int dst, void* rbuf, size_t rbytes, int src,
                                sim::TimeNs ready, const std::string& op, const FlowPattern* pattern) {
  if (dst == rank_ && src == rank_) {
    if (sbytes != rbytes) check_header(Header{0, sbytes, SignatureScope::current()}, rbytes, src, op);
    if (sbytes && sbuf != rbuf && !*shape_only_) std::memmove(rbuf, sbuf, sbytes);
    return ready;
  }
  const SendOp s{sbuf, sbytes, dst, ready};
  RecvOp r{rbuf, rbytes, src, 0};
  exchange({&s, 1}, {&r, 1}, op, pattern);
  return std::max(ready, r.arrival);
}

sim::TimeNs Transport::send(const void* buf, size_t bytes, int dst, sim::TimeNs ready, const std::string& op,
                            const FlowPattern* pattern) {
  const SendOp s{buf, bytes, dst, ready};
  exchange({&s, 1}, {}, op, pattern);
  return ready;
}

sim::TimeNs Transport::recv(void* buf, size_t bytes, int src, const std::string& op, const FlowPattern* pattern) {
  RecvOp r{buf, bytes, src, 0};
  exchange({}, {&r, 1}, op, pattern);
  return r.arrival;
}

}  // namespace shardsim::runtime
