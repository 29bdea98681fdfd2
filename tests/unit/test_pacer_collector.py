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
from hft_infer.transport.codec import SERVICE_TOPIC, IngressDecoder, ReusableEncoder, encode, topic_for
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


def test_encode_feed_writes_exactly_what_to_message_encodes():
    from hft_infer.replay.events import to_message
    from hft_infer.replay.pacer import TS_SENTINEL
    from hft_infer.replay.synthetic import SyntheticConfig, generate
    from hft_infer.transport.codec import encode

    ev = generate(3000, SyntheticConfig(instruments=8, seed=2))
    ev["priority"][::7] = 1
    assert (ev["kind"] == 1).any()  # trades too
    feed = encode_feed(ev)
    assert [bytes(p) for p in feed.payloads] == [encode(to_message(ev[i], TS_SENTINEL)) for i in range(len(ev))]
    assert feed.topics == [topic_for(int(i)) for i in ev["instrument"]]


def test_feed_file_round_trip(tmp_path):
    from hft_infer.replay.pacer import feed_from_frames, load_feed, save_feed

    feed = encode_feed(_events(50))
    save_feed(str(tmp_path / "f.npz"), feed, constant_rate(50, 1000.0))
    back, offsets = load_feed(str(tmp_path / "f.npz"))
    assert back == feed and offsets.tolist() == constant_rate(50, 1000.0).tolist()
    raw = feed_from_frames([(b"", b"\x01\x02"), (b"\x00\x00\x00\x07", b"x")])  # captures: empty topics too
    save_feed(str(tmp_path / "g.npz"), raw, np.zeros(2, np.int64))
    assert load_feed(str(tmp_path / "g.npz"))[0] == raw


def _batch(rows, ts_decision=7):
    from hft_infer.transport.schema import DecisionBatch

    inst = np.array([r[0] for r in rows], "<u4").tobytes()
    seq = np.array([r[1] for r in rows], "<u8").tobytes()
    status = np.array([r[2] for r in rows], "u1").tobytes()
    n = len(rows)
    return DecisionBatch(ts_decision, "m", n, inst, seq, status, bytes(n), bytes(n), np.full(n, 0.25, "<f4").tobytes(),
                         np.array([r[3] for r in rows], "<u4").tobytes(), np.full(n, 100, "<i8").tobytes(),
                         np.full(n, 150, "<i8").tobytes())


def test_decode_frames_reads_batches_decisions_and_status_in_any_mix():
    from hft_infer.replay.collector import analyse, decode_frames

    ev = _events(12, n_inst=3)  # instruments 0,1,2; seqs 0..3
    frames = [encode(Status(0, 0, 0, 0, 0, 0, 0, 0, 0, [0] * 12)),  # before the run
              encode(_batch([(0, 0, 0, 0), (1, 0, 0, 0), (2, 0, 1, 0)])),  # 2 decided, 1 shed
              encode(_decision(0, 1)),
              b"\x93\x10garbage",  # a Decision tag, not a Decision
              encode(_batch([(1, 2, 0, 1), (2, 1, 0, 0)])),  # (1, 2) covers (1, 1): conflated
              encode(_decision(0, 2)), encode(_decision(0, 3)),
              encode(Status(9, 11, 9, 1, 1, 0, 0, 0, 0, [0] * 12, final=True))]
    recv = [10, 20, 30, 35, 40, 50, 60, 70]
    ans = decode_frames(frames, recv)
    assert (ans.batch_frames, ans.decision_frames, ans.undecodable_frames) == (2, 3, 1)
    assert [s.final for _, s in ans.statuses] == [False, True]
    assert ans.cols["recv_mono_ns"].tolist() == [20, 20, 20, 30, 40, 40, 50, 60]  # receive order
    assert ans.cols["score"][0] == 0.25 and ans.cols["ts_decision_ns"][0] == 7 and ans.cols["ts_recv_ns"][0] == 150
    res = analyse(ans, ev["instrument"], ev["seq"], np.zeros(12, np.int64), 12, measure_from=3)
    acc = res.accounting
    assert (acc["decided"], acc["shed"], acc["conflated"], acc["lost"]) == (7, 1, 1, 12 - 9)
    assert acc["received"] == 11  # from the last Status
    assert res.tick_to_decision["count"] == 5  # decided events with index >= 3
    assert res.send_to_service_recv["count"] == 2 and res.send_to_service_recv["p50_us"] == 0.05  # batch rows
    assert ans.decisions()[0] == Decision(0, 0, 0, 0, 0, 0.25, 0, 100, 150, 7, "m")


def test_format_table_never_cuts_numbers_and_marks_missing_values():
    from hft_infer.metrics import format_table

    big = {"count": 123_456_789, "p50_us": 1.25, "p90_us": 123_456_789.0, "p99_us": None, "p999_us": float("nan"),
           "max_us": 9.99e12}
    text = format_table({"a_rather_long_stage_name": big, "ratio": {"count": "", "p50_us": "2.50x"}}, title="T")
    lines = text.splitlines()
    assert lines[0] == "T"
    assert "123,456,789" in text and "123,456,789.0" in text and "9,990,000,000,000.0" in text and "2.50x" in text
    assert len({len(line) for line in lines[1:3]}) == 1  # header and full row aligned
    row = lines[2].split()
    assert row[0] == "a_rather_long_stage_name" and row[4] == "-" and row[5] == "-"
    assert lines[1].split()[:3] == ["stage", "count", "p50"]


def test_plan_harness_gives_pacer_and_collectors_their_own_cores_only_with_enough():
    from hft_infer.app.launcher import plan_harness
    from hft_infer.config import load_config

    cfg = load_config(None, [])  # cpu.cores = "none": the service floats on the helper cores
    big = plan_harness(cfg, "auto", 2, pool=list(range(16)))
    assert (big.pacer_spin, big.pacer_core, big.collector_spin, big.collector_cores) == (True, 15, True, [14, 13])
    assert big.helper_cores == list(range(13)) and big.service_cores == []
    assert plan_harness(cfg, "sleep", 1, pool=list(range(16))).pacer_spin is False  # still on its own core
    small = plan_harness(cfg, "auto", 1, pool=[0, 1])
    assert (small.pacer_spin, small.pacer_core, small.collector_spin, small.collector_cores) == (False, None, False,
                                                                                                  [None])
    assert plan_harness(cfg, "spin", 1, pool=[0, 1]).pacer_spin is True  # asked for: given, collector still blocks
    assert plan_harness(cfg, "auto", 3, pool=[0, 1, 2, 3]).pacer_core is None  # 3 collectors need 5 cores
    assert "pacer: spin on core 15" in big.describe() and big.as_dict()["collector"] == "spin"
