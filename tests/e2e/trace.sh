#!/usr/bin/env bash
# e2e: `shardsim run --trace FILE` writes a Chrome trace-event JSON that a viewer can load and that agrees with
# the run's --json report. Checked (python3, stdlib json only) on the small MLP at 4 chips and on the default job
# (Llama-2-7B MLP, tp=8) at 8 chips:
#   - the file is valid JSON in the Object Format ({"traceEvents": [...], "displayTimeUnit": "ms"|"ns"});
#   - one process per chip: exactly N pids with process_name "chip 0".."chip N-1" (+ process_sort_index), and
#     (dependency recording, which --trace turns on) one more, "critical path", whose slices have cat
#     "critical_path";
#     every (pid, tid) with events has thread_name and thread_sort_index; no tid is used by two pids;
#   - every chip has X events on its "compute" track and on at least one "link->..." port track;
#   - every X event has name, cat, ts >= 0, dur >= 0 and args.bytes; compute events have args.flops > 0; send
#     events have args.peer, a chip in range other than their own; collective regions sit on "collectives*";
#     receives (cat "recv") sit on "receives*" and have args.peer, another chip;
#   - spans on one (pid, tid) track never overlap (1e-6 us slack);
#   - per chip, the latest span end equals the report's simulated total (simulated.per_chip[].simulated.total_ns,
#     within the trace's 1 ps rounding), the send bytes add up to its bytes_sent and the compute FLOPs to its flops.
# The checker is also run on deliberately broken copies of the trace (overlapping spans, a send to itself, a
# compute span without FLOPs, a missing process_name, an end time off by 1 us, a truncated file): each must fail.
# Usage: trace.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
# Knobs: E2E_TRACE_DEFAULT=0 skips the 8-chip default job (about 16 s wall on 2 cores).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"

if ! command -v python3 >/dev/null 2>&1; then
  echo "[$E2E_NAME] SKIP: python3 not found (the trace checks need it)"
  exit 77
fi

cat >check_trace.py <<'EOF'
import json, math, re, sys

