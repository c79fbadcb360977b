#!/usr/bin/env bash
# e2e: `shardsim train` runs the single-device reference language model: losses fall, the report has the
# simulated step time, tokens/s and MFU, two runs print the same bytes; on 2 ranks it trains data-parallel with
# ZeRO (sharding/plans/data_parallel.h) and prints the same losses as one chip; bad configs (incl. an lr beyond fp32)
# exit 2 with one line, sizes beyond this host's memory (real data or shape-only) exit 3 with one line before any step.
# Usage: train.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"

one_error_line() { assert_out_count '^shardsim: error' 1 "exactly one 'shardsim: error' line"; }
TRAIN=$CONFIGS/lm_train.yaml

e2e_case "(a) 12 steps of the default config, twice"
if expect_exit 0 '^  step time +[0-9.]+ us$' -- shardsim_mpi 1 train "$TRAIN" --steps 12; then
  assert_out_count '^ +[0-9]+( +[0-9.]+){6}$' 12 "one row per step"
  assert_out 'MFU +[0-9.]+% of 1 x 47.5 TFLOP/s fp32 peak' "MFU against the device's peak (trainium1 fp32)"
  first=$(awk '$1 == "1" {print $2}' "$E2E_STDOUT")
  last=$(awk '$1 == "12" {print $2}' "$E2E_STDOUT")
  if awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < 0.8 * a)}'; then pass "loss falls: $first -> $last"; else
    fail "loss did not fall by 20% in 12 steps: $first -> $last"
  fi
  cp "$E2E_STDOUT" first_run.txt
  if expect_exit 0 '^loss: ' -- shardsim_mpi 1 train "$TRAIN" --steps 12; then
    grep -Ev '^  (total [0-9.]+ s|peak RSS .*)$' first_run.txt >first_sim.txt
    if grep -Ev '^  (total [0-9.]+ s|peak RSS .*)$' "$E2E_STDOUT" | cmp -s first_sim.txt -; then pass "second run prints the same bytes (but the host's wall time and peak RSS)"; else
      fail "two runs differ"
      diff first_run.txt "$E2E_STDOUT" | head -n 10 >&2
    fi
  fi
fi

e2e_case "(a2) bf16 mixed precision"
sed -E 's/^(  dtype:).*/\1 bf16/' "$TRAIN" >bf16.yaml
if expect_exit 0 'bf16 compute, fp32 master weights' -- shardsim_mpi 1 train bf16.yaml --steps 12; then
  assert_out 'MFU +[0-9.]+% of 1 x 190.0 TFLOP/s bf16 peak' "MFU against the bf16 peak"
fi

e2e_case "(b) data parallel on 2 ranks, ZeRO-2: the single-device losses, the step split and the memory"
sed -E 's/^(  dtype:.*)$/\1\nparallel:\n  zero: 2\n  bucket_bytes: 2048/' "$TRAIN" >dp.yaml
if expect_exit 0 '^  exposed comm +[0-9.]+ (ns|us)' \
    -- shardsim_mpi 2 train dp.yaml --steps 12; then
  assert_out '^  plan +data parallel dp=2 \(gradients averaged over dp, ZeRO stage 2, .*; [0-9]+ gradient buckets' "the plan line"
  assert_out '^  optimizer state +[0-9]+  formula +[0-9]+  8\*Psi/N_d' "optimizer state next to ZeRO's formula"
  awk '$1 ~ /^[0-9]+$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2}' "$E2E_STDOUT" >dp_losses.txt
  awk '$1 ~ /^[0-9]+$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2}' first_run.txt >one_losses.txt
  if [[ -s dp_losses.txt ]] && cmp -s dp_losses.txt one_losses.txt; then
    pass "12 per-step losses equal one chip's (4 decimals)"
  else
    fail "dp losses differ from one chip's"
    paste one_losses.txt dp_losses.txt | head -n 12 >&2
  fi
fi

e2e_case "(b2) parallel.dp different from the ranks, and a bad ZeRO stage"
sed -E 's/^(  dtype:.*)$/\1\nparallel:\n  dp: 4/' "$TRAIN" >dp4.yaml
if expect_exit 2 '^shardsim: error: .*dp4\.yaml:[0-9]+: parallel: tp 1 x cp 1 x ulysses 1 x dp 4 = 4 does not match the job.s 2 chips' -- shardsim_mpi 2 train dp4.yaml
then one_error_line; fi
sed -E 's/^(  dtype:.*)$/\1\nparallel:\n  zero: 4/' "$TRAIN" >zero4.yaml
if expect_exit 2 '^shardsim: error: .*zero4\.yaml:[0-9]+: .*parallel.zero: must be between 0 and 3 \(got 4\)' -- shardsim_mpi 2 train zero4.yaml
then one_error_line; fi

e2e_case "(c) heads not a multiple of kv_heads"
sed -E 's/^(  kv_heads:).*/\1 3/' "$TRAIN" >bad_heads.yaml
if expect_exit 2 '^shardsim: error: .*bad_heads\.yaml:[0-9]+: model.kv_heads: 4 query heads are not a multiple of 3 KV heads' -- shardsim_mpi 1 train bad_heads.yaml
then one_error_line; fi

e2e_case "(d) a typo in train:"
sed -E 's/^(  )lr:/\1learning_rate:/' "$TRAIN" >typo.yaml
if expect_exit 2 '^shardsim: error: .*typo\.yaml:[0-9]+: .*learning_rate' -- shardsim_mpi 1 train typo.yaml
then one_error_line; fi

