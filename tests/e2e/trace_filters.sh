#!/usr/bin/env bash
# e2e: the profiler and traces at full size (issue 46 kind 13; docs/PROFILE.md "Traces at full size"), on small
# cases. Checked (python3, stdlib json):
#   - a pipelined training step with 32 micro-batches (many events per chip): the profile's path has no
#     "waiting (no recorded producer)" (producers are found exactly, not in a table that evicts them);
#   - --trace-chips / --trace-axis: the file holds the processes of those chips only (and the critical path's),
#     each kept chip with every one of its events in the full trace, and every arrow has both ends in the file;
#   - --trace-window: every kept event overlaps the window, and no event of the full trace that overlaps it is
#     missing;
#   - --trace-step: the step traced; a step the run does not have is exit 2 before any step;
#   - the report states the trace's events, chips and estimated size, within 25 % of the file's; past
#     --trace-max-mib the trace is not written: one warning line, the report says why, exit 0;
#   - bad filters (chips out of range, an axis of size 1, a window that is empty, a filter without --trace) are
#     exit 2 with one line naming the flag, before the run; `run` (the default job) takes the same flags.
# Usage: trace_filters.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
[ "$E2E_TIMEOUT" -lt 120 ] && E2E_TIMEOUT=120

if ! command -v python3 >/dev/null 2>&1; then
  echo "[$E2E_NAME] SKIP: python3 not found (the checks need it)"
  exit 77
fi
LM=$CONFIGS/lm_train.yaml
# 8 chips on one rank: tp 2 (innermost), dp 2, pp 2 (the pp group of chip 0: chips 0 and 4).
train8() { shardsim_mpi 1 --chips 8 train "$LM" --plan dp=2,tp=2,pp=2 --ring 8 --shape-only "$@"; }

cat >check_trace.py <<'PY'
import json, sys
# check_trace.py FULL FILTERED CHIPS(comma list or "all") FROM_US TO_US
full, part = (json.load(open(f)) for f in sys.argv[1:3])
chips = None if sys.argv[3] == "all" else {int(c) for c in sys.argv[3].split(",")}
lo, hi = float(sys.argv[4]), float(sys.argv[5])
nchips = full["otherData"]["chips"]
errs = []
def x_of(t):
    return [e for e in t["traceEvents"] if e.get("ph") == "X" and e["pid"] <= nchips]
pids = {e["pid"] for e in part["traceEvents"] if e["pid"] <= nchips}
want_pids = {c + 1 for c in chips} if chips is not None else set(range(1, nchips + 1))
if not pids <= want_pids:
    errs.append(f"processes {sorted(pids - want_pids)} of chips that were not asked for")
def key(e):
    return (e["pid"], e["name"], e["ts"], e["dur"], e.get("tid"))
kept = {key(e) for e in x_of(part)}
for e in x_of(part):
    if not (e["ts"] + e["dur"] >= lo and e["ts"] <= hi):
        errs.append(f"event {e['name']} [{e['ts']}, {e['ts'] + e['dur']}] us outside the window")
        break
want = {key(e) for e in x_of(full) if e["pid"] in want_pids and e["ts"] + e["dur"] >= lo and e["ts"] <= hi}
# tids may differ (lanes are packed over the kept events only): compare without them
strip = lambda s: {k[:4] for k in s}
if strip(kept) != strip(want):
    errs.append(f"{len(strip(want) - strip(kept))} events of the full trace missing, {len(strip(kept) - strip(want))} extra")
outs = [e["bind_id"] for e in part["traceEvents"] if e.get("flow_out")]
ins = [e["bind_id"] for e in part["traceEvents"] if e.get("flow_in")]
if sorted(outs) != sorted(ins):
    errs.append(f"{len(set(outs) ^ set(ins))} arrows with one end only")
if chips is not None and not part["otherData"].get("filter"):
    errs.append("otherData.filter missing")
print("; ".join(errs) if errs else f"ok: {len(kept)} events of {len(pids)} chip(s), {len(outs)} arrows")
sys.exit(1 if errs else 0)
PY

check_trace() {  # WHAT FULL FILTERED CHIPS FROM TO
  local what=$1 out
  shift
  if out=$(python3 check_trace.py "$@" 2>&1); then pass "$what: $out"; else fail "$what: $out"; fi
}

e2e_case "a long pipelined step: producers found exactly, no waiting"
if expect_exit 0 'critical path:' -- train8 --steps 1 --set model.batch=64 --profile --json long.json; then
  python3 - long.json >waiting.txt <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["profile"]
print(p["waiting_ns"], p["end_ns"], sum(1 for s in p["path"] if s["waiting_ns"] > 0))
PY
  read -r waiting end steps_waiting <waiting.txt
  if awk -v w="$waiting" -v e="$end" 'BEGIN { exit !(e > 0 && w / e < 1e-9) }'; then
    pass "32 micro-batches per replica: waiting ${waiting} ns of ${end} ns"
  else
    fail "waiting ${waiting} ns of ${end} ns (${steps_waiting} steps with waiting)"
  fi
fi

e2e_case "chips, an axis and a window keep only what was asked"
expect_exit 0 'trace: [0-9]+ events of 8 chip\(s\), about' -- train8 --steps 1 --trace full.json
expect_exit 0 'trace: [0-9]+ events of 3 chip\(s\), about .*; kept: chips 0-1,5' -- \
  train8 --steps 1 --trace chips.json --trace-chips 5,0-1
