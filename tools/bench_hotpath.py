#!/usr/bin/env python3
"""Where the microseconds go in the hot loop: per-event ingest and per-decision publish, through
the code the service runs (hft_infer.service.Service on real ipc sockets), plus their parts.

    python tools/bench_hotpath.py [--n 50000] [--baseline REF] [--json out.json]

    python tools/bench_hotpath.py --run-sizes 1024 [--n 20000 --reps 3]   # a burst's fixed cost
    python tools/bench_hotpath.py --run-sizes 1024 --columns-min 32,64,96 --frame-sizes 32,48,64,96,128
    python tools/bench_hotpath.py --run-sizes 93 --frame-sizes 9 --burst-frames 1,4,6   # a GPU shard's bursts
    python tools/bench_hotpath.py --run-sizes 93 --frame-sizes 9 --burst-frames 19 --run-parts  # where a burst goes

REF: a git commit, or a folder holding a copy of that commit's hft_infer/ingest.py, ingest_cold.py
and scheduler.py (for a machine without the repository's .git).

Rows (median of --reps repetitions):

  ingest, burst        Stepper.ingest (Ingest.drain) over a socket pre-filled with --n quotes (64 instruments):
                       recv topic + payload, decode, checks, sequence, feature rows, queueing;
                       conflating (default model) with fresh and with stale events (ts_send_ns long
                       past), and sequential. With --baseline REF the same rows for the ingest of git
                       REF (its hft_infer/ingest.py, ingest_cold.py, ingest_batch.py and scheduler.py,
                       loaded in place of ours; same store, sockets), repetitions interleaved so that
                       a busy machine hits both alike, and the ratio
  ingest, EventBatch   the same over EventBatch frames of 16 / 64 / 256 events (with --baseline too)
  ... parts            recv pair, + RCVMORE, decode, the book check (big-int per event; numpy per
                       burst), field reads
  publish              Stepper.complete + flush per decision (thread CPU time, and wall clock: what
                       else ran on the core, libzmq's I/O thread under taskset -c K, lands in the
                       latter), for a finished step of 1 / 8 / 32 / 64
                       requests, egress.mode batch (one DecisionBatch) and per_instrument; in batch
                       mode, each step also answered from numpy columns and from tuples
                       (stepper.ANSWER_COLUMNS_MIN forced each way), for the crossover;
                       --publish-sizes sets the steps, --only-publish skips every other row
  idle iteration       an ingest poll on an empty socket (EVENTS check) and asyncio.sleep(0)
  fold                 StageHistograms.fold_some of one chunk (4096 samples), per chunk
  one event per cycle  --low-rate N events, each sent after >= 100 µs of the loop's idle path (as at
                       low rates): its ingest, submit, device wait, complete, flush and whole cycle
                       (wall clock, p50 and p90), default model and lstm_a (sequential), the engine
                       `auto` picks (the graph engine on a GPU) or --engine's; with --cycle-parts a
                       second pass also times each phase's parts (decode, checks/row/push, form batch,
                       engine.submit, the gather, collect, pack, send: _CYCLE_PARTS) by wrapping the
                       service's own methods; --only-low-rate skips every other row

Targets (issue "Hot path v2", H200 host): ingest <= 1.5 µs/event in bursts, publish <= 0.5
µs/decision in batch mode. On the dev VM the absolute figures are the VM's; compare rows.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import inspect
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq
from benchlib import table, write_json

import hft_infer.channels as channels_module
import hft_infer.ingest_batch as ingest_batch
import hft_infer.service as service_module
from hft_infer.config import load_config
from hft_infer.heap import FrozenHeap
from hft_infer.metrics import StageHistograms
from hft_infer.service import Service
from hft_infer.stepper import _Batch
from hft_infer.transport.codec import (
    BATCH_TOPIC,
    IngressDecoder,
    _high_byte_masks,
    encode,
    event_batch,
    pack_book,
    topic_for,
)
from hft_infer.transport.schema import Quote

N_INST = 64


def quotes(n: int, levels: int = 10, ts_send_ns: int = 0) -> list[tuple[bytes, bytes]]:
    """ts_send_ns 0: no send time (fresh: the deadline counts from receipt); 1: long past (stale)."""
    rng = np.random.default_rng(0)
    lv = (rng.random((16, levels, 4)) * 10 + 100).astype(np.float32)
    return [(topic_for(i % N_INST),
             encode(Quote(i % N_INST, i // N_INST, 0, ts_send_ns, levels, pack_book(lv[i % 16])))) for i in range(n)]


def event_batches(n: int, size: int, levels: int = 10, ts_send_ns: int = 0,
                  n_inst: int = N_INST) -> list[tuple[bytes, bytes]]:
    """The events of `quotes(n)` (over `n_inst` instruments) as EventBatch frames of `size` quotes
    each (the last one shorter)."""
    rng = np.random.default_rng(0)
    lv = (rng.random((16, levels, 4)) * 10 + 100).astype(np.float32)
    i = np.arange(n)
    books = lv[i % 16]
    out = []
    for a in range(0, n, size):
        j = i[a:a + size]
        out.append((BATCH_TOPIC, encode(event_batch(j % n_inst, j // n_inst, np.zeros(len(j)),
                                                    np.full(len(j), ts_send_ns), books[a:a + size]))))
    return out


def load_baseline(ref: str):
    """The Ingest and Scheduler classes of git REF: its hft_infer/ingest.py, ingest_cold.py and
    ingest_batch.py (where it has them) and scheduler.py, under private names, so that the
    baseline is REF's whole ingest path (the scheduler's push is part of the sequential row)."""
    root = Path(__file__).resolve().parent.parent
    d = Path(tempfile.mkdtemp(prefix="hft-hp-base-", dir="/tmp"))
    for name in ("ingest_cold", "ingest_batch", "ingest", "scheduler"):
        if Path(ref).is_dir():  # a copy of REF's hft_infer/ (a machine without the repository's .git)
            f = Path(ref) / f"{name}.py"
            got = subprocess.CompletedProcess([], 0 if f.is_file() else 1, f.read_text() if f.is_file() else "",
                                              f"{f}: not a file")
        else:
            got = subprocess.run(["git", "-C", str(root), "show", f"{ref}:hft_infer/{name}.py"], capture_output=True,
                                 text=True)
        if got.returncode:
            if name not in ("ingest_cold", "ingest_batch"):
                raise SystemExit(f"bench_hotpath: no hft_infer/{name}.py at {ref}: {got.stderr.strip()}")
            continue
        # the baseline's own cold paths, under a private name (NO_REQUEST stays ours: the same -1)
        text = got.stdout.replace("from hft_infer.ingest_cold import", "from _base_ingest_cold import")
        text = text.replace("from hft_infer.ingest_batch import", "from _base_ingest_batch import")
        (d / f"_base_{name}.py").write_text(text)
    sys.path.insert(0, str(d))
    classes = []
    for name, cls in (("ingest", "Ingest"), ("scheduler", "Scheduler")):
        spec = importlib.util.spec_from_file_location(f"_base_{name}", d / f"_base_{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        classes.append(getattr(mod, cls))
    return (_accepting_new_keywords(classes[0]), classes[1])


def _accepting_new_keywords(ingest_cls):
    """REF's Ingest, made to ignore the keyword arguments our Service passes that REF's __init__
    does not take (e.g. `rows_read`, added after it): REF then runs as REF did."""
    params = inspect.signature(ingest_cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return ingest_cls

    class BaselineIngest(ingest_cls):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **{k: v for k, v in kwargs.items() if k in params})

    return BaselineIngest


class Rig:
    """A Service on a private runtime dir, its feed bound here (the service connects)."""

    def __init__(self, overrides: list[str], baseline=None, n_inst: int = N_INST) -> None:
        """`baseline`: (Ingest, Scheduler) classes to build the service with (load_baseline);
        `n_inst`: the universe's instruments."""
        self.runtime = tempfile.mkdtemp(prefix="hft-hp-", dir="/tmp")
        os.environ["HFT_INFER_RUNTIME_DIR"] = self.runtime
        self.cfg = load_config(None, ['model.checkpoint=""', 'model.preset="mlp_small"', "control.enabled=false",
                                      f"universe.instruments={n_inst}", "ingest.rcv_hwm=0", *overrides])
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.SNDHWM, 0)
        self.pub.bind(f"ipc://{self.runtime}/hft-infer-md.sock")
        own = channels_module.Ingest, service_module.Scheduler
        # Service() builds the scheduler, and open_sockets the ingest of the class that
        # channels.open_ingest names (for the zmq transport, channels.Ingest): the baseline's, if given
        channels_module.Ingest, service_module.Scheduler = baseline or own
        try:
            self.svc = Service(self.cfg)
            self.svc.open_sockets(self.ctx)
        finally:
            channels_module.Ingest, service_module.Scheduler = own
        if baseline is not None:  # the swap took (a rig that measured our own code twice would not say)
            assert type(self.svc.ingest) is baseline[0] and type(self.svc.sched) is baseline[1]
        self.svc.warm_up()
        # as Service.run does: freeze what survived set-up and collect only young objects, at
        # reset (the service's housekeeping); automatic collections mid-burst are not what it runs
        self.svc.heap.freeze()
        subs = 0
        while subs < n_inst + 1 and self.pub.poll(5000):
            subs += self.pub.recv()[:1] == b"\x01"

    def fill(self, frames) -> None:
        send = self.pub.send
        more = int(zmq.SNDMORE)
        for t, p in frames:
            send(t, more)
            send(p)
        sock = self.svc.ingest_sock
        while not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            time.sleep(0.001)
        time.sleep(0.2)  # let libzmq's I/O thread move everything into the socket's queue

    def reset(self) -> None:
        svc = self.svc
        svc.step.drain_inflight()
        while svc.sched.queued_slots:
            svc.step.submit(force=True)
            svc.step.drain_inflight()
        svc.egress.answers.clear()
        svc.store.reset_slots(range(svc.n_slots))
        svc.ingest.last_seq[:] = [-1] * svc.n_slots
        svc.heap.collect_young()

    def close(self) -> None:
        self.svc.heap.restore()
        self.svc.close()
        self.pub.close(0)
        self.ctx.term()
        shutil.rmtree(self.runtime, ignore_errors=True)


