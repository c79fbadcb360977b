#!/usr/bin/env bash
# e2e: sweeps that do not wait on validation (issue 17). On 4 ranks, a workload grid (two sizes of a small block x
# 2- and 4-chip rings x tp / cp plans) runs twice:
#  - validate once (the default): each distinct plan is validated once with real data on a shrunk copy (the two
#    sizes shrink to the same config, so 4 validation runs for 8 points); every full-size point is timed shape-only
#    (timing shape_only) and carries validated_at = the shrunk dimensions and its plan's verdict (pass);
#  - --validate-every: every point runs with real data (timing run, validated_at self, verdict pass);
#  - every simulated column of every point is identical between the two runs (bit for bit, as text);
#  - a results file of the validate-once run resumes under validate: every by re-running the shape-only rows only;
#  - bad values of `validate:` exit 2 with FILE:LINE.
# Usage: sweep_validate.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
E2E_TIMEOUT=${E2E_TIMEOUT_SWEEP:-180}
command -v python3 >/dev/null 2>&1 || { echo "[$E2E_NAME] python3 needed for the CSV comparison"; exit 77; }

cat >grid.yaml <<EOF
name: vgrid
output: once
axes:
  workload:
    - {config: $CONFIGS/blocks/small_block.yaml, label: s64}
    - {config: $CONFIGS/blocks/small_block.yaml, label: s128, set: {seq: 128}}
  topology:
    - {kind: ring, chips: 2, bandwidth_gbps: 100, latency_ns: 1000, label: ring2}
    - {kind: ring, chips: 4, bandwidth_gbps: 100, latency_ns: 1000, label: ring4}
  plan: [{tp: chips}, {cp: chips}]
EOF

e2e_case "validate once (default): 4 distinct plans validated small, 8 points shape-only"
if expect_exit 0 "ran 8, skipped 0" -- shardsim_mpi 4 sweep grid.yaml --no-plots; then
  assert_out "^validate once: 4 distinct plan\(s\) validated with real data at a small size" "4 validation runs for 8 points"
  assert_out "8 timed shape-only \(8 of them with their plan validated at a small size\)" "summary counts"
  assert_out "^  s128 +ring4 +generic .*; hidden=64,ffn=128" "the best-plan table says where the winner was validated"
  if python3 - once/results.csv <<'PY'; then pass "timing shape_only, validated_at = shrunk dims, verdict pass, max_rel_error of the validation"; else fail "validate-once rows"; fi
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 8, len(rows)
for r in rows:
    want = "hidden=64,ffn=128" + (",seq=64" if r["workload"] == "s128" else "")
    assert r["timing"] == "shape_only", (r["key"], r["timing"])
    assert r["validated_at"] == want, (r["key"], r["validated_at"], want)
    assert r["verdict"] == "pass", (r["key"], r["verdict"], r["reason"])
    assert r["max_rel_error"] != "" and float(r["max_rel_error"]) < 1e-4, (r["key"], r["max_rel_error"])
    assert float(r["sim_time_us"]) > 0, r["key"]
PY
fi

e2e_case "--validate-every: every point with real data; identical simulated numbers"
if expect_exit 0 "ran 8, skipped 0" -- shardsim_mpi 4 sweep grid.yaml --validate-every --output every --no-plots; then
  assert_out_count "^validate once" 0 "no separate validation runs"
  if python3 - once/results.csv every/results.csv <<'PY'; then pass "all 8 points: every simulated column identical; every = run/self/pass"; else fail "validate-once and validate-every differ"; fi
import csv, sys
once = {r["key"]: r for r in csv.DictReader(open(sys.argv[1]))}
every = {r["key"]: r for r in csv.DictReader(open(sys.argv[2]))}
assert once.keys() == every.keys() and len(once) == 8, (sorted(once), sorted(every))
sim = ("sim_time_us", "compute_us", "comm_us", "exposed_comm_us", "idle_us", "peak_mem_bytes", "tflops",
       "peak_fraction", "tokens_per_s", "algorithm_used")
for k, e in every.items():
    assert (e["timing"], e["validated_at"], e["verdict"]) == ("run", "self", "pass"), (k, e["timing"], e["validated_at"], e["verdict"])
    for c in sim:
        assert once[k][c] == e[c], (k, c, once[k][c], e[c])
# The two sizes differ at full size (the grid is not trivially one point).
assert len({r["sim_time_us"] for r in once.values()}) == 8, "expected 8 distinct simulated times"
print("8 points identical")
PY
fi

e2e_case "validate: every in the file resumes a validate-once results file by re-running its shape-only rows"
sed -e 's/^output: once/output: once\nvalidate: every/' grid.yaml >every.yaml
if expect_exit 0 "ran 8, skipped 0" -- shardsim_mpi 4 sweep every.yaml --no-plots; then
  python3 -c 'import csv,sys; rows=list(csv.DictReader(open(sys.argv[1]))); assert len(rows)==8 and all(r["timing"]=="run" and r["validated_at"]=="self" for r in rows)' once/results.csv \
    && pass "the 8 rows were replaced by real-data rows" || fail "resumed rows"
  expect_exit 0 "ran 0, skipped 8" -- shardsim_mpi 4 sweep every.yaml --no-plots
fi

e2e_case "bad validate values"
sed -e 's/^output: once/output: bad\nvalidate: sometimes/' grid.yaml >bad1.yaml
expect_exit 2 "bad1.yaml:3:.*validate: 'once' .* or 'every' .*\(got 'sometimes'\)" -- shardsim_mpi 1 sweep bad1.yaml \
  && assert_out_count "error" 1 "one message"
sed -e 's/^output: once/output: bad\nvalidate: [every]/' grid.yaml >bad2.yaml
expect_exit 2 "bad2.yaml:3:.*validate: .*\(got a non-scalar\)" -- shardsim_mpi 1 sweep bad2.yaml
[ ! -e bad ] && pass "nothing written for a bad file" || fail "bad/ was created"

e2e_finish
