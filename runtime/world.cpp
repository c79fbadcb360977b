#include "runtime/world.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "common/error.h"

namespace shardsim::runtime {

MpiSession::MpiSession(int* argc, char*** argv) {
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "shardsim: MPI_Init_thread failed\n");
    std::exit(kExitRuntimeFault);
  }
  if (provided < MPI_THREAD_FUNNELED) {
    std::fprintf(stderr, "shardsim: MPI provides thread level %d, need at least MPI_THREAD_FUNNELED "
                         "(MPI_THREAD_MULTIPLE for async collectives)\n", provided);
    MPI_Abort(MPI_COMM_WORLD, kExitRuntimeFault);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void check_mpi(int rc, int rank, const std::string& op) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw RuntimeFault("chip " + std::to_string(rank) + ": " + op + ": MPI error: " + std::string(text, len));
}

World::World(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

namespace {
void sleepy_wait(MPI_Request* req, int rank, const char* op) {
  int done = 0;
  auto pause = std::chrono::microseconds(50);
  while (true) {
    check_mpi(MPI_Test(req, &done, MPI_STATUS_IGNORE), rank, op);
    if (done) return;
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::milliseconds(5)) pause *= 2;
  }
}
}  // namespace

bool World::any(bool flag) const {
  int local = flag ? 1 : 0, global = 0;
  MPI_Request req;
  check_mpi(MPI_Iallreduce(&local, &global, 1, MPI_INT, MPI_MAX, comm_, &req), rank_, "agree");
  sleepy_wait(&req, rank_, "agree");
  return global != 0;
}

void World::sleepy_barrier() const {
  MPI_Request req;
  check_mpi(MPI_Ibarrier(comm_, &req), rank_, "barrier");
  sleepy_wait(&req, rank_, "barrier");
}

std::string World::broadcast(const std::string& value, int root) const {
  long long n = static_cast<long long>(value.size());
  MPI_Request req;
  check_mpi(MPI_Ibcast(&n, 1, MPI_LONG_LONG, root, comm_, &req), rank_, "broadcast");
  sleepy_wait(&req, rank_, "broadcast");
  std::string out = rank_ == root ? value : std::string(static_cast<size_t>(n), '\0');
  if (n > 0) {
    check_mpi(MPI_Ibcast(out.data(), static_cast<int>(n), MPI_CHAR, root, comm_, &req), rank_, "broadcast");
    sleepy_wait(&req, rank_, "broadcast");
  }
  return out;
}

void World::agree(const std::function<void()>& check) const {
  std::string message;
  int code = 0;
  try {
    check();
  } catch (const Error& e) {
    message = e.what();
    code = e.exit_code();
  }
  int mine = code != 0 ? rank_ : size_, first = size_;
  MPI_Request req;
  check_mpi(MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm_, &req), rank_, "agree");
  sleepy_wait(&req, rank_, "agree");
  if (first == size_) return;
  check_mpi(MPI_Bcast(&code, 1, MPI_INT, first, comm_), rank_, "agree");
  message = broadcast(message, first);
  throw AgreedError(message, code);
}

void World::abort(int code, const std::string& message) const {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  MPI_Abort(comm_, code);
  std::_Exit(code);  // MPI_Abort should not return; make sure
}

}  // namespace shardsim::runtime
