#!/usr/bin/env python3
"""`hft-infer bench` at several rates for each poll mode, side by side in one run.

    python tools/bench_poll_modes.py [--rates 1000,10000,50000] [--duration 5] [--json out.json]
                                     [-- extra bench args, e.g. --set cpu.cores=[1]]

Every run uses the same synthetic feed (seed) and the sleeping pacer (on a
2-core machine a spinning pacer next to a busy-polling service would be two
spinning processes on two cores), and reports per-stage and tick-to-decision
percentiles, achieved rate and the accounting. Ratios are against hybrid, the
default mode.
"""

from __future__ import annotations

import argparse
import sys

from benchlib import table, write_json

from hft_infer.app.cli import build_parser


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="1000,10000,50000")
    ap.add_argument("--modes", default="busy,hybrid,event")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--json")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    extra = [x for x in a.bench_args if x != "--"]
    from hft_infer.app.bench import run

    rows = []
    for rate in a.rates.split(","):
        for mode in a.modes.split(","):
            args = build_parser().parse_args(["bench", "--rate", rate, "--duration", str(a.duration), "--quiet",
                                              "--pacer", "sleep", "--set", f"ingest.poll_mode={mode}", *extra])
            out, _ = run(args)
            rows.append({"rate": float(rate), "mode": mode, "rate_achieved": out["rate_achieved"],
                         "stages": out["stages"], "tick_to_decision": out["tick_to_decision"],
                         "accounting": out["accounting"], "pacer_lateness": out["pacer_lateness"]})
            print(f"done {mode} @ {rate}", file=sys.stderr, flush=True)
    table_rows = []
    for r in rows:
        sv, tk, acc = r["stages"]["service"], r["tick_to_decision"], r["accounting"]
        hyb = next((x for x in rows if x["rate"] == r["rate"] and x["mode"] == "hybrid"), None)
        hyb_p99 = hyb["tick_to_decision"]["p99_us"] if hyb else None
        vs = f"{tk['p99_us'] / hyb_p99:.2f}x" if hyb_p99 and tk["p99_us"] else None
        table_rows.append([r["rate"], r["mode"], r["rate_achieved"], sv["p50_us"], sv["p99_us"], sv["p999_us"],
                           tk["p50_us"], tk["p99_us"], tk["p999_us"], vs, acc["decided"], acc["conflated"],
                           acc["shed"], acc["lost"]])
    print(table(["rate", "mode", "achieved/s", "service p50 µs", "p99", "p99.9", "tick p50 µs", "p99", "p99.9",
                 "tick p99 vs hybrid", "decided", "conflated", "shed", "lost"], table_rows, digits=0))
    if a.json:
        write_json(a.json, {"rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
