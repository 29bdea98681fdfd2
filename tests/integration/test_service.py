"""The service as a real subprocess over real ipc sockets: accounting, shedding,
conflation, bad input, drain on SIGTERM, summary output."""

from __future__ import annotations

import math

import numpy as np
from service_harness import TEST_MODEL, ServiceUnderTest, quote

from hft_infer.metrics import SERVICE_STAGES
from hft_infer.transport.codec import encode, pack_book, topic_for
from hft_infer.transport.schema import Decision, Heartbeat, Outcome, Quote, Reason, Status, Trade
from hft_infer.transport.stats import GAUGES


def _identity(st: Status) -> bool:
    return st.received == st.decided + st.shed + st.conflated + st.rejected + st.pending


def test_accounting_identity_under_load_with_bad_input_mixed_in():
    with ServiceUnderTest() as svc:
        svc.start()
        rng = np.random.default_rng(7)
        frames, seqs = [], [0] * 64
        bad = 0
        for k in range(6000):
            inst = int(rng.integers(0, 64))
            if k % 100 == 50:
                frames.append((topic_for(inst), b"\x93garbage"))  # undecodable
                bad += 1
                continue
            frames.append((topic_for(inst), quote(inst, seqs[inst])))
            seqs[inst] += 1
        frames.append((topic_for(0), encode(Heartbeat(1, "feed"))))  # not an event
        svc.send(frames)
        final = svc.stop()
        assert svc.proc.returncode == 0, svc.log_tail()
    assert final is not None and final.final and final.pending == 0 and _identity(final)
    assert final.received == 6000
    assert final.rejected == bad == final.rejected_by_reason[Reason.DECODE_ERROR]
    assert final.seq_gaps == 0
    decisions = [m for m in svc.messages() if isinstance(m, Decision)]
    answered = sum(1 for d in decisions if d.status in (Outcome.DECIDED, Outcome.SHED))
    assert answered + sum(d.n_conflated for d in decisions) + bad == 6000  # nothing lost
    assert final.decided == sum(1 for d in decisions if d.status == Outcome.DECIDED)


