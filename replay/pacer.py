"""Open-loop pacing: every event has an intended send time, fixed before the run.

Schedules (offsets in ns from the start, one per event):
- `by_timestamps(ts_exchange_ns, speed)`: the original spacing scaled by 1/speed;
- `constant_rate(n, rate)`, `poisson_rate(n, rate, seed)`;
- `as_fast_as_possible(n)`: all zero (--max).

The pacer never waits for the service (open loop): when it falls behind it
sends at once and records its lateness (actual - intended), so pacing error is
visible rather than silently stretching the schedule. Latency measured from
the *intended* time therefore includes any backlog the service causes (no
coordinated omission). Two ways to wait for a send time:

- spin (`spin=True`): read the clock until the time has come, sleeping only
  when more than SLEEP_THRESHOLD_NS ahead. Accurate, and takes a whole core:
  for a core of its own (`replay.pacer_proc` pins it there).
- sleep (`spin=False`): sleep through every wait. Less accurate (a wake-up
  per send; `replay.child.set_timer_slack` takes the kernel's default 50 us
  timer slack off it), and it leaves the CPU to the service: the choice on
  machines with too few cores to give each process its own.

In `bench` and `replay` nothing else shares the pacer's thread: decisions are
received by a separate collector process (`replay.collector_proc`), so a send
burst never delays the timestamp of a decision. (`idle_hook` still runs a
collector in the pacer's thread, for tools that want one process.)

Frames are encoded before the run. The publisher's `ts_send_ns` field is
patched in place just before each send (the frame was encoded with a
sentinel that msgpack writes as a fixed 9-byte uint64, so its offset is
known), which costs one `struct.pack_into` instead of an encode per event.

Batched frames (`feed_batch` > 1, `bench`/`replay --feed-batch N`): when the
pacer is due to send and later events are already due too (it fell behind:
above ~20-50k events/s a sleeping pacer always has), it sends up to N of
them as one EventBatch frame (transport/schema.py) built from the feed's
columns (`FeedColumns`, slices of them: no per-event Python), each with the
batch's send time; an event due alone goes out as its own frame, as without
the option. Like a feed handler that batches under load, it sends at most one
frame per `feed_batch_us` (100 µs by default) once events come faster than
that: an event due sooner than that after the last frame, with another one due
before the gap ends, waits for the gap and goes with what is due by then; so
at 600k events/s the frames hold ~60-120 events, and at 10k events/s every
event still goes alone and at once. Each event's actual send time is still recorded, so lateness and
tick-to-decision count the wait for the batch. Quotes of another depth than
the feed's and captured frames are never batched. For shards (`bench --shards
N --feed-batch K`: `shard_of`, `shard_count`) the events due together go as one
EventBatch per shard, under that shard's batch topic (codec.shard_batch_topic),
each a slice of the shard's own columns (`FeedColumns.take`, made once).
"""

from __future__ import annotations

import gc
import struct
import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import numpy as np
import zmq

from hft_infer.clock import perf_ns
from hft_infer.replay.events import KIND_QUOTE
from hft_infer.transport.codec import BATCH_TOPIC, shard_batch_topic, topic_for
from hft_infer.transport.schema import BYTES_PER_LEVEL, EventBatch, Quote, Trade
from hft_infer.transport.shm import ShmPublisher

TS_SENTINEL = 0x7FFF_FFFF_FFFF_FFF0
_SENTINEL_BYTES = b"\xcf" + TS_SENTINEL.to_bytes(8, "big")
_U64 = struct.Struct(">Q")

# Spinning pacer: sleep only when more than this ahead of schedule, and wake
# this much before the send time (time.sleep overshoots by ~20-100 us).
SLEEP_THRESHOLD_NS = 2_000_000
SLEEP_MARGIN_NS = 1_000_000
# Only with an idle hook (a collector sharing the thread, the old design, kept for
# tools/naive_loop.py): call it when at least this much time is left before the
# next send, and sleep in slices of SLEEP_SLICE_NS in between.
IDLE_HOOK_MIN_NS = 20_000
SLEEP_SLICE_NS = 100_000


