#!/usr/bin/env bash
# e2e: bring your own config (issue 52, docs/IMPORT.md). `shardsim import hf` on the public config.json of eight
# dense model families (and three MoE ones) writes configs that `train` runs shape-only, reporting the published
# parameter count within 0.5 %; the public Megatron-LM GPT-3 175B script and torchtitan llama3 TOMLs import and run;
# export then import of shipped configs gives the same simulated step; bad input is one line, exit 2, and leaves an
# existing output untouched.
# Usage: import.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
DATA=$CONFIGS/../tests/data

# The parameter count on train's "model" line. The imported models are trained shape-only on few chips to read
# their counts and plans, not their fit: a huge HBM (--set device.hbm_gib=1000000) keeps `train` from exiting 2
# on "does NOT fit" (the one memory rule, docs/CONFIG.md hbm_gib).
params_of() { sed -n 's/.* ffn [0-9]*; \([0-9]*\) parameters.*/\1/p' "$E2E_OUT" | head -n 1; }
step_of() { sed -n 's/^  step time *\(.*\)$/\1/p' "$E2E_OUT" | head -n 1; }

e2e_case "import hf: eight dense families load in train and report the published parameter count (0.5 %)"
# Published: the safetensors totals on each model's Hugging Face hub page.
while read -r file published; do
  if expect_exit 0 'parameters as shardsim counts them' -- "$SHARDSIM" import hf "$DATA/hf/$file.json" -o "$file.yaml"; then
    if expect_exit 0 'DONE \(shape-only, not validated\)' -- shardsim_mpi 1 train "$file.yaml" --set device.hbm_gib=1000000; then
      got=$(params_of)
      if awk -v g="$got" -v p="$published" 'BEGIN { d = (g - p) / p; exit !(g > 0 && d < 0.005 && d > -0.005) }'; then
        pass "$file: $got parameters, published $published"
      else
        fail "$file: $got parameters, published $published (more than 0.5 % apart)"
      fi
    fi
  fi
done <<'EOF'
llama2_7b 6738415616
llama3_8b 8030261248
llama3.2_1b 1235814400
mistral_7b 7241732096
qwen2_7b 7615616512
qwen3_8b 8190735360
gpt2 124439808
pythia_160m 162322944
gemma_2b 2506172416
EOF

e2e_case "import hf: MoE models import with their model.moe section (MLA as its dense skeleton), every MoE field named"
for file in mixtral_8x7b qwen3_30b_a3b deepseek_v3 llama4_scout; do
  if expect_exit 0 'MoE fields recorded' -- "$SHARDSIM" import hf "$DATA/hf/$file.json" -o "$file.yaml"; then
    grep -q '^# Mixture of experts: the model.moe section below' "$file.yaml" && grep -q '^  moe:$' "$file.yaml" &&
      pass "$file: the header names the MoE fields, model.moe is live" ||
      fail "$file: no MoE block in the header"
    expect_exit 0 'DONE' -- shardsim_mpi 1 train "$file.yaml" --set device.hbm_gib=1000000
  fi
done
grep -q 'multi-head latent attention is not expressible' deepseek_v3.yaml && pass "DeepSeek-V3: MLA named" ||
  fail "DeepSeek-V3: MLA not named"

e2e_case "import hf with --base: device and topology from a shipped config, then a plan on 8 chips"
expect_exit 0 'parameters' -- "$SHARDSIM" import hf "$DATA/hf/llama3_8b.json" --seq 2048 --batch 8 \
  --base "$CONFIGS/lm_llama3_8b_64chips.yaml" -o base.yaml
grep -q '^device: trainium1' base.yaml && pass "device carried from --base" || fail "no device line from --base"
expect_exit 0 'step time' -- shardsim_mpi 1 train base.yaml --chips 64 --plan tp=8,sp=true --set device.hbm_gib=1000000

e2e_case "import megatron: the public GPT-3 175B example script (shell arrays and variables)"
expect_exit 2 'gpt3_175b_distributed.sh:56: --tensor-model-parallel-size: tp 8 x pp 16 x cp 1 = 128 does not divide the world size 8' -- \
  "$SHARDSIM" import megatron "$DATA/megatron/gpt3_175b_distributed.sh"
if expect_exit 0 '175234375680 parameters' -- "$SHARDSIM" import megatron "$DATA/megatron/gpt3_175b_distributed.sh" \
     --world-size 128 -o gpt3.yaml; then
  for want in '--fp16: fp16 is written as bf16' '--rampup-batch-size 16 16 5859375: batch ramp-up' \
              '--tensor-model-parallel-size 8 *-> parallel.tp' '--data-path \$5'; do
    grep -Eq -- "$want" gpt3.yaml && pass "header: $want" || fail "header lacks /$want/"
  done
  # The full 1,536-sequence batch is 1,536 micro-batches; two keep the test short.
  expect_exit 0 'pipeline pp=16 \(1f1b' -- shardsim_mpi 1 train gpt3.yaml --chips 128 --set model.batch=2 --set device.hbm_gib=1000000
fi

e2e_case "import torchtitan: the llama3 8B and 70B train_configs TOMLs (presets for 64 GPUs)"
expect_exit 2 'llama3_8b.toml:[0-9]+: \[parallelism\] data_parallel_shard_degree: -1 takes the rest of the world size' -- \
  "$SHARDSIM" import torchtitan "$DATA/torchtitan/llama3_8b.toml"
