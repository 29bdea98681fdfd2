"""A feed that arrives late says so in the service's log and in the gauge `feed_late_us` of its
stats snapshots (hft_infer/late_feed.py): a real `serve`, a real publisher sending quotes whose
ts_send_ns is a second past (older than the deadline on arrival: every one shed at ingest, nothing
stepped), then fresh ones (decided: on time again), and a real PULL where the control process
would read the snapshots."""

from __future__ import annotations

import time

import zmq
from service_harness import TEST_MODEL, ServiceUnderTest

from hft_infer.late_feed import MIN_EVENTS
from hft_infer.transport.schema import Outcome, Reason
from hft_infer.transport.stats import decode_snapshot

STATS = ["metrics.stats_interval_ms=100", "scheduler.max_age_us=5000"]


def _wait_log(svc: ServiceUnderTest, text: str, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        log = svc.log_tail(400)
        if text in log:
            return log
        time.sleep(0.05)
    raise AssertionError(f"no {text!r} in the service log:\n{svc.log_tail(40)}")


def _snapshot_reader(svc: ServiceUnderTest) -> zmq.Socket:
    """A PULL bound where the service pushes its stats snapshots (the control process's place)."""
    pull = svc.ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.bind(svc.endpoint("control"))
    return pull


def _late_gauges(pull: zmq.Socket) -> list[float]:
    """feed_late_us of every snapshot waiting on `pull`, oldest first."""
    out = []
    while pull.poll(0):
        out.append(decode_snapshot(pull.recv()).gauges["feed_late_us"])
    return out


def test_a_late_feed_is_named_in_the_log_and_its_end_too():
    with ServiceUnderTest(TEST_MODEL + STATS) as svc:
        pull = _snapshot_reader(svc)
        svc.start()
        _late_gauges(pull)  # start-up's snapshots
        seq = 0
        # ~3 stats intervals of events a second old on arrival (at least MIN_EVENTS an interval)
        t_end = time.monotonic() + 0.5
        while time.monotonic() < t_end:
            old = time.time_ns() - 1_000_000_000
            svc.send_quotes([(i % 8, seq + i) for i in range(2 * MIN_EVENTS)], ts_send_ns=old)
            seq += 2 * MIN_EVENTS
            time.sleep(0.02)
        log = _wait_log(svc, "warning: the feed arrives late")
        assert "older than the deadline (scheduler.max_age_us = 5000) on arrival" in log
        assert "on time again" not in log
        late = _late_gauges(pull)
        # the spell counts from the start of its first interval: a whole interval already at its first snapshot
        spell = [g for g in late if g > 0]
        assert spell and spell == sorted(spell) and spell[-1] >= 100_000, late  # >= one 100 ms interval
        late_sent = seq
        # then fresh ones (no send time: the deadline counts from receipt), decided: the spell ends
        t_end = time.monotonic() + 0.5
        while time.monotonic() < t_end:
            svc.send_quotes([(i % 8, seq + i) for i in range(2 * MIN_EVENTS)])
            seq += 2 * MIN_EVENTS
            time.sleep(0.02)
        log = _wait_log(svc, "the feed is on time again after")
        time.sleep(0.25)  # a snapshot shipped after the spell ended
        on_time = _late_gauges(pull)
        final = svc.stop()
        pull.close()
    assert on_time and on_time[-1] == 0.0, on_time
    assert log.count("warning: the feed arrives late") == 1  # said once (again only after 10 s)
    assert final is not None and final.received == seq and final.decided > 0
    # every late event was shed STALE at ingest (the conflating model): none decided
    shed = [d for d in svc.decisions() if d.status == Outcome.SHED and d.seq < late_sent]
    assert final.rejected_by_reason[Reason.STALE] >= len(shed) > 0
    assert not [d for d in svc.decisions() if d.status == Outcome.DECIDED and d.seq < late_sent]


def test_an_idle_or_busy_service_with_a_timely_feed_says_nothing_of_it():
    with ServiceUnderTest(TEST_MODEL + STATS) as svc:
        pull = _snapshot_reader(svc)
        svc.start()
        for k in range(20):
            svc.send_quotes([(i % 8, k * MIN_EVENTS + i) for i in range(MIN_EVENTS)])
            time.sleep(0.02)
        time.sleep(0.3)  # a few idle intervals too
        gauges = _late_gauges(pull)
        final = svc.stop()
        log = svc.log_tail(400)
        pull.close()
    assert final is not None and final.decided > 0
    assert len(gauges) >= 5 and not any(gauges), gauges
    assert "feed arrives late" not in log and "on time again" not in log