check_trace "--trace-chips 5,0-1" full.json chips.json 0,1,5 0 1e18
expect_exit 0 'kept: pp group of chip 0: chips 0,4' -- train8 --steps 1 --trace pp.json --trace-axis pp
check_trace "--trace-axis pp" full.json pp.json 0,4 0 1e18
expect_exit 0 'kept: tp group of chip 5: chips 4-5' -- train8 --steps 1 --trace tp.json --trace-axis tp:5
check_trace "--trace-axis tp:5" full.json tp.json 4,5 0 1e18
# A window in the middle of the step (microseconds of simulated time, as the trace's ts).
mid=$(python3 -c "import json; t=json.load(open('full.json')); x=[e['ts']+e['dur'] for e in t['traceEvents'] if e.get('ph')=='X']; print(max(x))")
lo=$(awk -v m="$mid" 'BEGIN { printf "%.6f", m * 0.4 }')
hi=$(awk -v m="$mid" 'BEGIN { printf "%.6f", m * 0.6 }')
expect_exit 0 "kept: chips 2-3; " -- train8 --steps 1 --trace win.json --trace-chips 2-3 --trace-window "$lo:$hi"
check_trace "--trace-chips 2-3 --trace-window $lo:$hi" full.json win.json 2,3 "$lo" "$hi"
expect_exit 0 'kept: from ' -- train8 --steps 1 --trace tail.json --trace-window "$hi:"
check_trace "--trace-window $hi:" full.json tail.json all "$hi" 1e18

e2e_case "the estimated size is stated and near the file's"
expect_exit 0 'trace: [0-9]+ events of 8 chip\(s\), about [0-9.]+ KiB' -- train8 --steps 1 --trace full2.json
est=$(grep -Eo 'about [0-9.]+ KiB' "$E2E_STDOUT" | grep -Eo '[0-9.]+' | head -1)
size=$(stat -c %s full2.json)
if awk -v e="$est" -v s="$size" 'BEGIN { r = e * 1024 / s; exit !(r > 0.75 && r < 1.25) }'; then
  pass "estimate ${est} KiB, file ${size} bytes"
else
  fail "estimate ${est} KiB, file ${size} bytes: more than 25 % apart"
fi

e2e_case "past --trace-max-mib: not written, one warning, the report says why, exit 0"
rm -f big.json
expect_exit 0 '^shardsim: warning: --trace big.json not written: .* more than --trace-max-mib 0.01; keep fewer chips' -- \
  train8 --steps 1 --trace big.json --trace-max-mib 0.01
assert_out '^trace: not written: '
assert_out_count 'warning' 1 "one warning line"
if [ ! -e big.json ]; then pass "no file"; else fail "big.json was written past the limit"; fi

e2e_case "--trace-step"
expect_exit 0 'trace: ' -- train8 --steps 2 --trace s1.json --trace-step 1
check_trace "--trace-step 1 (a whole step)" full.json s1.json all 0 1e18
expect_exit 2 "^shardsim: error: --trace-step: this run's steps are 1 \.\. 2 \(got 3\)" -- \
  train8 --steps 2 --trace s3.json --trace-step 3
assert_out_count 'step +[0-9]' 0 "refused before any step"

e2e_case "bad filters: exit 2 naming the flag, before the run"
expect_exit 2 "^shardsim: error: --trace-chips: '8': expected chip ids and ranges A-B of 0\.\.7" -- \
  train8 --steps 1 --trace x.json --trace-chips 8
expect_exit 2 "^shardsim: error: --trace-axis: 'cp': expected AXIS or AXIS:CHIP, AXIS one of this run's mesh axes \(tp, dp, pp\)" -- \
  train8 --steps 1 --trace x.json --trace-axis cp
expect_exit 2 "^shardsim: error: --trace-window: '5:1': expected FROM:TO" -- train8 --steps 1 --trace x.json --trace-window 5:1
expect_exit 2 "^shardsim: error: --trace-chips requires --trace" -- train8 --steps 1 --trace-chips 0
expect_exit 2 "^shardsim: error: --trace-chips and --trace-axis: give one of them" -- \
  train8 --steps 1 --trace x.json --trace-chips 0 --trace-axis pp
if [ ! -e x.json ]; then pass "no trace written by a refused run"; else fail "x.json written by a refused run"; fi

e2e_case "run and profile take the same flags"
expect_exit 0 'kept: chips 3' -- shardsim_mpi 1 --chips 8 run --no-checkpoint --shape-only --trace run.json --trace-chips 3
expect_exit 0 'kept: chips 0-7' -- shardsim_mpi 1 --chips 8 run --no-checkpoint --shape-only --trace runall.json --trace-chips 0-7
check_trace "run --trace-chips 3" runall.json run.json 3 0 1e18
expect_exit 0 'kept: tp group of chip 0: chips 0-7' -- shardsim_mpi 1 --chips 8 profile --trace prof.json --trace-axis tp
expect_exit 2 "^shardsim: error: --trace-chips: '9'" -- \
  shardsim_mpi 1 --chips 8 run --no-checkpoint --shape-only --trace run9.json --trace-chips 9
assert_out_count '^simulated' 0 "refused before the run"

e2e_finish
