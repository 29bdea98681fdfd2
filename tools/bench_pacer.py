#!/usr/bin/env python3
"""Pacer accuracy: lateness (actual - intended send time) at several rates, spin vs sleep.

    python tools/bench_pacer.py [--rates 10000,100000,max] [--seconds 3] [--json out.json]

The pacer publishes pre-encoded synthetic quotes on an ipc PUB while a
subscriber process drains them (so the frames really leave the process), and
records its own lateness in an HDR histogram: p50/p99/p99.9/max, plus the
achieved rate. `max` sends as fast as possible (all intended times zero: the
lateness then is the queueing of the send loop itself).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

import zmq

from hft_infer.metrics import new_histogram, record_array, summarize
from hft_infer.replay.pacer import Pacer, as_fast_as_possible, constant_rate, encode_feed
from hft_infer.replay.synthetic import SyntheticConfig, generate

DRAIN = """
import sys, zmq
s = zmq.Context().socket(zmq.SUB); s.setsockopt(zmq.RCVHWM, 0); s.setsockopt(zmq.SUBSCRIBE, b"")
s.connect(sys.argv[1]); n = 0; want = int(sys.argv[2])
while n < want and s.poll(5000):
    while True:
        try:
            s.recv(zmq.NOBLOCK)
        except zmq.Again:
            break
        n += 1
print(n // 2)
"""


def run(rate: str, seconds: float, spin: bool) -> dict:
    r = 500_000.0 if rate == "max" else float(rate)
    n = int(r * seconds)
    feed = encode_feed(generate(n, SyntheticConfig(instruments=64, seed=3, rate_hz=r)))
    offsets = as_fast_as_possible(n) if rate == "max" else constant_rate(n, r)
    ep = f"ipc://{tempfile.mkdtemp(prefix='hft-pace-', dir='/tmp')}/p.sock"
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.bind(ep)
    drain = subprocess.Popen([sys.executable, "-c", DRAIN, ep, str(2 * n)], stdout=subprocess.PIPE, text=True)
    pub.poll(10_000)
    pub.recv()  # the drain has subscribed
    time.sleep(0.2)
    res = Pacer(pub, feed, offsets, spin=spin).run()
    got = int(drain.communicate(timeout=120)[0] or 0)
    ctx.destroy(linger=0)
    h = new_histogram()
    record_array(h, res.lateness_ns)
    return {"rate": rate, "pacer": "spin" if spin else "sleep", "sent": res.sent, "received": got,
            "rate_achieved": res.rate_achieved, "lateness": summarize(h)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="10000,100000,max")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = [run(rate, a.seconds, spin) for rate in a.rates.split(",") for spin in (True, False)]
    print(f"{'rate':>7s} {'pacer':6s} {'achieved/s':>10s} {'late p50 µs':>11s} {'p99':>8s} {'p99.9':>8s} "
          f"{'max':>8s} {'received':>9s}")
    for r in rows:
        s = r["lateness"]
        print(f"{r['rate']:>7s} {r['pacer']:6s} {r['rate_achieved']:10.0f} {s['p50_us']:11.1f} {s['p99_us']:8.1f} "
              f"{s['p999_us']:8.1f} {s['max_us']:8.1f} {r['received']:9d}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
