// The serving library (serving/): request traces, the paged KV cache's capacity formula and allocation, the
// batching policies and the metrics, with a stand-in iteration time (the executor's is tested in
// tests/mpi/serve_decode_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <vector>

#include "common/config.h"
#include "common/error.h"
#include "serving/kv_cache.h"
#include "serving/metrics.h"
#include "serving/requests.h"
#include "serving/scheduler.h"

using namespace shardsim;
using namespace shardsim::serving;

namespace {

// An iteration takes 1 ms per new token plus 10 ms.
double toy_iteration(const std::vector<BatchEntry>& b) {
  double t = 0.010;
  for (const auto& e : b) t += 0.001 * double(e.rows);
  return t;
}

KvCapacity blocks(int64_t n, int64_t block = 16) {
  KvCapacity c;
  c.block_size = block;
  c.blocks = n;
  return c;
}

std::string write_temp(const std::string& name, const std::string& text) {
  const auto p = std::filesystem::temp_directory_path() / ("shardsim_serving_" + std::to_string(::getpid()) + name);
  std::ofstream(p) << text;
  return p.string();
}

}  // namespace

TEST(ServingKvCache, CapacityIsItsFormula) {
  // Llama-3-8B bf16 on an 80 GiB chip: 2 x 32 layers x 8 kv heads x 128 x 2 B = 131072 B per token.
  const double hbm = 80.0 * 1073741824.0, w = 16.06e9, a = 1.2e9, per = 131072;
  const KvCapacity c = kv_capacity(hbm, 0.9, w, a, per, 16);
  const int64_t want = int64_t(std::floor((0.9 * hbm - w - a) / (16 * per)));
  EXPECT_EQ(c.blocks, want);
  EXPECT_EQ(c.tokens(), want * 16);
  EXPECT_THROW(kv_capacity(hbm, 0.1, w, a, per, 16), std::invalid_argument);  // nothing left for the cache
}

TEST(ServingKvCache, BlocksPerSequence) {
  PagedKvCache k(blocks(10));
  k.grow(1, 17);  // 2 blocks
  EXPECT_EQ(k.used_blocks(), 2);
  k.grow(1, 32);  // still 2
  EXPECT_EQ(k.used_blocks(), 2);
  EXPECT_TRUE(k.can_grow(2, 16 * 8));
  EXPECT_FALSE(k.can_grow(2, 16 * 8 + 1));
  k.release(1);
  EXPECT_EQ(k.free_blocks(), 10);
}

// Expert-parallel serving: each ep chip's pool holds only its own sequences' blocks (sequence s on pool s mod 2).
TEST(ServingKvCache, ShardsArePoolsOfTheirOwnSequences) {
  KvCapacity c = blocks(9);
  c.shards = 2;
  PagedKvCache k(c);
  EXPECT_EQ(k.capacity().blocks, 8);  // whole pools: 2 x 4
  k.grow(0, 16 * 4);                  // pool 0 full
  EXPECT_FALSE(k.can_grow(2, 1));     // sequence 2 is pool 0's too
  EXPECT_TRUE(k.can_grow(1, 16 * 4));
  EXPECT_FALSE(k.can_grow(3, 16 * 4 + 1));  // more than a pool
  EXPECT_EQ(k.used_blocks(), 4);
  EXPECT_DOUBLE_EQ(k.utilisation(), 0.5);
  k.grow(1, 16 * 3);
  EXPECT_EQ(k.free_blocks(), 1);
  EXPECT_THROW(k.grow(2, 1), std::logic_error);
  k.release(0);
  EXPECT_TRUE(k.can_grow(2, 16 * 4));
  EXPECT_EQ(k.used_blocks(), 3);
}

TEST(ServingTrace, GeneratedIsSeededAndOrdered) {
  TraceSpec s;
  s.rate = 5;
  s.count = 1000;
  s.prompt = {"uniform", 0, 10, 20};
  s.output = {"normal", 0, 1, 100, 50, 10};
  const auto a = generate_trace(s), b = generate_trace(s);
  ASSERT_EQ(a.size(), 1000u);
  double mean_gap = a.back().arrival_s / 1000;
  EXPECT_NEAR(mean_gap, 0.2, 0.02);  // Poisson at 5/s
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].arrival_s, b[i].arrival_s);
    EXPECT_GE(a[i].prompt, 10);
    EXPECT_LE(a[i].prompt, 20);
    EXPECT_GE(a[i].output, 1);
    if (i) EXPECT_GE(a[i].arrival_s, a[i - 1].arrival_s);
  }
  s.arrival = "fixed";
  const auto f = generate_trace(s);
  EXPECT_DOUBLE_EQ(f[10].arrival_s, 2.0);
}