def ingest_all(rig: Rig, frames: int) -> int:
    """Stepper.ingest until the rig's `frames` pre-filled frames are read; returns the bursts."""
    ingest = rig.svc.step.ingest
    n = bursts = 0
    while n < frames:
        n += ingest()
        bursts += 1
    return bursts


def ingest_ns_per_event(rigs: list[Rig], frames, reps: int, events: int | None = None) -> list[float]:
    """Median ns/event of each rig; the rigs' repetitions interleaved. Thread CPU time
    (time.thread_time_ns), not wall time: on a shared machine the wall clock also counts the
    time the thread was descheduled; the per-event Python cost is the CPU time."""
    out: list[list[float]] = [[] for _ in rigs]
    for _ in range(reps):
        for k, rig in enumerate(rigs):
            rig.reset()
            rig.fill(frames)
            t0 = time.thread_time_ns()
            ingest_all(rig, len(frames))
            out[k].append((time.thread_time_ns() - t0) / (events or len(frames)))
            rig.reset()
    return [statistics.median(o) for o in out]


def publish_ns_per_decision(rig: Rig, batch: int, reps: int) -> tuple[float, float, float, float]:
    """Stepper.complete + flush for a finished step of `batch` requests (queued directly): the
    median thread CPU time and wall time per decision, and the CPU time of the flush alone (the
    frame's join and send) per step; then the CPU time per decision of what a large step leaves to
    the fold (SampleBuffer.add_differences: its queue, wire and service samples, worked out here
    for every step of the run at once, as a fold does), which the first figure includes. The CPU
    time is the loop thread's own cost (as the ingest rows'); the wall time also holds whatever
    ran on its core meanwhile -- under `taskset -c K`, libzmq's I/O thread, woken by each send to
    move the frame on, which the service places on a helper core of its own
    (pinning.zmq_io_affinity)."""
    svc = rig.svc
    # SampleBuffer.samples works out what a step deferred (a baseline tree from before it deferred nothing)
    settle = [buf.samples for buf in svc.step.bufs.values() if hasattr(buf, "samples")]
    for samples in settle:  # what earlier runs deferred, not this one's
        samples()
    out, wall, flush = [], [], []
    decided = 0
    for _ in range(reps * 20):
        rig.reset()
        now = time.perf_counter_ns()
        for k in range(batch):
            svc.sched.push(k % N_INST, 0, k // N_INST, 0, now, now, 0)
        n = svc.sched.form_batch(time.perf_counter_ns(), force=True)
        rids = svc.sched.batch_rids[:n]
        slots, positions = svc.engine.request()
        slots[:n] = [svc.sched.r_slot[r] for r in rids]
        positions[:n] = 0
        svc.engine.submit(n)
        svc.step.inflight.append(_Batch(rids, time.perf_counter_ns(), 0))
        while not svc.engine.poll():  # a GPU step: wait for it outside the timed part
            pass
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        svc.step.complete()
        c1 = time.thread_time_ns()
        svc.step.flush()
        c2, t1 = time.thread_time_ns(), time.perf_counter_ns()
        out.append((c2 - c0) / n)
        wall.append((t1 - t0) / n)
        flush.append(c2 - c1)
        decided += n
    c0 = time.thread_time_ns()
    for samples in settle:
        samples()
    deferred = (time.thread_time_ns() - c0) / decided
    return statistics.median(out) + deferred, statistics.median(wall) + deferred, statistics.median(flush), deferred


class _PartTimer:
    """Times calls of chosen methods of the service's own objects, by wrapping each on its
    instance (the wrapper's own cost, ~0.1-0.3 µs a call, lands in the part it wraps): what the
    parts of one phase of `low_rate_cycle` cost, each phase's remainder being its glue. A module's
    function may be wrapped too (its callers look it up in the module's globals at each call)."""

    def __init__(self) -> None:
        self.spent: dict[str, int] = {}
        self._undo: list[tuple[object, str, object]] = []

    def wrap(self, obj, attr: str, part: str) -> None:
        fn = getattr(obj, attr)
        spent, pc = self.spent, time.perf_counter_ns
        spent[part] = 0

        def timed(*args, **kwargs):
            t = pc()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[part] += pc() - t

        # an instance's method lives on its class (deleted to restore); a module's function is its own
        self._undo.append((obj, attr, fn if attr in vars(obj) else None))
        setattr(obj, attr, timed)

    def take(self) -> dict[str, int]:
        got = dict(self.spent)
        for k in self.spent:
            self.spent[k] = 0
        return got

    def restore(self) -> None:
        for obj, attr, own in reversed(self._undo):
            if own is None:
                delattr(obj, attr)  # the class's method shows through again
            else:
                setattr(obj, attr, own)
        self._undo.clear()


# the parts of a phase that `low_rate_cycle(..., parts=True)` times: (phase, object path, method, part)
_CYCLE_PARTS = (
    ("ingest", "ingest", "_decode", "decode"),
    ("ingest", "ingest", "_handle_one", "checks, row, push"),
    ("submit", "sched", "form_batch", "form batch"),
    ("submit", "engine", "submit", "engine.submit"),
    ("submit", "engine.staging", "gather", "gather rows"),
    ("submit", "engine._gather", "gather", "gather rows"),
    ("complete", "engine", "collect", "engine.collect"),
    ("flush", "egress", "batch_bytes", "pack frame"),
    ("flush", "egress", "_send", "send"),
)


def _resolve(svc, path: str):
    obj = svc
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def low_rate_cycle(rig: Rig, frames, idle_us: float = 100.0, parts: bool = False) -> dict[str, list[int]]:
    """One event per loop cycle, as at low rates: run the loop's idle path (an ingest poll,
    engine.poll, housekeeping, as Service._loop does) for `idle_us`, send a frame, idle on until the
    iteration that reads it, then submit, wait for the device, complete and flush, each timed on
    the wall clock (ns). What one event costs the loop when nothing is batched with it.
    `parts`: also time the parts in _CYCLE_PARTS (keys "phase: part"; a phase's whole then
    includes the wrappers' cost: compare parts within one run, wholes without `parts`)."""
    svc = rig.svc
    step, engine, sched = svc.step, svc.engine, svc.sched
    send, more = rig.pub.send, int(zmq.SNDMORE)
    pc = time.perf_counter_ns
    phases = ("ingest", "submit", "device", "complete", "flush", "loop")
    out: dict[str, list[int]] = {k: [] for k in phases}
    timer = _PartTimer()
    if parts:
        for phase, path, attr, part in _CYCLE_PARTS:
            obj = _resolve(svc, path)
            if obj is not None and f"{phase}: {part}" not in timer.spent:
                timer.wrap(obj, attr, f"{phase}: {part}")
        out.update({k: [] for k in timer.spent})
    idle_ns = int(idle_us * 1000)

    def idle_iteration(t0: int) -> int:
        n = step.ingest()
        if not n:
            engine.poll()
            svc._housekeeping(t0)
        return n

    try:
        for topic, payload in frames:
            t_idle = pc()
            while pc() - t_idle < idle_ns:  # the idle loop, nothing to read
                idle_iteration(pc())
            send(topic, more)
            send(payload)
            timer.take()
            while True:  # until the iteration that reads the frame
                t0 = pc()
                n = idle_iteration(t0)
                t1 = pc()
                if n:
                    break
            if not (engine.can_submit and sched.queued_slots):
                continue  # rejected or conflated into a queued request: nothing to step
            step.submit()  # a CPU engine steps here (and step.submit completes it at once)
            t2 = pc()
            while step.inflight and not engine.poll():
                pass
            t3 = pc()
            if step.inflight:
                step.complete()
            t4 = pc()
            step.flush()
            t5 = pc()
            for k, v in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0)):
                out[k].append(v)
            for k, v in timer.take().items():
                out[k].append(v)
            svc.stages.fold_one(svc.stages.IDLE_FOLD_MIN)
    finally:
        timer.restore()
    return out


