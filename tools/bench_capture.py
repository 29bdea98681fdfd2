#!/usr/bin/env python3
"""Publish throughput from a capture file: how fast can a replay put frames on the wire?

    python tools/bench_capture.py [--capture FILE] [--events 500000] [--levels 10] [--repeat 5] [--cpu N]

Without --capture it builds one: 100,000 distinct Quote/Trade messages
(topic frame + msgpack payload, 10-level quotes ~190 bytes) written over and
over up to --events records, through CaptureWriter, so writing and reading
are measured too. Then it reads the capture back and publishes every record
over an ipc:// PUB as fast as possible, in several ways:

- multipart:     sock.send_multipart([topic, payload]) per message
- sndmore:       sock.send(topic, SNDMORE); sock.send(payload), methods bound to locals
- zero-copy:     sndmore with copy=False (zmq wraps the bytes instead of copying)
- direct:        sndmore through the compiled backend's send, bound once, with
                 positional arguments (`direct_send` below): skips pyzmq's
                 Python-level wrapper and the keyword-argument parsing
- direct+clock:  direct plus one time.monotonic_ns() per message (the least a
                 pacer adds: it has to read the clock to know when to send)

each with no subscriber (libzmq drops at once: the cost of the Python call
and the API alone) and with a SUB in another process that counts what it
gets (the real case: the frames go through the pipe, libzmq's I/O thread and
the ipc socket, and on a 2-core machine the subscriber and both I/O threads
compete with the publisher for the cores). The publishing thread is pinned to
one core (--cpu, default the last one) after the zmq context exists, so that
the context's I/O thread may run elsewhere (DESIGN.md: a busy thread that
shares its core with the I/O thread starves it).

Figures are messages (records) per second, the median of --repeat runs.
Finally an `hft-infer record` subprocess records one direct publish of the
whole capture, to show whether the recorder keeps up with a replay.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import zmq
from benchlib import table, write_json

from hft_infer.replay.capture import CaptureWriter, capture_info, read_capture
from hft_infer.replay.events import KIND_QUOTE, KIND_TRADE, empty_events, encode_frames

TARGET = 500_000  # events/s, issue 7

_SUBSCRIBER = r"""
import sys, zmq
ctx = zmq.Context()
s = ctx.socket(zmq.SUB)
s.setsockopt(zmq.RCVHWM, 0)
s.setsockopt(zmq.SUBSCRIBE, b"")
s.connect(sys.argv[1])
n = 0
recv = s.recv_multipart
while True:
    m = recv()
    if m[0] == b"END":
        break
    n += 1
