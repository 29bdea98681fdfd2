"""Clocks: one monotonic read per event, converted to the epoch when it goes on the wire.

Stage durations use `time.perf_counter_ns()` (CLOCK_MONOTONIC: never steps,
system-wide, so it is comparable across processes on one host). Timestamps
that leave the process (`ts_recv_ns`, `ts_decision_ns`) and the `wire` stage
(publisher's `ts_send_ns` is CLOCK_REALTIME) need the epoch: rather than a
second clock read per event, `EpochClock` keeps the offset between the two
clocks. The two can drift apart fast: on the 2-core dev VM CLOCK_REALTIME
gained 25 ms on CLOCK_MONOTONIC in 5 s (5000 ppm, measured 2026-12-01), so
a stale offset puts milliseconds of error into cross-process figures. The hot
loop therefore re-reads it once per ingest burst with `sync()` (two clock
reads, ~80 ns), and publishers stamp `ts_send_ns` with time.time_ns() itself.
"""

from __future__ import annotations

import time

perf_ns = time.perf_counter_ns


class EpochClock:
    __slots__ = ("offset_ns",)

    def __init__(self) -> None:
        self.offset_ns = 0
        self.refresh()

    def refresh(self) -> None:
        """Offset = realtime - monotonic, from the tightest of a few bracketed reads."""
        best_gap = None
        for _ in range(5):
            a = perf_ns()
            wall = time.time_ns()
            b = perf_ns()
            if best_gap is None or b - a < best_gap:
                best_gap = b - a
                self.offset_ns = wall - (a + b) // 2

    def sync(self) -> int:
        """Cheap re-read of the offset (one pair of reads): once per burst; returns it."""
        self.offset_ns = time.time_ns() - perf_ns()
        return self.offset_ns

    def epoch(self, mono_ns: int) -> int:
        return mono_ns + self.offset_ns
