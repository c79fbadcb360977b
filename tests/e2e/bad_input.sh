#!/usr/bin/env bash
# e2e: bad input must fail fast with exit code 2 and one clear `shardsim: error:` line naming FILE:LINE where
# there is one (never a hang, never a line per rank); a failed validation must exit 1 and print FAIL.
# Usage: bad_input.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
E2E_MPIRUN_NP1=1  # signals and aborts at one rank go through mpirun, as users run it

# one_error_line: exactly one `shardsim: error` line in the combined output, whatever the rank count.
one_error_line() { assert_out_count '^shardsim: error' 1 "exactly one 'shardsim: error' line"; }

# line_of FILE FIXED_STRING: 1-based line number of the first line containing the string.
line_of() { grep -nF -- "$2" "$1" | head -n 1 | cut -d: -f1; }

# ---- (a) topology with 6 chips under 8 ranks ----
e2e_case "(a) 6-chip topology on 8 ranks"
with_chips "$SMALL" 6 six_chips.yaml
if expect_exit 2 '^shardsim: error: .*\b6 chips\b.*\b8 (MPI )?ranks\b' -- shardsim_mpi 8 run six_chips.yaml; then
  one_error_line
  assert_out '^shardsim: error: .*six_chips\.yaml' "message names the config file"
fi

# ---- (b) malformed YAML: an unclosed flow sequence ----
e2e_case "(b) malformed YAML (unclosed bracket)"
sed '/^[[:space:]]*kind: ring/a\  dims: [2, 4' "$SMALL" >malformed.yaml
bad_line=$(line_of malformed.yaml 'dims: [2, 4')
if [ -z "$bad_line" ]; then
  fail "test bug: could not insert the malformed line"
elif expect_exit 2 '^shardsim: error: ' -- shardsim_mpi 4 run malformed.yaml; then
  one_error_line
  assert_out '^shardsim: error: .*malformed\.yaml:[0-9]+' "message names the file and a line"
  # The unclosed '[' is on line $bad_line: that is the line a user must fix.
  assert_out "^shardsim: error: (.*/)?malformed\\.yaml:$bad_line(:[0-9]+)?: " \
    "message points at malformed.yaml:$bad_line, the line with the unclosed '['"
fi

# ---- (c) unknown key (a typo) ----
e2e_case "(c) unknown key under topology"
sed -E 's/^([[:space:]]+)bandwidth_gbps:.*/\1bandwith_gbps: 100/' "$SMALL" >unknown_key.yaml
bad_line=$(line_of unknown_key.yaml 'bandwith_gbps: 100')
if [ -z "$bad_line" ]; then
  fail "test bug: could not insert the unknown key"
elif expect_exit 2 "^shardsim: error: (.*/)?unknown_key\\.yaml:$bad_line(:[0-9]+)?: .*bandwith_gbps" -- \
    shardsim_mpi 4 run unknown_key.yaml; then
  one_error_line
  assert_out '^shardsim: error: .*unknown key' "message says the key is unknown"
fi

# ---- (d) negative bandwidth ----
e2e_case "(d) negative bandwidth"
sed -E 's/^([[:space:]]+bandwidth_gbps:).*/\1 -50/' "$SMALL" >negative_bw.yaml
bad_line=$(line_of negative_bw.yaml 'bandwidth_gbps: -50')
if [ -z "$bad_line" ]; then
  fail "test bug: could not set a negative bandwidth"
elif expect_exit 2 '^shardsim: error: .*bandwidth.*> 0' -- shardsim_mpi 4 run negative_bw.yaml; then
  one_error_line
  assert_out "^shardsim: error: (.*/)?negative_bw\\.yaml:$bad_line(:[0-9]+)?: " "message names negative_bw.yaml:$bad_line"
fi

# ---- (e) missing config file ----
e2e_case "(e) missing config file"
missing=$E2E_TMP/no/such/dir/missing_config.yaml
if expect_exit 2 '^shardsim: error: ' -- shardsim_mpi 4 run "$missing"; then
  one_error_line
  assert_out_fixed "$missing" "message names the missing path"
fi

