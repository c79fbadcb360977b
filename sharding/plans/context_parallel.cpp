#include "sharding/plans/context_parallel.h"

#include <algorithm>
#include <cstring>

namespace shardsim::sharding::plans {

std::vector<Chunk> cp_chunks(int64_t T, int cp, int c, bool zigzag) {
  if (cp == 1) return {{0, 0, T}};
  if (zigzag) {
    const int64_t n = T / (2 * cp);
    return {{0, c * n, n}, {n, (2 * cp - 1 - c) * n, n}};
  }
  return {{0, c * (T / cp), T / cp}};
}

Tensor ring_attention(PlanContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                      const std::vector<Chunk>& attn_chunks, int c_idx, sim::Memory& memory, uint64_t ring_buffers) {
  const auto& s = ctx.s;
  const auto& p = ctx.p;
  Chip& chip = ctx.chip;
  const int64_t T = s.seq, nq = q.dim(1), d = q.dim(2);
  int64_t n_attn = 0;
  for (const auto& c : attn_chunks) n_attn += c.len;
  std::vector<Tensor> acc, lse;
  const bool real = q.has_storage();
  init_acc(attn_chunks, nq, d, acc, lse, real);
  // Local chunk layout of q/k/v follows attn_chunks.
  if (p.cp == 1) {
    attend(chip, s, q, attn_chunks, k, v, attn_chunks, acc, lse, "attention");
  } else {
    // Ring attention: the K/V block (with the chunk positions of its owner) goes around the cp ring.
    runtime::Transport& cp_group = ctx.cp;
    const int P = p.cp;
    const int next = (c_idx + 1) % P, prev = (c_idx + P - 1) % P;
    Tensor kcur = k, vcur = v;
    sim::TimeNs kv_ready = chip.t;
    const sim::TimeNs q_ready = chip.t;
    const size_t kvb = k.nbytes();
    auto ring_mem = memory.scoped("ring K/V receive buffers", ring_buffers);
    for (int step = 0; step < P; ++step) {
      const int owner = (c_idx - step + P) % P;  // whose chunks we hold now
      const std::vector<Chunk> owner_chunks = cp_chunks(T, P, owner, p.zigzag);
      Tensor knext, vnext;
      sim::TimeNs next_ready = kv_ready;
      if (step + 1 < P) {  // post the exchange first: it overlaps the compute below in simulated time
        knext = Tensor::make(s.dtype, k.shape(), real);
        vnext = Tensor::make(s.dtype, v.shape(), real);
        // Shape-only: no staging buffers, null pointers, and only the header travels (runtime/transport.h).
        std::vector<unsigned char> sbuf(real ? 2 * kvb : 0), rbuf(real ? 2 * kvb : 0);
        if (real) {
          std::memcpy(sbuf.data(), kcur.data(), kvb);
          std::memcpy(sbuf.data() + kvb, vcur.data(), kvb);
        }
        const double before = cp_group.bytes_sent();
        next_ready = cp_group.sendrecv(real ? sbuf.data() : nullptr, 2 * kvb, next, real ? rbuf.data() : nullptr,
                                       2 * kvb, prev, kv_ready, "cp ring K/V step" + std::to_string(step));
        chip.tl->record_region("cp ring K/V step" + std::to_string(step), "collective", {kv_ready, next_ready},
                               static_cast<double>(2 * kvb));
        ctx.comm.add("cp ring K/V", cp_group.bytes_sent() - before, static_cast<double>(2 * kvb));
        if (real) {
          std::memcpy(knext.data(), rbuf.data(), kvb);
          std::memcpy(vnext.data(), rbuf.data() + kvb, kvb);
        }
      }
      chip.t = std::max(chip.t, std::max(q_ready, kv_ready));
      attend(chip, s, q, attn_chunks, kcur, vcur, owner_chunks, acc, lse,
             "ring attention (block of chip " + std::to_string(owner) + ")");
      if (step + 1 < P) {
        kcur = std::move(knext);
        vcur = std::move(vnext);
        kv_ready = next_ready;
      }
    }
  }
  return finish_acc(attn_chunks, acc, s.dtype, n_attn).reshaped({n_attn, nq * d});
}

}  // namespace shardsim::sharding::plans
