"""The burst path of the real ingest (tests/ingest_rig.py: hft_infer.ingest.Ingest on a real socket).

A burst (frames queued before one drain) must end exactly as the same frames read one at a
time, except where conflation within the burst is the point: the rows written, the sequence
state, every rejection and its reason, the queued requests and the accounting identity. Stale
and superseded events take the cheap path: superseded ones are CONFLATED into their
instrument's newest event, a stale newest one is shed at once, and no request is left for them.
"""

from __future__ import annotations

import numpy as np
import pytest
from ingest_rig import IngestRig

from hft_infer.ingest_batch import COLUMNS_MIN
from hft_infer.transport.codec import BATCH_TOPIC, SERVICE_TOPIC, encode, pack_book, topic_for
from hft_infer.transport.schema import Decision, Heartbeat, Outcome, Quote, Reason, Reset, Trade

LEVELS = 10
OLD_NS = 1  # a ts_send_ns (epoch ns) long past every deadline


def _book(k: float, nan: bool = False) -> bytes:
    lv = np.full((LEVELS, 4), 100.0 + k, np.float32)
    lv[:, 1] = k + 1.0
    if nan:
        lv[3, 2] = np.nan
    return pack_book(lv)


def quote(inst: int, seq: int, k: float = 0.0, *, ts_send: int = 0, nan: bool = False, levels: int = LEVELS,
          topic: int | None = None) -> list[bytes]:
    book = _book(k, nan) if levels == LEVELS else pack_book(np.full((levels, 4), 7.0 + k, np.float32))
    return [topic_for(inst if topic is None else topic), encode(Quote(inst, seq, 0, ts_send, levels, book))]


def trade(inst: int, seq: int, price: float = 101.0, size: float = 2.0, side: int = 1) -> list[bytes]:
    return [topic_for(inst), encode(Trade(inst, seq, 0, 0, price, size, side))]


def burst(rig: IngestRig, messages: list[list[bytes]]) -> None:
    """Queue every message, then drain: the ingest reads them as bursts (inproc delivers at once)."""
    for parts in messages:
        rig.push.send_multipart(parts)
    while rig.ingest.drain(256):
        pass


def one_by_one(rig: IngestRig, messages: list[list[bytes]]) -> None:
    for parts in messages:
        rig.send(parts)


def _state(rig: IngestRig) -> dict:
    """What the ingest left behind, in a comparable form."""
    sched = rig.sched
    queued = {}
    for slot in range(rig.store.n_slots):
        rid = sched.s_rid[slot] if sched.conflate else None
        if sched.conflate and rid != -1:
            queued[slot] = (sched.r_seq[rid], sched.r_pos[rid])
        elif not sched.conflate and sched.s_len[slot]:
            ring = sched.s_ring[slot]
            rids = [ring[(sched.s_head[slot] + j) % sched.max_pending] for j in range(sched.s_len[slot])]
            queued[slot] = [(sched.r_seq[r], sched.r_pos[r], sched.r_stale[r]) for r in rids]
    rejected = {Reason(i).name: n for i, n in enumerate(rig.acct.by_reason) if n}
    answers = sorted((a[0], a[1], a[2], a[3]) for a in zip(*rig.answers.columns()) if a[2] == Outcome.REJECTED)
    return {"received": rig.acct.received, "rejected": rejected, "rejected_answers": answers,
            "last_seq": list(rig.ingest.last_seq), "count": list(rig.store.count), "rows": rig.store.array.copy(),
            "queued": queued, "live": sched.live_requests(), "gaps": (rig.acct.seq_gaps, rig.acct.seq_missing),
            "heartbeats": rig.acct.heartbeats, "resets": rig.acct.resets, "resets_seen": list(rig.resets)}


