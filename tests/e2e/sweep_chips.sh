#!/usr/bin/env bash
# e2e: `shardsim sweep` with several chips per rank (runtime/chips.h). One spec of 1-, 2-, 4- and 8-chip points
# (collectives with real data and shape-only, a transformer block validated once) and 16-chip points run at
#  - -np 8 (one chip per rank), -np 1 --chips 8 (each point on chips started for it alone) and -np 2 --chips 4
#    (a 4-chip group inside one rank, an 8-chip group across both): results.csv and results.json are byte-identical once the wall-time column is dropped
#    (every simulated column, verdicts, reasons, the chips each point ran on);
#  - the 16-chip points are recorded with verdict error ("needs 16 chips, the launch has 8") at every launch;
#  - the points run on concurrent groups of chips (4 groups of 2 chips at 8 chips);
#  - bad input at K > 1 (unknown axis, missing file) still exits 2 with one line;
#  - topo describe works at K > 1 (same output as K = 1); calibrate runs at K > 1 (a missing log: exit 2, one line).
# Usage: sweep_chips.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
E2E_TIMEOUT=${E2E_TIMEOUT_SWEEP:-180}
command -v python3 >/dev/null 2>&1 || { echo "[$E2E_NAME] python3 needed for the CSV/JSON comparison"; exit 77; }

cat >grid.yaml <<EOF
name: kgrid
validate_max_bytes: 64K
axes:
  topology:
    - {kind: ring, chips: 1, bandwidth_gbps: 100, latency_ns: 1000, label: ring1}
    - {kind: ring, chips: 2, bandwidth_gbps: 100, latency_ns: 1000, label: ring2}
    - {kind: torus, dims: [2, 2], bandwidth_gbps: 50, latency_ns: 500, label: torus2x2}
    - {kind: ring, chips: 8, bandwidth_gbps: 100, latency_ns: 1000, label: ring8}
    - {kind: ring, chips: 16, bandwidth_gbps: 100, latency_ns: 1000, label: ring16}
  collective: [all_reduce]
  algorithm: [ring, auto]
  size: [4K, 1M]
  workload:
    - {config: $CONFIGS/blocks/small_block.yaml, label: small, set: {seq: 32}}
  plan: [{tp: chips}]
EOF
# 5 topologies x 2 algorithms x 2 sizes = 20 collective points, 5 workload points. On ring16 the 4 collective points
# need 16 chips (the launches have 8), and the block's tp16 does not fit its 8 heads (the parser's error, first).
TOTAL=25

# Drops the wall-time column from a results.csv / results.json and prints the rest (the bytes compared).
strip() {  # FILE
  python3 - "$1" <<'PY'
import csv, io, json, sys
path = sys.argv[1]
if path.endswith(".json"):
    doc = json.load(open(path))
    for r in doc["rows"]:
        r.pop("wall_s", None)
    print(json.dumps(doc, sort_keys=True, indent=1))
else:
    rows = list(csv.reader(open(path, newline="")))
    i = rows[0].index("wall_s")
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([r[:i] + r[i + 1:] for r in rows])
    print(out.getvalue(), end="")
PY
}

run_sweep() {  # NAME NP [CHIP FLAGS...]
  local name=$1 np=$2
  shift 2
  if expect_exit 0 "sweep kgrid: ran [0-9]+, skipped 0" -- shardsim_mpi "$np" "$@" sweep grid.yaml --output "$name" --no-plots; then
    assert_out "^sweep kgrid: $TOTAL points, 0 already in .* $TOTAL to run on 8 chip" "announces $TOTAL points on 8 chips"
    if [ "$np" -gt 1 ]; then
      assert_out "^chips 2: .* on 4 concurrent group\(s\) of 2 chip" "2-chip points: 4 groups of chips side by side"
      assert_out "^chips 8: .* on 1 concurrent group\(s\) of 8 chip" "8-chip points: one group"
    else  # one MPI rank: each point starts its own chips (a training point folds as train folds it)
      assert_out "^chips 2: .* one at a time on 2 chip\(s\) started for each" "2-chip points: one at a time, 2 chips each"
    fi
    local n
    n=$(grep -c 'needs 16 chips, the launch has 8' "$name/results.csv")
    [ "$n" -eq 4 ] && pass "$name: the 4 collective points needing 16 chips recorded as errors" \
      || fail "$name: $n rows say 'needs 16 chips, the launch has 8', want 4"
    grep -Eq "^workload\|small\|tp8\|ring8.*,shape_only,.*,pass," "$name/results.csv" \
      && pass "$name: the 8-chip block ran shape-only and passed its plan's validation" \
      || fail "$name: small block tp8 on ring8 did not pass"
    grep -Eq "^all_reduce\|ring\|torus2x2\|generic\|fp32\|4096#.*,run,.*,pass," "$name/results.csv" \
      && pass "$name: 4 KiB on the 2x2 torus ran with real data and passed" || fail "$name: no passing real-data torus row"
    return 0
  fi
  return 1
}

