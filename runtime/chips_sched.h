// Internal to runtime/chips*.cpp (not a public header): the chip scheduler's state. One Sched per run_chips call
// (g while it runs): the chips' fibers, the mailboxes of the chip router, the MPI traffic between ranks, the fold
// (docs/performance/fold.md). runtime/chips.cpp runs it; runtime/chips_control.cpp holds the control-plane
// collectives over it (allgather, split, reduce_to_all, gather, rank_handover, broadcast).
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/context/fiber.hpp>

#include "runtime/chips.h"
#include "runtime/host_memory.h"
#include "runtime/transport.h"
#include "runtime/world.h"

namespace shardsim::runtime::chips_detail {

namespace ctx = boost::context;


constexpr int kChipTag = 7101;
constexpr size_t kPiece = size_t{1} << 30;   // payload bytes per MPI message (int counts)
constexpr size_t kMaxHeader = 128;
constexpr uint64_t kControl = uint64_t{1} << 63;  // context bit of control-plane messages
// Context of the per-rank hand-over communicators (rank_handover; "ChkpHand" without the top bit). Split contexts
// are 63-bit hashes (Transport::split) and the world's is 1: a collision is as unlikely as one between two splits.
constexpr uint64_t kHandoverCtx = 0x43686b7048616e64ull & ~kControl;
// Fiber stacks: collectives, kernels and the CLI run on them. Guard page below (overflow faults, never corrupts).
constexpr size_t kStackBytes = kFiberStackBytes;

// What travels in front of every piece over MPI.
struct Wire {
  uint64_t ctx;
  int32_t src, dst;
  uint64_t bytes;     // payload bytes of the whole message (0: header only)
  uint32_t piece, npieces;
  uint32_t hlen;
  uint32_t pad;
  unsigned char header[kMaxHeader];
};

struct Msg {
  unsigned char header[kMaxHeader];
  size_t hlen = 0;
  size_t bytes = 0;                     // payload bytes
  std::vector<unsigned char> storage;   // payload at storage.data() + offset
  size_t offset = 0;
  // Or a payload several local chips receive (chips::post_shared: one copy, not one per receiver).
  std::shared_ptr<const std::vector<unsigned char>> shared{};
  const unsigned char* payload() const { return shared ? shared->data() : storage.data() + offset; }
};

struct Key {
  uint64_t ctx;
  int src, dst;
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = k.ctx * 0x9e3779b97f4a7c15ull;
    h ^= (static_cast<uint64_t>(static_cast<uint32_t>(k.src)) << 32 | static_cast<uint32_t>(k.dst)) +
         0x7f4a7c159e3779b9ull + (h << 6) + (h >> 2);
    return static_cast<size_t>(h);
  }
};

struct Chip {
  ctx::fiber fib;
  ctx::fiber sink;  // the scheduler while this chip runs
  bool started = false, done = false, waiting = false, busy = false;
  bool queued = false;  // in Sched::ready
  std::string op;
  std::vector<int> peers;
  // wait_until_all: the (context, source) messages this chip still misses; it is queued only when the last of
  // them is delivered (a woken chip whose wait is still unmet would cost a resume for nothing). Empty: any
  // delivery to the chip queues it.
  std::vector<std::pair<uint64_t, int>> missing;
  int code = 0;
};

struct Sched {
  int k = 1, wrank = 0, wsize = 1;
  MPI_Comm comm = MPI_COMM_NULL;
  std::vector<Chip> chips;
  int cur = -1;
  uint64_t events = 0;
  std::vector<int> ready, running;  // chips to resume: not started yet, or every awaited message arrived
  using Mail = std::unordered_map<Key, std::deque<Msg>, KeyHash>;
  Mail mail;
  // Emptied mailboxes kept for reuse (map node and deque storage): each message would otherwise allocate a map
  // node, a deque map and a deque block, and free them again when it is taken. Bounded, so an all_to_all's p^2
  // keys do not stay allocated.
  std::vector<Mail::node_type> spare_boxes;
  static constexpr size_t kMaxSpareBoxes = 4096;
  std::map<int, Msg> assembling;  // source rank -> message whose pieces are still arriving
  std::map<int, Key> assembling_key;
  std::vector<MPI_Request> send_reqs;
  std::vector<std::vector<unsigned char>> send_bufs;
  std::vector<int> done_idx;
  std::vector<std::shared_ptr<VComm>> worlds;
  std::vector<std::shared_ptr<VComm>> locals;  // per chip: this rank's K chips (rank_handover)
  // chips::shared_ints: hash of the contents -> the shared copies (weak: a copy goes with its last holder).
  std::unordered_map<uint64_t, std::vector<std::weak_ptr<const std::vector<int>>>> shared_ints;
  int stall_chip = -1;
  std::function<void(uint64_t, double)> progress_fn;
  double progress_every_s = 0;
  std::chrono::steady_clock::time_point progress_since, progress_last;