def _mixed_feed(k0: int, k1: int, seqs: list[int], odd_sizes: bool) -> list[list[bytes]]:
    """Good quotes and trades of several instruments with bad frames of every kind among them;
    with `odd_sizes` also books of other sizes (the burst's rows then do not line up for numpy)."""
    msgs: list[list[bytes]] = []
    for k in range(k0, k1):
        inst = k % 5
        if k % 7 == 3:
            msgs.append(trade(inst, seqs[inst], 100.0 + k, 1.0 + k, 1 if k % 2 else -1))
        else:
            msgs.append(quote(inst, seqs[inst], float(k)))
        seqs[inst] += 1
        bad = k % 10
        if bad == 1:
            msgs.append(quote(2, seqs[2], nan=True))  # NON_FINITE: seq not taken
        elif bad == 2:
            msgs.append(quote(99, 0))  # UNKNOWN_INSTRUMENT (topic 99)
        elif bad == 3:
            msgs.append([topic_for(1), b"\xc1garbage"])  # DECODE_ERROR
        elif bad == 4:
            msgs.append(quote(1, seqs[1] - 1) if seqs[1] > 1 else quote(1, seqs[1] + 5))  # OUT_OF_ORDER (or a gap)
        elif bad == 5:
            msgs.append([topic_for(3)])  # BAD_FRAMING: a lone topic frame
        elif bad == 6:
            msgs.append(quote(4, seqs[4], topic=3))  # TOPIC_MISMATCH
        elif bad == 7:
            msgs.append([topic_for(0), encode(Decision(0, 1, 0, 0, 0, 0.0, 0, 0, 0, 0))])  # UNEXPECTED_KIND
        elif bad == 8:
            msgs.append([topic_for(0xFFFFFFFF), encode(Heartbeat(0))])  # not an event
        elif bad == 9:
            msgs.append(trade(0, seqs[0], price=float("nan")))  # NON_FINITE trade
        elif bad == 0 and odd_sizes:
            msgs.append([topic_for(2), encode(Quote(2, seqs[2], 0, 0, 3, b"\x00" * 40))])  # BAD_LEVELS
    mid = len(msgs) // 2
    if odd_sizes:  # a valid quote of fewer levels (the general path), instrument 2's newest, and a trade
        msgs.append(quote(2, seqs[2], levels=6))
        msgs.append(trade(3, seqs[3]))
        seqs[2] += 1
        seqs[3] += 1
    else:
        msgs.insert(mid, [topic_for(0xFFFFFFFF), encode(Reset(0, 3))])  # a Reset mid-burst
    return msgs


@pytest.mark.parametrize("conflate", [True, False])
def test_a_burst_ends_as_the_same_frames_read_one_at_a_time(conflate):
    seqs = [0] * 6
    lined_up = _mixed_feed(0, 80, seqs, odd_sizes=False)  # the numpy path: book check, row writes
    odd = _mixed_feed(80, 120, seqs, odd_sizes=True)  # per-event checks and writes
    a = IngestRig(instruments=8, topic_frame=True, conflate=conflate, max_pending=4, depth=256)
    b = IngestRig(instruments=8, topic_frame=True, conflate=conflate, max_pending=4, depth=256)
    for rig in (a, b):  # what a Reset sees already queued: everything before it in the feed
        rig.ingest.on_reset = (lambda r: lambda slots: r.resets.append(
            (slots, r.sched.live_requests(), r.sched.conflated, list(r.store.count))))(rig)
    bulk_writes = []
    write_books = a.store.write_books
    a.store.write_books = lambda *args: (bulk_writes.append(len(args[0])), write_books(*args))
    try:
        burst(a, lined_up)
        assert bulk_writes, "the lined-up burst took the numpy path"
        burst(a, odd)
        one_by_one(b, lined_up + odd)
        sa, sb = _state(a), _state(b)
        rows_a, rows_b = sa.pop("rows"), sb.pop("rows")
        assert sa == sb
        np.testing.assert_array_equal(rows_a, rows_b)
        assert a.sched.conflated == b.sched.conflated  # fresh events: the same conflations, wherever done
        assert sum(sa["rejected"].values()) >= 9 and sa["resets"] == 1
        if not conflate:
            assert sa["rejected"].get("QUEUE_FULL")  # max_pending 4: some fell over it, unwritten
        assert a.identity_holds() and b.identity_holds()
    finally:
        a.close()
        b.close()