def main():
    trace_path, report_path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mutate = sys.argv[4] if len(sys.argv) > 4 else ""
    errors = []
    def err(msg):
        errors.append(msg)

    try:
        with open(trace_path) as f:
            doc = json.load(f)
    except ValueError as e:
        sys.exit(f"trace {trace_path} is not valid JSON: {e}")
    with open(report_path) as f:
        report = json.load(f)

    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        sys.exit("trace is not a JSON object with a traceEvents array")
    if doc.get("displayTimeUnit") not in ("ms", "ns"):
        err(f"displayTimeUnit is {doc.get('displayTimeUnit')!r}, the format allows 'ms' or 'ns'")
    events = doc["traceEvents"]
    if mutate:
        apply_mutation(mutate, events)

    # ---- metadata: processes and tracks ----
    chip_of = {}        # pid -> chip
    path_pid = None     # the critical path's process
    proc_sort = set()
    thread_name = {}    # (pid, tid) -> name
    thread_sort = set()
    pid_of_tid = {}
    for e in events:
        if not isinstance(e, dict) or not isinstance(e.get("ph"), str) or not isinstance(e.get("pid"), int):
            err(f"event without a string ph and an integer pid: {e}")
            continue
        if "tid" in e:
            if not isinstance(e["tid"], int):
                err(f"non-integer tid: {e}")
                continue
            if pid_of_tid.setdefault(e["tid"], e["pid"]) != e["pid"]:
                err(f"tid {e['tid']} is used by pids {pid_of_tid[e['tid']]} and {e['pid']} (Perfetto keys threads by tid)")
        if e["ph"] != "M":
            continue
        name, args = e.get("name"), e.get("args", {})
        if name == "process_name":
            m = re.fullmatch(r"chip (\d+)", str(args.get("name")))
            if args.get("name") == "critical path" and path_pid is None:
                path_pid = e["pid"]
            elif not m:
                err(f"process_name {args.get('name')!r} is not 'chip N'")
            else:
                chip_of[e["pid"]] = int(m.group(1))
        elif name == "process_sort_index":
            proc_sort.add(e["pid"])
        elif name == "thread_name":
            thread_name[(e["pid"], e.get("tid"))] = str(args.get("name"))
        elif name == "thread_sort_index":
            thread_sort.add((e["pid"], e.get("tid")))
    if sorted(chip_of.values()) != list(range(n)):
        err(f"expected one process per chip 0..{n - 1}, process_name gives chips {sorted(chip_of.values())}")
    if len(set(chip_of)) != len(chip_of.values()) or len(chip_of) != n:
        err(f"expected {n} pids with process_name, got {len(chip_of)}")
    for pid in chip_of:
        if pid not in proc_sort:
            err(f"pid {pid} has no process_sort_index")

    # ---- spans ----
    spans = {}          # (pid, tid) -> [(start, end, name)]
    per_chip = {c: {"compute": 0, "link": 0, "end": None, "bytes_sent": 0.0, "flops": 0.0} for c in range(n)}
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        pid, tid = e.get("pid"), e.get("tid")
        where = f"X event {e.get('name')!r} (pid {pid}, tid {tid})"
        if pid == path_pid and path_pid is not None:
            if e.get("cat") != "critical_path":
                err(f"{where}: cat {e.get('cat')!r} on the critical path's process")
            spans.setdefault((pid, tid), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
            continue
        if pid not in chip_of:
            err(f"{where}: its pid has no process_name")
            continue
        chip = chip_of[pid]
        track = thread_name.get((pid, tid))
        if track is None:
            err(f"{where}: its track has no thread_name")
            continue
        if (pid, tid) not in thread_sort:
            err(f"{where}: its track has no thread_sort_index")
        if not isinstance(e.get("name"), str) or not e["name"]:
            err(f"{where}: no name")
        ts, dur, args, cat = e.get("ts"), e.get("dur"), e.get("args"), e.get("cat")
        if not is_num(ts) or ts < 0:
            err(f"{where}: ts {ts!r} is not a number >= 0")
            continue
        if not is_num(dur) or dur < 0:
            err(f"{where}: dur {dur!r} is not a number >= 0")
            continue
        if not isinstance(args, dict) or not is_num(args.get("bytes")) or args["bytes"] < 0:
            err(f"{where}: no args.bytes >= 0 (args {args!r})")
            continue
        if cat == "compute":
            if track != "compute":
                err(f"{where}: compute event on track {track!r}")
            if not is_num(args.get("flops")) or args["flops"] <= 0:
                err(f"{where}: compute event without args.flops > 0 (args {args})")
            else:
                per_chip[chip]["flops"] += args["flops"]
            per_chip[chip]["compute"] += 1
        elif cat == "send":
            if not track.startswith("link->"):
                err(f"{where}: send on track {track!r}, not a link port")
            peer = args.get("peer")
            if not isinstance(peer, int) or not 0 <= peer < n or peer == chip:
                err(f"{where}: send from chip {chip} has args.peer {peer!r} (want another chip in 0..{n - 1})")
            per_chip[chip]["link"] += 1
            per_chip[chip]["bytes_sent"] += args["bytes"]
        elif cat == "collective":
            if not track.startswith("collectives"):
                err(f"{where}: collective region on track {track!r}")
        elif cat == "recv":
            if not track.startswith("receives"):
                err(f"{where}: receive on track {track!r}")
            peer = args.get("peer")
            if not isinstance(peer, int) or not 0 <= peer < n or peer == chip:
                err(f"{where}: receive on chip {chip} has args.peer {peer!r} (want another chip in 0..{n - 1})")
        else:
            err(f"{where}: unknown cat {cat!r}")
        spans.setdefault((pid, tid), []).append((ts, ts + dur, e["name"]))
        if cat == "recv":
            continue  # an arrival is never later than the op that uses it, but is not an end of the chip's work
        end = per_chip[chip]["end"]
        per_chip[chip]["end"] = ts + dur if end is None else max(end, ts + dur)

    for (pid, tid), v in spans.items():
        v.sort()
        for a, b in zip(v, v[1:]):
            if a[1] > b[0] + 1e-6:
                err(f"chip {chip_of.get(pid, 'critical path')} track {thread_name.get((pid, tid))!r}: {a[2]!r} [{a[0]}, {a[1]}] overlaps "
                    f"{b[2]!r} [{b[0]}, {b[1]}] us")

    # ---- against the report ----
    rep_chips = {c["chip"]: c["simulated"] for c in report["simulated"]["per_chip"]}
    if sorted(rep_chips) != list(range(n)):
        err(f"report has per_chip entries for chips {sorted(rep_chips)}")
    for c in range(n):
        pc = per_chip[c]
        if pc["compute"] == 0:
            err(f"chip {c}: no X events on its compute track")
        if pc["link"] == 0:
            err(f"chip {c}: no X events on any link-port track")
        if c not in rep_chips:
            continue
        sim = rep_chips[c]
        want = sim["total_ns"] / 1e3
        if pc["end"] is None or abs(pc["end"] - want) > 1e-6 + 1e-12 * want:
            err(f"chip {c}: latest span end {pc['end']} us, report's simulated total {want} us")
        if not close(pc["bytes_sent"], sim["bytes_sent"]):
            err(f"chip {c}: sends carry {pc['bytes_sent']} bytes, report's bytes_sent {sim['bytes_sent']}")
        if not close(pc["flops"], sim["flops"]):
            err(f"chip {c}: compute spans carry {pc['flops']} FLOPs, report's flops {sim['flops']}")
    total = report["simulated"]["breakdown"]["total_ns"] / 1e3
    latest = max((pc["end"] or 0) for pc in per_chip.values())
    if abs(latest - total) > 1e-6 + 1e-12 * total:
        err(f"latest span end over all chips {latest} us, report's critical-chip total {total} us")

    if errors:
        for m in errors[:20]:
            print("  " + m)
        if len(errors) > 20:
            print(f"  ... and {len(errors) - 20} more")
        sys.exit(1)
    xs = sum(len(v) for v in spans.values())
    print(f"{xs} spans on {len(spans)} tracks of {n} chips; latest end {latest} us = report total {total} us")

def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

def close(a, b):
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1.0)

