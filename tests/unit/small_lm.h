// The small language model the tests start from: vocab 32, hidden 16, 2 layers, 4 query heads and 2 KV heads of 4,
// SwiGLU of 32, 8 tokens per sequence, 2 sequences, seed 1; rmsnorm, rope (theta 10000), causal, fp32. A
// sharding::ModelSpec (the one model description); tests change the fields they exercise.
#pragma once

#include "sharding/model_spec.h"
#include "tests/unit/small_lm.h"

namespace shardsim::test {

inline sharding::ModelSpec small_lm() {
  sharding::ModelSpec c;
  c.vocab = 32;
  c.hidden = 16;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 4;
  c.ffn = 32;
  c.seq = 8;
  c.batch = 2;
  return c;
}

}  // namespace shardsim::test
