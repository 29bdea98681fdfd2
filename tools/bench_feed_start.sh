#!/usr/bin/env bash
# The first 100 ms of a feed: what a service sheds while its first bursts go through, this checkout's tree against
# a baseline's (tools/baseline_tree.sh REV DIR makes DIR/py), alternated, beside the rest of the run per 100 ms.
#
#   tools/bench_feed_start.sh BASE_PY [ROUNDS] [-- BENCH ARGS...]
#   tools/baseline_tree.sh main /tmp/base-main && tools/bench_feed_start.sh /tmp/base-main/py 2
#
# Default bench: lstm_a in stream mode (a sequential model: its first EventBatch burst takes the scheduler's column
# push) on gpu.toml, 40k events/s for 2 s over EventBatch frames of 64, stats every 20 ms. Prints the provenance
# first, then one line a run: shed (LATE + STALE + QUEUE_FULL) in the first five 20 ms intervals with events, the
# same per 100 ms over the rest of the feed, and the run's sheds by reason.
set -eu
base_py=${1:?usage: tools/bench_feed_start.sh BASE_PY [ROUNDS] [-- BENCH ARGS...]}
rounds=${2:-2}
shift $(( $# < 2 ? $# : 2 ))
[ "${1:-}" = "--" ] && shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-c configs/gpu.toml --set 'model.mode="stream"' --rate 40000 --duration 2 --feed-batch 64)
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown) against $base_py"
echo "date: $(date -u +%FT%TZ)  machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "command: bench ${args[*]} --set metrics.stats_interval_ms=20, $rounds rounds, this tree then the baseline"
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/feed-start-XXXXXX)
for r in $(seq "$rounds"); do
  for who in this base; do
    py=python3; [ "$who" = base ] && py=$base_py
    run="$work/$who$r"
    line=$(timeout 300 "$py" -m hft_infer bench "${args[@]}" --set metrics.stats_interval_ms=20 --quiet \
      --run-dir "$run" 2>&1 | grep -o "shed and rejected.*" || true)
    PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" python3 - "$run/snapshots.jsonl" "$who $r" "$line" <<'PY'
import sys
from pathlib import Path
from shard_accounting import intervals  # each stats interval's growth, as --timeline reads it
rows = [(c.get("received", 0), sum(r.get(k, 0) for k in ("LATE", "STALE", "QUEUE_FULL")))
        for _, c, r in intervals(Path(sys.argv[1]))]
start = next(i for i, x in enumerate(rows) if x[0])
first, rest = rows[start:start + 5], rows[start + 5:-2]
later = f"{round(sum(x[1] for x in rest) / len(rest) * 5)} of {round(sum(x[0] for x in rest) / len(rest) * 5)}" \
    if rest else "-"
print(f"{sys.argv[2]:7s} first 100 ms of the feed: shed {sum(x[1] for x in first)} of {sum(x[0] for x in first)}; "
      f"later, per 100 ms: shed {later}; whole run: {sys.argv[3].replace('shed and rejected by reason (the service): ', '')}")
PY
  done
done
rm -rf "$work"
