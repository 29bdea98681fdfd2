#!/usr/bin/env bash
# The shared-memory transport on the H200 host (issue 19): the harness floor and lstm_a over
# ZeroMQ ipc and over iceoryx2, side by side, in one run, inside a fixed time budget.
#
#   tools/bench_shm.sh [--dry-run] [OUTDIR]          # OUTDIR default: ${OUT:-gpu-out}/shm
#
# For each rate in $RATES (default 10000 100000) and each transport in $TRANSPORTS (default
# zmq iceoryx2), one `hft-infer bench -c configs/gpu.toml --transport T --rate R` of each run
# kind in $RUNS:
#   floor       --null-service (the harness floor: same sockets, framing, placement, no model)
#   persistent  lstm_a with runner.engine = "persistent"
#   auto        lstm_a with the config's engine (auto: the graph engine where CUDA works)
# in priority order (the issue's targets first: floor and persistent at 10k over both
# transports, then 100k, then the default engine); a run that cannot start with MIN_RUN_S left
# in BUDGET_S is skipped and listed, each run is wrapped in `timeout` (RUN_CAP_S), so the script
# ends within its budget and never hangs. tools/gpu_session.sh `land` calls it with the
# `step shm 50` timeout, where only the first runs fit: for the whole set give it a device
# call of its own, e.g. `BUDGET_S=500 bash tools/bench_shm.sh "$OUT/shm"`.
#
# Every log (OUTDIR/NAME.log, one per run) starts with the provenance block (commit, date,
# machine, GPU, versions with iceoryx2), then the command; each run's JSON is OUTDIR/NAME.json,
# its run directory OUTDIR/runs/NAME. At the end OUTDIR/summary.md (also on stdout) and
# OUTDIR/summary.json: tick_to_decision p50 / p99 / p99.9 / max and lost per run, zmq and
# iceoryx2 beside each other with their ratio, and the targets of issue 19 (iceoryx2: floor p99
# <= 40 µs at 10k; lstm_a persistent p99 <= 50 µs at 10k and <= 100 µs at 100k; lost 0) met,
# missed or not run.
#
# Exit status: 0 when every run that started succeeded (budget skips are listed, not failures);
# 1 when a run failed, timed out or lost an event; 2 on bad usage or a missing prerequisite.
#
# Knobs (environment): BUDGET_S=45, RATES="10000 100000", TRANSPORTS="zmq iceoryx2",
# RUNS="floor persistent auto", DURATION=2, WARMUP=0.5, INSTRUMENTS=64, RUN_CAP_S=60,
# MIN_RUN_S=8, PY=python3, CONFIG=configs/gpu.toml, EXTRA_SET (more --set K=V, space-separated),
# ORDER (run:transport:rate items; default below).
#
# The dev VM (2 cores, no GPU): `--dry-run` prints the plan; a tiny-rate self-test of the
# CPU-only parts (never two processes spinning):
#   RATES=300 RUNS="floor auto" DURATION=1 PY=.venv/bin/python \
#   EXTRA_SET='ingest.poll_mode="event" cpu.cores="none" runner.device="cpu"' tools/bench_shm.sh /tmp/bshm
set -u
dry=0
if [ "${1:-}" = --dry-run ]; then dry=1; shift; fi
if [ $# -gt 1 ]; then
  echo "usage: tools/bench_shm.sh [--dry-run] [OUTDIR]" >&2
  exit 2
fi
OUTDIR=${1:-${OUT:-gpu-out}/shm}
BUDGET_S=${BUDGET_S:-45}
RATES=${RATES:-10000 100000}
TRANSPORTS=${TRANSPORTS:-zmq iceoryx2}
RUNS=${RUNS:-floor persistent auto}
DURATION=${DURATION:-2}
WARMUP=${WARMUP:-0.5}
INSTRUMENTS=${INSTRUMENTS:-64}
RUN_CAP_S=${RUN_CAP_S:-60}
MIN_RUN_S=${MIN_RUN_S:-8}
PY=${PY:-python3}
CONFIG=${CONFIG:-configs/gpu.toml}
EXTRA_SET=${EXTRA_SET:-}
ORDER=${ORDER:-floor:iceoryx2:10000 floor:zmq:10000 persistent:iceoryx2:10000 persistent:zmq:10000 \
floor:iceoryx2:100000 floor:zmq:100000 persistent:iceoryx2:100000 persistent:zmq:100000 \
auto:iceoryx2:10000 auto:zmq:10000 auto:iceoryx2:100000 auto:zmq:100000}
START=$SECONDS

in_list() { case " $2 " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

order=()
for item in $ORDER; do
  IFS=: read -r run transport rate <<< "$item"
  in_list "$run" "$RUNS" && in_list "$transport" "$TRANSPORTS" && in_list "$rate" "$RATES" && order+=("$item")
done
# rates or runs named in the knobs but not in ORDER (a self-test's RATES=300) still run, after ORDER's
for run in $RUNS; do for rate in $RATES; do for transport in $TRANSPORTS; do
  in_list "$run:$transport:$rate" "${order[*]:-}" || order+=("$run:$transport:$rate")
done; done; done

extra=()
for kv in $EXTRA_SET; do extra+=(--set "$kv"); done

run_args() {  # the bench arguments of one run kind
  case $1 in
    floor) echo "--null-service" ;;
    persistent) echo '--set runner.engine="persistent"' ;;
    auto) ;;
    *) echo "bench_shm: unknown run kind $1 (floor, persistent, auto)" >&2; return 1 ;;
  esac
}

