"""Say so when the feed itself arrives late: every event too old on arrival, nothing stepped.

Past its deadline an event is shed at ingest (LATE for a stateful model, STALE for a
conflating one) so that it costs the least. When events reach the service already older than
the deadline -- the publisher, the transport or its I/O threads fell behind, or the
publisher's clock runs behind this host's -- every event is shed that way, nothing is queued
or stepped, and the accounting alone shows only "100 % shed": it reads like a model past its
capacity. On an H100 host, 12 lstm_a shards whose libzmq I/O threads shared one saturated
helper core read their feed 4+ ms late and stayed there, shedding everything for whole seconds
(BENCHMARKS.md wave 27). This watch tells the two apart in the log, once per stats interval
(cold): an interval in which at least MIN_EVENTS arrived, some were shed as too old at ingest,
at most 1 - LATE_SHARE of them were rejected (bad input), no step ran, and nothing is queued or
in flight (an engine that stopped keeps steps in flight; an overloaded one has queues) is a late
feed: a fresh event would have been queued and stepped, so every one was too old (shed, or for a
conflating model conflated into one that was). The spell's length so far is the gauge
`feed_late_us` (transport/stats.GAUGES: stats snapshots, Prometheus, the dashboard), 0 while on time.
"""

from __future__ import annotations

from hft_infer.transport.schema import Reason

MIN_EVENTS = 50  # fewer in an interval: too few to say anything
LATE_SHARE = 0.9  # of the interval's events not rejected (bad input is another matter)
REPEAT_NS = 10_000_000_000  # while it lasts, say so again this often
_LATE, _STALE = int(Reason.LATE), int(Reason.STALE)


class LateFeedWatch:
    def __init__(self, acct, max_age_us: int, log) -> None:
        self.acct = acct
        self.max_age_us = max_age_us
        self.log = log
        self._received = self._old = self._batches = self._rejected = 0
        self.since_ns = 0  # when the current late spell began: the start of its first interval (0: none)
        self._last_check_ns = 0
        self._told_ns = 0
        self._shed_in_spell = 0

    def late_ns(self, now: int) -> int:
        """How long the current late spell has lasted at `now` (0: the feed is on time)."""
        return now - self.since_ns if self.since_ns else 0

    def check(self, now: int, idle: bool) -> None:
        """At a stats interval: `idle` = nothing queued and no step in flight."""
        acct = self.acct
        received, old, batches = acct.received, acct.by_reason[_LATE] + acct.by_reason[_STALE], acct.batches
        d_recv, d_old, d_steps = received - self._received, old - self._old, batches - self._batches
        d_rej = acct.rejected - self._rejected
        self._received, self._old, self._batches, self._rejected = received, old, batches, acct.rejected
        interval_start, self._last_check_ns = self._last_check_ns or now, now
        if d_recv < MIN_EVENTS:
            return
        if d_steps == 0 and idle and d_old > 0 and d_recv - d_rej >= LATE_SHARE * d_recv:
            if not self.since_ns:
                self.since_ns, self._told_ns, self._shed_in_spell = interval_start, 0, 0
            self._shed_in_spell += d_old
            if not self._told_ns or now - self._told_ns >= REPEAT_NS:
                self._told_ns = now
                spell_s = (now - self.since_ns) / 1e9
                self.log(f"warning: the feed arrives late: the last {d_recv:,} events were older than the deadline "
                         f"(scheduler.max_age_us = {self.max_age_us}) on arrival and ended at ingest ({d_old:,} shed "
                         f"as too old, the rest conflated into those or rejected), nothing stepped ({spell_s:.1f} s "
                         "so far). The delay is before this service: the publisher, the transport or its I/O "
                         "threads' cores (a helper core kept busy), or a publisher clock behind this host's")
        elif self.since_ns:
            self.log(f"the feed is on time again after {(now - self.since_ns) / 1e9:.1f} s late "
                     f"({self._shed_in_spell:,} events shed as too old on arrival meanwhile)")
            self.since_ns = 0