def test_deadline_shedding_answers_shed():
    # Every request is older than 1 us by the time it is picked: all shed, none decided.
    with ServiceUnderTest(TEST_MODEL + ["scheduler.max_age_us=1"]) as svc:
        svc.start()
        svc.send_quotes([(i % 8, i // 8) for i in range(40)], gap_s=0.001)
        final = svc.stop()
    shed = [d for d in svc.decisions() if d.status == Outcome.SHED]
    assert final.decided == 0 and final.shed == len(shed) > 0
    assert all(d.reason == Reason.STALE and d.action == 0 for d in shed)
    assert final.shed + final.conflated == 40 and _identity(final)


def test_conflation_merges_a_burst_into_one_decision():
    # A 200 ms batching window: the burst of one instrument is conflated into one trigger.
    with ServiceUnderTest(TEST_MODEL + ["scheduler.policy=window", "scheduler.max_wait_us=200000",
                                        "scheduler.max_age_us=10000000"]) as svc:
        svc.start()
        svc.send_quotes([(5, s) for s in range(10)])
        msgs = svc.wait_for(lambda m: any(isinstance(x, Decision) for x in m))
        final = svc.stop()
    d = [x for x in msgs if isinstance(x, Decision)]
    assert len(d) == 1 and d[0].instrument == 5 and d[0].seq == 9 and d[0].n_conflated == 9
    assert d[0].status == Outcome.DECIDED and -1.0 <= d[0].score <= 1.0 and d[0].action in (-1, 0, 1)
    assert final.conflated == 9 and final.decided == 1 and _identity(final)


def test_malformed_frames_are_rejected_with_reasons_and_service_keeps_answering():
    nan_book = np.full((10, 4), 1.0, np.float32)
    nan_book[3, 2] = math.nan
    cases = [
        ([topic_for(1), b"\xc1"], Reason.DECODE_ERROR, False),
        ([topic_for(1), encode(Quote(1, 0, 0, 0, 10, pack_book(nan_book)))], Reason.NON_FINITE, True),
        ([topic_for(1), encode(Quote(1, 1, 0, 0, 3, b"short"))], Reason.BAD_LEVELS, True),
        ([topic_for(1), encode(Quote(999, 0, 0, 0, 1, pack_book(np.ones((1, 4), np.float32))))],
         Reason.UNKNOWN_INSTRUMENT, True),
        ([topic_for(2), quote(1, 2)], Reason.TOPIC_MISMATCH, True),
        # a lone frame (its first bytes match a subscribed topic, or SUB filtering would drop it)
        ([topic_for(1) + quote(1, 3)], Reason.BAD_FRAMING, False),
        ([topic_for(1), quote(1, 4), b"extra"], Reason.BAD_FRAMING, False),
        ([topic_for(1), encode(Trade(1, 5, 0, 0, 10.0, 1.0, 0))], Reason.BAD_FIELD, True),
        ([topic_for(1), encode(Decision(1, 6, 0, 0, 0, 0.0, 0, 0, 0, 0, ""))], Reason.UNEXPECTED_KIND, False),
        ([topic_for(1), b"\x00" * 5000], Reason.OVERSIZED, False),
        ([topic_for(1), encode(Quote(1, 7, 0, 0, 1, pack_book(np.ones((1, 4), np.float32)))) + b"\x00"],
         Reason.DECODE_ERROR, False),
    ]
    with ServiceUnderTest() as svc:
        svc.start()
        svc.send([c[0] for c in cases])
        svc.send_quotes([(1, 100), (2, 0)])  # good events after the bad ones
        msgs = svc.wait_for(lambda m: sum(isinstance(x, Decision) and x.status == 0 for x in m) >= 2)
        final = svc.stop()
    rejected = [d for d in msgs if isinstance(d, Decision) and d.status == Outcome.REJECTED]
    answered_reasons = sorted(d.reason for d in rejected)
    assert answered_reasons == sorted(int(r) for _, r, answered in cases if answered)
    expected = {}
    for _, r, _ in cases:
        expected[r] = expected.get(r, 0) + 1
    for reason, count in expected.items():
        assert final.rejected_by_reason[reason] == count, reason.name
    assert final.rejected == len(cases) and final.decided >= 2 and _identity(final) and final.pending == 0


def test_sigterm_under_load_drains_everything():
    with ServiceUnderTest() as svc:
        svc.start()
        svc.send_quotes([(i % 64, i // 64) for i in range(3000)])
        final = svc.stop()  # immediately: part of the burst is still queued in the socket
        code = svc.proc.returncode
        summary = svc.summary()
        hgrm = (svc.run_dir / "service.hgrm").read_text()
    assert code == 0
    assert final.pending == 0 and final.received == 3000 and _identity(final)
    decisions = svc.decisions()
    assert len(decisions) + sum(d.n_conflated for d in decisions) == 3000
    assert summary["accounting"]["pending"] == 0
    for stage in SERVICE_STAGES:
        row = summary["stages"][stage]
        assert set(row) == {"count", "p50_us", "p90_us", "p99_us", "p999_us", "max_us"}
    # one ingest sample per burst, one step sample per batch, per decided event for the rest
    assert 0 < summary["stages"]["ingest"]["count"] <= 3000
    assert summary["stages"]["step"]["count"] == summary["counters"]["batches"]
    assert summary["stages"]["service"]["count"] == summary["stages"]["queue"]["count"] == final.decided
    assert summary["identity_holds"]
    assert summary["stages"]["wire"]["count"] == 0  # the test publisher sends ts_send_ns = 0
    # the hot thread's preemptions, read from the kernel (hot_thread_stats.py): present and counted
    assert summary["counters"]["hot_preemptions"] >= 0 and summary["counters"]["hot_runqueue_wait_us"] >= 0
    # the gauges as they stood at stop (transport/stats.GAUGES): nothing pending, a conflating model's
    # admission untouched
    gauges = summary["gauges"]
    assert set(gauges) == set(GAUGES) and gauges["queue_depth"] == 0.0 and gauges["admit_margin_us"] == 0.0
    assert "Percentile" in hgrm and "#[Max" in hgrm  # HdrHistogram's percentile distribution format


def test_stalls_are_split_by_the_phase_that_took_them():
    """metrics.stall_us = 1: every working iteration is a stall, so the counters must hold the
    service's own phases: the CPU engine steps inside submit, the feed is read in ingest, and the
    phases of each stall add up to at least the threshold."""
    with ServiceUnderTest([*TEST_MODEL, "metrics.stall_us=1"]) as svc:
        svc.start()
        svc.send_quotes([(i % 16, i // 16) for i in range(800)])
        final = svc.stop()
        counters = svc.summary()["counters"]
    assert final.decided > 0 and _identity(final)
    phases = [counters[f"stall_{p}_us"] for p in ("ingest", "complete", "submit", "other", "yield")]
    assert counters["stalls"] > 0 and counters["stall_submit_us"] > 0 and counters["stall_ingest_us"] > 0, counters
    assert sum(phases) >= counters["stalls"] - 5, counters  # each phase's sum is truncated to whole µs


def test_stream_lstm_decides_every_event_in_order():
    overrides = ["model.checkpoint=\"\"", "model.preset=\"lstm_a\"", "model.mode=\"stream\""]
    with ServiceUnderTest(overrides) as svc:
        svc.start()
        pairs = [(i % 4, i // 4) for i in range(200)]
        svc.send_quotes(pairs)
        final = svc.stop()
    d = svc.decisions()
    assert final.conflated == 0 and final.decided + final.shed == 200
    assert sorted((x.instrument, x.seq) for x in d) == sorted(pairs)  # one answer each
    by_inst = {}
    for x in d:
        if x.status == Outcome.DECIDED:  # sheds at admission (QUEUE_FULL, LATE) are answered when read
            by_inst.setdefault(x.instrument, []).append(x.seq)
    assert by_inst and all(seqs == sorted(seqs) for seqs in by_inst.values())  # in order per instrument


def test_sequence_gaps_restarts_and_out_of_order_events():
    # 0 1 | gap of 3 | 5 6 | 0: the publisher restarted | 1 2 | 1 again: out of order (rejected, answered)
    seqs = [0, 1, 5, 6, 0, 1, 2, 1]
    with ServiceUnderTest() as svc:
        svc.start()
        svc.send_quotes([(3, s) for s in seqs])
        final = svc.stop()
        counters = svc.summary()["counters"]
    assert final.seq_gaps == 1 and final.seq_missing == 3 and counters["seq_resets"] == 1
    assert final.rejected == final.rejected_by_reason[Reason.OUT_OF_ORDER] == 1
    rejected = [d for d in svc.decisions() if d.status == Outcome.REJECTED]
    assert [(d.instrument, d.seq, d.reason) for d in rejected] == [(3, 1, Reason.OUT_OF_ORDER)]
    assert final.received == len(seqs) and _identity(final)