e2e_case "-np 8, one chip per rank (the reference)"
run_sweep k1 8

e2e_case "-np 1 --chips 8: every group inside one rank"
if run_sweep k8 1 --chips 8; then
  assert_out "to run on 8 chip\(s\) \(1 rank\(s\) x 8 chips, started for each point in turn\)" "says how the chips are started"
fi

e2e_case "-np 2 --chips 4 (--chips-per-rank 4): groups inside a rank and across ranks"
run_sweep k4 2 --chips-per-rank 4

e2e_case "byte-identical results (simulated columns) at K = 1, 8, 4"
for k in k8 k4; do
  for f in results.csv results.json; do
    if [ -s "k1/$f" ] && [ -s "$k/$f" ] && [ "$(strip "k1/$f")" = "$(strip "$k/$f")" ]; then
      pass "$k/$f identical to k1/$f apart from wall_s"
    else
      fail "$k/$f differs from k1/$f (wall_s dropped)"
      diff <(strip "k1/$f") <(strip "$k/$f") | head -10 >&2
    fi
  done
done
if [ -s k1/results.csv ]; then
  python3 - k1/results.csv <<'PY' && pass "the reference is not trivially empty: real-data, shape-only and error rows, 8-chip groups" || fail "reference rows"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 25, len(rows)
timing = {r["timing"] for r in rows}
assert {"run", "shape_only"} <= timing, timing
assert sum(r["verdict"] == "error" for r in rows) == 5
assert all(float(r["sim_time_us"]) > 0 for r in rows if r["verdict"] != "error" and r["chips"] != "1")
assert {r["ranks"] for r in rows if r["chips"] == "8" and r["verdict"] != "error"} == {"0-7"}
assert {r["ranks"] for r in rows if r["chips"] == "2" and r["verdict"] != "error"} <= {"0-1", "2-3", "4-5", "6-7"}
PY
fi

e2e_case "bad input at K > 1: exit 2, one line"
sed -e 's/^  collective:/  colective:/' grid.yaml >bad.yaml
if expect_exit 2 "^shardsim: error: .*bad.yaml:[0-9]+.*colective" -- shardsim_mpi 2 --chips 4 sweep bad.yaml --no-plots; then
  assert_out_count '^shardsim: error' 1 "exactly one error line"
fi
if expect_exit 2 "^shardsim: error: .*nope.yaml" -- shardsim_mpi 1 --chips 4 sweep nope.yaml; then
  assert_out_count '^shardsim: error' 1 "exactly one error line"
fi

e2e_case "topo describe at K > 1 = K = 1; calibrate refused with one line"
cat >t8.yaml <<EOF
topology: {kind: torus, dims: [2, 4], bandwidth_gbps: 100, latency_ns: 1000}
EOF
if expect_exit 0 "^topology " -- shardsim_mpi 1 topo describe t8.yaml --json topo1.json; then
  cp "$E2E_STDOUT" topo1.txt
  if expect_exit 0 "^topology " -- shardsim_mpi 2 --chips 8 topo describe t8.yaml --json topo8.json; then
    cmp -s topo1.txt "$E2E_STDOUT" && cmp -s topo1.json topo8.json \
      && pass "topo describe: same text and JSON at --chips 8" || fail "topo describe differs at --chips 8"
  fi
fi
# calibrate runs at --chips too (tests/e2e/calibrate.sh checks its fit); a missing log is one error line.
if expect_exit 2 "^shardsim: error: x.log: cannot open" -- \
  shardsim_mpi 1 --chips 8 calibrate --topology t8.yaml x.log; then
  assert_out_count '^shardsim: error' 1 "exactly one error line"
fi

e2e_finish
