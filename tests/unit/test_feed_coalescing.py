"""ingest.coalesce_us: while a full batch is queued, the loop reads the feed at most once per
that long (Stepper.feed_due); never while less than a batch waits, never after a burst that
stopped at its frame budget, never with runner.cpu_worker; and a value a held event could not
survive (>= scheduler.max_age_us) is refused at load. The service's own Stepper, on real sockets;
time is passed in, as the loop passes its clock."""

from __future__ import annotations

import time

import pytest
import zmq
from service_harness import in_process_services, quote

from hft_infer.config import ConfigError, load_config
from hft_infer.service import Service
from hft_infer.transport.codec import topic_for

N_SLOTS = 16
BATCH = 4
T0 = 10_000_000_000  # the loop's clock (perf_ns) at the first read
HOLD_NS = 500_000


@pytest.fixture
def make_service(tmp_path, monkeypatch):
    yield from in_process_services(tmp_path, monkeypatch, f"universe.instruments={N_SLOTS}",
                                   'scheduler.conflate="off"', f"scheduler.max_batch={BATCH}",
                                   f"ingest.coalesce_us={HOLD_NS // 1000}")


def _queue(svc: Service, slots) -> None:
    for slot in slots:
        svc.sched.push(slot, 0, 0, 0, T0, T0, 0)


def test_the_feed_is_held_only_while_a_full_batch_is_queued_and_only_for_coalesce_us(make_service):
    svc = make_service()
    step = svc.step
    assert step.ingest(T0) == 0  # an empty socket: the read emptied it at T0
    _queue(svc, range(BATCH - 1))
    assert step.feed_due(T0 + 1)  # less than a batch waits: read whatever comes
    _queue(svc, [BATCH - 1])
    assert not step.feed_due(T0 + 1) and not step.feed_due(T0 + HOLD_NS - 1)
    assert svc.acct.coalesced_reads == 1  # one read put off, however many iterations it waited
    assert step.feed_due(T0 + HOLD_NS)
    assert step.ingest(T0 + HOLD_NS) == 0
    assert not step.feed_due(T0 + HOLD_NS + 1) and svc.acct.coalesced_reads == 2
    assert svc.counters()["coalesced_reads"] == 2


def test_a_shard_with_fewer_slots_than_a_batch_holds_at_three_quarters_of_them(make_service):
    """A shard of 8 instruments at max_batch 64 can never queue a batch of 64: its full batch is
    6 slots (three quarters), or coalescing would never hold a read there."""
    svc = make_service("universe.instruments=8", "scheduler.max_batch=64", "runner.buckets=[1,2,4,8,16,32,64]")
    step = svc.step
    assert step.full_batch == 6
    assert step.ingest(T0) == 0
    _queue(svc, range(5))
    assert step.feed_due(T0 + 1)
    _queue(svc, [5])
    assert not step.feed_due(T0 + 1) and svc.acct.coalesced_reads == 1


def test_past_capacity_the_feed_is_held_at_half_the_last_step(make_service):
    """Fewer slots than a full batch queued: held only past capacity (no read found the socket
    empty for coalesce_us) and while at least half as many slots wait as the last step took."""
    svc = make_service()
    step = svc.step
    assert step.ingest(T0) == 0  # found empty at T0
    _queue(svc, range(2))
    step.last_batch = 4
    assert step.feed_due(T0 + 1)  # the socket was empty a moment ago: below capacity, read
    step._last_read = T0 + HOLD_NS  # a read at T0 + HOLD_NS emptied the socket, having found events
    assert not step.feed_due(T0 + HOLD_NS + 1) and svc.acct.coalesced_reads == 1  # 2 of the last 4
    assert step.feed_due(T0 + 2 * HOLD_NS)  # held at most coalesce_us since that read
    step.last_batch = 5
    assert step.feed_due(T0 + HOLD_NS + 1)  # 2 queued, under half of the last step's 5
    step.last_batch = 4
    assert step.ingest(T0 + HOLD_NS + 2) == 0  # a read that finds nothing: below capacity again
    assert step.feed_due(T0 + HOLD_NS + 3)


def test_small_steps_never_hold_past_capacity_however_long_since_an_empty_read(make_service):
    """Below capacity at a moderate rate a loop iteration can be as long as the gap between events,
    so no read finds the socket empty for a while (or a stall passes coalesce_us) though each step
    takes a row or two: no read is held then -- only after a step of at least half a full batch."""
    svc = make_service("universe.instruments=64", "scheduler.max_batch=64", "runner.buckets=[1,2,4,8,16,32,64]")
    step = svc.step
    assert step.full_batch == 48
    assert step.ingest(T0) == 0  # found empty at T0, then never again
    later = T0 + 10 * HOLD_NS
    step._last_read = later  # a read just now found events and emptied the socket
    for last_batch, queued in ((1, 1), (2, 1), (23, 12)):
        step.last_batch = last_batch
        _queue(svc, range(svc.sched.queued_slots, queued))
        assert step.feed_due(later + 1), (last_batch, queued)
    step.last_batch = 24  # half a full batch: past capacity, held while 12 of them wait
    assert not step.feed_due(later + 1) and svc.acct.coalesced_reads == 1
    assert step.feed_due(later + HOLD_NS)


