// Internal to checkpoint/: rank 0's serial structural check of a checkpoint file (signature, `complete`, the
// manifest, every tensor's attributes, type and shape), before any collective open.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace shardsim::sharding::detail {

// The file's description as JSON {"step", "attrs": {root string attributes}, "tensors": [{name, dtype, shape,
// sharding, mesh, checksum, chunk, gzip, storage_bytes}]}, or ConfigError naming PATH (and the tensor).
nlohmann::json inspect_serial(const std::string& path);

}  // namespace shardsim::sharding::detail