# ---- (f) nonexistent --resume checkpoint ----
e2e_case "(f) nonexistent --resume file"
if expect_exit 2 'shardsim: error' -- shardsim_mpi 4 run "$SMALL" --resume no_such_checkpoint.h5 --no-checkpoint; then
  one_error_line  # checked up front, before the ranks start work
  assert_out 'shardsim: error.*no_such_checkpoint\.h5' "message names the missing checkpoint"
fi

# ---- (f2) unwritable checkpoint directory: refused before any work ----
e2e_case "(f2) checkpoint into a missing directory"
if expect_exit 2 '^shardsim: error: ' -- shardsim_mpi 4 run "$SMALL" --checkpoint "$E2E_TMP/no/such/dir/x.h5"; then
  one_error_line
  assert_out "directory '[^']*/no/such/dir': No such file or directory" "message names the missing directory"
fi

# ---- (h) a workload that does not fit the simulated HBM ----
e2e_case "(h) simulated out of memory"
sed 's/^  preset: generic/  preset: generic\n  hbm_gib: 0.00001/' "$SMALL" >oom.yaml
if expect_exit 2 '^shardsim: error: ' -- shardsim_mpi 4 run oom.yaml; then
  one_error_line
  assert_out 'oom\.yaml: simulated out of memory: [0-9.e+-]+ GiB per chip \(state \+ activations\) does not fit the [0-9.e+-]+ GiB usable of the device.s 1e-05 GiB HBM' "message names the need per chip and the capacity"
fi

# ---- (g) validation failure: bf16 against an impossible tolerance (tp: dp's rows equal the reference's bit for bit) ----
e2e_case "(g) validation failure (bf16, tolerance 1e-30)"
with_dtype "$SMALL" bf16 strict_bf16.yaml
sed -i -E -e '/^validate:/,/^[^[:space:]#]/{/^[[:space:]]+/d}' \
  -e 's/^validate:.*/validate: {enabled: true, tolerance: 1e-30}/' strict_bf16.yaml
if ! grep -q '^validate: {enabled: true, tolerance: 1e-30}$' strict_bf16.yaml; then
  fail "test bug: could not set the validation tolerance"
elif expect_exit 1 'validation FAIL' -- shardsim_mpi 4 run strict_bf16.yaml --plan tp=4 --json strict.json; then
  assert_stdout_last_line FAIL
  assert_out 'tolerance 1e-30' "report shows the configured tolerance"
  assert_out_count '^shardsim: error' 0 "a failed validation is a verdict, not an error line"
  check_json strict.json verdict='"FAIL"' validation.passed=false
fi

# ---- (i) outputs that would clobber the config or each other: refused before any work ----
e2e_case "(i) --json over the config file"
cp "$SMALL" keep.yaml
if expect_exit 2 '^shardsim: error: ' -- shardsim_mpi 4 run keep.yaml --json keep.yaml --no-checkpoint; then
  one_error_line
  assert_out 'would overwrite the config file' "message says why"
  if cmp -s "$SMALL" keep.yaml; then pass "config left intact"; else fail "config file was modified"; fi
fi
e2e_case "(i) --json and --trace on one file"
if expect_exit 2 '^shardsim: error: ' -- shardsim_mpi 4 run "$SMALL" --json same.json --trace same.json --no-checkpoint; then
  one_error_line
fi

# ---- (j) a checkpoint that does not match the config: one message, exit 2 ----
e2e_case "(j) resume with another activation"
if expect_exit 0 'PASS' -- shardsim_mpi 4 run "$SMALL" --checkpoint silu.h5; then
  sed 's/activation: silu/activation: gelu/' "$SMALL" >gelu.yaml
  if expect_exit 2 '^shardsim: error: ' -- shardsim_mpi 4 run gelu.yaml --resume silu.h5 --no-checkpoint; then
    one_error_line
    assert_out "saved for model '[^']*ffn 200 seq 16' but the config's model is '[^']* mlp geglu'" \
      "message names both models: the checkpoint's SwiGLU and the config's GeGLU"
  fi
fi

# ---- (k) network flags and fields out of range, groups and algorithms that do not apply ----
e2e_case "(k) --group dim:0 on a graph"
printf 'topology:\n  kind: graph\n  chips: 2\n  bandwidth_gbps: 10\n  links:\n    - [0, 1]\n' >graph2.yaml
if expect_exit 2 '^shardsim: error: ' -- shardsim_mpi 2 validate --topology graph2.yaml --group dim:0 -c all_reduce --counts 7; then
  one_error_line
  assert_out '--group dim:0: the topology is a graph .*has no dimensions; use world, mod:K or div:K' "names the kind"
