#!/usr/bin/env python3
"""Goodput under overload: decided/s against offered/s, and the service at 3x and 10x its capacity.

    python tools/bench_overload.py [-c CONFIG] [--set K=V]... [--rates 5000,10000,20000,40000,80000]
        [--duration 3] [--overload 3,10] [--overload-duration 5] [--baseline-python PY]
        [--json out.json] [--plot curve.png]

Every point is one `hft-infer bench` run (a fresh service, the harness's pacer and
collector processes; the same code path `bench` and `serve` run), so the figures are
the service's own accounting beside the harness's:

1. the sweep: each offered rate in --rates for --duration s (+1 s warm-up);
2. capacity: the highest offered rate of the sweep at which the service kept up
   (shed <= 1 % of the events and lost = 0); "decided/s at capacity" is that run's
   decided/s (decided events over the whole run, warm-up included);
3. overload: offered at each multiple in --overload of that capacity for
   --overload-duration s; the issue's criterion: decided/s >= 90 % of decided/s at
   capacity, lost = 0, every event accounted (sent = decided + shed + conflated +
   rejected). The table says met or missed for each.

--baseline-python PY runs every point a second time with another interpreter (e.g. the venv
of a checkout of the previous commit: `hft-infer` as installed there, or the wrapper that
`tools/baseline_tree.sh REV DIR` writes, DIR/py: REV's package laid out as installed), the two alternating
point by point so that a busy machine hits both alike; each is judged against its own
capacity and both are printed.

The pacer's achieved rate is printed beside the offered one: where the load
generator itself cannot keep up (a 2-core VM at several 100k events/s), the
multiple actually offered is the achieved one, and the table says so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import table, write_json

CRITERION = 0.90  # decided/s under overload as a share of decided/s at capacity
SHED_LIMIT = 0.01  # capacity: shed at most this share of the events


def run_bench(rate: float, duration: float, config: str | None, sets: list[str], work: Path,
              python: str = sys.executable, label: str = "", with_floor: bool = False, feed_batch: int = 1) -> dict:
    """One `hft-infer bench` run; its summary (accounting, stages, tick_to_decision, rates; with
    `with_floor`, the null service's run on the same feed first, under "floor")."""
    out = work / f"bench-{label}{int(rate)}-{duration:g}.json"
    cmd = [python, "-m", "hft_infer", "bench", "--rate", str(rate), "--duration", str(duration), "--quiet",
           "--json", str(out), "--run-dir", str(work / f"run-{label}{int(rate)}-{duration:g}")]
    if with_floor:
        cmd.append("--with-floor")
    if feed_batch > 1:
        cmd += ["--feed-batch", str(feed_batch)]
    if config:
        cmd += ["-c", config]
    for s in sets:
        cmd += ["--set", s]
    # cwd: the work dir, so that `-m` does not put a checkout on the path ahead of the one that
    # `python` has installed (a baseline interpreter must run its own hft_infer)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=work)
    if proc.returncode not in (0, 1) or not out.exists():  # 1: lost events (reported, not fatal here)
        raise SystemExit(f"bench_overload: bench at {rate:g}/s failed (exit {proc.returncode}):\n"
                         f"{proc.stderr[-2000:]}")
    doc = json.loads(out.read_text())
    return doc.get("result", doc)


def point(r: dict, duration: float) -> dict:
    """The figures of one run that the tables use."""
    acc = r["accounting"]
    seconds = duration + float(r.get("warmup_s") or 0)
    sent = acc["sent"]
    accounted = acc["decided"] + acc["shed"] + acc["conflated"] + acc["rejected"]
    tick = r.get("tick_to_decision") or {}
    service = (r.get("stages") or {}).get("service") or {}
    return {
        "offered": r["rate_offered"], "achieved": r.get("rate_achieved"), "seconds": seconds,
        "sent": sent, "decided": acc["decided"], "shed": acc["shed"], "conflated": acc["conflated"],
        "rejected": acc["rejected"], "lost": acc["lost"], "accounted": accounted == sent - acc["lost"],
        "decided_per_s": acc["decided"] / seconds, "shed_share": acc["shed"] / sent if sent else 0.0,
        "tick_p50_us": tick.get("p50_us"), "tick_p99_us": tick.get("p99_us"),
        "service_p99_us": service.get("p99_us"),
        "floor_p99_us": ((r.get("floor") or {}).get("tick_to_decision") or {}).get("p99_us"),
    }


def capacity(sweep: list[dict]) -> dict | None:
    kept = [p for p in sweep if p["shed_share"] <= SHED_LIMIT and p["lost"] == 0]
    return max(kept, key=lambda p: p["offered"]) if kept else None


ROW_HEADERS = ["offered/s", "achieved/s", "decided/s", "shed %", "conflated", "lost", "tick p50 µs",
               "tick p99 µs", "floor p99 µs", "service p99 µs"]


def _row(p: dict) -> list:
    return [p["offered"], p["achieved"], p["decided_per_s"], 100 * p["shed_share"], p["conflated"], p["lost"],
            p["tick_p50_us"], p["tick_p99_us"], p["floor_p99_us"], p["service_p99_us"]]


def plot(points: list[dict], cap: dict | None, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = sorted(points, key=lambda p: p["achieved"] or p["offered"])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p["achieved"] or p["offered"] for p in pts], [p["decided_per_s"] for p in pts], "o-")
    if cap:
        ax.axhline(CRITERION * cap["decided_per_s"], ls="--", c="grey", label="90 % of decided/s at capacity")
        ax.legend()
    ax.set_xscale("log")
    ax.set_xlabel("offered events/s (achieved by the pacer)")
    ax.set_ylabel("decided events/s")
    ax.set_title("goodput")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run_order(variants: list, k: int, baseline_first: bool = False) -> list:
    """The variants in the order they run at the k-th point of a sweep (or of the overload points):
    alternated from point to point, so neither always runs first; `baseline_first` swaps every
    point's order (the same point in the other order, from a second run)."""
    first = variants[::-1] if baseline_first else variants
    return first if k % 2 == 0 else first[::-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("-c", "--config", help="TOML config (default: the embedded default)")
    ap.add_argument("--set", action="append", default=[], metavar="K=V", help="config override (repeatable)")
    ap.add_argument("--rates", default="5000,10000,20000,40000,80000", help="the sweep's offered rates, events/s")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds of load per sweep point (default 3)")
    ap.add_argument("--overload", default="3,10", help="multiples of capacity to offer (default 3,10)")
    ap.add_argument("--overload-duration", type=float, default=5.0, help="seconds per overload point (default 5)")
    ap.add_argument("--baseline-python", metavar="PY",
                    help="also run every point with this interpreter (another checkout's venv), interleaved")
    ap.add_argument("--baseline-first", action="store_true",
                    help="with --baseline-python: run the baseline first where this tree would (the order alternates "
                         "from point to point but is fixed by each point's place: two runs, one with this flag, "
                         "put each point in both orders)")
    ap.add_argument("--with-floor", action="store_true",
                    help="run each point against the null service first (bench --with-floor): the harness "
                         "floor's tick p99 from the same run beside the service's")
    ap.add_argument("--feed-batch", type=int, default=1, metavar="N",
                    help="bench --feed-batch N: events due together go as one EventBatch frame (default 1)")
    ap.add_argument("--json", help="write the points, capacity and verdicts here (with provenance)")
    ap.add_argument("--plot", help="write the goodput curve as a PNG here")
    a = ap.parse_args(argv)
    try:
        rates = [float(x) for x in a.rates.split(",")]
        multiples = [float(x) for x in a.overload.split(",")] if a.overload else []
    except ValueError:
        ap.error("--rates and --overload take comma-separated numbers")
    if a.config:
        a.config = str(Path(a.config).resolve())  # the runs start in a work dir
    if not rates or min(rates) <= 0 or any(m <= 1 for m in multiples) or a.duration <= 0:
        ap.error("rates and durations must be > 0 and overload multiples > 1")
    variants = [("this", sys.executable)] + ([("baseline", a.baseline_python)] if a.baseline_python else [])
    sweep: dict[str, list[dict]] = {v: [] for v, _ in variants}
    caps: dict[str, dict | None] = {}
    over: dict[str, list[dict]] = {v: [] for v, _ in variants}
    with tempfile.TemporaryDirectory(prefix="hft-overload-") as tmp:
        work = Path(tmp)
        for k, rate in enumerate(rates):
            for v, py in run_order(variants, k, a.baseline_first):
                r = run_bench(rate, a.duration, a.config, a.set, work, py, v, a.with_floor, a.feed_batch)
                sweep[v].append(point(r, a.duration))
                print(v, table(ROW_HEADERS, [_row(sweep[v][-1])]).splitlines()[-1], file=sys.stderr, flush=True)
        caps = {v: capacity(sweep[v]) for v, _ in variants}
        for k, m in enumerate(multiples):
            for v, py in run_order(variants, k, a.baseline_first):
                cap = caps[v]
                if cap is None:
                    continue
                p = point(run_bench(m * cap["offered"], a.overload_duration, a.config, a.set, work, py, v,
                                    a.with_floor, a.feed_batch),
                          a.overload_duration)
                achieved_multiple = (p["achieved"] or p["offered"]) / cap["offered"]
                p |= {"multiple": m, "achieved_multiple": achieved_multiple,
                      "goodput_share": p["decided_per_s"] / cap["decided_per_s"] if cap["decided_per_s"] else 0.0}
                p["met"] = p["goodput_share"] >= CRITERION and p["lost"] == 0 and p["accounted"]
                over[v].append(p)
    for v, py in variants:
        if len(variants) > 1:
            print(f"== {v}: {py}")
        report(sweep[v], caps[v], over[v])
        print()
    if a.plot:
        plot(sweep["this"] + over["this"], caps["this"], a.plot)
    if a.json:
        doc = {"sweep": sweep["this"], "capacity": caps["this"], "overload": over["this"],
               "config": a.config, "sets": a.set, "criterion": CRITERION, "feed_batch": a.feed_batch}
        if a.baseline_python:
            doc["baseline"] = {"python": a.baseline_python, "sweep": sweep["baseline"],
                               "capacity": caps["baseline"], "overload": over["baseline"]}
        write_json(a.json, doc)
    cap = caps["this"]
    return 0 if cap is not None and all(p["met"] for p in over["this"]) else 1


def report(sweep: list[dict], cap: dict | None, over: list[dict]) -> None:
    print(table(ROW_HEADERS, [_row(p) for p in sweep], title="sweep"))
    print()
    if cap is None:
        print(f"capacity: no sweep point kept up (shed <= {SHED_LIMIT:.0%}, lost 0): lower --rates")
        return
    print(f"capacity: {cap['offered']:,.0f} events/s offered, {cap['decided_per_s']:,.0f} decided/s "
          f"(the highest sweep rate with shed <= {SHED_LIMIT:.0%} and lost 0)")
    rows = [[f"{p['multiple']:g}x", f"{p['achieved_multiple']:.1f}x", p["decided_per_s"],
             100 * p["goodput_share"], p["lost"], "yes" if p["accounted"] else "NO",
             "met" if p["met"] else "MISSED"] for p in over]
    print(table(["offered", "achieved", "decided/s", "% of capacity", "lost", "all accounted",
                 f">= {CRITERION:.0%}, lost 0"], rows, title="overload"))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