TEST(ServingTrace, FilesAndTheirErrors) {
  const auto csv = write_temp("ok.csv", "arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,20,3\n");
  const auto r = load_trace(csv);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1].prompt, 20);
  const auto jl = write_temp("ok.jsonl", "{\"arrival_s\": 0, \"prompt_tokens\": 4, \"output_tokens\": 2}\n\n"
                                         "{\"arrival_s\": 1, \"prompt_tokens\": 8, \"output_tokens\": 1}\n");
  EXPECT_EQ(load_trace(jl).size(), 2u);
  auto message = [](const std::string& path) {
    try {
      (void)load_trace(path);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(write_temp("neg.csv", "arrival_s,prompt_tokens,output_tokens\n0,-3,5\n")).find(":2: prompt_tokens"),
            std::string::npos);
  EXPECT_NE(message(write_temp("order.csv", "arrival_s,prompt_tokens,output_tokens\n1,3,5\n0.5,3,5\n")).find(":3: arrival_s"),
            std::string::npos);
  EXPECT_NE(message(write_temp("bad.jsonl", "{\"arrival_s\": 0, \"prompt_tokens\": 1e30, \"output_tokens\": 2}\n")).find(":1: prompt_tokens"),
            std::string::npos);
  EXPECT_THROW(check_trace(r, 20, "t"), ConfigError);  // 20 + 3 > a context of 20
}

