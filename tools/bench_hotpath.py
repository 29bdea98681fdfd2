#!/usr/bin/env python3
"""Where the microseconds go: cost per event of each hot-loop phase, in one process.

    python tools/bench_hotpath.py [--n 100000]

Each phase is the real code the service runs (no copies of it), timed over
--n events, median of 5 repetitions, in ns per event:

  recv        ZeroMQ ipc recv of a topic + 170-byte quote (queue pre-filled)
  ready-check EVENTS getsockopt vs poll(0) vs recv(NOBLOCK)+Again on an empty socket
  decode      msgspec decode of the quote (typed Decoder, memoryview book)
  validate    validate_quote (levels, finite/non-negative via the high-byte check)
  write       FeatureStore.write_quote (memoryview copy into the ring)
  push        Scheduler.push (conflating) ; push+pick: push then form_batch of 1
  record      SampleBuffer.add (one stage sample)
  on_frame    Service._on_frame: decode + validate + write + push + 2 samples, all in
  publish     DecisionPublisher.send_decision (encode_into + 2-frame NOBLOCK send, no subscriber)
  step        EagerEngine.step for batch 1 / 8 / 64 of the default model (per batch, µs)
  yield       `await asyncio.sleep(0)` under uvloop (what a busy loop pays to let timers run)
  gc          a gc.collect(0) with the heap frozen vs not (the pause the loop avoids)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time

import numpy as np
import zmq

from hft_infer.config import load_config
from hft_infer.metrics import SampleBuffer
from hft_infer.transport.codec import IngressDecoder, encode, pack_book, topic_for, validate_quote
from hft_infer.transport.schema import Quote


def timed(fn, n: int, reps: int = 5) -> float:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn(n)
        out.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    args = ap.parse_args()
    n = args.n
    rows: list[tuple[str, float, str]] = []

    lv = (np.random.default_rng(0).random((10, 4)) * 100 + 1).astype(np.float32)
    frame = encode(Quote(5, 1, 2, 3, 10, pack_book(lv)))
    decode = IngressDecoder().decode
    q = decode(frame)

    # --- receive and readiness checks over ipc
    ctx = zmq.Context()
    d = tempfile.mkdtemp(prefix="hft-hp-", dir="/tmp")
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 0)
    pull.bind(f"ipc://{d}/a.sock")
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 0)
    push.connect(f"ipc://{d}/a.sock")
    topic = topic_for(5)

    def fill(k):
        for _ in range(k):
            push.send(topic, zmq.SNDMORE)
            push.send(frame)
        while not pull.poll(1000):
            pass
        time.sleep(0.3)

    def recv2(k):
        r = pull.recv
        for _ in range(k):
            r()
            r()

    per = []
    for _ in range(3):
        fill(n)
        t0 = time.perf_counter_ns()
        recv2(n)
        per.append((time.perf_counter_ns() - t0) / n)
    rows.append(("recv topic+payload", statistics.median(per), "ns/event"))

    EV, PI = zmq.EVENTS, zmq.POLLIN
    g = pull.getsockopt

    def events_check(k):
        for _ in range(k):
            g(EV) & PI

    def poll_check(k):
        p = pull.poll
        for _ in range(k):
            p(0)

    def again_check(k):
        r = pull.recv
        for _ in range(k):
            try:
                r(zmq.NOBLOCK)
            except zmq.Again:
                pass

    m = max(n // 5, 1000)
    rows.append(("ready-check EVENTS (empty)", timed(events_check, m), "ns/check"))
    rows.append(("ready-check poll(0) (empty)", timed(poll_check, m), "ns/check"))
    rows.append(("ready-check recv+Again (empty)", timed(again_check, m), "ns/check"))

    # --- decode / validate / write / push / record
    rows.append(("decode", timed(lambda k: [decode(frame) for _ in range(k)], n), "ns/event"))
    rows.append(("validate", timed(lambda k: [validate_quote(q, 64) for _ in range(k)], n), "ns/event"))

    from hft_infer.features import FeatureStore
    from hft_infer.scheduler import Scheduler

    store = FeatureStore(64, 10, 32)
    rows.append(("feature write", timed(lambda k: [store.write_quote(i & 63, q.book, 10) for i in range(k)], n),
                 "ns/event"))

    cfg = load_config(None)
    table = [[2] * 64, [1] * 64]
    sched = Scheduler(cfg.scheduler, 64, sequential=False, conflate=True, class_by_slot_kind=table)

    def push_only(k):
        for i in range(k):
            sched.push(i & 63, i, i, 2, i, i, 0)

    rows.append(("scheduler push (conflating)", timed(push_only, n), "ns/event"))

    def push_pick(k):
        for i in range(k):
            sched.push(i & 63, i, i, 2, i, i, 0)
            c = sched.form_batch(i + 10)
            for j in range(c):
                sched.release(sched.batch_rids[j])

    sched2 = Scheduler(cfg.scheduler.__class__(max_batch=1, classes=4, default_class=2), 64, sequential=False,
                       conflate=True, class_by_slot_kind=table)
    sched = sched2
    rows.append(("scheduler push + pick (batch 1)", timed(push_pick, n), "ns/event"))

    buf = SampleBuffer(1 << 20)

    def rec(k):
        a = buf.add
        for i in range(k):
            a(i)
        buf.take()

    rows.append(("metrics sample", timed(rec, n), "ns/sample"))

    # --- the whole per-frame path and publishing, through a real Service
    from hft_infer.service import Service

    svc_cfg = load_config(None, ["service.name=hp", f"ingest.endpoint=\"ipc://{d}/md.sock\"",
                                 f"egress.endpoint=\"ipc://{d}/dec.sock\"",
                                 f"metrics.control_endpoint=\"ipc://{d}/ctl.sock\""])
    svc = Service(svc_cfg)
    svc.open_sockets()
    frames = [encode(Quote(i & 63, i >> 6, 0, 0, 10, pack_book(lv))) for i in range(n)]
    from hft_infer.clock import perf_ns

    def on_frame(k):
        f = svc._on_frame
        for i in range(k):
            f(None, frames[i], perf_ns())
        while svc.sched.queued_slots:  # keep the queue from filling between repetitions
            svc._step(force=True)

    # _on_frame includes 2 clock reads; the step it forces afterwards is excluded below
    t_on = []
    for _ in range(3):
        svc.store.reset()
        t0 = time.perf_counter_ns()
        f = svc._on_frame
        for i in range(n):
            f(None, frames[i], perf_ns())
        t_on.append((time.perf_counter_ns() - t0) / n)
        while svc.sched.queued_slots:
            svc._step(force=True)
    rows.append(("on_frame (decode..push, 2 samples)", statistics.median(t_on), "ns/event"))
    pub = svc.publisher

    def publish(k):
        s = pub.send_decision
        for i in range(k):
            s(i & 63, i & 63, i, 0, 0, 1, 0.5, 0, 0, 0, 0)

    rows.append(("publish decision", timed(publish, n), "ns/decision"))

    eng = svc.engine
    for b in (1, 8, 64):
        e_slots, e_positions = eng.request()
        e_slots[:b] = np.arange(b) % 64
        e_positions[:b] = 40

        def step(k, b=b):
            for _ in range(k):
                eng.step(b)

        k = max(200, 20000 // b)
        rows.append((f"model step batch {b} ({svc.model_version})", timed(step, k) / 1000, "µs/batch"))
    svc.close()

    async def yields(k):
        for _ in range(k):
            await asyncio.sleep(0)

    import uvloop

    t = []
    for _ in range(3):
        t0 = time.perf_counter_ns()
        uvloop.run(yields(n))
        t.append((time.perf_counter_ns() - t0) / n)
    rows.append(("await asyncio.sleep(0) (uvloop)", statistics.median(t), "ns/yield"))

    # GC: a young collection over a large heap, frozen or not
    junk = [{"a": [i]} for i in range(300_000)]  # a service-sized heap of long-lived objects
    gc.collect()
    t0 = time.perf_counter_ns()
    gc.collect()
    full_unfrozen = (time.perf_counter_ns() - t0) / 1e3
    gc.freeze()
    t0 = time.perf_counter_ns()
    gc.collect()
    full_frozen = (time.perf_counter_ns() - t0) / 1e3
    gc.unfreeze()
    del junk
    rows.append(("gc.collect() full, heap not frozen", full_unfrozen, "µs/pause"))
    rows.append(("gc.collect() full, heap frozen", full_frozen, "µs/pause"))

    print(f"Hot-loop phase costs (median of repetitions, n={n})")
    print(f"{'phase':44s} {'cost':>10s}  unit")
    for name, v, unit in rows:
        print(f"{name:44s} {v:10.1f}  {unit}")


if __name__ == "__main__":
    main()
