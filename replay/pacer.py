"""Open-loop pacing: every event has an intended send time, fixed before the run.

Schedules (offsets in ns from the start, one per event):
- `by_timestamps(ts_exchange_ns, speed)`: the original spacing scaled by 1/speed;
- `constant_rate(n, rate)`, `poisson_rate(n, rate, seed)`;
- `as_fast_as_possible(n)`: all zero (--max).

The pacer spins to hit each intended time, sleeping only when it is far ahead,
and never waits for the service (open loop): when it falls behind it sends
immediately and its lateness (actual - intended) is recorded, so pacing error
is visible rather than silently stretching the schedule. Latency measured
from the *intended* time therefore includes any backlog the service causes
(no coordinated omission).

Frames are encoded before the run. The publisher's `ts_send_ns` field is
patched in place just before each send (the frame was encoded with a
sentinel that msgpack writes as a fixed 9-byte uint64, so its offset is
known), which costs one `struct.pack_into` instead of an encode per event.
"""

from __future__ import annotations

import gc
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import zmq

from hft_infer.clock import perf_ns
from hft_infer.replay.events import to_message
from hft_infer.transport.codec import encode, topic_for

TS_SENTINEL = 0x7FFF_FFFF_FFFF_FFF0
_SENTINEL_BYTES = b"\xcf" + TS_SENTINEL.to_bytes(8, "big")
_U64 = struct.Struct(">Q")

# Sleep only when more than this ahead of schedule (time.sleep overshoots by
# ~60-100 us on the dev VM); otherwise spin.
SLEEP_THRESHOLD_NS = 2_000_000
SLEEP_MARGIN_NS = 1_000_000
# While spinning ahead of schedule, call the idle hook (collector) when at
# least this much time is left before the next send.
IDLE_HOOK_MIN_NS = 20_000
# A sleeping pacer (spin=False) sleeps in slices of this length and runs the
# idle hook between them: the collector shares the thread, and a decision
# that arrives during a long sleep must be timestamped when it arrives, not
# when the next send is due (that would add up to a whole inter-send gap to
# the measured latency).
SLEEP_SLICE_NS = 100_000


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


@dataclass
class EncodedFeed:
    """Wire frames ready to send: topics, payloads (bytearray) and the ts_send offsets."""

    topics: list[bytes]
    payloads: list[bytearray]
    ts_offsets: list[int]  # byte offset of the uint64 ts_send_ns value in each payload (-1: none)

    def __len__(self) -> int:
        return len(self.payloads)


def encode_feed(events: np.ndarray) -> EncodedFeed:
    """Encode an event table into frames whose ts_send_ns can be patched at send time."""
    topics, payloads, offsets = [], [], []
    for i in range(events.shape[0]):
        row = events[i]
        payload = bytearray(encode(to_message(row, TS_SENTINEL)))
        off = payload.find(_SENTINEL_BYTES)
        topics.append(topic_for(int(row["instrument"])))
        payloads.append(payload)
        offsets.append(off + 1 if off >= 0 else -1)
    return EncodedFeed(topics, payloads, offsets)


def feed_from_frames(frames: list[tuple[bytes, bytes]]) -> EncodedFeed:
    """Frames captured verbatim (record/replay): sent exactly as they were, no patching."""
    return EncodedFeed([t for t, _ in frames], [bytearray(p) for _, p in frames], [-1] * len(frames))


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


class Pacer:
    def __init__(self, sock: zmq.Socket, feed: EncodedFeed, offsets_ns: np.ndarray, *, topic_frame: bool = True,
                 idle_hook: Callable[[], object] | None = None,
                 progress_hook: Callable[[int, int], object] | None = None,
                 progress_interval_s: float = 1.0, spin: bool = True) -> None:
        if len(feed) != offsets_ns.shape[0]:
            raise ValueError("one intended offset per frame")
        self.sock = sock
        self.feed = feed
        self.offsets = offsets_ns.astype(np.int64)
        self.topic_frame = topic_frame
        self.idle_hook = idle_hook
        self.progress_hook = progress_hook
        self.progress_interval_ns = int(progress_interval_s * 1e9)
        # spin=False: sleep through every wait (less accurate, lateness recorded): for
        # machines where a spinning pacer would share cores with a spinning service.
        self.sleep_threshold_ns = SLEEP_THRESHOLD_NS if spin else 0
        self.sleep_margin_ns = SLEEP_MARGIN_NS if spin else 0
        self.sleep_slice_ns = None if spin else SLEEP_SLICE_NS
        self._stop = False

    def stop(self) -> None:
        self._stop = True

    def run(self, start_delay_ns: int = 1_000_000) -> PaceResult:
        # A full collection over the feed's millions of objects would stall the
        # schedule for milliseconds: freeze what exists, collect nothing mid-run.
        gc.collect()
        gc.freeze()
        gc.disable()
        try:
            return self._run(start_delay_ns)
        finally:
            gc.enable()
            gc.unfreeze()

    def _run(self, start_delay_ns: int) -> PaceResult:
        n = len(self.feed)
        start = perf_ns() + start_delay_ns
        intended = self.offsets + start
        targets = intended.tolist()  # Python ints: cheap to compare in the loop
        actual = [0] * n
        topics, payloads, ts_off = self.feed.topics, self.feed.payloads, self.feed.ts_offsets
        send = self.sock.send
        SNDMORE = int(zmq.SNDMORE)  # a plain int: an enum flag costs ~1.7 us per send (tools/bench_capture.py)
        pack_into = _U64.pack_into
        time_ns = time.time_ns
        idle = self.idle_hook
        progress = self.progress_hook
        next_progress = start + self.progress_interval_ns
        topic_frame = self.topic_frame
        sleep_threshold, sleep_margin = self.sleep_threshold_ns, self.sleep_margin_ns
        slice_ns = self.sleep_slice_ns
        i = 0
        while i < n and not self._stop:
            target = targets[i]
            now = perf_ns()
            while now < target:
                ahead = target - now
                if ahead > sleep_threshold:
                    if idle is not None:
                        idle()
                    nap = ahead - sleep_margin
                    time.sleep((nap if slice_ns is None or nap < slice_ns else slice_ns) / 1e9)
                elif idle is not None and ahead > IDLE_HOOK_MIN_NS:
                    idle()
                now = perf_ns()
            off = ts_off[i]
            payload = payloads[i]
            if off >= 0:
                pack_into(payload, off, time_ns())  # CLOCK_REALTIME now (see EpochClock.sync)
            if topic_frame:
                send(topics[i], SNDMORE)
            send(payload)
            actual[i] = now
            i += 1
            if now >= next_progress:
                next_progress = now + self.progress_interval_ns
                if progress is not None:
                    progress(i, n)
                if idle is not None:
                    idle()  # behind schedule for a long stretch: still read decisions now and then
        elapsed = (actual[i - 1] - actual[0]) / 1e9 if i else 0.0
        return PaceResult(intended, np.asarray(actual, dtype=np.int64), i, max(elapsed, 1e-9))
