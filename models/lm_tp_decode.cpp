// LmTpTrainer's serving mode (models/lm_tp.h, serve_step): an iteration of prefill and decode rows through the
// executor's own pieces (the embedding, the block program with its KV-cache attention, the head), on this chip's
// shards of the mesh.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/all_gather.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/norm.h"
#include "models/lm_tp.h"
#include "models/lm_tp_decode.h"
#include "sharding/plans/pipeline_schedule.h"
#include "sharding/plans/tensor_parallel.h"

namespace shardsim::models {

using runtime::DType;
using runtime::Tensor;

void LmTpTrainer::check_servable() const {
  // The plans serving refuses (sp, fused, cp, ulysses, interleaved stages) are refused at parse, from the plan
  // registry's modes (sharding/plans/registry.h); the model is checked here.
  if (global_.vocab == 0)
    throw std::invalid_argument("model.vocab: serving needs a language model (a vocabulary), not a block stack");
}

sharding::plans::KvCache LmTpTrainer::make_kv_cache(int64_t capacity) const {
  return {local_.layers, local_.kv_heads, local_.head_dim, local_.dtype, capacity, store_};
}

std::vector<std::vector<float>> LmTpTrainer::serve_logits(const Tensor& x_last, int64_t B, sim::TimeNs& t) {
  const ModelSpec& c = local_;
  Tensor xf = make(c.dtype, {B, c.hidden});
  const auto norm = c.layernorm() ? kernels::layernorm(x_last, work_.final_norm, work_.final_norm_b, xf, c.norm_eps)
                                  : kernels::rmsnorm(x_last, work_.final_norm, xf, c.norm_eps);
  charge(norm, t);
  Tensor head_t;
  const Tensor& head = lm_head_weight(c, work_, head_t);
  sharding::plans::Chip chip{&tl_, t};
  auto ctx = context(chip);
  ctx.n_attn = ctx.n_resid = B;
  Tensor logits = std::move(sharding::plans::column_parallel(ctx, xf, {&head}, {"gemm.head"}, "before the head",
                                                             "gemm.head", "gemm.head")[0]);
  t = chip.t;
  // The vocab-parallel logits [B, V/T] gathered over tp (vLLM's tensor_model_parallel_gather before sampling).
  const int64_t Vl = c.vocab, V = global_.vocab;
  Tensor all = make(c.dtype, {int64_t(tp_size_) * B * Vl});
  if (tp_size_ > 1) {
    collectives::CollectiveOptions o;
    o.algorithm = algorithm_;
    o.name = "all_gather.logits";
    t = collectives::all_gather(mesh_["tp"], logits.data_if_stored(), all.data_if_stored(), size_t(all.numel()),
                                c.dtype, t, o)
            .span.end;
  } else if (store_) {
    all = std::move(logits).reshaped({B * Vl});
  }
  std::vector<std::vector<float>> out;
  if (!store_) return out;
  out.assign(size_t(B), std::vector<float>(size_t(V)));
  for (int p = 0; p < tp_size_; ++p)
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j < Vl; ++j) out[size_t(i)][size_t(p * Vl + j)] = all.get((p * B + i) * Vl + j);
  return out;
}

LmServeBatch LmTpTrainer::ep_share(const LmServeBatch& batch, std::vector<int64_t>& ep_rows,
                                   std::vector<size_t>& index) const {
  ep_rows.assign(size_t(ep_size_), 0);
  index.clear();
  LmServeBatch own;
  own.repeat_blocks = batch.repeat_blocks;
  size_t row = 0;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const sharding::plans::KvSeq& q = batch.seqs[i];
    const int home = int(((q.slot % ep_size_) + ep_size_) % ep_size_);
    ep_rows[size_t(home)] += q.rows;
    if (home == ep_rank_) {
      own.seqs.push_back(q);
      index.push_back(i);
      if (!batch.tokens.empty() && row + size_t(q.rows) <= batch.tokens.size())
        own.tokens.insert(own.tokens.end(), batch.tokens.begin() + std::ptrdiff_t(row),
                          batch.tokens.begin() + std::ptrdiff_t(row + size_t(q.rows)));
    }
    row += size_t(std::max<int64_t>(q.rows, 0));
  }
  return own;
}

