"""Property-based tests (hypothesis) of the ingress codec: any byte string and any
mutation of a valid frame is either a valid event or rejected with a reason -- never
an exception, never a crash."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hft_infer.transport.codec import IngressDecoder, book_array, classify, encode, pack_book
from hft_infer.transport.schema import Heartbeat, Quote, Reason, Trade

DECODE = IngressDecoder().decode
UNIVERSE = {i: i for i in range(32)}


def _classify(frame: bytes):
    return classify(DECODE, frame, max_frame_bytes=4096, max_levels=16, universe=UNIVERSE)


float32s = st.floats(width=32, allow_nan=True, allow_infinity=True)
levels_st = st.integers(min_value=0, max_value=20).flatmap(
    lambda n: st.lists(float32s, min_size=4 * n, max_size=4 * n).map(lambda xs: (n, xs)))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=600))
def test_random_bytes_never_raise(frame):
    msg, reason = _classify(frame)
    assert isinstance(reason, Reason)
    if reason == Reason.NONE:
        assert isinstance(msg, (Quote, Trade, Heartbeat))


@settings(max_examples=400, deadline=None)
@given(instrument=st.integers(-5, 40), seq=st.integers(-3, 2**40), lv=levels_st,
       priority=st.integers(-3, 20), declared_delta=st.sampled_from([0, 0, 0, 1, -1]))
def test_quote_validation_matches_its_definition(instrument, seq, lv, priority, declared_delta):
    n, values = lv
    block = np.asarray(values, dtype=np.float32).tobytes()
    declared = n + declared_delta
    msg, reason = _classify(encode(Quote(instrument, seq, 0, 0, declared, block, priority)))
    arr = np.asarray(values, dtype=np.float32)
    if declared < 1 or declared > 16 or declared != n:
        expected = Reason.BAD_LEVELS
    elif seq < 0 or priority < -1:
        expected = Reason.BAD_FIELD
    elif not all(math.isfinite(x) and x >= 0 and not (x == 0 and math.copysign(1, x) < 0) and x < 2.0**127
                 for x in arr.tolist()):
        expected = Reason.NON_FINITE
    elif instrument not in UNIVERSE:
        expected = Reason.UNKNOWN_INSTRUMENT
    else:
        expected = Reason.NONE
    assert reason == expected
    if reason == Reason.NONE:
        np.testing.assert_array_equal(book_array(msg), arr)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_valid_frames_never_raise(data):
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
    msg, reason = _classify(bytes(frame))
    assert isinstance(reason, Reason)
    if reason == Reason.NONE and isinstance(msg, Quote):
        assert len(msg.book) == 16 * msg.n_levels and 1 <= msg.n_levels <= 16


@settings(max_examples=200, deadline=None)
@given(price=st.floats(allow_nan=True, allow_infinity=True), size=st.floats(allow_nan=True, allow_infinity=True),
       side=st.integers(-3, 3))
def test_trade_validation(price, size, side):
    msg, reason = _classify(encode(Trade(1, 1, 0, 0, price, size, side)))
    if not (math.isfinite(price) and math.isfinite(size)) or price < 0 or size < 0:
        assert reason == Reason.NON_FINITE
    elif side not in (1, -1):
        assert reason == Reason.BAD_FIELD
    else:
        assert reason == Reason.NONE and msg.price == price
