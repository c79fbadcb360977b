#!/usr/bin/env bash
# e2e: the small MLP (model.kind mlp: x + mlp(rmsnorm(x)), the executor's block with attention off) on 1, 2, 3, 4
# and 8 chips under its default plan (dp over every chip) and tensor parallel where the FFN splits evenly (tp=2, 4,
# 8: 200 columns): every run validates against one device, writes a readable HDF5 checkpoint holding the whole
# (unsharded) weights, and a valid JSON report. An uneven FFN split (tp=3) is refused with one line (exit 2).
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
  if [ "$n" = 1 ]; then assert_out "plan +single device" "the default plan on one chip: a single device"; else
    assert_out "plan +data parallel dp=$n" "the default plan: dp over every chip"
  fi
  assert_out_count '^shardsim: error' 0 "no error lines"

  ck=$(report_checkpoint)
  if [ -z "$ck" ]; then
    fail "report has no 'checkpoint: step 0 saved to PATH' line"
  elif [ ! -f "$ck" ]; then
    fail "report names checkpoint '$ck' but no such file exists in $PWD"
  elif ! h5dump -H "$ck" >"h5_$n.txt" 2>&1; then
    fail "h5dump -H $ck failed: $(head -n 3 "h5_$n.txt")"
  else
    pass "h5dump -H $ck succeeds"
    # Global shapes (hidden 64, ffn 200) whatever the plan: the weights part of a training state.
    for spec in "w_gate:( 64, 200 )" "w_up:( 64, 200 )" "w_down:( 200, 64 )" "mlp_norm:( 64 )"; do
      ds=${spec%%:*}
      want=${spec#*:}
      got=$(h5_shape "$ck" "layers.0.$ds")
      if [ "$got" = "$want" ]; then pass "dataset master/layers.0.$ds, shape $got"; else
        fail "dataset $ds has shape '$got', expected '$want' (h5dump -H lists: $(grep -o 'DATASET "[^"]*"' "h5_$n.txt" | tr '\n' ' '))"
      fi
    done
  fi
  check_json "out_$n.json" verdict='"PASS"' chips="$n" validation.passed=true

  case $n in
    1) ;;
    3) expect_exit 2 'model.ffn 200 is not a multiple of tp 3' -- shardsim_mpi 3 run "$cfg" --plan tp=3 --no-checkpoint ;;
    *) if expect_exit 0 'validation PASS' -- shardsim_mpi "$n" run "$cfg" --plan tp=$n --no-checkpoint; then
         assert_out "^  tp all_reduce +[0-9.]+ MiB in 1 call" "tp=$n: one all_reduce of the MLP's output"
       fi ;;
  esac
done

e2e_finish
