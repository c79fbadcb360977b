#!/usr/bin/env bash
# e2e: the small MLP on 1, 2, 3, 4 and 8 chips (FFN 200 shards unevenly over 3 and 8) must validate, write a
# readable HDF5 checkpoint holding the full (unsharded) tensors, and write a valid JSON report.
# Usage: run_chips.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"

for n in 1 2 3 4 8; do
  e2e_case "chips=$n"
  cfg=small_mlp_$n.yaml
  with_chips "$SMALL" "$n" "$cfg" || continue
  rm -f ./*.h5 out_$n.json

  expect_exit 0 'validation PASS' -- shardsim_mpi "$n" run "$cfg" --json "out_$n.json" || continue
  assert_stdout_last_line PASS
  assert_out "topology +ring $n chips" "report describes a $n-chip ring"
  assert_out_count '^shardsim: error' 0 "no error lines"

  ck=$(report_checkpoint)
  if [ -z "$ck" ]; then
    fail "report has no 'checkpoint PATH' line"
  elif [ ! -f "$ck" ]; then
    fail "report names checkpoint '$ck' but no such file exists in $PWD"
  elif ! h5dump -H "$ck" >"h5_$n.txt" 2>&1; then
    fail "h5dump -H $ck failed: $(head -n 3 "h5_$n.txt")"
  else
    pass "h5dump -H $ck succeeds"
    # Global shapes (hidden 64, ffn 200, tokens 16) whatever the chip count: the shards are stitched together.
    for spec in "w_gate:( 64, 200 )" "w_up:( 64, 200 )" "w_down:( 200, 64 )" "input:( 16, 64 )" "output:( 16, 64 )"; do
      ds=${spec%%:*}
      want=${spec#*:}
      if ! grep -Fq "DATASET \"$ds\"" "h5_$n.txt"; then
        fail "checkpoint $ck has no dataset '$ds' (h5dump -H lists: $(grep -o 'DATASET "[^"]*"' "h5_$n.txt" | tr '\n' ' '))"
      else
        got=$(h5_shape "$ck" "$ds")
        if [ "$got" = "$want" ]; then pass "dataset $ds present, shape $got"; else
          fail "dataset $ds has shape '$got', expected '$want' (the full tensor, not a shard)"
        fi
      fi
    done
  fi

  check_json "out_$n.json" verdict='"PASS"' chips="$n" validation.passed=true
done

e2e_finish
