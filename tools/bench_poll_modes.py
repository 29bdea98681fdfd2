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
import json
import sys

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
    print(f"{'rate':>7s} {'mode':7s} {'achieved':>9s} {'service p50':>11s} {'p99':>8s} {'p99.9':>8s} "
          f"{'tick p50':>9s} {'p99':>8s} {'p99.9':>8s} {'tick p99 vs hybrid':>18s} {'decided':>8s} "
          f"{'conflated':>9s} {'shed':>5s} {'lost':>4s}")
    for r in rows:
        sv, tk, acc = r["stages"]["service"], r["tick_to_decision"], r["accounting"]
        hyb = next(x for x in rows if x["rate"] == r["rate"] and x["mode"] == "hybrid")["tick_to_decision"]["p99_us"]

        def f(x):
            return f"{x:8.0f}" if x is not None else f"{'-':>8s}"

        print(f"{r['rate']:7.0f} {r['mode']:7s} {r['rate_achieved']:9.0f} {f(sv['p50_us']):>11s} {f(sv['p99_us'])} "
              f"{f(sv['p999_us'])} {f(tk['p50_us']):>9s} {f(tk['p99_us'])} {f(tk['p999_us'])} "
              f"{(tk['p99_us'] / hyb if hyb and tk['p99_us'] else float('nan')):17.2f}x {acc['decided']:8d} "
              f"{acc['conflated']:9d} {acc['shed']:5d} {acc['lost']:4d}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
