#!/usr/bin/env python3
"""Which payload for the iceoryx2 transport: the msgpack frame in a [u8] slice, or a fixed-layout record?

    python tools/bench_shm.py [--n 20000] [--cores 0,1] [--json OUT]

Round trips between two Python processes, one Quote of 10 levels (the frame the ingest reads,
~190 bytes) there and back, each side busy-polling (pinned to --cores when given), for:

- `zmq ipc`:            ZeroMQ PAIR over ipc, recv(NOBLOCK) spin, the msgpack frame (today's wire);
- `iox2 frame`:         iceoryx2 publish-subscribe, [u8] slice holding the same msgpack frame,
                        copied out and decoded with the ingest's msgspec decoder (what the
                        service does: transport/shm.py, one codec for both transports);
- `iox2 record`:        iceoryx2 publish-subscribe, a fixed-layout ctypes record (the Quote's
                        fields, the book as float32[40]) written and read in place, no decode.

Each echo side receives, turns the message into what the ingest needs (instrument, seq,
ts_send_ns and the book as a float32 view) and sends the same message back. Prints p50 / p99 /
p99.9 / max of the round trip in µs and each row's ratios to `zmq ipc`. Two busy-polling
processes: run it alone (on the 2-core dev VM it shares the machine with anything else
running). Needs the shm extra (`pip install 'hft-infer[shm]'`).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import time
import uuid

import numpy as np
from benchlib import write_json

LEVELS = 10
KINDS = ("zmq ipc", "iox2 frame", "iox2 record")


class QuoteRecord(ctypes.Structure):
    """The fixed-layout alternative: the Quote's fields at fixed offsets, read in place."""

    _fields_ = [("instrument", ctypes.c_uint32), ("n_levels", ctypes.c_uint32), ("seq", ctypes.c_uint64),
                ("ts_exchange_ns", ctypes.c_int64), ("ts_send_ns", ctypes.c_int64), ("priority", ctypes.c_int32),
                ("_pad", ctypes.c_uint32), ("book", ctypes.c_float * (4 * LEVELS))]


def _frame() -> bytes:
    from hft_infer.transport.codec import encode, pack_book
    from hft_infer.transport.schema import Quote

    book = np.tile(np.array([[99.9, 5.0, 100.1, 7.0]], np.float32), (LEVELS, 1))
    return encode(Quote(7, 1, 1, time.time_ns(), LEVELS, pack_book(book), -1))


def _pin(core: int | None) -> None:
    if core is not None:  # not checked against our own mask: an echo inherits the parent's pinning
        try:
            os.sched_setaffinity(0, {core})
        except OSError as e:
            print(f"bench_shm: cannot pin to core {core}: {e.strerror}", file=sys.stderr)


# --------------------------------------------------------------------------- the three transports

class Zmq:
    def __init__(self, tag: str, server: bool) -> None:
        import zmq

        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PAIR)
        self.sock.setsockopt(zmq.LINGER, 0)
        path = f"ipc:///tmp/bench-shm-{tag}.sock"
        self.sock.bind(path) if server else self.sock.connect(path)
        self._again, self._nb = zmq.Again, int(zmq.NOBLOCK)

    def send(self, data) -> None:
        self.sock.send(data, self._nb)

    def recv(self):
        while True:
            try:
                return self.sock.recv(self._nb)
            except self._again:
                pass

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


class _Spin:
    """The iceoryx2 rows' shared half: spin on `self._poll` until a message, release the ports."""

    def recv(self):
        poll = self._poll
        while (got := poll()) is None:
            pass
        return got

    def close(self) -> None:
        for port in (self.pub, self.sub):
            if hasattr(port, "close"):  # transport/shm.py's wrappers
                port.close()
            else:  # raw iceoryx2 ports
                port.delete()


class IoxFrame(_Spin):
    """transport/shm.py as the service uses it: bytes in a [u8] slice."""

    def __init__(self, tag: str, server: bool) -> None:
        from hft_infer.transport.shm import ShmPublisher, ShmSubscriber

        out, back = f"bench-shm/{tag}/a", f"bench-shm/{tag}/b"
        self.pub = ShmPublisher(out if server else back, buffer=64, role="bench")
        self.sub = ShmSubscriber(back if server else out, buffer=64, role="bench")
        self._poll = self.sub.recv

    def send(self, data) -> None:
        self.pub.send(data)


class IoxRecord(_Spin):
    """A fixed-layout record: written field by field into the loaned sample, read in place."""

    def __init__(self, tag: str, server: bool) -> None:
        import iceoryx2 as iox

        iox.set_log_level(iox.LogLevel.Error)
        self.iox = iox
        self.node = iox.NodeBuilder.new().create(iox.ServiceType.Ipc)

        def service(name):
            return (self.node.service_builder(iox.ServiceName.new(name)).publish_subscribe(QuoteRecord)
                    .enable_safe_overflow(False).subscriber_max_buffer_size(64).open_or_create())

        out, back = f"bench-shm/{tag}/ra", f"bench-shm/{tag}/rb"
        self.pub = service(out if server else back).publisher_builder().backpressure_strategy(
            iox.BackpressureStrategy.DiscardData).create()
        self.sub = service(back if server else out).subscriber_builder().buffer_size(64).create()
        self._poll = self.sub.receive

    def send(self, rec) -> None:
        sample = self.pub.loan_uninit()
        ctypes.memmove(sample.payload_ptr, ctypes.addressof(rec), ctypes.sizeof(QuoteRecord))
        sample.assume_init().send()


