#!/usr/bin/env bash
# e2e: what an output path points at is never replaced (docs/RELIABILITY.md section 4, issue 46 kinds 1, 5, 7).
# Every output flag (run, profile, train, serve, bench, topo describe, validate, ckpt, calibrate, import, export) is
# given, in turn:
#  - /dev/stdout (the shell redirects it to a file): the content is appended to standard output, /dev/stdout
#    stays the system's symlink;
#  - a symlink to a FIFO with a reader: the reader gets the content, the link and the FIFO stay;
#  - a symlink to /dev/null: exit 0, the link stays;
#  - a symlink to a regular file: the file gets the content, the link stays a link;
# checkpoints (HDF5 seeks) refuse the three streams with exit 2 before any work. Also: an output under a regular
# file is exit 2 before the run; `--plots DIR --json DIR/roofline.dat` is exit 2 (two outputs, one file). Folder
# outputs (--plots, a sweep's --output / output:) at /dev/stdout or a link to a FIFO, /dev/null or a file: exit 2,
# links intact; a link to a folder fills the folder; a sweep's results files through links.
# Usage: output_paths.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
E2E_TIMEOUT=${E2E_TIMEOUT_OUTPUT_PATHS:-120}

with_chips "$SMALL" 1 c1.yaml
sed 's/^train:/train:\n  steps: 2/; /^  steps: 30/d' "$CONFIGS/lm_train.yaml" >t.yaml
printf 'kernel,dtype,m,n,k,batch,time_us\ngemm,fp32,512,512,512,1,600\ngemm,fp32,1024,1024,1024,1,4500\n' >k.csv
shardsim_mpi 1 run c1.yaml --checkpoint ck.h5 >/dev/null 2>&1 || fail "setup: the checkpoint was not written"
shardsim_mpi 1 --chips 8 bench all_reduce --shape-only -b 64K -e 1M -f 4 -n 1 -w 0 -c 0 >bench.txt 2>&1
{
  echo "# Collective test starting: all_reduce_perf"
  awk -F'|' '/^ +[0-9]+ / { split($1, a, " "); split($2, o, " ");
    printf "%12s %12s %9s %7s %7s %9s %7s %7s %7s %9s %7s %7s %7s\n", a[1], a[2], "float", "sum", -1, o[1], o[2], o[3], 0, o[1], o[2], o[3], 0 }' bench.txt
} >ar.log

# marked CMD...: CMD, then "(exit N)" on stderr, so a command that prints nothing (export --output) still has a
# line for expect_exit to match.
marked() {
  "$@"
  local rc=$?
  echo "(exit $rc)" >&2
  return $rc
}