print(n, flush=True)
"""


def build_messages(n_distinct: int, levels: int) -> list[tuple[bytes, bytes]]:
    rng = np.random.default_rng(7)
    ev = empty_events(n_distinct, levels)
    ev["ts_exchange_ns"] = 1_700_000_000_000_000_000 + np.arange(n_distinct) * 1000
    ev["instrument"] = rng.integers(0, 64, n_distinct)
    ev["seq"] = np.arange(n_distinct)
    trade = rng.random(n_distinct) < 0.2
    ev["kind"] = np.where(trade, KIND_TRADE, KIND_QUOTE)
    ev["n_levels"] = np.where(trade, 0, levels)
    ev["book"] = np.where(trade[:, None, None], 0, 100 + rng.random((n_distinct, levels, 4))).astype(np.float32)
    ev["price"] = np.where(trade, 100 + rng.random(n_distinct), 0)
    ev["size"] = np.where(trade, 10, 0)
    ev["side"] = np.where(trade, 1, 0)
    return encode_frames(ev, ts_send_ns=ev["ts_exchange_ns"])


def write_bench_capture(path: str, n: int, levels: int) -> float:
    msgs = build_messages(min(n, 100_000), levels)
    t0 = time.perf_counter()
    with CaptureWriter(path, endpoint="bench", overwrite=True) as w:
        add, k, base = w.add, len(msgs), time.time_ns()
        for i in range(n):
            add(base + i, msgs[i % k])
    return n / (time.perf_counter() - t0)


def direct_send(sock: zmq.Socket):
    """`sock.send` without pyzmq's Python layer: the compiled backend method, bound.

    zmq.Socket.send (zmq/sugar/socket.py) is a Python function that handles
    the draft sockets' routing_id/group and then calls the Cython backend's
    send with keyword arguments. Called directly, positionally, as
    send(data, flags, copy, track), the same send costs about half as much
    (measured here: ~0.45 vs ~1.1 us a frame on the loaded 2-core dev VM).
    Falls back to sock.send if pyzmq's class layout changes.
    """
    for klass in type(sock).__mro__[1:]:
        if klass.__module__.startswith("zmq.backend") and "send" in vars(klass):
            return klass.send.__get__(sock)
    return sock.send


def run_direct(sock, topics, payloads) -> None:
    send, more = direct_send(sock), int(zmq.SNDMORE)  # a plain int: IntFlag arithmetic is slow
    for t, p in zip(topics, payloads):
        send(t, more, True, False)
        send(p, 0, True, False)


def run_direct_clock(sock, topics, payloads) -> None:
    send, more, clock = direct_send(sock), int(zmq.SNDMORE), time.monotonic_ns
    last = 0
    for t, p in zip(topics, payloads):
        last = clock()
        send(t, more, True, False)
        send(p, 0, True, False)
    return last


def run_sndmore(sock, topics, payloads) -> None:
    send, more = sock.send, zmq.SNDMORE
    for t, p in zip(topics, payloads):
        send(t, more)
        send(p)


def run_multipart(sock, topics, payloads) -> None:
    send = sock.send_multipart
    for t, p in zip(topics, payloads):
        send([t, p])


def run_zero_copy(sock, topics, payloads) -> None:
    send, more = sock.send, zmq.SNDMORE
    for t, p in zip(topics, payloads):
        send(t, more, copy=False)
        send(p, copy=False)


VARIANTS = {"multipart": run_multipart, "sndmore": run_sndmore, "zero-copy": run_zero_copy,
            "direct": run_direct, "direct+clock": run_direct_clock}


def publish(ctx, endpoint: str, fn, topics, payloads, subscriber: bool,
            subscriber_cpus: set[int]) -> tuple[float, int | None]:
    """One timed run: messages/s, and what the subscriber counted (None without one)."""
    sock = ctx.socket(zmq.XPUB if subscriber else zmq.PUB)
    sock.setsockopt(zmq.SNDHWM, 0)  # as open_publisher: never drop, a slow subscriber costs memory
    sock.setsockopt(zmq.LINGER, -1)
    sock.bind(endpoint)
    proc = None
    try:
        if subscriber:
            # An XPUB is libzmq's PUB plus subscription reporting: wait for the
            # subscription so that nothing is lost to the slow-joiner window.
            # A child inherits the pinned publisher's affinity: give it the other cores.
            proc = subprocess.Popen([sys.executable, "-c", _SUBSCRIBER, endpoint], stdout=subprocess.PIPE,
                                    text=True, preexec_fn=lambda: os.sched_setaffinity(0, subscriber_cpus))
            if not sock.poll(30_000):
                raise RuntimeError("subscriber never subscribed")
            sock.recv()
        t0 = time.perf_counter()
        fn(sock, topics, payloads)
        dt = time.perf_counter() - t0
        got = None
        if proc is not None:
            sock.send_multipart([b"END", b""])
            got = int(proc.communicate(timeout=600)[0].strip())
        return len(topics) / dt, got
    finally:
        sock.close()
        if proc is not None and proc.poll() is None:
            proc.kill()


def bench_record(ctx, tmp: str, topics, payloads, recorder_cpus: set[int]) -> dict:
    """`hft-infer record` (a subprocess on the other cores) recording a direct publish of the capture.

    The recorder's rate is its first-to-last receive time; with RCVHWM 0 on
    its side and SNDHWM 0 here nothing may be lost, only delayed.
    """
    ep, out = f"ipc://{tmp}/record.sock", os.path.join(tmp, "recorded.cap")
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.setsockopt(zmq.LINGER, -1)
    pub.bind(ep)
    proc = subprocess.Popen([sys.executable, "-m", "hft_infer", "record", "--endpoint", ep, "--out", out,
                             "--count", str(len(topics)), "--force"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: os.sched_setaffinity(0, recorder_cpus))
    try:
        if not pub.poll(60_000):
            raise RuntimeError("recorder never subscribed")
        pub.recv()
        t0 = time.perf_counter()
        run_direct(pub, topics, payloads)
        publish_rate = len(topics) / (time.perf_counter() - t0)
        _, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"recorder failed: {err.strip()}")
    finally:
        pub.close()
        if proc.poll() is None:
            proc.kill()
    info = capture_info(out)
    return {"published_per_s": publish_rate, "recorded": info["records"],
            "recorded_per_s": info["records"] / info["duration_s"] if info["duration_s"] else 0.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capture", help="an existing capture file (default: build one)")
    ap.add_argument("--events", type=int, default=500_000, help="records in the built capture")
    ap.add_argument("--levels", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cpu", type=int, default=None, help="core for the publishing thread (default: last)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    ap.add_argument("--no-subscriber-runs", action="store_true")
    ap.add_argument("--no-record-run", action="store_true", help="skip recording the publish with `hft-infer record`")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="hft-bc-", dir="/tmp")
    result: dict = {"host_cpus": os.cpu_count()}
    path = args.capture
    if path is None:
        path = os.path.join(tmp, "bench.cap")
        result["write_records_per_s"] = write_bench_capture(path, args.events, args.levels)
    info = capture_info(path)
    t0 = time.perf_counter()
    cap = read_capture(path)
    result["read_records_per_s"] = len(cap) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    msgs = cap.messages()
    if any(len(m) != 2 for m in msgs):
        print("this benchmark publishes topic-framed (2-frame) captures only", file=sys.stderr)
        return 2
    topics = [m[0] for m in msgs]
    payloads = [m[1] for m in msgs]
    del msgs
    result["build_send_lists_s"] = time.perf_counter() - t0
    result["records"] = len(cap)
    result["mean_payload_bytes"] = (info["frame_bytes"] - 4 * info["records"]) / max(info["records"], 1)
    del cap

    ctx = zmq.Context()  # before pinning: its I/O thread keeps the process's full CPU set
    cpus = sorted(os.sched_getaffinity(0))
    cpu = args.cpu if args.cpu is not None else cpus[-1]
    os.sched_setaffinity(0, {cpu})
    others = set(cpus) - {cpu} or {cpu}
    result["publisher_cpu"] = cpu
    result["subscriber_cpus"] = sorted(others)

    # Round robin over the variants, so that load from other processes on a
    # shared machine lands on all of them alike; "best" is the least
    # disturbed run (interference only ever slows a run down).
    cases = [(name, sub) for name in args.variants.split(",")
             for sub in ((False,) if args.no_subscriber_runs else (False, True))]
    rates: dict = {c: [] for c in cases}
    received: dict = {c: [] for c in cases}
    for r in range(args.repeat):
        for name, sub in cases:
            ep = f"ipc://{tmp}/bench-{name}-{int(sub)}-{r}.sock"
            rate, got = publish(ctx, ep, VARIANTS[name], topics, payloads, sub, others)
            rates[(name, sub)].append(rate)
            received[(name, sub)].append(got)
    if not args.no_record_run:
        result["record"] = bench_record(ctx, tmp, topics, payloads, others)
    ctx.term()
    rows = [{"variant": name, "subscriber": sub, "msgs_per_s": statistics.median(rates[(name, sub)]),
             "min": min(rates[(name, sub)]), "best": max(rates[(name, sub)]),
             "received_all": all(g == len(topics) for g in received[(name, sub)]) if sub else None}
            for name, sub in cases]
    result["runs"] = rows
    result["load_average"] = os.getloadavg()

    print(f"capture: {result['records']:,} records, ~{result['mean_payload_bytes']:.0f}-byte payloads; "
          f"publisher pinned to cpu {cpu} of {result['host_cpus']}, subscriber on {sorted(others)}")
    if "write_records_per_s" in result:
        print(f"write capture: {result['write_records_per_s']:,.0f} records/s")
    print(f"read capture:  {result['read_records_per_s']:,.0f} records/s "
          f"(+ {result['build_send_lists_s']:.2f} s to build the send lists)")
    print()
    print(table(["variant", "subscriber", "median msgs/s", "min", "best", f">= {TARGET:,} (median)", "received"],
                [[r["variant"], r["subscriber"], f"{r['msgs_per_s']:,.0f}", f"{r['min']:,.0f}", f"{r['best']:,.0f}",
                  r["msgs_per_s"] >= TARGET,
                  "-" if r["received_all"] is None else ("all" if r["received_all"] else "LOSS")] for r in rows]))
    if "record" in result:
        r = result["record"]
        print(f"\nhft-infer record (other cores) of a direct publish: recorded {r['recorded']:,} of "
              f"{result['records']:,} at {r['recorded_per_s']:,.0f} msgs/s (published at {r['published_per_s']:,.0f})")
    la = result["load_average"]
    print(f"\nload average at the end: {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} on {result['host_cpus']} cpus "
          "(other processes share these cores: compare medians run side by side, not across runs)")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
