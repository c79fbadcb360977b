# Shared helpers for the shardsim end-to-end tests. Source it, then call e2e_init "$@".
#
# Every test script takes:  SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
# (tests/e2e/CMakeLists.txt passes $<TARGET_FILE:shardsim>, ${PROJECT_SOURCE_DIR}/configs, ${MPIEXEC_EXECUTABLE}).
# Run by hand, e.g.:
#   OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
#     bash tests/e2e/run_chips.sh build/apps/shardsim configs mpirun
#
# Environment knobs:
#   E2E_TIMEOUT  seconds before one mpirun is considered hung on an idle host (default 60; scaled by the load
#                average per core, up to x4: e2e_timeout)
#   E2E_KEEP=1   keep the scratch directory (its path is printed) instead of deleting it
#
# Assertions never stop the script: each failure is printed (with the command and its output) and counted,
# and e2e_finish exits 1 if any failed, so one run shows every broken case.

set -u
# One host: shared memory only, no TCP listeners on the ranks (unless the caller set these variables).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/mpi_env.sh"

E2E_NAME=$(basename "$0" .sh)
E2E_FAILS=0
E2E_CHECKS=0
E2E_NCMD=0
E2E_CASE=""
E2E_TIMEOUT=${E2E_TIMEOUT:-60}
E2E_TMP=""
E2E_START=$SECONDS
# Filled by expect_exit: the last command's exit code and its captured output.
E2E_RC=""
E2E_STDOUT=""
E2E_STDERR=""
E2E_OUT=""  # stdout followed by stderr

# ---- reporting ----

e2e_case() {  # NAME: label for the messages that follow
  E2E_CASE=$1
  echo "--- [$E2E_NAME] $E2E_CASE"
}

_e2e_where() { echo "[$E2E_NAME${E2E_CASE:+ / $E2E_CASE}]"; }

pass() {
  E2E_CHECKS=$((E2E_CHECKS + 1))
  echo "ok   $(_e2e_where) $*"
}

fail() {
  E2E_CHECKS=$((E2E_CHECKS + 1))
  E2E_FAILS=$((E2E_FAILS + 1))
  echo "FAIL $(_e2e_where) $*" >&2
  return 1
}

# Show the last command's output (indented, capped) after a failure.
show_output() {
  local f
  for f in "$E2E_STDOUT" "$E2E_STDERR"; do
    if [ -z "$f" ] || [ ! -f "$f" ]; then continue; fi
    echo "     ---- $(basename "$f") (last 40 lines) ----" >&2
    tail -n 40 "$f" | sed 's/^/     | /' >&2
  done
}

e2e_finish() {
  local secs=$((SECONDS - E2E_START))
  if [ "$E2E_FAILS" -ne 0 ]; then
    echo "=== [$E2E_NAME] FAILED: $E2E_FAILS of $E2E_CHECKS checks failed (${secs}s)" >&2
    exit 1
  fi
  echo "=== [$E2E_NAME] all $E2E_CHECKS checks passed (${secs}s)"
  exit 0
}

# ---- setup ----

_e2e_cleanup() {
  cd / || true
  if [ -n "$E2E_TMP" ] && [ -d "$E2E_TMP" ]; then
    if [ "${E2E_KEEP:-0}" = 1 ]; then
      echo "[$E2E_NAME] kept scratch directory $E2E_TMP"
    else
      rm -rf -- "$E2E_TMP"
    fi
  fi
}

