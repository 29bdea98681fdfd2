"""EventBatch frames through the real ingest (tests/ingest_rig.py: hft_infer.ingest.Ingest on a real
socket): a batch must end exactly as its quotes sent one frame each -- rows, positions, sequence
state, queued triggers, conflation and every rejection with its answer -- on the column path
(hft_infer/ingest_batch.py) and on the general path it falls back to."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from ingest_rig import IngestRig
from test_ingest_burst import LEVELS, OLD_NS, _book, _state, burst, one_by_one, quote, trade

from hft_infer.ingest_batch import COLUMNS_MIN
from hft_infer.transport.codec import (
    BATCH_TOPIC,
    SERVICE_TOPIC,
    encode,
    event_batch,
    event_batch_columns,
    event_batch_shape_ok,
    events_of_batch,
    topic_for,
)
from hft_infer.transport.schema import EventBatch, Heartbeat, Outcome, Quote, Reason, Reset, Trade

RNG_SEED = 11


def batch_frame(events: list[tuple], *, levels: int = LEVELS, topic: bytes = BATCH_TOPIC,
                priority: list[int] | None = None) -> list[bytes]:
    """One EventBatch message of (instrument, seq, k, ts_send[, (price, size, side)]) events: quotes
    with test_ingest_burst's books, trades where the fifth element is given."""
    books = [np.frombuffer(_book(e[2]), "<f4")[: levels * 4] for e in events]
    trades = [e[4] if len(e) > 4 else None for e in events]
    extra = {}
    if any(trades):
        extra = dict(kind=[1 if t else 0 for t in trades], price=[t[0] if t else 0.0 for t in trades],
                     size=[t[1] if t else 0.0 for t in trades], side=[t[2] if t else 0 for t in trades])
    b = event_batch([e[0] for e in events], [e[1] for e in events], [0] * len(events), [e[3] for e in events],
                    np.stack(books), priority, **extra)
    return [topic, encode(b)]


def frames_of(events: list[tuple]) -> list[list[bytes]]:
    return [trade(e[0], e[1], *e[4]) if len(e) > 4 else quote(e[0], e[1], e[2], ts_send=e[3]) for e in events]


def _feed(rng, n: int, instruments: int, seqs: list[int], trades: float = 0.1) -> list[tuple]:
    """Quotes and (a share `trades` of) trades of random instruments, each next in its sequence."""
    out = []
    for inst in rng.integers(0, instruments, n).tolist():
        k = float(rng.integers(0, 1000))
        if rng.random() < trades:
            out.append((inst, seqs[inst], k, 0, (100.0 + k, 1.0 + k / 10, 1 if k % 2 else -1)))
        else:
            out.append((inst, seqs[inst], k, 0))
        seqs[inst] += 1
    return out


def _compare(a: IngestRig, b: IngestRig) -> None:
    sa, sb = _state(a), _state(b)
    rows_a, rows_b = sa.pop("rows"), sb.pop("rows")
    assert sa == sb
    np.testing.assert_array_equal(rows_a, rows_b)
    assert a.sched.conflated == b.sched.conflated
    assert a.identity_holds() and b.identity_holds()


def _rigs(**kw) -> tuple[IngestRig, IngestRig]:
    return IngestRig(instruments=8, topic_frame=True, **kw), IngestRig(instruments=8, topic_frame=True, **kw)


def test_the_column_path_ends_as_the_quotes_sent_one_frame_each():
    rng = np.random.default_rng(RNG_SEED)
    seqs = [0] * 8
    # batches of 1 to 300 quotes: instruments with more than the ring's depth (64) in one run too
    sizes = [1, 5, 300, 17, 64, 129]
    quotes = [_feed(rng, k, 3 if k == 300 else 6, seqs) for k in sizes]  # ~100 each of 3 in the 300
    a, b = _rigs()
    writes = []  # rows the column path wrote, per run
    write_rows = a.ingest._write_rows
    a.ingest._write_rows = lambda *args: (writes.append(len(args[5])), write_rows(*args))
    try:
        burst(a, [batch_frame(q) for q in quotes[:3]])  # three batches read in one drain: merged
        for q in quotes[3:]:
            burst(a, [batch_frame(q)])
        one_by_one(b, [f for q in quotes for f in frames_of(q)])
        assert writes == [306, 64, 129], "the runs of COLUMNS_MIN (64) or more events took the column path"
        _compare(a, b)
        assert a.acct.received == sum(sizes) and a.sched.conflated == sum(sizes) - a.sched.live_requests()
    finally:
        a.close()
        b.close()


