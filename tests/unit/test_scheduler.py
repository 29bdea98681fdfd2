"""Scheduler: aged priority, conflation, sequential discipline, deadlines, batch policies."""

from __future__ import annotations

import pytest

from hft_infer.config import SchedulerConfig
from hft_infer.scheduler import NCONF_MAX, NO_REQUEST, Scheduler

US = 1000


def make(n_slots=8, *, sequential=False, classes=4, **kw):
    cfg = SchedulerConfig(classes=classes, default_class=0, **kw)
    table = [[0] * n_slots, [0] * n_slots]
    return Scheduler(cfg, n_slots, sequential=sequential, conflate=not sequential, class_by_slot_kind=table)


def picked(s, now, force=False):
    n = s.form_batch(now, force=force)
    out = [(s.r_slot[r], s.r_seq[r]) for r in s.batch_rids[:n]]
    for r in s.batch_rids[:n]:
        s.release(r)
    for i in range(s.n_shed):
        s.release(s.shed_rids[i])
    return out


def test_classes_order_and_fifo_within_class():
    s = make(max_batch=16, aging_us=1e9)  # aging effectively off
    t = 1_000_000
    s.push(0, 0, 10, 2, t, t, 0)
    s.push(1, 0, 11, 0, t + 1, t + 1, 0)
    s.push(2, 0, 12, 1, t + 2, t + 2, 0)
    s.push(3, 0, 13, 0, t + 3, t + 3, 0)
    assert picked(s, t + 10) == [(1, 11), (3, 13), (2, 12), (0, 10)]


def test_aging_lets_an_old_low_class_request_overtake_new_urgent_ones():
    s = make(max_batch=1, aging_us=100.0, max_age_us=10**9)
    t0 = 10_000_000
    s.push(7, 0, 1, 3, t0, t0, 0)  # class 3 at t0: key t0 + 300us
    for i in range(5):  # class 0 arrivals after t0 + 300us have larger keys
        s.push(i, 0, 100 + i, 0, t0 + 301 * US + i, t0 + 301 * US + i, 0)
    assert picked(s, t0 + 400 * US) == [(7, 1)]
    s2 = make(max_batch=1, aging_us=100.0, max_age_us=10**9)
    s2.push(7, 0, 1, 3, t0, t0, 0)
    s2.push(0, 0, 100, 0, t0 + 299 * US, t0 + 299 * US, 0)  # enqueued before t0 + 300us: goes first
    assert picked(s2, t0 + 400 * US) == [(0, 100)]


@pytest.mark.parametrize("sequential", [False, True])
def test_flooded_class_0_does_not_starve_class_3(sequential):
    """Class 0 floods (3 arrivals per 10 us tick, 2 served: its backlog only grows). A class-3
    request arriving at t must be served, and before any class-0 request enqueued after
    t + 3 * aging_us: aging bounds its wait by 3 * aging_us plus the backlog that was
    already ahead of it."""
    aging_us = 50.0
    n_slots = 64
    s = make(n_slots, sequential=sequential, max_batch=2, aging_us=aging_us, max_age_us=10**9,
             max_pending_per_instrument=10_000, capacity=100_000)
    t = 0
    slot = 0
    low_at = None
    served_low_at = None
    overtaken_by_late = 0
    low_seq = 10**9  # marks the class-3 request (the flood's seqs are its ticks)
    for tick in range(3000):
        t += 10 * US
        for _ in range(3):
            slot = (slot + 1) % (n_slots - 1)
            s.push(slot, 0, tick, 0, t, t, 0)
        if tick == 1000:
            s.push(n_slots - 1, 0, low_seq, 3, t, t, 0)
            low_at = t
        entry_enq = list(s.s_enq_ns)  # when each queued slot entry was enqueued (its aging base)
        n = s.form_batch(t)
        for r in s.batch_rids[:n]:
            if s.r_seq[r] == low_seq:
                served_low_at = t
            elif (low_at is not None and served_low_at is None
                  and entry_enq[s.r_slot[r]] > low_at + 3 * aging_us * US):
                overtaken_by_late += 1
            s.release(r)
        if served_low_at is not None:
            break
    assert served_low_at is not None, "class 3 starved"
    assert overtaken_by_late == 0
    assert s.q_len[0] > 0  # the flood was still on when class 3 got its turn