Tensor LmTpTrainer::serve_input(const std::vector<int64_t>& tokens, const std::vector<int64_t>& pos, sim::TimeNs& t) {
  const ModelSpec& c = local_;
  const int64_t N = int64_t(pos.size());
  Tensor x = make(c.dtype, {N, c.hidden});
  if (!owns_embed_) {  // the previous stage's rows
    runtime::RecvOp in{x.data_if_stored(), size_t(x.nbytes()), pp_rank_ - 1, 0};
    const sim::TimeNs start = t;
    mesh_["pp"].exchange({}, std::span<runtime::RecvOp>(&in, 1), "pp.recv_activation");
    t = std::max(t, in.arrival);
    tl_.record_region("pp.recv_activation", "collective", {start, t}, double(in.bytes));
    return x;
  }
  x = on_chip(t, [&](auto& ctx) {  // the tp unit's vocab-parallel embedding, as the forward's
    ctx.n_attn = ctx.n_resid = N;
    return sharding::plans::vocab_parallel_embedding(ctx, work_.embed, tokens, tp_rank_ * c.vocab, global_.vocab,
                                                     std::move(x));
  });
  if (c.position == sharding::PositionKind::learned) {
    Tensor p = make(c.dtype, {N, c.hidden});
    charge(kernels::embedding_forward(work_.pos_embed, pos, 0, global_.position_rows(), p), t);
    charge(kernels::add_inplace(x, p), t);
  }
  return x;
}

void LmTpTrainer::serve_blocks(const LmServeBatch& whole, const LmServeBatch& batch, sharding::plans::KvCache& cache,
                               const std::vector<int64_t>& pos, std::vector<int64_t>* ep_rows, Tensor& x,
                               sim::TimeNs& t) {
  const bool shared = whole.origin_ns >= 0;
  sharding::plans::TokenLayout lay;
  lay.batch = int64_t(batch.seqs.size());
  lay.pos = pos;
  // REPEAT_BLOCKS: once the stage's blocks run periodically, the rest take the period (see LmServeBatch); not for
  // MoE layers that differ from block to block (dense layers among them, a skewed declared routing: each layer
  // draws its own, or a histogram: each layer may have its own row). Uniform routing routes every layer alike.
  const bool moe_varies = global_.moe && (global_.moe->dense_layers > 0 || global_.moe->layer_step > 1 ||
                                          global_.moe->routing.skew > 0 || !global_.moe->routing.histogram.empty());
  const bool repeat = batch.repeat_blocks && !store_ && !moe_varies;
  const int64_t blocks = chunk_len_[0];
  sim::TimeNs prev_span = -1, prev_lead = t - tl_.host_time(), prev_host = tl_.host_time(), prev_start = t;
  for (int64_t l = 0; l < blocks; ++l) {
    const int64_t li = chunk_first_[0] + l;
    const sim::TimeNs start = t;
    const int64_t gated0 = tl_.host_gated();
    const sharding::plans::KvAttention kv{&cache, li, &batch.seqs};
    sharding::plans::BlockWeights bw = block_weights(li);
    if (ep_rows) bw.moe.ep_tokens = ep_rows;
    x = on_chip(t, [&](auto& ctx) {
      ctx.n_attn = ctx.n_resid = int64_t(pos.size());
      ctx.kv = &kv;
      return sharding::plans::block_forward(ctx, lay, bw, x);
    });
    if (!repeat || l + 1 == blocks) continue;
    // Periodic from here (every later block runs exactly as this one; see LmServeBatch) when the host's lead over
    // the device (t - host issue clock) did not shrink over the block and either the host gated none of its
    // kernels or the block's span equals the previous one's.
    const sim::TimeNs span = t - start, lead = t - tl_.host_time(), host_step = tl_.host_time() - prev_host;
    const double tol = 1e-9 * std::max(span, 1.0);
    const bool same = l > 0 && std::abs(span - prev_span) <= tol;
    // A shared timeline: this block and the one before it clear of the flows booked before, the rest (projected)
    // ending before any flow booked after (LmServeBatch).
    const bool clear = !shared || (start >= whole.quiet_after_ns && (l == 0 || prev_start >= whole.quiet_after_ns) &&
                                   t + span * double(blocks - 1 - l) <= whole.horizon_ns);
    prev_start = start;
    // With ep the chips' blocks are coupled through the MoE exchange (a chip without sequences waits in it), and
    // the first block's span on a chip depends on when the others reached it: two equal spans in a row are asked.
    double periodic = clear && lead >= prev_lead - tol && ((tl_.host_gated() == gated0 && ep_size_ == 1) || same) ? 1 : 0;
    if (tp_size_ > 1) mesh_["tp"].allreduce(std::span<double>(&periodic, 1), runtime::Reduce::min, "serve blocks periodic");
    if (ep_size_ > 1) mesh_["ep"].allreduce(std::span<double>(&periodic, 1), runtime::Reduce::min, "serve blocks periodic");
    if (periodic > 0) {
      const double rest = double(blocks - 1 - l);
      t += span * rest;
      tl_.host_sync(tl_.host_time() + host_step * rest);  // the host issued the skipped blocks' kernels too
      break;
    }
    prev_span = span;
    prev_lead = lead;
    prev_host = tl_.host_time();
  }
}

