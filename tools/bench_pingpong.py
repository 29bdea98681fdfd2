#!/usr/bin/env python3
"""Raw ZeroMQ ipc ping-pong between two processes: the round trip the harness floor is compared with.

    python tools/bench_pingpong.py [--patterns pair,pubsub] [--n 100000] [--cores C,S] [--poll auto|spin|block]
                                   [--json out.json]

Two processes on one host, ipc://, a ~170-byte message out (a 10-level
quote's size) and a ~63-byte one back (a one-row DecisionBatch's size):

- `pair`: one PAIR socket each way: the rawest round trip ZeroMQ offers.
- `pubsub`: the harness's shape: the client's XPUB -> the server's SUB, and the
  server's XPUB -> the client's SUB, each message a topic frame + a payload
  (the pacer -> service -> collector path, minus the service's work).

The client records each round trip (send -> reply received, CLOCK_MONOTONIC)
after --warmup round trips; percentiles in µs. Placement as `bench` does it
(hft_infer.app.launcher.plan_harness): with 4 or more cores the client takes
the pacer's core and the server the collector's, libzmq's I/O threads the
helper cores, and both busy-poll; with fewer, nothing is pinned and both block
in zmq_poll (two spinning processes on two cores measure the scheduler).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import zmq
from benchlib import table, write_json

from hft_infer.metrics import new_histogram, record_array, summarize
from hft_infer.replay.child import pin_self, set_timer_slack, zmq_context

OUT_BYTES, BACK_BYTES = 170, 63
TOPIC = b"\x00\x00\x00\x07"
NB = int(zmq.NOBLOCK)
MORE = int(zmq.SNDMORE)


def _sockets(ctx: zmq.Context, pattern: str, endpoint: str, server: bool):
    """(send socket, recv socket) for one side."""
    if pattern == "pair":
        s = ctx.socket(zmq.PAIR)
        (s.bind if server else s.connect)(endpoint + ".pair")
        return s, s
    out = ctx.socket(zmq.XPUB)
    out.setsockopt(zmq.SNDHWM, 0)
    out.bind(endpoint + (".s2c" if server else ".c2s"))
    inp = ctx.socket(zmq.SUB)
    inp.setsockopt(zmq.SUBSCRIBE, b"")
    inp.connect(endpoint + (".c2s" if server else ".s2c"))
    return out, inp


def _recv(sock, spin: bool, frames: int):
    """Receive one message of `frames` frames, spinning on NOBLOCK or blocking in recv."""
    if spin:
        while True:
            try:
                first = sock.recv(NB)
                break
            except zmq.Again:
                pass
    else:
        first = sock.recv()
    return sock.recv() if frames == 2 else first


def _send(sock, payload: bytes, frames: int) -> None:
    if frames == 2:
        sock.send(TOPIC, MORE)
    sock.send(payload)


def _wait_subscribed(out) -> None:
    if out.socket_type == zmq.XPUB:
        out.recv()  # the peer's subscription has arrived: nothing sent from now on is dropped


def serve(a: argparse.Namespace) -> int:
    set_timer_slack()
    ctx = zmq_context([int(c) for c in a.io_cores.split(",") if c])
    pin_self(a.core)
    out, inp = _sockets(ctx, a.pattern, a.endpoint, server=True)
    frames = 2 if a.pattern == "pubsub" else 1
    back = bytes(BACK_BYTES)
    print("ready", flush=True)
    _wait_subscribed(out)
    for _ in range(a.total):
        _recv(inp, a.spin, frames)
        _send(out, back, frames)
    time.sleep(0.2)
    return 0


def client(pattern: str, n: int, warmup: int, cores: tuple[int | None, int | None], io: list[int],
           spin: bool) -> dict:
    endpoint = f"ipc://{tempfile.mkdtemp(prefix='hft-pp-', dir='/tmp')}/pp"
    srv = subprocess.Popen([sys.executable, __file__, "--serve", "--pattern", pattern, "--endpoint", endpoint,
                            "--total", str(n + warmup), "--io-cores", ",".join(map(str, io)),
                            *(["--core", str(cores[1])] if cores[1] is not None else []),
                            *(["--spin"] if spin else [])], stdout=subprocess.PIPE, text=True)
    assert srv.stdout.readline().strip() == "ready"
    set_timer_slack()
    ctx = zmq_context(io)
    placed = pin_self(cores[0])
    out, inp = _sockets(ctx, pattern, endpoint, server=False)
    frames = 2 if pattern == "pubsub" else 1
    _wait_subscribed(out)
    time.sleep(0.3)  # the server's subscription to us travels too
    payload = bytes(OUT_BYTES)
    rtt = np.zeros(n, dtype=np.int64)
    perf = time.perf_counter_ns
    for i in range(warmup + n):
        t0 = perf()
        _send(out, payload, frames)
        _recv(inp, spin, frames)
        if i >= warmup:
            rtt[i - warmup] = perf() - t0
    srv.wait(timeout=30)
    ctx.destroy(linger=0)
    h = new_histogram()
    record_array(h, rtt)
    return {"pattern": pattern, "round_trips": n, "poll": "spin" if spin else "block", "client_core": cores[0],
            "server_core": cores[1], "io_cores": io, "client": placed, "rtt": summarize(h)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--patterns", default="pair,pubsub")
    ap.add_argument("--n", type=int, default=100_000, help="measured round trips per pattern")
    ap.add_argument("--warmup", type=int, default=2_000)
    ap.add_argument("--cores", help="CLIENT,SERVER cores (default: the harness's pacer and collector cores)")
    ap.add_argument("--poll", choices=("auto", "spin", "block"), default="auto")
    ap.add_argument("--json")
    # the server side (internal)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pattern", help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--total", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--core", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--io-cores", default="", help=argparse.SUPPRESS)
    ap.add_argument("--spin", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        return serve(a)
    from hft_infer.app.launcher import plan_harness
    from hft_infer.config import load_config

    plan = plan_harness(load_config(None, []), "auto", 1)
    if a.cores:
        c, s = (int(x) for x in a.cores.split(","))
        cores = (c, s)
        io = [x for x in sorted(os.sched_getaffinity(0)) if x not in cores]
    else:
        cores = (plan.pacer_core, plan.collector_cores[0])
        io = plan.helper_cores if plan.pacer_core is not None else []
    spin = a.poll == "spin" or (a.poll == "auto" and cores[0] is not None)
    rows = [client(p, a.n, a.warmup, cores, io, spin) for p in a.patterns.split(",")]
    print(f"ZeroMQ ipc round trip, {a.n:,} per pattern, {OUT_BYTES} B out / {BACK_BYTES} B back, "
          f"{'spinning' if spin else 'blocking'}, client core {cores[0]}, server core {cores[1]}, "
          f"io cores {','.join(map(str, io)) or '-'} ({os.cpu_count()} cores)")
    print(table(["pattern", "p50 µs", "p90 µs", "p99 µs", "p99.9 µs", "max µs"],
                [[r["pattern"]] + [r["rtt"][k] for k in ("p50_us", "p90_us", "p99_us", "p999_us", "max_us")]
                 for r in rows]))
    if a.json:
        write_json(a.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
