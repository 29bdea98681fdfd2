"""The asynchronous hot path and what a feed can throw at it, on a real `hft-infer serve`:
ingest while a step is in flight, DecisionBatch read by a plain msgpack client, values that
used to crash it, an oversized frame that used to leave it deaf, a Reset that makes a replay
decide like a fresh start, signals during the drain."""

from __future__ import annotations

import os
import signal
import struct
import time

import msgpack
import numpy as np
import pytest
import zmq
from service_harness import SLOW_MODEL, TEST_MODEL, ServiceUnderTest

from hft_infer.transport.codec import SERVICE_TOPIC, encode, pack_book, topic_for
from hft_infer.transport.schema import Decision, Heartbeat, Outcome, Quote, Reason, Reset, Status, Trade


def _identity(st: Status) -> bool:
    return st.received == st.decided + st.shed + st.conflated + st.rejected + st.pending


def test_the_loop_keeps_ingesting_while_a_step_is_in_flight():
    with ServiceUnderTest(SLOW_MODEL + ["runner.cpu_worker=true", "universe.instruments=8"]) as svc:
        svc.start(n_topics=9)
        svc.send_quotes([(i % 8, i // 8) for i in range(400)], gap_s=0.0002)
        final = svc.stop()
        counters = svc.summary()["counters"]
    assert final.received == 400 and final.pending == 0 and _identity(final)
    # frames were read between a step's submit and its collect (the worker ran the step meanwhile);
    # how many batches that took depends on how long the worker's first step runs cold, so only
    # "some were decided" is asserted about them
    assert counters["overlapped"] > 0 and counters["batches"] >= 1 and final.decided > 0


def test_a_coalescing_loop_past_capacity_reads_in_put_off_bursts_and_accounts_every_event():
    """ingest.coalesce_us on the service the CLI runs: a sequential model past capacity (a slow
    CPU step of milliseconds, batches of 4 over 16 instruments, a feed paced over ~0.3 s) keeps a
    full batch queued, so after a burst that empties the socket the next is put off (a hold longer
    than a step: the loop steps queued batches meanwhile) -- and every event still ends decided or
    shed, none pending. (A feed sent all at once would be read in bursts that each stop at their
    frame budget, which leave the feed due: nothing to put off.)"""
    n = 1500
    overrides = SLOW_MODEL + ['scheduler.conflate="off"', "scheduler.max_batch=4", "universe.instruments=16",
                              "scheduler.max_age_us=2000000", "ingest.coalesce_us=50000"]
    with ServiceUnderTest(overrides) as svc:
        svc.start(n_topics=17)
        svc.send_quotes([(i % 16, i // 16) for i in range(n)], gap_s=0.0002)
        final = svc.stop()
        counters = svc.summary()["counters"]
    assert final.received == n and final.pending == 0 and final.rejected == 0 and _identity(final)
    assert final.decided > 0 and counters["coalesced_reads"] > 0, counters


def _thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of process `pid` by thread name ("main": the
    thread the process started with, which runs the loop)."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = open(f"/proc/{pid}/task/{tid}/stat").read()
        except OSError:  # a thread that ended meanwhile
            continue
        name = "main" if int(tid) == pid else stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()  # from field 3 (state) on: utime is 14, stime 15
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def test_the_loop_sleeps_instead_of_spinning_while_the_workers_step_runs():
    """runner.cpu_worker: a loop that spins while the step is in flight holds the GIL the worker
    needs between kernels (runner/worker.py: lstm_a's steps took ~20x longer). With nothing to
    ingest the loop sleeps on the ingest socket and the worker's done_fd, so over a feed that
    keeps the worker stepping, the loop's thread spends far less CPU than the worker's (spinning,
    it spent at least as much). CPU time per thread from /proc, not wall-clock time."""
    n = 2000
    with ServiceUnderTest(SLOW_MODEL + ["runner.cpu_worker=true", "universe.instruments=8"]) as svc:
        svc.start(n_topics=9)
        pid = svc.proc.pid
        before = _thread_cpu_s(pid)
        svc.send_quotes([(i % 8, i // 8) for i in range(n)], gap_s=0.0002)
        svc.wait_for(lambda m: any(isinstance(x, Status) and x.received == n and x.pending == 0 for x in m))
        after = _thread_cpu_s(pid)
        final = svc.stop()
    assert final.received == n and _identity(final) and final.decided > 0
    loop_s, step_s = after["main"] - before["main"], after["hft-infer-step"] - before["hft-infer-step"]
    assert step_s >= 0.1, (loop_s, step_s)  # the worker stepped long enough to compare against
    # sleeping, the loop spends ~0.35x the worker's CPU on the dev VM (0.20 / 0.61 s, this tree and
    # dd63f2e alike) and 0.61x in one busy CI run; spinning, at least 1x
    assert loop_s < step_s * 0.8, (loop_s, step_s)


@pytest.mark.gpu
@pytest.mark.parametrize(("engine", "model"), [("graph", ['model.preset="lstm_a"', 'model.mode="window"']),
                                               ("graph", ['model.preset="mlp_small"']),
                                               ("persistent", ['model.preset="lstm_a"', 'model.mode="window"'])])
def test_the_loop_keeps_ingesting_while_a_device_step_is_in_flight(engine, model):
    """The acceptance check of the asynchronous hot path on a GPU: the real engines (a CUDA graph
    per bucket; a persistent kernel behind its request ring) in a real service, fed back to back,
    read frames between a step's submit and its collect, and account for every event."""
    overrides = ['model.checkpoint=""', *model, f'runner.engine="{engine}"', 'runner.device="cuda"',
                 "universe.instruments=8"]
    with ServiceUnderTest(overrides) as svc:
        svc.start(n_topics=9)
        svc.send_quotes([(i % 8, i // 8) for i in range(2000)])  # back to back: frames arrive mid-step
        final = svc.stop()
        summary = svc.summary()
    counters = summary["counters"]
    assert summary["engine"] == engine  # the device engine itself, not a fallback
    assert final.received == 2000 and final.pending == 0 and _identity(final)
    assert final.decided > 0 and counters["batches"] >= 1
    assert counters["overlapped"] > 0, counters


@pytest.mark.gpu
@pytest.mark.parametrize("chain", [True, False])
def test_a_backlogged_instrument_is_stepped_by_chained_steps_in_sequence_order(chain):
    """runner.chain_steps on the graph engine: a stateful model steps one row per instrument per
    step, so one instrument's events sent back to back queue behind each other. Chained, the loop
    submits steps while the engine takes one (4 in flight), each taking that instrument's next
    event -- counted as chained_steps; off, one step an iteration and none counted. Either way
    every event is decided (a deadline no step misses here), in its sequence order, once."""
    n = 600
    overrides = ['model.checkpoint=""', 'model.preset="lstm_a"', 'model.mode="window"', 'runner.engine="graph"',
                 'runner.device="cuda"', "universe.instruments=2", "runner.max_inflight=4",
                 f"runner.chain_steps={'true' if chain else 'false'}", "scheduler.max_age_us=60000000",
                 "scheduler.max_pending_per_instrument=1024"]
    with ServiceUnderTest(overrides) as svc:
        svc.start(n_topics=3)
        svc.send_quotes([(0, s) for s in range(n)])
        final = svc.stop()
        decided = [(d.instrument, d.seq) for d in svc.decisions() if d.status == Outcome.DECIDED]
        counters = svc.summary()["counters"]
    assert final.received == n and final.decided == n and final.pending == 0 and _identity(final)
    assert decided == [(0, s) for s in range(n)]
    assert (counters["chained_steps"] > 0) == chain, counters
    assert counters["batches"] >= n  # one row of the instrument per step, chained or not


def _plain_msgpack_batch(frame: bytes) -> list[dict]:
    """DecisionBatch as the README describes it, decoded with msgpack and struct alone."""
    f = msgpack.unpackb(frame, raw=False)
    assert f[0] == 18
    n = f[3]
    names = ("instrument", "seq", "status", "reason", "action", "score", "n_conflated", "ts_send_ns", "ts_recv_ns")
    cols = [struct.unpack(f"<{n}{c}", col) for c, col in zip("IQBBbfIqq", f[4:13])]
    return [dict(zip(names, row)) for row in zip(*cols)]


def test_batch_egress_one_frame_per_iteration_read_by_a_plain_msgpack_client():
    with ServiceUnderTest(TEST_MODEL + ["egress.mode=batch", "scheduler.policy=window",
                                        "scheduler.max_wait_us=20000"]) as svc:
        svc.start()
        raw = svc.ctx.socket(zmq.SUB)  # a foreign client: its own socket, plain msgpack
        raw.setsockopt(zmq.SUBSCRIBE, b"\xff\xff\xff\xfe")
        raw.setsockopt(zmq.SUBSCRIBE, SERVICE_TOPIC)
        raw.connect(svc.endpoint("decisions"))
        # a slow joiner would miss the decisions: wait for the service's periodic Status, which
        # the publisher sends only once both subscriptions (processed in order) have reached it
        assert raw.poll(15000), "no Status reached the plain client"
        raw.recv_multipart()
        svc.send_quotes([(i, 0) for i in range(16)])
        svc.send([(topic_for(3), b"\xc1")])  # undecodable: counted only
        svc.send([(topic_for(4), encode(Quote(4, -1, 0, 0, 10, pack_book(np.ones((10, 4), np.float32)))))])
        final = svc.stop()
        rows = []
        while raw.poll(200):
            topic, payload = raw.recv_multipart()
            if topic == SERVICE_TOPIC:  # Status frames (periodic, final)
                continue
            assert topic == b"\xff\xff\xff\xfe"
            rows += _plain_msgpack_batch(payload)
        raw.close(0)
    decided = [r for r in rows if r["status"] == Outcome.DECIDED]
    assert sorted(r["instrument"] for r in decided) == list(range(16)) and all(-1 <= r["score"] <= 1 for r in decided)
    rejected = [r for r in rows if r["status"] == Outcome.REJECTED]
    assert rejected == []  # a negative seq cannot be named in a uint64 column: counted only
    assert final.rejected == 2 and final.decided == 16 and _identity(final)
    # the harness's own collector sees the same answers through the typed decoder
    assert sorted(d.instrument for d in svc.decisions() if d.status == Outcome.DECIDED) == list(range(16))


def test_values_that_crashed_the_service_are_rejected_and_it_keeps_deciding():
    book = pack_book(np.ones((10, 4), np.float32) * 100)
    bad = [
        (1, encode(Trade(1, 0, 0, 0, 1e39, 1.0, 1))),  # finite float64 above float32's maximum
        (1, encode(Trade(1, 1, 0, 0, 100.0, 1e300, -1))),
        (2, encode(Quote(2, 0, 0, 2**64 - 1, 10, book))),  # ts_send_ns beyond int64
        (2, encode(Quote(2, 1, 0, -(2**63), 10, book))),
    ]
    with ServiceUnderTest() as svc:
        svc.start()
        svc.send([(topic_for(i), p) for i, p in bad])
        svc.send([(topic_for(3), encode(Quote(3, 0, 0, 0, 10, book))),
                  (topic_for(3), encode(Quote(3, 2**64 - 1, 0, 0, 10, book)))])  # a seq jump to the top
        svc.send_quotes([(5, 0), (5, 1)])
        svc.wait_for(lambda m: sum(isinstance(x, Decision) and x.instrument == 5 for x in m) >= 1)
        final = svc.stop()
        code = svc.proc.returncode
    assert code == 0 and final.pending == 0 and _identity(final)
    assert final.rejected_by_reason[Reason.NON_FINITE] == 2 and final.rejected_by_reason[Reason.BAD_FIELD] == 2
    assert final.seq_gaps == 1 and final.seq_missing == 2**63 - 1  # 2**64 - 2 missing: saturated, not overflowed
    answered = {(d.instrument, d.seq, d.reason) for d in svc.decisions() if d.status == Outcome.REJECTED}
    assert (1, 0, Reason.NON_FINITE) in answered and (2, 0, Reason.BAD_FIELD) in answered


def test_readable_rejects_are_answered_and_kinds_that_are_not_events_are_named():
    with ServiceUnderTest() as svc:
        svc.start()
        svc.send([
            (topic_for(6), msgpack.packb([2, 6, 11, 0, 0, "px", 1.0, 1])),  # price as str: readable inst/seq
            (topic_for(6), msgpack.packb([1, 6, 12, 0, 0, 1, b"\x00" * 16, True])),  # priority = true
            (topic_for(6), encode(Decision(6, 13, 0, 0, 0, 0.0, 0, 0, 0, 0, ""))),
            (SERVICE_TOPIC, encode(Heartbeat(time.time_ns(), "feed-a"))),
        ])
        svc.send_quotes([(7, 0)])
        svc.wait_for(lambda m: any(isinstance(x, Decision) and x.instrument == 7 for x in m))
        final = svc.stop()
        counters = svc.summary()["counters"]
    rejected = sorted((d.instrument, d.seq, d.reason) for d in svc.decisions() if d.status == Outcome.REJECTED)
    assert rejected == [(6, 11, Reason.DECODE_ERROR), (6, 12, Reason.DECODE_ERROR)]
    assert final.rejected_by_reason[Reason.UNEXPECTED_KIND] == 1 and counters["heartbeats"] == 1
    assert final.received == 4 and _identity(final)  # the heartbeat is not an event


def test_after_an_oversized_frame_the_sub_ingest_reconnects_and_decides_again():
    with ServiceUnderTest(TEST_MODEL + ["ingest.max_msg_size_bytes=2000"]) as svc:
        svc.start()
        svc.send([(topic_for(1), b"\x00" * 5000)])  # libzmq drops the connection on this one
        t0 = time.monotonic()
        seq = 0
        decided_at = None
        while time.monotonic() - t0 < 20 and decided_at is None:
            svc.send_quotes([(1, seq)])
            seq += 1
            if svc.sub.poll(50):
                svc.collector.poll()
            if any(isinstance(m, Decision) and m.status == Outcome.DECIDED for m in svc.messages()):
                decided_at = time.monotonic() - t0
        final = svc.stop()
        log = svc.log_tail(50)
    assert decided_at is not None, log
    assert final.ingest_disconnects >= 1 and "feed connection lost" in log
    print(f"decided again {decided_at * 1e3:.0f} ms after the oversized frame")  # BENCHMARKS.md, robustness


def test_a_reset_makes_a_second_replay_decide_exactly_like_the_first():
    # a deadline far past any stall of a busy test host (at the default 5 ms, one of 160 events was
    # shed on the H200 host on a slow day, 2026-12-04): this test is about the Reset, not deadlines
    overrides = ['model.checkpoint=""', 'model.preset="lstm_a"', 'model.mode="stream"', "universe.instruments=4",
                 "scheduler.max_age_us=2000000"]
    pairs = [(i % 4, i // 4) for i in range(80)]
    with ServiceUnderTest(overrides) as svc:
        svc.start(n_topics=5)
        svc.send_quotes(pairs, gap_s=0.0005)
        svc.send([(SERVICE_TOPIC, encode(Reset(time.time_ns())))])
        svc.send_quotes(pairs, gap_s=0.0005)
        final = svc.stop()
        counters = svc.summary()["counters"]
    decided = [d for d in svc.decisions() if d.status == Outcome.DECIDED]
    assert (final.received, final.shed, final.rejected, final.conflated) == (160, 0, 0, 0), final
    assert len(decided) == 160 and counters["resets"] == 1
    first = {(d.instrument, d.seq): (d.score, d.action) for d in decided[:80]}
    second = {(d.instrument, d.seq): (d.score, d.action) for d in decided[80:]}
    assert first.keys() == second.keys()
    # stream state, held positions and sequences all started again: the same numbers, up to the
    # float32 rounding of differently sized batches (~3e-8 seen)
    for key, (score, action) in first.items():
        assert abs(second[key][0] - score) < 1e-6 and second[key][1] == action, key


@pytest.mark.parametrize("signals", [2, 3])
def test_a_second_signal_does_not_kill_the_drain_and_a_third_forces_it(signals):
    with ServiceUnderTest(SLOW_MODEL + ["universe.instruments=8"]) as svc:
        svc.start(n_topics=9)
        svc.send_quotes([(i % 8, i // 8) for i in range(2000)])
        for _ in range(signals):  # all within the drain (it waits >= 100 ms for the feed to go quiet)
            svc.proc.send_signal(signal.SIGTERM)
            time.sleep(0.005)
        got_final = svc.collector.wait_final(60)
        svc.proc.wait(60)
        code = svc.proc.returncode
        final = [m for m in svc.messages() if isinstance(m, Status) and m.final]
        summary = svc.summary()
        log = svc.log_tail(30)
    assert code == 0 and got_final and final[-1].pending == 0 and _identity(final[-1]), log
    assert summary["accounting"]["pending"] == 0
    assert ("drain forced" in log) == (signals == 3), log
