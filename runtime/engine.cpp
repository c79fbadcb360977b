#include "runtime/engine.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "common/number.h"
#include "runtime/world.h"

namespace shardsim::runtime {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {
constexpr int kArrivalTag = 7100;

std::string thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "level " + std::to_string(level);
  }
}

std::string rank_list(const std::vector<int>& ranks) {
  if (ranks.empty()) return "none";
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

// Books EVENTS (an op's sends and regions, as recorded on another timeline) on TL, in order, each send at its
// recorded span (Timeline::replay_send: also a flow of a crossing-flow step, whose share send() alone cannot see).
// RECEIVES (dependency recording: Timeline::receives()) are recorded as they were, ids and producers kept.
void replay(const std::vector<sim::Event>& events, const std::vector<sim::Event>& receives, sim::Timeline& tl) {
  for (const auto& r : receives) tl.replay_receive(r);
  for (const auto& e : events) {
    if (e.category == "send")
      tl.replay_send(e);
    else if (e.engine < 0)
      tl.replay_region(e);
    else  // no collective charges compute today; replaying it would need the event's precision
      throw std::logic_error("async engine: cannot replay compute event '" + e.name + "'");
  }
}

[[noreturn]] void rethrow_prefixed(std::exception_ptr error, const std::string& prefix) {
  try {
    std::rethrow_exception(error);
  } catch (const AgreedError& e) {
    throw AgreedError(prefix + e.what(), e.exit_code());
  } catch (const UsageError& e) {
    throw UsageError(prefix + e.what());
  } catch (const ConfigError& e) {
    throw ConfigError(prefix + e.what());
  } catch (const RuntimeFault& e) {
    throw RuntimeFault(prefix + e.what());
  } catch (const std::exception& e) {
    throw RuntimeFault(prefix + e.what());
  }
}
}  // namespace

double watchdog_seconds_from_env(double fallback) {
  const char* v = std::getenv("SHARDSIM_WATCHDOG_S");
  if (!v || !*v) return fallback;
  const double s = decimal_double(v).value_or(NAN);  // decimal only (common/number.h)
  if (!(s >= 0) || s > 1e9)
    throw UsageError(std::string("SHARDSIM_WATCHDOG_S='") + v + "': expected seconds >= 0 (0 disables the watchdog)");
  return s;
}

struct AsyncOp::State {
  std::string name;
  std::uint64_t seq = 0;
  Engine::Job job;
  std::optional<sim::Timeline> snapshot;            // the chip's timeline when submitted (moved to the engine)
  std::vector<std::shared_ptr<State>> prior;        // earlier ops not yet committed when this one was submitted
  std::vector<sim::Event> events;                   // what the job booked (engine thread writes, then done)
  std::vector<sim::Event> receives;                 // its receives (dependency recording only)
  double bytes_sent = 0;
  std::exception_ptr error;
  std::atomic<bool> done{false};
  std::mutex m;
  std::condition_variable cv;
  bool waited = false;  // main thread only
};

// What the watchdog watches: the running job. Guarded by m.
struct Watch {
  std::mutex m;
  bool active = false;
  std::string op;
  std::uint64_t seq = 0;
  bool arrival = false;           // still exchanging sequence numbers
  std::vector<int> pending;       // world ranks with pending requests
  Clock::time_point last;
};

struct Engine::Impl : WaitObserver {
  sim::Timeline* chip_tl;                 // the chip's timeline (main thread)
  std::shared_ptr<double> chip_bytes;     // the parent transport's byte counter
  sim::Timeline tl;                       // the engine's timeline (engine thread)
  Transport tp;                           // duplicated communicator (engine thread)
  double watchdog_s;
  int world_rank = 0;
  int stall_rank = -1;
  Watch watch;

  std::uint64_t next_seq = 0;                          // main thread
  std::deque<std::shared_ptr<AsyncOp::State>> uncommitted;  // main thread, issue order

  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::thread progress;
  asio::io_context wd_io;
  asio::steady_timer wd_timer{wd_io};
  std::thread watchdog;

  Impl(Transport& parent, double wd)
      : chip_tl(&parent.timeline()),
        chip_bytes(parent.bytes_sent_),
        tl(parent.timeline()),
        tp(parent.duplicate(tl)),
        watchdog_s(wd) {
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    if (const char* s = std::getenv("SHARDSIM_TEST_STALL_RANK"); s && *s) stall_rank = std::atoi(s);
  }