def first_x(events, cat, pid=None):
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == cat and (pid is None or e.get("pid") == pid):
            return e
    raise SystemExit(f"test bug: no {cat} event to mutate")

def apply_mutation(kind, events):
    if kind == "overlap":  # the second compute span of a chip starts inside the first
        a = first_x(events, "compute")
        b = next(e for e in events if e.get("ph") == "X" and e is not a and e.get("pid") == a["pid"]
                 and e.get("tid") == a["tid"] and e["ts"] >= a["ts"] + a["dur"])
        b["ts"] = a["ts"] + a["dur"] / 2
    elif kind == "peer_self":
        s = first_x(events, "send")
        names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
        s["args"]["peer"] = int(names[s["pid"]].split()[1])  # "chip N": the sender's own chip
    elif kind == "no_flops":
        del first_x(events, "compute")["args"]["flops"]
    elif kind == "no_process_name":
        i = next(i for i, e in enumerate(events) if e.get("ph") == "M" and e.get("name") == "process_name")
        del events[i]
    elif kind == "late_end":  # the last span of some chip ends 1 us late
        last = max((e for e in events if e.get("ph") == "X" and e.get("cat") in ("compute", "send", "collective")),
                   key=lambda e: e["ts"] + e["dur"])
        last["dur"] += 1.0
    else:
        raise SystemExit(f"test bug: unknown mutation {kind}")

main()
EOF

# check_trace TRACE REPORT N: the checks above pass.
check_trace() {
  local out
  if out=$(python3 check_trace.py "$1" "$2" "$3" 2>&1); then
    pass "trace $1 is valid and consistent with $2: $out"
  else
    fail "trace $1 (report $2, $3 chips):"$'\n'"$out"
  fi
}

# check_rejects TRACE REPORT N: the checker must fail on each broken copy of TRACE.
check_rejects() {
  local kind out
  for kind in overlap peer_self no_flops no_process_name late_end; do
    if out=$(python3 check_trace.py "$1" "$2" "$3" "$kind" 2>&1); then
      fail "the checker accepted a broken trace ($kind): $out"
    else
      pass "the checker rejects a broken trace ($kind): $(echo "$out" | head -n 1 | sed 's/^ *//')"
    fi
  done
  head -c "$(($(wc -c <"$1") / 2))" "$1" >truncated.json
  if out=$(python3 check_trace.py truncated.json "$2" "$3" 2>&1); then
    fail "the checker accepted a truncated trace"
  else
    pass "the checker rejects a truncated trace: $out"
  fi
}

# run_traced N CONFIG NAME: runs CONFIG on N chips with --trace NAME.json --json NAME.report.json, then checks.
run_traced() {
  local n=$1 cfg=$2 name=$3
  rm -f "$name.json" "$name.report.json"
  expect_exit 0 'validation PASS' -- \
    shardsim_mpi "$n" run "$cfg" --no-checkpoint --trace "$name.json" --json "$name.report.json" || return 1
  assert_stdout_last_line PASS
  assert_out "^trace +$name\.json " "report names the trace file"
  check_json "$name.report.json" verdict='"PASS"' chips="$n" trace="\"$name.json\""
  if [ ! -s "$name.json" ]; then
    fail "no trace written at $name.json"
    return 1
  fi
  check_trace "$name.json" "$name.report.json" "$n"
}

e2e_case "small MLP, 4 chips (tp 4: the default plan, dp, has no link traffic)"
with_chips "$SMALL" 4 small4.yaml
printf 'parallel:\n  tp: 4\n' >>small4.yaml
if run_traced 4 small4.yaml small4; then
  e2e_case "checker self-test on broken copies of the 4-chip trace"
  check_rejects small4.json small4.report.json 4
fi

if [ "${E2E_TRACE_DEFAULT:-1}" != 0 ]; then
  e2e_case "default job (Llama-2-7B MLP, tp=8), 8 chips"
  # About 16 s wall on a 2-core host (most of it the single-device reference); allow for a loaded machine.
  E2E_TIMEOUT=$((E2E_TIMEOUT > 180 ? E2E_TIMEOUT : 180))
  run_traced 8 "$CONFIGS/workloads/llama2_7b_mlp_tp8.yaml" default8
else
  echo "[$E2E_NAME] default job skipped (E2E_TRACE_DEFAULT=0)"
fi

e2e_finish