def parts(frames, reps: int) -> list[tuple[str, float]]:
    """The pieces of one event's ingest, each on its own (ns per event)."""
    decode = IngressDecoder().decode
    payloads = [p for _, p in frames]
    msgs = [decode(p) for p in payloads]
    m80, m7f, m01 = _high_byte_masks(10)
    fb = int.from_bytes

    def t(fn):
        r = []
        # under the service's collector regime (heap.py: frozen, no automatic collection): a decoded
        # Quote holds a memoryview, a tracked object, so with collection on, each timed map over
        # thousands of frames also paid collections walking the `msgs` above (4.5 against 0.4 µs
        # an event on the dev VM), which the service's burst of at most max_drain never does
        with FrozenHeap():
            for _ in range(reps):
                t0 = time.thread_time_ns()  # CPU time, as for the ingest rows
                fn()
                r.append((time.thread_time_ns() - t0) / len(frames))
        return statistics.median(r)

    def book_check():
        for m in msgs:
            x = fb(m.book, "little")
            if x & m80 or ((x & m7f) + m01) & m80:
                raise AssertionError

    def book_check_numpy():  # what Ingest._handle does per burst of 256
        for c in range(0, len(msgs), 256):
            books = [m.book for m in msgs[c:c + 256]]
            words = np.frombuffer(b"".join(books), dtype="<u4").reshape(len(books), -1)
            if words.max() >= 0x7F000000:
                raise AssertionError

    return [("decode (msgspec, typed)", t(lambda: [decode(p) for p in payloads])),
            ("decode, map over a burst", t(lambda: list(map(decode, payloads)))),
            ("book check (big-int high bytes, per event)", t(book_check)),
            ("book check (numpy, per burst of 256)", t(book_check_numpy)),
            ("6 field reads", t(lambda: [(m.instrument, m.seq, m.ts_send_ns, m.priority, m.n_levels, m.book)
                                         for m in msgs]))]