fi
expect_exit 2 '--group dim:2: the torus topology has 2 dimensions \(dim:0\.\.dim:1\)' -- \
  shardsim_mpi 4 validate --torus 2x2 --group dim:2 -c all_reduce --counts 7
e2e_case "(k) extreme bandwidth and latency"
for v in 1e308 1e-300 nan inf -1 0; do
  expect_exit 2 "--bandwidth: must be a finite number > 0 within 0\.001\.\.1e\+06 GB/s \(got " -- \
    shardsim_mpi 2 validate --bandwidth "$v" -c all_reduce --counts 7
done
for v in 1e308 nan -5; do
  expect_exit 2 "--latency: must be a finite number >= 0 within 0\.\.1e\+09 ns \(got " -- \
    shardsim_mpi 2 validate --latency "$v" -c all_reduce --counts 7
done
for v in 1e308 1e-300 .nan; do
  printf 'topology:\n  kind: ring\n  chips: 2\n  bandwidth_gbps: %s\n' "$v" >bw.yaml
  expect_exit 2 "bw\.yaml:4: topology\.bandwidth_gbps: must be a finite number > 0 within 0\.001\.\.1e\+06 GB/s \(got $v\)" -- \
    shardsim_mpi 2 validate --topology bw.yaml -c all_reduce --counts 7
done
printf 'topology:\n  kind: ring\n  chips: 2\n  bandwidth_gbps: 10\n  latency_ns: 1e300\n' >lat.yaml
expect_exit 2 'lat\.yaml:5: topology\.latency_ns: must be a finite number >= 0 within 0\.\.1e\+09 ns \(got 1e300\)' -- \
  "$SHARDSIM" topo describe lat.yaml
printf 'topology: [ Ring ]\nnpus_count: [ 2 ]\nbandwidth: [ 1e308 ]\nlatency: [ 10 ]\n' >astra_bw.yml
expect_exit 2 'astra_bw\.yml:3: bandwidth\[0\]: must be a finite number > 0 within' -- "$SHARDSIM" topo describe astra_bw.yml
e2e_case "(k) an algorithm of another collective"
expect_exit 2 "broadcast: algorithm 'halving_doubling' is not applicable to broadcast \(it is an algorithm of all_reduce, reduce_scatter, all_gather, all_gatherv\); broadcast takes: binomial_tree, ring, auto" -- \
  shardsim_mpi 2 bench broadcast -a halving_doubling -b 8 -e 8 -n 1 -w 0
expect_exit 2 "--algo: broadcast: algorithm 'halving_doubling' is not applicable to broadcast .*takes: binomial_tree, ring, auto" -- \
  shardsim_mpi 2 validate -c broadcast -a halving_doubling --counts 7
expect_exit 2 "unknown algorithm 'warp' \(known: binomial_tree, ring, auto\)" -- \
  shardsim_mpi 2 bench broadcast -a warp -b 8 -e 8 -n 1 -w 0
e2e_case "(k) wording: singular counts, bidir_ring refusal on a permuted torus placement"
printf 'topology:\n  kind: stacked\n  dims:\n    - {kind: switch, size: 2, bandwidth_gbps: 10}\n' >one_switch.yaml
if expect_exit 0 'diameter +2 hops' -- "$SHARDSIM" topo describe one_switch.yaml; then
  assert_out 'chips +2 \(\+ 1 switch\)$' "1 switch, not 1 switches"
fi
printf 'topology:\n  kind: ring\n  chips: 2\n  bandwidth_gbps: 10\n' >ring2.yaml
expect_exit 0 'diameter +1 hop$' -- "$SHARDSIM" topo describe ring2.yaml
printf 'topology:\n  kind: torus\n  dims: [4]\n  bandwidth_gbps: 10\n  placement: [0, 2, 1, 3]\n' >permuted.yaml
expect_exit 2 "bidir_ring. cannot run here: chip 1 reaches chips 3 and 2 through the same link 1 -> 2 \(the rank order does not follow the topology's rings" -- \
  shardsim_mpi 4 validate --topology permuted.yaml -c all_reduce -a bidir_ring --counts 7

