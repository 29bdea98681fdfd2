"""What bench and replay report beside the accounting: the busiest instrument's events/s
(replay.events.busiest_instrument), the service's steps/s and its loop's stalls and preemptions
from its interval snapshots (drive.StatsReceiver.counter_rate / loop_health, fed over a real
PUSH/PULL pair)."""

from __future__ import annotations

import time

import numpy as np
import zmq

from hft_infer.app.drive import Load, StatsReceiver, feed_line
from hft_infer.clock import EpochClock, perf_ns
from hft_infer.loop_stalls import loop_line
from hft_infer.replay.collector import merge_shed_by_instrument, shed_by_instrument, shed_by_instrument_line
from hft_infer.replay.events import beyond_step_rate, busiest_instrument
from hft_infer.transport.schema import Outcome
from hft_infer.transport.stats import Snapshot, encode_snapshot


def test_the_busiest_instrument_is_the_one_with_most_events():
    inst = np.array([5, 9, 9, 2, 9, 5, 7], dtype=np.uint32)
    b = busiest_instrument(inst, elapsed_s=0.5)
    assert b == {"id": 9, "events": 3, "share": 3 / 7, "per_s": 6.0}
    assert busiest_instrument(inst[:0], 1.0) is None
    assert busiest_instrument(inst, 0.0)["per_s"] is None


def test_events_beyond_the_step_rate_are_each_instruments_excess_over_one_row_a_step():
    # over 2 s: instrument 1 has 10 events, 2 has 4, 3 has 1; at 3 steps/s a loop steps each at most
    # 6 times: 4 of instrument 1's are beyond it, none of the others'
    inst = np.array([1] * 10 + [2] * 4 + [3], dtype=np.uint32)
    assert beyond_step_rate(inst, 2.0, 3.0) == 4
    assert beyond_step_rate(inst, 2.0, 1.0) == 8 + 2  # 2 steps each: 8 of 1's, 2 of 2's
    assert beyond_step_rate(inst, 2.0, 100.0) == 0
    assert beyond_step_rate(inst, 2.0, None) is None and beyond_step_rate(inst, 0.0, 3.0) is None
    out = {"busiest_instrument": busiest_instrument(inst, 2.0), "steps_per_s": 3.0,
           "beyond_step_rate": 4, "accounting": {"sent": 15}}
    line = feed_line(out)
    assert "stepped 3 steps/s" in line and "4 events (26.7%) came past that rate" in line, line
    assert "came past" not in feed_line(out | {"beyond_step_rate": None})


