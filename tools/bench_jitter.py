#!/usr/bin/env python3
"""How often the OS takes a pinned, spinning core away, and for how long (the floor under any
pacer's lateness).

    python tools/bench_jitter.py [--cores 3,14] [--seconds 2] [--threshold-us 1] [--json out.json]

Each core in turn: a child process pinned there spins reading perf_counter_ns for --seconds and
records every gap between consecutive reads above --threshold-us (a timer tick, an interrupt,
another task, a VM exit). It reports the interruptions per second, their p50/p99/max, and the
share of 10 µs slots (a 100k events/s schedule) in which one of at least 5 µs began: that share
is the floor of the pacer's lateness at that quantile on this core (issue "Measurement you can
trust": lateness p99 <= 5 µs at 100k). With a 1 kHz scheduler tick on a core that is not
`nohz_full`, ~1 % of the slots see the tick.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np
from benchlib import table, write_json

SPIN = r"""
import json, os, sys, time
core, seconds, threshold = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
if core >= 0:
    os.sched_setaffinity(0, {core})
pn = time.perf_counter_ns
gaps, starts = [], []
end = pn() + int(seconds * 1e9)
last = t0 = pn()
while last < end:  # the loop body is a read and a compare: its own cost is tens of ns
    now = pn()
    if now - last > threshold:
        gaps.append(now - last)
        starts.append(last - t0)
    last = now
print(json.dumps({"gaps": gaps, "starts": starts, "span_ns": last - t0}))
"""


def measure(core: int, seconds: float, threshold_ns: int) -> dict:
    out = subprocess.run([sys.executable, "-c", SPIN, str(core), str(seconds), str(threshold_ns)],
                         capture_output=True, text=True, timeout=seconds * 5 + 30, check=True).stdout
    doc = json.loads(out)
    gaps = np.asarray(doc["gaps"], dtype=np.int64)
    starts = np.asarray(doc["starts"], dtype=np.int64)
    span = doc["span_ns"]
    slots = max(1, span // 10_000)
    hit = np.unique(starts[gaps >= 5_000] // 10_000).size  # 10 µs slots in which a >= 5 µs gap began
    us = gaps / 1e3 if gaps.size else np.zeros(1)
    return {"core": core, "seconds": span / 1e9, "per_s": gaps.size / (span / 1e9),
            "p50_us": float(np.percentile(us, 50)), "p99_us": float(np.percentile(us, 99)),
            "max_us": float(us.max()), "total_ms_per_s": float(gaps.sum() / 1e6 / (span / 1e9)),
            "slots_hit_pct": 100.0 * hit / slots}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cores", default=None, help="comma-separated cores (default: the last one allowed)")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--threshold-us", type=float, default=1.0, help="a gap above this is an interruption")
    ap.add_argument("--json", metavar="PATH")
    a = ap.parse_args()
    allowed = sorted(os.sched_getaffinity(0))
    try:
        cores = [int(c) for c in a.cores.split(",")] if a.cores else [allowed[-1]]
    except ValueError:
        ap.error(f"--cores: not a list of core numbers: {a.cores!r}")
    bad = [c for c in cores if c not in allowed]
    if bad:
        ap.error(f"--cores: {bad} not in this process's affinity {allowed}")
    if a.seconds <= 0 or a.threshold_us <= 0:
        ap.error("--seconds and --threshold-us must be > 0")
    try:
        isolated = open("/sys/devices/system/cpu/isolated").read().strip() or "-"
        nohz = open("/sys/devices/system/cpu/nohz_full").read().strip() or "-"
    except OSError:
        isolated = nohz = "?"
    rows = [measure(c, a.seconds, int(a.threshold_us * 1000)) for c in cores]
    print(table(["core", "interruptions/s", "p50 µs", "p99 µs", "max µs", "ms lost per s",
                 "10 µs slots hit by >= 5 µs (%)"],
                [[r["core"], r["per_s"], r["p50_us"], r["p99_us"], r["max_us"], r["total_ms_per_s"],
                  r["slots_hit_pct"]] for r in rows]))
    print(f"isolated cores: {isolated}; nohz_full: {nohz}; threshold {a.threshold_us:g} µs")
    if a.json:
        write_json(a.json, {"isolated": isolated, "nohz_full": nohz, "threshold_us": a.threshold_us, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
