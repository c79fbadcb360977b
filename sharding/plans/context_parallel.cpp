#include "sharding/plans/context_parallel.h"

#include "sharding/plans/registry.h"

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

}  // namespace shardsim::sharding::plans

// ---- Ring attention forward and backward ----
namespace shardsim::sharding::plans {

namespace {

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
  void charge_to(Chip& chip) const {
    if (!k.name.empty()) chip.charge(k, k.name, true);
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
// ready at READY; recorded as a collective region NAME on CHIP's timeline (and, with COMM_KEY and ring.comm, counted
// there). Returns the arrival time.
sim::TimeNs ring_pass(CpRing& ring, Chip& chip, std::vector<Tensor*> send, std::vector<Tensor*> recv,
                      sim::TimeNs ready, const std::string& name, const char* comm_key = nullptr) {
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
  const double before = ring.group.bytes_sent();
  const sim::TimeNs arrival = ring.group.sendrecv(ring.store ? sbuf.data() : nullptr, bytes, next,
                                                  ring.store ? rbuf.data() : nullptr, bytes, prev, ready, name);
  if (chip.tl) chip.tl->record_region(name, "collective", {ready, arrival}, double(bytes));
  if (comm_key && ring.comm) ring.comm->add(comm_key, ring.group.bytes_sent() - before, double(bytes));
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
  return kernels::KernelCost{"cp_grad_accumulate", n, 3 * 4 * n, DType::fp32, {}};
}

}  // namespace

Tensor ring_attention_forward(CpRing& ring, const SeqShard& s, const Tensor& q, const Tensor& k, const Tensor& v,
                              std::vector<Tensor>& lse_out, Chip& chip) {
  sim::TimeNs& t = chip.t;
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
      next_ready = ring_pass(ring, chip, {&kcur, &vcur}, {&knext, &vnext}, kv_ready,
                             "cp ring K/V step" + std::to_string(step), "cp ring K/V");
    }
    t = std::max(t, kv_ready);
    for (int64_t b = 0; b < B; ++b) {
      // One fused launch per step and sequence, as a chip-side ring-attention kernel with a per-token position mask
      // runs it: the FLOPs of the visible (query chunk, key chunk) pairs, the HBM bytes of one call over all this
      // chip's q rows x the block's kv rows scaled by the visible fraction (cutting the rows into zig-zag chunks
      // does not lower the tiles' arithmetic intensity), the shape of that call, and one merge per query chunk.
      double flops = 0, merge_flops = 0, merge_bytes = 0;
      for (size_t qi = 0; qi < nc; ++qi) {
        const Chunk& qc = chunks[qi];
        const Tensor qb = q.rows(b * Tl + qc.local, qc.len);
        bool merged = false;
        for (const Chunk& kc : kv_chunks) {
          if (kc.global > qc.global + qc.len - 1) continue;  // every key in the future of every query: masked
          Tensor ob = Tensor::make(DType::fp32, {qc.len, hq, d}, store), lb = Tensor::make(DType::fp32, {hq, qc.len}, store);
          flops += kernels::attention(qb, kcur.rows(b * Tl + kc.local, kc.len), vcur.rows(b * Tl + kc.local, kc.len), ob,
                                      lb, causal_at(qc.global, kc.global))
                       .flops;
          const size_t i = size_t(b) * nc + qi;
          kernels::KernelCost m;
          if (!has[i]) {  // the first partial is the accumulator (merging it into an empty one changes nothing)
            acc[i] = std::move(ob);
            lse[i] = std::move(lb);
            has[i] = 1;
            Tensor a0 = Tensor::make(DType::fp32, {qc.len, hq, d}, false), l0 = Tensor::make(DType::fp32, {hq, qc.len}, false);
            m = kernels::merge_attention_partials(a0, l0, a0, l0);  // its cost: the fused kernel merges every chunk
          } else {
            m = kernels::merge_attention_partials(acc[i], lse[i], ob, lb);
          }
          if (!merged) {  // the fused kernel merges each query chunk once per step
            merge_flops += m.flops;
            merge_bytes += m.bytes;
            merged = true;
          }
        }
      }
      if (flops <= 0) continue;
      const auto full = kernels::attention_cost(Tl, Tl, hq, hkv, d, s.dtype, DType::fp32);
      const double visible = full.flops > 0 ? flops / full.flops : 1.0;
      const std::string name = "ring attention (block of chip " + std::to_string((me - step + P) % P) + ")";
      chip.charge(kernels::KernelCost{name, flops + merge_flops, full.bytes * visible + merge_bytes, s.dtype, full.shape},
                  name, true);
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
                             Tensor& dk, Tensor& dv, Chip& chip) {
  sim::TimeNs& t = chip.t;
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
          ring_pass(ring, chip, {&kcur, &vcur}, {&knext, &vnext}, kv_ready, "cp ring K/V backward step" + std::to_string(step));
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
      bwd.charge_to(chip);
      accum.charge_to(chip);
    }
    // dK/dV of the block travel with it (fp32 accumulators): after the last step they reach its owner.
    Tensor dknext = Tensor::make(DType::fp32, {N, hkv, d}, store), dvnext = Tensor::make(DType::fp32, {N, hkv, d}, store);
    dkv_ready = ring_pass(ring, chip, {&dkcur, &dvcur}, {&dknext, &dvnext}, t, "cp ring dK/dV step" + std::to_string(step));
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

// ==== plan registration (sharding/plans/registry.h: the descriptor make_registry() lists) ====

namespace shardsim::sharding::plans {

namespace {

// ---- cp: context parallel, ring attention (context_parallel.h) ----
void cp_read(const PlanParse& c, ParallelPlan& p) {
  if (!c.given) return;
  const std::string split = c.par.get_string("cp_split", "zigzag");
  if (split != "zigzag" && split != "contiguous") c.fail("cp_split", "'" + split + "' (zigzag | contiguous)");
  if (c.has("cp_split") && p.cp == 1) c.fail("cp_split", "only used with context parallelism (cp > 1)");
  p.zigzag = split == "zigzag";
  if (p.cp == 1) return;
  if (c.use == SpecUse::mlp) c.not_implemented("cp", "cp: the MLP shards no sequence");
  refuse_unfused_attention(c, "cp");
}
void cp_check(const PlanParse& c, const ParallelPlan& p) {
  if (p.cp > 1 && !c.model.causal)
    c.fail("cp", "ring attention runs the causal mask only (model.causal: false needs cp 1, or ulysses)");
  if (p.cp > 1 && c.model.seq % (p.zigzag ? 2 * p.cp : p.cp) != 0)
    c.fail("cp",
           "seq " + std::to_string(c.model.seq) + " is not divisible by " +
               (p.zigzag ? "2*cp = " + std::to_string(2 * p.cp) + " (zig-zag split)" : "cp = " + std::to_string(p.cp)));
}
std::string cp_text(const ModelSpec&, const ParallelPlan& p, bool train_mode) {
  return "context parallel cp=" + std::to_string(p.cp) + " (ring attention" +
         (train_mode ? " forward and backward" : "") + ", " + (p.zigzag ? "zig-zag" : "contiguous") + " split)";
}

}  // namespace

PlanDescriptor cp_plan_descriptor() {
  PlanDescriptor d;
  d.name = "cp";
  d.title = "context parallel";
  d.summary =
      "ring attention: the sequence split over the cp axis, K/V blocks passed round the ring (zig-zag "
      "split: chip c holds chunks c and 2cp-1-c, balancing the causal mask; "
      "sharding/plans/context_parallel.h)";
  d.axis = "cp";
  d.size = &ParallelPlan::cp;
  d.keys = {{"cp", PlanValue::size, kPlanSizes, "1", "context-parallel (ring attention) size", true},
            {"cp_split", PlanValue::choice, "zigzag | contiguous", "zigzag", "how the sequence is cut over cp", true}};
  d.excludes = {"ulysses"};
  d.needs_attention = true;
  d.modes = {ModeUse::runs, ModeUse::runs, ModeUse::refused,
             "context parallelism is not a serving plan (serve runs tp, pp, dp and ep)"};
  d.read = cp_read;
  d.check = cp_check;
  d.text = cp_text;
  d.example = {plan_test_model("", "cp: 2, cp_split: contiguous"), SpecUse::train, 2, ""};
  d.bad_cases = {{plan_test_model("", "cp: 3"), SpecUse::train, 3, "cp"},
                 {plan_test_model("", "cp_split: contiguous"), SpecUse::train, 1, "cp_split"}};
  return d;
}

}  // namespace shardsim::sharding::plans
