"""Pacing schedules, the pacer against a real socket, and collector accounting with drops."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from hft_infer.replay.collector import Collector
from hft_infer.replay.events import empty_events
from hft_infer.replay.pacer import (
    Pacer,
    as_fast_as_possible,
    by_timestamps,
    constant_rate,
    encode_feed,
    poisson_rate,
)
from hft_infer.transport.codec import SERVICE_TOPIC, IngressDecoder, ReusableEncoder, topic_for
from hft_infer.transport.schema import Decision, Status


def test_constant_rate_schedule():
    off = constant_rate(5, 1000.0)
    assert off.tolist() == [0, 1_000_000, 2_000_000, 3_000_000, 4_000_000]


def test_poisson_schedule_is_deterministic_increasing_and_has_the_mean_rate():
    a, b = poisson_rate(200_000, 50_000.0, seed=3), poisson_rate(200_000, 50_000.0, seed=3)
    assert np.array_equal(a, b) and a[0] == 0 and np.all(np.diff(a) >= 0)
    mean_gap_ns = a[-1] / (a.size - 1)
    assert abs(mean_gap_ns - 20_000) < 200  # within 1 % of 1/rate
    gaps = np.diff(a)
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.02  # exponential: coefficient of variation 1


def test_timestamp_schedule_scales_by_speed():
    ts = np.array([1_000, 3_000, 3_000, 11_000], dtype=np.int64)
    assert by_timestamps(ts, 1.0).tolist() == [0, 2000, 2000, 10000]
    assert by_timestamps(ts, 2.0).tolist() == [0, 1000, 1000, 5000]
    with pytest.raises(ValueError):
        by_timestamps(ts, 0.0)
    assert as_fast_as_possible(3).tolist() == [0, 0, 0]


def _events(n, n_inst=4):
    ev = empty_events(n, 2)
    ev["instrument"] = np.arange(n) % n_inst
    ev["seq"] = np.arange(n) // n_inst
    ev["n_levels"] = 2
    ev["book"] = 1.0
    return ev


def test_pacer_sends_every_frame_in_order_with_patched_send_times(zctx):
    ev = _events(400)
    feed = encode_feed(ev)
    pub = zctx.socket(zmq.PUSH)
    pull = zctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    pub.connect(f"tcp://127.0.0.1:{port}")
    res = Pacer(pub, feed, constant_rate(400, 20_000.0)).run()
    got = [pull.recv_multipart() for _ in range(400)]
    dec = IngressDecoder().decode
    msgs = [dec(p) for _, p in got]
    assert [(m.instrument, m.seq) for m in msgs] == list(zip(ev["instrument"].tolist(), ev["seq"].tolist()))
    assert all(t == topic_for(m.instrument) for (t, _), m in zip(got, msgs))
    sends = np.array([m.ts_send_ns for m in msgs])
    assert np.all(np.diff(sends) >= 0) and sends[0] > 1_600_000_000 * 10**9  # real epoch times, in order
    assert res.sent == 400
    assert np.all(res.actual_mono_ns >= res.intended_mono_ns)  # never early
    assert np.all(np.diff(res.actual_mono_ns) >= 0)
    # the schedule's span is a floor for the run's (how much longer it took is the machine's business)
    assert res.actual_mono_ns[-1] - res.actual_mono_ns[0] >= res.intended_mono_ns[-1] - res.actual_mono_ns[0]


def _decision(inst, seq, status=0, nconf=0):
    return Decision(inst, seq, status, 0, 1, 0.5, nconf, 0, 0, 0, "m")


def test_collector_accounts_for_drops_and_conflation(zctx):
    ev = _events(100)
    pub = zctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub = zctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    import time

    time.sleep(0.3)
    enc = ReusableEncoder()
    sent_decisions = 0
    dropped = {(1, 3), (2, 7), (3, 20)}  # these answers "get lost"
    for inst in range(4):
        seqs = list(range(25))
        for s in seqs:
            if (inst, s) in dropped:
                continue
            if inst == 0 and s % 5 != 4:  # instrument 0: conflated in runs of 5
                continue
            nconf = 4 if inst == 0 else 0
            status = 1 if (inst == 2 and s == 0) else 0  # one shed
            pub.send_multipart([topic_for(inst), bytes(enc.encode(_decision(inst, s, status, nconf)))])
            sent_decisions += 1
    pub.send_multipart([SERVICE_TOPIC, bytes(enc.encode(Status(0, 100, 76, 1, 20, 0, 0, 0, 0, [0] * 12,
                                                               final=True)))])
    col = Collector(sub)
    assert col.wait_final(5.0)
    intended = np.arange(100, dtype=np.int64)
    res = col.result(ev["instrument"], ev["seq"], intended, 100)
    acc = res.accounting
    assert acc["conflated"] == 20 and acc["shed"] == 1 and acc["rejected"] == 0
    assert acc["decided"] == sent_decisions - 1  # every answer but the shed one
    assert acc["lost"] == len(dropped)
    assert res.unmatched == 0 and res.duplicates == 0