# path_cases WHAT STREAMS_OK NP CMD...: CMD has the word OUT where the output path goes. STREAMS_OK=no: the
# output must be a regular file (a checkpoint).
path_cases() {
  local what=$1 streams=$2 np=$3
  shift 3
  local args=() a p
  run_with() {  # PATH: CMD with OUT replaced
    args=()
    for a in "$@"; do [ "$a" = OUT ] && args+=("$P") || args+=("$a"); done
  }
  # 1. /dev/stdout (stdout is a file here, as under `> out.txt`)
  P=/dev/stdout run_with "$@"
  if [ "$streams" = yes ]; then
    expect_exit 0 '\(exit 0\)' -- marked shardsim_mpi "$np" "${args[@]}" && [ "$(wc -c <"$E2E_STDOUT")" -gt 0 ] \
      && pass "$what /dev/stdout: written to standard output"
  else
    expect_exit 2 "is \(or links to\) a stream" -- shardsim_mpi "$np" "${args[@]}"
  fi
  [ -L /dev/stdout ] && pass "$what: /dev/stdout is still a symlink" || fail "$what: /dev/stdout was replaced"
  # 2. a symlink to a FIFO with a reader
  rm -f fifo fifo.lnk got
  mkfifo fifo && ln -s fifo fifo.lnk
  if [ "$streams" = yes ]; then
    (timeout 60 cat fifo >got) &
    local reader=$!
    P=fifo.lnk run_with "$@"
    expect_exit 0 '\(exit 0\)' -- marked shardsim_mpi "$np" "${args[@]}"
    wait "$reader"
    [ -s got ] && pass "$what: the FIFO's reader got the content" || fail "$what: nothing came through the FIFO"
  else
    P=fifo.lnk run_with "$@"
    expect_exit 2 "is \(or links to\) a stream" -- shardsim_mpi "$np" "${args[@]}"
  fi
  [ -L fifo.lnk ] && [ -p fifo ] && pass "$what: the link to the FIFO and the FIFO stay" \
    || fail "$what: the link or the FIFO was replaced"
  # 3. a symlink to /dev/null
  rm -f null.lnk && ln -s /dev/null null.lnk
  P=null.lnk run_with "$@"
  if [ "$streams" = yes ]; then expect_exit 0 '\(exit 0\)' -- marked shardsim_mpi "$np" "${args[@]}"
  else expect_exit 2 "is \(or links to\) a stream" -- shardsim_mpi "$np" "${args[@]}"; fi
  [ -L null.lnk ] && [ -c /dev/null ] && pass "$what: the link to /dev/null stays" || fail "$what: null.lnk was replaced"
  # 4. a symlink to a regular file
  rm -f file.lnk target.out && echo old >target.out && ln -s target.out file.lnk
  P=file.lnk run_with "$@"
  expect_exit 0 '\(exit 0\)' -- marked shardsim_mpi "$np" "${args[@]}"
  if [ -L file.lnk ] && [ "$(readlink file.lnk)" = target.out ] && [ "$(head -c 3 target.out)" != old ] \
    && [ -s target.out ]; then
    pass "$what: the link's target got the content, the link stays"
  else
    fail "$what: link to a regular file: link $(readlink file.lnk || echo gone), target '$(head -c 40 target.out)'"
  fi
  ls ./*.partial* >/dev/null 2>&1 && fail "$what: temporaries left" || true
}

e2e_case "run, profile, train"
path_cases "run --json" yes 1 run c1.yaml --no-checkpoint --json OUT
path_cases "run --trace" yes 1 run c1.yaml --no-checkpoint --trace OUT
path_cases "run --checkpoint" no 1 run c1.yaml --checkpoint OUT
path_cases "profile --json" yes 1 --chips 4 profile "$SMALL" --json OUT
path_cases "train --json" yes 1 train t.yaml --json OUT
path_cases "train --checkpoint" no 1 train t.yaml --checkpoint OUT
path_cases "profile --trace" yes 1 --chips 4 profile "$SMALL" --trace OUT
path_cases "train --trace" yes 1 train t.yaml --trace OUT
e2e_case "serve"
printf 'arrival_s,prompt_tokens,output_tokens\n0,64,4\n0.01,32,4\n' >req.csv
path_cases "serve --json" yes 1 serve "$CONFIGS/serve/llama3_8b_h100.yaml" --requests req.csv --json OUT
path_cases "serve --trace" yes 1 serve "$CONFIGS/serve/llama3_8b_h100.yaml" --requests req.csv --trace OUT
e2e_case "bench, topo, validate"
path_cases "bench --csv" yes 1 --chips 2 bench all_reduce -b 1K -e 4K -n 1 -w 0 --csv OUT
path_cases "bench --json" yes 1 --chips 2 bench all_reduce -b 1K -e 4K -n 1 -w 0 --json OUT
path_cases "topo describe --dot" yes 1 topo describe "$SMALL" --dot OUT
path_cases "topo describe --json" yes 1 topo describe "$SMALL" --json OUT
path_cases "validate --json" yes 1 --chips 2 validate -c all_reduce --counts 8 --json OUT
e2e_case "ckpt, calibrate"
path_cases "ckpt inspect --json" yes 1 ckpt inspect ck.h5 --json OUT
path_cases "ckpt convert OUT" no 1 ckpt convert ck.h5 OUT
path_cases "calibrate --out" yes 1 --chips 8 calibrate ar.log --bandwidth 100 --latency 1000 --out OUT
path_cases "calibrate --json" yes 1 --chips 8 calibrate ar.log --bandwidth 100 --latency 1000 --json OUT
path_cases "calibrate --kernels --out" yes 1 calibrate --kernels k.csv --device h100 --out OUT
path_cases "calibrate --kernels --json" yes 1 calibrate --kernels k.csv --device h100 --json OUT
e2e_case "import, export"
path_cases "import hf --output" yes 1 import hf "$CONFIGS/../tests/data/hf/llama3_8b.json" --output OUT
path_cases "export megatron --output" yes 1 export megatron "$CONFIGS/lm_train.yaml" --output OUT

# dir_cases WHAT CMD...: CMD has the word OUT where an output folder goes (--plots, a sweep's --output / output:).
# /dev/stdout and links to a FIFO, /dev/null and a regular file are not folders: exit 2, each link intact; a link
# to a folder gets the files in that folder and stays a link.
dir_cases() {
  local what=$1
  shift
  local a args
  rm -rf fifo fifo.lnk null.lnk file.lnk target.out tdir dir.lnk
  mkfifo fifo && ln -s fifo fifo.lnk && ln -s /dev/null null.lnk && echo old >target.out && ln -s target.out file.lnk
  mkdir tdir && ln -s tdir dir.lnk
  for P in /dev/stdout fifo.lnk null.lnk file.lnk dir.lnk; do
    args=()
    for a in "$@"; do [ "$a" = OUT ] && args+=("$P") || args+=("$a"); done
    if [ "$P" = dir.lnk ]; then
      expect_exit 0 '.' -- shardsim_mpi 1 "${args[@]}"
    else
      expect_exit 2 "$P.*(not a directory|Not a directory)" -- shardsim_mpi 1 "${args[@]}"
    fi
  done
  [ -L /dev/stdout ] && [ -L fifo.lnk ] && [ -p fifo ] && [ -L null.lnk ] && [ -c /dev/null ] && [ -L file.lnk ] &&
    [ "$(cat target.out)" = old ] && [ -L dir.lnk ] && pass "$what: every link intact, the file behind file.lnk untouched" ||
    fail "$what: a link or its target was replaced"
  [ -n "$(ls tdir)" ] && pass "$what: the files went into the folder dir.lnk points at ($(ls tdir | head -3 | tr '\n' ' '))" ||
    fail "$what: nothing in the folder behind dir.lnk"
}
e2e_case "folders: --plots, sweep --output and output:"
dir_cases "profile --plots" --chips 4 profile "$SMALL" --plots OUT
dir_cases "train --plots" train t.yaml --plots OUT
printf 'name: g\noutput: OUTDIR\naxes:\n  topology:\n    - {kind: ring, chips: 2, bandwidth_gbps: 100, latency_ns: 1000, label: ring2}\n  collective: [all_reduce]\n  algorithm: [ring]\n  size: [4K]\n' >g.yaml
dir_cases "sweep --output" --chips 2 sweep g.yaml --no-plots --force --output OUT
sed 's/^output: OUTDIR/output: dir.lnk/' g.yaml >g_dir.yaml
expect_exit 0 'results' -- shardsim_mpi 1 --chips 2 sweep g_dir.yaml --no-plots --force
[ -L dir.lnk ] && [ -f tdir/results.csv ] && pass "sweep output: a link to a folder: results in the folder, the link stays" ||
  fail "sweep output: dir.lnk"
# A sweep's results files through links: a link to a regular file is written at its target; streams refused.
rm -rf so && mkdir so && echo '{}' >so_target.json && ln -s ../so_target.json so/results.json && ln -s /dev/null so/results.csv
expect_exit 2 'results\.csv: is not a regular file' -- shardsim_mpi 1 --chips 2 sweep g.yaml --no-plots --output so
rm so/results.csv
expect_exit 0 'results' -- shardsim_mpi 1 --chips 2 sweep g.yaml --no-plots --output so
[ -L so/results.json ] && grep -q all_reduce so_target.json && pass "sweep results.json through a link: the target holds the rows" ||
  fail "sweep results.json link: $(ls -l so | tr '\n' ' ')"

e2e_case "an output under a regular file: exit 2 before the run (not exit 3 after it)"
echo x >afile
for flag in --json --trace; do
  expect_exit 2 "afile' is not a directory" -- shardsim_mpi 1 run c1.yaml --no-checkpoint $flag afile/x.json
done
expect_exit 2 "afile' is not a directory" -- shardsim_mpi 1 run c1.yaml --checkpoint afile/x.h5
expect_exit 2 "afile' is not a directory" -- shardsim_mpi 1 --chips 2 bench all_reduce -b 1K -e 1K --csv afile/x.csv
expect_exit 2 "afile' is not a directory" -- shardsim_mpi 1 train t.yaml --json afile/x.json
expect_exit 2 "afile' is not a directory" -- shardsim_mpi 1 ckpt convert ck.h5 afile/x.h5

e2e_case "--plots DIR and another output on one of its files"
expect_exit 2 'both write' -- shardsim_mpi 1 --chips 4 profile "$SMALL" --plots pl --json pl/roofline.dat
[ -e pl/roofline.dat ] && fail "pl/roofline.dat was written" || pass "nothing written"

e2e_finish