def test_conflation_replaces_trigger_and_counts():
    s = make(max_batch=8)
    t = 5_000_000
    r1 = s.push(3, 10, 100, 0, t, t, 111)
    r2 = s.push(3, 11, 101, 0, t + 5, t + 5, 222)
    r3 = s.push(3, 12, 102, 0, t + 9, t + 9, 333)
    assert r1 == r2 == r3 and s.conflated == 2 and s.queued_slots == 1
    n = s.form_batch(t + 20)
    rid = s.batch_rids[0]
    assert n == 1 and (s.r_pos[rid], s.r_seq[rid], s.r_nconf[rid], s.r_send_epoch_ns[rid]) == (12, 102, 2, 333)
    assert s.r_origin_ns[rid] == t + 9  # latency is measured from the trigger that is decided


def test_conflation_keeps_the_queue_position():
    s = make(max_batch=1, aging_us=1e9)
    t = 1_000_000
    s.push(1, 0, 1, 0, t, t, 0)
    s.push(2, 0, 2, 0, t + 1, t + 1, 0)
    s.push(1, 1, 3, 0, t + 2, t + 2, 0)  # conflates slot 1: still ahead of slot 2
    assert picked(s, t + 3) == [(1, 3)]
    assert picked(s, t + 4) == [(2, 2)]


def test_stale_requests_are_shed_when_picked():
    s = make(max_batch=8, max_age_us=100)
    t = 1_000_000
    s.push(0, 0, 1, 0, t, t, 0)
    s.push(1, 0, 2, 0, t + 150 * US, t + 150 * US, 0)
    n = s.form_batch(t + 200 * US)
    assert n == 1 and s.r_seq[s.batch_rids[0]] == 2
    assert s.n_shed == 1 and s.r_seq[s.shed_rids[0]] == 1
    assert s.pending == 0


def test_sequential_takes_one_event_per_slot_in_order():
    s = make(max_batch=8, sequential=True, max_pending_per_instrument=4)
    t = 1_000_000
    for k in range(3):
        s.push(5, k, k, 0, t + k, t + k, 0)
    s.push(6, 0, 50, 0, t + 10, t + 10, 0)
    assert picked(s, t + 20) == [(5, 0), (6, 50)]
    assert picked(s, t + 21) == [(5, 1)]
    assert picked(s, t + 22) == [(5, 2)]
    assert picked(s, t + 23) == []


def test_sequential_overflow_is_shed_queue_full():
    s = make(max_batch=8, sequential=True, max_pending_per_instrument=2)
    t = 1_000
    assert s.push(1, 0, 0, 0, t, t, 0) != NO_REQUEST
    assert s.push(1, 1, 1, 0, t, t, 0) != NO_REQUEST
    assert s.push(1, 2, 2, 0, t, t, 0) == NO_REQUEST
    assert s.live_requests() == 2


def test_sequential_stale_requests_stay_in_batch_marked_stale():
    s = make(max_batch=8, sequential=True, max_age_us=10)
    t = 1_000_000
    s.push(1, 0, 0, 0, t, t, 0)
    n = s.form_batch(t + 50 * US)
    assert n == 1 and s.r_stale[s.batch_rids[0]] and s.n_shed == 0


def test_capacity_exhaustion_sheds():
    s = make(n_slots=64, max_batch=64, sequential=True, capacity=16, max_pending_per_instrument=64)
    results = [s.push(i % 64, 0, i, 0, 1, 1, 0) for i in range(20)]
    assert results.count(NO_REQUEST) == 4 and s.live_requests() == 16


def test_window_policy_waits_for_a_fuller_batch_or_the_deadline():
    s = make(max_batch=4, policy="window", max_wait_us=100)
    t = 1_000_000
    s.push(0, 0, 0, 0, t, t, 0)
    s.push(1, 0, 1, 0, t, t, 0)
    assert s.form_batch(t + 50 * US) == 0
    assert s.batch_due_ns(t + 50 * US) == t + 100 * US
    s.push(2, 0, 2, 0, t, t, 0)
    s.push(3, 0, 3, 0, t, t, 0)
    assert s.batch_due_ns(t + 60 * US) == 0  # full batch: go now
    assert len(picked(s, t + 60 * US)) == 4
    s.push(0, 1, 4, 0, t + 70 * US, t + 70 * US, 0)
    assert picked(s, t + 120 * US) == []
    assert picked(s, t + 171 * US) == [(0, 4)]
    s.push(1, 1, 5, 0, t + 200 * US, t + 200 * US, 0)
    assert picked(s, t + 201 * US, force=True) == [(1, 5)]


