// The keys of a serve config's `serve:` section (apps/serve.cpp's parser passes them to expect_keys;
// experiments/config_keys.h lists them for `shardsim help config` and docs/CONFIG.md's check).
#pragma once

#include <string_view>

namespace shardsim::serving {

inline constexpr std::string_view kServeKeys[] = {"policy",          "max_num_seqs", "max_num_batched_tokens",
                                                  "block_size",      "memory_fraction", "slo",
                                                  "trace",           "preemption",   "swap_space_gib",
                                                  "host_link_gbps",  "disaggregation",
                                                  "load_balance",    "cuda_graphs"};
// serve.disaggregation: prefill and decode on separate replicas (apps/serve.cpp).
inline constexpr std::string_view kServeDisaggKeys[] = {"prefill_replicas", "prefill", "decode"};
// serve.disaggregation.prefill / decode: a group's own plan (per-phase parallelism).
inline constexpr std::string_view kServeDisaggGroupKeys[] = {"parallel"};
inline constexpr std::string_view kServeSloKeys[] = {"ttft_ms", "tpot_ms"};
// serve.trace: a file, or generated arrivals and lengths.
inline constexpr std::string_view kServeTraceFileKeys[] = {"file"};
inline constexpr std::string_view kServeTraceKeys[] = {"arrival", "rate", "count", "seed", "prompt", "output"};
// serve.trace.prompt / output given as a map.
inline constexpr std::string_view kServeLengthKeys[] = {"kind", "value", "min", "max", "mean", "std"};

}  // namespace shardsim::serving