  // WaitObserver, called on the engine thread from the transport's waits.
  void pending(MPI_Comm comm, const std::vector<int>& ranks) override {
    std::vector<int> world(ranks.size(), MPI_UNDEFINED);
    if (!ranks.empty()) {
      MPI_Group g, wg;
      MPI_Comm_group(comm, &g);
      MPI_Comm_group(MPI_COMM_WORLD, &wg);
      MPI_Group_translate_ranks(g, static_cast<int>(ranks.size()), ranks.data(), wg, world.data());
      MPI_Group_free(&g);
      MPI_Group_free(&wg);
    }
    std::lock_guard<std::mutex> lock(watch.m);
    watch.pending = std::move(world);
  }
  void progressed() override {
    std::lock_guard<std::mutex> lock(watch.m);
    watch.last = Clock::now();
  }

  // Every rank tells every other which op it is starting; returns once all have (a rank that never arrives is
  // what the watchdog reports). Non-blocking requests through the observer.
  void arrive(std::uint64_t seq, const std::string& name) {
    const int p = tp.size(), me = tp.rank();
    std::vector<unsigned long long> in(static_cast<size_t>(p), 0);
    const unsigned long long mine = seq;
    std::vector<MPI_Request> reqs;
    std::vector<int> peers;
    for (int r = 0; r < p; ++r) {
      if (r == me) continue;
      reqs.emplace_back();
      peers.push_back(r);
      check_mpi(MPI_Irecv(&in[static_cast<size_t>(r)], 1, MPI_UNSIGNED_LONG_LONG, r, kArrivalTag, tp.comm(),
                          &reqs.back()),
                tp.chip(), name);
    }
    for (int r = 0; r < p; ++r) {
      if (r == me) continue;
      reqs.emplace_back();
      peers.push_back(r);
      check_mpi(MPI_Isend(&mine, 1, MPI_UNSIGNED_LONG_LONG, r, kArrivalTag, tp.comm(), &reqs.back()), tp.chip(), name);
    }
    tp.wait_requests(reqs, peers, name);
    for (int r = 0; r < p; ++r)
      if (r != me && in[static_cast<size_t>(r)] != seq)
        throw RuntimeFault("chip " + std::to_string(tp.chip()) + ": " + name + ": ranks issue async ops in different " +
                           "orders: this rank is at op #" + std::to_string(seq) + ", rank " + std::to_string(r) +
                           " at op #" + std::to_string(in[static_cast<size_t>(r)]));
  }

  void run(const std::shared_ptr<AsyncOp::State>& st) {
    {
      std::lock_guard<std::mutex> lock(watch.m);
      watch.active = true;
      watch.op = st->name;
      watch.seq = st->seq;
      watch.arrival = true;
      watch.pending.clear();
      watch.last = Clock::now();
    }
    try {
      arrive(st->seq, st->name);
      {
        std::lock_guard<std::mutex> lock(watch.m);
        watch.arrival = false;
        watch.last = Clock::now();
      }
      tl = std::move(*st->snapshot);
      st->snapshot.reset();
      tl.set_keep_events(true);  // the job's events are replayed on the chip's timeline at completion
      for (const auto& p : st->prior)
        if (!p->error) replay(p->events, p->receives, tl);
      const size_t n0 = tl.events().size(), r0 = tl.receives().size();
      const double b0 = tp.bytes_sent();
      if (tl.records_dependencies()) tl.set_async_id_space(st->seq);  // ids apart from the chip timeline's
      st->job(tp);
      st->events.assign(tl.events().begin() + static_cast<std::ptrdiff_t>(n0), tl.events().end());
      st->receives.assign(tl.receives().begin() + static_cast<std::ptrdiff_t>(r0), tl.receives().end());
      st->bytes_sent = tp.bytes_sent() - b0;
    } catch (...) {
      st->error = std::current_exception();
    }
    st->job = nullptr;
    {
      std::lock_guard<std::mutex> lock(watch.m);
      watch.active = false;
    }
    {
      std::lock_guard<std::mutex> lock(st->m);
      st->done = true;
    }
    st->cv.notify_all();
  }

  void arm_watchdog() {
    const double tick = std::clamp(watchdog_s / 10, 0.05, 1.0);
    wd_timer.expires_after(std::chrono::microseconds(static_cast<long long>(tick * 1e6)));
    wd_timer.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;  // cancelled: the engine is stopping
      check_watchdog();
      arm_watchdog();
    });
  }

  void check_watchdog() {
    std::string message;
    {
      std::lock_guard<std::mutex> lock(watch.m);
      if (!watch.active) return;
      const double idle = std::chrono::duration<double>(Clock::now() - watch.last).count();
      if (idle < watchdog_s) return;
      std::ostringstream os;
      os << "shardsim: watchdog: chip " << tp.chip() << " (rank " << world_rank << "): async " << watch.op << " #"
         << watch.seq << " made no progress for " << static_cast<long long>(idle) << " s (limit " << watchdog_s
         << " s, SHARDSIM_WATCHDOG_S); ";
      if (watch.arrival)
        os << "ranks that have not reached this op: " << rank_list(watch.pending);
      else if (watch.pending.empty())
        os << "waiting inside a blocking MPI call (all ranks of the op)";
      else
        os << "waiting on ranks: " << rank_list(watch.pending) << " (pending MPI requests)";
      os << "; aborting the job";
      message = os.str();
    }
    World(MPI_COMM_WORLD).abort(kExitRuntimeFault, message);
  }
};