# ---- (l) YAML that yaml-cpp accepts but that does not mean what it says (issue 14, item 10) ----
e2e_case "(l) two YAML documents"
{ cat "$SMALL"; printf -- '---\nworkload:\n  ffn: 4096\n'; } >two_docs.yaml
doc_line=$(grep -n '^---$' two_docs.yaml | tail -n 1 | cut -d: -f1)
if expect_exit 2 "^shardsim: error: (.*/)?two_docs\\.yaml:$doc_line: a second YAML document" -- \
    shardsim_mpi 2 run two_docs.yaml --no-checkpoint; then
  one_error_line
fi
e2e_case "(l) a directory as the config"
mkdir -p cfgdir.yaml
expect_exit 2 "^shardsim: error: config file 'cfgdir\\.yaml' is a directory" -- shardsim_mpi 2 run cfgdir.yaml \
  && one_error_line
expect_exit 2 "cfgdir\\.yaml'?:? is a directory" -- "$SHARDSIM" topo describe cfgdir.yaml
e2e_case "(l) unterminated quote"
# name: "small-mlp  (no closing quote): yaml-cpp folds the next lines into the string and used to report a
# missing key further down; the error must point at the quote.
sed -E '0,/^name:.*/s//name: "small-mlp/' "$SMALL" >open_quote.yaml
q_line=$(line_of open_quote.yaml 'name: "small-mlp')
if [ -z "$q_line" ]; then
  fail "test bug: could not insert the open quote"
elif expect_exit 2 "^shardsim: error: (.*/)?open_quote\\.yaml:$q_line:7: unterminated quote" -- \
    shardsim_mpi 2 run open_quote.yaml --no-checkpoint; then
  one_error_line
fi
# The same with a later quote that closes it: yaml-cpp fails further down; the message still names the quote.
sed -E '0,/^name:.*/s//name: "small-mlp/; 0,/^([[:space:]]+)kind: ring/s//\1kind: "ring"/' "$SMALL" >open_quote2.yaml
q_line=$(line_of open_quote2.yaml 'name: "small-mlp')
expect_exit 2 "^shardsim: error: (.*/)?open_quote2\\.yaml:$q_line:7: unterminated quote" -- \
  shardsim_mpi 2 run open_quote2.yaml --no-checkpoint
e2e_case "(l) control characters in a name"
printf 'name: "bad\\nname"\n' >ctl.yaml
grep -v '^name:' "$SMALL" >>ctl.yaml
expect_exit 2 "^shardsim: error: (.*/)?ctl\\.yaml:1: name: contains a control character U\\+000A" -- \
  shardsim_mpi 2 run ctl.yaml --no-checkpoint

# Sizes and plans of the model: and parallel: sections (one parser for run and train): a value out of its documented
# bound, or a product of sizes that would wrap int64, is exit 2 at parse naming FILE:LINE and the key; an unknown
# collective algorithm too, listing the known ones (they were found at run time, or wrapped to negative counts).
e2e_case "(sizes) bounds and products of sizes, unknown algorithm: FILE:LINE and the key, before anything runs"
LM="$CONFIGS/lm_train.yaml"
size_case() {  # NAME SED_EXPR REGEX [RANKS]
  sed -E "$2" "$LM" >"$1.yaml"
  if expect_exit 2 "^shardsim: error: (.*/)?$1\\.yaml:[0-9]+: $3" -- shardsim_mpi "${4:-1}" train "$1.yaml"; then
    one_error_line
  fi
}
size_case ffn2e17 's/^(  ffn:).*/\1 200000000000000000/' 'model\.ffn: must be between 1 and 4194304'
size_case hidden1e9 's/^(  hidden:).*/\1 1000000000/' 'model\.hidden: must be between 1 and 1048576'
size_case vocab9e18 's/^(  vocab:).*/\1 9000000000000000000/; s/^(  hidden:).*/\1 9000000000000000000/' \
  'model\.vocab: must be between 1 and 16777216'
