// all_to_all, all_to_allv over real ranks (ctest runs them at np 1, 2, 3, 4 and 8):
//  - Matrix: every algorithm the registry lists (and auto) x dtypes x ops x counts, bit-exact against the
//    single-device reference, special values included (tests/mpi/collective_params.h); a new algorithm is
//    covered by registering it.
//  - ClosedForm / Correctness: simulated times against closed forms or first-principles schedules of the
//    documented cost model (docs/MODEL.md), and cases the matrix does not reach (every root, uneven counts,
//    other topologies), checked against expectations computed here (tests/mpi/algorithm_helpers.h).
#include "mpi/algorithm_helpers.h"
#include "mpi/collective_params.h"

using namespace algtest;

class AllToAllMatrix : public CollectiveTest {};
TEST_P(AllToAllMatrix, MatchesReference) { run_matrix(); }
SHARDSIM_REGISTRY_SUITES(AllToAllMatrix, Collective::all_to_all);

class AllToAllvMatrix : public CollectiveTest {};
TEST_P(AllToAllvMatrix, MatchesReference) { run_matrix(); }
SHARDSIM_REGISTRY_SUITES(AllToAllvMatrix, Collective::all_to_allv);

// ---- closed forms and all to all-specific cases (moved from algorithms_test.cpp) ----

// all_to_all.h: rank r sends its block to r+s for s = 1..p-1, all injected at READY in one step with the all-pairs
// pattern. Per direction d of the ring, every link carries k_d = sum over the s routed that way of hops(s) flows.
// Where some block of that direction takes >= 2 hops, flows of several senders meet on every link of that
// direction (crossing-flow contention, docs/MODEL.md): each of its blocks runs concurrently at B/k_d and takes
// hops(s) alpha + k_d S/B. Otherwise (p <= 3: one-hop blocks only) the blocks leaving through the same port queue
// in s order. By symmetry every rank finishes at the same time.
TEST(ClosedForm, AllToAllPortQueues) {
  const int p = world_size(), r = world_rank();
  const size_t block = 2048;  // int32 elements per peer
  for (double bw : kBws)
    for (double alpha : kAlphas) {
      Fixture f(ring_topo(bw, alpha));
      std::vector<int32_t> in(block * size_t(p)), out(block * size_t(p), -1);
      for (size_t i = 0; i < in.size(); ++i) in[i] = int32_t(r * 100000 + int(i));
      const auto res = collectives::all_to_all(f.tp, in.data(), out.data(), in.size(), DType::int32, 0.0);
      EXPECT_EQ(res.algorithm, "direct");
      std::map<int, int> flows, longest;  // per direction: k_d and the longest route
      for (int s = 1; s < p; ++s) {
        flows[ring_dir(p, 0, s)] += ring_hops(p, 0, s);
        longest[ring_dir(p, 0, s)] = std::max(longest[ring_dir(p, 0, s)], ring_hops(p, 0, s));
      }
      std::map<int, double> port;
      double want = 0;
      for (int s = 1; s < p; ++s) {
        const int d = ring_dir(p, 0, s);
        double& busy = port[d];
        busy += block * 4.0 / bw;
        const double done = longest[d] >= 2 ? flows[d] * block * 4.0 / bw : busy;
        want = std::max(want, done + ring_hops(p, 0, s) * alpha);
      }
      expect_time(res.span.duration(), want, "all_to_all");
      expect_time(collectives::estimate_ns(Collective::all_to_all, "direct", f.tp, block * 4.0 * p), want,
                  "all_to_all estimate");
      bool ok = true;
      for (int q = 0; q < p; ++q)
        for (size_t k = 0; k < block; ++k)
          ok = ok && out[size_t(q) * block + k] == int32_t(q * 100000 + r * int(block) + int(k));
      EXPECT_TRUE(ok) << "all_to_all data";
    }
}