namespace {
// ROWS [n, V] summed over GROUP's chips (host-side: each row's logits from the chip holding them, zeros elsewhere)
// at rows AT (the whole's n rows; AT empty: the same rows).
std::vector<std::vector<float>> sum_logits(runtime::Transport& group, const std::vector<std::vector<float>>& rows,
                                           const std::vector<size_t>& at, int64_t n, int64_t V, const char* name) {
  std::vector<double> flat(size_t(n * V), 0.0);
  for (size_t i = 0; i < rows.size() && (at.empty() || i < at.size()); ++i)
    for (int64_t j = 0; j < V; ++j) flat[(at.empty() ? i : at[i]) * size_t(V) + size_t(j)] = rows[i][size_t(j)];
  group.allreduce(std::span<double>(flat), runtime::Reduce::sum, name);
  std::vector<std::vector<float>> out(static_cast<size_t>(n), std::vector<float>(static_cast<size_t>(V)));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < V; ++j) out[size_t(i)][size_t(j)] = float(flat[size_t(i * V + j)]);
  return out;
}
}  // namespace

void LmTpTrainer::serve_stages(const LmServeBatch& whole, sim::TimeNs stage_start, sim::TimeNs t, LmServeResult& r) {
  const bool shared = whole.origin_ns >= 0;
  // The chip's end: its clock or its timeline's last event (an outgoing pp send's end), unless that event is a flow
  // booked outside this iteration (a shared timeline's KV cache transfer, LmServeBatch::foreign_end_ns).
  const sim::TimeNs last = tl_.end_time();
  r.chip_ns = shared && last <= whole.foreign_end_ns ? t : std::max(t, last);
  if (shared) r.chip_ns -= whole.origin_ns;
  // Every stage's span on this replica (the latest chip of each), agreed by the replica's chips only: dp replicas
  // serve their own batches (apps/serve.cpp).
  std::vector<double> spans(size_t(2 * pp_size_), 0.0);
  spans[size_t(2 * pp_rank_)] = shared ? stage_start - whole.origin_ns : stage_start;
  spans[size_t(2 * pp_rank_ + 1)] = r.chip_ns;
  mesh_.excluding("dp").allreduce(std::span<double>(spans), runtime::Reduce::max, "serve iteration stages");
  for (int s = 0; s < pp_size_; ++s) {
    r.stages.push_back({spans[size_t(2 * s)], spans[size_t(2 * s + 1)]});
    r.ns = std::max(r.ns, spans[size_t(2 * s + 1)]);
  }
}

