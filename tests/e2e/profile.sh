#!/usr/bin/env bash
# e2e: the profiler (docs/PROFILE.md): `run --profile`, `shardsim profile`, `--what-if`, the trace's arrows, and
# `train --profile --what-if`. Checked (python3, stdlib json):
#   - the default job (Llama-2-7B MLP, tp=8, 8 chips on one rank; shape-only, which gives real data's simulated
#     figures) with --profile --trace reports the same simulated figures as without (recording dependencies changes
#     no time) and still 555.132 us (the executor's forward: RMSNorm, MLP, residual; main's kernel model of edeba7d);
#   - the profile's critical path ends at the report's simulated total and its classes add up to it; every step
#     lies within [0, end] and the steps do not overlap; the top bottleneck has time > 0;
#   - the trace: every send with "flow_out" has exactly one receive with "flow_in" and the same bind_id, on another
#     process (chip); no bind_id repeats; every receive of the run is paired; the critical path process exists;
#   - --what-if link_bw=2x,hbm_bw=1.5x,peak=2x,latency=0.5x,dim0.bandwidth=2x: rows sorted by speedup, and each
#     row's time equals a separate shape-only `run` with the row's --set overrides, exactly;
#   - `shardsim profile` prints the profile (shape-only, no checkpoint);
#   - a straggler (chip 0 with one more FFN column than the others) is first among the chips on the path, and every
#     kernel on the path is its own;
#   - train --profile --what-if on a 4-chip dp x tp training config: the profile's end and the what-if row equal
#     a separate `train --shape-only --set ...` step, exactly;
#   - bad --what-if specs: exit 2 with one line naming the change;
#   - --plots DIR (run/profile/train): roofline.png and utilisation.png are valid PNGs (signature, IHDR, IEND), the
#     default job's GEMMs lie right of the ridge point and its SwiGLU left of it (roofline.dat), the utilisation
#     fractions lie in [0, 1]; a symlink at roofline.png stays and its target gets the PNG; without gnuplot the
#     data and scripts are written and the run warns with exit 0; --plots naming a file is exit 2.
# Usage: profile.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
[ "$E2E_TIMEOUT" -lt 300 ] && E2E_TIMEOUT=300  # the default job's run with the profile, twice, on 2 shared cores

if ! command -v python3 >/dev/null 2>&1; then
  echo "[$E2E_NAME] SKIP: python3 not found (the checks need it)"
  exit 77
fi

DEFAULT=$CONFIGS/workloads/llama2_7b_mlp_tp8.yaml

cat >check_profile.py <<'EOF'
import json, sys

def total_of(rep):
    return rep["simulated"]["total_ns"] if "total_ns" in rep["simulated"] else rep["simulated"]["critical"]["total_ns"]

def main():
    rep = json.load(open(sys.argv[1]))
    p = rep["profile"]
    errs = []
    end = p["end_ns"]
    s = sum(p["path_ns_by_class"].values())
    if abs(s - end) > 1e-6 * max(1.0, end):
        errs.append(f"classes add up to {s}, the path ends at {end}")
    t = 0.0
    for st in p["path"]:
        if st["from_ns"] + 1e-9 < t:
            errs.append(f"step {st} starts before the previous step ends ({t})")
        if st["end_ns"] < st["from_ns"] or st["end_ns"] > end + 1e-9:
            errs.append(f"step {st} outside [0, {end}]")
        t = st["end_ns"]
    if p["path"] and abs(t - end) > 1e-9:
        errs.append(f"the last step ends at {t}, not {end}")
    if not p["bottlenecks"] or p["bottlenecks"][0]["ns"] <= 0:
        errs.append("no bottleneck with time > 0")
    if len(sys.argv) > 2:
        want = float(sys.argv[2])
        if abs(end - want) > 1e-6:
            errs.append(f"the path ends at {end}, the report says {want}")
    for e in errs:
        print("profile check:", e)
    sys.exit(1 if errs else 0)

main()
EOF

