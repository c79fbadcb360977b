// Plan unit: sequence parallelism (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
// Models", 2022) on the tp axis. Norms and residuals run on a sequence shard of the tp group (Shard(0) over tp:
// n_resid = n_attn / tp rows per chip); the shard is all_gathered before each column-parallel GEMM and the
// row-parallel GEMM's Partial(sum) output is reduce_scattered back to the shard (instead of an all_reduce).
// Bytes per chip (ring algorithms, M = the gathered [n_attn, hidden] activation): (tp-1)/tp·M for each.
#pragma once

#include <string>

#include "sharding/plans/block_ops.h"

namespace shardsim::sharding::plans {

// LOCAL [n_resid, hidden] (Shard(0) over tp) -> [n_attn, hidden] (Replicate over tp), "sp all_gather (WHAT)".
Tensor sp_all_gather(PlanContext& ctx, const Tensor& local, const std::string& what);
// PARTIAL [n_attn, hidden] (Partial(sum) over tp) -> [n_resid, hidden] (Shard(0) over tp).
Tensor sp_reduce_scatter(PlanContext& ctx, const Tensor& partial, const std::string& what);

// The plan registry's descriptors of the units in this file (sharding/plans/registry.h; listed once by
// make_registry() in registry.cpp).
struct PlanDescriptor;
PlanDescriptor sp_plan_descriptor();

}  // namespace shardsim::sharding::plans