LmServeResult LmTpTrainer::serve_step(const LmServeBatch& whole, sharding::plans::KvCache& cache) {
  check_servable();
  LmServeResult r;
  if (whole.seqs.empty()) return r;
  for (const auto& s : whole.seqs)
    if (s.rows < 1 || s.past < 0)
      throw std::invalid_argument("serve_step: a sequence needs rows >= 1 and past >= 0 (got rows " +
                                  std::to_string(s.rows) + ", past " + std::to_string(s.past) + ")");
  // Expert parallelism: the replica's ep chips share its batch, each attending its own sequences (ep_share) while
  // the MoE layers exchange their rows over ep; a chip may have none this iteration (it still joins the exchange).
  std::vector<int64_t> ep_rows;
  std::vector<size_t> index;
  const LmServeBatch own = ep_size_ > 1 ? ep_share(whole, ep_rows, index) : LmServeBatch{};
  const LmServeBatch& batch = ep_size_ > 1 ? own : whole;
  const int64_t B = int64_t(batch.seqs.size()), V = global_.vocab;
  std::vector<int64_t> pos;  // every new row's position, sequence-major
  for (const auto& s : batch.seqs)
    for (int64_t i = 0; i < s.rows; ++i) pos.push_back(s.past + i);
  const int64_t N = int64_t(pos.size());
  if (store_ && int64_t(batch.tokens.size()) != N)
    throw std::invalid_argument("serve_step: " + std::to_string(batch.tokens.size()) + " tokens for " +
                                std::to_string(N) + " new rows");
  const std::vector<int64_t> tokens = batch.tokens.empty() ? std::vector<int64_t>(size_t(N), 0) : batch.tokens;
  const bool shared = whole.origin_ns >= 0;  // a shared timeline (LmServeBatch): no reset, from the origin
  if (!shared) tl_.reset();
  fused_ops_.clear();
  attention_ns_ = 0;  // this iteration's (on_chip adds the block's attention)
  sim::TimeNs t = shared ? whole.origin_ns : 0.0;
  if (shared) tl_.host_sync(t);  // the host starts issuing at the origin, as from 0 on a fresh timeline
  Tensor x = serve_input(tokens, pos, t);
  const sim::TimeNs stage_start = owns_embed_ ? (shared ? whole.origin_ns : 0.0) : t;
  serve_blocks(whole, batch, cache, pos, ep_size_ > 1 ? &ep_rows : nullptr, x, t);
  if (!owns_head_) {  // on to the next stage
    const runtime::SendOp out{x.data_if_stored(), size_t(x.nbytes()), pp_rank_ + 1, t};
    mesh_["pp"].exchange(std::span<const runtime::SendOp>(&out, 1), {}, "pp.send_activation");
    tl_.record_region("pp.send_activation", "collective", {t, t}, double(x.nbytes()));
  } else {
    Tensor last = make(local_.dtype, {B, local_.hidden});  // each sequence's last new row (the next token's)
    if (store_) {
      int64_t r0 = 0;
      for (int64_t i = 0; i < B; ++i) {
        r0 += batch.seqs[size_t(i)].rows;
        last.set_rows(i, x.rows(r0 - 1, 1));
      }
    }
    r.logits = serve_logits(last, B, t);
  }
  // The last stage's logits on every stage, then every sequence's on every ep chip (host-side).
  if (pp_size_ > 1 && store_)
    r.logits = sum_logits(mesh_["pp"], owns_head_ ? r.logits : std::vector<std::vector<float>>{}, {}, B, V,
                          "serve logits pp");
  if (ep_size_ > 1 && store_)
    r.logits = sum_logits(mesh_["ep"], r.logits, index, int64_t(whole.seqs.size()), V, "serve logits ep");
  serve_stages(whole, stage_start, t, r);
  return r;
}