def test_adaptive_policy_shrinks_the_wait_when_over_objective_and_grows_under_it():
    s = make(max_batch=8, policy="adaptive", max_wait_us=200, latency_objective_us=100)
    a = s.adaptive
    a.wait_ns = 160 * US
    now = 0
    for i in range(64):  # way over the objective; the loop offers an update every millisecond
        now += 1000 * US
        a.observe_batch(500 * US)
        a.update(i * 10, now)
    assert a.wait_ns < 160 * US // 2
    for i in range(1024):  # way under: the sliding window refills, then the wait climbs back
        now += 1000 * US
        a.observe_batch(10 * US)
        a.update(640 + i, now)
    assert a.wait_ns == 200 * US


def test_adaptive_updates_at_most_every_update_interval():
    s = make(max_batch=8, policy="adaptive", max_wait_us=200, latency_objective_us=100)
    a = s.adaptive
    a.wait_ns = 160 * US
    a.observe_batch(500 * US)
    a.update(0, 10**9)
    assert a.wait_ns == 80 * US
    a.update(0, 10**9 + a.UPDATE_NS - 1)  # too soon: no second halving
    assert a.wait_ns == 80 * US
    a.update(0, 10**9 + a.UPDATE_NS)
    assert a.wait_ns == 40 * US


@pytest.mark.parametrize("policy", ["greedy", "window", "adaptive"])
def test_no_request_is_lost_across_policies(policy):
    s = make(n_slots=16, max_batch=4, policy=policy, max_wait_us=20, max_age_us=10**9)
    t = 0
    pushed = set()
    for i in range(400):
        t += 3 * US
        s.push(i % 16, i, i, i % 4, t, t, 0)
        pushed.add(i)
    got = set()
    conflated = s.conflated
    while s.queued_slots:
        t += 10 * US
        got |= {seq for _, seq in picked(s, t)}
    assert len(got) + conflated == len(pushed)


def test_events_conflated_by_the_ingest_count_as_the_schedulers_own():
    s = make(capacity=16)
    t = 1_000_000
    rid = s.push(0, 4, 4, 0, t, t, 0, False, 4)  # the newest of a burst of five
    assert s.r_nconf[rid] == 4 and s.conflated == 4 and s.live_requests() == 1
    assert s.push(0, 7, 7, 0, t + 1, t + 1, 0, False, 2) == rid  # replaces it: itself and two more
    assert s.r_nconf[rid] == 7 and s.conflated == 7 and (s.r_seq[rid], s.r_pos[rid]) == (7, 7)
    s.count_conflated(3)  # conflated into a trigger the ingest shed
    assert s.conflated == 10 and s.live_requests() == 1


def test_n_conflated_saturates_at_the_wires_uint32_and_conflated_counts_on():
    """The request table holds n_conflated saturated (NCONF_MAX), so that an answer takes the column
    as it is; the `conflated` counter keeps the exact count."""
    s = make(capacity=16)
    t = 1_000_000
    rid = s.push(0, 4, 4, 0, t, t, 0, False, NCONF_MAX + 5)
    assert s.r_nconf[rid] == NCONF_MAX and s.conflated == NCONF_MAX + 5
    assert s.push(0, 5, 5, 0, t + 1, t + 1, 0, False, 2) == rid
    assert s.r_nconf[rid] == NCONF_MAX and s.conflated == NCONF_MAX + 8
    other = s.push(1, 4, 4, 0, t, t, 0, False, NCONF_MAX - 2)
    assert s.push(1, 5, 5, 0, t + 1, t + 1, 0, False, 2) == other  # past the bound by one
    assert s.r_nconf[other] == NCONF_MAX and s.conflated == 2 * NCONF_MAX + 9


def test_no_room_counts_nothing_superseded():
    s = make(n_slots=20, capacity=16)
    for slot in range(16):  # every request id handed out
        assert s.push(slot, 0, 0, 0, 1, 1, 0) != NO_REQUEST
    assert s.push(16, 0, 0, 0, 1, 1, 0, False, 5) == NO_REQUEST
    assert s.conflated == 0  # the caller sheds the trigger and counts its superseded ones
