"""Property-based tests (hypothesis) of the service's real ingest (hft_infer.ingest.Ingest, through
a real socket; tests/ingest_rig.py): any byte string, any mutation of a valid frame and any
value in the wire's ranges -- huge floats, extreme integers, sequence jumps -- is either
accepted or rejected with a reason; never an exception, and the accounting identity holds.
The ingest's inlined fast-path checks must agree with their definition in transport/codec.py."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st
from ingest_rig import IngestRig

from hft_infer.transport.codec import encode, pack_book, validate_quote, validate_trade
from hft_infer.transport.schema import Outcome, Quote, Reason, Trade

LEVELS = 10
N_INST = 32
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
U64 = st.integers(0, 2**64 - 1)
ANY_INT = st.integers(-(2**63), 2**64 - 1)  # everything msgpack can carry


@pytest.fixture(scope="module")
def rig():
    r = IngestRig(instruments=N_INST, levels=LEVELS, max_levels=16)
    yield r
    assert r.identity_holds()
    r.close()


def _fresh(rig):
    rig.ingest.last_seq[:] = [-1] * N_INST  # each example starts a sequence (no OUT_OF_ORDER carry-over)


float32s = st.floats(width=32, allow_nan=True, allow_infinity=True)
levels_st = st.integers(min_value=0, max_value=20).flatmap(
    lambda n: st.lists(float32s, min_size=4 * n, max_size=4 * n).map(lambda xs: (n, xs)))


@settings(max_examples=300, **SETTINGS)
@given(st.binary(max_size=600))
def test_random_bytes_never_raise(rig, frame):
    v = rig.classify([frame])
    assert isinstance(v.reason, Reason) and rig.identity_holds()


@settings(max_examples=400, **SETTINGS)
@given(instrument=st.one_of(st.integers(-5, 40), ANY_INT), seq=st.one_of(st.integers(-3, 2**40), ANY_INT),
       lv=levels_st, priority=st.one_of(st.integers(-3, 20), ANY_INT), declared_delta=st.sampled_from([0, 0, 0, 1, -1]),
       ts_send=st.one_of(st.just(0), ANY_INT))
def test_quote_outcome_matches_its_definition(rig, instrument, seq, lv, priority, declared_delta, ts_send):
    _fresh(rig)
    n, values = lv
    block = np.asarray(values, dtype=np.float32).tobytes()
    declared = n + declared_delta
    q = Quote(instrument, seq, 0, ts_send, declared, block, priority)
    v = rig.classify([encode(q)])
    expected = validate_quote(q, 16)
    if not expected and not 0 <= instrument < N_INST:
        expected = Reason.UNKNOWN_INSTRUMENT
    assert v.reason == expected and v.received == 1 and rig.identity_holds()
    readable = 0 <= instrument <= 0xFFFFFFFD and 0 <= seq < 2**64
    if expected:  # a readable rejected event is answered, with its reason
        assert v.answers == ([(instrument, seq, Outcome.REJECTED, expected, 0, 0.0, 0, ts_send if 0 <= ts_send < 2**63
                               else 0, v.answers[0][8])] if readable else [])
    else:
        slot, pos = instrument, rig.store.count[instrument] - 1
        arr = np.asarray(values, dtype=np.float32)[: 4 * LEVELS]
        np.testing.assert_array_equal(rig.store.array[slot, pos % rig.store.depth, : arr.size], arr)


@settings(max_examples=300, **SETTINGS)
@given(price=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e39, 1e300, 2.0**127])),
       size=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e39, -0.0, 3.4e38])),
       side=st.integers(-3, 3), ts_send=st.one_of(st.just(0), ANY_INT), seq=ANY_INT)
def test_trade_outcome_matches_its_definition(rig, price, size, side, ts_send, seq):
    _fresh(rig)
    t = Trade(1, seq, 0, ts_send, price, size, side)
    v = rig.classify([encode(t)])
    assert v.reason == validate_trade(t) and rig.identity_holds()
    if v.reason == Reason.NONE:  # what reached the feature row: exactly float32(price), float32(size * side)
        row = rig.store.array[1, (rig.store.count[1] - 1) % rig.store.depth]
        assert row[4 * LEVELS] == np.float32(price) and row[4 * LEVELS + 1] == np.float32(size * side)
        assert math.isfinite(row[4 * LEVELS]) and math.isfinite(row[4 * LEVELS + 1])


def test_values_that_crashed_the_service_are_rejected_with_a_reason(rig):
    _fresh(rig)
    book = pack_book(np.ones((LEVELS, 4), np.float32))
    cases = [
        (Trade(2, 0, 0, 0, 1e39, 1.0, 1), Reason.NON_FINITE),  # finite float64 above float32's max
        (Trade(2, 1, 0, 0, 100.0, 1e300, -1), Reason.NON_FINITE),
        (Quote(2, 2, 0, 2**64 - 1, LEVELS, book), Reason.BAD_FIELD),  # ts_send_ns beyond int64
        (Quote(2, 3, 0, -(2**63), LEVELS, book), Reason.BAD_FIELD),
    ]
    for msg, reason in cases:
        assert rig.classify([encode(msg)]).reason == reason
    assert rig.classify([encode(Quote(2, 4, 0, 0, LEVELS, book))]).reason == Reason.NONE
    # a sequence jump to the top of uint64: one gap, its size saturates, nothing overflows
    assert rig.classify([encode(Quote(2, 2**64 - 1, 0, 0, LEVELS, book))]).reason == Reason.NONE
    assert rig.acct.seq_gaps >= 1 and rig.acct.seq_missing <= 2**63 - 1
    status = rig.acct.status(0, conflated=rig.sched.conflated, pending=rig.sched.live_requests(), final=False,
                             engine="rig", model_version="m")
    msgspec.msgpack.encode(status)  # the Status (and so the control snapshot) still encodes


@settings(max_examples=300, **SETTINGS)
@given(data=st.data())
def test_mutated_valid_frames_never_raise(rig, data):
    _fresh(rig)
    n = data.draw(st.integers(1, 10))
    frame = bytearray(encode(Quote(3, 7, 1, 2, n, pack_book(np.ones((n, 4), np.float32)))))
    for _ in range(data.draw(st.integers(1, 5))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        assume(len(frame) > 0)
        pos = data.draw(st.integers(0, len(frame) - 1))
        if op == "flip":
            frame[pos] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del frame[pos:pos + data.draw(st.integers(1, 8))]
        else:
            frame[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    v = rig.classify([bytes(frame)])
    assert isinstance(v.reason, Reason) and rig.identity_holds()


@settings(max_examples=200, **SETTINGS)
@given(seqs=st.lists(st.one_of(st.integers(0, 50), U64), min_size=1, max_size=30))
def test_any_sequence_of_seqs_is_accounted(rig, seqs):
    _fresh(rig)
    book = pack_book(np.ones((LEVELS, 4), np.float32))
    gaps_before = rig.acct.seq_gaps
    outcomes = [rig.classify([encode(Quote(5, s, 0, 0, LEVELS, book))]).reason for s in seqs]
    last, gaps = -1, 0
    for s, r in zip(seqs, outcomes):  # the documented rule: next, gap, restart at 0, else OUT_OF_ORDER
        if last < 0 or s == last + 1 or s > last or s == 0:
            assert r == Reason.NONE
            gaps += last >= 0 and s > last + 1
            last = s
        else:
            assert r == Reason.OUT_OF_ORDER
    assert rig.acct.seq_gaps - gaps_before == gaps and rig.identity_holds()