// Issue 46 (kinds 3 and 9): an arrival past kMaxArrivalS printed inf and NaN latencies with exit 0; messages echo
// a field as written (9223372036854775807 was shown as 9223372036854775808.000000); a CSV's byte-order mark is
// skipped (it read as "the header has no column arrival_s").
TEST(ServingTrace, ArrivalsBoundedFieldsEchoedAsWrittenAndABomSkipped) {
  auto message = [](const std::string& path) {
    try {
      (void)load_trace(path);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string head = "arrival_s,prompt_tokens,output_tokens\n";
  EXPECT_NE(message(write_temp("far.csv", head + "1e308,64,4\n")).find(":2: arrival_s: 1e308 must be a time from 0 to 1e+06"),
            std::string::npos);
  EXPECT_NE(message(write_temp("far.jsonl", "{\"arrival_s\": 2e6, \"prompt_tokens\": 1, \"output_tokens\": 2}\n"))
                .find(":1: arrival_s: 2000000.0 must be a time"),
            std::string::npos);
  EXPECT_EQ(message(write_temp("edge.csv", head + "1000000,64,4\n")), "no error");
  EXPECT_NE(message(write_temp("huge.csv", head + "0,9223372036854775807,4\n"))
                .find(":2: prompt_tokens: 9223372036854775807 must be an integer in 1.."),
            std::string::npos);
  EXPECT_NE(message(write_temp("neg.csv", head + "0,64,-4\n")).find("output_tokens: -4 must be"), std::string::npos);
  const auto bom = write_temp("bom.csv", "\xef\xbb\xbf" + head + "0,64,4\n");
  ASSERT_EQ(load_trace(bom).size(), 1u);
  // A generated trace whose count / rate passes the bound is refused by check_trace.
  TraceSpec s;
  s.arrival = "fixed";
  s.rate = 1e-6;
  s.count = 3;
  EXPECT_THROW(check_trace(generate_trace(s), 1 << 20, "t"), ConfigError);
  s.rate = 1;
  EXPECT_NO_THROW(check_trace(generate_trace(s), 1 << 20, "t"));
}

// A key given twice in a JSONL request, or a CSV header naming a column twice, is refused (nlohmann kept the last
// value silently); every per-request message names the trace's FILE:LINE, or "generated request N".
TEST(ServingTrace, DuplicateKeysRefusedAndRequestsNamedByTheirLine) {
  auto message = [](const std::string& path) {
    try {
      (void)load_trace(path);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(write_temp("dup.jsonl", "{\"arrival_s\": 0, \"prompt_tokens\": 4, \"output_tokens\": 2}\n"
                                            "{\"arrival_s\": 1, \"prompt_tokens\": 4, \"prompt_tokens\": 9, "
                                            "\"output_tokens\": 2}\n"))
                .find("dup.jsonl:2: key prompt_tokens given twice"),
            std::string::npos);
  EXPECT_NE(message(write_temp("dup.csv", "arrival_s,prompt_tokens,output_tokens,prompt_tokens\n0,4,2,9\n"))
                .find("dup.csv:1: the header names column prompt_tokens twice (columns 2 and 4)"),
            std::string::npos);
  EXPECT_EQ(message(write_temp("other.csv", "arrival_s,note,prompt_tokens,note,output_tokens\n0,a,4,b,2\n")),
            "no error");  // an unread column twice is harmless
  const std::string path = write_temp("long.jsonl", "\n{\"arrival_s\": 0, \"prompt_tokens\": 4, \"output_tokens\": 2}\n"
                                                    "{\"arrival_s\": 1, \"prompt_tokens\": 30, \"output_tokens\": 2}\n");
  const auto reqs = load_trace(path);
  try {
    check_trace(reqs, 20, path);
    ADD_FAILURE() << "a request past the context was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":3: request 1: prompt_tokens + output_tokens = 32 exceeds"),
              std::string::npos) << e.what();
  }
  TraceSpec g;
  g.count = 2;
  g.prompt.value = 30;
  try {
    check_trace(generate_trace(g), 20, "c.yaml (serve.trace)");
    ADD_FAILURE() << "a generated request past the context was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("c.yaml (serve.trace): generated request 0: "), std::string::npos) << e.what();
  }
}

// Static and continuous batching prefill whole prompts: a max_num_batched_tokens they cannot keep is refused (at
// the key, or naming the request that would exceed it), never exceeded silently; static batches keep to it.
TEST(ServingScheduler, TokenBudgetRefusedWhenItCannotBeKept) {
  std::vector<Request> reqs;
  for (int i = 0; i < 12; ++i) reqs.push_back({i, 0.0, 40, 3});
  SchedulerConfig st{Policy::static_batch, 8, 100};
  PagedKvCache kv(blocks(4000));
  const ServeRun run = simulate(reqs, st, kv, toy_iteration);
  for (const auto& it : run.iterations) EXPECT_LE(it.tokens, 100);  // 2 prompts per batch, not 8
  EXPECT_EQ(run.iterations.front().seqs, 2);
  SchedulerConfig tight{Policy::continuous, 8, 42};  // a prompt of 41 and 2 outputs recomputed: 43 > 42
  PagedKvCache kv2(blocks(4000));
  reqs[5].line = 7;
  reqs[5].index = 5;
  reqs[5].prompt = 41;
  tight.trace = "t.csv";
  try {
    (void)simulate(reqs, tight, kv2, toy_iteration);
    ADD_FAILURE() << "a prompt past max_num_batched_tokens was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("t.csv:7: request 5: prompt_tokens + output_tokens - 1 = 43"), std::string::npos)
        << e.what();
  }
  SchedulerConfig few{Policy::continuous, 8, 4};  // 8 decodes per iteration cannot fit 4 tokens
  PagedKvCache kv3(blocks(4000));
  EXPECT_THROW((void)simulate(std::vector<Request>{{0, 0.0, 2, 2}}, few, kv3, toy_iteration), std::invalid_argument);
  // At the key, with the lines that gave the limits.
  auto refused = [](const std::string& yaml, int64_t context) {
    const ConfigNode root = ConfigNode::load_string(yaml, "s.yaml");
    SchedulerConfig c;
    read_batching(root.child("serve"), c);
    try {
      check_batching(root.child("serve"), c, context);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(refused("serve:\n  policy: continuous\n  max_num_batched_tokens: 1\n", 4096)
                .find("s.yaml:3: serve.max_num_batched_tokens: 1 is below the model's context of 4096 tokens"),
            std::string::npos);
  EXPECT_NE(refused("serve:\n  max_num_seqs: 512\n  max_num_batched_tokens: 256\n", 128)
                .find("s.yaml:3: serve.max_num_batched_tokens: 256 is below max_num_seqs 512 (s.yaml:2)"),
            std::string::npos);
  EXPECT_EQ(refused("serve:\n  policy: chunked\n  max_num_batched_tokens: 1\n", 4096), "no error");
  EXPECT_EQ(refused("serve:\n  policy: static\n  max_num_seqs: 1\n  max_num_batched_tokens: 128\n", 4096),
            "no error");  // static: per request (a validation row's budget is its batch's prompts)
}

TEST(ServingScheduler, ContinuousFirstTokenAfterItsPrefillAndOneTokenPerDecode) {
  std::vector<Request> reqs{{0, 0.0, 100, 5}};
  PagedKvCache kv(blocks(100));
  const ServeRun run = simulate(reqs, {}, kv, toy_iteration);
  ASSERT_EQ(run.iterations.size(), 5u);  // the prefill (first token) and 4 decodes
  EXPECT_NEAR(run.requests[0].first_token_s, 0.110, 1e-12);
  EXPECT_NEAR(run.requests[0].finish_s, 0.110 + 4 * 0.011, 1e-12);
  const ServeMetrics m = summarise(run, {}, 1);
  EXPECT_NEAR(m.tpot.p50, 0.011, 1e-12);
  EXPECT_EQ(kv.used_blocks(), 0);  // released at the end
}

// Disaggregated decode: requests arriving with their prompt's cache and first token never prefill, and a later
// arrival joins the running decode step (continuous batching).
TEST(ServingScheduler, PrefilledArrivalsDecodeAndJoinTheRunningStep) {
  std::vector<Request> reqs{{0, 0.200, 100, 5, true, 0.100}, {1, 0.205, 50, 3, true, 0.150}};
  PagedKvCache kv(blocks(100));
  const ServeRun run = simulate(reqs, {}, kv, toy_iteration);
  ASSERT_EQ(run.iterations.size(), 4u);  // r0 alone, r0 + r1 twice, r0 alone
  for (const auto& it : run.iterations) {
    EXPECT_EQ(it.prefill_tokens, 0);
    EXPECT_EQ(it.tokens, it.seqs);
  }
  EXPECT_EQ(run.iterations[1].seqs, 2);
  EXPECT_NEAR(run.requests[0].first_token_s, 0.100, 1e-12);
  EXPECT_NEAR(run.requests[1].finish_s, 0.211 + 2 * 0.012, 1e-12);
  EXPECT_NEAR(run.requests[0].finish_s, 0.211 + 2 * 0.012 + 0.011, 1e-12);
  EXPECT_NEAR(run.itl_s.at(0), 0.211 - 0.100, 1e-12);  // the first gap holds the transfer and the wait
  EXPECT_EQ(kv.used_blocks(), 0);
}

TEST(ServingScheduler, ChunkedKeepsTheTokenBudgetAndStaticWaitsForItsBatch) {
  TraceSpec s;
  s.rate = 50;
  s.count = 40;
  s.prompt = {"uniform", 0, 100, 600};
  s.output = {"uniform", 0, 5, 40};
  const auto reqs = generate_trace(s);
  SchedulerConfig chunked{Policy::chunked, 64, 256};
  PagedKvCache kv(blocks(4000));
  const ServeRun c = simulate(reqs, chunked, kv, toy_iteration);
  for (const auto& it : c.iterations) EXPECT_LE(it.tokens, 256);
  SchedulerConfig st{Policy::static_batch, 8, 1 << 20};
  PagedKvCache kv2(blocks(4000));
  const ServeRun sr = simulate(reqs, st, kv2, toy_iteration);
  for (const auto& it : sr.iterations) EXPECT_LE(it.seqs, 8);
  // Every request produced its tokens under both.
  for (const auto* run : {&c, &sr})
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_GE(run->requests[i].first_token_s, reqs[i].arrival_s);
      EXPECT_GE(run->requests[i].finish_s, run->requests[i].first_token_s);
    }
  // Continuous batching beats static on mean TTFT here (requests join running batches).
  PagedKvCache kv3(blocks(4000));
  const ServeRun cont = simulate(reqs, {Policy::continuous, 8, 1 << 20}, kv3, toy_iteration);
  EXPECT_LT(summarise(cont, {}, 1).ttft.mean, summarise(sr, {}, 1).ttft.mean);
}

TEST(ServingScheduler, PreemptsByRecomputeOrSwapWhenTheCacheIsFull) {
  // 4 blocks of 16 tokens; two requests of 30 + 20 tokens each cannot both hold 50 tokens.
  std::vector<Request> reqs{{0, 0.0, 30, 20}, {1, 0.0, 30, 20}};
  PagedKvCache kv(blocks(5));
  const ServeRun run = simulate(reqs, {}, kv, toy_iteration);
  EXPECT_GT(run.preemptions, 0);
  for (const auto& r : run.requests) EXPECT_GT(r.finish_s, 0);
  // By swap: the victim's tokens go to host memory and come back (no prefill again): fewer tokens run; without
  // host memory for it, recompute again.
  SchedulerConfig sw;
  sw.swap = true;
  sw.swap_s_per_token = 1e-4;
  sw.swap_blocks = 100;
  PagedKvCache kv2(blocks(5));
  const ServeRun swapped = simulate(reqs, sw, kv2, toy_iteration);
  EXPECT_GT(swapped.swaps, 0);
  int64_t tokens_recompute = 0, tokens_swap = 0, copied = 0;
  for (const auto& it : run.iterations) tokens_recompute += it.tokens;
  for (const auto& it : swapped.iterations) {
    tokens_swap += it.tokens;
    copied += it.swapped_tokens;
  }
  EXPECT_LT(tokens_swap, tokens_recompute);
  EXPECT_EQ(copied % 2, 0);  // every swap out came back in
  EXPECT_GT(copied, 0);
  for (const auto& r : swapped.requests) EXPECT_GT(r.finish_s, 0);
  sw.swap_blocks = 1;  // too small for any victim: recompute
  PagedKvCache kv3(blocks(5));
  EXPECT_EQ(simulate(reqs, sw, kv3, toy_iteration).swaps, 0);
  std::vector<Request> big{{0, 0.0, 100, 1}};
  PagedKvCache tiny(blocks(2));
  EXPECT_THROW(simulate(big, {}, tiny, toy_iteration), ConfigError);  // a config's limit: exit 2, the request named
}

// Pipeline parallelism: two virtual engines keep two batches in flight through two stages (each half of the toy
// iteration, 1 ms hop between them); each stage runs one batch at a time, each engine one batch at a time, and the
// trace finishes earlier than with one batch in flight. One engine through the same stages takes, per iteration,
// the whole pipeline's time.
TEST(ServingScheduler, PipelineEnginesKeepBatchesInFlight) {
  std::vector<Request> reqs;
  for (int64_t i = 0; i < 8; ++i) reqs.push_back({i, 0.001 * double(i), 100, 20});
  const StageFn two = [](const std::vector<BatchEntry>& b, double) {
    const double h = toy_iteration(b) / 2;
    return std::vector<StageSpan>{{0, h}, {h + 0.001, 2 * h + 0.001}};
  };
  auto run = [&](int engines) {
    SchedulerConfig c;
    c.engines = engines;
    PagedKvCache kv(blocks(1000));
    return simulate_pipeline(reqs, c, kv, two);
  };
  const ServeRun one = run(1), pipe = run(2);
  for (const auto& it : one.iterations)
    EXPECT_NEAR(it.end_s - it.start_s, 2 * (toy_iteration({}) + 0.001 * double(it.tokens)) / 2 + 0.001, 1e-12);
  double last_one = 0, last_pipe = 0;
  for (const auto& r : one.requests) last_one = std::max(last_one, r.finish_s);
  for (const auto& r : pipe.requests) last_pipe = std::max(last_pipe, r.finish_s);
  EXPECT_LT(last_pipe, 0.75 * last_one);
  bool overlap = false;
  std::map<int, double> engine_end;
  for (size_t i = 0; i < pipe.iterations.size(); ++i) {
    const auto& it = pipe.iterations[i];
    if (engine_end.count(it.engine)) EXPECT_GE(it.start_s, engine_end[it.engine] - 1e-12);
    engine_end[it.engine] = it.end_s;
    if (i > 0 && it.start_s < pipe.iterations[i - 1].end_s) overlap = true;
    if (i > 0) EXPECT_GE(it.start_s, pipe.iterations[i - 1].start_s);  // stage 0 in launch order
  }
  EXPECT_TRUE(overlap);
  EXPECT_EQ(engine_end.size(), 2u);
  for (const auto& r : pipe.requests) EXPECT_GT(r.finish_s, r.first_token_s);
}

TEST(ServingMetrics, PercentilesInterpolateAsNumpy) {
  const Percentiles p = percentiles({1, 2, 3, 4});
  EXPECT_DOUBLE_EQ(p.p50, 2.5);
  EXPECT_DOUBLE_EQ(p.p90, 3.7);
  EXPECT_DOUBLE_EQ(p.mean, 2.5);
}

// The stepped scheduler (a load balancer's view): outstanding tokens are the prompt and output less the cache, and
// handing over only some requests leaves the others untouched.
TEST(ServingScheduler, SteppedOutstandingTokensAndASubsetOfTheRequests) {
  std::vector<Request> reqs{{0, 0.0, 100, 5}, {1, 0.001, 40, 3}, {2, 0.002, 60, 4}};
  const StageFn one = [](const std::vector<BatchEntry>& b, double) { return std::vector<StageSpan>{{0, toy_iteration(b)}}; };
  PagedKvCache kv(blocks(100));
  Simulation sim(reqs, {}, kv, one);
  sim.run_until(0.0);
  sim.arrive(0);
  EXPECT_EQ(sim.outstanding_tokens(), 105);
  sim.run_until(0.002);  // the prefill of request 0 (0 .. 0.110) is the only batch that starts before
  EXPECT_EQ(sim.outstanding_tokens(), 5);
  sim.arrive(2);  // request 1 goes elsewhere
  EXPECT_EQ(sim.outstanding_tokens(), 5 + 64);
  const ServeRun run = sim.finish();
  EXPECT_GT(run.requests[0].finish_s, 0);
  EXPECT_GT(run.requests[2].finish_s, 0);
  EXPECT_EQ(run.requests[1].finish_s, 0);  // never handed over
  EXPECT_EQ(kv.used_blocks(), 0);
}

// Stepping one batch at a time (the disaggregated run orders several schedulers' batches this way): next_ready is
// when the next batch may start, the stage function is told that start, finished_last names the requests a batch
// finished and last_end its end; a disaggregated decode's arrival (arrive_prefilled) decodes from its cache.
TEST(ServingScheduler, SteppedBatchesTheirStartsAndPrefilledArrivals) {
  std::vector<Request> reqs{{0, 0.0, 100, 1}, {1, 0.5, 40, 3}};
  std::vector<double> starts;
  const StageFn one = [&](const std::vector<BatchEntry>& b, double start) {
    starts.push_back(start);
    return std::vector<StageSpan>{{0, toy_iteration(b)}};
  };
  PagedKvCache kv(blocks(100));
  Simulation sim(reqs, {}, kv, one);
  EXPECT_EQ(sim.next_ready(), std::numeric_limits<double>::infinity());
  sim.arrive(0);
  EXPECT_EQ(sim.next_ready(), 0.0);
  sim.step();  // request 0's prefill makes its only token
  ASSERT_EQ(sim.finished_last(), std::vector<int64_t>{0});
  EXPECT_DOUBLE_EQ(sim.last_end(), toy_iteration({{0, 0, 100}}));
  EXPECT_EQ(sim.next_ready(), std::numeric_limits<double>::infinity());
  sim.arrive_prefilled(1, 0.6, 0.55);  // its prompt's cache and first token come from elsewhere
  EXPECT_DOUBLE_EQ(sim.next_ready(), 0.6);
  sim.step();  // its second token: a decode step over the 40 cached tokens
  EXPECT_TRUE(sim.finished_last().empty());
  sim.step();
  EXPECT_EQ(sim.finished_last(), std::vector<int64_t>{1});
  const ServeRun run = sim.finish();
  ASSERT_EQ(starts.size(), 3u);
  EXPECT_EQ(starts[0], 0.0);
  EXPECT_DOUBLE_EQ(starts[1], 0.6);
  for (size_t i = 0; i < run.iterations.size(); ++i) EXPECT_DOUBLE_EQ(run.iterations[i].start_s, starts[i]);
  EXPECT_DOUBLE_EQ(run.requests[1].first_token_s, 0.55);
  EXPECT_DOUBLE_EQ(run.requests[1].arrival_s, 0.6);
  EXPECT_EQ(run.iterations[1].prefill_tokens, 0);  // decodes only: the prompt came with its cache
  EXPECT_THROW(sim.step(), std::logic_error);
}

// Swap copies run on the host link beside the compute (serving/scheduler.h): the iteration that swaps a victim out
// lasts max(its compute, the copy), not their sum; the one that swaps it back in starts its compute when the copy
// in has ended, and lasts its compute.
TEST(ServingScheduler, SwapCopiesOverlapCompute) {
  std::vector<Request> reqs{{0, 0.0, 30, 20}, {1, 0.0, 30, 20}};
  SchedulerConfig sw;
  sw.swap = true;
  sw.swap_s_per_token = 1e-3;  // 30+ tokens: longer than an iteration's compute (10 ms + 1 ms per token)
  sw.swap_blocks = 100;
  PagedKvCache kv(blocks(5));
  const ServeRun run = simulate(reqs, sw, kv, toy_iteration);
  ASSERT_EQ(run.swaps, 1);
  std::vector<size_t> with;
  for (size_t i = 0; i < run.iterations.size(); ++i)
    if (run.iterations[i].swapped_tokens > 0) with.push_back(i);
  ASSERT_EQ(with.size(), 2u);  // out, then back in
  const IterationSample& out = run.iterations[with[0]];
  const IterationSample& in = run.iterations[with[1]];
  const IterationSample& before_in = run.iterations[with[1] - 1];
  const double compute_out = 0.010 + 0.001 * double(out.tokens), copy = 1e-3 * double(out.swapped_tokens);
  EXPECT_GT(copy, compute_out);
  EXPECT_NEAR(out.end_s - out.start_s, std::max(compute_out, copy), 1e-12);
  EXPECT_EQ(in.swapped_tokens, out.swapped_tokens);
  EXPECT_NEAR(in.start_s - before_in.end_s, 1e-3 * double(in.swapped_tokens), 1e-12);
  EXPECT_NEAR(in.end_s - in.start_s, 0.010 + 0.001 * double(in.tokens), 1e-12);
  for (const auto& r : run.requests) EXPECT_GT(r.finish_s, 0);
}

// serve --trace (issue 46 kind 13): written in pieces (bounded memory), counted exactly before it is written, never
// below the bound stated before the run, and a window keeps exactly the iterations and spans that overlap it.
TEST(ServingTrace, WrittenInPiecesCountedExactlyAboveItsBoundAndWindowed) {
  TraceSpec s;
  s.rate = 50;
  s.count = 3000;
  s.prompt = {"uniform", 0, 10, 200};
  s.output = {"uniform", 0, 1, 40};
  const std::vector<Request> reqs = generate_trace(s);
  PagedKvCache kv(blocks(100000));
  const ServeRun run = simulate(reqs, {}, kv, toy_iteration);
  std::string text;
  size_t pieces = 0, largest = 0;
  const TraceSize n = write_trace(run, {}, [&](std::string_view p) {
    text += p;
    ++pieces;
    largest = std::max(largest, p.size());
  });
  EXPECT_EQ(n.bytes, double(text.size()));
  EXPECT_GT(pieces, 1u);
  EXPECT_LT(largest, (1u << 20) + 4096);  // one piece at a time, about 1 MiB each
  const TraceSize counted = write_trace(run, {}, nullptr);
  EXPECT_EQ(counted.bytes, n.bytes);
  EXPECT_EQ(counted.events, n.events);
  EXPECT_EQ(n.events, 2 + 2 * int64_t(run.iterations.size()) + 4 * int64_t(reqs.size()) -
                          2 * std::count_if(reqs.begin(), reqs.end(), [](const Request& r) { return r.output <= 1; }));
  const TraceSize least = trace_size_at_least(reqs, {});
  EXPECT_LE(least.bytes, n.bytes);
  EXPECT_GT(least.bytes, 0.5 * n.bytes);  // 78 % here: the iterations are the part not known before the run
  EXPECT_EQ(text.substr(text.size() - 3), "]}\n");
  // [10 s, 11 s]: each kept iteration overlaps it, and every iteration that overlaps it is kept.
  const TraceWindow w{10, 11};
  std::string part;
  (void)write_trace(run, w, [&](std::string_view p) { part += p; });
  int64_t overlapping = 0;
  for (const auto& it : run.iterations) overlapping += it.end_s >= 10 && it.start_s <= 11;
  size_t slices = 0;
  for (size_t at = part.find("\"ph\":\"X\""); at != std::string::npos; at = part.find("\"ph\":\"X\"", at + 1)) ++slices;
  EXPECT_EQ(int64_t(slices), overlapping);
  EXPECT_GT(overlapping, 0);
  EXPECT_LE(trace_size_at_least(reqs, w).bytes, double(part.size()));
}