def wait_until(target: int, now: int, spin: bool) -> int:
    """Wait until perf_counter_ns reaches `target` (spinning, sleeping only when more than
    SLEEP_THRESHOLD_NS ahead; or sleeping through it); returns the time read last. A wake-up may
    come early (a signal) or late (the scheduler): both are looped over."""
    sleep = time.sleep
    while now < target:
        if not spin:
            sleep((target - now) / 1e9)
        elif target - now > SLEEP_THRESHOLD_NS:
            sleep((target - now - SLEEP_MARGIN_NS) / 1e9)
        now = perf_ns()
    return now


def constant_rate(n: int, rate: float) -> np.ndarray:
    return (np.arange(n, dtype=np.float64) * (1e9 / rate)).astype(np.int64)


def poisson_rate(n: int, rate: float, seed: int = 1) -> np.ndarray:
    gaps = np.random.default_rng(seed).exponential(1e9 / rate, n)
    gaps[0] = 0.0
    return np.cumsum(gaps).astype(np.int64)


def by_timestamps(ts_ns: np.ndarray, speed: float) -> np.ndarray:
    if speed <= 0:
        raise ValueError("speed must be > 0")
    rel = ts_ns.astype(np.int64) - int(ts_ns[0])
    return (rel / speed).astype(np.int64)


def as_fast_as_possible(n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.int64)


# an EventBatch's bytes beside its columns (msgpack array, tag, n, n_levels and 10 bin headers)
BATCH_OVERHEAD_BYTES = 64
# instrument, seq, ts_exchange_ns, ts_send_ns, priority, kind, price, size, side
EVENT_BATCH_BYTES_PER_EVENT = 4 + 8 + 8 + 8 + 1 + 1 + 8 + 8 + 1
_COLUMNS = ("instrument", "seq", "ts_exchange_ns", "priority", "kind", "price", "size", "side", "book")
_BYTES_PER_EVENT = {"instrument": 4, "seq": 8, "ts_exchange_ns": 8, "priority": 1, "kind": 1, "price": 8, "size": 8,
                    "side": 1}  # and book: levels x 16


