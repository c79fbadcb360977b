#include "runtime/transport.h"

#include <algorithm>

#include "common/error.h"
#include "runtime/world.h"

namespace shardsim::runtime {

namespace {
constexpr int kHeaderTag = 7001;
constexpr int kPayloadTag = 7002;
constexpr size_t kPiece = size_t{1} << 30;  // bytes per MPI message: keeps counts within int
}  // namespace

Transport::Transport(MPI_Comm comm, sim::Timeline& timeline, std::vector<int> rank_to_chip)
    : comm_(comm), timeline_(&timeline), rank_to_chip_(std::move(rank_to_chip)) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  if (static_cast<int>(rank_to_chip_.size()) != size_)
    throw RuntimeFault("transport: rank_to_chip has " + std::to_string(rank_to_chip_.size()) +
                       " entries for a communicator of " + std::to_string(size_));
}

void Transport::post_send(const void* buf, size_t bytes, int dst, sim::TimeNs ready, const std::string& op,
                          Header& h, std::vector<MPI_Request>& reqs) {
  const sim::Span s = timeline_->send(op, chip_of(dst), static_cast<double>(bytes), ready);
  bytes_sent_ += static_cast<double>(bytes);
  h.arrival_ns = s.end;
  h.bytes = bytes;
  reqs.emplace_back();
  check_mpi(MPI_Isend(&h, sizeof(Header), MPI_BYTE, dst, kHeaderTag, comm_, &reqs.back()), chip(), op);
  const auto* p = static_cast<const unsigned char*>(buf);
  for (size_t off = 0; off < bytes; off += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, bytes - off));
    reqs.emplace_back();
    check_mpi(MPI_Isend(p + off, n, MPI_BYTE, dst, kPayloadTag, comm_, &reqs.back()), chip(), op);
  }
}

void Transport::post_recv(void* buf, size_t bytes, int src, Header& h, std::vector<MPI_Request>& reqs,
                          const std::string& op) {
  // The header is received first and checked before the payload is posted: a size mismatch must become a
  // clear error, not a truncation fault inside MPI.
  check_mpi(MPI_Recv(&h, sizeof(Header), MPI_BYTE, src, kHeaderTag, comm_, MPI_STATUS_IGNORE), chip(), op);
  check_header(h, bytes, src, op);
  auto* p = static_cast<unsigned char*>(buf);
  for (size_t off = 0; off < bytes; off += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, bytes - off));
    reqs.emplace_back();
    check_mpi(MPI_Irecv(p + off, n, MPI_BYTE, src, kPayloadTag, comm_, &reqs.back()), chip(), op);
  }
}

void Transport::check_header(const Header& h, size_t bytes, int src, const std::string& op) const {
  if (h.bytes != bytes)
    throw RuntimeFault("chip " + std::to_string(chip()) + ": " + op + ": expected " + std::to_string(bytes) +
                       " bytes from chip " + std::to_string(chip_of(src)) + ", got " + std::to_string(h.bytes));
}

sim::TimeNs Transport::sendrecv(const void* sbuf, size_t sbytes, int dst, void* rbuf, size_t rbytes, int src,
                                sim::TimeNs ready, const std::string& op) {
  if (dst == rank_ && src == rank_) {
    if (sbytes != rbytes) check_header(Header{0, sbytes}, rbytes, src, op);
    if (sbytes) std::copy_n(static_cast<const unsigned char*>(sbuf), sbytes, static_cast<unsigned char*>(rbuf));
    return ready;
  }
  std::vector<MPI_Request> reqs;
  Header out{}, in{};
  post_send(sbuf, sbytes, dst, ready, op, out, reqs);  // nonblocking: the receive below cannot deadlock
  post_recv(rbuf, rbytes, src, in, reqs, op);
  check_mpi(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), chip(), op);
  return std::max(ready, in.arrival_ns);
}

sim::TimeNs Transport::send(const void* buf, size_t bytes, int dst, sim::TimeNs ready, const std::string& op) {
  std::vector<MPI_Request> reqs;
  Header out{};
  post_send(buf, bytes, dst, ready, op, out, reqs);
  check_mpi(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), chip(), op);
  return ready;
}

sim::TimeNs Transport::recv(void* buf, size_t bytes, int src, const std::string& op) {
  std::vector<MPI_Request> reqs;
  Header in{};
  post_recv(buf, bytes, src, in, reqs, op);
  check_mpi(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), chip(), op);
  return in.arrival_ns;
}

}  // namespace shardsim::runtime
