#!/usr/bin/env python3
"""Soak: sustained open-loop load for a long time; memory, tail latency and loss over time.

    python tools/soak.py [--minutes 10] [--rate 5000] [--json soak.json] [-- BENCH ARGS...]

Runs `hft-infer bench` machinery for --minutes at --rate, then reads the
service's own per-interval snapshots (one per second): resident memory
(`rss_bytes` gauge) and per-minute service-stage p99.9. Pass criteria
(issue 9): RSS growth < 2 % from the end of the first minute to the end,
p99.9 stable (reported per minute; the max/median ratio is printed), lost = 0.
Not part of CI (it takes --minutes).
"""

from __future__ import annotations

import argparse
import statistics
import sys

from benchlib import percentile_table, table, write_json

from hft_infer.app.cli import build_parser
from hft_infer.metrics import add_sparse, from_wire, new_histogram


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=5000.0)
    ap.add_argument("--json", help="write the soak result here")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER, help="extra `hft-infer bench` arguments after --")
    a = ap.parse_args()
    extra = [x for x in a.bench_args if x != "--"]
    args = build_parser().parse_args(["bench", "--rate", str(a.rate), "--duration", str(a.minutes * 60),
                                      "--warmup", "5", "--quiet", *extra])
    from hft_infer.app.bench import run

    out, stats = run(args)
    snaps = [s for s in stats.snapshots if not s.final]
    t0 = snaps[0].ts_ns
    rss = [(round((s.ts_ns - t0) / 1e9), s.gauges.get("rss_bytes", 0.0)) for s in snaps]
    after_first_minute = [v for t, v in rss if t >= 60] or [v for _, v in rss]
    rss_growth = (rss[-1][1] - after_first_minute[0]) / after_first_minute[0] * 100 if after_first_minute[0] else None
    per_minute = {}
    for s in snaps:
        minute = int((s.ts_ns - t0) / 60e9)
        h = per_minute.setdefault(minute, new_histogram())
        if "service" in s.stages:
            add_sparse(h, from_wire(s.stages["service"]))
    p999 = {m: h.get_value_at_percentile(99.9) / 1e3 for m, h in sorted(per_minute.items()) if h.get_total_count()}
    med = statistics.median(p999.values()) if p999 else 0.0
    result = {
        "minutes": a.minutes, "rate": a.rate, "rate_achieved": out["rate_achieved"],
        "accounting": out["accounting"], "rss_mb_start": after_first_minute[0] / 2**20,
        "rss_mb_end": rss[-1][1] / 2**20, "rss_growth_pct": rss_growth,
        "service_p999_us_per_minute": p999, "p999_max_over_median": (max(p999.values()) / med) if med else None,
        "tick_to_decision": out["tick_to_decision"], "stages": out["stages"], "run_dir": out["run_dir"],
    }
    print(percentile_table(out["stages"] | {"tick_to_decision": out["tick_to_decision"]},
                           title=f"soak: {a.minutes:g} min at {a.rate:g}/s (achieved {out['rate_achieved']:.0f}/s)"))
    print()
    print(table(["minute", "service p99.9 µs"], [[m, v] for m, v in p999.items()],
                title="service p99.9 per minute"))
    print(f"\nRSS {result['rss_mb_start']:.1f} MB after the first minute -> {result['rss_mb_end']:.1f} MB at the end; "
          f"accounting: " + ", ".join(f"{k}={v}" for k, v in out["accounting"].items()))
    if a.json:
        write_json(a.json, result)
    ok = out["accounting"]["lost"] == 0 and rss_growth is not None and rss_growth < 2.0
    growth = f"{rss_growth:.2f} %" if rss_growth is not None else "unknown"
    print(f"soak: {'PASS' if ok else 'FAIL'}: lost={out['accounting']['lost']}, RSS growth {growth}, "
          f"p99.9 max/median {result['p999_max_over_median']}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
