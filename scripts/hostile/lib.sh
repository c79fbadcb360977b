# Shared by the hostile scripts (rerun.sh, surfaces.sh): the binary and configs, a scratch folder, and the case
# helpers. A script sources it with its own arguments ("$@"), then calls `kind K` before each group of cases,
# `hc WANT REGEX -- CMD...` / `ok COND TEXT` for each case, and `hostile_summary` at the end (exit 1 on a failure).
set -u
BIN=$(realpath -e "${1:-build/apps/shardsim}") || { echo "no shardsim binary" >&2; exit 2; }
CONFIGS=$(realpath -e "${2:-configs}") || { echo "no configs folder" >&2; exit 2; }
source "$(dirname "${BASH_SOURCE[0]}")/../mpi_env.sh"
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/shardsim-hostile.XXXXXX")
trap 'cd /; rm -rf -- "$WORK"' EXIT
cd "$WORK" || exit 2
LIMIT=${HOSTILE_TIMEOUT:-120}
declare -A TRIED FAILED
KIND=""
ONLY=${HOSTILE_ONLY:-}
LAST_OUT=$WORK/last.out

kind() { KIND=$1; }
skip_kind() { [ -n "$ONLY" ] && [ "$ONLY" != "$KIND" ]; }

# hc WANT REGEX -- CMD...: WANT is an exit code; REGEX must match the combined output. An exit 2 must print
# exactly one `shardsim: error` line; no output may hold a raw ESC or BEL; /dev/stdout must stay a symlink.
hc() {
  skip_kind && return 0
  local want=$1 regex=$2
  shift 3
  TRIED[$KIND]=$((${TRIED[$KIND]:-0} + 1))
  timeout -k 5 "$LIMIT" "$@" >"$LAST_OUT" 2>&1 </dev/null
  local rc=$? why=""
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then why="hung (killed after ${LIMIT}s)"
  elif [ "$rc" != "$want" ]; then why="exit $rc, wanted $want"
  elif ! grep -Eq -- "$regex" "$LAST_OUT"; then why="output does not match /$regex/"
  elif [ "$want" = 2 ] && [ "$(grep -c 'shardsim: error' "$LAST_OUT")" != 1 ]; then
    why="$(grep -c 'shardsim: error' "$LAST_OUT") error lines, wanted one"
  elif grep -q $'[\x1b\x07]' "$LAST_OUT"; then why="a raw control byte in the output"
  elif [ ! -L /dev/stdout ]; then why="/dev/stdout is no longer a symlink"
  fi
  if [ -n "$why" ]; then
    FAILED[$KIND]=$((${FAILED[$KIND]:-0} + 1))
    echo "FAIL [kind $KIND] $why: $*"
    # a crash (a signal's exit code) shows its whole backtrace, anything else its last lines
    sed 's/^/    | /' "$LAST_OUT" | tail -n "$([ "$rc" -gt 128 ] && echo 60 || echo 4)"
  fi
}
# ok COND TEXT: a check of a file after a case (counted as a case of the current kind).
ok() {
  skip_kind && return 0
  TRIED[$KIND]=$((${TRIED[$KIND]:-0} + 1))
  if ! eval "$1"; then
    FAILED[$KIND]=$((${FAILED[$KIND]:-0} + 1))
    echo "FAIL [kind $KIND] $2 ($1)"
  fi
}


# The table of cases tried and failed per kind; returns 1 when any case failed.
hostile_summary() {
  echo
  printf '%-6s %6s %6s\n' kind cases fails
  local total=0 bad=0 k
  for k in "${!TRIED[@]}"; do echo "$k"; done | sort -n | while read -r k; do
    printf '%-6s %6d %6d\n' "$k" "${TRIED[$k]}" "${FAILED[$k]:-0}"
  done
  for k in "${!TRIED[@]}"; do total=$((total + TRIED[$k])); bad=$((bad + ${FAILED[$k]:-0})); done
  printf '%-6s %6d %6d\n' all "$total" "$bad"
  [ "$bad" = 0 ]
}