for f in llama3_8b llama3_70b; do
  if expect_exit 0 '64 chips' -- "$SHARDSIM" import torchtitan "$DATA/torchtitan/$f.toml" --world-size 64 -o "tt_$f.yaml"; then
    expect_exit 0 'ZeRO stage 3' -- shardsim_mpi 1 train "tt_$f.yaml" --chips 64 --set device.hbm_gib=1000000
  fi
done

e2e_case "round trip: export then import of shipped configs gives the same config and the same simulated step"
for c in lm_llama3_8b_64chips.yaml lm_train_dp4.yaml validation/korthikanti22_22b_tp8_sp_selective.yaml; do
  name=$(basename "$c" .yaml)
  chips=$("$SHARDSIM" export megatron "$CONFIGS/$c" | sed -n 's/^torchrun --nnodes \([0-9]*\) --nproc_per_node \([0-9]*\).*/\1 \2/p' |
          awk '{ print $1 * $2 }')
  check "export megatron $c -o $name.args" "$SHARDSIM" export megatron "$CONFIGS/$c" -o "$name.args"
  grep -q '^torchrun --nnodes' "$name.args" && pass "$name.args is a torchrun line" || fail "$name.args: no torchrun line"
  expect_exit 0 'keys written' -- "$SHARDSIM" import megatron "$name.args" --base "$CONFIGS/$c" -o "$name.back.yaml"
  expect_exit 0 'step time' -- shardsim_mpi 1 train "$CONFIGS/$c" --chips "$chips" --shape-only
  want=$(step_of)
  expect_exit 0 'step time' -- shardsim_mpi 1 train "$name.back.yaml" --chips "$chips" --shape-only
  got=$(step_of)
  [ -n "$want" ] && [ "$want" = "$got" ] && pass "$name: step $got before and after" || fail "$name: step '$want' vs '$got'"
  expect_exit 0 '^\[parallelism\]' -- "$SHARDSIM" export torchtitan "$CONFIGS/$c"
done

e2e_case "sweep --export: the best-plan table names each winner's launch line"
expect_exit 0 'parameters' -- "$SHARDSIM" import hf "$DATA/hf/gpt2.json" --batch 8 --seq 256 -o byo.yaml
cat >byo_sweep.yaml <<'EOF2'
name: byo
output: byo_out
axes:
  workload: [{config: byo.yaml, label: gpt2}]
  topology: [{kind: ring, chips: 8, bandwidth_gbps: 100, latency_ns: 1000}]
  device: [h100]
  plan:
    - {tp: 1, dp: fill}
    - {tp: 2, sp: true, dp: fill, zero: 1}
EOF2
if expect_exit 0 'launch of the best plan tp[0-9]+xdp[0-9]+.* for gpt2 on .* \(export megatron\):' -- \
     shardsim_mpi 1 --chips 8 sweep byo_sweep.yaml --export megatron --no-plots; then
  assert_out '^torchrun --nnodes 1 --nproc_per_node 8 pretrain_gpt.py' "the winner's torchrun line"
  assert_out '^  --global-batch-size 8 ' "the winner's batch"
fi

e2e_case "bad input: one line, exit 2, the existing output untouched"
echo 'keep' >keep.yaml
head -c 200 "$DATA/hf/llama3_8b.json" >truncated.json
expect_exit 2 '^shardsim: error: truncated.json:[0-9]+: not valid JSON' -- "$SHARDSIM" import hf truncated.json -o keep.yaml
[ "$(cat keep.yaml)" = keep ] && pass "keep.yaml untouched" || fail "keep.yaml changed"
printf '[model]\nflavor = "8B"\n[training]\nseq_len = 8\n[training]\nsteps = 1\n' >dup.toml
expect_exit 2 '^shardsim: error: dup.toml:5: not valid TOML' -- "$SHARDSIM" import torchtitan dup.toml --world-size 8
printf '{"architectures": ["T5ForConditionalGeneration"], "d_model": 512}' >t5.json
expect_exit 2 "architectures: 'T5ForConditionalGeneration' is not an architecture shardsim imports" -- "$SHARDSIM" import hf t5.json
expect_exit 2 'does not load: .*parallel' -- "$SHARDSIM" import megatron -- \
  '--num-layers 4 --hidden-size 256 --num-attention-heads 6 --kv-channels 32 --seq-length 64 --vocab-size 512 --tensor-model-parallel-size 4'
expect_exit 2 '--global-batch-size: 10 is not a multiple of --micro-batch-size 1 x dp 4' -- "$SHARDSIM" import megatron -- \
  --nproc_per_node 4 --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 64 --vocab-size 512 --global-batch-size 10
expect_exit 2 'arguments: --global-batch-size: 10 is not a multiple' -- "$SHARDSIM" import megatron -- \
  '--nproc_per_node 4 --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 64 --vocab-size 512 --global-batch-size 10'
expect_exit 2 "'\\\\x1b\[31m' is not an integer" -- "$SHARDSIM" import megatron -- --num-layers $'\e[31m' --hidden-size 4
assert_out_count '.' 1 "one line"

e2e_case "import megatron: a variable doubled past the script's bound is refused at its line, at once"
{ echo 'A=x'; for i in $(seq 1 60); do echo 'A="$A$A"'; done; echo 'torchrun pretrain_gpt.py --num-layers 2 --vocab-size $A'; } > bomb.sh
expect_exit 2 '^shardsim: error: .*bomb\.sh:2[0-9]: the line.s variables expand past 1048576 bytes' -- \
  "$SHARDSIM" import megatron bomb.sh --world-size 1 -o bomb.yaml

e2e_finish
