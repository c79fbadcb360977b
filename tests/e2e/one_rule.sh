#!/usr/bin/env bash
# e2e: issue 46 kind 8 (rest) and the one memory rule (docs/CONFIG.md, device.hbm_gib):
#   - `train` and `run` (its forward mode) on a device whose HBM their state and activations exceed print the
#     report ("does NOT fit") and exit 2 with one error line naming hbm_gib less hbm_reserve_gib;
#   - two `train --checkpoint X` at once: the second is refused (exit 2, one line naming X and the holder) before
#     any step; a finished run leaves no lock file; a killed holder does not block the next run;
#   - a copied binary reads its device presets from what was compiled in, not from the source tree it was built
#     in: with that tree's configs/ hidden (a private mount namespace), `help devices` and a run on the h100
#     preset still work.
# Usage: one_rule.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
LM=$CONFIGS/lm_train.yaml

e2e_case "train: does NOT fit is exit 2 after the report, as run's out of memory"
sed 's/^device: trainium1/device: {preset: trainium1, hbm_gib: 0.00001}/' "$LM" >tiny_hbm.yaml
if expect_exit 2 '^shardsim: error: .*tiny_hbm.yaml.*: simulated out of memory: [0-9.e+-]+ GiB per chip \(state \+ activations\) does not fit the [0-9.e+-]+ GiB usable' -- \
  shardsim_mpi 1 --chips 2 train tiny_hbm.yaml --plan dp=2 --ring 2 --steps 1; then
  assert_out 'does NOT fit' "the report's memory line is printed first"
  assert_out_count '^shardsim: error:' 1 "one error line"
fi
expect_exit 0 ': fits$' -- shardsim_mpi 1 --chips 2 train "$LM" --plan dp=2 --ring 2 --steps 1
sed 's/^  preset: generic/  preset: generic\n  hbm_gib: 0.00001/' "$SMALL" >oom.yaml
if expect_exit 2 'oom\.yaml: simulated out of memory: [0-9.e+-]+ GiB per chip \(state \+ activations\) does not fit .*kept in reserve, device.hbm_reserve_gib' -- \
  shardsim_mpi 1 --chips 4 run oom.yaml --no-checkpoint; then
  assert_out 'does NOT fit' "run: the same rule and report line as train (one executor)"
fi
# Refused before writing anything: no checkpoint and no --json of a run (or training) that does not fit.
if expect_exit 2 'oom\.yaml: simulated out of memory' -- shardsim_mpi 1 --chips 4 run oom.yaml --checkpoint oom_ck.h5 --json oom.json; then
  [ ! -e oom_ck.h5 ] && [ ! -e oom.json ] && pass "run out of HBM: no checkpoint, no JSON written" \
    || fail "run out of HBM wrote $(ls oom_ck.h5 oom.json 2>/dev/null)"
fi
if expect_exit 2 'tiny_hbm\.yaml.*simulated out of memory' -- \
  shardsim_mpi 1 --chips 2 train tiny_hbm.yaml --plan dp=2 --ring 2 --steps 2 --checkpoint tiny_ck.h5 --save-every 1 --json tiny.json; then
  [ ! -e tiny_ck.h5 ] && [ ! -e tiny.json ] && pass "train out of HBM: no checkpoint, no JSON written" \
    || fail "train out of HBM wrote $(ls tiny_ck.h5 tiny.json 2>/dev/null)"
fi

e2e_case "two train --checkpoint on one file: the second is refused before any step"
"$SHARDSIM" --chips 2 train "$LM" --plan dp=2 --ring 2 --steps 1000000 --checkpoint ck.h5 --save-every 1000000 \
  >first.out 2>&1 &
first=$!
for _ in $(seq 1 600); do [ -e .ck.h5.lock ] && grep -q 'train' .ck.h5.lock 2>/dev/null && break; sleep 0.1; done
if expect_exit 2 "^shardsim: error: --checkpoint ck.h5 is in use by another command \(pid $first on host .*: train .*lm_train.yaml\); wait for it to finish or choose another file" -- \
  shardsim_mpi 1 --chips 2 train "$LM" --plan dp=2 --ring 2 --steps 1 --checkpoint ck.h5; then
  assert_out_count '^ +[0-9]+ +[0-9.e+-]+' 0 "no step ran"
fi
kill -KILL "$first" 2>/dev/null
wait "$first" 2>/dev/null
expect_exit 0 '^checkpoint: step 1 saved' -- shardsim_mpi 1 --chips 2 train "$LM" --plan dp=2 --ring 2 --steps 1 --checkpoint ck.h5
if [ ! -e .ck.h5.lock ]; then pass "no lock file left after the run"; else fail "the lock file .ck.h5.lock was left"; fi

e2e_case "a copied binary reads the presets compiled into it"
cp "$SHARDSIM" ./shardsim_copy
printf 'name: h\ntopology: {kind: ring, chips: 2, bandwidth_gbps: 100}\ndevice: h100\nmodel: {kind: mlp, hidden: 64, ffn: 128, tokens: 16, activation: silu, dtype: fp32, seed: 1}\nparallel: {tp: 2}\ncheckpoint: {enabled: false}\n' >h.yaml
if command -v unshare >/dev/null 2>&1 && unshare -m true 2>/dev/null; then
  # configs/ of the source tree hidden under an empty tmpfs, for this command only.
  expect_exit 0 'device +h100: ' -- unshare -m sh -c "mount -t tmpfs tmpfs '$CONFIGS' && ./shardsim_copy --chips 2 run h.yaml"
  expect_exit 0 '^\| h100 \|' -- unshare -m sh -c "mount -t tmpfs tmpfs '$CONFIGS' && ./shardsim_copy help devices"
  assert_out 'Kernel rates against published measurements' "the kernel tables are compiled in too"
else
  echo "     (no private mount namespace: not root; the hidden-tree case is skipped)"
fi
expect_exit 0 'device +h100: ' -- ./shardsim_copy --chips 2 run h.yaml

e2e_finish