cat >check_flows.py <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
ev = doc["traceEvents"]
errs = []
outs, ins = {}, {}
recvs = 0
names = {}
for e in ev:
    if e.get("ph") == "M" and e.get("name") == "process_name":
        names[e["pid"]] = e["args"]["name"]
    if e.get("ph") != "X":
        continue
    if e.get("cat") == "recv":
        recvs += 1
    if e.get("flow_out"):
        if e["bind_id"] in outs: errs.append(f"bind_id {e['bind_id']} leaves two slices")
        outs[e["bind_id"]] = e
    if e.get("flow_in"):
        if e["bind_id"] in ins: errs.append(f"bind_id {e['bind_id']} enters two slices")
        ins[e["bind_id"]] = e
for k, o in outs.items():
    i = ins.get(k)
    if i is None:
        errs.append(f"send {k} has no receive"); continue
    if o["cat"] != "send" or i["cat"] != "recv": errs.append(f"flow {k}: {o['cat']} -> {i['cat']}")
    if o["pid"] == i["pid"]: errs.append(f"flow {k} stays on pid {o['pid']}")
    if o["args"]["peer"] + 1 != i["pid"] or i["args"]["peer"] + 1 != o["pid"]:
        errs.append(f"flow {k}: peers do not match the pids")
    if i["ts"] + 1e-9 < o["ts"]: errs.append(f"flow {k} arrives before it leaves")
for k in ins:
    if k not in outs: errs.append(f"receive {k} has no send")
if recvs != len(ins): errs.append(f"{recvs} receives, {len(ins)} with an arrow")
if not outs: errs.append("no arrows")
if "critical path" not in names.values(): errs.append("no critical path process")
crit = sum(1 for e in ev if e.get("ph") == "X" and e.get("args", {}).get("critical_path"))
if crit == 0: errs.append("no event marked critical_path")
for e in errs: print("flow check:", e)
print(f"{len(outs)} arrows, {crit} events on the critical path")
sys.exit(1 if errs else 0)
EOF

cat >check_whatif.py <<'EOF'
import json, sys
rep = json.load(open(sys.argv[1]))
w = rep["what_if"]
rows = w["changes"]
errs = []
sp = [r["speedup"] for r in rows]
if sp != sorted(sp, reverse=True): errs.append(f"rows not sorted by speedup: {sp}")
for r in rows:
    if abs(r["speedup"] - w["baseline_ns"] / r["ns"]) > 1e-12 * r["speedup"]: errs.append(f"speedup of {r}")
for e in errs: print("what-if check:", e)
# The --set flags of each row, one line per row: CHANGE<TAB>NS<TAB>SET<TAB>SET...
with open(sys.argv[2], "w") as f:
    for r in rows:
        f.write("\t".join([r["change"], repr(r["ns"])] + r["set"]) + "\n")
sys.exit(1 if errs else 0)
EOF

