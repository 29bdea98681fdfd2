#!/usr/bin/env python3
"""Pacer accuracy: lateness (actual - intended send time) at several rates, spin vs sleep.

    python tools/bench_pacer.py [--rates 10000,100000,max] [--pacers spin,sleep] [--seconds 3] [--json out.json]

The pacer process `bench` and `replay` use (hft_infer.replay.pacer_proc,
placed as hft_infer.app.launcher.plan_harness places it: with 4 or more cores
on a core of its own, its I/O thread on the helper cores) publishes
pre-encoded synthetic quotes on an ipc XPUB while a subscriber process drains
them (on the collector's core), so that the frames really leave the process.
Its lateness goes into an HDR histogram: p50/p99/p99.9/max, plus the achieved
rate. `max` sends as fast as possible (all intended times zero: the lateness
is then the queueing of the send loop itself).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from benchlib import table, write_json

from hft_infer.app.launcher import plan_harness
from hft_infer.config import load_config
from hft_infer.metrics import new_histogram, record_array, summarize
from hft_infer.replay.child import Child, wait_replies
from hft_infer.replay.pacer import as_fast_as_possible, constant_rate, encode_feed, save_feed
from hft_infer.replay.synthetic import SyntheticConfig, generate

DRAIN = """
import os, sys, zmq
if sys.argv[3] != "-":
    os.sched_setaffinity(0, {int(sys.argv[3])})
s = zmq.Context().socket(zmq.SUB); s.setsockopt(zmq.RCVHWM, 0); s.setsockopt(zmq.SUBSCRIBE, b"")
s.connect(sys.argv[1]); n = 0; want = int(sys.argv[2])
while n < want and s.poll(10000):
    while True:
        try:
            s.recv(zmq.NOBLOCK)
        except zmq.Again:
            break
        n += 1
print(n // 2)
"""


def run(rate: str, seconds: float, spin: bool, plan, work: Path) -> dict:
    r = 500_000.0 if rate == "max" else float(rate)
    n = int(r * seconds)
    feed = encode_feed(generate(n, SyntheticConfig(instruments=64, seed=3, rate_hz=r)))
    save_feed(str(work / "feed.npz"), feed, as_fast_as_possible(n) if rate == "max" else constant_rate(n, r))
    ep = f"ipc://{work}/p.sock"
    pinned = plan.pacer_core is not None
    pacer = Child("pacer", "hft_infer.replay.pacer_proc",
                  ["--feed", str(work / "feed.npz"), "--endpoint", ep, "--out", str(work / "pace.npz"),
                   "--topics", "1", "--io-cores", ",".join(map(str, plan.helper_cores)) if pinned else "",
                   *(["--core", str(plan.pacer_core)] if pinned else []), *(["--spin"] if spin else [])],
                  work / "pacer.log")
    try:
        wait_replies({pacer: "bound"}, 120)
        drain = subprocess.Popen([sys.executable, "-c", DRAIN, ep, str(2 * n),
                                  str(plan.collector_cores[0]) if pinned else "-"], stdout=subprocess.PIPE, text=True)
        wait_replies({pacer: "subscribed"}, 60)
        pacer.send("go", time.perf_counter_ns() + 200_000_000)
        wait_replies({pacer: "done"}, seconds * 5 + 60, on_line=lambda c, ln: None)
        got = int(drain.communicate(timeout=120)[0] or 0)
    finally:
        pacer.close()
    with np.load(work / "pace.npz") as z:
        late = z["actual"][: int(z["sent"])] - z["intended"][: int(z["sent"])]
        sent, elapsed = int(z["sent"]), float(z["elapsed_s"])
    h = new_histogram()
    record_array(h, late)
    return {"rate": rate, "pacer": "spin" if spin else "sleep", "core": plan.pacer_core, "sent": sent,
            "received": got, "rate_achieved": (sent - 1) / elapsed if sent > 1 else 0.0, "lateness": summarize(h)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="10000,100000,max")
    ap.add_argument("--pacers", default="spin,sleep")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    plan = plan_harness(load_config(None, []), "auto", 1)
    work = Path(tempfile.mkdtemp(prefix="hft-pace-", dir="/tmp"))
    rows = [run(rate, a.seconds, p == "spin", plan, work) for rate in a.rates.split(",") for p in a.pacers.split(",")]
    print(f"pacer process on core {plan.pacer_core}, drain on core {plan.collector_cores[0]} ({os.cpu_count()} cores)")
    print(table(["rate", "pacer", "achieved/s", "late p50 µs", "p99 µs", "p99.9 µs", "max µs", "received"],
                [[r["rate"], r["pacer"], r["rate_achieved"]]
                 + [r["lateness"][k] for k in ("p50_us", "p99_us", "p999_us", "max_us")] + [r["received"]]
                 for r in rows]))
    if a.json:
        write_json(a.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