e2e_case "(e) a NaN learning rate"
sed -E 's/^(  lr:).*/\1 .nan/' "$TRAIN" >nan_lr.yaml
if expect_exit 2 '^shardsim: error: .*nan_lr\.yaml:[0-9]+: .*lr.*finite' -- shardsim_mpi 1 train nan_lr.yaml
then one_error_line; fi

e2e_case "(f) an unsupported dtype"
sed -E 's/^(  dtype:).*/\1 fp8_e4m3/' "$TRAIN" >fp8.yaml
if expect_exit 2 '^shardsim: error: .*fp8\.yaml:[0-9]+: .*dtype.*fp32 or bf16' -- shardsim_mpi 1 train fp8.yaml
then one_error_line; fi

e2e_case "(g) a finite lr beyond fp32's range (1e300 became inf in AdamW: exit 3 'internal error')"
sed -E 's/^(  lr:).*/\1 1e300/' "$TRAIN" >huge_lr.yaml
if expect_exit 2 '^shardsim: error: .*huge_lr\.yaml:[0-9]+: train.lr: must be at most 3.4e38' -- shardsim_mpi 1 train huge_lr.yaml
then one_error_line; fi

e2e_case "(h) sizes that cannot fit in host memory are refused before allocating (was std::bad_alloc, exit 3)"
sed -E 's/^(  ffn:).*/\1 99999999999/' "$TRAIN" >huge_ffn.yaml
if expect_exit 2 '^shardsim: error: .*huge_ffn\.yaml:[0-9]+: model.ffn: must be between 1 and 4194304' \
    -- shardsim_mpi 1 train huge_ffn.yaml
then one_error_line; fi
sed -E 's/^(  hidden:).*/\1 1048576/; s/^(  ffn:).*/\1 1048576/' "$TRAIN" >huge_dims.yaml  # within the bounds
if expect_exit 3 '^shardsim: error: .*huge_dims\.yaml: model: needs at least .* GiB of host memory per rank' \
    -- shardsim_mpi 2 train huge_dims.yaml
then one_error_line; fi
# Shape-only keeps per-token bookkeeping (issue 31 item 4: batch 1e8 was killed by the OOM killer with no line):
# the largest token count the bounds allow on one chip is estimated before the step, exit 3 naming the estimate.
if expect_exit 3 '^shardsim: error: .*lm_train\.yaml \(with command-line overrides\): model: needs about [0-9.]+ GiB of host memory for the shape-only step.s bookkeeping \(.* tokens per chip.*but only [0-9.]+ GiB is available' \
    -- shardsim_mpi 1 train "$TRAIN" --shape-only --steps 1 --set model.batch=16777216 --set model.seq=256
then one_error_line; assert_out_count "^ +[0-9]+ " 0 "no step ran"; fi

e2e_case "(i) --steps 0: the range in the message is 1.. (CLI11's PositiveNumber said '0 not in range 0.000000 to 1.8e308')"
if expect_exit 2 '^shardsim: error: --steps: Value 0 not in range 1 to ' -- shardsim_mpi 1 train "$TRAIN" --steps 0
then one_error_line; fi

e2e_case "(j) training-state checkpoints: resume at step 3 of 6 equals the uninterrupted run, byte for byte"
if expect_exit 0 '^checkpoint: step 6 saved to full\.h5' -- shardsim_mpi 1 train "$TRAIN" --steps 6 --save-every 3 --checkpoint full.h5; then
  assert_out '^checkpoint: step 3 saved to full\.h5' "--save-every 3 saves at step 3 too"
  awk '$1 ~ /^[4-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' "$E2E_STDOUT" >full_456.txt
fi
if expect_exit 0 '^checkpoint: step 3 saved to part\.h5' -- shardsim_mpi 1 train "$TRAIN" --steps 3 --checkpoint part.h5 &&
   expect_exit 0 '^resumed: part\.h5 at step 3 \(saved under dp=1, ZeRO stage 0\)' \
     -- shardsim_mpi 1 train "$TRAIN" --steps 6 --resume part.h5 --checkpoint resumed.h5; then
  assert_out_count '^ +[0-9]+( +[0-9.]+){6}$' 3 "only steps 4-6 run"
  awk '$1 ~ /^[4-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' "$E2E_STDOUT" >resumed_456.txt
  if [[ -s full_456.txt ]] && cmp -s full_456.txt resumed_456.txt; then pass "losses and grad norms of steps 4-6 equal"; else
    fail "resumed steps 4-6 differ"; paste full_456.txt resumed_456.txt >&2
  fi
  # Masters, moments, step, data position and attributes: the whole state, bit for bit.
  if cmp -s full.h5 resumed.h5; then pass "the step-6 checkpoints are byte-identical"; else fail "step-6 checkpoints differ"; fi
fi

e2e_case "(k) resume under another mesh: one chip's step 3 on dp 2 ZeRO-3, and dp 2 ZeRO-2's step 3 on one chip"
sed -E 's/^(  dtype:.*)$/\1\nparallel:\n  zero: 3/' "$TRAIN" >dp_z3.yaml
if expect_exit 0 '^resumed: part\.h5 at step 3 \(saved under dp=1, ZeRO stage 0\)' -- shardsim_mpi 2 train dp_z3.yaml --steps 6 --resume part.h5; then
  awk '$1 ~ /^[4-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' "$E2E_STDOUT" >dp_456.txt
  if cmp -s full_456.txt dp_456.txt; then pass "dp 2 ZeRO-3 continues with one chip's losses (4 decimals)"; else
    fail "dp resume differs"; paste full_456.txt dp_456.txt >&2
  fi