def max_batch_events(levels: int, max_frame_bytes: int) -> int:
    """The most events of `levels` levels an EventBatch frame of at most `max_frame_bytes` holds."""
    per_event = EVENT_BATCH_BYTES_PER_EVENT + levels * BYTES_PER_LEVEL
    return max(1, (max_frame_bytes - BATCH_OVERHEAD_BYTES) // per_event)


@dataclass(eq=False)
class FeedColumns:
    """The feed's events as EventBatch columns (bytes, one row per event, in feed order), for a
    pacer that batches; `batchable[i]`: event i is a trade or a quote of `levels` levels. The
    optional columns are b"" where the feed does not need them (no priorities, no trades)."""

    levels: int
    batchable: np.ndarray  # bool per event
    instrument: bytes  # uint32 LE per event
    seq: bytes  # uint64 LE
    ts_exchange_ns: bytes  # int64 LE
    priority: bytes  # int8, or b""
    kind: bytes  # uint8 Kind, or b"" (no trades); price, size, side with it
    price: bytes  # float64
    size: bytes  # float64
    side: bytes  # int8
    book: bytes  # float32, levels * 4 per event (trades: zeros)

    def __eq__(self, other) -> bool:
        return isinstance(other, FeedColumns) and all(
            np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
            for a, b in zip(vars(self).values(), vars(other).values()))

    @classmethod
    def of_events(cls, events: np.ndarray) -> FeedColumns:
        levels = events.dtype["book"].shape[0]
        prio = events["priority"]
        is_trade = events["kind"] != KIND_QUOTE
        has_trades = bool(is_trade.any())

        def col(name: str, dt: str) -> bytes:
            return events[name].astype(dt).tobytes() if has_trades else b""
        book = np.ascontiguousarray(events["book"], dtype="<f4").copy()
        book[is_trade] = 0.0  # a trade's row is ignored on the wire
        return cls(levels, is_trade | (events["n_levels"] == levels),
                   events["instrument"].astype("<u4").tobytes(), events["seq"].astype("<u8").tobytes(),
                   events["ts_exchange_ns"].astype("<i8").tobytes(),
                   b"" if (prio == -1).all() else prio.astype("i1").tobytes(),
                   col("kind", "u1"), col("price", "<f8"), col("size", "<f8"), col("side", "i1"), book.tobytes())

    def take(self, idx: np.ndarray) -> FeedColumns:
        """The rows `idx` (feed order kept) as columns of their own: one shard's events."""
        def rows(name: str) -> bytes:
            col = getattr(self, name)
            if not col:  # an optional column the feed does not need
                return b""
            w = self.levels * 16 if name == "book" else _BYTES_PER_EVENT[name]
            return np.frombuffer(col, dtype=np.uint8).reshape(-1, w)[idx].tobytes()
        return FeedColumns(self.levels, self.batchable[idx], *(rows(name) for name in _COLUMNS))

    def batch(self, i: int, j: int, ts_send_ns: int) -> EventBatch:
        """Events i..j-1 (all batchable) as one EventBatch sent at `ts_send_ns`."""
        n = j - i
        book = self.levels * 16
        wide = 8 if self.kind else 0  # the trade columns are there or all empty
        narrow = 1 if self.kind else 0
        return EventBatch(n, self.levels, self.instrument[4 * i:4 * j], self.seq[8 * i:8 * j],
                          self.ts_exchange_ns[8 * i:8 * j], _I64.pack(ts_send_ns) * n, self.book[book * i:book * j],
                          self.priority[i:j], self.kind[narrow * i:narrow * j], self.price[wide * i:wide * j],
                          self.size[wide * i:wide * j], self.side[narrow * i:narrow * j])


_I64 = struct.Struct("<q")


@dataclass
class EncodedFeed:
    """Wire frames ready to send: topics, payloads (bytearray) and the ts_send offsets; with
    `columns`, the same events as EventBatch columns for a batching pacer."""

    topics: list[bytes]
    payloads: list[bytearray]
    ts_offsets: list[int]  # byte offset of the uint64 ts_send_ns value in each payload (-1: none)
    columns: FeedColumns | None = None

    def __len__(self) -> int:
        return len(self.payloads)


def encode_feed(events: np.ndarray) -> EncodedFeed:
    """Encode an event table into frames whose ts_send_ns can be patched at send time, and its
    columns (a pacer with feed_batch > 1 sends them as EventBatch frames when several are due).

    The same messages as `events.to_message` builds, from columns read once
    into Python lists (a numpy scalar per field and row made it ~3x slower:
    8.5 against 2.6 us per event on the dev VM)."""
    n = events.shape[0]
    inst, seq, ts_x = events["instrument"].tolist(), events["seq"].tolist(), events["ts_exchange_ns"].tolist()
    kind, n_levels, prio = events["kind"].tolist(), events["n_levels"].tolist(), events["priority"].tolist()
    price, size, side = events["price"].tolist(), events["size"].tolist(), events["side"].tolist()
    book = np.ascontiguousarray(events["book"], dtype="<f4").reshape(n, -1).view(np.uint8)
    enc = msgspec.msgpack.Encoder().encode
    topic_of: dict[int, bytes] = {}
    topics, payloads, offsets = [], [], []
    for i in range(n):
        if kind[i] == KIND_QUOTE:
            msg = Quote(inst[i], seq[i], ts_x[i], TS_SENTINEL, n_levels[i], book[i, :16 * n_levels[i]].tobytes(),
                        prio[i])
        else:
            msg = Trade(inst[i], seq[i], ts_x[i], TS_SENTINEL, price[i], size[i], side[i], prio[i])
        payload = bytearray(enc(msg))
        off = payload.find(_SENTINEL_BYTES)
        topic = topic_of.get(inst[i])
        if topic is None:
            topic = topic_of[inst[i]] = topic_for(inst[i])
        topics.append(topic)
        payloads.append(payload)
        offsets.append(off + 1 if off >= 0 else -1)
    return EncodedFeed(topics, payloads, offsets, FeedColumns.of_events(events))


def feed_from_frames(frames: list[tuple[bytes, bytes]]) -> EncodedFeed:
    """Frames captured verbatim (record/replay): sent exactly as they were, no patching."""
    return EncodedFeed([t for t, _ in frames], [bytearray(p) for _, p in frames], [-1] * len(frames))


def _pack(frames) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(f) for f in frames), dtype=np.uint32, count=len(frames))
    return np.frombuffer(b"".join(frames), dtype=np.uint8), lengths