def test_with_the_models_window_given_a_conflating_run_writes_only_each_slots_window():
    """rows_read = W (the service passes its model's window): a conflating run writes each slot's
    last W rows, the only ones a step reads (older ones: never read before newer rows replace
    them); those rows, trades' books taken from unwritten quotes included, and all other state
    end exactly as the same events one frame each (which write every row)."""
    window = 10
    rng = np.random.default_rng(RNG_SEED + 1)
    seqs = [0] * 8
    sizes = [300, COLUMNS_MIN + 8, 129, COLUMNS_MIN + 1]  # ~50, ~12, ~21, ~11 events per instrument per run
    feeds = [_feed(rng, k, 6, seqs, trades=0.3) for k in sizes]
    a = IngestRig(instruments=8, topic_frame=True, rows_read=window)
    b = IngestRig(instruments=8, topic_frame=True)
    writes = []
    write_rows = a.ingest._write_rows
    a.ingest._write_rows = lambda *args: (writes.append(int(args[6].sum())), write_rows(*args))
    try:
        for f in feeds:
            burst(a, [batch_frame(f)])
        one_by_one(b, [fr for f in feeds for fr in frames_of(f)])
        per_run = [sum(min(c, window) for c in np.bincount([e[0] for e in f]).tolist()) for f in feeds]
        assert writes == per_run and per_run[0] < sizes[0]
        sa, sb = _state(a), _state(b)
        sa.pop("rows"), sb.pop("rows")
        assert sa == sb and a.sched.conflated == b.sched.conflated
        for slot in range(8):
            n = a.store.count[slot]
            assert n == b.store.count[slot]
            np.testing.assert_array_equal(a.store.window(slot, n - 1, window), b.store.window(slot, n - 1, window))
        assert a.identity_holds()
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("conflate", [True, False])
def test_a_trade_as_an_instruments_first_event_has_a_zero_book_whatever_the_ring_held(conflate):
    """An instrument's first event a trade, in a run that takes the column path: its row's book is
    zeros (no row before it), as on the per-frame path, even where the ring still holds old rows
    (here: every ring row of the rig set to 5.0 before the feed, as memory left by earlier use)."""
    rng = np.random.default_rng(RNG_SEED + 7)
    seqs = [0] * 8
    first = [(2, 0, 1.0, 0, (100.5, 3.0, -1))]  # instrument 2's first event: a trade
    seqs[2] = 1
    feed = first + _feed(rng, COLUMNS_MIN + 20, 8, seqs, trades=0.2)
    kw = dict(instruments=8, conflate=conflate, topic_frame=True, max_pending=256, depth=256)
    a, b = IngestRig(**kw), IngestRig(**kw)
    writes = []
    write_rows = a.ingest._write_rows
    a.ingest._write_rows = lambda *args: (writes.append(1), write_rows(*args))
    try:
        a.store.array[:] = 5.0
        b.store.array[:] = 5.0
        burst(a, [batch_frame(feed)])
        one_by_one(b, frames_of(feed))
        assert writes == [1], "the run took the column path"
        row = a.store.row(2, 0)
        assert not row[: 4 * LEVELS].any() and row[4 * LEVELS:].tolist() == [100.5, -3.0]
        for slot in range(8):
            n = a.store.count[slot]
            assert n == b.store.count[slot]
            np.testing.assert_array_equal(a.store.window(slot, n - 1, n), b.store.window(slot, n - 1, n))
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("case", ["clean", "nan", "unknown", "gap", "repeat", "restart", "ts_negative", "priority",
                                  "levels", "wrong_topic", "first_seq_after_history"])