def snapshot(end_ns: int, interval_ns: int, batches: int) -> Snapshot:
    # the loop's counters grow with batches: stalls a tenth of them, 300 µs each, all in submit; one
    # preemption of 50 µs per 100 batches
    loop = {"stalls": batches // 10, "stall_ingest_us": 0, "stall_complete_us": 0, "stall_submit_us": batches * 30,
            "stall_other_us": 0, "stall_yield_us": 0, "hot_preemptions": batches // 100,
            "hot_runqueue_wait_us": batches // 2}
    return Snapshot(service="t", pid=1, ts_ns=end_ns, interval_ns=interval_ns, engine="eager", engine_reason="",
                    model_version="m", counters={"batches": batches, **loop}, rejected_by_reason={}, gauges={},
                    stages={}, histogram_highest_ns=10**9, histogram_digits=3)


def test_steps_per_second_counts_only_intervals_wholly_inside_the_measured_feed(tmp_path):
    ctx = zmq.Context()
    endpoint = f"ipc://{tmp_path}/control"
    recv = StatsReceiver(ctx, endpoint)
    push = ctx.socket(zmq.PUSH)
    push.connect(endpoint)
    try:
        # the feed: 10 events 100 ms apart, the first 3 warm-up; the schedule starts at `start`
        start = perf_ns()
        load = Load(events=np.zeros(10), feed=None, offsets_ns=np.arange(10) * 100_000_000, measure_from=3)
        recv.measure(load, start)
        t0 = EpochClock().epoch(start)  # another clock object: equal within its calibration's noise
        assert abs(recv.measure_after_ns - t0 - 300_000_000) < 10_000
        assert abs(recv.measure_until_ns - t0 - 900_000_000) < 10_000
        ms = 1_000_000
        # cumulative counts at the end of 200 ms intervals: warm-up [0, 200], straddling [200, 400],
        # inside [400, 600] and [600, 800], straddling the end [800, 1000] (the drain)
        for end, batches in ((200, 1_000), (400, 2_000), (600, 2_500), (800, 3_300), (1_000, 9_000)):
            push.send(encode_snapshot(snapshot(t0 + end * ms, 200 * ms, batches)))
        deadline = time.monotonic() + 5
        while len(recv.snapshots) < 5 and time.monotonic() < deadline:
            recv.poll()
            time.sleep(0.01)
        assert len(recv.snapshots) == 5
        # (3,300 - 2,000) steps over the two inner intervals, 0.4 s
        assert recv.counter_rate("batches") == 1_300 / 0.4
        # the loop's stalls and preemptions over the same intervals, and bench's line of them
        loop = recv.loop_health()
        assert loop == {"stalls": 130, "stall_ingest_us": 0, "stall_complete_us": 0, "stall_submit_us": 39_000,
                        "stall_other_us": 0, "stall_yield_us": 0, "hot_preemptions": 13, "hot_runqueue_wait_us": 650,
                        "span_s": 0.4}
        line = loop_line(loop)
        assert "130 iterations past metrics.stall_us" in line and "submit 39.0" in line and "13 times" in line
        recv.measure_until_ns = t0 + 500 * ms  # no interval wholly inside any more
        assert recv.counter_rate("batches") is None and recv.loop_health() is None
        assert loop_line(None).startswith("loop: -")
    finally:
        push.close(0)
        recv.sock.close(0)
        ctx.term()


def test_the_reasons_line_names_each_reason_with_its_outcome_most_frequent_first():
    from hft_infer.accounting import reasons_by_name, reasons_line
    from hft_infer.transport.schema import Reason

    counts = [0] * (len(Reason) + 1)
    counts[Reason.LATE], counts[Reason.STALE], counts[Reason.DECODE_ERROR] = 140_052, 54_720, 3
    counts[len(Reason)] = 2  # a reason a newer service counts
    by_reason = reasons_by_name(counts)
    assert by_reason == {"DECODE_ERROR": 3, "STALE": 54_720, "LATE": 140_052, f"REASON_{len(Reason)}": 2}
    assert reasons_line(by_reason) == ("shed and rejected by reason (the service): LATE 140,052 (shed), "
                                       f"STALE 54,720 (shed), DECODE_ERROR 3 (rejected), REASON_{len(Reason)} 2 "
                                       "(rejected)")
    assert reasons_line({}) == "shed and rejected by reason (the service): none"
    assert reasons_line(None, "shard 0").startswith("shed and rejected by reason: - (shard 0: no final Status)")


def test_a_running_services_reasons_are_counted_from_the_runs_start():
    """bench against a running service (not started by bench): its Status counts since it started,
    so the run's reasons are the last Status's less the one seen before the run; none: None."""
    from hft_infer.app.drive import run_reasons
    from hft_infer.transport.schema import Reason, Status

    def status(late: int, stale: int, n: int = len(Reason)) -> Status:
        counts = [0] * n
        counts[Reason.LATE], counts[Reason.STALE] = late, stale
        return Status(0, 0, 0, 0, 0, 0, 0, 0, 0, counts)

    assert run_reasons(status(120, 7), status(100, 7)) == {"LATE": 20}
    assert run_reasons(status(120, 7), None) == {"STALE": 7, "LATE": 120}
    assert run_reasons(status(5, 0, n=len(Reason) + 1), status(2, 0)) == {"LATE": 3}  # a newer service's longer list
    assert run_reasons(None, None) is None


def test_shed_by_instrument_names_the_instruments_that_shed_most():
    # outcome per event: 7 has 3 shed of 4, 2 has 2 of 2, 5 has 1 of 4 (and a conflated, a rejected and a
    # lost one (-1), not shed), 9 none of 1: the shed ones alone count
    S, D, C, R = int(Outcome.SHED), int(Outcome.DECIDED), int(Outcome.CONFLATED), int(Outcome.REJECTED)
    inst = np.array([7, 7, 2, 5, 7, 9, 5, 2, 7, 5, 5], dtype=np.uint32)
    outcome = np.array([S, S, S, C, D, D, S, S, S, R, -1])
    s = shed_by_instrument(outcome, inst, top=2)
    assert s == {"shed": 6, "instruments": 4, "instruments_shed": 3,
                 "top": [{"id": 7, "shed": 3, "events": 4}, {"id": 2, "shed": 2, "events": 2}]}
    # ties: the lower id first
    tie = shed_by_instrument(np.array([S, S]), np.array([8, 3], dtype=np.uint32))
    assert [t["id"] for t in tie["top"]] == [3, 8]
    none = shed_by_instrument(np.array([D, D]), np.array([1, 2], dtype=np.uint32))
    assert none == {"shed": 0, "instruments": 2, "instruments_shed": 0, "top": []}
    assert shed_by_instrument_line(none) is None and shed_by_instrument_line(None) is None
    line = shed_by_instrument_line(s)
    assert line.startswith("shed by instrument: 3 of 4 instruments lost events to shedding")
    assert "7 3 of 4, 2 2 of 2" in line and "83.3% of the shed" in line, line


def test_shards_shed_by_instrument_merges_their_tops():
    a = {"shed": 10, "instruments": 3, "instruments_shed": 2,
         "top": [{"id": 1, "shed": 8, "events": 20}, {"id": 4, "shed": 2, "events": 5}]}
    b = {"shed": 9, "instruments": 2, "instruments_shed": 2,
         "top": [{"id": 2, "shed": 8, "events": 9}, {"id": 6, "shed": 1, "events": 1}]}
    m = merge_shed_by_instrument([a, b], top=3)
    assert m == {"shed": 19, "instruments": 5, "instruments_shed": 4,
                 "top": [{"id": 1, "shed": 8, "events": 20}, {"id": 2, "shed": 8, "events": 9},
                         {"id": 4, "shed": 2, "events": 5}]}