Engine::Engine(Transport& parent, EngineOptions options) {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE)
    throw RuntimeFault("chip " + std::to_string(parent.chip()) +
                       ": async engine: needs MPI_THREAD_MULTIPLE (its thread and the main thread both call MPI), "
                       "but MPI was initialised with " + thread_level_name(provided) +
                       " (use runtime::MpiSession, which requests MPI_THREAD_MULTIPLE)");
  const double wd = options.watchdog_s >= 0 ? options.watchdog_s : watchdog_seconds_from_env(300);
  impl_ = std::make_unique<Impl>(parent, wd);
  impl_->tp.observer_ = std::shared_ptr<WaitObserver>(impl_.get(), [](WaitObserver*) {});  // not owning
  impl_->progress = std::thread([this] { impl_->io.run(); });
  if (wd > 0) {
    impl_->arm_watchdog();
    impl_->watchdog = std::thread([this] { impl_->wd_io.run(); });
  }
}

Engine::~Engine() {
  impl_->work.reset();  // run() returns once the queue is empty
  impl_->progress.join();
  asio::post(impl_->wd_io, [this] { impl_->wd_timer.cancel(); });
  if (impl_->watchdog.joinable()) impl_->watchdog.join();
}

double Engine::watchdog_seconds() const { return impl_->watchdog_s; }

AsyncOp Engine::submit(const std::string& name, Job job) {
  Impl& im = *impl_;
  auto st = std::make_shared<AsyncOp::State>();
  st->name = name;
  st->seq = im.next_seq++;
  if (im.stall_rank == im.world_rank) {
    std::fprintf(stderr, "shardsim: test hook SHARDSIM_TEST_STALL_RANK: rank %d stalls before async %s #%llu\n",
                 im.world_rank, name.c_str(), static_cast<unsigned long long>(st->seq));
    std::fflush(stderr);
    while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  st->job = std::move(job);
  st->snapshot.emplace(*im.chip_tl);
  st->prior.assign(im.uncommitted.begin(), im.uncommitted.end());
  im.uncommitted.push_back(st);
  asio::post(im.io, [&im, st] { im.run(st); });
  AsyncOp op;
  op.engine_ = this;
  op.state_ = std::move(st);
  return op;
}

namespace {
// Waits for OP if it was never waited for; errors are printed (a destructor cannot throw).
void settle(AsyncOp& op, bool pending) {
  if (!pending) return;
  try {
    op.wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardsim: error in an async op that was never waited for: %s\n", e.what());
  }
}
}  // namespace

AsyncOp& AsyncOp::operator=(AsyncOp&& other) noexcept {
  if (this != &other) {
    settle(*this, state_ && !state_->waited);
    engine_ = other.engine_;
    state_ = std::move(other.state_);
  }
  return *this;
}

AsyncOp::~AsyncOp() { settle(*this, state_ && !state_->waited); }

const std::string& AsyncOp::name() const { return state_->name; }
std::uint64_t AsyncOp::seq() const { return state_->seq; }
bool AsyncOp::test() const { return state_ && state_->done.load(); }

void AsyncOp::wait() {
  if (!state_) throw std::logic_error("AsyncOp::wait on an empty op");
  if (state_->waited) throw std::logic_error("AsyncOp::wait called twice on " + state_->name);
  {
    std::unique_lock<std::mutex> lock(state_->m);
    state_->cv.wait(lock, [&] { return state_->done.load(); });
  }
  state_->waited = true;
  // Commit this op and every earlier one (all finished: jobs run in order) to the chip's timeline, in issue order.
  auto& im = *engine_->impl_;
  while (!im.uncommitted.empty() && im.uncommitted.front()->seq <= state_->seq) {
    auto& op = *im.uncommitted.front();
    if (!op.error) {
      replay(op.events, op.receives, *im.chip_tl);
      *im.chip_bytes += op.bytes_sent;
    }
    im.uncommitted.pop_front();
  }
  if (state_->error)
    rethrow_prefixed(state_->error, "async " + state_->name + " #" + std::to_string(state_->seq) + ": ");
}

}  // namespace shardsim::runtime