namespace {

// [first, first + count) of a range; empty when count <= 0.
struct Range {
  int64_t first = 0, count = 0;
  Range meet(const Range& o) const {
    const int64_t a = std::max(first, o.first), b = std::min(first + count, o.first + o.count);
    return {a, std::max<int64_t>(0, b - a)};
  }
};

// A layout's chip at index I of its ranks: its tp and pp coordinates, its layers and the KV heads it holds; with
// the heads replicated over tp (tp above the KV heads), which copy of its head it holds (COPY, of REPS).
struct KvChip {
  Range layers, heads;
  int copy = 0, reps = 1;
};

KvChip kv_chip(const KvLayout& l, int64_t layers, int64_t kv_heads, size_t i) {
  const int t = int(i % size_t(l.tp)), s = int(i / size_t(l.tp));
  const std::vector<int64_t> per = sharding::plans::stage_layers(layers, l.pp, l.layers_per_stage);
  KvChip c;
  for (int k = 0; k < s; ++k) c.layers.first += per[size_t(k)];
  c.layers.count = per[size_t(s)];
  if (kv_heads % l.tp == 0) {
    c.heads = {t * (kv_heads / l.tp), kv_heads / l.tp};
  } else {
    c.reps = l.tp / int(kv_heads);  // tp ranks per head
    c.heads = {t / c.reps, 1};
    c.copy = t % c.reps;
  }
  return c;
}

// The KV heads sender A sends receiver B: those both hold, when A holds the copy B takes them from (B's copy mod
// A's copies: equal layouts pair each chip with its peer; a head held once is sent by its one holder).
Range pair_heads(const KvChip& a, const KvChip& b) {
  return a.copy == b.copy % a.reps ? a.heads.meet(b.heads) : Range{};
}

void check_layout(int ranks, const KvLayout& l, int64_t layers, int64_t kv_heads, const char* what) {
  const std::string name = std::string("kv_transfer: the ") + what + " layout";
  if (l.tp < 1 || l.pp < 1 || l.ranks.size() != size_t(l.tp) * size_t(l.pp))
    throw std::invalid_argument(name + " needs tp x pp ranks (tp " + std::to_string(l.tp) + ", pp " +
                                std::to_string(l.pp) + ", " + std::to_string(l.ranks.size()) + " ranks)");
  for (const int r : l.ranks)
    if (r < 0 || (ranks >= 0 && r >= ranks))
      throw std::invalid_argument(name + ": rank " + std::to_string(r) + " not in the transport");
  if (kv_heads % l.tp != 0 && l.tp % kv_heads != 0)
    throw std::invalid_argument(name + ": " + std::to_string(kv_heads) + " KV heads and tp " + std::to_string(l.tp) +
                                " (one must divide the other)");
  (void)sharding::plans::stage_layers(layers, l.pp, l.layers_per_stage);  // throws on a bad split
}

void check_layouts(int ranks, const KvLayout& from, const KvLayout& to, int64_t layers, int64_t kv_heads) {
  check_layout(ranks, from, layers, kv_heads, "sending");
  check_layout(ranks, to, layers, kv_heads, "receiving");
  for (const int r : from.ranks)
    if (std::find(to.ranks.begin(), to.ranks.end(), r) != to.ranks.end())
      throw std::invalid_argument("kv_transfer: rank " + std::to_string(r) + " is in both layouts");
}

}  // namespace

std::vector<KvMessage> kv_transfer_messages(int64_t layers, int64_t kv_heads, int64_t head_dim, double element_bytes,
                                            const KvLayout& from, const KvLayout& to) {
  check_layouts(-1, from, to, layers, kv_heads);
  std::vector<KvMessage> out;
  for (size_t i = 0; i < from.ranks.size(); ++i) {
    const KvChip a = kv_chip(from, layers, kv_heads, i);
    for (size_t j = 0; j < to.ranks.size(); ++j) {
      const KvChip b = kv_chip(to, layers, kv_heads, j);
      const Range lay = a.layers.meet(b.layers), heads = pair_heads(a, b);
      if (lay.count == 0 || heads.count == 0) continue;
      out.push_back({from.ranks[i], to.ranks[j],
                     double(lay.count) * 2.0 * double(heads.count) * double(head_dim) * element_bytes});
    }
  }
  return out;
}

