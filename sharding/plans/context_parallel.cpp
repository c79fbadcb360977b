#include "sharding/plans/context_parallel.h"

#include <algorithm>
#include <cstring>

#include "kernels/attention_backward.h"

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

// ---- Ring attention for training (forward and backward) ----
namespace shardsim::sharding::plans {

namespace {

void charge(sim::Timeline& tl, const kernels::KernelCost& k, sim::TimeNs& t) {
  t = tl.compute(k.name, k.flops, k.bytes, runtime::precision_of(k.dtype), t, k.shape).end;
}

// The kernels of one ring step for one sequence, charged as one launch each (a varlen flash-attention kernel over
// the step's chunk pairs, one correction / accumulation kernel), as the non-cp path charges one attention per
// sequence: the per-pair launches of this host loop are not what a device runs.
struct FusedLaunch {
  kernels::KernelCost k;
  void add(const kernels::KernelCost& c) {
    if (k.name.empty()) {
      k = c;
    } else {
      k.flops += c.flops;
      k.bytes += c.bytes;
    }
  }
  void charge_to(sim::Timeline& tl, sim::TimeNs& t) const {
    if (!k.name.empty()) charge(tl, k, t);
  }
};

kernels::AttentionOptions causal_at(int64_t q_offset, int64_t k_offset) {
  kernels::AttentionOptions o;
  o.causal = true;
  o.q_offset = q_offset;
  o.k_offset = k_offset;
  return o;
}

// One cp ring step: SEND's tensors (concatenated) to the next cp rank, RECV's (same sizes) from the previous, data
// ready at READY; recorded as a collective region NAME. Returns the arrival time.
sim::TimeNs ring_pass(CpRing& ring, std::vector<Tensor*> send, std::vector<Tensor*> recv, sim::TimeNs ready,
                      const std::string& name) {
  const int P = ring.group.size(), me = ring.group.rank(), next = (me + 1) % P, prev = (me + P - 1) % P;
  size_t bytes = 0;
  for (const Tensor* s : send) bytes += s->nbytes();
  std::vector<unsigned char> sbuf(ring.store ? bytes : 0), rbuf(ring.store ? bytes : 0);
  if (ring.store) {
    size_t off = 0;
    for (const Tensor* s : send) {
      std::memcpy(sbuf.data() + off, s->data(), s->nbytes());
      off += s->nbytes();
    }
  }
  const sim::TimeNs arrival = ring.group.sendrecv(ring.store ? sbuf.data() : nullptr, bytes, next,
                                                  ring.store ? rbuf.data() : nullptr, bytes, prev, ready, name);
  ring.tl.record_region(name, "collective", {ready, arrival}, double(bytes));
  if (ring.store) {
    size_t off = 0;
    for (Tensor* r : recv) {
      std::memcpy(r->data(), rbuf.data() + off, r->nbytes());
      off += r->nbytes();
    }
  }
  return arrival;
}

Tensor to_compute(const CpRing& ring, const SeqShard& s, const Tensor& f32, runtime::Shape shape) {
  if (!ring.store) return Tensor::make(s.dtype, std::move(shape), false);
  if (s.dtype == DType::fp32) {
    Tensor out = f32;
    return std::move(out).reshaped(std::move(shape));
  }
  return Tensor::from_float(f32.to_float(), s.dtype, std::move(shape));
}

// fp32 ACC rows [R0, ...) += PART; its cost (charged fused per ring step and sequence).
kernels::KernelCost add_rows(bool store, Tensor& acc, int64_t r0, const Tensor& part) {
  if (store) {
    const int64_t per_row = part.numel() / std::max<int64_t>(1, part.dim(0));
    float* a = acc.f32() + r0 * per_row;
    const float* p = part.f32();
    for (int64_t i = 0; i < part.numel(); ++i) a[i] += p[i];
  }
  const double n = double(part.numel());
  return kernels::KernelCost{"cp_grad_accumulate", n, 3 * 4 * n, DType::fp32};
}

}  // namespace

Tensor ring_attention_forward(CpRing& ring, const SeqShard& s, const Tensor& q, const Tensor& k, const Tensor& v,
                              std::vector<Tensor>& lse_out, sim::TimeNs& t) {
  const int64_t Tl = s.seq, hq = s.heads, hkv = s.kv_heads, d = s.head_dim, B = s.batch, N = B * Tl;
  const int P = ring.group.size(), me = ring.group.rank();
  const bool store = ring.store;
  const std::vector<Chunk> chunks = cp_chunks(ring.global_seq, P, me, ring.zigzag);
  const size_t nc = chunks.size();
  std::vector<Tensor> acc(size_t(B) * nc), lse(size_t(B) * nc);
  std::vector<char> has(acc.size(), 0);
  Tensor kcur = k, vcur = v;
  sim::TimeNs kv_ready = t;
  for (int step = 0; step < P; ++step) {
    const std::vector<Chunk> kv_chunks = cp_chunks(ring.global_seq, P, (me - step + P) % P, ring.zigzag);
    Tensor knext, vnext;
    sim::TimeNs next_ready = kv_ready;
    if (step + 1 < P) {  // posted before the compute on the current block: the transfer overlaps it
      knext = Tensor::make(s.dtype, {N, hkv, d}, store);
      vnext = Tensor::make(s.dtype, {N, hkv, d}, store);
      next_ready = ring_pass(ring, {&kcur, &vcur}, {&knext, &vnext}, kv_ready, "cp_ring.kv_step" + std::to_string(step));
    }
    t = std::max(t, kv_ready);
    for (int64_t b = 0; b < B; ++b) {
      FusedLaunch attn, merge;
      for (size_t qi = 0; qi < nc; ++qi) {
        const Chunk& qc = chunks[qi];
        const Tensor qb = q.rows(b * Tl + qc.local, qc.len);
        for (const Chunk& kc : kv_chunks) {
          if (kc.global > qc.global + qc.len - 1) continue;  // every key in the future of every query: masked
          Tensor ob = Tensor::make(DType::fp32, {qc.len, hq, d}, store), lb = Tensor::make(DType::fp32, {hq, qc.len}, store);
          attn.add(kernels::attention(qb, kcur.rows(b * Tl + kc.local, kc.len), vcur.rows(b * Tl + kc.local, kc.len),
                                      ob, lb, causal_at(qc.global, kc.global)));
          const size_t i = size_t(b) * nc + qi;
          if (!has[i]) {
            acc[i] = std::move(ob);
            lse[i] = std::move(lb);
            has[i] = 1;
          } else {
            merge.add(kernels::merge_attention_partials(acc[i], lse[i], ob, lb));
          }
        }
      }
      attn.charge_to(ring.tl, t);
      merge.charge_to(ring.tl, t);
    }
    if (step + 1 < P) {
      kcur = std::move(knext);
      vcur = std::move(vnext);
      kv_ready = next_ready;
    }
  }
  Tensor o = Tensor::make(s.dtype, {N, hq, d}, store);
  lse_out.clear();
  for (int64_t b = 0; b < B; ++b)
    for (size_t qi = 0; qi < nc; ++qi) {
      const size_t i = size_t(b) * nc + qi;
      o.set_rows(b * Tl + chunks[qi].local, to_compute(ring, s, acc[i], {chunks[qi].len, hq, d}));
      lse_out.push_back(std::move(lse[i]));  // per (sequence, chunk): fp32 [Hq, len], the merged log-sum-exp
    }
  return o;
}

void ring_attention_backward(CpRing& ring, const SeqShard& s, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& o, const std::vector<Tensor>& lse, const Tensor& dout, Tensor& dq,
                             Tensor& dk, Tensor& dv, sim::TimeNs& t) {
  const int64_t Tl = s.seq, hq = s.heads, hkv = s.kv_heads, d = s.head_dim, B = s.batch, N = B * Tl;
  const int P = ring.group.size(), me = ring.group.rank();
  const bool store = ring.store;
  const std::vector<Chunk> chunks = cp_chunks(ring.global_seq, P, me, ring.zigzag);
  const size_t nc = chunks.size();
  Tensor dq_acc = Tensor::make(DType::fp32, {N, hq, d}, store);
  Tensor kcur = k, vcur = v;
  Tensor dkcur = Tensor::make(DType::fp32, {N, hkv, d}, store), dvcur = Tensor::make(DType::fp32, {N, hkv, d}, store);
  sim::TimeNs kv_ready = t, dkv_ready = t;
  for (int step = 0; step < P; ++step) {
    const std::vector<Chunk> kv_chunks = cp_chunks(ring.global_seq, P, (me - step + P) % P, ring.zigzag);
    Tensor knext, vnext;
    sim::TimeNs next_ready = kv_ready;
    if (step + 1 < P) {  // K/V for the next step, posted first (it does not depend on this step's compute)
      knext = Tensor::make(s.dtype, {N, hkv, d}, store);
      vnext = Tensor::make(s.dtype, {N, hkv, d}, store);
      next_ready =
          ring_pass(ring, {&kcur, &vcur}, {&knext, &vnext}, kv_ready, "cp_ring.bwd_kv_step" + std::to_string(step));
    }
    t = std::max(t, std::max(kv_ready, dkv_ready));
    for (int64_t b = 0; b < B; ++b) {
      FusedLaunch bwd, accum;
      for (size_t qi = 0; qi < nc; ++qi) {
        const Chunk& qc = chunks[qi];
        const int64_t qr = b * Tl + qc.local;
        const Tensor qb = q.rows(qr, qc.len), ob = o.rows(qr, qc.len), dob = dout.rows(qr, qc.len);
        for (const Chunk& kc : kv_chunks) {
          if (kc.global > qc.global + qc.len - 1) continue;
          const int64_t kr = b * Tl + kc.local;
          Tensor dqp = Tensor::make(DType::fp32, {qc.len, hq, d}, store),
                 dkp = Tensor::make(DType::fp32, {kc.len, hkv, d}, store),
                 dvp = Tensor::make(DType::fp32, {kc.len, hkv, d}, store);
          bwd.add(kernels::attention_backward(qb, kcur.rows(kr, kc.len), vcur.rows(kr, kc.len), ob,
                                              lse[size_t(b) * nc + qi], dob, dqp, dkp, dvp,
                                              causal_at(qc.global, kc.global)));
          accum.add(add_rows(store, dq_acc, qr, dqp));
          accum.add(add_rows(store, dkcur, kr, dkp));
          accum.add(add_rows(store, dvcur, kr, dvp));
        }
      }
      bwd.charge_to(ring.tl, t);
      accum.charge_to(ring.tl, t);
    }
    // dK/dV of the block travel with it (fp32 accumulators): after the last step they reach its owner.
    Tensor dknext = Tensor::make(DType::fp32, {N, hkv, d}, store), dvnext = Tensor::make(DType::fp32, {N, hkv, d}, store);
    dkv_ready = ring_pass(ring, {&dkcur, &dvcur}, {&dknext, &dvnext}, t, "cp_ring.dkv_step" + std::to_string(step));
    dkcur = std::move(dknext);
    dvcur = std::move(dvnext);
    if (step + 1 < P) {
      kcur = std::move(knext);
      vcur = std::move(vnext);
      kv_ready = next_ready;
    }
  }
  t = std::max(t, dkv_ready);
  dq = to_compute(ring, s, dq_acc, {N, hq, d});
  dk = to_compute(ring, s, dkcur, {N, hkv, d});
  dv = to_compute(ring, s, dvcur, {N, hkv, d});
}

}  // namespace shardsim::sharding::plans