# e2e_init SHARDSIM CONFIG_DIR [MPIEXEC]: checks the arguments, makes and enters a scratch directory.
# Sets SHARDSIM, CONFIGS, SMALL (the small MLP config), MPIEXEC, MPI_FLAGS, E2E_TMP.
e2e_init() {
  if [ $# -lt 2 ] || [ $# -gt 3 ]; then
    echo "usage: $0 SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]" >&2
    exit 2
  fi
  SHARDSIM=$(realpath -e -- "$1" 2>/dev/null) || { echo "$0: no shardsim binary at '$1'" >&2; exit 2; }
  [ -x "$SHARDSIM" ] || { echo "$0: '$SHARDSIM' is not executable" >&2; exit 2; }
  CONFIGS=$(realpath -e -- "$2" 2>/dev/null) || { echo "$0: no config directory at '$2'" >&2; exit 2; }
  SMALL=$CONFIGS/workloads/small_mlp.yaml
  [ -r "$SMALL" ] || { echo "$0: cannot read $SMALL" >&2; exit 2; }
  MPIEXEC=${3:-mpirun}
  command -v "$MPIEXEC" >/dev/null 2>&1 || { echo "$0: MPI launcher '$MPIEXEC' not found" >&2; exit 2; }
  command -v timeout >/dev/null 2>&1 || { echo "$0: coreutils 'timeout' not found" >&2; exit 2; }
  # Up to 8 ranks on a small machine: Open MPI refuses to oversubscribe unless told to; MPICH does not need it.
  # (Open MPI 4's mpiexec/orterun calls itself "OpenRTE" in --version, its mpirun "Open MPI".)
  MPI_FLAGS=()
  if "$MPIEXEC" --version 2>&1 | grep -Eqi 'open ?mpi|openrte|open-mpi'; then MPI_FLAGS+=(--oversubscribe); fi

  E2E_TMP=$(mktemp -d "${TMPDIR:-/tmp}/shardsim-e2e-$E2E_NAME.XXXXXX") || { echo "$0: mktemp failed" >&2; exit 2; }
  trap _e2e_cleanup EXIT
  trap 'echo "[$E2E_NAME] interrupted" >&2; exit 130' INT TERM
  cd "$E2E_TMP" || exit 2
  echo "=== [$E2E_NAME] shardsim=$SHARDSIM configs=$CONFIGS mpiexec=$MPIEXEC scratch=$E2E_TMP"
}

# ---- running ----

# shardsim_mpi NP ARGS...: runs shardsim on NP ranks, killed after E2E_TIMEOUT seconds (exit 124, or 137 if it
# ignored SIGTERM for 10 more seconds). timeout signals its whole process group, so the ranks go too.
# NP = 1 runs the binary as an MPI singleton (no launcher): the same program and output, and it spares Open MPI's
# ~2 s teardown after every non-zero exit under mpirun (odls_base_sigkill_timeout), which most expect_exit 2 cases
# would pay. Scripts that test the launcher's own behaviour at one rank (signals, aborts, MPI noise) set
# E2E_MPIRUN_NP1=1 before calling it.
# The timeout is scaled by the host's load: E2E_TIMEOUT x (1-minute load average / cores), at least x1 and at most
# x4, so a run that takes 50 s on an idle machine is not called hung while other jobs keep every core busy (a
# test must not depend on host speed; a real hang still ends).
e2e_timeout() {
  local cores load
  cores=$(nproc 2>/dev/null || echo 1)
  load=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)
  awk -v t="$E2E_TIMEOUT" -v l="$load" -v c="$cores" 'BEGIN { f = l / c; if (f < 1) f = 1; if (f > 4) f = 4; printf "%d\n", t * f }'
}
shardsim_mpi() {
  local np=$1 limit
  shift
  limit=$(e2e_timeout)
  if [ "$np" = 1 ] && [ -z "${E2E_MPIRUN_NP1:-}" ]; then
    timeout -k 10 "$limit" "$SHARDSIM" "$@"
    return
  fi
  timeout -k 10 "$limit" "$MPIEXEC" ${MPI_FLAGS[@]+"${MPI_FLAGS[@]}"} -np "$np" "$SHARDSIM" "$@"
}

