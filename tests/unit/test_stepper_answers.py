"""A finished step's answers and stage samples are the same whether the step held one request
(Stepper._answer_one, the low-rate path) or many (Stepper._answer_step over tuples of the
scheduler's columns; Stepper._answer_columns over its numpy columns, for a large step), for decided
and for stale rows; and the Answers columns the egress packs hold what was added, by every method."""

from __future__ import annotations

import numpy as np
import pytest
from service_harness import in_process_services

from hft_infer.egress import Answers
from hft_infer.service import Service
from hft_infer.stepper import _Batch
from hft_infer.transport.schema import Outcome, Reason

N_SLOTS = 6


@pytest.fixture
def make_service(tmp_path, monkeypatch):
    yield from in_process_services(tmp_path, monkeypatch, f"universe.instruments={N_SLOTS}")


def _feed(svc: Service, slots: list[int], stale_slots: frozenset = frozenset()) -> None:
    """A quote row for each slot (the same rows every run) and its request: seq, receive time and
    send time chosen per slot, so that every answer column differs between slots; the requests of
    `stale_slots` queued stale (as the ingest queues a sequential model's late row)."""
    rng = np.random.default_rng(7)
    for slot in slots:
        book = (rng.random((10, 4)) * 10 + 100).astype(np.float32).tobytes()
        for pos in range(svc.window):
            svc.store.write_quote_at(slot, pos, book, 10)
        svc.store.count[slot] = svc.window
        recv = 1_000_000 + 1000 * slot
        send = 0 if slot == 2 else 1_780_000_000_000_000_000 + slot  # slot 2: no send time (no wire sample)
        svc.sched.push(slot, svc.window - 1, 100 + slot, 0, recv, recv, send, slot in stale_slots)


def _run(svc: Service, slots: list[int], t_submit_at: int) -> tuple[list[tuple], dict[str, list[int]], int, int]:
    """Step the fed requests (batches as the scheduler forms them), answer them; returns the
    answers, the queue and wire samples (ts_recv and wire less the service's clock offset:
    each service reads its own), the number of step samples and of steps answered from numpy
    columns. Checks that the flush records one `service` sample per decided event."""
    step = svc.step
    while svc.sched.queued_slots:
        n = svc.sched.form_batch(t_submit_at, force=True)
        rids = svc.sched.batch_rids[:n]
        s, p = svc.engine.request()
        s[:n] = [svc.sched.r_slot[r] for r in rids]
        p[:n] = [svc.sched.r_pos[r] for r in rids]
        svc.engine.submit(n)
        step.inflight.append(_Batch(rids, t_submit_at, 0))
        step.complete(wait=True)
    offset = svc.clock.offset_ns  # each service's own: ts_recv back on the perf_counter clock
    answers = sorted(a[:8] + (a[8] - offset,) for a in zip(*svc.egress.answers.columns()))
    bufs = svc.stages.buffers
    samples = {"queue": sorted(bufs["queue"].samples()), "wire": sorted(w - offset for w in bufs["wire"].samples())}
    columns_answered = len(step._service_recv_cols)
    assert len(bufs["service"].samples()) == 0
    step.flush()
    assert len(bufs["service"].samples()) == svc.acct.decided and not step._service_recv_cols
    return answers, samples, len(bufs["step"].samples()), columns_answered


@pytest.mark.parametrize("columns", [False, True], ids=["tuples", "numpy-columns"])
@pytest.mark.parametrize("stale", [False, True, "mixed"])
def test_a_step_of_one_answers_as_a_step_of_many(make_service, stale, columns):
    overrides = ['scheduler.conflate="off"'] + (["scheduler.max_age_us=1"] if stale is True else [])
    slots = list(range(N_SLOTS))
    one = make_service(*overrides, "scheduler.max_batch=1", "runner.buckets=[1]")
    many = make_service(*overrides)
    assert N_SLOTS < many.step.answer_columns_min  # by default a step this small goes the tuple way
    if columns:  # ... made to take the numpy columns' (a step with stale rows still goes the tuple way)
        many.step.answer_columns_min = 2
    t_submit = 1_000_000 + 1000 * N_SLOTS + (10_000_000 if stale is True else 0)  # stale: 10 ms after receipt
    stale_slots = frozenset((1, 2, 4)) if stale == "mixed" else frozenset()  # 2: no send time either
    for svc in (one, many):
        _feed(svc, slots, stale_slots)
    got_one, samples_one, steps_one, _ = _run(one, slots, t_submit)
    got_many, samples_many, steps_many, columns_steps = _run(many, slots, t_submit)
    assert steps_one == N_SLOTS and steps_many < N_SLOTS  # the two paths ran
    assert (columns_steps > 0) == (columns and not stale)  # ... and the many's the one meant
    assert len(got_one) == len(got_many) == N_SLOTS
    for a, b in zip(got_one, got_many):
        assert a[:5] == b[:5] and a[6:] == b[6:]  # instrument, seq, status, reason, action; nconf, times
        assert a[5] == pytest.approx(b[5], rel=1e-5, abs=1e-6)  # the score (batch 1 and 6 round alike)
    assert [a[8] for a in got_one] == [1_000_000 + 1000 * s for s in slots]  # ts_recv: epoch ns less the offset
    assert samples_one == samples_many
    if stale == "mixed":  # the stale rows shed, their decisions withheld; the others decided, with samples
        slot_of = {inst: s for s, inst in enumerate(one.instrument_ids)}
        assert [(a[2], a[3], a[4], a[5]) for a in got_one if slot_of[a[0]] in stale_slots] == [
            (int(Outcome.SHED), int(Reason.STALE), 0, 0.0)] * len(stale_slots)
        assert {a[2] for a in got_one if slot_of[a[0]] not in stale_slots} == {int(Outcome.DECIDED)}
        fresh = [s for s in slots if s not in stale_slots]
        assert samples_one["queue"] == sorted(t_submit - (1_000_000 + 1000 * s) for s in fresh)
        assert samples_one["wire"] == sorted(1_000_000 + 1000 * s - (1_780_000_000_000_000_000 + s) for s in fresh)
        assert one.acct.decided == many.acct.decided == len(fresh)
        assert one.acct.by_reason[int(Reason.STALE)] == many.acct.by_reason[int(Reason.STALE)] == len(stale_slots)
        return
    assert {a[2] for a in got_one} == {int(Outcome.SHED if stale else Outcome.DECIDED)}
    assert {a[3] for a in got_one} == {int(Reason.STALE) if stale else 0}
    if stale:  # a withheld decision records neither queue nor wire
        assert samples_one["queue"] == samples_one["wire"] == []
        assert one.acct.by_reason[int(Reason.STALE)] == many.acct.by_reason[int(Reason.STALE)] == N_SLOTS
    else:
        assert samples_one["queue"] == sorted(t_submit - (1_000_000 + 1000 * s) for s in slots)
        sends = {s: 1_780_000_000_000_000_000 + s for s in slots if s != 2}  # slot 2 gave no send time
        assert samples_one["wire"] == sorted(1_000_000 + 1000 * s - sends[s] for s in sends)
        assert one.acct.decided == many.acct.decided == N_SLOTS