command_of() {  # run transport rate -> the bench command line (words)
  local a
  a=$(run_args "$1") || return 1
  # shellcheck disable=SC2086  # a is a list of words
  echo $PY -m hft_infer bench -c "$CONFIG" --transport "$2" $a ${extra[@]+"${extra[@]}"} --rate "$3" \
    --duration "$DURATION" --warmup "$WARMUP" --instruments "$INSTRUMENTS" --quiet \
    --run-dir "$OUTDIR/runs/$1-$2-$3" --json "$OUTDIR/$1-$2-$3.json"
}

if [ "$dry" = 1 ]; then
  echo "bench_shm: plan (BUDGET_S=$BUDGET_S, RUN_CAP_S=$RUN_CAP_S, MIN_RUN_S=$MIN_RUN_S), in order:"
  for item in "${order[@]}"; do
    IFS=: read -r run transport rate <<< "$item"
    echo "  $run-$transport-$rate: $(command_of "$run" "$transport" "$rate")" || exit 2
  done
  exit 0
fi

mkdir -p "$OUTDIR/runs" || { echo "bench_shm: cannot create $OUTDIR" >&2; exit 2; }
command -v timeout > /dev/null || { echo "bench_shm: needs coreutils timeout" >&2; exit 2; }
[ -f "$CONFIG" ] || { echo "bench_shm: no config $CONFIG (run from the repository root or set CONFIG)" >&2; exit 2; }
if in_list iceoryx2 "$TRANSPORTS" && ! $PY -c "import iceoryx2" 2> "$OUTDIR/import.err"; then
  echo "bench_shm: $PY cannot import iceoryx2: pip install 'hft-infer[shm]' (or TRANSPORTS=zmq):" >&2
  cat "$OUTDIR/import.err" >&2
  exit 2
fi
if ! $PY -c "import hft_infer.app.cli" 2>> "$OUTDIR/import.err"; then
  echo "bench_shm: $PY cannot import hft_infer (set PY=...):" >&2
  cat "$OUTDIR/import.err" >&2
  exit 2
fi

provenance() {  # the block every log starts with: tools/gpu_session.sh's when it called us, plus iceoryx2
  if [ -f "$OUTDIR/../provenance.txt" ]; then  # gpu_session.sh's $WORK/provenance.txt (we run in $WORK/shm)
    cat "$OUTDIR/../provenance.txt"
  else  # alone: the same facts from tools/benchlib.py's run_meta
    $PY - "$(cd "$(dirname "$0")" && pwd)" <<'EOF' 2>&1
import sys
sys.path.insert(0, sys.argv[1])
from benchlib import run_meta
m = run_meta([])
g, mc, v = m["git"], m["machine"], m["versions"]
print(f"commit: {g['commit'] or 'unknown (no .git here: pass HFT_COMMIT)'} (uncommitted changes: {g['dirty']})")
print(f"date: {m['date']}  host: {mc['host']}  kernel: {mc['kernel']}")
print(f"machine: nproc {mc['cpus_usable']} of {mc['cpus']}, {mc['cpu']}, load {mc['load_average']}")
print("versions: " + ", ".join(f"{k} {x}" for k, x in v.items()))
EOF
    echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader 2>/dev/null | head -1 | grep . || echo none)"
  fi
  echo "iceoryx2: $($PY -c 'from importlib import metadata; print(metadata.version("iceoryx2"))' 2>/dev/null || echo 'not installed')"
}
provenance > "$OUTDIR/provenance.txt"
cat "$OUTDIR/provenance.txt"
: > "$OUTDIR/runs.tsv"

failed=0
run_pid=
trap 'echo "bench_shm: terminated; stopping the run in progress" >&2; [ -n "$run_pid" ] && kill -TERM "$run_pid";
      wait; exit 143' TERM INT