def _unpack(blob: np.ndarray, lengths: np.ndarray, kind=bytes) -> list:
    data = blob.tobytes()
    ends = np.cumsum(lengths, dtype=np.int64).tolist()
    starts = [0] + ends[:-1]
    return [kind(data[a:b]) for a, b in zip(starts, ends)]


def save_feed(path: str, feed: EncodedFeed, offsets_ns: np.ndarray) -> None:
    """Write the frames and their intended offsets for a pacer process (`load_feed`)."""
    t_blob, t_len = _pack(feed.topics)
    p_blob, p_len = _pack(feed.payloads)
    cols = {}
    c = feed.columns
    if c is not None:
        cols = {"col_levels": np.int64(c.levels), "col_batchable": c.batchable,
                **{f"col_{name}": np.frombuffer(getattr(c, name), dtype=np.uint8) for name in _COLUMNS}}
    np.savez(path, topic_blob=t_blob, topic_len=t_len, payload_blob=p_blob, payload_len=p_len,
             ts_offsets=np.asarray(feed.ts_offsets, dtype=np.int64), offsets_ns=offsets_ns.astype(np.int64), **cols)


def load_feed(path: str) -> tuple[EncodedFeed, np.ndarray]:
    with np.load(path) as z:
        topics = _unpack(z["topic_blob"], z["topic_len"])
        payloads = _unpack(z["payload_blob"], z["payload_len"], bytearray)
        columns = None
        if "col_levels" in z:
            columns = FeedColumns(int(z["col_levels"]), z["col_batchable"].copy(),
                                  **{name: z[f"col_{name}"].tobytes() for name in _COLUMNS})
        return EncodedFeed(topics, payloads, z["ts_offsets"].tolist(), columns), z["offsets_ns"].copy()


def direct_send(sock):
    """As `_direct_send`; for an iceoryx2 publisher (transport/shm.py) its send, called the same way
    (there are no topic frames over iceoryx2: its Pacer has topic_frame=False)."""
    if isinstance(sock, ShmPublisher):
        shm_send = sock.send
        return lambda data, flags, copy, track: shm_send(data)
    return _direct_send(sock)


def _direct_send(sock: zmq.Socket):
    """`sock.send` without pyzmq's Python layer: the compiled backend method, bound, to be
    called positionally as send(data, flags, copy, track). zmq.Socket.send is a Python
    wrapper (draft sockets' routing_id/group) that calls it with keyword arguments; the
    direct call costs about half (tools/bench_capture.py). Falls back to sock.send."""
    for klass in type(sock).__mro__[1:]:
        if klass.__module__.startswith("zmq.backend") and "send" in vars(klass):
            return klass.send.__get__(sock)
    return lambda data, flags=0, copy=True, track=False: sock.send(data, flags, copy=copy, track=track)


@dataclass
class PaceResult:
    intended_mono_ns: np.ndarray  # intended send time per event (perf_counter_ns clock)
    actual_mono_ns: np.ndarray  # actual send time per event
    sent: int
    elapsed_s: float

    @property
    def lateness_ns(self) -> np.ndarray:
        return self.actual_mono_ns[: self.sent] - self.intended_mono_ns[: self.sent]

    @property
    def rate_achieved(self) -> float:
        """Events per second between the first and the last send."""
        return (self.sent - 1) / self.elapsed_s if self.sent > 1 else 0.0


def _result(intended: np.ndarray, actual: list[int], n: int) -> PaceResult:
    """The run's PaceResult from the send times recorded (one per event sent, in order)."""
    sent = len(actual)
    actual += [0] * (n - sent)
    elapsed = (actual[sent - 1] - actual[0]) / 1e9 if sent else 0.0
    return PaceResult(intended, np.asarray(actual, dtype=np.int64), sent, max(elapsed, 1e-9))