def recv_parts(n: int, reps: int) -> list[tuple[str, float]]:
    ctx = zmq.Context()
    d = tempfile.mkdtemp(prefix="hft-hp-", dir="/tmp")
    pub, sub = ctx.socket(zmq.PUB), ctx.socket(zmq.SUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    pub.bind(f"ipc://{d}/r.sock")
    sub.connect(f"ipc://{d}/r.sock")
    time.sleep(0.3)
    frames = quotes(n)
    NOBLOCK, RCVMORE, EVENTS = int(zmq.NOBLOCK), int(zmq.RCVMORE), int(zmq.EVENTS)
    rows = []
    for name, checks in (("recv topic + payload", 0), ("... + one RCVMORE check", 1)):
        r = []
        for _ in range(reps):
            for t_, p in frames:
                pub.send(t_, zmq.SNDMORE)
                pub.send(p)
            time.sleep(0.3)
            recv, get = sub.recv, sub.get
            t0 = time.perf_counter_ns()
            for _ in range(n):
                recv(NOBLOCK)
                recv(NOBLOCK)
                if checks:
                    get(RCVMORE)
            r.append((time.perf_counter_ns() - t0) / n)
        rows.append((name, statistics.median(r)))
    get = sub.get
    t0 = time.perf_counter_ns()
    for _ in range(20000):
        get(EVENTS)
    rows.append(("idle poll: EVENTS check", (time.perf_counter_ns() - t0) / 20000))
    t0 = time.perf_counter_ns()
    for _ in range(2000):
        try:
            sub.recv(NOBLOCK)
        except zmq.Again:
            pass
    rows.append(("idle poll: recv raising zmq.Again", (time.perf_counter_ns() - t0) / 2000))
    pub.close(0)
    sub.close(0)
    ctx.term()
    shutil.rmtree(d, ignore_errors=True)
    return rows


def misc(reps: int) -> list[tuple[str, float]]:
    async def yields(k):
        for _ in range(k):
            await asyncio.sleep(0)

    import uvloop

    t0 = time.perf_counter_ns()
    uvloop.run(yields(20000))
    rows = [("await asyncio.sleep(0) (uvloop)", (time.perf_counter_ns() - t0) / 20000)]
    st = StageHistograms(("a",), capacity=65536, highest_ns=60_000_000_000)
    rng = np.random.default_rng(0)
    r = []
    for k in range(max(reps, 5) + 1):  # the first, untimed: first-touch costs (~1 ms on the dev VM)
        st.buffers["a"].add_many(rng.lognormal(11, 1, 8192).astype(np.int64))
        t0 = time.perf_counter_ns()
        st.fold_some()
        if k:
            r.append(time.perf_counter_ns() - t0)
    rows.append(("fold one chunk (4096 samples), per chunk", statistics.median(r)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--baseline", metavar="REF",
                    help="also measure the ingest of git REF (e.g. main; or a folder: see above), interleaved")
    ap.add_argument("--low-rate", type=int, default=2000, metavar="N",
                    help="events sent one per loop cycle after >= 100 µs of idle loop (0: skip those rows)")
    ap.add_argument("--only-low-rate", action="store_true",
                    help="only the one-event-per-cycle rows (with --cycle-parts: and their parts)")
    ap.add_argument("--cycle-parts", action="store_true",
                    help="also time the parts of each phase of the one-event cycle (a second pass, wrapped)")
    ap.add_argument("--engine", default="auto", choices=("auto", "eager", "graph", "persistent"),
                    help="runner.engine of the one-event cycle rows (default: auto, what the service picks)")
    ap.add_argument("--run-sizes", type=int, default=0, metavar="INSTRUMENTS",
                    help="only the EventBatch rows of a sequential model over INSTRUMENTS instruments by frame "
                         "size, one frame per burst against 64 (a burst's fixed cost against its per-event cost)")
    ap.add_argument("--frame-sizes", default="10,32,64,256", metavar="N,N,...",
                    help="--run-sizes: EventBatch frame sizes (events)")
    ap.add_argument("--burst-frames", default="1,64", metavar="N,N,...",
                    help="--run-sizes: frames read per burst (ingest.max_drain), each a row (default 1,64; a saturated "
                         "GPU shard at ~92k events/s reads ~3-5 frames of ~9 events a burst, BENCHMARKS.md wave 32)")
    ap.add_argument("--columns-min", default="", metavar="N,N,...",
                    help="--run-sizes: each of these as ingest_batch.COLUMNS_MIN (the run size from which the "
                         "column path is taken), interleaved; default: the code's own")
    ap.add_argument("--run-parts", action="store_true",
                    help="--run-sizes: also the parts of a burst in µs, each row's (a second pass, the service's "
                         "methods wrapped: run_parts)")
    ap.add_argument("--conflating", action="store_true",
                    help="--run-sizes: the default (conflating) model instead of a sequential one")
    ap.add_argument("--publish-sizes", default="1,8,32,64", metavar="N,N,...",
                    help="the publish rows' step sizes (default 1,8,32,64); in batch mode each size of 2 or more "
                         "also answered from numpy columns and from tuples, for the crossover")
    ap.add_argument("--only-publish", action="store_true", help="the publish rows only")
    ap.add_argument("--json", metavar="PATH")
    a = ap.parse_args()
    rows: list[tuple[str, float, str]] = []
    base_cls = load_baseline(a.baseline) if a.baseline else None
    if a.run_sizes:
        rows += run_size_rows(a)
    elif a.only_publish:
        rows += publish_rows(a)
    elif not a.only_low_rate:
        rows += burst_rows(a, base_cls)
    if not a.run_sizes and not a.only_publish:
        rows += low_rate_rows(a)
    print(table(["phase", "cost", "unit"], rows, digits=2 if any(u == "x" for _, _, u in rows) else 0))
    if a.json:
        write_json(a.json, {"n": a.n, "baseline": a.baseline,
                            "rows": [{"phase": n, "value": v, "unit": u} for n, v, u in rows]})


def burst_rows(a, base_cls) -> list[tuple[str, float, str]]:
    """Ingest in bursts and EventBatch frames, its parts, publish, the idle iteration and a fold."""
    rows: list[tuple[str, float, str]] = []
    frames = quotes(a.n)
    stale = quotes(a.n, ts_send_ns=1)
    for name, overrides, feed in (("conflating (default mlp_small), fresh", [], frames),
                                  ("conflating (default mlp_small), stale", [], stale),
                                  ("sequential (conflate off)", ['scheduler.conflate="off"',
                                                                 "scheduler.max_pending_per_instrument=4096",
                                                                 "scheduler.capacity=262144"], frames)):
        rigs = [Rig(overrides)] + ([Rig(overrides, base_cls)] if base_cls else [])
        try:
            got = ingest_ns_per_event(rigs, feed, a.reps)
            rows.append((f"ingest, bursts of 256, {name}", got[0], "ns/event"))
            if base_cls:
                rows.append((f"  baseline {a.baseline}", got[1], "ns/event"))
                rows.append(("  baseline / this", got[1] / got[0], "x"))
        finally:
            for rig in rigs:
                rig.close()
    # EventBatch frames (hft_infer/ingest_batch.py): the same events, many per frame
    for name, overrides, ts in (("conflating (default mlp_small), fresh", [], 0),
                                ("conflating (default mlp_small), stale", [], 1),
                                ("sequential (conflate off)", ['scheduler.conflate="off"',
                                                               "scheduler.max_pending_per_instrument=4096",
                                                               "scheduler.capacity=262144"], 0),
                                ("sequential, stale (each event shed LATE, answered)", ['scheduler.conflate="off"',
                                                                                        "scheduler.capacity=262144"],
                                 1)):
        rigs = [Rig(overrides + ["ingest.max_drain=64"])]
        if base_cls:
            rigs.append(Rig(overrides + ["ingest.max_drain=64"], base_cls))
        try:
            for size in (16, 64, 256):
                got = ingest_ns_per_event(rigs, event_batches(a.n, size, ts_send_ns=ts), a.reps, events=a.n)
                rows.append((f"ingest, EventBatch frames of {size}, bursts of 64 frames, {name}", got[0], "ns/event"))
                if base_cls:
                    rows.append((f"  baseline {a.baseline}", got[1], "ns/event"))
                    rows.append(("  baseline / this", got[1] / got[0], "x"))
        finally:
            for rig in rigs:
                rig.close()
    rows += [(f"  part: {n}", v, "ns/event") for n, v in recv_parts(min(a.n, 20000), a.reps)]
    rows += [(f"  part: {n}", v, "ns/event") for n, v in parts(frames[:20000], a.reps)]
    rows += publish_rows(a)
    rows += [(n, v, "ns") for n, v in misc(a.reps)]
    return rows


def publish_rows(a) -> list[tuple[str, float, str]]:
    """Publish per decision for steps of --publish-sizes, both egress modes; in batch mode each
    size of 2 or more also answered both ways, from numpy columns and from tuples
    (stepper.ANSWER_COLUMNS_MIN forced each way), alternated, and their ratio: the crossover."""
    rows: list[tuple[str, float, str]] = []
    sizes = [int(x) for x in a.publish_sizes.split(",")]
    for mode in ("batch", "per_instrument"):
        rig = Rig([f"egress.mode={mode}"])
        try:
            for b in sizes:
                cpu, wall, flush, deferred = publish_ns_per_decision(rig, b, a.reps)
                rows.append((f"publish, step of {b}, egress {mode}", cpu, "ns/decision"))
                rows.append(("  wall clock", wall, "ns/decision"))
                rows.append(("  of which the flush (frames joined and sent)", flush, "ns/step"))
                rows.append(("  of which left to the fold (samples worked out)", deferred, "ns/decision"))
            if mode != "batch":
                continue
            step = rig.svc.step
            own = step.answer_columns_min
            for b in (b for b in sizes if b > 1):
                got = {"numpy columns": [], "tuples": []}
                for _ in range(2):
                    for path, columns_min in (("numpy columns", 2), ("tuples", 1 << 30)):
                        step.answer_columns_min = columns_min
                        got[path].append(publish_ns_per_decision(rig, b, a.reps)[0])
                step.answer_columns_min = own
                cols, tups = statistics.median(got["numpy columns"]), statistics.median(got["tuples"])
                rows.append((f"  step of {b}, answered from numpy columns", cols, "ns/decision"))
                rows.append((f"  step of {b}, answered from tuples", tups, "ns/decision"))
                rows.append(("  columns / tuples", cols / tups, "x"))
        finally:
            rig.close()
    return rows


# the parts of an EventBatch burst that --run-parts times: (object path, or a module, attribute, part)
_RUN_PARTS = (
    ("ingest", "_finish", "finish"),
    ("ingest", "_handle_mixed", "handle"),
    (ingest_batch, "shape_ok", "shapes"),
    ("ingest", "_batch_columns", "columns"),
    (ingest_batch, "merged_event_columns", "joined"),
    ("ingest", "_queue_run_in_order", "in_order"),
    ("ingest", "_queue_newest", "newest"),
    ("ingest", "_write_rows", "rows"),
    ("sched", "run_waits_ns", "waits"),
    ("sched", "push_columns", "pushes"),
)
# each row of run_parts: (label, its µs from the burst's total and the wrapped parts' times, per burst)
_RUN_ROWS = (
    ("burst (all)", lambda t, p: t),
    ("read: recv loop, framing", lambda t, p: t - p["finish"]),
    ("decode", lambda t, p: p["finish"] - p["handle"]),
    ("handling's loops over frames", lambda t, p: p["handle"] - p["shapes"] - p["columns"]),
    ("frame shape checks (codec.event_batch_shape_ok)", lambda t, p: p["shapes"]),
    ("columns joined (codec.merged_event_columns)", lambda t, p: p["joined"]),
    ("column checks (_batch_columns less the above and below)",
     lambda t, p: p["columns"] - p["joined"] - p["in_order"] - p["newest"]),
    ("queueing less rows, waits, pushes",
     lambda t, p: p["in_order"] + p["newest"] - p["rows"] - p["waits"] - p["pushes"]),
    ("rows written (_write_rows)", lambda t, p: p["rows"]),
    ("deadline waits (Scheduler.run_waits_ns)", lambda t, p: p["waits"]),
    ("pushes (Scheduler.push_columns)", lambda t, p: p["pushes"]),
)


def run_parts(rig: Rig, frames, reps: int) -> dict[str, float]:
    """µs per burst of each part of an EventBatch burst (_RUN_ROWS), by wrapping the service's own
    methods (_RUN_PARTS: a second pass, after the unwrapped one); a part that holds others is given
    as its own remainder (read = the burst less `_finish`, decode = `_finish` less the handling, ...),
    so the rows after the first add up to it."""
    timer = _PartTimer()
    svc = rig.svc
    for path, attr, part in _RUN_PARTS:
        timer.wrap(path if not isinstance(path, str) else _resolve(svc, path), attr, part)
    spent: dict[str, list[float]] = {label: [] for label, _ in _RUN_ROWS}
    try:
        for _ in range(reps):
            rig.reset()
            rig.fill(frames)
            timer.take()
            t0 = time.perf_counter_ns()
            bursts = ingest_all(rig, len(frames))
            total = (time.perf_counter_ns() - t0) / bursts / 1e3
            p = {k: v / bursts / 1e3 for k, v in timer.take().items()}
            for label, part in _RUN_ROWS:
                spent[label].append(part(total, p))
            rig.reset()
    finally:
        timer.restore()
    return {k: statistics.median(v) for k, v in spent.items()}


def run_size_rows(a) -> list[tuple[str, float, str]]:
    """--run-sizes N: ingest of a sequential model (conflation off; --conflating: the default
    model's conflation) over N instruments, EventBatch frames of --frame-sizes events, read
    --burst-frames frames per burst (ingest.max_drain; by default one and 64; a saturated GPU shard
    reads ~3-5, 28-48 events: BENCHMARKS.md wave 32). A run's fixed cost shows as the gap between the
    two; --run-parts says where a burst's time goes (run_parts). Runs under
    ingest_batch.COLUMNS_MIN events take the per-event path; --columns-min A,B,... measures each
    threshold (set in this process, repetitions interleaved): where the column path starts to pay."""
    rows: list[tuple[str, float, str]] = []
    model = [] if a.conflating else ['scheduler.conflate="off"', "scheduler.max_pending_per_instrument=4096"]
    kind = "conflating" if a.conflating else "sequential"
    thresholds = [int(x) for x in a.columns_min.split(",")] if a.columns_min else [ingest_batch.COLUMNS_MIN]
    default = ingest_batch.COLUMNS_MIN
    for size in (int(x) for x in a.frame_sizes.split(",")):
        for drain in (int(x) for x in a.burst_frames.split(",")):
            rig = Rig([*model, "scheduler.capacity=262144", f"ingest.max_drain={drain}"], n_inst=a.run_sizes)
            frames = event_batches(a.n, size, n_inst=a.run_sizes)
            got: dict[int, list[float]] = {t: [] for t in thresholds}
            parts: dict[str, float] = {}
            try:
                for _ in range(a.reps):
                    for t in thresholds:
                        ingest_batch.COLUMNS_MIN = t
                        got[t] += ingest_ns_per_event([rig], frames, 1, events=a.n)
                if a.run_parts:
                    parts = run_parts(rig, frames, a.reps)
            finally:
                ingest_batch.COLUMNS_MIN = default
                rig.close()
            for t in thresholds:
                where = f", COLUMNS_MIN {t}" if a.columns_min else ""
                rows.append((f"ingest, {a.run_sizes} instruments, EventBatch frames of {size}, bursts of {drain} "
                             f"frame{'s' if drain > 1 else ''}, {kind}{where}", statistics.median(got[t]),
                             "ns/event"))
            rows += [(f"  ... {part}", v, "µs/burst") for part, v in parts.items()]
    return rows


def low_rate_rows(a) -> list[tuple[str, float, str]]:
    """One event per loop cycle (--low-rate N events), each phase's p50 (p90 in the name), and with
    --cycle-parts a second pass with the parts of each phase timed."""
    rows: list[tuple[str, float, str]] = []
    if not a.low_rate:
        return rows
    for name, overrides in (("default mlp_small, conflating", []),
                            ("lstm_a, sequential", ['model.preset="lstm_a"', 'model.mode="window"'])):
        for parts in (False, True) if a.cycle_parts else (False,):
            rig = Rig([*overrides, f'runner.engine="{a.engine}"'])
            try:
                got = low_rate_cycle(rig, quotes(a.low_rate), parts=parts)
            finally:
                rig.close()
            label = f"one event per cycle{', parts timed' if parts else ''}, {name} [{rig.svc.engine.name}]"
            for phase, v in got.items():
                v = v[len(v) // 10:]  # the first tenth warms up
                if not v:
                    continue
                rows.append((f"{label}, {phase} (p50; p90 {np.percentile(v, 90) / 1e3:,.1f} µs)",
                             statistics.median(v), "ns"))
    return rows


if __name__ == "__main__":
    main()