for item in "${order[@]}"; do
  IFS=: read -r run transport rate <<< "$item"
  name="$run-$transport-$rate"
  left=$((BUDGET_S - (SECONDS - START)))
  if [ "$left" -lt "$MIN_RUN_S" ]; then
    echo "== $name: skipped: ${left}s of the ${BUDGET_S}s budget left (a run needs ${MIN_RUN_S}s)"
    printf '%s\t%s\t%s\tskipped-budget\t%ss left\n' "$run" "$transport" "$rate" "$left" >> "$OUTDIR/runs.tsv"
    continue
  fi
  limit=$((left - 2 < RUN_CAP_S ? left - 2 : RUN_CAP_S))  # 2 s for the summary, inside the budget
  cmd=$(command_of "$run" "$transport" "$rate") || exit 2
  log="$OUTDIR/$name.log"
  { cat "$OUTDIR/provenance.txt"; echo "command: $cmd"; echo "timeout: ${limit}s"; echo "---"; } > "$log"
  echo "== $name: timeout ${limit}s (+$((SECONDS - START))s of ${BUDGET_S}s)"
  t0=$SECONDS
  # in the background so that a TERM to this script (the session's step timeout) reaches the run
  # shellcheck disable=SC2086  # cmd is a list of words without spaces in them
  timeout -k 3 "$limit" $cmd >> "$log" 2>&1 &
  run_pid=$!
  wait "$run_pid"
  rc=$?
  run_pid=
  took=$((SECONDS - t0))
  echo "--- exit $rc after ${took}s" >> "$log"
  case $rc in
    0) state=ok ;;
    124|137) if [ "$limit" -lt "$RUN_CAP_S" ]; then state=cut-budget; else state=timeout; failed=1; fi ;;
    *) state="exit-$rc"; failed=1 ;;
  esac
  [ "$state" = ok ] || { echo "bench_shm: $name: $state after ${took}s; the end of its log:" >&2; tail -n 8 "$log" >&2; }
  printf '%s\t%s\t%s\t%s\t%ss\n' "$run" "$transport" "$rate" "$state" "$took" >> "$OUTDIR/runs.tsv"
  grep -E '^tick_to_decision ' "$log" | head -n 1 | sed "s/^/   $name: /"
done

$PY - "$OUTDIR" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
runs = [line.split("\t") for line in (out / "runs.tsv").read_text().splitlines() if line]

def load(run, transport, rate):
    try:
        return json.loads((out / f"{run}-{transport}-{rate}.json").read_text())
    except (OSError, ValueError):
        return None

def f(x, nd=1):
    return "-" if x is None else f"{x:,.{nd}f}"

state = {(r[0], r[1], r[2]): r[3] for r in runs}
keys = sorted({(r[0], r[2]) for r in runs}, key=lambda k: (["floor", "persistent", "auto"].index(k[0])
                                                          if k[0] in ("floor", "persistent", "auto") else 9, int(k[1])))
md = ["# hft-infer over ZeroMQ ipc and iceoryx2 (tools/bench_shm.sh)", "", "```",
      (out / "provenance.txt").read_text().strip(), "```", "",
      "| run | rate/s | transport | engine | achieved/s | tick_to_decision p50 / p99 / p99.9 | max | lost | p99 iceoryx2 / zmq |",
      "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
summary = {"provenance": (out / "provenance.txt").read_text(), "runs": {}, "targets": {}}
for run, rate in keys:
    zmq_p99 = (load(run, "zmq", rate) or {}).get("tick_to_decision", {}).get("p99_us")
    for transport in ("zmq", "iceoryx2"):
        if (run, transport, rate) not in state:
            continue
        o = load(run, transport, rate)
        if o is None:
            md.append(f"| {run} | {int(rate):,} | {transport} | {state[(run, transport, rate)]} ||||||")
            continue
        t = o["tick_to_decision"]
        ratio = t["p99_us"] / zmq_p99 if transport == "iceoryx2" and zmq_p99 else None
        md.append(f"| {run} | {int(rate):,} | {transport} | {o.get('engine', '-')} | {f(o.get('rate_achieved'), 0)} "
                  f"| {f(t.get('p50_us'))} / {f(t.get('p99_us'))} / {f(t.get('p999_us'))} | {f(t.get('max_us'))} "
                  f"| {o['accounting']['lost']:,} | {f(ratio, 2) + 'x' if ratio else '-'} |")
        summary["runs"][f"{run}-{transport}-{rate}"] = o

def target(name, run, rate, limit_us):
    o = load(run, "iceoryx2", rate)
    if o is not None and o["tick_to_decision"].get("p99_us") is None:
        o = None  # a run that decided nothing (e.g. its engine refused at start-up): no figure to judge
    ok = None if o is None else (o["tick_to_decision"]["p99_us"] <= limit_us and o["accounting"]["lost"] == 0)
    summary["targets"][name] = ok
    got = f" ({f(o['tick_to_decision']['p99_us'])} µs, lost {o['accounting']['lost']})" if o else ""
    md.append(f"- {name}: {'not run' if ok is None else ('**met**' if ok else '**missed**')}{got}")

md += ["", "Latency in µs (intended send time -> decision received, open loop). Targets (issue 19, iceoryx2):"]
target("floor p99 <= 40 us at 10k", "floor", "10000", 40)
target("lstm_a persistent p99 <= 50 us at 10k", "persistent", "10000", 50)
target("lstm_a persistent p99 <= 100 us at 100k", "persistent", "100000", 100)
skipped = [f"{r[0]}-{r[1]}-{r[2]} ({r[3]})" for r in runs if r[3] != "ok"]
if skipped:
    md += ["", "Not run or not ok: " + ", ".join(skipped)]
(out / "summary.md").write_text("\n".join(md) + "\n")
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print("\n".join(md))
EOF
[ $? -ne 0 ] && failed=1
exit "$failed"
