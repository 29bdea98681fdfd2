"""Deadline admission for stateful (sequential) models: a slot queues no more than the service
steps within max_age at its measured pace (scheduler.py's module docstring).

Time is simulated (now_ns given to every call), so these are exact, not timed, tests."""

from __future__ import annotations

import pytest

from hft_infer.config import SchedulerConfig
from hft_infer.scheduler import NO_REQUEST, Scheduler

US = 1000
T0 = 1_000_000_000


def make(n_slots=8, *, admission="deadline", **kw):
    kw.setdefault("max_batch", n_slots)
    kw.setdefault("max_pending_per_instrument", 64)
    cfg = SchedulerConfig(classes=1, default_class=0, admission=admission, **kw)
    return Scheduler(cfg, n_slots, sequential=True, conflate=False, class_by_slot_kind=[[0] * n_slots] * 2)


def push(s, slot, t, seq=0):
    return s.push(slot, seq, seq, 0, t, t, 0)


def step(s, now):
    """Form a batch at `now` and release it (the step done); returns (fresh, stale) picked."""
    n = s.form_batch(now)
    rids = s.batch_rids[:n]
    stale = sum(1 for r in rids if s.r_stale[r])
    s.release_many(rids)
    return n - stale, stale


def backlog(s, slots, per_slot, t):
    for slot in range(slots):
        for k in range(per_slot):
            assert push(s, slot, t, k) != NO_REQUEST


def steps_every(s, period_us, batches, start=T0):
    """`batches` batches, one every `period_us`; returns the time of the last."""
    now = start
    for _ in range(batches):
        now += period_us * US
        step(s, now)
    return now