# expect_exit CODE REGEX -- CMD...: runs CMD, checks its exit code is CODE and that its combined
# stdout+stderr matches the extended regex REGEX. A timeout (124/137) is always a failure.
# Returns 0 if both hold; the output stays in E2E_STDOUT / E2E_STDERR / E2E_OUT for further checks.
expect_exit() {
  if [ $# -lt 4 ] || [ "$3" != "--" ]; then
    fail "test bug: usage is expect_exit CODE REGEX -- CMD..."
    return 1
  fi
  local want=$1 regex=$2
  shift 3
  E2E_NCMD=$((E2E_NCMD + 1))
  E2E_STDOUT=$E2E_TMP/cmd$E2E_NCMD.stdout
  E2E_STDERR=$E2E_TMP/cmd$E2E_NCMD.stderr
  E2E_OUT=$E2E_TMP/cmd$E2E_NCMD.out
  local t0=$SECONDS
  "$@" >"$E2E_STDOUT" 2>"$E2E_STDERR"
  E2E_RC=$?
  cat "$E2E_STDOUT" "$E2E_STDERR" >"$E2E_OUT"
  local cmd="\`$*\` (${E2E_RC}, $((SECONDS - t0))s)"
  if [ "$E2E_RC" -eq 124 ] || [ "$E2E_RC" -eq 137 ]; then
    fail "HUNG: killed after ${E2E_TIMEOUT}s timeout (exit $E2E_RC): $*"
    show_output
    return 1
  fi
  if [ "$E2E_RC" -ne "$want" ]; then
    fail "expected exit code $want, got $E2E_RC: $*"
    show_output
    return 1
  fi
  if ! grep -Eq -- "$regex" "$E2E_OUT"; then
    fail "exit code $want as expected, but the output does not match /$regex/: $*"
    show_output
    return 1
  fi
  pass "exit $want and output matches /$regex/: $cmd"
}

# ---- assertions on the last command's output ----

assert_out() {  # REGEX [WHAT]: combined output matches the extended regex
  if grep -Eq -- "$1" "$E2E_OUT"; then pass "${2:-output matches /$1/}"; else
    fail "${2:-output} : no line matches /$1/"
    show_output
  fi
}

assert_out_fixed() {  # STRING [WHAT]: combined output contains STRING literally
  # shellcheck disable=SC2016  # the quotes in the message are literal
  if grep -Fq -- "$1" "$E2E_OUT"; then pass "${2:-output contains '$1'}"; else
    fail "${2:-output} : does not contain '$1'"
    show_output
  fi
}

assert_out_count() {  # REGEX N [WHAT]: exactly N lines of the combined output match REGEX
  local n
  n=$(grep -Ec -- "$1" "$E2E_OUT")
  if [ "$n" -eq "$2" ]; then pass "${3:-exactly $2 line(s) match /$1/}"; else
    fail "${3:-output}: expected exactly $2 line(s) matching /$1/, found $n"
    show_output
  fi
}

assert_stdout_last_line() {  # TEXT: the last line of stdout is exactly TEXT
  local last
  last=$(tail -n 1 "$E2E_STDOUT")
  if [ "$last" = "$1" ]; then pass "report ends with '$1'"; else
    fail "expected the report's last line to be '$1', got '$last'"
    show_output
  fi
}

# The checkpoint path the last report names on its "checkpoint PATH" line (empty if none).
report_checkpoint() {  # the path of run's "checkpoint: step K saved to PATH" line
  sed -n 's/^checkpoint: step [0-9]* saved to \(.*\)$/\1/p' "$E2E_STDOUT" | tail -n 1
}

# check WHAT CMD...: CMD must exit 0.
check() {
  local what=$1
  shift
  if "$@" >/dev/null 2>&1; then pass "$what"; else fail "$what: \`$*\` exited $?"; fi
}

# ---- python3 with h5py ----

# h5py_python: prints a python3 that imports h5py and numpy (Debian's python3-h5py lives in /usr/bin/python3 even
# when another python3 is first on PATH); returns 1 and prints nothing when there is none.
h5py_python() {
  local p
  for p in /usr/bin/python3 python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import h5py, numpy' >/dev/null 2>&1; then echo "$p"; return 0; fi
  done
  return 1
}

# ---- config editing ----

# with_chips SRC N DST: copy of SRC with topology.chips set to N (checks the edit took).
with_chips() {
  sed -E "s/^([[:space:]]+chips:)[[:space:]]*[0-9]+[[:space:]]*$/\1 $2/" "$1" >"$3"
  grep -Eq "^[[:space:]]+chips: $2$" "$3" || fail "test bug: could not set chips: $2 in a copy of $1"
}

# with_dtype SRC DTYPE DST: copy of SRC with workload.dtype set to DTYPE.
with_dtype() {
  sed -E "s/^([[:space:]]+dtype:)[[:space:]]*[a-z0-9]+[[:space:]]*$/\1 $2/" "$1" >"$3"
  grep -Eq "^[[:space:]]+dtype: $2$" "$3" || fail "test bug: could not set dtype: $2 in a copy of $1"
}

# ---- HDF5 ----

# h5_shape FILE DATASET: prints the dataspace of DATASET, e.g. "( 64, 200 )", from `h5dump -H`.
h5_shape() {
  h5dump -H "$1" 2>/dev/null | awk -v ds="DATASET \"$2\"" '
    index($0, ds) { f = 1 }
    f && /DATASPACE/ { sub(/.*SIMPLE \{ */, ""); sub(/ *\/.*/, ""); print; exit }'
}

# check_json FILE KEY=VALUE...: FILE is valid JSON and each dotted KEY equals VALUE (compared as JSON text,
# e.g. verdict='"PASS"' chips=4 validation.passed=true). Without python3, falls back to grep.
check_json() {
  local file=$1
  shift
  if [ ! -s "$file" ]; then fail "JSON report $file missing or empty"; return 1; fi
  if command -v python3 >/dev/null 2>&1; then
    local err
    if err=$(python3 - "$file" "$@" 2>&1 <<'EOF'
import json, sys
with open(sys.argv[1]) as f:
    try:
        doc = json.load(f)
    except ValueError as e:
        sys.exit(f"not valid JSON: {e}")
bad = []
for spec in sys.argv[2:]:
    key, want = spec.split("=", 1)
    node = doc
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            bad.append(f"{key}: missing")
            break
        node = node[part]
    else:
        if node != json.loads(want):
            bad.append(f"{key}: expected {want}, got {json.dumps(node)}")
if bad:
    sys.exit("; ".join(bad))
EOF
    ); then
      pass "JSON report $file is valid${*:+ and has $*}"
    else
      fail "JSON report $file: $err"
    fi
  else
    local spec key want ok=1
    for spec in "$@"; do
      key=${spec%%=*}
      key=${key##*.}
      want=${spec#*=}
      grep -Eq "\"$key\": *$want" "$file" || { ok=0; fail "JSON report $file: no \"$key\": $want (python3 not found, grep check)"; }
    done
    [ $ok = 1 ] && pass "JSON report $file has $* (grep check; python3 not found)"
  fi
}
