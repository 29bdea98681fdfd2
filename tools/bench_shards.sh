#!/usr/bin/env bash
# Scale-out measurement (issue 18): aggregate decided/s and tick_to_decision of N shards on one
# host, lstm_a and the default model, beside the harness floor, inside a fixed time budget.
#
#   tools/bench_shards.sh OUTDIR
#
# For each model and N in $SHARDS (default 1 2 4 8; an N is skipped when `nproc` < N + 3:
# a core per shard, the pacer, a collector and one for libzmq's I/O threads), one
#   hft-infer bench -c configs/gpu.toml --shards N --rate N*RATE_PER_SHARD ...
# (lstm_a, engine auto = the graph engine on a GPU; the default model is the same config with
# model.checkpoint = "builtin:default"), the lstm_a runs with --with-floor (the null service
# in N shards, same feed and placement: the floor of that shard count). Runs go in priority
# order, $ORDER (default: lstm_a 1, 4, 8, then the default model 1, 4, then lstm_a 2 and the
# default model 2, 8: the 1->4 efficiencies and lstm_a's widest run first); a run that cannot
# start with MIN_RUN_S left in BUDGET_S is skipped and listed, every run is wrapped in
# `timeout` (its whole process group, the shards included, is killed at the limit), so the
# script ends within the budget and never hangs. At the end a summary table (stdout and
# OUTDIR/summary.md, OUTDIR/summary.json) with the scaling efficiency
# decided/s(4) / (4 x decided/s(1)) per model.
#
# Exit status: 0 when every run that started succeeded (skips for the budget, and a last run cut
# short by it, `cut-budget`, are listed, not failures); 1 when a run failed, timed out at
# RUN_CAP_S or lost an event, or no run succeeded; 2 on bad usage.
#
# Knobs (environment): BUDGET_S=70 (whole script), SHARDS="1 2 4 8", MODELS="lstm_a default",
# RATE_PER_SHARD=30000 (events/s offered per shard: one lstm_a shard saturates between 30k
# and 50k/s, BENCHMARKS.md), DURATION=1, WARMUP=0.5 (s per run), INSTRUMENTS=64 (the feed's, and the
# universe's: universe.instruments is set to it, which a config with explicit universe.ids ignores),
# RUN_CAP_S=40 (longest single run), MIN_RUN_S=12 (no run starts with less left), PY=python3 (has
# hft_infer, pyzmq and msgspec), CONFIG=configs/gpu.toml, EXTRA_SET (more --set K=V,
# space-separated, e.g. for a CPU-only test: 'ingest.poll_mode="event" runner.device="cpu"'),
# CHECK_CORES=1 (0: run every N whatever `nproc` says: a logic test on a small machine), FLOOR=1
# (0: no --with-floor runs, e.g. a second pass under tools/with_mps.sh, whose floor -- no GPU --
# is the first pass's), FEED_BATCH=1 (>1: bench --feed-batch, one EventBatch per shard of the
# events due together, under each shard's batch topic), EXTRA_ARGS (more bench arguments,
# space-separated, e.g. --balance-shards).
#
# The dev VM (2 cores, no GPU), a logic test that never spins two processes at once:
#   SHARDS="1 2" RATE_PER_SHARD=300 CHECK_CORES=0 PY=.venv/bin/python \
#   EXTRA_SET='ingest.poll_mode="event" cpu.cores="none"' tools/bench_shards.sh /tmp/bs
set -u
if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: tools/bench_shards.sh OUTDIR" >&2
  exit 2
fi
OUTDIR=$1
BUDGET_S=${BUDGET_S:-70}
SHARDS=${SHARDS:-1 2 4 8}
MODELS=${MODELS:-lstm_a default}
RATE_PER_SHARD=${RATE_PER_SHARD:-30000}
DURATION=${DURATION:-1}
WARMUP=${WARMUP:-0.5}
INSTRUMENTS=${INSTRUMENTS:-64}
RUN_CAP_S=${RUN_CAP_S:-40}
MIN_RUN_S=${MIN_RUN_S:-12}
PY=${PY:-python3}
CONFIG=${CONFIG:-configs/gpu.toml}
EXTRA_SET=${EXTRA_SET:-}
EXTRA_ARGS=${EXTRA_ARGS:-}
CHECK_CORES=${CHECK_CORES:-1}
FLOOR=${FLOOR:-1}
FEED_BATCH=${FEED_BATCH:-1}
HERE=$(cd "$(dirname "$0")" && pwd)
START=$SECONDS

mkdir -p "$OUTDIR/runs" || { echo "bench_shards: cannot create $OUTDIR" >&2; exit 2; }
: > "$OUTDIR/runs.tsv"
if ! command -v timeout > /dev/null; then
  echo "bench_shards: needs coreutils timeout" >&2
  exit 2
fi
if ! $PY -c "import hft_infer, zmq, msgspec" 2> "$OUTDIR/import.err"; then
  echo "bench_shards: $PY cannot import hft_infer, zmq and msgspec (set PY=...):" >&2
  cat "$OUTDIR/import.err" >&2
  exit 2