def test_a_batch_the_column_path_refuses_ends_as_its_quotes_in_one_burst(case):
    n = 4 * -(-max(48, COLUMNS_MIN) // 4)  # a clean run long enough for the column path
    good = [(i % 4, i // 4, float(i), 0) for i in range(n)]  # n / 4 each of instruments 0..3
    good[13] = good[13] + ((101.0, 2.0, -1),)  # a trade among them
    a, b = _rigs()
    columns = []
    a.ingest._write_rows = (lambda w: lambda *args: (columns.append(len(args[5])), w(*args)))(a.ingest._write_rows)
    try:
        history = [(0, 0, 1.0, 0), (1, 0, 2.0, 0)]
        if case == "first_seq_after_history":  # instrument 0 already at seq 0: the batch starting at 0 repeats it
            burst(a, frames_of(history))
            burst(b, frames_of(history))
        quotes = list(good)
        topic = BATCH_TOPIC
        priority = None
        levels = LEVELS
        if case == "unknown":
            quotes[5] = (99, 0, 5.0, 0)
        elif case == "gap":
            quotes[9] = (quotes[9][0], quotes[9][1] + 3, 9.0, 0)
        elif case == "repeat":
            quotes[8] = quotes[4]
        elif case == "restart":
            quotes += [(2, 0, 50.0, 0)]
        elif case == "ts_negative":
            quotes[3] = (quotes[3][0], quotes[3][1], 3.0, -5)
        elif case == "priority":
            priority = [-1] * len(quotes)
            priority[7] = -3
        elif case == "levels":
            levels = 6
        elif case == "wrong_topic":
            topic = topic_for(2)
        frame = batch_frame(quotes, levels=levels, topic=topic, priority=priority)
        if case == "nan":
            b_ = events_of_batch(msgspec_decode(frame[1]))
            raw = bytearray(frame[1])
            at = raw.find(bytes(b_[10].book)) + 8  # quote 10's third float
            raw[at:at + 4] = np.float32(np.nan).tobytes()
            frame = [topic, bytes(raw)]
        burst(a, [frame])
        # b: the same quotes, each as a frame of its own under the same topic rules, in one burst
        expanded = events_of_batch(msgspec_decode(frame[1]))
        tops = [topic_for(q.instrument) if topic == BATCH_TOPIC else topic for q in expanded]
        burst(b, [[t, encode(q)] for t, q in zip(tops, expanded)])
        _compare(a, b)
        assert columns == ([n] if case == "clean" else []), "only the clean batch took the column path"
        if case in ("nan", "unknown", "repeat", "ts_negative", "priority", "wrong_topic"):
            assert sum(a.acct.by_reason) >= 1, "the case's quote was rejected"
        elif case == "levels":
            assert a.store.count[:4] == [n // 4] * 4 and a.sched.live_requests() == 4
    finally:
        a.close()
        b.close()


def msgspec_decode(payload: bytes) -> EventBatch:
    import msgspec
    return msgspec.msgpack.decode(payload, type=EventBatch)


def test_a_stateful_model_takes_every_quote_of_a_batch_in_order():
    a, b = (IngestRig(instruments=4, conflate=False, topic_frame=True, max_pending=8) for _ in range(2))
    try:
        quotes = [(i % 2, i // 2, float(i), 0) for i in range(30)]  # 15 each: more than max_pending
        burst(a, [batch_frame(quotes)])
        burst(b, frames_of(quotes))
        _compare(a, b)
        assert a.acct.by_reason[Reason.QUEUE_FULL] == 14  # 15 - 8 per instrument, unwritten
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("conflate", [True, False])
def test_a_run_continuing_sequences_past_int64_takes_the_column_path(conflate):
    """seq is uint64 on the wire: a run whose instruments' last seqs are past 2**63 (past int64, which
    a numpy check of the sequences could not hold) is checked for continuity all the same and taken
    as columns, and a run that repeats such a seq is refused, both ending as the quotes sent one
    frame each."""
    big = 2**63 + 5
    n = 4 * -(-max(48, COLUMNS_MIN) // 4)
    for repeat in (False, True):
        a, b = (IngestRig(instruments=8, conflate=conflate, topic_frame=True, max_pending=256) for _ in range(2))
        columns: list[int] = []
        a.ingest._write_rows = (lambda w, seen: lambda *args: (seen.append(len(args[1])), w(*args)))(
            a.ingest._write_rows, columns)
        try:
            history = [(i, big, 1.0, 0) for i in range(4)]
            burst(a, frames_of(history))
            burst(b, frames_of(history))
            start = big if repeat else big + 1
            quotes = [(i % 4, start + i // 4, float(i), 0) for i in range(n)]
            burst(a, [batch_frame(quotes)])
            burst(b, frames_of(quotes))
            _compare(a, b)
            assert columns == ([] if repeat else [n])
            if repeat:  # each instrument's first quote repeats its last seq
                assert a.acct.by_reason[Reason.OUT_OF_ORDER] == 4
            else:
                assert a.ingest.last_seq[:4] == [big + n // 4] * 4
        finally:
            a.close()
            b.close()


def _queued_requests(rig: IngestRig) -> tuple:
    """What _state does not hold of a sequential scheduler: each queued request's class, send time,
    n_conflated and deadline origin, the class FIFOs' slot order, the counters, and the answers (without the
    receive time, which differs between two rigs) of each reason, in order. Across reasons the order is not
    defined: the per-frame path answers a chunk's LATE ones, then its QUEUE_FULL ones, chunk by chunk (chunks
    of the ring's depth within a burst), the column path a run's LATE ones, then its QUEUE_FULL ones, so the
    two interleave them differently when a run spans several chunks (found when COLUMNS_MIN went to 64 and
    this test's runs changed)."""
    sched = rig.sched
    per_slot = {}
    for slot in range(rig.store.n_slots):
        ring = sched.s_ring[slot]
        rids = [ring[(sched.s_head[slot] + j) % sched.max_pending] for j in range(sched.s_len[slot])]
        # origin == receive: no send time, or one ahead of our clock (counted from receipt)
        per_slot[slot] = [(sched.r_cls[r], sched.r_send_epoch_ns[r], sched.r_nconf[r],
                           sched.r_origin_ns[r] == sched.r_recv_ns[r]) for r in rids]
    fifos = [[sched.q_buf[c][(sched.q_head[c] + j) % rig.store.n_slots] for j in range(sched.q_len[c])]
             for c in range(sched.classes)]
    answers: dict[int, list] = {}
    for a in zip(*rig.answers.columns()):
        answers.setdefault(a[3], []).append(a[:8])  # by reason, each in the order answered
    return per_slot, fifos, sched.pending, sched.queued_slots, answers, list(rig.acct.by_reason), rig.acct.shed


def _step_some(rig: IngestRig, k: int) -> None:
    """k steps' worth of requests off the queues, decided and their ids given back (as the stepper)."""
    for _ in range(k):
        n = rig.sched.form_batch(0, force=True)
        rig.sched.release_many(rig.sched.batch_rids[:n])
        rig.acct.decided += n


@pytest.mark.parametrize("admission", ["deadline", "depth"])
def test_a_stateful_model_takes_a_run_of_batches_as_columns_as_its_events_one_frame_each(admission):
    """Sequential: runs of batches (quotes and trades, stale and fresh, priorities, instruments past
    their room in the scheduler) take the column path and end exactly as their events sent one
    frame each: rows, positions, queued requests in order with their stale flag, class and send
    time, FIFO order, QUEUE_FULL sheds with their answers, and the accounting. Under deadline
    admission the stale ones are shed LATE, unapplied (their slots' later rows close up, a trade
    after one repeats the last applied book); under depth admission they are queued apply-only."""
    rng = np.random.default_rng(RNG_SEED + 3)
    seqs = [0] * 8
    fresh = time.time_ns()
    ahead = fresh + 10**11  # a publisher clock 100 s ahead of ours
    first_id = 1000  # instrument ids apart from slots: an answer that named a slot would differ
    runs = []
    for k in (COLUMNS_MIN + 8, 300, COLUMNS_MIN + 1, 120):
        feed = _feed(rng, k, 5 if k == 300 else 8, seqs, trades=0.2)
        feed = [(first_id + e[0], e[1], e[2], int(rng.choice([0, OLD_NS, fresh, ahead]))) + e[4:] for e in feed]
        runs.append((feed, rng.integers(-1, 7, len(feed)).tolist()))
    kw = dict(instruments=8, conflate=False, topic_frame=True, max_pending=40, depth=128, admission=admission,
              first_id=first_id)
    a, b = IngestRig(**kw), IngestRig(**kw)
    writes = []
    write_rows = a.ingest._write_rows

    def counting_writes(*args):  # rows written per run: `keep`'s count, or every event's (keep None)
        writes.append(len(args[1]) if args[6] is None else int(args[6].sum()))
        return write_rows(*args)

    a.ingest._write_rows = counting_writes
    try:
        for feed, prio in runs:
            half = len(feed) // 2
            batches = [batch_frame(feed[:half], priority=prio[:half]), batch_frame(feed[half:], priority=prio[half:])]
            burst(a, batches)
            # b: the same events, each a frame of its own under its instrument's topic
            singles = [e for f in batches for e in events_of_batch(msgspec_decode(f[1]))]
            burst(b, [[topic_for(e.instrument), encode(e)] for e in singles])
            _compare(a, b)
            assert _queued_requests(a) == _queued_requests(b)
            # the shed answers (LATE, QUEUE_FULL) alike, all but their receive times
            assert sorted(x[:8] for x in zip(*a.answers.columns())) == sorted(x[:8] for x in zip(*b.answers.columns()))
            _step_some(a, 3)
            _step_some(b, 3)
        assert len(writes) == 4, "every run took the column path"
        assert {x[0] for x in zip(*a.answers.columns())} <= set(range(first_id, first_id + 8))
        assert a.acct.by_reason[Reason.QUEUE_FULL] > 0, "the 300-event run passed some instruments' room"
        stale = [a.sched.r_stale[r] for s in range(8) for r in a.sched.s_ring[s][:a.sched.s_len[s]]]
        if admission == "depth":
            assert True in stale and False in stale and a.acct.by_reason[Reason.LATE] == 0
        else:
            assert True not in stale and a.acct.by_reason[Reason.LATE] > 0
    finally:
        a.close()
        b.close()


def test_a_stateful_run_shed_late_whole_stores_no_row_and_ends_as_its_events_one_frame_each():
    """Deadline admission, every event of a run long past its deadline (a saturated service's usual
    run): all shed LATE on the column path, none queued, no ring row written (the ring as the
    previous run left it), each slot's count as before and its sequence advanced -- as the same
    events sent one frame each."""
    rng = np.random.default_rng(RNG_SEED + 5)
    seqs = [0] * 8
    kw = dict(instruments=8, conflate=False, topic_frame=True, max_pending=64, depth=128, admission="deadline")
    a, b = IngestRig(**kw), IngestRig(**kw)
    in_order, writes = [], []
    a.ingest._queue_run_in_order = (lambda f: lambda *args: (in_order.append(1), f(*args))[1])(
        a.ingest._queue_run_in_order)
    a.ingest._write_rows = (lambda f: lambda *args: (writes.append(1), f(*args))[1])(a.ingest._write_rows)
    try:
        fresh = _feed(rng, COLUMNS_MIN + 8, 8, seqs, trades=0.2)  # rows in the ring first
        stale = [(e[0], e[1], e[2], OLD_NS) + e[4:] for e in _feed(rng, COLUMNS_MIN + 8, 8, seqs, trades=0.2)]
        for feed in (fresh, stale):
            frame = batch_frame(feed)
            burst(a, [frame])
            # b: the same events (trades with their send time too), each a frame of its own
            burst(b, [[topic_for(e.instrument), encode(e)] for e in events_of_batch(msgspec_decode(frame[1]))])
        _compare(a, b)
        assert len(in_order) == 2 and len(writes) == 1, "both runs on the column path; the stale one wrote no row"
        assert a.acct.by_reason[Reason.LATE] == len(stale)
        assert list(a.store.count)[:8] == [sum(1 for e in fresh if e[0] == s) for s in range(8)]  # (then the sink)
        assert list(a.ingest.last_seq) == [s - 1 if s else -1 for s in seqs]
    finally:
        a.close()
        b.close()


def test_a_stateful_run_that_would_exhaust_the_request_ids_takes_the_general_path():
    rng = np.random.default_rng(RNG_SEED + 4)
    seqs = [0] * 8
    feed = _feed(rng, 100, 8, seqs)
    kw = dict(instruments=8, conflate=False, topic_frame=True, max_pending=64, capacity=50)
    a, b = IngestRig(**kw), IngestRig(**kw)
    columns = []
    a.ingest._write_rows = (lambda w: lambda *args: (columns.append(1), w(*args)))(a.ingest._write_rows)
    try:
        burst(a, [batch_frame(feed)])
        burst(b, frames_of(feed))
        _compare(a, b)
        assert _queued_requests(a) == _queued_requests(b)
        assert columns == [] and a.acct.by_reason[Reason.QUEUE_FULL] == 50 and a.sched.free_requests() == 0
    finally:
        a.close()
        b.close()


def test_stale_batches_cost_one_answer_per_instrument():
    rig = IngestRig(instruments=8, topic_frame=True, max_age_us=1000)
    try:
        quotes = [(i % 4, i // 4, float(i), OLD_NS) for i in range(400)]
        burst(rig, [batch_frame(quotes[:150]), batch_frame(quotes[150:])])
        assert rig.acct.received == 400
        assert rig.acct.by_reason[Reason.STALE] == rig.acct.shed == 4
        assert rig.sched.conflated == 396 and rig.sched.live_requests() == 0
        shed = sorted((a[0], a[1], a[3], a[6]) for a in zip(*rig.answers.columns()) if a[2] == Outcome.SHED)
        assert shed == [(i, 99, Reason.STALE, 99) for i in range(4)]
        assert rig.store.count[:4] == [100] * 4 and rig.ingest.last_seq[:4] == [99] * 4
        np.testing.assert_array_equal(rig.store.row(1, 99)[: 4 * LEVELS], np.frombuffer(_book(397.0), "<f4"))
        assert rig.identity_holds()
    finally:
        rig.close()


def test_batches_frames_heartbeats_and_resets_keep_feed_order_in_one_burst():
    rng = np.random.default_rng(RNG_SEED + 1)
    seqs = [0] * 8
    q1, q2, q3 = _feed(rng, 20, 5, seqs), _feed(rng, 7, 5, seqs), _feed(rng, 12, 5, seqs)
    msgs = ([batch_frame(q1)] + frames_of(q2[:3]) + [[SERVICE_TOPIC, encode(Heartbeat(0))]]
            + [batch_frame(q2[3:])] + [[SERVICE_TOPIC, encode(Reset(0, 2))]] + [batch_frame(q3)])
    flat = (frames_of(q1) + frames_of(q2[:3]) + [[SERVICE_TOPIC, encode(Heartbeat(0))]] + frames_of(q2[3:])
            + [[SERVICE_TOPIC, encode(Reset(0, 2))]] + frames_of(q3))
    a, b = _rigs()
    for rig in (a, b):  # what the Reset sees queued: everything before it in the feed
        rig.ingest.on_reset = (lambda r: lambda slots: r.resets.append(
            (slots, r.sched.live_requests(), r.sched.conflated, list(r.store.count))))(rig)
    try:
        burst(a, msgs)
        burst(b, flat)
        _compare(a, b)
        assert a.acct.heartbeats == 1 and a.acct.resets == 1 and a.acct.received == 39
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("damage", ["seq_short", "book_long", "priority_short", "n_zero"])
def test_a_batch_whose_columns_disagree_is_one_decode_error(damage):
    good = event_batch([1, 2], [0, 0], [0, 0], [0, 0], np.ones((2, LEVELS, 4)))
    fields = dict(n=2, n_levels=LEVELS, instrument=bytes(good.instrument), seq=bytes(good.seq),
                  ts_exchange_ns=bytes(good.ts_exchange_ns), ts_send_ns=bytes(good.ts_send_ns),
                  book=bytes(good.book), priority=b"")
    if damage == "seq_short":
        fields["seq"] = fields["seq"][:8]
    elif damage == "book_long":
        fields["book"] += b"\x00" * 16
    elif damage == "priority_short":
        fields["priority"] = b"\x00"
    else:
        fields["n"] = 0
    bad = EventBatch(**fields)
    assert event_batch_columns(bad) is None and events_of_batch(bad) is None
    rig = IngestRig(instruments=4, topic_frame=True)
    try:
        v = rig.classify([BATCH_TOPIC, encode(bad)])
        assert v.reason == Reason.DECODE_ERROR and v.received == 1
        rig.classify(batch_frame([(1, 0, 1.0, 0)]))  # the next batch is read as usual
        assert rig.sched.live_requests() == 1 and rig.identity_holds()
    finally:
        rig.close()


def _shape_by_the_table(batch: EventBatch) -> bool:
    """The shape rule read straight off the column tables (transport/schema.py): the oracle for
    codec.event_batch_shape_ok, which compares cached tuples of lengths instead."""
    from hft_infer.transport.schema import BYTES_PER_LEVEL, EVENT_BATCH_COLUMNS, EVENT_BATCH_OPTIONAL_COLUMNS

    size = {"<u4": 4, "<u8": 8, "<i8": 8, "<f8": 8, "i1": 1, "u1": 1}
    n, levels = batch.n, batch.n_levels
    if n < 1 or levels < 0 or len(batch.book) != n * levels * BYTES_PER_LEVEL:
        return False
    if any(len(getattr(batch, name)) != n * size[dt] for name, dt in EVENT_BATCH_COLUMNS):
        return False
    if any(len(getattr(batch, name)) not in (0, n * size[dt]) for name, dt in EVENT_BATCH_OPTIONAL_COLUMNS):
        return False
    trade = [len(getattr(batch, name)) > 0 for name in ("kind", "price", "size", "side")]
    return all(trade) or not any(trade)


@settings(max_examples=400, deadline=None)
@given(n=st.integers(-1, 6), levels=st.integers(-1, 3), data=st.data())
def test_the_shape_check_follows_the_column_tables(n, levels, data):
    """Column lengths at, or one off, the right ones for n, mostly right (else almost every batch
    is refused for its first column and the rules for the optional ones go untested)."""
    k = max(n, 0)

    def required(per_event: int) -> int:
        return data.draw(st.sampled_from([k * per_event] * 6 + [k * per_event + 1, max(k * per_event - 1, 0)]))

    def optional(per_event: int) -> int:
        return data.draw(st.sampled_from([0] * 3 + [k * per_event] * 3 + [k * per_event + 1]))

    fields = dict(n=n, n_levels=levels, instrument=bytes(required(4)), seq=bytes(required(8)),
                  ts_exchange_ns=bytes(required(8)), ts_send_ns=bytes(required(8)),
                  book=bytes(required(max(levels, 0) * 16)), priority=bytes(optional(1)), kind=bytes(optional(1)),
                  price=bytes(optional(8)), size=bytes(optional(8)), side=bytes(optional(1)))
    batch = EventBatch(**fields)
    assert event_batch_shape_ok(batch) == _shape_by_the_table(batch)
    for _ in range(2):  # the second call reads the cached lengths for n
        assert event_batch_shape_ok(batch) == _shape_by_the_table(batch)


def test_a_plain_msgpack_client_writes_the_readme_example_and_the_ingest_takes_it():
    """The README's EventBatch example, built with msgpack alone (a foreign client), is the
    148 bytes the README lists, and the real ingest takes its quote and trade in order."""
    import re
    import struct
    from pathlib import Path

    import msgpack

    book = struct.pack("<4f", 100.0, 2.0, 100.5, 3.0) + bytes(16)
    frame = msgpack.packb([5, 2, 1, struct.pack("<2I", 7, 7), struct.pack("<2Q", 0, 1), bytes(16), bytes(16), book,
                           b"", bytes([0, 1]), struct.pack("<2d", 0.0, 100.5), struct.pack("<2d", 0.0, 2.0),
                           struct.pack("<2b", 0, 1)], use_bin_type=True)
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("#### EventBatch (tag 5)"):readme.index("#### Decision (tag 16)")]
    block = section[section.index("```\n9d"):]
    block = block[4:block.index("\n```")]
    listed = []
    for line in block.splitlines():  # the hex bytes open each line; the comment follows them
        for tok in line.split():
            if re.fullmatch(r"[0-9a-f]{2}", tok):
                listed.append(int(tok, 16))
            elif re.fullmatch(r"\(x\d+\)", tok):  # the byte before, repeated to this many
                listed.extend([listed[-1]] * (int(tok[2:-1]) - 1))
            else:
                break
    assert len(frame) == 148 and bytes(listed) == frame, "README's bytes are the plain-msgpack frame"
    events = events_of_batch(msgspec_decode(frame))
    assert [(type(e).__name__, e.instrument, e.seq) for e in events] == [("Quote", 7, 0), ("Trade", 7, 1)]
    rig = IngestRig(instruments=8, levels=1, max_levels=1, topic_frame=True)
    try:
        v = rig.classify([BATCH_TOPIC, frame])
        assert v.reason == Reason.NONE and v.received == 2
        np.testing.assert_array_equal(rig.store.row(7, 1)[:6], np.array([100.0, 2.0, 100.5, 3.0, 100.5, 2.0], "f4"))
        assert rig.identity_holds()
    finally:
        rig.close()


def test_the_batch_frame_limit_stays_within_what_libzmq_delivers():
    from hft_infer.config import load_config

    assert load_config(None, []).ingest.batch_frame_limit() == 65536
    assert load_config(None, ["ingest.max_msg_size_bytes=2000"]).ingest.batch_frame_limit() == 2000
    assert load_config(None, ["ingest.max_msg_size_bytes=-1", "ingest.max_batch_frame_bytes=200000"]
                       ).ingest.batch_frame_limit() == 200000
    assert load_config(None, ["ingest.max_frame_bytes=100000", "ingest.max_msg_size_bytes=-1"]
                       ).ingest.batch_frame_limit() == 100000


def test_the_column_path_at_the_services_shape_writes_every_slots_rows():
    """64 instruments and a ring of ~600 rows, as the default service has (slot * depth is past
    int16: the column path sorts slots as int16 and must index the ring in int64), with trades."""
    rng = np.random.default_rng(RNG_SEED + 2)
    seqs = [0] * 64
    runs = [_feed(rng, k, 64, seqs) for k in (200, 300, 64)]
    a, b = (IngestRig(instruments=64, topic_frame=True, depth=600) for _ in range(2))
    try:
        for q in runs:
            burst(a, [batch_frame(q[x:x + 50]) for x in range(0, len(q), 50)])
        one_by_one(b, [f for q in runs for f in frames_of(q)])
        _compare(a, b)
        assert a.store.count[63] > 0 and np.abs(a.store.array[63]).sum() > 0
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("levels", [0, 1, 10])
@pytest.mark.parametrize("with_priority", [False, True])
@pytest.mark.parametrize("with_trades", [False, True])
def test_events_of_batch_are_the_batchs_columns_row_by_row(levels, with_priority, with_trades):
    """The per-event path's expansion (codec.events_of_batch) against the numpy reading of the same
    frame (event_batch_columns): each event's type, fields and book bytes are its row's."""
    rng = np.random.default_rng(RNG_SEED + levels)
    n = 13
    kind = rng.integers(0, 2, n).astype("u1") if with_trades else None
    batch = event_batch(rng.integers(0, 2**32, n, dtype=np.uint64), rng.integers(0, 2**63, n, dtype=np.uint64),
                        rng.integers(-2**62, 2**62, n), rng.integers(0, 2**62, n),
                        rng.random((n, levels * 4), dtype=np.float32),
                        rng.integers(-1, 5, n) if with_priority else None, kind=kind,
                        price=rng.random(n) if with_trades else None, size=rng.random(n) if with_trades else None,
                        side=rng.choice([-1, 1], n) if with_trades else None)
    batch = msgspec_decode(encode(batch))  # as the ingest gets it: decoded from a frame
    events, cols = events_of_batch(batch), event_batch_columns(batch)
    assert len(events) == n
    for i, e in enumerate(events):
        assert (e.instrument, e.seq, e.ts_exchange_ns, e.ts_send_ns, e.priority) == (
            int(cols["instrument"][i]), int(cols["seq"][i]), int(cols["ts_exchange_ns"][i]),
            int(cols["ts_send_ns"][i]), int(cols["priority"][i]))
        if with_trades and kind[i] == 1:
            assert type(e) is Trade and (e.price, e.size, e.side) == (
                float(cols["price"][i]), float(cols["size"][i]), int(cols["side"][i]))
        else:
            assert type(e) is Quote and e.n_levels == levels and bytes(e.book) == cols["book"][i].tobytes()