class Pacer:
    def __init__(self, sock: zmq.Socket, feed: EncodedFeed, offsets_ns: np.ndarray, *, topic_frame: bool = True,
                 progress_hook: Callable[[int, int], object] | None = None,
                 progress_interval_s: float = 1.0, spin: bool = True,
                 idle_hook: Callable[[], object] | None = None, feed_batch: int = 1,
                 feed_batch_us: float = 100.0, shard_of: np.ndarray | None = None, shard_count: int = 1,
                 shard_socks: list | None = None) -> None:
        """`idle_hook`: work to do in this thread while waiting (a collector sharing it);
        it delays every decision it reads while the pacer is busy sending, which is why
        `bench`/`replay` run their collector as a process of its own. `feed_batch`: send up to
        this many events that are due together as one EventBatch frame (needs `feed.columns`),
        and no more than one frame per `feed_batch_us` (a frame due sooner waits for the rest).
        `shard_of` (the shard of each event, 0..shard_count-1) with `shard_count` > 1: the events
        due together go as one EventBatch per shard, each under that shard's batch topic
        (codec.shard_batch_topic), for `serve --shard I/N` services on one feed. `shard_socks`
        (one per shard, in shard order; `sock` is then unused): each shard's frames go to its own
        publisher instead, with no topic frame -- one iceoryx2 service per shard, which has no
        topics to filter one feed by (`bench --shards N --transport iceoryx2`); an event due alone
        goes to its shard's publisher too."""
        if len(feed) != offsets_ns.shape[0]:
            raise ValueError("one intended offset per frame")
        if feed_batch < 1:
            raise ValueError("feed_batch must be >= 1")
        if feed_batch > 1 and (feed.columns is None or idle_hook is not None):
            raise ValueError("feed_batch > 1 needs the feed's columns (encode_feed) and no idle hook")
        self.feed_batch = feed_batch
        self.feed_batch_ns = int(feed_batch_us * 1000)
        self.sock = sock
        self.feed = feed
        self.offsets = offsets_ns.astype(np.int64)
        self.topic_frame = topic_frame
        self.progress_hook = progress_hook
        self.progress_interval_ns = int(progress_interval_s * 1e9)
        self.spin = spin
        self.idle_hook = idle_hook
        self._stop = False
        self._prepared = False
        self._shards = None
        self._shard_of = shard_of
        self._send_of_event = None  # shard_socks: each event's shard's send (prepare)
        # each shard's own send (shard_socks), else None: the one socket's, under the shard's topic
        self._shard_sends = None if shard_socks is None else [direct_send(sock) for sock in shard_socks]
        if shard_socks is not None and (len(shard_socks) != shard_count or shard_count < 2 or feed_batch < 2
                                        or topic_frame):
            raise ValueError("shard_socks: one per shard (shard_count >= 2), with feed_batch > 1 and no topic frames")
        if shard_count > 1 and feed_batch > 1:
            if shard_of is None or len(shard_of) != len(feed):
                raise ValueError("shard_count > 1 needs the shard of every event (shard_of)")
            # per shard: its batch topic, its events' feed indices (sorted) and their columns, so
            # that a shard's events among those due together are one slice of its own columns
            self._shards = []
            for k in range(shard_count):
                idx = np.flatnonzero(shard_of == k)
                if len(idx):
                    self._shards.append((shard_batch_topic(k, shard_count), idx, feed.columns.take(idx).batch,
                                         self._shard_sends[k] if self._shard_sends else None))

    def stop(self) -> None:
        """Stop sending (from another thread or a signal handler), at the next progress tick."""
        self._stop = True

    def prepare(self) -> None:
        """What costs time in proportion to the feed besides the constructor's per-shard split,
        done before the schedule starts: the offsets and the batching plan as Python lists, and a
        full collection, after which the feed's objects are frozen (never traversed again). `run`
        calls it if nobody did; pacer_proc.py builds the Pacer and calls it before it reports its
        subscriptions, so that `go`'s lead time is spent on neither (before 2026-12-04 it was:
        with 1.2M-2.5M events and 8 shards the first sends were 0.4-1.1 s late on the H200 host,
        and the run's rate looked higher than offered)."""
        if self._prepared:
            return
        n = len(self.feed)
        self._offsets = self.offsets.tolist()  # Python ints: cheap to compare in the loop
        if self.feed_batch > 1:
            cols = self.feed.columns
            # the first event at or after each one that cannot be batched (a batch stops before it)
            stop = np.flatnonzero(~cols.batchable)
            self._stop_at = np.append(stop, n)[np.searchsorted(stop, np.arange(n), side="right")].tolist()
            self._batchable = cols.batchable.tolist()
            if self._shard_sends is not None:  # an event due alone goes to its shard's publisher
                self._send_of_event = [self._shard_sends[k] for k in self._shard_of.tolist()]
        # A full collection over the feed's millions of objects would stall the schedule for
        # milliseconds: collect once here, freeze what exists, collect nothing mid-run.
        gc.collect()
        gc.freeze()
        self._prepared = True

    def run(self, start_mono_ns: int | None = None, start_delay_ns: int = 1_000_000) -> PaceResult:
        """Send every frame at its intended time; the schedule starts at `start_mono_ns`
        (perf_counter_ns clock), or `start_delay_ns` from now."""
        self.prepare()
        gc.disable()
        try:
            start = perf_ns() + start_delay_ns if start_mono_ns is None else start_mono_ns
            if self.idle_hook is not None:
                return self._run_shared(start)
            return self._run_batched(start) if self.feed_batch > 1 else self._run(start)
        finally:
            gc.enable()
            gc.unfreeze()
            self._prepared = False  # unfrozen: a second run collects and freezes again

    def _run(self, start: int) -> PaceResult:
        n = len(self.feed)
        actual: list[int] = []
        record = actual.append
        send = direct_send(self.sock)
        SNDMORE = int(zmq.SNDMORE)  # a plain int: an enum flag costs ~1.7 us per send (tools/bench_capture.py)
        pack_into = _U64.pack_into
        time_ns = time.time_ns
        interval = self.progress_interval_ns
        next_progress = start + interval
        topic_frame = self.topic_frame
        spin = self.spin
        for offset, topic, payload, off in zip(self._offsets, self.feed.topics, self.feed.payloads,
                                               self.feed.ts_offsets):
            target = start + offset
            now = perf_ns()
            if now < target:  # time to spare: the call costs nothing that matters
                now = wait_until(target, now, spin)
            if off >= 0:
                pack_into(payload, off, time_ns())  # CLOCK_REALTIME read now, never a stale offset
            if topic_frame:
                send(topic, SNDMORE, True, False)
            send(payload, 0, True, False)
            record(now)
            if now >= next_progress:  # about once a second: the only non-send work in the loop
                next_progress = now + interval
                if self._progress(len(actual), n):
                    break
        return _result(self.offsets + start, actual, n)

    def _progress(self, sent: int, n: int) -> bool:
        """The loops' once-a-second work: report progress; True when asked to stop."""
        if self.progress_hook is not None:
            self.progress_hook(sent, n)
        return self._stop

    def _run_batched(self, start: int) -> PaceResult:
        """`_run`, except that events already due when one is sent go with it, up to feed_batch of
        them, as one EventBatch frame (a run of batchable quotes; anything else alone)."""
        n = len(self.feed)
        offsets = self._offsets
        actual: list[int] = []
        record, extend = actual.append, actual.extend
        send = direct_send(self.sock)
        SNDMORE = int(zmq.SNDMORE)
        pack_into = _U64.pack_into
        time_ns = time.time_ns
        encode = msgspec.msgpack.Encoder().encode
        make_batch = self.feed.columns.batch
        stop_at, batchable = self._stop_at, self._batchable
        topics, payloads, ts_offsets = self.feed.topics, self.feed.payloads, self.feed.ts_offsets
        most = self.feed_batch
        gap = self.feed_batch_ns
        last_send = -gap
        interval = self.progress_interval_ns
        next_progress = start + interval
        topic_frame = self.topic_frame
        spin = self.spin
        searchsorted = np.searchsorted
        # per shard: the topic frame to send first (None: none) and the send of its batches
        shards = None if self._shards is None else [
            (topic if topic_frame else None, idx, shard_batch, shard_send or send)
            for topic, idx, shard_batch, shard_send in self._shards]
        send_of_event = self._send_of_event
        i = 0
        while i < n:
            target = start + offsets[i]
            now = perf_ns()
            if now < target:
                now = wait_until(target, now, spin)
            hold = last_send + gap
            # a frame went out less than `gap` ago and another event is due before the gap ends:
            # wait for the gap and send them together (one event alone goes at once)
            if now < hold and batchable[i] and i + 1 < n and start + offsets[i + 1] <= hold:
                now = wait_until(hold, now, spin)
            last_send = now
            j = i + 1
            if batchable[i]:  # every event due by now, up to `most` and the next unbatchable one
                j = max(j, bisect_right(offsets, now - start, i, min(i + most, stop_at[i])))
            if j - i > 1:
                if shards is None:
                    if topic_frame:
                        send(BATCH_TOPIC, SNDMORE, True, False)
                    send(encode(make_batch(i, j, time_ns())), 0, True, False)
                else:  # one batch per shard of its events among i..j (a slice of its own columns)
                    ts = time_ns()
                    for topic, idx, shard_batch, shard_send in shards:
                        a, b = searchsorted(idx, (i, j)).tolist()
                        if b > a:
                            if topic is not None:
                                send(topic, SNDMORE, True, False)
                            shard_send(encode(shard_batch(a, b, ts)), 0, True, False)
                extend([now] * (j - i))
            else:
                payload = payloads[i]
                off = ts_offsets[i]
                if off >= 0:
                    pack_into(payload, off, time_ns())
                if send_of_event is not None:
                    send_of_event[i](payload, 0, True, False)
                else:
                    if topic_frame:
                        send(topics[i], SNDMORE, True, False)
                    send(payload, 0, True, False)
                record(now)
            i = j
            if now >= next_progress:
                next_progress = now + interval
                if self._progress(len(actual), n):
                    break
        return _result(self.offsets + start, actual, n)

    def _run_shared(self, start: int) -> PaceResult:
        """The loop with an idle hook: a collector in this thread reads decisions only when the
        pacer has IDLE_HOOK_MIN_NS to spare, or between sleep slices."""
        n = len(self.feed)
        offsets = self._offsets
        actual = [0] * n
        topics, payloads, ts_off = self.feed.topics, self.feed.payloads, self.feed.ts_offsets
        send = direct_send(self.sock)
        SNDMORE = int(zmq.SNDMORE)
        idle, progress = self.idle_hook, self.progress_hook
        next_progress = start + self.progress_interval_ns
        threshold, margin = (SLEEP_THRESHOLD_NS, SLEEP_MARGIN_NS) if self.spin else (0, 0)
        i = 0
        while i < n and not self._stop:
            target = start + offsets[i]
            now = perf_ns()
            while now < target:
                ahead = target - now
                if ahead > threshold:
                    idle()
                    nap = ahead - margin
                    time.sleep((nap if self.spin or nap < SLEEP_SLICE_NS else SLEEP_SLICE_NS) / 1e9)
                elif ahead > IDLE_HOOK_MIN_NS:
                    idle()
                now = perf_ns()
            if ts_off[i] >= 0:
                _U64.pack_into(payloads[i], ts_off[i], time.time_ns())
            if self.topic_frame:
                send(topics[i], SNDMORE, True, False)
            send(payloads[i], 0, True, False)
            actual[i] = now
            i += 1
            if now >= next_progress:
                next_progress = now + self.progress_interval_ns
                if progress is not None:
                    progress(i, n)
                idle()  # behind schedule for a long stretch: still read decisions now and then
        elapsed = (actual[i - 1] - actual[0]) / 1e9 if i else 0.0
        return PaceResult(self.offsets + start, np.asarray(actual, dtype=np.int64), i, max(elapsed, 1e-9))