def test_within_a_burst_only_the_newest_event_of_an_instrument_is_queued():
    rig = IngestRig(instruments=8, topic_frame=True)
    try:
        feed = [quote(i % 3, i // 3, float(i)) for i in range(30)]  # 10 each of instruments 0, 1, 2
        burst(rig, feed)
        sched = rig.sched
        assert rig.acct.received == 30 and sched.live_requests() == 3
        assert sched.conflated == 27 and sched.pending == 3
        for slot in range(3):
            rid = sched.s_rid[slot]
            assert (sched.r_seq[rid], sched.r_pos[rid], sched.r_nconf[rid]) == (9, 9, 9)
            # every row was written (the window reads them), in feed order
            assert rig.store.count[slot] == 10
            for seq in range(10):
                np.testing.assert_array_equal(rig.store.row(slot, seq)[: 4 * LEVELS],
                                              np.frombuffer(_book(float(3 * seq + slot)), "<f4"))
        assert len(rig.answers) == 0  # conflated events are not answered on their own
        assert rig.identity_holds()
    finally:
        rig.close()


def test_stale_events_are_conflated_and_their_newest_shed_at_once():
    rig = IngestRig(instruments=8, topic_frame=True, max_age_us=1000)
    try:
        feed = [quote(i % 4, i // 4, float(i), ts_send=OLD_NS) for i in range(40)]
        feed.append(quote(3, 10, 99.0))  # fresh (no send time): the newest of instrument 3 is queued
        burst(rig, feed)
        sched = rig.sched
        assert rig.acct.received == 41
        assert rig.acct.by_reason[Reason.STALE] == rig.acct.shed == 3  # the newest of instruments 0..2
        assert sched.live_requests() == 1 and sched.r_seq[sched.s_rid[3]] == 10
        assert sched.r_nconf[sched.s_rid[3]] == 10  # instrument 3's stale ones went into the fresh one
        assert sched.conflated == 9 * 3 + 10
        shed = [a for a in zip(*rig.answers.columns()) if a[2] == Outcome.SHED]
        assert sorted((a[0], a[1], a[3], a[6]) for a in shed) == [(i, 9, Reason.STALE, 9) for i in range(3)]
        assert rig.store.count[:4] == [10, 10, 10, 11]  # stale rows still update the window
        assert rig.identity_holds()
    finally:
        rig.close()


def test_a_stateful_model_applies_every_stale_row_and_withholds_its_decision():
    """admission = "depth": an event already past its deadline is still applied (queued
    apply-only: stepped, its decision withheld)."""
    rig = IngestRig(instruments=4, conflate=False, max_age_us=1000, max_pending=64, admission="depth")
    try:
        burst(rig, [quote(i % 2, i // 2, float(i), ts_send=OLD_NS)[1:] for i in range(20)]
              + [quote(1, 10)[1:]])
        sched = rig.sched
        assert sched.live_requests() == 21 and sched.conflated == 0 and rig.acct.shed == 0
        stale = [sched.r_stale[sched.s_ring[s][j]] for s in (0, 1) for j in range(sched.s_len[s])]
        assert stale.count(True) == 20 and stale.count(False) == 1
        assert rig.store.count[:2] == [10, 11]
    finally:
        rig.close()


@pytest.mark.parametrize("one_at_a_time", [False, True])
def test_deadline_admission_sheds_late_events_unapplied(one_at_a_time):
    """admission = "deadline" (the default): an event already past its deadline when read is shed
    LATE, its row not written and no position taken, so the instrument's next event takes the
    position after its last applied one; a trade after a LATE quote repeats the last applied
    book. One frame at a time and in a burst alike."""
    rig = IngestRig(instruments=4, conflate=False, max_age_us=1000, max_pending=64)
    try:
        feed = ([quote(0, 0, 1.0)[1:], quote(0, 1, 2.0, ts_send=OLD_NS)[1:], quote(1, 0, 3.0, ts_send=OLD_NS)[1:]]
                + [quote(0, 2 + i, 4.0 + i, ts_send=OLD_NS)[1:] for i in range(17)]
                + [trade(0, 19, 50.0, 2.0, 1)[1:], quote(1, 1, 9.0)[1:]])
        (one_by_one if one_at_a_time else burst)(rig, feed)
        late = [a for a in zip(*rig.answers.columns()) if a[3] == Reason.LATE]
        assert [(a[0], a[1]) for a in late] == [(0, 1), (1, 0)] + [(0, 2 + i) for i in range(17)]  # feed order
        assert rig.acct.by_reason[Reason.LATE] == 19 and rig.acct.shed == 19
        assert rig.store.count[:2] == [2, 1]  # slot 0: seq 0 and the trade; slot 1: seq 1
        np.testing.assert_array_equal(rig.store.row(0, 1)[: 4 * LEVELS], rig.store.row(0, 0)[: 4 * LEVELS])
        np.testing.assert_array_equal(rig.store.row(1, 0)[: 4 * LEVELS], np.frombuffer(_book(9.0), "<f4"))
        assert rig.ingest.last_seq[:2] == [19, 1]
        assert rig.sched.live_requests() == 3 and rig.identity_holds()
    finally:
        rig.close()


def test_a_burst_longer_than_the_ring_is_handled_in_chunks():
    rig = IngestRig(instruments=4, depth=64)
    try:
        feed = [quote(i % 2, i // 2, float(i))[1:] for i in range(250)]  # drains of 256 > depth 64
        burst(rig, feed)
        assert rig.store.count[:2] == [125, 125]
        for slot in (0, 1):
            for seq in range(125 - 64, 125):  # the ring holds the newest 64 rows of each slot
                np.testing.assert_array_equal(rig.store.row(slot, seq)[: 4 * LEVELS],
                                              np.frombuffer(_book(float(2 * seq + slot)), "<f4"))
        assert rig.sched.live_requests() == 2 and rig.sched.conflated == 248 and rig.identity_holds()
    finally:
        rig.close()


@pytest.mark.parametrize("how", ["one_by_one", "burst", "event_batch"])
def test_deadline_admission_sheds_what_its_queue_would_make_stale(how):
    """An event young enough on arrival, but not with its instrument's queue ahead of it: with 2 ms
    a queue place (Scheduler.place_ns) and a 10 ms deadline, an event 6 ms old is LATE behind two
    queued ones (expected wait 2.5 places: 6 + 5 > 10) and admitted into an empty queue (6 + 1 <=
    10); a fresh one is admitted behind the two. Per frame, in a burst and over an EventBatch (COLUMNS_MIN more
    instruments' events make the chunk long enough for the bulk and column paths) alike."""
    import time

    rig = _admission_rig()
    try:
        one_by_one(rig, [quote(0, 0, 1.0), quote(0, 1, 2.0)])  # two queued on slot 0
        rig.sched.place_ns = 2_000_000
        aged = time.time_ns() - 6_000_000
        events = [(0, 2, 3.0, aged), (1, 0, 4.0, aged), (0, 3, 5.0, 0)] + [(i, 0, 6.0, 0)
                                                                           for i in range(2, COLUMNS_MIN + 2)]
        assert _late_of(rig, how, events) == [(0, 2)]
        assert rig.store.count[:3] == [3, 1, 1] and rig.sched.s_len[:3].tolist() == [3, 1, 1]
        assert rig.ingest.last_seq[0] == 3 and rig.identity_holds()
        assert rig.column_runs == ([1] if how == "event_batch" else [])
    finally:
        rig.close()


def _admission_rig() -> IngestRig:
    """A sequential rig (10 ms deadline) that notes each column run it takes in `column_runs`: the
    EventBatch cases must take the column path (ingest_batch.py, from COLUMNS_MIN events)."""
    import test_ingest_batch  # noqa: F401 - for _late_of; a first import takes milliseconds, which would age the
    # tests' timed events past what they test (imported here, not at the top: it imports this module)

    rig = IngestRig(instruments=COLUMNS_MIN + 8, conflate=False, max_age_us=10_000, max_pending=64, topic_frame=True)
    rig.column_runs = []
    run = rig.ingest._queue_run_in_order
    rig.ingest._queue_run_in_order = lambda *args: rig.column_runs.append(1) or run(*args)
    return rig


def _late_of(rig: IngestRig, how: str, events: list[tuple]) -> list[tuple[int, int]]:
    """Send (instrument, seq, k, ts_send) events one by one, as a burst of frames or as one
    EventBatch (`how`); returns the (instrument, seq) answered LATE."""
    from test_ingest_batch import batch_frame

    if how == "event_batch":
        burst(rig, [batch_frame(events)])
    else:
        frames = [quote(i, q, k, ts_send=ts) for i, q, k, ts in events]
        (one_by_one if how == "one_by_one" else burst)(rig, frames)
    return [(a[0], a[1]) for a in zip(*rig.answers.columns()) if a[3] == Reason.LATE]


@pytest.mark.parametrize("how", ["one_by_one", "burst", "event_batch"])
def test_deadline_admission_sheds_by_the_schedulers_margin(how):
    """The scheduler's learned margin (Scheduler.admit_margin_ns; admit_age_ns = max_age less it)
    narrows what each path admits: with a 10 ms deadline and a 4.5 ms margin, an event 6 ms old
    that queues its instrument anew (no wait by the pace model) is LATE; fresh ones are admitted.
    Per frame, in a burst and over an EventBatch (the column path) alike."""
    import time

    rig = _admission_rig()
    try:
        sched = rig.sched
        sched.place_ns = sched.step_period_ns = 2_000_000  # measured: waits are counted
        sched.admit_margin_ns = 4_500_000
        sched.admit_age_ns = sched.max_age_ns - sched.admit_margin_ns
        aged = time.time_ns() - 6_000_000
        events = [(1, 0, 4.0, aged), (0, 0, 5.0, 0)] + [(i, 0, 6.0, 0) for i in range(2, COLUMNS_MIN + 2)]
        assert _late_of(rig, how, events) == [(1, 0)]
        assert rig.store.count[:3] == [1, 0, 1] and rig.sched.s_len[:3].tolist() == [1, 0, 1]
        assert rig.identity_holds()
        assert rig.column_runs == ([1] if how == "event_batch" else [])
    finally:
        rig.close()


@pytest.mark.parametrize("how", ["one_by_one", "burst", "event_batch"])
def test_deadline_admission_counts_the_slots_queued_ahead_of_a_new_one(how):
    """An event that queues its instrument anew waits for the slots queued ahead of it, the
    chunk's own first: with a 10 ms period between batches of 4, a 100 ms deadline and 20 slots
    queued (5 batches ahead), an event 36 ms old that queues a slot anew waits 5.5 periods: 36 +
    55 <= 100, admitted; the next two new slots count it ahead (21 and 22 queued: 5.5 periods),
    admitted too, and after 4 new slots one more batch: 24 queued ahead -> 6.5 periods, 36 + 65
    > 100: LATE, so are the new slots after it. Until 2026-12-04 an event for an empty queue
    waited none however many slots were queued, and was stale when its turn came. (The time the
    test itself takes between stamping the events and reading them only ages them: the admitted
    ones have 9 ms of it to spare; at a tenth of these times, 0.5 ms, a loaded 2-core VM ran out.)"""
    import time

    from test_ingest_batch import batch_frame

    rig = IngestRig(instruments=64, conflate=False, max_age_us=100_000, max_pending=64, topic_frame=True,
                    max_batch=4)
    try:
        one_by_one(rig, [quote(i, 0, 1.0) for i in range(20)])  # 20 slots queued, one event each
        sched = rig.sched
        sched.step_period_ns = 10_000_000
        sched.place_ns = 50_000_000  # a place: the period x 5 rounds (20 slots, 4 per batch)
        assert sched.queued_slots == 20 and sched.turn_wait_ns() == 55_000_000
        aged = time.time_ns() - 36_000_000
        new = list(range(20, 56))  # 36 instruments queued anew, the EventBatch's column path needs 32+
        events = [(i, 0, 2.0, aged) for i in new]
        if how == "event_batch":
            burst(rig, [batch_frame(events)])
        else:
            frames = [quote(i, q, k, ts_send=ts) for i, q, k, ts in events]
            (one_by_one if how == "one_by_one" else burst)(rig, frames)
        late = sorted(a[0] for a in zip(*rig.answers.columns()) if a[3] == Reason.LATE)
        assert late == new[4:]  # 20..23 admitted (5.5 periods), 24.. behind a sixth batch (6.5): LATE
        assert sched.queued_slots == 24 and rig.identity_holds()
    finally:
        rig.close()


@pytest.mark.parametrize("read", [burst, one_by_one])
def test_a_reset_is_applied_only_on_the_service_topic_or_its_own_instruments(read):
    """README, Reset: on `ff ff ff ff` (one instrument or all: every shard sees it and applies what
    it serves) or on the topic of the one instrument it names. On another instrument's topic (only
    the shard serving that topic would see it), a Reset of all on an instrument's topic, or on the
    batch topic, it is TOPIC_MISMATCH: counted as a received and rejected message, not applied."""
    rig = IngestRig(instruments=8, topic_frame=True)
    try:
        read(rig, [
            [SERVICE_TOPIC, encode(Reset(0, 2))],  # applied: slot 2
            [topic_for(5), encode(Reset(0, 5))],  # applied: slot 5
            [SERVICE_TOPIC, encode(Reset(0))],  # applied: all
            [topic_for(3), encode(Reset(0, 4))],  # another instrument's topic
            [topic_for(3), encode(Reset(0))],  # a Reset of all on an instrument's topic
            [BATCH_TOPIC, encode(Reset(0, 3))],  # the batch topic
            quote(1, 0),
        ])
        st = _state(rig)
        assert rig.resets == [[2], [5], list(range(8))] and st["resets"] == 3
        assert st["rejected"] == {"TOPIC_MISMATCH": 3} and st["rejected_answers"] == []  # no seq to name
        assert st["received"] == 4 and rig.identity_holds()  # the three rejected Resets and the quote
    finally:
        rig.close()
