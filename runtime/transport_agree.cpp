// Argument agreement of collective calls over a Transport (transport.h, "Argument agreement"): the recursive-doubling
// agreement round, the skipped-call bookkeeping and the mixed-case probe.
#include <algorithm>
#include <string>
#include <vector>

#include "common/error.h"
#include "runtime/dtype.h"
#include "runtime/transport.h"
#include "runtime/world.h"

namespace shardsim::runtime {

void Transport::mark_agreed(uint64_t hash) const {
  auto& set = agree_->agreed;
  if (set.size() >= 4096) set.clear();  // every rank clears at the same call: the sets stay equal
  set.insert(hash);
}

namespace {
constexpr int kCallTagMask = 0x7fff;  // call numbers as tags: MPI guarantees tags up to 32767
int call_tag(int64_t call) { return static_cast<int>(call & kCallTagMask); }
}  // namespace

Transport::Agreement::~Agreement() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm);
}

void Transport::note_skipped(std::span<const int64_t> fields, const char* const* names) {
  Agreement& a = *agree_;
  a.current = a.calls++;
  a.in_progress = false;
  a.n_fields = std::min(fields.size(), a.fields.size());
  std::copy_n(fields.begin(), a.n_fields, a.fields.begin());
  a.names = names;
}

void Transport::agree_max(std::span<int64_t> v, const char* const* names, const std::string& op) {
  Agreement& a = *agree_;
  a.current = a.calls++;
  a.names = names;
  a.n_fields = 0;
  if (vc_ || size_ == 1) {  // chip mode: the chip router's allgather (see agreed())
    allreduce(v, Reduce::max, op);
    return;
  }
  if (a.comm == MPI_COMM_NULL) {  // the first agreement on this communicator: every rank is here
    MPI_Comm dup = MPI_COMM_NULL;
    std::vector<MPI_Request> req(1);
    check_mpi(MPI_Comm_idup(comm_, &dup, req.data()), chip(), op);
    wait(req, {-1}, op, nullptr);
    MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
    a.comm = dup;
  }
  a.in_progress = true;
  const int tag = call_tag(a.current);
  const size_t n = v.size();
  std::vector<int64_t> out(n + 1), in(n + 1);
  std::vector<MPI_Request> reqs(2);
  // One step: send our values to PEER (if SEND) and receive PEER's (if RECV), folding them in with max (if MERGE).
  auto step = [&](int peer, bool send, bool recv, bool merge) {
    out[0] = a.current;
    std::copy(v.begin(), v.end(), out.begin() + 1);
    reqs.assign(2, MPI_REQUEST_NULL);
    if (send)
      check_mpi(MPI_Isend(out.data(), static_cast<int>(n + 1), MPI_INT64_T, peer, tag, a.comm, &reqs[0]), chip(), op);
    if (recv)
      check_mpi(MPI_Irecv(in.data(), static_cast<int>(n + 1), MPI_INT64_T, peer, tag, a.comm, &reqs[1]), chip(), op);
    wait(reqs, {peer, peer}, op, nullptr);
    if (!recv) return;
    if (merge)
      for (size_t i = 0; i < n; ++i) v[i] = std::max(v[i], in[i + 1]);
    else
      std::copy(in.begin() + 1, in.end(), v.begin());
  };
  int p2 = 1;
  while (p2 * 2 <= size_) p2 *= 2;
  if (rank_ >= p2) {  // an extra rank: swap with the partner (both ways, see agreed()), then take the result
    step(rank_ - p2, true, true, true);
    step(rank_ - p2, false, true, false);
  } else {
    const bool has_extra = rank_ + p2 < size_;
    if (has_extra) step(rank_ + p2, true, true, true);
    for (int d = 1; d < p2; d <<= 1) step(rank_ ^ d, true, true, true);
    if (has_extra) step(rank_ + p2, true, false, false);
  }
  a.in_progress = false;
}

void Transport::probe_agreement(const std::string& op) {
  Agreement& a = *agree_;
  if (a.comm == MPI_COMM_NULL || a.current < 0) return;
  const int cur = call_tag(a.current);
  int flag = 0;
  MPI_Status st;
  if (!a.in_progress) {  // an agreement message for the call this rank skipped
    MPI_Iprobe(MPI_ANY_SOURCE, cur, a.comm, &flag, &st);
    if (flag) report_skipped_mismatch(st, op);
  }
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, a.comm, &flag, &st);  // one for an earlier call
  if (flag && ((st.MPI_TAG - cur) & kCallTagMask) > kCallTagMask / 2) report_skipped_mismatch(st, op);
}

void Transport::report_skipped_mismatch(const MPI_Status& st, const std::string& op) {
  Agreement& a = *agree_;
  int n = 0;
  MPI_Get_count(&st, MPI_INT64_T, &n);
  std::vector<int64_t> msg(static_cast<size_t>(std::max(n, 1)));
  MPI_Recv(msg.data(), n, MPI_INT64_T, st.MPI_SOURCE, st.MPI_TAG, a.comm, MPI_STATUS_IGNORE);
  const size_t k = a.n_fields;
  const std::string other = "chip " + std::to_string(chip_of(st.MPI_SOURCE));
  const std::string me = "chip " + std::to_string(chip());
  std::string what = "which calls they make (" + me + " skipped the argument check of call " +
                     std::to_string(a.current) + ", " + other + " is in the one of call " + std::to_string(msg[0]) + ")";
  if (msg[0] == a.current && k > 0 && a.names && msg.size() == 1 + 2 * k)
    for (size_t i = 0; i < k; ++i) {
      const int64_t hi = msg[1 + i], lo = -msg[1 + k + i], mine = a.fields[i];
      if (lo == mine && hi == mine) continue;
      const std::string name = a.names[i];
      auto show = [&](int64_t x) -> std::string {
        if (name == "dtype") return dtype_name(static_cast<DType>(x));
        if (name == "algorithm") return "(another name)";
        if (name == "collective") return "#" + std::to_string(x);
        return std::to_string(x);
      };
      const int64_t theirs = lo != mine ? lo : hi;
      what = name + ": " + me + " " + show(mine) + " (agreed before), " + other + " " + show(theirs) + " (new)";
      break;
    }
  throw UsageError(me + ": " + op + ": ranks disagree on " + what +
                   " (every rank must call the collective with the same arguments)");
}

}  // namespace shardsim::runtime