def _rows(a: Answers) -> list[tuple]:
    return list(zip(*a.columns()))


def test_every_way_into_the_answer_columns_holds_the_same_values():
    U32 = (1 << 32) - 1
    rows = [(7, 2**64 - 1, 0, 0, -1, 0.25, 3, 2**63 - 1, 1_780_000_000_000_000_000),
            (8, 0, 0, 0, 1, -1.5, U32 + 9, 0, 1)]  # n_conflated past uint32: saturated
    expected = [r[:6] + (min(r[6], U32),) + r[7:] for r in rows]
    one_by_one = Answers()
    for r in rows:
        one_by_one.add(*r)
    assert _rows(one_by_one) == expected
    decided = Answers()
    cols = list(zip(*rows))
    decided.add_decided(list(cols[0]), cols[1], cols[6], cols[7], list(cols[8]),
                        np.array(cols[5], dtype=np.float32), np.array(cols[4], dtype=np.int64))
    assert _rows(decided) == expected
    by_columns = Answers()
    by_columns.add_columns(*cols)
    assert _rows(by_columns) == expected
    shed = Answers()
    shed.add_shed(list(cols[0]), list(cols[1]), int(Reason.LATE), list(cols[6]), list(cols[7]), list(cols[8]))
    assert _rows(shed) == [(r[0], r[1], int(Outcome.SHED), int(Reason.LATE), 0, 0.0, r[6], r[7], r[8])
                           for r in expected]
    saturated = Answers()
    saturated.add_shed([1, 2], [3, 4], int(Reason.STALE), np.array([5, U32 + 9], dtype=np.int64), [0, 0], [6, 7])
    assert list(saturated.nconf) == [5, U32]
    shed_np = Answers()  # a column run's sheds come as numpy columns
    shed_np.add_shed(np.array(cols[0], dtype=np.int64), np.array(cols[1], dtype=np.uint64), int(Reason.LATE), None,
                     np.array(cols[7], dtype=np.int64), np.array(cols[8], dtype=np.int64))
    assert _rows(shed_np) == [(r[0], r[1], int(Outcome.SHED), int(Reason.LATE), 0, 0.0, 0, r[7], r[8])
                              for r in expected]
    shed.clear()
    assert len(shed) == 0 and all(len(c) == 0 for c in shed.columns())


def test_shed_requests_answer_alike_as_tuples_and_as_numpy_columns(make_service):
    """Stepper.answer_shed (requests shed unstepped: stale at pick, a drain out of time, an engine
    failure) answers from tuples below answer_columns_min and from numpy columns at or above it:
    the same answers, the requests released and counted either way."""
    slots = list(range(N_SLOTS))
    got = []
    for columns_min in (10**9, 2):
        svc = make_service('scheduler.conflate="off"')
        svc.step.answer_columns_min = columns_min
        _feed(svc, slots)
        n = svc.sched.form_batch(2_000_000, force=True)
        rids = svc.sched.batch_rids[:n]
        live = svc.sched.live_requests()
        svc.step.answer_shed(rids, int(Reason.ENGINE_FAILURE))
        assert svc.sched.live_requests() == live - n
        assert svc.acct.by_reason[int(Reason.ENGINE_FAILURE)] == n == N_SLOTS
        offset = svc.clock.offset_ns
        got.append(sorted(a[:8] + (a[8] - offset,) for a in zip(*svc.egress.answers.columns())))
    assert got[0] == got[1]
    slot_of = {inst: s for s, inst in enumerate(svc.instrument_ids)}
    assert [(slot_of[a[0]], a[1], a[2], a[3], a[8]) for a in got[1]] == [
        (s, 100 + s, int(Outcome.SHED), int(Reason.ENGINE_FAILURE), 1_000_000 + 1000 * s) for s in slots]
    assert [a[7] for a in got[1]] == [0 if s == 2 else 1_780_000_000_000_000_000 + s for s in slots]