  // Folded run (run_chips' FoldSpec): replicas > 1. World ranks g with replica(g) == 0 run (slot_of), the others
  // are mirrored.
  int fold_stride = 1, fold_size = 1, fold_period = 0, fold_replicas = 1;
  bool fold_fallback = false;  // FoldSpec::fallback
  std::string fold_failed;     // why the folded attempt fell back ("": it did not)
  bool folded() const { return fold_replicas > 1; }
  int dpc(int g) const { return (g / fold_stride) % fold_size; }
  int replica(int g) const { return dpc(g) / fold_period; }
  int shift(int g, int d) const {  // the chip D replicas on (sigma^D)
    const int c = dpc(g);
    return g + (((c + d * fold_period) % fold_size + fold_size) % fold_size - c) * fold_stride;
  }
  int slot_of(int g) const {
    if (!folded()) return g % k;
    const int block = fold_stride * fold_size;
    return (g / block) * (fold_stride * fold_period) + g % block;
  }
  int world_of(int slot) const {
    if (!folded()) return wrank * k + slot;
    const int run = fold_stride * fold_period;
    return (slot / run) * fold_stride * fold_size + slot % run;
  }
  bool simulated(int g) const { return !folded() || replica(g) == 0; }
  bool local(int g) const { return folded() || g / k == wrank; }
  int rank_of(int g) const { return folded() ? 0 : g / k; }

  std::deque<Msg>& box(const Key& key) {
    auto it = mail.find(key);
    if (it != mail.end()) return it->second;
    if (spare_boxes.empty()) return mail[key];
    Mail::node_type n = std::move(spare_boxes.back());
    spare_boxes.pop_back();
    n.key() = key;
    return mail.insert(std::move(n)).position->second;
  }

  void retire(Mail::iterator it) {
    if (spare_boxes.size() < kMaxSpareBoxes) spare_boxes.push_back(mail.extract(it));
    else mail.erase(it);
  }

  void deliver(const Key& key, Msg&& m) {
    box(key).push_back(std::move(m));
    ++events;
    // Only the destination can be waiting for it (every wait is for messages to the waiting chip).
    Chip& c = chips[static_cast<size_t>(slot_of(key.dst))];
    if (!c.waiting || c.queued) return;
    if (!c.missing.empty()) {
      auto it = std::find(c.missing.begin(), c.missing.end(), std::pair{key.ctx, key.src});
      if (it == c.missing.end()) return;
      *it = c.missing.back();
      c.missing.pop_back();
      if (!c.missing.empty()) return;
    }
    c.queued = true;
    ready.push_back(slot_of(key.dst));
  }

  // Receives what has arrived and retires finished sends. True if anything happened.
  bool progress() {
    bool any = false;
    while (true) {
      int flag = 0;
      MPI_Message mh;
      MPI_Status st;
      check_mpi(MPI_Improbe(MPI_ANY_SOURCE, kChipTag, comm, &flag, &mh, &st), wrank, "chip router");
      if (!flag) break;
      int count = 0;
      MPI_Get_count(&st, MPI_BYTE, &count);
      std::vector<unsigned char> buf(static_cast<size_t>(count));
      check_mpi(MPI_Mrecv(buf.data(), count, MPI_BYTE, &mh, &st), wrank, "chip router");
      any = true;
      Wire w;
      std::memcpy(&w, buf.data(), sizeof(Wire));
      const Key key{w.ctx, w.src, w.dst};
      const size_t piece_bytes = buf.size() - sizeof(Wire);
      if (w.npieces <= 1) {
        Msg m;
        std::memcpy(m.header, w.header, w.hlen);
        m.hlen = w.hlen;
        m.bytes = w.bytes;
        m.offset = sizeof(Wire);
        m.storage = std::move(buf);
        deliver(key, std::move(m));
        continue;
      }
      // Pieces of one message come back to back from one source rank (posted without a yield in between).
      if (w.piece == 0) {
        Msg m;
        std::memcpy(m.header, w.header, w.hlen);
        m.hlen = w.hlen;
        m.bytes = w.bytes;
        m.storage.resize(w.bytes);
        assembling[st.MPI_SOURCE] = std::move(m);
        assembling_key[st.MPI_SOURCE] = key;
      }
      Msg& m = assembling.at(st.MPI_SOURCE);
      std::memcpy(m.storage.data() + static_cast<size_t>(w.piece) * kPiece, buf.data() + sizeof(Wire), piece_bytes);
      if (w.piece + 1 == w.npieces) {
        deliver(assembling_key.at(st.MPI_SOURCE), std::move(m));
        assembling.erase(st.MPI_SOURCE);
        assembling_key.erase(st.MPI_SOURCE);
      }
    }
    if (!send_reqs.empty()) {
      int n = 0;
      done_idx.resize(send_reqs.size());
      check_mpi(MPI_Testsome(static_cast<int>(send_reqs.size()), send_reqs.data(), &n, done_idx.data(),
                             MPI_STATUSES_IGNORE),
                wrank, "chip router");
      if (n > 0 && n != MPI_UNDEFINED) {
        size_t j = 0;
        for (size_t i = 0; i < send_reqs.size(); ++i) {
          if (send_reqs[i] == MPI_REQUEST_NULL) continue;
          send_reqs[j] = send_reqs[i];
          if (j != i) send_bufs[j] = std::move(send_bufs[i]);
          ++j;
        }
        send_reqs.resize(j);
        send_bufs.resize(j);
      } else if (n == MPI_UNDEFINED) {
        send_reqs.clear();
        send_bufs.clear();
      }
    }
    return any;
  }
};

extern Sched* g;  // the running scheduler (nullptr outside run_chips)

}  // namespace shardsim::runtime::chips_detail