size_case seq1e12 's/^(  seq:).*/\1 1000000000000/; s/^(  batch:).*/\1 1000000000000/' 'model\.seq: must be between'
size_case batch1e8 's/^(  batch:).*/\1 100000000/' 'model\.batch: must be between 1 and 16777216'
size_case seq1e8 's/^(  seq:).*/\1 100000000/' 'model\.seq: must be between 1 and 16777216'
size_case tokens 's/^(  seq:).*/\1 16777216/; s/^(  batch:).*/\1 16777216/' \
  'model\.batch x seq \(tokens per step\) = 16777216 x 16777216 = 281474976710656 is above the limit 4294967296'
size_case layers 's/^(  layers:).*/\1 4096/; s/^(  hidden:).*/\1 262144/; s/^(  ffn:).*/\1 1048576/' \
  'model\.layers x parameters per layer'
size_case algo 's/^(train:)$/parallel:\n  algorithm: bogus\n\1/' \
  "parallel\\.algorithm: unknown algorithm 'bogus' \\(known: .*ring.*\\)" 2

# Host memory running out (a 2 GiB buffer under a 3 GB address-space limit): one line naming the chip and the
# cause, exit 3 (was a raw "internal error on chip 1: std::bad_alloc" plus a peer's "terminated by SIGTERM").
lowmem_mpi() { (ulimit -v 3000000 && shardsim_mpi "$@"); }
if expect_exit 3 '^shardsim: error on chip [01]: out of host memory' -- lowmem_mpi 2 bench all_reduce -b 2G -e 2G \
  -n 1 -w 0; then
  n=$(grep -c '^shardsim' "$E2E_STDERR")
  [ "$n" -eq 1 ] && pass "one shardsim line" || fail "$n shardsim lines: $(cat "$E2E_STDERR")"
fi

# The same in a singleton (one process, as `shardsim ...` or `mpirun -np 1 ...` is run): the one line and nothing
# else (MPI_Abort added Open MPI's MPI_ABORT banner or an ORTE_ERROR_LOG line under it).
if E2E_MPIRUN_NP1= expect_exit 3 '^shardsim: error on chip 0: out of host memory' -- \
    lowmem_mpi 1 bench all_reduce -b 2G -e 2G -n 1 -w 0; then
  n=$(grep -c . "$E2E_STDERR")
  [ "$n" -eq 1 ] && pass "stderr is the one line" || fail "$n lines on stderr: $(head -c 600 "$E2E_STDERR")"
fi

# run --shape-only keeps per-token bookkeeping on every chip: the 2^24-token MLP on 1,024 chips of one rank (~400 GB)
# is refused before any chip starts, exit 3 naming the estimate (ulimit -v: a safety net should the host be larger).
if expect_exit 3 '^shardsim: error: .*small_mlp\.yaml \(with command-line overrides\): model: needs about [0-9.e+]+ GiB of host memory for the shape-only step.s bookkeeping \([0-9.e+]+ tokens per chip: 8 bytes each on the 1024 chip\(s\) of this host.*\), but only [0-9.]+ GiB is available' \
    -- lowmem_mpi 1 --chips 1024 run "$SMALL" --shape-only --no-checkpoint --ring 1024 --plan tp=4,dp=256 \
    --set model.tokens=16777216; then
  n=$(grep -c '^shardsim' "$E2E_STDERR")
  [ "$n" -eq 1 ] && pass "one shardsim line" || fail "$n shardsim lines: $(cat "$E2E_STDERR")"
fi

# Host memory planned before chips start (issue 31 item 4): 1,024 chips on one rank under a 1 GiB address-space
# limit (their stacks alone reserve 1 GiB) are refused up front with one line naming the estimate, the limit and
# the chips-per-rank maximum, exit 3 (was an uncaught std::bad_alloc, SIGABRT and a backtrace).
lowmem_one() { (ulimit -v 1048576 && shardsim_mpi 1 "$@"); }
if expect_exit 3 '^shardsim: error: host memory: 1024 chips on this rank need about .* GiB of address space.*limit \(ulimit -v\) is 1\.00 GiB \(at most [0-9]+ chips per rank' \
  -- lowmem_one --chips 1024 bench all_reduce -b 8 -e 8 -n 1 -w 0; then
  n=$(grep -c '^shardsim' "$E2E_STDERR")
  [ "$n" -eq 1 ] && pass "one shardsim line" || fail "$n shardsim lines: $(cat "$E2E_STDERR")"
fi

e2e_finish