TEST(Correctness, AllToAllvPerPairCountsZeroBlocksAndDisplacements) {
  const int p = world_size(), r = world_rank();
  Fixture f(ring_topo(100, 500));
  // Byte b of element k of the block rank s sends to rank d.
  auto elem_byte = [](int s, int d, size_t k, size_t b) {
    return static_cast<unsigned char>((s * 37 + d * 11 + int(k) * 3 + int(b) * 101 + 1) & 0xFF);
  };
  for (int variant = 0; variant < 3; ++variant)
    for (DType t : {DType::uint8, DType::int32, DType::fp64}) {
      auto n = [&](int s, int d) -> size_t {
        if (variant == 0) return size_t((s * 3 + d * 5 + 1) % 4);                   // 0..3, zeros scattered
        if (variant == 1) return s == d ? 0 : size_t(50 + 17 * ((s + 2 * d) % 3));  // nothing to self
        return d == 0 ? 0 : size_t(s + d);                                          // nobody sends to rank 0
      };
      const size_t es = runtime::dtype_size(t);
      std::vector<size_t> sc(static_cast<size_t>(p)), sd(static_cast<size_t>(p)), rc(static_cast<size_t>(p)), rd(static_cast<size_t>(p));
      size_t pos = 0;
      for (int j = 0; j < p; ++j) {  // send blocks in rank order, one spare element after each
        sc[size_t(j)] = n(r, j);
        sd[size_t(j)] = pos;
        pos += sc[size_t(j)] + 1;
      }
      Bytes send(pos * es, 0xEE);
      for (int j = 0; j < p; ++j)
        for (size_t k = 0; k < sc[size_t(j)]; ++k)
          for (size_t b = 0; b < es; ++b) send[(sd[size_t(j)] + k) * es + b] = elem_byte(r, j, k, b);
      pos = 0;
      for (int j = p - 1; j >= 0; --j) {  // receive blocks in reverse rank order, two spare elements before each
        pos += 2;
        rc[size_t(j)] = n(j, r);
        rd[size_t(j)] = pos;
        pos += rc[size_t(j)];
      }
      Bytes recv(pos * es, 0x5A), want(pos * es, 0x5A);
      for (int j = 0; j < p; ++j)
        for (size_t k = 0; k < rc[size_t(j)]; ++k)
          for (size_t b = 0; b < es; ++b) want[(rd[size_t(j)] + k) * es + b] = elem_byte(j, r, k, b);
      const Bytes send_copy = send;
      const auto res = collectives::all_to_allv(f.tp, send.data(), sc, sd, recv.data(), rc, rd, t, 0.0);
      EXPECT_TRUE(same_bytes(recv, want, es)) << "all_to_allv variant " << variant << " " << dt(t);
      EXPECT_EQ(send, send_copy) << "send buffer modified";
      EXPECT_EQ(res.algorithm, "direct");
      size_t sent_elems = 0;
      for (int j = 0; j < p; ++j) sent_elems += j == r ? 0 : sc[size_t(j)];
      EXPECT_DOUBLE_EQ(res.bytes_sent, double(sent_elems * es)) << "bytes_sent counts only blocks to other chips";
    }
}

TEST(Correctness, AllToAllEqualBlocksInPlaceAndOut) {
  const int p = world_size(), r = world_rank();
  Fixture f(ring_topo(100, 500));
  for (size_t block : {size_t(0), size_t(1), size_t(7), size_t(500)})
    for (bool in_place : {false, true}) {
      const size_t count = block * size_t(p);
      std::vector<int64_t> send(count), recv(count, -7);
      for (size_t j = 0; j < count; ++j) send[j] = int64_t(r) * 1000000 + int64_t(j);
      void* out = in_place ? static_cast<void*>(send.data()) : recv.data();
      collectives::all_to_all(f.tp, send.data(), out, count, DType::int64, 0.0, opts("pairwise"));
      const auto& got = in_place ? send : recv;
      size_t bad = 0;
      for (int q = 0; q < p; ++q)
        for (size_t k = 0; k < block; ++k)
          bad += got[size_t(q) * block + k] != int64_t(q) * 1000000 + int64_t(size_t(r) * block + k);
      EXPECT_EQ(bad, 0u) << "all_to_all block " << block << (in_place ? " in-place" : "");
    }
}
