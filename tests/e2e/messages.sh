#!/usr/bin/env bash
# e2e: messages say what is wrong and how to fix it (issue 46 kind 9), one line each:
#  - a flag out of range names the flag and the bound, not CLI11's 309-digit range; NaN is refused;
#  - a job of one rank hosting N chips is "N chips (1 rank x N chips)" and the advice is --chips, not mpirun -np;
#  - a folder on a read-only file system says "Read-only file system" (not "No such file or directory");
#  - a resume whose batch agrees with the config does not blame the batch;
#  - bad input found while running (an algorithm a group cannot run) is "shardsim: error:", exit 2, not
#    "error on chip 0".
# Usage: messages.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"

e2e_case "flag bounds"
expect_exit 2 "^shardsim: error: --ring: must be a whole number >= 1 \(got '0'\)" -- shardsim_mpi 1 run "$SMALL" --ring 0
assert_out_count '[0-9]{40}' 0 "no 309-digit range"
expect_exit 2 "^shardsim: error: --bandwidth: must be a finite number > 0 .*\(got 'nan'\)" -- \
  shardsim_mpi 1 run "$SMALL" --bandwidth nan
expect_exit 2 "^shardsim: error: --latency: must be a finite number >= 0 .*\(got 'nan'\)" -- \
  shardsim_mpi 1 train "$CONFIGS/lm_train.yaml" --latency nan

e2e_case "job sizes and how to change them"
expect_exit 2 'the topology has 4 chips but the job has 16 chips \(1 rank x 16 chips\); run it with --chips 4$' -- \
  shardsim_mpi 1 --chips 16 run "$SMALL" --no-checkpoint
expect_exit 2 'but the job has 1 rank \(one chip per rank\); run it with --chips 4$' -- shardsim_mpi 1 profile "$SMALL"
assert_out_count 'mpirun -np' 0 "no mpirun advice to a one-rank user"
expect_exit 2 'but the job has 2 ranks \(one chip per rank\); run it with mpirun -np 4 \(or --chips 4 on one rank\)' -- \
  shardsim_mpi 2 run "$SMALL" --no-checkpoint

e2e_case "a read-only file system"
mkdir -p ro
if mount -t tmpfs -o ro,size=64k tmpfs ro 2>/dev/null; then
  expect_exit 2 "^shardsim: error: --plots ro/pl: the directory cannot be created: Read-only file system" -- \
    shardsim_mpi 1 --chips 4 run "$SMALL" --no-checkpoint --plots ro/pl
  printf 'name: s\noutput: ro/out\naxes:\n  topology: [{kind: ring, chips: 1, bandwidth_gbps: 100}]\n  collective: [all_reduce]\n  size: [1K]\n' >s.yaml
  expect_exit 2 "output directory 'ro/out' cannot be created: Read-only file system" -- shardsim_mpi 1 sweep s.yaml
  expect_exit 2 "directory 'ro' is not writable: Read-only file system" -- shardsim_mpi 1 --chips 4 run "$SMALL" --json ro/r.json
  umount ro
else
  echo "     (no tmpfs mount: not root; the read-only cases are skipped)"
fi

e2e_case "a resume whose attributes disagree with themselves does not blame an equal batch"
sed 's/^train:/train:\n  steps: 2/; /^  steps: 30/d' "$CONFIGS/lm_train.yaml" >t.yaml
if PY=$(h5py_python) && expect_exit 0 'saved' -- shardsim_mpi 1 train t.yaml --checkpoint st.h5; then
  "$PY" -c 'import h5py, sys; f = h5py.File("st.h5", "r+"); f.attrs["data_position"] = "7"; f.close()'
  expect_exit 2 'data position 7 sequences at step 2 does not match its own step x batch \(2 x 2\)' -- \
    shardsim_mpi 1 train t.yaml --resume st.h5 --steps 3
  assert_out_count "config's global batch" 0 "the equal batch is not blamed"
fi

e2e_case "bad input found once the mesh exists is not a chip's error; it names the key"
printf 'topology: {kind: switch, chips: 4, bandwidth_gbps: 100, latency_ns: 1000}\n' >sw4.yaml
expect_exit 2 "^shardsim: error: t\\.yaml .*--set parallel\\.algorithm=in_switch: parallel\\.algorithm: 'in_switch' cannot run the dp group's all_gather over 4 chips" -- \
  shardsim_mpi 1 --chips 4 train t.yaml --steps 1 --topology sw4.yaml --plan dp=4 --set model.batch=4 \
  --set parallel.algorithm=in_switch
assert_out_count 'error on chip' 0 "no 'on chip N'"
assert_out_count '^shardsim: error' 1 "one error line"

e2e_case "a key no line holds (its default) is named as not set, not at another key's line; the layers before micro-batches"
expect_exit 2 '^shardsim: error: [^:]*lm_train\.yaml \(with command-line overrides\): model\.micro_batch: .*\(model\.micro_batch is not set: its default\)$' -- \
  shardsim_mpi 1 --chips 2 run "$CONFIGS/lm_train.yaml" --plan pp=2,schedule=interleaved,virtual_stages=2 \
  --set model.layers=4 --set model.batch=4
expect_exit 2 'parallel\.pp: 2 stages x 2 virtual stages but the model has only 2 layers' -- \
  shardsim_mpi 1 --chips 2 run "$CONFIGS/lm_train.yaml" --plan pp=2,schedule=interleaved,virtual_stages=2 \
  --set model.batch=4

e2e_case "another command's flag: serve takes no --resume / --checkpoint"
expect_exit 2 '^shardsim: error: serve takes no --resume \(an option of run, train' -- \
  shardsim_mpi 1 serve "$CONFIGS/serve/llama3_8b_h100.yaml" --resume x.h5
expect_exit 2 '^shardsim: error: serve takes no --checkpoint' -- \
  shardsim_mpi 1 serve "$CONFIGS/serve/llama3_8b_h100.yaml" --checkpoint x.h5

e2e_case "integer flags read decimal (a leading zero is not octal); --chips given twice is refused"
if expect_exit 0 'over 10 steps' -- shardsim_mpi 1 train "$CONFIGS/lm_train.yaml" --steps 010; then
  pass "--steps 010 ran 10 steps"
fi
expect_exit 2 '^shardsim: error: --chips given twice' -- shardsim_mpi 1 --chips 2 --chips 4 train "$CONFIGS/lm_train.yaml" --steps 1

e2e_case "a trace over --trace-max-mib names the stale file left at its path"
echo OLD > stale.json
if expect_exit 0 'not written: .*the file already there is an earlier run.s, left as it was' -- \
  shardsim_mpi 1 train "$CONFIGS/lm_train.yaml" --steps 1 --trace stale.json --trace-max-mib 0.000001; then
  [ "$(cat stale.json)" = OLD ] && pass "the earlier file is left as it was" || fail "stale.json changed"
fi

e2e_finish