fi
if expect_exit 0 '^checkpoint: step 3 saved to dp_part\.h5' -- shardsim_mpi 2 train dp.yaml --steps 3 --checkpoint dp_part.h5 &&
   expect_exit 0 '^resumed: dp_part\.h5 at step 3 \(saved under dp=2, ZeRO stage 2\)' \
     -- shardsim_mpi 1 train "$TRAIN" --steps 6 --resume dp_part.h5; then
  awk '$1 ~ /^[4-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' "$E2E_STDOUT" >one_456.txt
  if cmp -s full_456.txt one_456.txt; then pass "one chip continues dp 2 ZeRO-2's run (4 decimals)"; else
    fail "one-chip resume differs"; paste full_456.txt one_456.txt >&2
  fi
fi

e2e_case "(l) checkpoint refusals: nothing left to run, another model, --save-every alone (damaged files: e2e.ckpt, LmResume)"
if expect_exit 2 '^shardsim: error: --resume: part\.h5 is at step 3 and the run stops at step 3' \
    -- shardsim_mpi 1 train "$TRAIN" --steps 3 --resume part.h5
then one_error_line; fi
sed -E 's/^(  hidden:).*/\1 32/' "$TRAIN" >wide.yaml
if expect_exit 2 "^shardsim: error: checkpoint part\\.h5: saved for model 'vocab 32 hidden 16 .*' but the config's model is 'vocab 32 hidden 32" \
    -- shardsim_mpi 2 train wide.yaml --steps 6 --resume part.h5
then one_error_line; fi
if expect_exit 2 '^shardsim: error: --save-every: needs --checkpoint' -- shardsim_mpi 1 train "$TRAIN" --save-every 2
then one_error_line; fi

e2e_case "(m) tensor parallelism: tp 2 on 2 ranks and dp 2 x tp 2 + sp on 4 print one chip's losses; a tp checkpoint resumes on one chip"
sed -E 's/^(  dtype:.*)$/\1\nparallel:\n  tp: 2/' "$TRAIN" >tp2.yaml
if expect_exit 0 '^  plan +tensor parallel tp=2 \(Megatron' -- shardsim_mpi 2 train tp2.yaml --steps 6 --save-every 3 --checkpoint tp2.h5; then
  awk '$1 ~ /^[1-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' "$E2E_STDOUT" >tp2_losses.txt
  awk '$1 ~ /^[1-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' first_run.txt >one_6.txt
  if [[ -s tp2_losses.txt ]] && cmp -s one_6.txt tp2_losses.txt; then pass "tp 2: losses and grad norms equal one chip's (4 decimals)"; else
    fail "tp 2 differs from one chip"; paste one_6.txt tp2_losses.txt >&2
  fi
  assert_out '^  optimizer state +[0-9]+  formula +[0-9]+  8\*Psi_tp' "per-chip optimizer state of the tp shards"
fi
sed -E 's/^(  tp: 2)$/\1\n  sp: true/' tp2.yaml >tp2sp.yaml
if expect_exit 0 '^  plan +tensor parallel tp=2 \(Megatron.*; sequence parallel \(reduce_scatter / all_gather around the norms\); data parallel dp=2' -- shardsim_mpi 4 train tp2sp.yaml --steps 6; then
  awk '$1 ~ /^[1-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' "$E2E_STDOUT" >dptp_losses.txt
  if cmp -s one_6.txt dptp_losses.txt; then pass "dp 2 x tp 2 with sequence parallelism: losses equal one chip's (4 decimals)"; else
    fail "dp2 x tp2 sp differs"; paste one_6.txt dptp_losses.txt >&2
  fi
fi
if expect_exit 0 '^resumed: tp2\.h5 at step 6 \(saved under dp=1 x tp=2\)' -- shardsim_mpi 1 train "$TRAIN" --steps 8 --resume tp2.h5; then
  pass "a tp 2 checkpoint continues on one chip"
fi
sed -E 's/^(  dtype:.*)$/\1\nparallel:\n  tp: 4/' "$TRAIN" >tp4.yaml
if expect_exit 0 '^  plan +tensor parallel tp=4 ' -- shardsim_mpi 4 train tp4.yaml --steps 6; then  # above its 2 KV heads
  awk '$1 ~ /^[1-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' "$E2E_STDOUT" >tp4_losses.txt
  if cmp -s one_6.txt tp4_losses.txt; then pass "tp 4 above 2 KV heads (replicated): losses equal one chip's (4 decimals)"; else
    fail "tp 4 with replicated KV heads differs"; paste one_6.txt tp4_losses.txt >&2
  fi
fi
# ZeRO-3 and recompute on the dp x tp mesh (numbers: LmTpZero, LmTpRecompute): one chip's losses again.
sed -E 's/^(  sp: true)$/\1\n  zero: 3/; s/^(  data_seed:.*)$/\1\n  recompute: true/' tp2sp.yaml >tpz3.yaml
if expect_exit 0 '^  plan +tensor parallel tp=2 \(Megatron.*; data parallel dp=2 \(gradients averaged over dp, ZeRO stage 3' -- shardsim_mpi 4 train tpz3.yaml --steps 6 --validate; then
  awk '$1 ~ /^[1-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' "$E2E_STDOUT" >tpz3_losses.txt
  if cmp -s one_6.txt tpz3_losses.txt; then pass "dp 2 x tp 2, sp, ZeRO-3, recompute: losses equal one chip's (4 decimals)"; else
    fail "dp2 x tp2 ZeRO-3 recompute differs"; paste one_6.txt tpz3_losses.txt >&2
  fi
  assert_out '^  parameters +[0-9]+  formula +[0-9]+  4\*Psi_tp/N_d' "per-chip parameters of the tp shards over dp (ZeRO-3)"
  assert_out '; recompute: full ' "the report says recompute"
  assert_out '^validation: PASS \(\|loss - reference\| = .*fp32: 1e-5 absolute' "--validate: PASS against the single-device reference"
