"""A feed that arrives late says so in the service's log (hft_infer/late_feed.py): a real `serve`,
a real publisher sending quotes whose ts_send_ns is a second past (older than the deadline on
arrival: every one shed at ingest, nothing stepped), then fresh ones (decided: on time again)."""

from __future__ import annotations

import time

from service_harness import TEST_MODEL, ServiceUnderTest

from hft_infer.late_feed import MIN_EVENTS
from hft_infer.transport.schema import Outcome, Reason

STATS = ["metrics.stats_interval_ms=100", "scheduler.max_age_us=5000"]


def _wait_log(svc: ServiceUnderTest, text: str, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        log = svc.log_tail(400)
        if text in log:
            return log
        time.sleep(0.05)
    raise AssertionError(f"no {text!r} in the service log:\n{svc.log_tail(40)}")


def test_a_late_feed_is_named_in_the_log_and_its_end_too():
    with ServiceUnderTest(TEST_MODEL + STATS) as svc:
        svc.start()
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
        late_sent = seq
        # then fresh ones (no send time: the deadline counts from receipt), decided: the spell ends
        t_end = time.monotonic() + 0.5
        while time.monotonic() < t_end:
            svc.send_quotes([(i % 8, seq + i) for i in range(2 * MIN_EVENTS)])
            seq += 2 * MIN_EVENTS
            time.sleep(0.02)
        log = _wait_log(svc, "the feed is on time again after")
        final = svc.stop()
    assert log.count("warning: the feed arrives late") == 1  # said once (again only after 10 s)
    assert final is not None and final.received == seq and final.decided > 0
    # every late event was shed STALE at ingest (the conflating model): none decided
    shed = [d for d in svc.decisions() if d.status == Outcome.SHED and d.seq < late_sent]
    assert final.rejected_by_reason[Reason.STALE] >= len(shed) > 0
    assert not [d for d in svc.decisions() if d.status == Outcome.DECIDED and d.seq < late_sent]


def test_an_idle_or_busy_service_with_a_timely_feed_says_nothing_of_it():
    with ServiceUnderTest(TEST_MODEL + STATS) as svc:
        svc.start()
        for k in range(20):
            svc.send_quotes([(i % 8, k * MIN_EVENTS + i) for i in range(MIN_EVENTS)])
            time.sleep(0.02)
        time.sleep(0.3)  # a few idle intervals too
        final = svc.stop()
        log = svc.log_tail(400)
    assert final is not None and final.decided > 0
    assert "feed arrives late" not in log and "on time again" not in log