sim::TimeNs kv_transfer(runtime::Transport& t, sharding::plans::KvCache& cache, int64_t layers, int64_t kv_heads,
                        const KvLayout& from, const KvLayout& to, const KvTransfer& x) {
  check_layouts(t.size(), from, to, layers, kv_heads);
  if (x.tokens < 1) throw std::invalid_argument("kv_transfer: " + std::to_string(x.tokens) + " tokens (at least one)");
  const int me = t.rank();
  const auto pos = [me](const KvLayout& l) { return size_t(std::find(l.ranks.begin(), l.ranks.end(), me) - l.ranks.begin()); };
  const size_t i_from = pos(from), i_to = pos(to);
  const bool sender = i_from < from.ranks.size(), receiver = i_to < to.ranks.size();
  if (!sender && !receiver) return x.ready;
  const KvLayout& mine = sender ? from : to;
  const KvChip self = kv_chip(mine, layers, kv_heads, sender ? i_from : i_to);
  const bool store = cache.stores() && !t.shape_only();
  // This chip's cache rows: [tokens, its heads, head_dim]; a head's slice within a row.
  const Tensor probe = cache.keys(0, sender ? x.slot_from : x.slot_to, x.tokens);  // a receiver's slot is made here
  const size_t row = probe.nbytes() / size_t(x.tokens), per_head = row / size_t(self.heads.count);
  const std::string op = "serve.kv_transfer";
  const KvLayout& other = sender ? to : from;
  sim::TimeNs done = sender ? x.ready : 0.0;
  // Receiver: its layers' K and V, filled message by message, appended at the end.
  std::vector<Tensor> k_in, v_in;
  if (receiver && store)
    for (int64_t l = 0; l < self.layers.count; ++l) {
      k_in.push_back(cache.keys(l, x.slot_to, x.tokens));
      v_in.push_back(cache.values(l, x.slot_to, x.tokens));
    }
  for (size_t j = 0; j < other.ranks.size(); ++j) {
    const KvChip peer = kv_chip(other, layers, kv_heads, j);
    const Range lay = self.layers.meet(peer.layers), heads = sender ? pair_heads(self, peer) : pair_heads(peer, self);
    if (lay.count == 0 || heads.count == 0) continue;
    const size_t slice = per_head * size_t(heads.count), part = slice * size_t(x.tokens);  // one K or V of a layer
    const size_t bytes = part * 2 * size_t(lay.count);
    std::vector<std::byte> buf(store ? bytes : 0);
    const size_t at = per_head * size_t(heads.first - self.heads.first);  // the slice's offset in this chip's row
    if (sender) {
      if (store)
        for (int64_t l = 0; l < lay.count; ++l)
          for (int kv = 0; kv < 2; ++kv) {
            const int64_t local = lay.first + l - self.layers.first;
            const Tensor src = kv == 0 ? cache.keys(local, x.slot_from, x.tokens) : cache.values(local, x.slot_from, x.tokens);
            const auto* p = static_cast<const std::byte*>(src.data_if_stored());
            for (int64_t r = 0; r < x.tokens; ++r)
              std::memcpy(buf.data() + size_t(2 * l + kv) * part + size_t(r) * slice, p + size_t(r) * row + at, slice);
          }
      (void)t.send(buf.data(), bytes, other.ranks[j], x.ready, op);
      done = std::max(done, t.timeline().end_time());  // the send's end (its port free again)
    } else {
      done = std::max(done, t.recv(buf.data(), bytes, other.ranks[j], op));
      if (store)
        for (int64_t l = 0; l < lay.count; ++l)
          for (int kv = 0; kv < 2; ++kv) {
            const size_t local = size_t(lay.first + l - self.layers.first);
            auto* p = static_cast<std::byte*>((kv == 0 ? k_in : v_in)[local].data_if_stored());
            for (int64_t r = 0; r < x.tokens; ++r)
              std::memcpy(p + size_t(r) * row + at, buf.data() + size_t(2 * l + kv) * part + size_t(r) * slice, slice);
          }
    }
  }
  if (receiver && store)
    for (int64_t l = 0; l < self.layers.count; ++l) cache.append(l, x.slot_to, 0, k_in[size_t(l)], v_in[size_t(l)]);
  return done;
}

}  // namespace shardsim::models
