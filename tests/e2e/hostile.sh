#!/usr/bin/env bash
# e2e: text from configs and results files is never run as code (docs/SECURITY.md).
#  - a sweep `label` (topology, workload, device) or plan value with a control character is refused with exit 2
#    naming FILE:LINE and the key, before anything runs (issue 14: a newline followed by system("touch X") in a
#    label created X when the sweep drew its plots);
#  - labels with gnuplot's other active characters (backquotes, @macros, quotes, semicolons) are accepted as text
#    and drawn, never executed;
#  - a results.csv edited to carry such text (sweep resume and --plot-only read it) is drawn without running it.
# Every case checks that the marker file the hostile text would create does not exist.
# Usage: hostile.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
E2E_TIMEOUT=${E2E_TIMEOUT_HOSTILE:-180}

MARK=$E2E_TMP/pwned
no_marker() {
  if [ -e "$MARK" ]; then fail "$1: the marker $MARK was created: user text was executed"; rm -f "$MARK"
  else pass "$1: marker not created"; fi
}
HAVE_GNUPLOT=0
command -v gnuplot >/dev/null 2>&1 && HAVE_GNUPLOT=1

# sweep_file TOPOLOGY WORKLOAD: a sweep with one collective and one workload point (2 chips: a busbw plot).
sweep_file() {
  cat <<EOF2
name: evil
output: out
validate_max_bytes: 64K
axes:
  topology:
    - $1
  collective: [all_reduce]
  algorithm: [ring]
  size: [4K]
  workload:
    - $2
  plan: [{tp: chips}]
EOF2
}
TOPO='{kind: ring, chips: 2, bandwidth_gbps: 100, latency_ns: 1000, label: ring2}'
WORK="{config: $CONFIGS/blocks/small_block.yaml, label: small, set: {seq: 32}}"

e2e_case "a newline and system() in a topology label (the issue's input)"
sweep_file "{kind: ring, chips: 2, bandwidth_gbps: 100, latency_ns: 1000, label: \"r1\\nsystem(\\\"touch $MARK\\\")\"}" "$WORK" >t.yaml
expect_exit 2 "^shardsim: error: (.*/)?t\\.yaml:6: axes\\.topology\\[0\\]\\.label: contains a control character U\\+000A" -- \
  shardsim_mpi 2 sweep t.yaml && assert_out_count '^shardsim: error' 1
no_marker "topology label"
[ ! -e out ] && pass "nothing written" || fail "out/ exists after a refused sweep"

e2e_case "a newline in a workload label and in a device label"
sweep_file "$TOPO" "{config: $CONFIGS/blocks/small_block.yaml, label: \"w\\nsystem('touch $MARK')\", set: {seq: 32}}" >w.yaml
expect_exit 2 "^shardsim: error: (.*/)?w\\.yaml:11: axes\\.workload\\[0\\]\\.label: contains a control character U\\+000A" -- \
  shardsim_mpi 2 sweep w.yaml
no_marker "workload label"
{ sweep_file "$TOPO" "$WORK"; printf '  device:\n    - {preset: generic, label: "d\\rx"}\n'; } >d.yaml
expect_exit 2 "^shardsim: error: (.*/)?d\\.yaml:14: axes\\.device\\[0\\]\\.label: contains a control character U\\+000D" -- \
  shardsim_mpi 2 sweep d.yaml
sweep_file "$TOPO" "$WORK" | sed 's/plan: \[{tp: chips}\]/plan: [{tp: chips, all_reduce: "ring\\tx"}]/' >p.yaml
expect_exit 2 "^shardsim: error: (.*/)?p\\.yaml:12: axes\\.plan\\[0\\]\\.all_reduce: contains a control character U\\+0009" -- \
  shardsim_mpi 2 sweep p.yaml

e2e_case "gnuplot's active characters in labels are drawn as text"
# Backquotes (command substitution), @macro, quotes, a semicolon and system(): all printable, so accepted.
sweep_file "{kind: ring, chips: 2, bandwidth_gbps: 100, latency_ns: 1000, label: \"r\`touch $MARK\`'; system('touch $MARK') @x\"}" \
  "{config: $CONFIGS/blocks/small_block.yaml, label: \"w\`touch $MARK\`' \\\" @GPVAL_PWD; system('touch $MARK')\", set: {seq: 32}}" >g.yaml
if expect_exit 0 "sweep evil: ran 2" -- shardsim_mpi 2 sweep g.yaml; then
  no_marker "labels with backquotes, quotes, @ and system()"
  if [ $HAVE_GNUPLOT = 1 ]; then
    [ -s out/busbw_all_reduce.png ] && [ -s out/breakdown.png ] && pass "both plots drawn" || fail "plots missing"
  fi
  grep -q 'touch' out/busbw_all_reduce.gp && fail "the busbw script contains label text" || pass "no label text in the busbw script"
  grep -q 'title columnheader(1)' out/busbw_all_reduce.gp && pass "series titles are read as data" || fail "no columnheader titles"
fi

e2e_case "a results file carrying a newline and system() (resume and --plot-only read it)"
if [ -s out/results.csv ]; then
  python3 - out/results.csv "$MARK" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1], newline="")))
evil = 'x\nsystem("touch %s")\n' % sys.argv[2]
for r in rows:
    r["topology"] += evil
    r["workload"] += evil
    r["plan"] += evil
with open(sys.argv[1], "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0].keys()), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
PY
  grep -qF 'system(""touch' out/results.csv && pass "results.csv tampered" || fail "test bug: tampering failed"
  if [ $HAVE_GNUPLOT = 1 ]; then
    expect_exit 0 "plot" -- shardsim_mpi 2 sweep g.yaml --plot-only
    no_marker "--plot-only on a tampered results.csv"
    grep -Eq '^[[:space:]]*system' out/busbw_all_reduce.gp out/breakdown.gp \
      && fail "a script line starts with results text" || pass "no script line starts with results text"
  fi
  # Resume reads the same file (its rows keep their keys; only the label columns were changed).
  expect_exit 0 "sweep evil" -- shardsim_mpi 2 sweep g.yaml
  no_marker "resume from a tampered results.csv"
fi

e2e_finish