TRANSPORTS = {"zmq ipc": Zmq, "iox2 frame": IoxFrame, "iox2 record": IoxRecord}


# --------------------------------------------------------------------------- both sides

def echo(kind: str, tag: str, n: int, core: int | None) -> None:
    """The child: receive, take what the ingest needs, send the same message back."""
    _pin(core)
    t = TRANSPORTS[kind](tag, server=False)
    print("ready", flush=True)
    if kind == "iox2 record":
        rec = QuoteRecord()
        for _ in range(n):
            sample = t.recv()
            r = QuoteRecord.from_address(sample.payload_ptr)  # in place: no decode, no copy
            _ = (r.instrument, r.seq, r.ts_send_ns, np.frombuffer(r.book, np.float32))
            ctypes.memmove(ctypes.addressof(rec), sample.payload_ptr, ctypes.sizeof(QuoteRecord))
            sample.delete()
            t.send(rec)
    else:
        from hft_infer.transport.codec import IngressDecoder

        decode = IngressDecoder().decode
        for _ in range(n):
            data = t.recv()
            q = decode(data)
            _ = (q.instrument, q.seq, q.ts_send_ns, np.frombuffer(q.book, np.float32))
            t.send(data)
    time.sleep(0.2)
    t.close()


def measure(kind: str, n: int, warmup: int, cores: list[int]) -> np.ndarray:
    tag = uuid.uuid4().hex[:8]
    child = subprocess.Popen([sys.executable, __file__, "--child", kind, "--tag", tag, "--n", str(n + warmup),
                              *(["--core", str(cores[1])] if len(cores) > 1 else [])],
                             stdout=subprocess.PIPE, text=True)
    try:
        _pin(cores[0] if cores else None)
        t = TRANSPORTS[kind](tag, server=True)
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # the child's ports connect
        if kind == "iox2 record":
            msg = QuoteRecord(7, LEVELS, 1, 1, time.time_ns(), -1)
        else:
            msg = _frame()
        out = np.empty(n + warmup, np.int64)
        perf = time.perf_counter_ns
        for i in range(n + warmup):
            t0 = perf()
            t.send(msg)
            got = t.recv()
            out[i] = perf() - t0
            if kind == "iox2 record":
                got.delete()
        t.close()
    finally:
        child.wait(30)
    return out[warmup:]


def stats(ns: np.ndarray) -> dict:
    us = ns / 1000.0
    return {"p50": float(np.percentile(us, 50)), "p99": float(np.percentile(us, 99)),
            "p99.9": float(np.percentile(us, 99.9)), "max": float(us.max()), "n": int(us.size)}


def table(rows: dict[str, dict]) -> str:
    base = rows.get("zmq ipc")
    lines = ["| payload / transport | round trip p50 µs | p99 | p99.9 | max | p50 vs zmq | p99 vs zmq |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for kind, s in rows.items():
        r50 = f"{s['p50'] / base['p50']:.2f}x" if base else "-"
        r99 = f"{s['p99'] / base['p99']:.2f}x" if base else "-"
        lines.append(f"| {kind} | {s['p50']:.1f} | {s['p99']:.1f} | {s['p99.9']:.1f} | {s['max']:.1f} "
                     f"| {r50} | {r99} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20_000, help="round trips per row (default 20000)")
    ap.add_argument("--warmup", type=int, default=2_000)
    ap.add_argument("--cores", default="", help="two cores: this process and the echo (default: not pinned)")
    ap.add_argument("--only", action="append", choices=KINDS, help="measure only these rows (repeatable)")
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    ap.add_argument("--tag", help=argparse.SUPPRESS)
    ap.add_argument("--core", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        echo(a.child, a.tag, a.n, a.core)
        return 0
    try:
        import iceoryx2  # noqa: F401
    except ImportError:
        print("bench_shm: needs iceoryx2: pip install 'hft-infer[shm]'", file=sys.stderr)
        return 2
    cores = [int(c) for c in a.cores.split(",") if c]
    rows = {}
    for kind in a.only or KINDS:
        rows[kind] = stats(measure(kind, a.n, a.warmup, cores))
        print(f"bench_shm: {kind}: p50 {rows[kind]['p50']:.1f} µs", file=sys.stderr, flush=True)
    frame = _frame()
    print(f"bench_shm: {a.n:,} round trips of a {LEVELS}-level Quote ({len(frame)} bytes as msgpack, "
          f"{ctypes.sizeof(QuoteRecord)} as a record), cores {a.cores or 'not pinned'}, "
          f"{os.cpu_count()} CPUs on {os.uname().nodename}")
    print(table(rows))
    if a.json:  # the rows beside where and how they were measured (commit, machine, versions)
        write_json(a.json, {"rows": rows, "n": a.n, "cores": a.cores, "frame_bytes": len(frame),
                            "record_bytes": ctypes.sizeof(QuoteRecord)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
