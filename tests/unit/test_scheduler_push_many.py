"""Scheduler.push_many (sequential models) against one Scheduler.push per event, on random inputs.

Two real schedulers get the same operations -- chunks of events (one push_many call against
a push per event), batches formed and released in between -- and must stay in the same state
after every operation: the whole request table, the free list (so the same request ids),
every slot's FIFO, the class FIFOs with their aging bases, the counters; the same events
refused (QUEUE_FULL); the same batches, with the same stale flags. The inputs reach the
cases that matter: slots at max_pending (refused in the middle of a chunk), the request ids
running out (capacity 16), apply-only (stale) events, mixed priority classes, ring heads that
have wrapped. The last test drives the real ingest (tests/ingest_rig.py) in bursts, through
push_many, against the same frames read one at a time, through push, and checks that every
event ends as exactly one of decided, shed or rejected.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from ingest_rig import IngestRig

from hft_infer.config import SchedulerConfig
from hft_infer.scheduler import NO_REQUEST, Scheduler
from hft_infer.transport.codec import encode, pack_book, topic_for
from hft_infer.transport.schema import Outcome, Quote, Reason, Trade

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
US = 1000


def _sched(n_slots: int, classes: int, max_pending: int, capacity: int, max_batch: int, aging_us: float,
           max_age_us: int) -> Scheduler:
    cfg = SchedulerConfig(classes=classes, default_class=0, max_batch=max_batch, capacity=capacity,
                          max_pending_per_instrument=max_pending, aging_us=aging_us, max_age_us=max_age_us)
    table = [[0] * n_slots, [0] * n_slots]
    return Scheduler(cfg, n_slots, sequential=True, conflate=False, class_by_slot_kind=table)


def _plain(v):
    """A scheduler attribute as comparable Python values: its numpy tables and the memoryviews
    over them as lists (whole, stale entries too), containers of them element by element."""
    if isinstance(v, (np.ndarray, memoryview)):
        return v.tolist()
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list) and v and isinstance(v[0], (np.ndarray, memoryview, list)):
        return [_plain(x) for x in v]
    return v


def _state(s: Scheduler) -> dict:
    """Everything the scheduler holds (its preallocated tables compared whole, stale entries too)."""
    out = {k: _plain(v) for k, v in vars(s).items() if k != "adaptive"}
    out["adaptive"] = None if s.adaptive is None else vars(s.adaptive)
    return out


@st.composite
def scenarios(draw):
    n_slots = draw(st.integers(1, 6))
    classes = draw(st.integers(1, 4))
    cfg = dict(n_slots=n_slots, classes=classes, max_pending=draw(st.integers(1, 6)),
               capacity=draw(st.sampled_from([16, 17, 24, 64])), max_batch=draw(st.integers(1, 5)),
               aging_us=draw(st.sampled_from([1.0, 50.0, 1e9])), max_age_us=draw(st.sampled_from([20, 10**9])))
    ops = []
    t = 1_000_000
    pos = [0] * n_slots
    for _ in range(draw(st.integers(1, 12))):
        if draw(st.integers(0, 3)):  # a chunk of events
            chunk = []
            for _ in range(draw(st.integers(0, 40))):
                slot = draw(st.integers(0, n_slots - 1))
                t += draw(st.integers(0, 30 * US))
                origin = t - draw(st.sampled_from([0, 0, 5 * US, 100 * US]))
                send = draw(st.sampled_from([0, 1_700_000_000_000_000_000 + t]))
                chunk.append((slot, pos[slot], pos[slot], draw(st.integers(0, classes - 1)), t, origin, send,
                              draw(st.booleans())))
                pos[slot] += 1
            ops.append(("chunk", chunk))
        else:  # a batch formed at a later time; `keep` of its requests stay in flight (not released)
            t += draw(st.integers(0, 200 * US))
            ops.append(("batch", t, draw(st.booleans()), draw(st.integers(0, 3))))
    return cfg, ops


def _run(cfg: dict, ops: list, many: bool):
    """Apply `ops`, chunks with push_many (`many`) or a push per event; returns the trace of
    what each operation answered and the state after each."""
    s = _sched(**cfg)
    trace = []
    in_flight: list[int] = []
    for op in ops:
        if op[0] == "chunk":
            events = op[1]
            if many:
                refused = s.push_many(events)
            else:
                refused = [j for j, e in enumerate(events) if s.push(*e) == NO_REQUEST]
            trace.append(("refused", refused))
        else:
            _, now, force, keep = op
            n = s.form_batch(now, force=force)
            rids = s.batch_rids[:n]
            trace.append(("batch", [(s.r_slot[r], s.r_pos[r], s.r_seq[r], s.r_cls[r], s.r_stale[r]) for r in rids]))
            assert s.n_shed == 0  # sequential: stale requests stay in the batch, marked
            in_flight += rids
            while len(in_flight) > keep:
                s.release(in_flight.pop(0))
        trace.append(("state", _state(s)))
    return trace, s


@settings(max_examples=400, **SETTINGS)
@given(scenarios())
def test_push_many_ends_in_the_state_of_one_push_per_event(scenario):
    cfg, ops = scenario
    many, s_many = _run(cfg, ops, many=True)
    each, s_each = _run(cfg, ops, many=False)
    assert many == each
    # every event pushed is refused or, once drained, in exactly one batch, in its slot's order
    pushed = [e for op in ops if op[0] == "chunk" for e in op[1]]
    refused = sum(len(x[1]) for x in many if x[0] == "refused")
    drained = []
    while s_many.queued_slots:
        n = s_many.form_batch(10**15, force=True)
        drained += [(s_many.r_slot[r], s_many.r_seq[r]) for r in s_many.batch_rids[:n]]
        for r in s_many.batch_rids[:n]:
            s_many.release(r)
    batched = [(slot, seq) for x in many if x[0] == "batch" for slot, _, seq, _, _ in x[1]] + drained
    assert len(batched) == len(set(batched)) == len(pushed) - refused
    for slot in range(cfg["n_slots"]):
        seqs = [seq for sl, seq in batched if sl == slot]
        assert seqs == sorted(seqs)
    assert s_many.pending == 0


def test_refused_events_are_each_slots_last_and_all_after_the_ids_run_out():
    """What push_many's docstring promises the ingest (which gives back the refused events'
    positions): per slot the refused events are its last ones in the chunk, and once the ids
    run out every later event is refused."""
    s = _sched(n_slots=4, classes=2, max_pending=3, capacity=16, max_batch=4, aging_us=1e9, max_age_us=10**9)
    t = 10**6
    order = [0, 1, 0, 0, 0, 1, 0, 2]  # slot 0: 3 queued, then 2 refused; slots 1 and 2 queued in between
    events = [(slot, k, k, k % 2, t + k, t + k, 0, k == 7) for k, slot in enumerate(order)]
    assert s.push_many(events) == [4, 6]
    assert s.live_requests() == 6 and s.s_len[:3].tolist() == [3, 2, 1]
    s2 = _sched(n_slots=6, classes=1, max_pending=8, capacity=16, max_batch=4, aging_us=1e9, max_age_us=10**9)
    chunk = [(k % 6, k // 6, k // 6, 0, t + k, t + k, 0, False) for k in range(20)]
    assert s2.push_many(chunk) == [16, 17, 18, 19]
    assert s2.push_many([]) == [] and s2.live_requests() == 16 and s2.pending == 16


def _fitting(s: Scheduler, events: list[tuple]) -> list[tuple]:
    """The events of a chunk that `s` has room for, as the column path keeps them (each slot's
    first ones up to its room, then as many as the free request ids allow)."""
    room = {slot: s.room(slot) for slot in range(s._n_slots)}
    out = []
    for e in events:
        if room[e[0]] and len(out) < s.free_requests():
            room[e[0]] -= 1
            out.append(e)
    return out


def _columns(events: list[tuple]) -> list[np.ndarray]:
    """push's arguments as the column path's numpy columns (slots int16, seq uint64, stale bool)."""
    dtypes = (np.int16, np.int64, np.uint64, np.int64, np.int64, np.int64, np.int64, np.bool_)
    return [np.array(col, dtype=d) for col, d in zip(zip(*events), dtypes)]


@settings(max_examples=400, **SETTINGS)
@given(scenarios())
def test_push_columns_ends_in_the_state_of_one_push_per_event(scenario):
    """The column path's push (numpy scatters) against a push per event, through the same
    operations: only events that fit, as its caller guarantees; a chunk that does not fit is
    refused whole with ValueError, changing nothing."""
    cfg, ops = scenario
    a, b = _sched(**cfg), _sched(**cfg)
    in_flight: list[int] = []
    for op in ops:
        if op[0] == "chunk":
            events = _fitting(a, op[1])
            if len(events) < len(op[1]):
                before = _state(a)
                with pytest.raises(ValueError):
                    a.push_columns(*_columns(op[1]))
                assert _state(a) == before
            if events:
                a.push_columns(*_columns(events))
            assert [j for j, e in enumerate(events) if b.push(*e) == NO_REQUEST] == []
        else:
            _, now, force, keep = op
            n = a.form_batch(now, force=force)
            assert b.form_batch(now, force=force) == n
            assert a.batch_rids[:n] == b.batch_rids[:n]
            in_flight += a.batch_rids[:n]
            while len(in_flight) > keep:
                r = in_flight.pop(0)
                a.release(r)
                b.release(r)
        assert _state(a) == _state(b)


def test_push_columns_takes_the_ids_and_places_push_would_across_ring_wraps():
    """A worked case: a slot whose ring head has wrapped, two classes, a slot already queued."""
    s = _sched(n_slots=3, classes=2, max_pending=4, capacity=16, max_batch=3, aging_us=1e9, max_age_us=10**9)
    t = 10**6
    s.push_many([(0, k, k, 0, t + k, t + k, 0, False) for k in range(3)])  # slot 0: rids 0, 1, 2
    s.form_batch(t + 10, force=True)  # takes rid 0: slot 0's head moves to 1, rid 0 back last
    s.form_batch(t + 11, force=True)  # takes rid 1
    s.release(0)
    s.release(1)
    events = [(2, 0, 0, 1, t + 20, t + 20, 5, True), (0, 3, 3, 0, t + 21, t + 21, 0, False),
              (0, 4, 4, 0, t + 22, t + 22, 0, False), (2, 1, 1, 0, t + 23, t + 19, 0, False)]
    s.push_columns(*_columns(events))
    assert s.s_len.tolist() == [3, 0, 2] and s.s_head[0] == 2
    # the free list is a stack: 1 and 0 (released last) go first, then 3, 4
    assert [s.s_ring[0][(2 + j) % 4] for j in range(3)] == [2, 0, 3]  # the wrap: places 2, 3, 0
    assert [s.s_ring[2][j] for j in range(2)] == [1, 4]
    assert (s.r_seq[1], s.r_cls[1], s.r_stale[1], s.r_send_epoch_ns[1], s.r_origin_ns[4]) == (0, 1, True, 5, t + 19)
    assert s.q_len[1] == 1 and s.q_buf[1][s.q_head[1]] == 2 and s.s_enq_ns[2] == t + 20  # its first event's class
    assert s.pending == 5 and s.live_requests() == 5


def test_push_many_is_for_sequential_models():
    cfg = SchedulerConfig(classes=1, default_class=0)
    s = Scheduler(cfg, 2, sequential=False, conflate=True, class_by_slot_kind=[[0, 0], [0, 0]])
    with pytest.raises(ValueError):
        s.push_many([(0, 0, 0, 0, 1, 1, 0, False)])


# ---------------------------------------------------------------------------------- the ingest

LEVELS = 10
OLD_NS = 1  # a ts_send_ns long past every deadline: stale at ingest, queued apply-only


def _book(k: int) -> bytes:
    return pack_book(np.full((LEVELS, 4), 100.0 + k, np.float32))


@st.composite
def feeds(draw):
    """Quotes and trades of a few instruments, fresh or stale, with and without a priority class,
    cut into bursts with steps (batches formed and answered) between some of them."""
    n_inst = draw(st.integers(1, 5))
    seqs = [0] * n_inst
    bursts = []
    for _ in range(draw(st.integers(1, 6))):
        msgs = []
        for _ in range(draw(st.integers(1, 40))):
            inst = draw(st.integers(0, n_inst - 1))
            ts = draw(st.sampled_from([0, OLD_NS]))
            prio = draw(st.sampled_from([-1, -1, 0, 1, 3, 9]))
            if draw(st.integers(0, 4)):
                m = Quote(inst, seqs[inst], 0, ts, LEVELS, _book(seqs[inst]), prio)
            else:
                m = Trade(inst, seqs[inst], 0, ts, 100.0 + seqs[inst], 1.0, draw(st.sampled_from([1, -1])), prio)
            seqs[inst] += 1
            msgs.append([topic_for(inst), encode(m)])
        bursts.append((msgs, draw(st.integers(0, 2))))  # then that many steps
    return n_inst, draw(st.integers(1, 5)), draw(st.sampled_from([16, 20])), bursts


def _rig(n_inst: int, max_pending: int, capacity: int) -> IngestRig:
    rig = IngestRig(instruments=n_inst, topic_frame=True, conflate=False, max_age_us=1000, max_pending=max_pending,
                    depth=256)
    cfg = SchedulerConfig(classes=4, default_class=0, max_age_us=10**9, aging_us=1e9, capacity=capacity,
                          max_batch=3, max_pending_per_instrument=max_pending, admission="depth")
    rig.sched = rig.ingest.sched = Scheduler(cfg, n_inst, sequential=True, conflate=False,
                                             class_by_slot_kind=[[0] * n_inst, [0] * n_inst])
    return rig


def _step(rig: IngestRig) -> list[tuple]:
    """What the service's step does with the scheduler's outcomes (a stateful model: a stale
    request is stepped and answered SHED/STALE), minus the model."""
    s, acct = rig.sched, rig.acct
    n = s.form_batch(time.perf_counter_ns(), force=True)
    out = []
    for r in s.batch_rids[:n]:
        out.append((s.r_slot[r], s.r_seq[r], s.r_pos[r], s.r_cls[r], s.r_stale[r]))
        if s.r_stale[r]:
            acct.shed_some(int(Reason.STALE))
        else:
            acct.decided += 1
        s.release(r)
    return out


def _ingest_state(rig: IngestRig) -> dict:
    s = rig.sched
    queued = {slot: [(s.r_seq[r], s.r_pos[r], s.r_cls[r], s.r_stale[r])
                     for r in (s.s_ring[slot][(s.s_head[slot] + j) % s.max_pending] for j in range(s.s_len[slot]))]
              for slot in range(rig.store.n_slots)}
    fifos = [[s.q_buf[c][(s.q_head[c] + j) % rig.store.n_slots] for j in range(s.q_len[c])] for c in range(s.classes)]
    sheds = sorted(a[:4] for a in zip(*rig.answers.columns()) if a[2] == Outcome.SHED)
    return {"count": list(rig.store.count), "last_seq": list(rig.ingest.last_seq), "queued": queued, "fifos": fifos,
            "free": len(s._free), "pending": s.pending, "received": rig.acct.received, "decided": rig.acct.decided,
            "shed": rig.acct.shed, "by_reason": list(rig.acct.by_reason), "sheds": sheds}


@settings(max_examples=60, **SETTINGS)
@given(feeds())
def test_the_ingest_queues_a_burst_as_its_frames_read_one_at_a_time(feed):
    n_inst, max_pending, capacity, bursts = feed
    a, b = _rig(n_inst, max_pending, capacity), _rig(n_inst, max_pending, capacity)
    try:
        for msgs, steps in bursts:
            for parts in msgs:
                a.push.send_multipart(parts)
            while a.ingest.drain(256):  # bursts: Ingest._handle, the chunk through push_many
                pass
            for parts in msgs:
                b.send(parts)  # one frame per drain: Ingest._handle_one, a push per event
            assert _ingest_state(a) == _ingest_state(b)
            np.testing.assert_array_equal(a.store.array, b.store.array)
            for _ in range(steps):
                assert _step(a) == _step(b)
        while a.sched.queued_slots or b.sched.queued_slots:
            assert _step(a) == _step(b)
        assert _ingest_state(a) == _ingest_state(b)
        sent = sum(len(msgs) for msgs, _ in bursts)
        for rig in (a, b):  # every event: decided, shed (stale or QUEUE_FULL) or rejected; none live
            acct = rig.acct
            assert acct.received == sent
            assert rig.sched.live_requests() == 0 and rig.sched.conflated == 0
            assert acct.received == acct.decided + acct.shed + acct.rejected and rig.identity_holds()
            assert acct.rejected == 0  # the feed is all valid and in sequence
    finally:
        a.close()
        b.close()
