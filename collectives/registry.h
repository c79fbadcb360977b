// The collective-algorithm registry: one descriptor per algorithm, registered in one place (registry.cpp).
//
// Everything that needs to know which algorithms exist derives from it: each collective's algorithm list and
// tie-break order (algorithm_names), alias resolution (canonical_algorithm), "auto" selection and its
// explanation (choose: applicability check, then the lowest cost estimate), error messages for unknown or
// inapplicable names (not_an_algorithm_of), the catalogue (`shardsim bench --list`, catalogue_text), workload
// and sweep validation, and the dispatch of the collectives themselves (all_reduce.cpp, reduce_scatter.cpp,
// all_gather.cpp, broadcast.cpp, reduce.cpp call the descriptor's run hooks; no algorithm name is compared as a
// string outside registry.cpp).
// The parametrised MPI tests (tests/mpi/collective_params.h) enumerate the registry, so a new algorithm is
// tested without editing a test. Recipe: docs/ARCHITECTURE.md, "Add a collective algorithm".
//
// The design follows ASTRA-sim (one class per algorithm under system/collective/) and NCCL (the cost model in
// one place, graph/tuning.cc: here collectives/cost/cost_model.cpp).
#pragma once

#include <string>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives {

// Run hooks: what the collective files call once the algorithm is chosen. All work in place and return the
// simulated time this chip's part is complete (>= READY). NAME prefixes the timeline events. A hook is null when
// the algorithm does not implement that shape of collective.
//
// reduce_scatter / all_gather phases over any packed LAYOUT (all_reduce, reduce_scatter, all_gather(v)).
using ReduceScatterFn = sim::TimeNs (*)(runtime::Transport& tp, void* base, const Layout& layout, DType t,
                                        ReduceOp op, size_t chunk_bytes, sim::TimeNs ready, const std::string& name);
using AllGatherFn = sim::TimeNs (*)(runtime::Transport& tp, void* base, const Layout& layout, DType t,
                                    size_t chunk_bytes, sim::TimeNs ready, const std::string& name);
// A whole all_reduce of COUNT elements from SENDBUF into RECVBUF (may alias); avg is finished by the caller.
using AllReduceFn = sim::TimeNs (*)(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count,
                                    DType t, ReduceOp op, size_t chunk_bytes, sim::TimeNs ready,
                                    const std::string& name);
// Rooted: broadcast BUF from ROOT; reduce ACC (this rank's contribution, used as scratch) into ROOT's ACC.
using BroadcastFn = sim::TimeNs (*)(runtime::Transport& tp, void* buf, size_t count, DType t, int root,
                                    size_t chunk_bytes, sim::TimeNs ready, const std::string& name);
using ReduceFn = sim::TimeNs (*)(runtime::Transport& tp, void* acc, size_t count, DType t, ReduceOp op, int root,
                                 size_t chunk_bytes, sim::TimeNs ready, const std::string& name);

struct AlgorithmDescriptor {
  std::string name;                  // canonical spelling (what results and reports print)
  std::vector<std::string> aliases;  // other accepted spellings
  std::string summary;               // one line for the catalogue
  std::vector<Collective> collectives;  // which collectives it implements
  // Why it cannot run C on TP's group and topology ("" when it can). Null: always applicable.
  std::string (*obstacle)(Collective c, const runtime::Transport& tp) = nullptr;
  // Simulated time (ns) of C for a per-rank buffer of BYTES (sized as estimate_ns in algorithms.h says) when
  // TP's group runs it alone from time 0; CHUNK_BYTES as CollectiveOptions::chunk_bytes. Only called for p > 1.
  double (*estimate_ns)(Collective c, const runtime::Transport& tp, double bytes, size_t chunk_bytes) = nullptr;
  // Run hooks (see above). The one-algorithm collectives (all_to_all(v), gather, scatter, send_recv, barrier)
  // are their algorithm: their own files implement it and the descriptor has no hook.
  ReduceScatterFn reduce_scatter = nullptr;
  AllGatherFn all_gather = nullptr;
  AllReduceFn all_reduce = nullptr;
  BroadcastFn broadcast = nullptr;
  ReduceFn reduce = nullptr;
  // "auto" (algorithms.h, choose) weighs this algorithm for the collectives in AUTO_FOR only: those for which NCCL
  // runs the algorithm it stands for (NCCL below), as NCCL's tuner admits them (src/graph/tuning.cc,
  // ncclTopoTuneModel: broadcast and reduce run Ring only; reduce_scatter and all_gather Ring, NVLS, CollNet
  // (and PAT); all_reduce Ring, Tree, NVLS, NVLS Tree, CollNet), plus the stated departures (docs/COLLECTIVES.md,
  // "auto"). Not in AUTO_FOR: runs only when named (-a NAME, a config's algorithm); auto shows its estimate but
  // never picks it.
  std::vector<Collective> auto_for;
  // Why auto does not weigh it on TP's group although it can run there ("" when it does; null: always), because
  // NCCL would not run it there (double_binary_tree inside one node: NCCL's Tree is a chain there). Named, it runs.
  std::string (*auto_obstacle)(Collective c, const runtime::Transport& tp) = nullptr;
  // The NCCL algorithm it stands for ("Ring", "Tree", "NVLS / CollNet"), or why auto departs from NCCL.
  std::string nccl;

  bool implements(Collective c) const;
  bool in_auto(Collective c) const;
};

// Every registered algorithm, in registration order (which is the tie-break order of "auto" within each
// collective).
const std::vector<AlgorithmDescriptor>& registered_algorithms();
// The algorithm named NAME or one of its aliases (whatever collective); nullptr if none.
const AlgorithmDescriptor* find_algorithm(const std::string& name);
// The descriptor of C's algorithm NAME (canonical or alias). Throws UsageError (exit 2, not_an_algorithm_of's
// message prefixed with C's name) when NAME is not an algorithm of C.
const AlgorithmDescriptor& algorithm_of(Collective c, const std::string& name);
// "" when NAME is "auto" or an algorithm of C, else not_an_algorithm_of(C, NAME): what workload / sweep / CLI
// validation reports.
std::string algorithm_name_error(Collective c, const std::string& name);
// The catalogue as text: one block per algorithm (name, aliases, collectives, summary) and, when TP is given,
// whether it can run on TP's group (or why not) and its estimate for BYTES per rank of every collective, with
// pipelining pieces of CHUNK_BYTES (0: none) as the run would cut them.
std::string catalogue_text(const runtime::Transport* tp = nullptr, double bytes = 0, size_t chunk_bytes = 0);

}  // namespace shardsim::collectives
