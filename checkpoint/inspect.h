// Internal to checkpoint/: rank 0's serial structural check of a checkpoint file (signature, `complete`, the
// manifest, every tensor's attributes, type and shape), before any collective open. A checkpoint reads only its own
// file (docs/SECURITY.md): a soft, external or user-defined link anywhere, a virtual dataset, external raw data or
// an unknown filter is refused; the manifest must list every dataset exactly once and nothing else; each declared
// shape must agree with what the file stores for it (so huge declared dimensions are refused before any read).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace shardsim::checkpoint::detail {

// The file's description as JSON {"step", "attrs": {root string attributes}, "tensors": [{name, dtype, shape,
// sharding, mesh, checksum, chunk, gzip, storage_bytes}]}, or ConfigError naming PATH (and the tensor).
nlohmann::json inspect_serial(const std::string& path);

}  // namespace shardsim::checkpoint::detail
