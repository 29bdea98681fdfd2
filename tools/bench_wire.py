#!/usr/bin/env python3
"""Wire microbenchmarks: decode cost per Quote design, and receive cost per API.

    python tools/bench_wire.py [--levels 10] [--n 200000] [--frames 100000]

1. Decode (+ getting the levels as float32 numbers) for a 10-level quote:
   - packed:  our schema, levels as one little-endian float32 `bin`, decoded
              into a memoryview and read with numpy.frombuffer;
   - list:    the same message with the levels as a msgpack array of floats,
              decoded into list[float] and turned into a float32 array;
   - json:    the list design in JSON through the standard library.
2. Receive cost for ~200-byte frames over ipc:// (PUSH -> PULL, in one
   process, the sender filling the pipe first so the receive is measured
   alone): recv() (copy into bytes), recv(copy=False) + frame.buffer, and
   recv_into a preallocated bytearray.

Each figure is the median of several timed repetitions, in ns per message.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import msgspec
import numpy as np
import zmq
from benchlib import table, write_json

from hft_infer.transport.codec import IngressDecoder, book_array, encode, pack_book, validate_quote
from hft_infer.transport.schema import Quote


class ListQuote(msgspec.Struct, tag=1, array_like=True, frozen=True, gc=False):
    instrument: int
    seq: int
    ts_exchange_ns: int
    ts_send_ns: int
    n_levels: int
    book: list[float]
    priority: int = -1


def _median_ns(fn, n: int, reps: int = 7) -> float:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(samples)


def bench_decode(levels: int, n: int) -> list[tuple[str, float, int]]:
    rng = np.random.default_rng(1)
    lv = (rng.random((levels, 4)) * 100 + 1).astype(np.float32)
    packed = encode(Quote(7, 1, 2, 3, levels, pack_book(lv)))
    as_list = msgspec.msgpack.encode(ListQuote(7, 1, 2, 3, levels, lv.reshape(-1).tolist()))
    as_json = json.dumps([1, 7, 1, 2, 3, levels, lv.reshape(-1).tolist()]).encode()

    dec = IngressDecoder().decode
    list_dec = msgspec.msgpack.Decoder(ListQuote).decode
    buf = bytearray(4096)
    buf[: len(packed)] = packed
    view = memoryview(buf)[: len(packed)]

    def packed_fn():
        book_array(dec(view))

    def packed_validated_fn():
        q = dec(view)
        validate_quote(q, 64)

    def list_fn():
        np.asarray(list_dec(as_list).book, dtype=np.float32)

    def json_fn():
        np.asarray(json.loads(as_json)[6], dtype=np.float32)

    return [
        ("packed float32 bin (ours)", _median_ns(packed_fn, n), len(packed)),
        ("packed + validate_quote", _median_ns(packed_validated_fn, n), len(packed)),
        ("msgpack list[float]", _median_ns(list_fn, n), len(as_list)),
        ("json list", _median_ns(json_fn, n // 4), len(as_json)),
    ]


def bench_recv(frames: int, size: int = 200) -> list[tuple[str, float]]:
    ctx = zmq.Context.instance()
    path = os.path.join(tempfile.mkdtemp(prefix="hft-wire-"), "recv.sock")
    endpoint = f"ipc://{path}"
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 0)
    pull.bind(endpoint)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 0)
    push.connect(endpoint)
    payload = os.urandom(size)
    buf = bytearray(4096)
    results = []

    def fill():
        for _ in range(frames):
            push.send(payload)
        # Wait until everything has crossed into the receiver's pipe.
        while not pull.poll(1000):
            pass
        time.sleep(0.2)

    variants = {
        "recv() -> bytes": lambda: pull.recv(),
        "recv(copy=False) + .buffer": lambda: pull.recv(copy=False).buffer,
        "recv_into(bytearray)": lambda: pull.recv_into(buf),
    }
    for name, fn in variants.items():
        per = []
        for _ in range(3):
            fill()
            t0 = time.perf_counter_ns()
            for _ in range(frames):
                fn()
            per.append((time.perf_counter_ns() - t0) / frames)
        results.append((name, statistics.median(per)))
    push.close(0)
    pull.close(0)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", type=int, default=10)
    ap.add_argument("--n", type=int, default=200_000, help="decodes per repetition")
    ap.add_argument("--frames", type=int, default=100_000, help="frames per receive repetition")
    ap.add_argument("--json", metavar="PATH", help="also write the figures, with the run's provenance, here")
    args = ap.parse_args()

    rows = bench_decode(args.levels, args.n)
    base = rows[0][1]
    print(table(["design", "ns/msg", "bytes", "vs ours"],
                [[name, round(ns), size, f"{ns / base:.2f}x"] for name, ns, size in rows],
                title=f"Decode of one {args.levels}-level Quote to float32 levels (median ns/message)"))
    print()
    recv = bench_recv(args.frames)
    recv_base = recv[-1][1]
    print(table(["API", "ns/frame", "vs recv_into"], [[name, round(ns), f"{ns / recv_base:.2f}x"] for name, ns in recv],
                title="Receive of a 200-byte frame over ipc:// (median ns/frame, queue pre-filled)"))
    if args.json:
        write_json(args.json, {
            "decode": [{"design": name, "ns_per_msg": ns, "bytes": size, "vs_ours": ns / base}
                       for name, ns, size in rows],
            "recv": [{"api": name, "ns_per_frame": ns, "vs_recv_into": ns / recv_base} for name, ns in recv]})


if __name__ == "__main__":
    main()