total_ns() { python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(repr(r["simulated"]["total_ns"]))' "$1"; }
step_ns() { python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(repr(r["train"]["step_ns"]))' "$1"; }

# Every row of ROWS re-run by CMD... with its --set flags; the JSON's value (by GETTER) must equal the row's.
check_rows() {
  local rows=$1 getter=$2
  shift 2
  local change ns sets n=0
  while IFS=$'\t' read -r -a fields; do
    change=${fields[0]}
    ns=${fields[1]}
    sets=()
    for s in "${fields[@]:2}"; do sets+=(--set "$s"); done
    n=$((n + 1))
    if expect_exit 0 '' -- "$@" --json "row$n.json" "${sets[@]}"; then
      got=$($getter "row$n.json")
      if [ "$got" = "$ns" ]; then pass "$change: re-run with ${sets[*]} gives $got ns, as the what-if row"
      else fail "$change: the what-if row says $ns ns, a re-run with ${sets[*]} gives $got"; fi
    fi
  done <"$rows"
}

e2e_case "default job: --profile and --trace change no simulated figure"
if expect_exit 0 'forward time +555\.132 us' -- shardsim_mpi 1 --chips 8 run "$DEFAULT" --no-checkpoint --shape-only --json plain.json; then
  pass "default job without --profile: 555.132 us"
fi
if expect_exit 0 'profile \(critical path across chips' -- shardsim_mpi 1 --chips 8 run "$DEFAULT" --no-checkpoint \
    --shape-only --profile --trace t.json --json prof.json; then
  assert_out 'forward time +555\.132 us' "the default job is still 555.132 us with --profile"
  assert_out 'top bottlenecks' "the text has the bottleneck table"
  if python3 - plain.json prof.json <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
sys.exit(0 if a["simulated"] == b["simulated"] else 1)
EOF
  then pass "the simulated section is identical with and without --profile --trace"
  else fail "the simulated section differs with --profile --trace"; fi
  if python3 check_profile.py prof.json "$(total_ns prof.json)"; then pass "the critical path tiles [0, total]"
  else fail "critical path checks (prof.json)"; fi
  if python3 check_flows.py t.json; then pass "every send's arrow ends at its receive on another chip"
  else fail "flow checks (t.json)"; fi
fi

e2e_case "--what-if: each row equals a re-run with its --set overrides"
if expect_exit 0 'what-if' -- shardsim_mpi 1 --chips 4 run "$SMALL" --no-checkpoint --shape-only --json wi.json \
    --what-if 'link_bw=2x,hbm_bw=1.5x,peak=2x,latency=0.5x,dim0.bandwidth=2x,launch=0.5x+peak=2x'; then
  if python3 check_whatif.py wi.json rows.tsv; then pass "rows sorted, speedups = baseline / time"
  else fail "what-if checks (wi.json)"; fi
  check_rows rows.tsv total_ns shardsim_mpi 1 --chips 4 run "$SMALL" --no-checkpoint --shape-only
fi

e2e_case "shardsim profile"
if expect_exit 0 'profile \(critical path across chips' -- shardsim_mpi 1 --chips 4 profile "$SMALL" --json p.json; then
  assert_out 'DONE \(shape-only' "profile runs in shape-only mode"
  if python3 check_profile.py p.json "$(total_ns p.json)"; then pass "the profile command's path tiles [0, total]"
  else fail "profile checks (p.json)"; fi
fi

e2e_case "a straggler: one chip with an extra FFN column is on the path and named first"
# hidden 1024, ffn 1025 on 4 chips: chip 0 holds 257 columns, the others 256 (with ffn 1024 all tie and the path
# runs through chip 2's kernels).
if expect_exit 0 'chips on the path: +chip 0 ' -- shardsim_mpi 1 --chips 4 profile "$SMALL" --set model.hidden=1024 \
    --set model.ffn=1025 --set model.tokens=256 --json strag.json; then
  if python3 - strag.json <<'EOF2'
import json, sys
p = json.load(open(sys.argv[1]))["profile"]
ok = p["chips_on_path"][0]["chip"] == 0 and all(s["chip"] == 0 for s in p["path"] if s["category"] == "compute")
sys.exit(0 if ok else 1)
EOF2
  then pass "chip 0 first on the path, and every kernel on the path is chip 0's"
  else fail "the straggler chip 0 is not first, or kernels of other chips are on the path (strag.json)"; fi
fi

e2e_case "train --profile --what-if"
TRAIN=$CONFIGS/lm_train.yaml
if expect_exit 0 'profile \(critical path across chips' -- shardsim_mpi 1 --chips 4 train "$TRAIN" --steps 2 \
    --plan dp=2,tp=2 --ring 4 --shape-only --profile --json tr.json --what-if 'link_bw=2x,peak=2x'; then
  if python3 check_profile.py tr.json; then pass "the training step's path tiles [0, end]"
  else fail "profile checks (tr.json)"; fi
  if python3 check_whatif.py tr.json trows.tsv; then pass "train: rows sorted"; else fail "what-if checks (tr.json)"; fi
  check_rows trows.tsv step_ns shardsim_mpi 1 --chips 4 train "$TRAIN" --steps 2 --plan dp=2,tp=2 --ring 4 --shape-only
fi

e2e_case "bad --what-if"
expect_exit 2 'what-if bogus=2x: unknown change' -- shardsim_mpi 1 --chips 4 run "$SMALL" --no-checkpoint --what-if bogus=2x
assert_out_count 'error' 1 "one line"
expect_exit 2 "what-if peak=fast: 'fast' is not a positive factor" -- shardsim_mpi 1 --chips 4 run "$SMALL" --no-checkpoint --what-if peak=fast
expect_exit 2 "what-if: 'link_bw=2x,,peak=2x': an empty item" -- shardsim_mpi 1 --chips 4 run "$SMALL" --no-checkpoint --what-if 'link_bw=2x,,peak=2x'
expect_exit 2 'what-if model.nope=2x: the config has no' -- shardsim_mpi 1 --chips 4 run "$SMALL" --no-checkpoint --what-if model.nope=2x
# Crafted values (the hostile pass of issue 31's surfaces): each is exit 2, one line, control characters escaped.
for spec in 'link_bw=nanx' 'peak=0x' 'link_bw=1e400x' 'peak=0x10x' 'peak= 2x' 'link_bw=infx' 'link_bw=-2x'; do
  if expect_exit 2 "^shardsim: error: --what-if .*is not a positive factor" -- \
      shardsim_mpi 1 --chips 4 run "$SMALL" --no-checkpoint --what-if "$spec"; then
    assert_out_count '^shardsim' 1 "$spec: one line"; fi
done
expect_exit 2 "^shardsim: error: --what-if =2x: expected KEY=VALUE" -- shardsim_mpi 1 --chips 4 run "$SMALL" --no-checkpoint --what-if '=2x'
expect_exit 2 '^shardsim: error: --what-if link_bw=2x\\x1b\[2J: ' -- shardsim_mpi 1 --chips 4 run "$SMALL" --no-checkpoint --what-if $'link_bw=2x\e[2J'
assert_out_count '^shardsim' 1 "ESC in a change: one line"
if LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$E2E_OUT"; then fail "raw control characters in the output"; else pass "escaped"; fi
expect_exit 2 '^shardsim: error: --what-if peak\\x0a=2x: unknown change' -- shardsim_mpi 1 --chips 4 run "$SMALL" --no-checkpoint --what-if $'peak\n=2x'
assert_out_count '^shardsim' 1 "a newline in a change: one line"

e2e_case "--what-if on a config path: model.tokens=2x equals --set model.tokens=32 (it said the config had no model.tokens)"
if expect_exit 0 'model\.tokens=2x +[0-9.]+ us +[0-9.]+x +\(--set model\.tokens=32\)' -- \
    shardsim_mpi 1 --chips 4 profile "$SMALL" --what-if model.tokens=2x; then
  want=$(sed -nE 's/^  model\.tokens=2x +([0-9.]+) us.*/\1/p' "$E2E_STDOUT")
  if expect_exit 0 '^  forward time ' -- shardsim_mpi 1 --chips 4 profile "$SMALL" --set model.tokens=32; then
    got=$(sed -nE 's/^  forward time +([0-9.]+) us$/\1/p' "$E2E_STDOUT" | head -n 1)
    [ -n "$got" ] && [ "$got" = "$want" ] && pass "the row's $want us = a re-run with --set ($got us)" ||
      fail "the row says '$want' us, a re-run with --set model.tokens=32 '$got' us"
  fi
fi

e2e_case "--plots: a roofline and a utilisation plot"
cat >check_plots.py <<'EOF'
import struct, sys, zlib
d = sys.argv[1]
errs = []
for name in ("roofline.png", "utilisation.png"):
    b = open(f"{d}/{name}", "rb").read()
    if b[:8] != b"\x89PNG\r\n\x1a\n": errs.append(f"{name}: no PNG signature"); continue
    n, t = struct.unpack(">I4s", b[8:16])
    w, h = struct.unpack(">II", b[16:24])
    if t != b"IHDR" or (w, h) != (960, 600): errs.append(f"{name}: IHDR {t} {w}x{h}")
    if zlib.crc32(b[12:12 + 4 + n]) != struct.unpack(">I", b[16 + n:20 + n])[0]: errs.append(f"{name}: IHDR CRC")
    if b[-12:-4] != b"\x00\x00\x00\x00IEND": errs.append(f"{name}: does not end with IEND")
ridge, side = None, {}
for line in open(f"{d}/roofline.dat"):
    if line.startswith("# roof:"): ridge = float(line.split()[-1]); continue
    if line.startswith("#"): continue
    op = line.split('"')[1]; f = line.split('"')[2].split()
    side[op] = float(f[1]) > ridge
if not any(v for k, v in side.items() if k.startswith("gemm.")): errs.append(f"no GEMM right of the ridge {ridge}: {side}")
if side.get("swiglu") is not False: errs.append(f"swiglu not left of the ridge {ridge}: {side}")
for line in open(f"{d}/utilisation.dat"):
    if line.startswith("#"): continue
    v = [float(x) for x in line.split()[2:]]
    if any(x < 0 or x > 1 + 1e-9 for x in v): errs.append(f"utilisation out of [0, 1]: {line.strip()}"); break
print("\n".join(errs))
sys.exit(1 if errs else 0)
EOF
echo "not a plot" >decoy.txt
if command -v gnuplot >/dev/null 2>&1; then
  mkdir -p plots && ln -s "$PWD/decoy.txt" plots/roofline.png
  if expect_exit 0 'plots/roofline\.png' -- shardsim_mpi 1 --chips 8 profile "$DEFAULT" --plots plots; then
    if python3 check_plots.py plots; then pass "valid PNGs; GEMMs right of the ridge, SwiGLU left; fractions in [0, 1]"
    else fail "plot checks (plots/)"; fi
    # A link at an output's name points where the output goes (docs/RELIABILITY.md section 4): the link stays,
    # its target holds the PNG.
    if [ -L plots/roofline.png ] && [ "$(head -c 4 decoy.txt | tail -c 3)" = PNG ]; then
      pass "a symlink at roofline.png stays; its target got the PNG"
    else fail "the symlink at plots/roofline.png was replaced, or its target not written"; fi
    if ls -a plots | grep -q '^\.plots\.'; then fail "a temporary drawing directory was left in plots/"
    else pass "no temporary left"; fi
  fi
  if expect_exit 0 'utilisation\.png' -- shardsim_mpi 1 --chips 4 train "$CONFIGS/lm_train.yaml" --steps 1 \
      --plan dp=2,tp=2 --ring 4 --shape-only --plots tplots; then
    if [ -s tplots/roofline.png ] && [ -s tplots/utilisation.dat ]; then pass "train --plots draws the last step"
    else fail "train --plots: files missing"; fi
  fi
else
  echo "[$E2E_NAME] note: gnuplot not found, the PNG checks are skipped"
fi
SHARDSIM_GNUPLOT=/nonexistent/gnuplot expect_exit 0 'plots: gnuplot not found' -- shardsim_mpi 1 --chips 4 \
  profile "$SMALL" --plots noplot
if [ -s noplot/roofline.dat ] && [ -s noplot/roofline.gp ] && [ ! -e noplot/roofline.png ]; then
  pass "without gnuplot: data and scripts written, no PNG"
else fail "without gnuplot: wrong files in noplot/"; fi
expect_exit 2 '--plots decoy.txt: exists and is not a directory' -- shardsim_mpi 1 --chips 4 run "$SMALL" \
  --no-checkpoint --plots decoy.txt
# A --plots folder that cannot be created is bad input found before the run (a too-long name was exit 3 after it).
long=$(printf 'p%.0s' $(seq 300))
expect_exit 2 "^shardsim: error: --plots p+: the directory cannot be created: File name too long" -- \
  shardsim_mpi 1 --chips 4 run "$SMALL" --no-checkpoint --plots "$long"
assert_out_count '^ *step|^DONE|^PASS|validation' 0 "nothing ran"
expect_exit 2 "^shardsim: error: --plots decoy.txt/sub: the directory cannot be created: Not a directory" -- \
  shardsim_mpi 1 --chips 4 train "$CONFIGS/lm_train.yaml" --steps 1 --plan dp=1 --plots decoy.txt/sub

e2e_finish