fi
[ -f "$CONFIG" ] || { echo "bench_shards: no config $CONFIG (run from the repository root or set CONFIG)" >&2; exit 2; }
CORES=$(nproc)
extra=(--set "universe.instruments=$INSTRUMENTS")
for kv in $EXTRA_SET; do extra+=(--set "$kv"); done
for a in $EXTRA_ARGS; do extra+=("$a"); done

model_args() {  # the --set arguments that pick the model
  case $1 in
    lstm_a) ;;  # configs/gpu.toml is lstm_a
    default) echo '--set model.checkpoint="builtin:default" --set model.preset=""' ;;
    *) echo "bench_shards: unknown model $1 (lstm_a or default)" >&2; return 1 ;;
  esac
}

ORDER=${ORDER:-lstm_a:1 lstm_a:4 lstm_a:8 default:1 default:4 lstm_a:2 default:2 default:8}
order=()
for item in $ORDER; do
  case " $MODELS " in *" ${item%%:*} "*) ;; *) continue ;; esac
  case " $SHARDS " in *" ${item##*:} "*) order+=("$item") ;; esac
done
[ ${#order[@]} -gt 0 ] || { echo "bench_shards: nothing to run (MODELS=$MODELS SHARDS=$SHARDS ORDER=$ORDER)" >&2; exit 2; }

failed=0
run_pid=
trap 'echo "bench_shards: terminated; stopping the run in progress" >&2; [ -n "$run_pid" ] && kill -TERM "$run_pid";
      wait; exit 143' TERM INT
for item in "${order[@]}"; do
  m=${item%%:*}
  n=${item##*:}
  name="$m-n$n"
  margs=$(model_args "$m") || exit 2
  if [ "$CHECK_CORES" != 0 ] && [ "$CORES" -lt $((n + 3)) ]; then
    echo "== $name: skipped: $CORES cores, $n shards need $((n + 3)) (a core each, pacer, collector, I/O)"
    printf '%s\t%s\t%s\tskipped-cores\t-\t%s\n' "$m" "$n" "$((n * RATE_PER_SHARD))" "$CORES cores" >> "$OUTDIR/runs.tsv"
    continue
  fi
  left=$((BUDGET_S - (SECONDS - START)))
  if [ "$left" -lt "$MIN_RUN_S" ]; then
    echo "== $name: skipped: ${left}s of the ${BUDGET_S}s budget left (a run needs ${MIN_RUN_S}s)" >&2
    printf '%s\t%s\t%s\tskipped-budget\t-\t%ss left\n' "$m" "$n" "$((n * RATE_PER_SHARD))" "$left" >> "$OUTDIR/runs.tsv"
    continue
  fi
  limit=$((left - 3 < RUN_CAP_S ? left - 3 : RUN_CAP_S))  # 3 s for the summary, inside the budget
  floor=()
  [ "$m" = lstm_a ] && [ "$FLOOR" != 0 ] && floor=(--with-floor)
  rate=$((n * RATE_PER_SHARD))
  json="$OUTDIR/runs/$name.json"
  t0=$SECONDS
  echo "== $name: $n shard(s), $rate events/s, timeout ${limit}s (+$((SECONDS - START))s of ${BUDGET_S}s)"
  # in the background so that a TERM to this script (an outer timeout) reaches the run: `timeout`
  # runs it in a process group of its own, which an outer kill would miss
  # shellcheck disable=SC2086  # margs is a list of words
  timeout -k 3 "$limit" $PY -m hft_infer bench -c "$CONFIG" $margs "${extra[@]}" --shards "$n" "${floor[@]}" \
    --rate "$rate" --duration "$DURATION" --warmup "$WARMUP" --instruments "$INSTRUMENTS" --feed-batch "$FEED_BATCH" --quiet \
    --run-dir "$OUTDIR/runs/$name" --json "$json" > "$OUTDIR/runs/$name.out" 2> "$OUTDIR/runs/$name.err" &
  run_pid=$!
  wait "$run_pid"
  rc=$?
  run_pid=
  took=$((SECONDS - t0))
  case $rc in
    0) state=ok ;;
    124|137) if [ "$limit" -lt "$RUN_CAP_S" ]; then state=cut-budget; else state=timeout; failed=1; fi ;;
    *) state="exit-$rc"; failed=1 ;;
  esac
  [ "$state" = ok ] || { echo "bench_shards: $name: $state after ${took}s; the end of its stderr:" >&2;
                         tail -n 8 "$OUTDIR/runs/$name.err" >&2; }
  printf '%s\t%s\t%s\t%s\t%s\t%ss\n' "$m" "$n" "$rate" "$state" "$json" "$took" >> "$OUTDIR/runs.tsv"
  grep -E '^all ' "$OUTDIR/runs/$name.out" | tail -n 1 | sed "s/^/   $name: /"
done

$PY "$HERE/bench_shards_summary.py" "$OUTDIR" --budget "$BUDGET_S" --elapsed "$((SECONDS - START))"
src=$?
[ "$src" -ne 0 ] && failed=1
exit "$failed"