def test_without_coalesce_us_or_with_a_worker_the_feed_is_always_due(make_service):
    for overrides in (["ingest.coalesce_us=0"], ["runner.cpu_worker=true"]):
        svc = make_service(*overrides)
        assert svc.step.coalesce_ns == 0, overrides
        assert svc.step.ingest(T0) == 0
        _queue(svc, range(N_SLOTS))
        assert svc.step.feed_due(T0 + 1) and svc.acct.coalesced_reads == 0, overrides


def test_a_burst_that_stopped_at_its_budget_leaves_the_feed_due(make_service):
    svc = make_service("ingest.max_drain=2")
    pub = zmq.Context.instance().socket(zmq.XPUB)  # the feed: the service connects to it
    pub.bind(svc.endpoints["ingest"])
    try:
        subs = 0
        while subs < N_SLOTS and pub.poll(5000):
            subs += pub.recv()[:1] == b"\x01"
        assert subs >= N_SLOTS, "the service never subscribed"
        _queue(svc, range(N_SLOTS - BATCH, N_SLOTS))  # a full batch waits already
        for i in range(5):  # five frames, two read a burst
            pub.send_multipart([topic_for(i), quote(i, 0)])
        sock = svc.ingest_sock
        deadline = time.monotonic() + 5
        while not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.1)  # let libzmq's I/O thread move all five into the socket's queue
        step = svc.step
        read = [step.ingest(T0)]
        assert read == [2] and step.feed_due(T0 + 1)  # stopped at the budget: the socket may hold more
        read.append(step.ingest(T0 + 1))
        read.append(step.ingest(T0 + 2))
        assert read == [2, 2, 1]  # the third emptied the socket: now the feed is held
        assert not step.feed_due(T0 + 3) and step.feed_due(T0 + 2 + HOLD_NS)
        assert svc.acct.received == 5
    finally:
        pub.close(0)


def test_a_coalesce_us_an_event_could_not_survive_is_refused():
    with pytest.raises(ConfigError, match="coalesce_us 5000 must be below scheduler.max_age_us 5000"):
        load_config(None, ["ingest.coalesce_us=5000"])
    assert load_config(None, ["ingest.coalesce_us=4999"]).ingest.coalesce_us == 4999


def test_read_gap_holds_past_capacity_while_steps_are_queued(make_service):
    """ingest.read_gap_us, without coalesce_us: held only once no read has found the socket empty
    for the gap, only while a slot is queued (whatever the batch), and at most the gap since the
    last read that emptied the socket; a read that finds the socket empty ends it."""
    svc = make_service("ingest.coalesce_us=0", f"ingest.read_gap_us={HOLD_NS // 1000}")
    step = svc.step
    assert step.coalesce_ns == 0 and step.read_gap_ns == HOLD_NS
    assert step.ingest(T0) == 0  # found empty at T0
    _queue(svc, [0])
    step._last_read = T0 + HOLD_NS // 2  # a read emptied the socket, having found events
    assert step.feed_due(T0 + HOLD_NS // 2 + 1)  # an empty read a moment ago: below capacity, read
    step._last_read = T0 + HOLD_NS  # no empty read since T0: past capacity by the gap
    assert not step.feed_due(T0 + HOLD_NS + 1) and svc.acct.coalesced_reads == 1
    assert not step.feed_due(T0 + 2 * HOLD_NS - 1) and svc.acct.coalesced_reads == 1  # one hold, counted once
    assert step.feed_due(T0 + 2 * HOLD_NS)  # the gap since that read has passed
    svc.sched.form_batch(T0 + 2 * HOLD_NS, force=True)  # the queued slot stepped: nothing queued
    assert svc.sched.queued_slots == 0
    assert step.feed_due(T0 + HOLD_NS + 1)  # nothing to step meanwhile: read at once
    _queue(svc, [1])
    assert not step.feed_due(T0 + HOLD_NS + 1)
    assert step.ingest(T0 + HOLD_NS + 2) == 0  # a read that finds nothing: below capacity again
    assert step.feed_due(T0 + HOLD_NS + 3)


def test_a_read_gap_us_an_event_could_not_survive_is_refused():
    with pytest.raises(ConfigError, match="read_gap_us 5000 must be below scheduler.max_age_us 5000"):
        load_config(None, ["ingest.read_gap_us=5000"])
    assert load_config(None, ["ingest.read_gap_us=4999"]).ingest.read_gap_us == 4999
