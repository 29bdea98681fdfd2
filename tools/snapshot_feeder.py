"""A stand-in for the hot loop's accounting: synthetic latencies, real snapshots.

Dev and test tool. It records synthetic per-stage latencies into the same
`metrics.StageHistograms` the service uses, folds them each interval into
sparse counts and ships real `Snapshot`s over a real PUSH socket with the
service's socket options (ZMQ_IMMEDIATE, small HWM, NOBLOCK; a failed send
is counted as control_dropped). The load and the latencies drift slowly
(a 30 s cycle) so that a dashboard has something that moves.

    python tools/snapshot_feeder.py --connect ipc:///tmp/x/control.sock --interval-ms 200
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time

import numpy as np

from hft_infer.metrics import SERVICE_STAGES, StageHistograms, to_wire
from hft_infer.transport.stats import COUNTERS, GAUGES, Snapshot, encode_snapshot

# Median latency (ns) and lognormal sigma per stage, roughly what the CPU
# engine shows on the dev VM.
_STAGE_SHAPE = {"wire": (35_000, 0.35), "ingest": (1_800, 0.25), "queue": (12_000, 0.8),
                "step": (85_000, 0.3), "publish": (4_000, 0.3), "loop_gap": (3_000, 0.5)}


class SyntheticService:
    def __init__(self, *, rate: float = 20_000, seed: int = 1, name: str = "feeder",
                 highest_ns: int = 60_000_000_000, digits: int = 3, cycle_s: float = 30.0,
                 interval_s: float = 1.0) -> None:
        self.rate = rate
        self.rng = np.random.default_rng(seed)
        self.name = name
        self.cycle_s = cycle_s
        self.highest_ns = highest_ns
        self.digits = digits
        # Room for a busy interval (Poisson and the load cycle stay well under 3x).
        capacity = max(4096, int(3 * rate * interval_s))
        self.hists = StageHistograms(SERVICE_STAGES, capacity=capacity, highest_ns=highest_ns, digits=digits)
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.by_reason = {"STALE": 0, "QUEUE_FULL": 0, "DECODE_ERROR": 0, "UNKNOWN_INSTRUMENT": 0}
        self.t0 = time.time()

    def _phase(self, now_s: float) -> float:
        return math.sin(2 * math.pi * (now_s - self.t0) / self.cycle_s)

    def step(self, now_ns: int, interval_ns: int, final: bool = False) -> Snapshot:
        """Record one interval's worth of synthetic events and return its snapshot."""
        rng = self.rng
        phase = self._phase(now_ns / 1e9)
        n = int(rng.poisson(self.rate * (1.0 + 0.3 * phase) * interval_ns / 1e9))
        slow = 1.0 + 0.25 * phase  # latencies breathe with the load
        samples = {}
        for stage, (median, sigma) in _STAGE_SHAPE.items():
            v = rng.lognormal(math.log(median * slow), sigma, n)
            spikes = rng.random(n) < 2e-3  # the tail the nines axis is for
            v[spikes] *= rng.uniform(5, 40, int(spikes.sum()))
            samples[stage] = v.astype(np.int64)
        samples["service"] = (samples["ingest"] + samples["queue"] + samples["step"] + samples["publish"]
                              + rng.integers(500, 3_000, n))
        for stage, v in samples.items():
            self.hists.buffers[stage].add_many(v)
        folded = self.hists.take_interval()

        rejected = int(rng.binomial(n, 2e-4))
        shed = int(rng.binomial(n, 1e-3 * (1.5 + phase)))
        conflated = int(rng.binomial(n, 0.05))
        c = self.counters
        c["received"] += n
        c["rejected"] += rejected
        c["shed"] += shed
        c["conflated"] += conflated
        c["decided"] += n - rejected - shed - conflated
        c["batches"] += max(1, n // 8)
        c["heartbeats"] += int(interval_ns // 1_000_000_000) or 1
        c["egress_dropped"] += int(rng.binomial(n, 1e-5))
        c["hot_preemptions"] += (p := int(rng.poisson(0.5)))
        c["hot_runqueue_wait_us"] += 40 * p
        self.by_reason["STALE"] += shed - (q := int(rng.binomial(shed, 0.2)))
        self.by_reason["QUEUE_FULL"] += q
        self.by_reason["DECODE_ERROR"] += rejected - (u := int(rng.binomial(rejected, 0.5)))
        self.by_reason["UNKNOWN_INSTRUMENT"] += u
        gauges = dict.fromkeys(GAUGES, 0.0)
        gauges["queue_depth"] = float(rng.poisson(4 * (1.5 + phase)))
        gauges["batch_wait_us"] = 0.0
        gauges["last_batch_size"] = float(rng.integers(1, 16))
        gauges["rss_bytes"] = 350e6
        gauges["admit_depth"] = float(rng.integers(1, 65))
        gauges["admit_margin_us"] = 250.0 if shed else 0.0  # no draw: the random stream stays as it was
        return Snapshot(service=self.name, pid=os.getpid(), ts_ns=now_ns, interval_ns=interval_ns,
                        engine="eager", engine_reason="synthetic feeder (no model)", precision="fp32",
                        model_version="synthetic", counters=dict(c), rejected_by_reason=dict(self.by_reason),
                        gauges=gauges, stages={s: to_wire(ic) for s, ic in folded.items()},
                        histogram_highest_ns=self.highest_ns, histogram_digits=self.digits, final=final)


def open_push(ctx, endpoint: str):
    """The service's control socket: never waits for an absent or slow peer."""
    import zmq

    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.IMMEDIATE, 1)  # no queueing for a peer that is not connected
    sock.setsockopt(zmq.SNDHWM, 4)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def main(argv: list[str] | None = None) -> int:
    import zmq

    p = argparse.ArgumentParser(prog="python tools/snapshot_feeder.py", description=__doc__.splitlines()[0])
    p.add_argument("--connect", required=True, metavar="ENDPOINT", help="the control process's endpoint")
    p.add_argument("--interval-ms", type=float, default=1000.0, help="snapshot interval (default 1000)")
    p.add_argument("--rate", type=float, default=20_000, help="synthetic events/s (default 20000)")
    p.add_argument("--count", type=int, default=0, help="stop after this many snapshots (0: until SIGTERM)")
    p.add_argument("--name", default="feeder", help="service name in the snapshots")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)

    stop = False

    def on_signal(signum, frame):  # only flips state
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    ctx = zmq.Context()
    sock = open_push(ctx, args.connect)
    svc = SyntheticService(rate=args.rate, seed=args.seed, name=args.name, interval_s=args.interval_ms / 1e3)
    interval_ns = int(args.interval_ms * 1e6)
    next_ns = time.time_ns() + interval_ns
    sent = 0
    while not stop and (args.count <= 0 or sent < args.count):
        time.sleep(max(0.0, (next_ns - time.time_ns()) / 1e9))
        snap = svc.step(next_ns, interval_ns)
        next_ns += interval_ns
        try:
            sock.send(encode_snapshot(snap), zmq.NOBLOCK)
            sent += 1
        except zmq.Again:
            svc.counters["control_dropped"] += 1
    # The last, final snapshot, as a stopping service sends it.
    try:
        sock.send(encode_snapshot(svc.step(time.time_ns(), interval_ns, final=True)), zmq.NOBLOCK)
    except zmq.Again:
        pass
    sock.close(linger=500)  # give the final snapshot a moment to leave
    ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