def test_depth_follows_the_measured_period():
    s = make(8, max_age_us=1000)
    backlog(s, 8, 40, T0)
    assert s.admit_depth == 64  # nothing measured yet: max_pending
    now = steps_every(s, 100, 30)  # a batch every 100 us while every slot is backlogged
    assert s.step_period_ns == 100 * US
    assert s.admit_depth == (1000 * US * 7 // 8) // (100 * US)  # 8 batches fit in 7/8 of max_age
    # a backlogged slot refuses beyond the depth, through push, room and push_in_order alike
    assert s.s_len[0] > s.admit_depth
    assert s.room(0) == 0
    assert push(s, 0, now, 99) == NO_REQUEST
    s2 = make(8, max_age_us=1000)
    s2.admit_depth = 3
    assert s2.push_in_order([5] * 5, [0] * 5, list(range(5)), [0] * 5, [now] * 5, [now] * 5, [0] * 5,
                            [False] * 5) == 3
    assert s2.room(5) == 0 and s2.room(4) == 3


def test_more_slots_than_a_batch_wait_more_batches_per_row():
    s = make(16, max_batch=4, max_age_us=1000)
    backlog(s, 16, 20, T0)
    steps_every(s, 50, 40)
    assert s.step_period_ns == 50 * US
    # 16 queued slots, 4 per batch: a slot is picked every 4th batch
    assert s.admit_depth == (1000 * US * 7 // 8) // (50 * US * 4)


def test_periods_without_a_backlog_are_not_the_pace():
    """One event per slot, a batch each, far apart: arrivals set that period, not the steps."""
    s = make(8, max_age_us=1000)
    now = T0
    for i in range(20):
        push(s, i % 8, now, i)
        step(s, now)
        now += 10_000 * US
    assert s.step_period_ns == 0
    assert s.admit_depth == 64


def test_depth_is_at_least_one_and_at_most_max_pending():
    s = make(4, max_age_us=100, max_pending_per_instrument=16)
    backlog(s, 4, 10, T0)
    steps_every(s, 1000, 5)  # each batch 1 ms apart: slower than the whole deadline
    assert s.admit_depth == 1
    fast = make(4, max_age_us=100_000, max_pending_per_instrument=16)
    backlog(fast, 4, 10, T0)
    steps_every(fast, 10, 5)
    assert fast.admit_depth == 16


def test_depth_mode_keeps_max_pending():
    s = make(8, admission="depth", max_age_us=1000)
    backlog(s, 8, 40, T0)
    now = steps_every(s, 100, 30)
    assert s.admit_depth == 64 and s.step_period_ns == 0
    assert push(s, 0, now, 99) != NO_REQUEST


@pytest.mark.parametrize("admission", ["deadline", "depth"])
def test_overload_three_times_the_step_rate(admission):
    """Three events per slot per batch period, one stepped: what each admission decides.
    depth: every queue fills to max_pending (64 x 100 us = 6.4 ms > max_age): every row is
    stale when picked, stepped, its decision withheld. deadline: the queues stay as deep as
    the deadline allows and what is picked is fresh."""
    s = make(8, admission=admission, max_age_us=1000)
    now, seq = T0, 0
    fresh = stale = refused = 0
    for tick in range(400):
        for slot in range(8):
            for _ in range(3):
                seq += 1
                if push(s, slot, now, seq) == NO_REQUEST:
                    refused += 1
        now += 100 * US
        f, st = step(s, now)
        if tick >= 200:  # the steady state
            fresh, stale = fresh + f, stale + st
    assert fresh + stale == 200 * 8  # one row per slot per batch either way
    if admission == "deadline":
        assert fresh == 200 * 8 and stale == 0
    else:
        assert fresh == 0 and stale == 200 * 8
    assert refused > 0  # three arrive for each one stepped: both shed the excess at admission


def _state(s):
    q = [[s.q_buf[c][(s.q_head[c] + j) % s._n_slots] for j in range(s.q_len[c])] for c in range(s.classes)]
    rings = [[s.s_ring[x][(s.s_head[x] + j) % s.max_pending] for j in range(s.s_len[x])] for x in range(s._n_slots)]
    return (q, rings, list(s.s_queued), list(s.s_enq_ns), s.pending, s.queued_slots, sorted(s._free),
            s.admit_depth, s.step_period_ns)


@pytest.mark.parametrize("seed,n_slots,one_class", [(seed, 12, 0.0) for seed in range(6)]
                         + [(seed, 40, 0.998) for seed in range(4)])
def test_taking_queued_slots_in_one_pass_picks_as_the_pick_loop(seed, n_slots, one_class):
    """Sequential batches formed in one pass -- every queued slot when they fit
    (Scheduler._take_every_slot), the head of the one queued class's FIFO when they do not
    (_take_head_of_one_class) -- pick the same requests in the same order, mark the same ones
    stale and leave the same queues as the pick loop, over random pushes in four classes (aging
    mixing them; with `one_class`, the share of pushes in class 0, mostly one), deadlines
    passing, enqueue times out of order (the loop then decides) and batches of any size."""
    import random

    rng = random.Random(seed)
    cfg = SchedulerConfig(classes=4, default_class=0, aging_us=30.0, max_age_us=400, max_batch=rng.choice([8, 12, 16]),
                          max_pending_per_instrument=8)
    pair = [Scheduler(cfg, n_slots, sequential=True, conflate=False, class_by_slot_kind=[[0] * n_slots] * 2)
            for _ in range(2)]
    pair[1]._take_every_slot = lambda now_ns: 0  # "out of key order": the pick loop decides every batch
    pair[1]._take_head_of_one_class = lambda now_ns: 0  # "more than one class"
    taken = []  # what each one-pass call returned (0: the pick loop decided)
    for name in ("_take_every_slot", "_take_head_of_one_class"):
        def spy(now_ns, take=getattr(pair[0], name), name=name):
            taken.append((name, take(now_ns)))
            return taken[-1][1]
        setattr(pair[0], name, spy)
    now, seq = T0, 0
    for _ in range(400):
        now += rng.randrange(1, 60) * US
        for _ in range(rng.randrange(0, 10 if one_class == 0 else 30)):
            slot, cls = rng.randrange(n_slots), 0 if rng.random() < one_class else rng.randrange(4)
            # now and then one read a while ago: its class's enqueue times out of order
            recv = now - (rng.randrange(0, 300) * US if rng.random() < 0.03 else 0)
            seq += 1
            assert len({s.push(slot, seq, seq, cls, recv, recv, 0) for s in pair}) == 1
        batches = []
        for s in pair:
            n = s.form_batch(now)
            rids = s.batch_rids[:n]
            batches.append([(r, s.r_slot[r], s.r_seq[r], s.r_stale[r]) for r in rids])
            s.release_many(rids)
        assert batches[0] == batches[1]
        assert _state(pair[0]) == _state(pair[1])
    # both ways taken: the one pass, and the pick loop where it declines
    path = "_take_head_of_one_class" if one_class else "_take_every_slot"
    ns = [n for name, n in taken if name == path]
    assert sum(1 for n in ns if n) > 10 and 0 in ns


def test_a_stall_does_not_leave_admission_tight():
    """One 20 ms gap between two backlogged batches stretches the period estimate past the whole
    deadline (depth 1: no slot can then hold two events, so no batch is backlogged again). Batches
    formed faster than the estimate without a backlog pull it back down: depth recovers."""
    s = make(8, max_age_us=1000)
    backlog(s, 8, 40, T0)
    now = steps_every(s, 100, 30)
    assert s.admit_depth == 8
    now = steps_every(s, 20_000, 1, start=now)  # the stall, still backlogged
    assert s.admit_depth == 1 and s.step_period_ns > 1000 * US
    while s.queued_slots:  # what was queued drains, one event per slot a batch
        now = steps_every(s, 100, 1, start=now)
    for _ in range(60):  # light load: one event per slot, a batch every 100 us, never backlogged
        now += 100 * US
        for slot in range(8):
            assert push(s, slot, now) != NO_REQUEST
        step(s, now)
    assert s.step_period_ns < 150 * US and s.admit_depth >= 5


def test_more_queued_slots_than_a_batch_is_a_backlog_even_at_one_event_each():
    """Slots left queued after a batch mean the next is due at once: the period between such
    batches is the pace (before 2026-12-04 only a slot holding a second event counted, so a
    backlog of many instruments at one event each was never measured)."""
    s = make(64, max_batch=8, max_age_us=10_000)
    now = T0
    for slot in range(64):
        assert push(s, slot, now, 0) != NO_REQUEST
    for _ in range(6):  # 64 slots, 8 per batch, one event each
        now += 300 * US
        step(s, now)
    assert s.step_period_ns == 300 * US


def test_overload_over_many_instruments_picks_only_fresh_events():
    """Five times the step rate over 512 instruments, an event per instrument at a time, each
    admitted or shed LATE as the ingest judges it (Scheduler.queue_wait_ns): every batch is full
    and nothing picked is stale. Before 2026-12-04 an event that queued its slot anew waited
    none by that measure, whatever the hundreds of slots queued ahead: most were stale when
    picked (stepped, their decisions withheld)."""
    s = make(512, max_batch=16, max_age_us=2000, max_pending_per_instrument=4)
    now, seq = T0, 0
    fresh = stale = late = 0
    for tick in range(600):
        for k in range(80):  # 80 arrivals per 100 us batch period: 5x the 16 stepped
            seq += 1
            slot = (seq * 7919) % 512
            origin = now - (k * 100 * US) // 80  # read at the tick's end: arrived during it
            if now - origin > s.max_age_ns - s.queue_wait_ns(slot):
                late += tick >= 300
                continue
            s.push(slot, seq, seq, 0, now, origin, 0)
        f, st = step(s, now)
        now += 100 * US
        if tick >= 300:  # the steady state
            fresh, stale = fresh + f, stale + st
    assert stale == 0 and fresh == 300 * 16 and late > 0


def test_a_batch_that_picks_stale_events_widens_the_margin_and_clean_batches_narrow_it():
    """admit_margin_ns: a quarter of the measured period more for each batch that picks a stale
    event (at most half of max_age), a 32nd less for each that picks none; admit_age_ns, the age
    past which the ingest sheds an event (less its expected wait), follows it."""
    s = make(8, max_age_us=2000)
    backlog(s, 8, 60, T0)
    steps_every(s, 100, 15)  # batches up to T0 + 1.5 ms: every pick fresh
    assert s.step_period_ns == 100 * US
    assert s.admit_margin_ns == 0 and s.admit_age_ns == s.max_age_ns
    now = T0 + 2100 * US  # every queued event is now past its deadline
    assert step(s, now) == (0, 8)
    assert s.admit_margin_ns == s.step_period_ns // 4 and s.admit_age_ns == s.max_age_ns - s.admit_margin_ns
    margins = []
    for _ in range(40):  # still stale: growing, capped at max_age / 2
        now += 100 * US
        assert step(s, now) == (0, 8)
        margins.append(s.admit_margin_ns)
    assert margins == sorted(margins) and margins[-1] == max(margins) == s.max_age_ns // 2
    while s.queued_slots:
        now += 100 * US
        step(s, now)
    m = s.admit_margin_ns
    for k in range(8):  # fresh picks from here: each batch takes a 32nd off
        assert push(s, k, now, 1000 + k) != NO_REQUEST
        now += 100 * US
        assert step(s, now)[1] == 0
        assert s.admit_margin_ns == m - (m >> 5)
        m = s.admit_margin_ns
    assert s.admit_age_ns == s.max_age_ns - m


def _saturated_loop(s, *, slots: int, per_period: int, period_us: int, lag: float, periods: int, seed: int = 0,
                    start: int = T0):
    """A loop past capacity, as on the H200 host: once a period it reads a burst of the events that
    arrived during the last one (their receive time the burst's start), admits or sheds each as the
    ingest does (LATE past admit_age_ns less Scheduler.queue_wait_ns: Ingest._handle's rule,
    test_ingest_burst holds the ingest to it), and forms one batch `lag` periods after the burst's
    start. Returns per batch (fresh, stale) over the second half, and the LATE ones, and the time
    the next period would start."""
    import random

    rnd = random.Random(seed)
    weights = [1.0 / (k + 1) ** 0.6 for k in range(slots)]  # a few busy instruments, many quiet ones
    now, seq, p = start, 0, period_us * US
    fresh = stale = late = 0
    for k in range(periods):
        for slot in rnd.choices(range(slots), weights, k=per_period):
            seq += 1
            origin = now - rnd.randrange(p)  # arrived during the last period
            if now - origin > s.admit_age_ns - (s.queue_wait_ns(slot) if s.step_period_ns else 0):
                late += k >= periods // 2
                continue
            s.push(slot, seq, seq, 0, now, origin, 0)
        f, st = step(s, now + int(lag * p))
        if k >= periods // 2:
            fresh, stale = fresh + f, stale + st
        now += p
    n = periods - periods // 2
    return fresh / n, stale / n, late / n, now


@pytest.mark.parametrize("per_period", [145, 290])
def test_overload_with_the_batch_late_in_the_period_keeps_batches_full_and_fresh(per_period):
    """The pace model expects the next batch half a period after an event's receipt; a saturated
    shard reads a burst, handles it for most of the period and only then forms the batch (3/4 of
    it here). Past capacity admission fills each queue to the deadline, so that bias alone left
    47 of a batch's 64 rows fresh here, at either load (30 with the batch a whole period late; the
    H200 host's lstm_a shard decided 55k and stepped 55k stale). With the learned margin the
    batches stay full of fresh rows, and what cannot be stepped in time is shed LATE at once
    instead (docs/bench/devvm-87f86b8/admission_sim.log)."""
    s = make(1024, max_batch=64, max_age_us=5000, max_pending_per_instrument=256, capacity=65536)
    fresh, stale, late, _ = _saturated_loop(s, slots=1024, per_period=per_period, period_us=1450, lag=0.75,
                                            periods=1200)
    assert fresh > 62 and stale < 1, (fresh, stale)
    assert late > per_period - 64 - 2  # the excess is shed at ingest, not stepped stale
    assert 0 < s.admit_margin_ns < s.max_age_ns // 2


def test_the_margin_fades_once_the_load_is_below_capacity():
    """After an overload the margin decays while batches pick nothing stale: back below capacity,
    with batches where the pace model expects them (half a period after the burst), it fades to
    nothing and the service admits as it did before the overload."""
    s = make(1024, max_batch=64, max_age_us=5000, max_pending_per_instrument=256, capacity=65536)
    *_, now = _saturated_loop(s, slots=1024, per_period=290, period_us=1450, lag=0.75, periods=400)
    assert s.admit_margin_ns > 100 * US
    fresh, stale, late, _ = _saturated_loop(s, slots=1024, per_period=40, period_us=1450, lag=0.5, periods=600,
                                            start=now)
    assert s.admit_margin_ns < 1 * US and s.admit_age_ns > s.max_age_ns - 1 * US
    # what is shed is the pace model's own: a busy instrument's event behind two of its own (2.5
    # places of 1.45 ms) plus its age passes 5 ms (~0.25 a period of 40)
    assert stale == 0 and fresh > 39.5, (fresh, stale, late)