fi
awk '$1 ~ /^[1-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/' "$E2E_STDOUT" >tpz3_rows.txt
cp "$E2E_STDOUT" tpz3_real.txt
# The same job with the 4 chips as fibers of one rank (runtime/chips.h): the same losses and simulated times.
if expect_exit 0 '^  plan +tensor parallel tp=2 .*; data parallel dp=2 ' -- shardsim_mpi 1 train tpz3.yaml --steps 6 --chips 4; then
  awk '$1 ~ /^[1-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/' "$E2E_STDOUT" >tpz3_chips.txt
  if [[ -s tpz3_rows.txt ]] && cmp -s tpz3_rows.txt tpz3_chips.txt; then pass "4 chips on one rank: every step row equals the 4-rank run's"; else
    fail "--chips 4 on one rank differs from 4 ranks"; paste tpz3_rows.txt tpz3_chips.txt >&2
  fi
fi
# (the shape-only and refusal runs below also use 4 chips on one rank: one process starts faster than four)

e2e_case "(u) pipelines: checkpoints pp 4 -> pp 2 -> pp 1 and pp 2 x tp 2 -> tp 2 through files continue the uninterrupted run; zb_h1 = 1f1b"
# 4 chips on one rank, 4 layers, 4 sequences in micro-batches of 1. The state itself restores bit-identical
# (TrainPipeline.StateReshardsAcrossPp); here the files: each resumed step prints the uninterrupted run's loss and
# gradient norm (4 decimals).
PPSET=(--chips 4 --set model.layers=4 --set model.batch=4 --set model.micro_batch=1)
for first in "pp=4" "pp=2 tp=2"; do
  tag=${first// /_}
  FIRST=(); for kv in $first; do FIRST+=(--set "parallel.${kv}"); done
  if expect_exit 0 '^DONE' -- shardsim_mpi 1 train "$TRAIN" "${PPSET[@]}" "${FIRST[@]}" --steps 6; then
    awk '$1 ~ /^[1-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' "$E2E_STDOUT" >"pp_full_$tag.txt"
  fi
  expect_exit 0 '^checkpoint: step 2 saved to ppa\.h5' -- shardsim_mpi 1 train "$TRAIN" "${PPSET[@]}" "${FIRST[@]}" --steps 2 \
    --checkpoint ppa.h5 || continue
  if [[ $first == "pp=4" ]]; then
    hops=("pp=2 2 4" "pp=1 4 6")
  else
    hops=("tp=2 2 6")
  fi
  from=ppa.h5
  for hop in "${hops[@]}"; do
    read -r mesh at to <<<"$hop"
    if expect_exit 0 "^resumed: $from at step $at " -- shardsim_mpi 1 train "$TRAIN" "${PPSET[@]}" --set "parallel.$mesh" \
         --steps "$to" --resume "$from" --checkpoint "pp_$to.h5"; then
      awk '$1 ~ /^[0-9]+$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' "$E2E_STDOUT" >pp_resumed.txt
      if [[ -s pp_resumed.txt ]] && grep -qxFf pp_resumed.txt "pp_full_$tag.txt" &&
         [[ $(grep -cxFf pp_resumed.txt "pp_full_$tag.txt") == $((to - at)) ]]; then
        pass "$first -> $mesh: steps $((at + 1))-$to equal the uninterrupted $first run's"
      else fail "$first -> $mesh: resumed steps differ"; paste "pp_full_$tag.txt" pp_resumed.txt >&2; fi
    fi
    from="pp_$to.h5"
  done
done
# ZB-H1 (the backward split into input and weight gradients) prints the same losses as 1F1B on pp 4, and its closed form.
if expect_exit 0 '^  bubble .*closed form \(p-1\)\(F\+B-W\)' -- shardsim_mpi 1 train "$TRAIN" "${PPSET[@]}" --set parallel.pp=4 \
     --set parallel.schedule=zb_h1 --steps 6; then
  awk '$1 ~ /^[1-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' "$E2E_STDOUT" >pp_zb.txt
  if [[ -s pp_zb.txt ]] && cmp -s pp_full_pp=4.txt pp_zb.txt; then pass "zb_h1 on pp 4: 1F1B's losses and grad norms (4 decimals)"; else
    fail "zb_h1 differs from 1f1b"; paste pp_full_pp=4.txt pp_zb.txt >&2; fi
  assert_out "^  peak_act_bytes include the pending weight gradients' operands" "the report counts the pending weight gradients"
fi

e2e_case "(p) shape-only: the real run's simulated fields without its data (no losses, NOT VALIDATED)"
if expect_exit 0 '^  mode +shape-only .*NOT VALIDATED' -- shardsim_mpi 1 train tpz3.yaml --steps 2 --shape-only --chips 4; then
  awk '$1 ~ /^[12]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $4, $5, $6, $7}' "$E2E_STDOUT" >so_rows.txt
  awk '$1 ~ /^[12]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $4, $5, $6, $7}' tpz3_real.txt >real_rows.txt
  if [[ -s so_rows.txt ]] && cmp -s so_rows.txt real_rows.txt; then pass "step time, compute, exposed, idle equal the real-data run's"; else
    fail "shape-only simulated fields differ"; paste real_rows.txt so_rows.txt >&2
  fi
  grep -E '^  (parameters|gradients|optimizer state|total +[0-9]+  formula|activations) ' "$E2E_STDOUT" >so_mem.txt
  grep -E '^  (parameters|gradients|optimizer state|total +[0-9]+  formula|activations) ' tpz3_real.txt >real_mem.txt
  if [[ -s so_mem.txt ]] && cmp -s so_mem.txt real_mem.txt; then pass "the memory rows equal the real-data run's"; else
    fail "shape-only memory differs"; paste real_mem.txt so_mem.txt >&2
  fi
  assert_out '^ +1 +- +- ' "no loss, no grad norm"
fi
sed -E 's/^(device:.*)$/\1\nmode: shape_only/' tpz3.yaml >tpz3_so.yaml
if expect_exit 2 '^shardsim: error: --checkpoint: a shape-only run has no training state' -- shardsim_mpi 1 train tpz3_so.yaml --chips 4 --checkpoint so.h5
then one_error_line; fi
if expect_exit 2 '^shardsim: error: --validate: a shape-only run computes no values' -- shardsim_mpi 1 train tpz3_so.yaml --chips 4 --validate
then one_error_line; fi
sed -E 's/^(device:.*)$/\1\nmode: shapeonly/' tpz3.yaml >tpz3_bad.yaml
if expect_exit 2 "^shardsim: error: .*tpz3_bad\\.yaml:[0-9]+: mode: 'shapeonly' \\(real \\| shape_only\\)" -- shardsim_mpi 1 train tpz3_bad.yaml --chips 4
then one_error_line; fi

e2e_case "(q) context parallelism (ring attention fwd + bwd): cp 2 x tp 2 prints one chip's losses, its checkpoint resumes on one chip; bad cp keys exit 2"
sed -E 's/^(  tp: 2)$/\1\n  cp: 2/' tp2.yaml >cp2tp2.yaml
if expect_exit 0 '; context parallel cp=2 \(ring attention forward and backward, zig-zag split' -- shardsim_mpi 4 train cp2tp2.yaml --steps 6 --save-every 3 --checkpoint cp.h5; then
  awk '$1 ~ /^[1-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' "$E2E_STDOUT" >cp_losses.txt
  if [[ -s cp_losses.txt ]] && cmp -s one_6.txt cp_losses.txt; then pass "cp 2 x tp 2: losses and grad norms equal one chip's (4 decimals)"; else
    fail "cp 2 x tp 2 differs from one chip"; paste one_6.txt cp_losses.txt >&2
  fi
fi
if expect_exit 0 '^resumed: cp\.h5 at step 6 \(saved under dp=1 x cp=2 x tp=2\)' -- shardsim_mpi 1 train "$TRAIN" --steps 8 --resume cp.h5; then
  pass "a cp 2 x tp 2 checkpoint continues on one chip"
fi
sed -E 's/^(  cp: 2)$/\1\n  cp_split: contiguous/' cp2tp2.yaml >cp_contig.yaml
if expect_exit 0 '; context parallel cp=2 \(.*contiguous split' -- shardsim_mpi 1 train cp_contig.yaml --steps 6 --chips 4; then
  awk '$1 ~ /^[1-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' "$E2E_STDOUT" >cpc_losses.txt
  if cmp -s one_6.txt cpc_losses.txt; then pass "contiguous split, 4 chips on one rank: one chip's losses"; else
    fail "contiguous cp differs"; paste one_6.txt cpc_losses.txt >&2
  fi
fi
sed -E 's/^(  cp: 2)$/\1\n  cp_split: diagonal/' cp2tp2.yaml >cp_bad_split.yaml
if expect_exit 2 "^shardsim: error: .*cp_bad_split\\.yaml:[0-9]+: .*parallel.cp_split: 'diagonal' \\(zigzag \\| contiguous\\)" -- shardsim_mpi 1 train cp_bad_split.yaml --chips 4
then one_error_line; fi
sed -E 's/^(  tp: 2)$/\1\n  cp_split: zigzag/' tp2.yaml >cp1_split.yaml
if expect_exit 2 '^shardsim: error: .*cp1_split\.yaml:[0-9]+: .*parallel.cp_split: only used with context parallelism' -- shardsim_mpi 1 train cp1_split.yaml --chips 2
then one_error_line; fi
sed -E 's/^(  tp: 2)$/\1\n  cp: 3/' tp2.yaml >cp3.yaml
if expect_exit 2 '^shardsim: error: .*cp3\.yaml:[0-9]+: parallel: tp 2 x cp 3 x ulysses 1 = 6 does not match the job.s 4 chips' -- shardsim_mpi 1 train cp3.yaml --chips 4
then one_error_line; fi
sed -E 's/^(  tp: 2)$/\1\n  cp: 8/' tp2.yaml >cp8.yaml
if expect_exit 2 '^shardsim: error: .*cp8\.yaml:[0-9]+: parallel.cp: seq 8 is not divisible by 2\*cp = 16 \(zig-zag split\)' -- shardsim_mpi 1 train cp8.yaml --chips 16
then one_error_line; fi

e2e_case "(r) Ulysses (all_to_all tokens <-> heads around attention, fwd + bwd): one chip's losses; bad ulysses keys exit 2"
sed -E 's/^(  dtype:.*)$/\1\nparallel:\n  ulysses: 2/' "$TRAIN" >uly2.yaml
if expect_exit 0 'Ulysses ulysses=2 \(all_to_all sequence <-> heads' -- shardsim_mpi 1 train uly2.yaml --steps 6 --chips 2; then
  awk '$1 ~ /^[1-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' "$E2E_STDOUT" >uly_losses.txt
  if [[ -s uly_losses.txt ]] && cmp -s one_6.txt uly_losses.txt; then pass "ulysses 2: losses and grad norms equal one chip's (4 decimals)"; else
    fail "ulysses 2 differs from one chip"; paste one_6.txt uly_losses.txt >&2
  fi
fi
# tp 2 x ulysses 2 with kv_heads 2: one kv head per tp rank, replicated to both Ulysses ranks of its GQA group.
sed -E 's/^(  tp: 2)$/\1\n  ulysses: 2/' tp2.yaml >uly_tp2.yaml
if expect_exit 0 '; Ulysses ulysses=2 ' -- shardsim_mpi 1 train uly_tp2.yaml --steps 6 --chips 4; then
  awk '$1 ~ /^[1-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' "$E2E_STDOUT" >uly_tp2_losses.txt
  if [[ -s uly_tp2_losses.txt ]] && cmp -s one_6.txt uly_tp2_losses.txt; then pass "tp 2 x ulysses 2, kv heads replicated: losses equal one chip's (4 decimals)"; else
    fail "tp 2 x ulysses 2 (replicated kv heads) differs from one chip"; paste one_6.txt uly_tp2_losses.txt >&2
  fi
fi
sed -E 's/^(  heads:).*/\1 6/; s/^(  kv_heads:).*/\1 3/' uly2.yaml >uly_kv3.yaml
if expect_exit 2 '^shardsim: error: .*uly_kv3\.yaml:[0-9]+: parallel.ulysses: 3 KV heads are neither a multiple nor a divisor of 2' -- shardsim_mpi 1 train uly_kv3.yaml --chips 2
then one_error_line; fi
sed -E 's/^(  ulysses: 2)$/\1\n  cp: 2/' uly2.yaml >uly_cp.yaml
if expect_exit 2 '^shardsim: error: .*uly_cp\.yaml:[0-9]+: .*parallel.ulysses: ulysses and cp both shard the sequence' -- shardsim_mpi 1 train uly_cp.yaml --chips 4
then one_error_line; fi

e2e_case "(s) parallel.fused: the sp collectives fused with their GEMMs (numbers: LmTpFused); fused without sp exits 2"
sed -E 's/^(  sp: true)$/\1\n  fused: true/' tp2sp.yaml >tp2fused.yaml
if expect_exit 0 '^  plan +tensor parallel tp=2 \(Megatron.*; sequence parallel .*; fused: all_gather_gemm / gemm_reduce_scatter' -- shardsim_mpi 1 train tp2fused.yaml --steps 6 --chips 4; then
  awk '$1 ~ /^[1-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' "$E2E_STDOUT" >fused_losses.txt
  if [[ -s fused_losses.txt ]] && cmp -s one_6.txt fused_losses.txt; then pass "dp 2 x tp 2, sp, fused: losses equal one chip's (4 decimals)"; else
    fail "fused differs from one chip"; paste one_6.txt fused_losses.txt >&2
  fi
fi
sed -E 's/^(  tp: 2)$/\1\n  fused: true/' tp2.yaml >tp2_fused_nosp.yaml
if expect_exit 2 '^shardsim: error: .*tp2_fused_nosp\.yaml:[0-9]+: parallel.fused: fused without sp does not train: .*tp_comm_overlap .*; set sp: true, or fused: false$' -- shardsim_mpi 1 train tp2_fused_nosp.yaml --chips 4
then one_error_line; fi

e2e_case "(t) run's overrides, --json and --trace: the issue's command on a 4x4 torus of h100s (16 chips on one rank, shape-only)"
if expect_exit 0 '^  plan +tensor parallel tp=4 .*; data parallel dp=4 ' -- shardsim_mpi 1 --chips 16 train "$CONFIGS/lm_train_dp4.yaml" --torus 4x4 --device h100 \
    --plan tp=4,dp=4 --set model.layers=2 --json r16.json --shape-only --steps 2; then
  assert_out '^shardsim train: lm_train_dp4  \(.*lm_train_dp4\.yaml \(with command-line overrides\)\)' "the config named with overrides"
  assert_out '^  topology +torus 4x4' "--torus 4x4 replaced the ring"
  assert_out '^  device +h100' "--device h100"
  assert_out '^  model +vocab 512, hidden 256, 2 layers' "--set model.layers=2"
  if python3 - r16.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = r["train"]
assert r["run_mode"] == "train" and r["chips"] == 16 and r["mode"] == "shape_only", (r["run_mode"], r["chips"], r["mode"])
assert r["device"].startswith("h100") and r["topology"].startswith("torus 4x4"), (r["device"], r["topology"])
assert [s["step"] for s in t["steps"]] == [1, 2] and all(s["loss"] is None for s in t["steps"]), t["steps"]
assert t["steps"][-1]["total_ns"] == r["simulated"]["total_ns"] == t["step_ns"] > 0
assert abs(r["simulated"]["tokens_per_s"] - t["tokens_per_step"] / t["step_ns"] * 1e9) < 1e-6 * r["simulated"]["tokens_per_s"]
assert 0 < t["mfu"] < 1 and t["mfu"] == r["simulated"]["peak_fraction"]
m = t["memory_per_chip"]
assert m["fits"] is True and m["chip_bytes"] == m["total_bytes"] + m["activations_bytes"] > 0
PY
  then pass "--json: run_mode train, 16 chips, h100, torus, 2 steps, tokens/s and MFU from the step time, memory fits"
  else fail "--json content"; fi
fi
# The same field names as run's JSON (one report type).
if expect_exit 0 'PASS' -- shardsim_mpi 1 --chips 4 run "$SMALL" --no-checkpoint --json run.json &&
   expect_exit 0 '^loss: ' -- shardsim_mpi 1 --chips 2 train "$TRAIN" --ring 2 --plan dp=2 --steps 3 --json dp2.json; then
  if python3 - run.json dp2.json "$E2E_STDOUT" <<'PY'
import json, re, sys
run, tr = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
missing = [k for k in run if k not in tr] + ["simulated." + k for k in run["simulated"] if k not in tr["simulated"]]
assert not missing, missing
rows = [l.split() for l in open(sys.argv[3]) if re.match(r"^ +[0-9]+( +[0-9.]+){6}$", l)]
assert [(int(a[0]), a[1]) for a in rows] == [(s["step"], "%.4f" % s["loss"]) for s in tr["train"]["steps"]], rows
PY
  then pass "train's JSON has every field of run's; its losses are the printed rows"
  else fail "train's JSON differs from run's fields or from its rows"; fi
fi
if expect_exit 0 '^trace +tr\.json' -- shardsim_mpi 1 --chips 2 train tp2.yaml --steps 2 --trace tr.json; then
  if python3 -c 'import json,sys; e=json.load(open("tr.json"))["traceEvents"]; cp={x["pid"] for x in e if x.get("name") == "process_name" and x["args"]["name"] == "critical path"}; assert len(cp) == 1 and {x["pid"] for x in e} - cp == {1, 2}; assert any(x.get("ph") == "X" for x in e)'; then
    pass "--trace: a Chrome trace of both chips"; else fail "--trace content"; fi
fi
# One chip without a parallel: section is the executor's dp = 1 plan: it has a timeline to trace.
if expect_exit 0 '^trace +t1\.json' -- shardsim_mpi 1 train "$TRAIN" --steps 2 --trace t1.json; then
  if python3 -c 'import json; e=json.load(open("t1.json"))["traceEvents"]; assert any(x.get("ph") == "X" for x in e)'; then
    pass "--trace on one chip: a Chrome trace of the one-chip executor"; else fail "--trace t1.json content"; fi
fi
if expect_exit 2 '^shardsim: error: --device: ' -- shardsim_mpi 1 train "$TRAIN" --device tpu_v9
then one_error_line; fi

e2e_case "(v) bf16 validation over 5 steps at dp 4 (a fixed 2e-3 failed at steps 4-5): the limit grows with the step"
if expect_exit 0 '^validation: PASS \(relative \|loss - reference\| = .*bf16: 2\^-9 x step' \
    -- shardsim_mpi 1 --chips 4 train "$CONFIGS/lm_train_dp4.yaml" --steps 5 --validate; then
  pass "configs/lm_train_dp4.yaml, bf16, dp 4, 5 steps: PASS"
fi

e2e_case "(w) a sweep over a training config runs it (was 'plan does not fit: unknown key train'; tests/e2e/sweep_train.sh)"
printf 'name: tr\naxes:\n  workload: [%s]\n  plan: [{tp: 1}]\n' "$TRAIN" >train_sweep.yaml
if expect_exit 2 '^shardsim: error: .*lm_train\.yaml:[0-9]+: topology: missing \(give the sweep a .topology. axis' \
    -- shardsim_mpi 1 sweep train_sweep.yaml --output tr_out
then one_error_line; fi
printf '  topology: [{kind: ring, chips: 1, bandwidth_gbps: 100}]\n' >>train_sweep.yaml
expect_exit 0 '^  lm_train +ring1 +trainium1 +tp1 +[0-9.]+ +[0-9]+ ' -- shardsim_mpi 1 sweep train_sweep.yaml --output tr_out --no-plots

e2e_case "(n) the step count has an upper limit (--steps 1e12 would run for days)"
if expect_exit 2 '^shardsim: error: --steps: Value 1000000000000 not in range 1 to 1000000' -- shardsim_mpi 1 train "$TRAIN" --steps 1000000000000
then one_error_line; fi
sed -E 's/^(  steps:).*/\1 2000000/' "$TRAIN" >many_steps.yaml
if expect_exit 2 '^shardsim: error: .*many_steps\.yaml:[0-9]+: train.steps: must be between 1 and 1000000' -- shardsim_mpi 1 train many_steps.yaml
then one_error_line; fi

e2e_case "(o) train.recompute: the same losses as one chip; the report says recompute (numbers: LmDpRecompute)"
sed -E 's/^(  data_seed:.*)$/\1\n  recompute: true/' dp.yaml >dp_rc.yaml
if expect_exit 0 '; recompute: full ' -- shardsim_mpi 2 train dp_rc.yaml --steps 12; then
  awk '$1 ~ /^[0-9]+$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' "$E2E_STDOUT" >rc_losses.txt
  awk '$1 ~ /^[0-9]+$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' first_run.txt >one_12.txt
  if cmp -s one_12.txt rc_losses.txt; then pass "12 losses equal one chip's"; else fail "recompute changed the losses"; fi
  assert_out '^  activations +[0-9]+  \(recompute per block' "the activation line says recompute"
fi

# On the generic device (no kernel model: every kernel at its roofline) the MFU tests the FLOP count alone; trainium1's
# systolic model runs head_dim 4 at 4/128 of the array, far below peak, which says nothing about the count.
e2e_case "(x) MFU counts causal attention: a tiny model at seq 1e6 stays below 100 % (the full s x s count gave 171 %)"
if expect_exit 0 'MFU +[0-9.]+% of 1 x 100.0 TFLOP/s fp32 peak' \
    -- shardsim_mpi 1 train "$TRAIN" --shape-only --steps 1 --set model.seq=1000000 --device generic; then
  mfu=$(sed -nE 's/^  MFU +([0-9.]+)% .*/\1/p' "$E2E_STDOUT")
  if awk -v m="$mfu" 'BEGIN { exit !(m > 50 && m < 100) }'; then pass "MFU $mfu % (attention-bound, below peak)"
  else fail "MFU '$mfu' % is not in (50, 100)"; fi
fi
e2e_case "(y) an override's error names the flag that set the value and the key as the file spells it (model.seq, not workload.seq)"
if expect_exit 2 '^shardsim: error: .*lm_train\.yaml \(with command-line overrides\), --set model\.seq=100000000: model\.seq: must be between 1 and 16777216' \
    -- shardsim_mpi 1 train "$TRAIN" --set model.seq=100000000
then one_error_line; fi

e2e_case "(z) the GPT block (layernorm, gelu MLP, learned positions, tied embeddings): tp 2 + sp with selective recompute prints one chip's losses; one weight for the tied head; bad variants exit 2"
sed -E 's/^(  seed: 1)$/\1\n  norm: layernorm\n  mlp: gelu\n  position: learned\n  tied_embeddings: true/' "$TRAIN" >gpt.yaml
if expect_exit 0 '^checkpoint: step 6 saved to gpt1\.h5' -- shardsim_mpi 1 train gpt.yaml --steps 6 --checkpoint gpt1.h5; then
  awk '$1 ~ /^[1-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' "$E2E_STDOUT" >gpt_one.txt
  if command -v h5ls >/dev/null 2>&1; then
    if h5ls -r gpt1.h5 | grep -q 'embed' && ! h5ls -r gpt1.h5 | grep -Eq '/head[ /]'; then
      pass "the tied checkpoint holds the embedding and no head"
    else fail "tied checkpoint: $(h5ls -r gpt1.h5 | grep -E 'embed|head' | head -n 4)"; fi
  fi
fi
{ cat gpt.yaml; printf 'parallel:\n  tp: 2\n  sp: true\n  recompute: selective\n'; } >gpt_tp2.yaml
if expect_exit 0 '; recompute: selective \(the attention core' -- shardsim_mpi 2 train gpt_tp2.yaml --steps 6; then
  awk '$1 ~ /^[1-6]$/ && (NF == 7 || NF == 8) && $2 ~ /^(-|-?[0-9]+\.[0-9][0-9][0-9][0-9])$/ {print $1, $2, $3}' "$E2E_STDOUT" >gpt_tp2.txt
  if [[ -s gpt_one.txt ]] && cmp -s gpt_one.txt gpt_tp2.txt; then pass "GPT block, tp 2 + sp: losses and grad norms equal one chip's (4 decimals)"
  else fail "GPT tp 2 differs from one chip"; paste gpt_one.txt gpt_tp2.txt >&2; fi
fi
if expect_exit 0 '^resumed: gpt1\.h5 at step 6' -- shardsim_mpi 2 train gpt_tp2.yaml --steps 8 --resume gpt1.h5; then
  pass "a one-chip GPT checkpoint continues on tp 2"
fi
if expect_exit 2 "^shardsim: error: .*lm_train\.yaml \(with command-line overrides\), --set model\.mlp=geglu: model\.mlp: geglu: not implemented yet in train" \
    -- shardsim_mpi 1 train "$TRAIN" --set model.mlp=geglu
then one_error_line; fi
if expect_exit 2 "^shardsim: error: .*parallel\.recompute: 'sometimes' \(none \| selective \| full" \
    -- shardsim_mpi 2 train gpt_tp2.yaml --set parallel.recompute=sometimes
then one_error_line; fi

e2e_case "(aa) fused x pp: pipeline stages gather fused ops and layer figures of different counts (overran the report's gather: heap corruption, exit 134/139, MPI_ERR_TRUNCATE)"
for mode in "train --steps 3 --validate" "run"; do
  # shellcheck disable=SC2086
  if expect_exit 0 '^validation: PASS' -- shardsim_mpi 1 --chips 4 $mode "$TRAIN" --plan tp=2,sp=true,fused=true,pp=2 \
      --set model.micro_batch=1 --no-checkpoint
  then pass "${mode%% *}: tp 2 + sp + fused x pp 2 on one rank of 4 chips: PASS"; fi
done
if expect_exit 0 '^validation: PASS' -- shardsim_mpi 4 train "$TRAIN" --plan tp=2,sp=true,fused=true,pp=2 \
    --set model.micro_batch=1 --steps 2 --validate --no-checkpoint
then pass "train: the same plan on 4 ranks: PASS"; fi

e2e_finish
