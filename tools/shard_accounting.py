#!/usr/bin/env python3
"""Per-shard accounting and loop counters of `hft-infer bench --shards` runs, one row per shard.

    python3 tools/shard_accounting.py [--header TEXT] NAME=RUN_DIR ...

RUN_DIR is a bench run directory holding shard0/service/service.json, shard1/... (bench_shards.sh
writes them under OUTDIR/runs/<model>-n<N>/), or a single service's run directory holding
service/service.json. Each row: the run's NAME, the shard, its accounting (received, decided, shed
by reason), the loop's counters (batches, coalesced_reads, stalls and the ingest part of them)
and the median of its `ingest` (µs an event of a burst), `step` and `loop_gap` stages, and its
events a burst (received over the `ingest` stage's count, one sample a burst, warm-up included) --
what a saturated shard's capacity and its losses are made of, where the aggregate table only sums them.
The table is plain text starting with a `#` line, as docs/bench/ logs must (tests/unit/
test_bench_logs.py); --header puts a line of provenance (e.g. `commit: ...`) first.
Exit 1 when a run directory holds no service.json.

--timeline prints, instead, each shard's snapshots.jsonl (the bench's record of every stats
snapshot; finer with `--set metrics.stats_interval_ms=100`) as one row per interval: what the
shard received, decided and shed LATE (and STALE) in it, its batches, held reads and the time of its
long ingests (stall_ingest_ms), and its admission's gauges at its end -- when a shard fell behind,
and what its admission did then.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

COLUMNS = ("run", "shard", "received", "decided", "shed", "LATE", "QUEUE_FULL", "STALE", "batches",
           "coalesced_reads", "stalls", "stall_ingest_ms", "ingest_p50_us", "step_p50_us", "loop_gap_p50_us",
           "events_per_burst")


def service_files(run_dir: Path) -> list[tuple[str, Path]]:
    """(shard label, service.json) of a run directory, shards in numeric order."""
    shards = sorted(run_dir.glob("shard*/service/service.json"), key=lambda p: int(p.parts[-3][5:]))
    if shards:
        return [(p.parts[-3][5:], p) for p in shards]
    single = run_dir / "service" / "service.json"
    return [("-", single)] if single.exists() else []


def row(name: str, shard: str, summary: dict) -> list:
    acct, counters, stages = summary["accounting"], summary["counters"], summary["stages"]
    reasons = summary.get("rejected_by_reason", {})

    def p50(stage: str):
        return stages.get(stage, {}).get("p50_us", "-")

    bursts = stages.get("ingest", {}).get("count", 0)

    return [name, shard, acct["received"], acct["decided"], acct["shed"], reasons.get("LATE", 0),
            reasons.get("QUEUE_FULL", 0), reasons.get("STALE", 0), counters["batches"],
            counters.get("coalesced_reads", 0), counters.get("stalls", 0),
            round(counters.get("stall_ingest_us", 0) / 1000, 1), p50("ingest"), p50("step"), p50("loop_gap"),
            round(acct["received"] / bursts, 1) if bursts else "-"]


TIMELINE_COLUMNS = ("run", "shard", "t_s", "interval_ms", "received", "decided", "LATE", "STALE", "batches",
                    "coalesced_reads", "stall_ingest_ms", "admit_margin_us", "admit_depth", "queue_depth")


def intervals(path: Path):
    """Each snapshot of a snapshots.jsonl with what grew over its interval (the first snapshot's: since
    start): (snapshot, the counters' growth, by_reason's growth), dicts of the snapshot's own keys."""
    prev_c: dict = {}
    prev_r: dict = {}
    for line in path.read_text().splitlines():
        snap = json.loads(line)
        c, r = snap["counters"], snap["by_reason"]
        yield snap, {k: v - prev_c.get(k, 0) for k, v in c.items()}, {k: v - prev_r.get(k, 0) for k, v in r.items()}
        prev_c, prev_r = c, r


def timeline_rows(name: str, shard: str, path: Path) -> list[list]:
    """One row per snapshot of a snapshots.jsonl: the counters' growth over its interval, the gauges
    at its end."""
    rows = []
    for snap, c, r in intervals(path):
        g = snap["gauges"]
        rows.append([name, shard, snap["t_s"], snap["interval_ms"], c["received"], c["decided"],
                     r.get("LATE", 0), r.get("STALE", 0), c["batches"], c.get("coalesced_reads", 0),
                     # a spell's loop: the time its long ingests took (wave 29's LATE spells: 50-90 ms of
                     # them in the spell's second against ~15-20 in the others)
                     round(c.get("stall_ingest_us", 0) / 1000, 1),
                     round(g.get("admit_margin_us", 0.0), 1), g.get("admit_depth", "-"), g.get("queue_depth", "-")])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", metavar="NAME=RUN_DIR")
    ap.add_argument("--header", default="", help="a first line (provenance), e.g. 'commit: abc1234 ...'")
    ap.add_argument("--timeline", action="store_true",
                    help="each shard's snapshots.jsonl, one row per stats interval, instead of the totals")
    a = ap.parse_args(argv)
    if a.header:  # first, even when a run below has nothing to read (the log still names its commit)
        print(a.header, flush=True)
    rows = []
    columns = TIMELINE_COLUMNS if a.timeline else COLUMNS
    for spec in a.runs:
        name, sep, path = spec.partition("=")
        if not sep:
            ap.error(f"{spec!r}: expected NAME=RUN_DIR")
        files = service_files(Path(path))
        if not files:
            print(f"shard_accounting: {path}: no shard*/service/service.json or service/service.json",
                  file=sys.stderr)
            return 1
        for shard, f in files:
            if not a.timeline:
                rows.append(row(name, shard, json.loads(f.read_text())))
                continue
            timeline = f.parent.parent / "snapshots.jsonl"  # RUN/shardI/snapshots.jsonl beside service/
            if not timeline.exists():
                print(f"shard_accounting: {timeline}: no snapshots.jsonl (a run cut off before its shards "
                      "stopped, or one from before the timeline was written)", file=sys.stderr)
                return 1
            rows += timeline_rows(name, shard, timeline)
    what = ("per-shard timeline, one row per stats interval (each shard's snapshots.jsonl)" if a.timeline else
            "per-shard accounting and loop counters (each shard's service.json)")
    print(f"# {what}: " + " ".join(columns))
    for r in rows:
        print(" ".join(str(v) for v in r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
