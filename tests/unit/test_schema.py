"""Wire schema round trips and every bad-input path mapping to its reason code, through the
service's real ingest (tests/ingest_rig.py)."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest
from ingest_rig import IngestRig

from hft_infer.transport.codec import (
    EgressDecoder,
    IngressDecoder,
    ReusableEncoder,
    book_array,
    encode,
    instrument_of_topic,
    pack_book,
    topic_for,
)
from hft_infer.transport.schema import Decision, Heartbeat, Quote, Reason, Status, Trade

MAX_LEVELS = 10


def _check(frame, max_frame_bytes=4096):
    """(the decoded message if the ingest accepted it, else None; the reason)."""
    rig = IngestRig(instruments=16, levels=MAX_LEVELS, max_levels=MAX_LEVELS, max_frame_bytes=max_frame_bytes)
    try:
        v = rig.classify([frame])
    finally:
        rig.close()
    return (IngressDecoder().decode(frame) if v.reason == Reason.NONE else None), v.reason


def _levels(n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.random((n, 4)) * 100 + 0.5).astype(np.float32)


@pytest.mark.parametrize("n", [1, 2, 7, MAX_LEVELS])
def test_quote_round_trip_keeps_levels_bit_exact(n):
    lv = _levels(n, seed=n)
    q = Quote(3, 17, 111, 222, n, pack_book(lv), priority=1)
    msg, reason = _check(encode(q))
    assert reason == Reason.NONE
    assert (msg.instrument, msg.seq, msg.ts_exchange_ns, msg.ts_send_ns, msg.priority) == (3, 17, 111, 222, 1)
    np.testing.assert_array_equal(book_array(msg).reshape(n, 4), lv)


def test_quote_book_is_a_view_of_the_receive_buffer():
    frame = bytearray(encode(Quote(1, 1, 0, 0, 1, pack_book(_levels(1)))))
    msg = IngressDecoder().decode(frame)
    assert isinstance(msg.book, memoryview)
    before = book_array(msg)[0]
    start = bytes(frame).index(bytes(msg.book))  # where the block sits in the frame
    frame[start:start + 4] = np.float32(42.0).tobytes()  # mutate the buffer: the view sees it
    assert book_array(msg)[0] == 42.0 != before


def test_optional_priority_defaults_to_minus_one():
    msg, reason = _check(msgspec.msgpack.encode([1, 2, 5, 0, 0, 1, pack_book(_levels(1))]))
    assert reason == Reason.NONE and msg.priority == -1


def test_zero_levels_is_bad_levels():
    assert _check(encode(Quote(1, 1, 0, 0, 0, b"")))[1] == Reason.BAD_LEVELS


def test_more_than_max_levels_is_bad_levels():
    n = MAX_LEVELS + 1
    assert _check(encode(Quote(1, 1, 0, 0, n, pack_book(_levels(n)))))[1] == Reason.BAD_LEVELS


def test_block_size_disagreeing_with_level_count_is_bad_levels():
    assert _check(encode(Quote(1, 1, 0, 0, 2, pack_book(_levels(1)))))[1] == Reason.BAD_LEVELS
    assert _check(encode(Quote(1, 1, 0, 0, 1, pack_book(_levels(1)) + b"\0")))[1] == Reason.BAD_LEVELS


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1.0, -0.0, -1e-30, 3e38])
@pytest.mark.parametrize("pos", [0, 1, 2, 3, 13])
def test_non_finite_or_negative_level_is_rejected(bad, pos):
    lv = _levels(4).reshape(-1)
    lv[pos] = bad
    assert _check(encode(Quote(1, 1, 0, 0, 4, lv.tobytes())))[1] == Reason.NON_FINITE


def test_zero_and_tiny_values_are_fine():
    lv = np.zeros((2, 4), np.float32)
    lv[1, 0] = 1e-38  # subnormal-ish but positive
    assert _check(encode(Quote(1, 1, 0, 0, 2, lv.tobytes())))[1] == Reason.NONE


def test_unknown_instrument():
    assert _check(encode(Quote(99, 1, 0, 0, 1, pack_book(_levels(1)))))[1] == Reason.UNKNOWN_INSTRUMENT
    assert _check(encode(Quote(-1, 1, 0, 0, 1, pack_book(_levels(1)))))[1] == Reason.UNKNOWN_INSTRUMENT


def test_negative_seq_and_bad_priority_are_bad_field():
    assert _check(encode(Quote(1, -5, 0, 0, 1, pack_book(_levels(1)))))[1] == Reason.BAD_FIELD
    assert _check(encode(Quote(1, 5, 0, 0, 1, pack_book(_levels(1)), priority=-2)))[1] == Reason.BAD_FIELD


@pytest.mark.parametrize("frame", [
    b"",  # empty
    b"\xc1",  # never-used msgpack byte
    b"hello world",  # not msgpack
    msgspec.msgpack.encode([99, 1, 2]),  # unknown tag
    msgspec.msgpack.encode(["x", 1, 2]),  # wrong tag type
    msgspec.msgpack.encode({"instrument": 1}),  # a map, not an array
    msgspec.msgpack.encode([1, 1, 1, 0, 0, 1, "0123456789abcdef"]),  # book as str
    msgspec.msgpack.encode([1, "1", 1, 0, 0, 1, b"0" * 16]),  # instrument as str
    msgspec.msgpack.encode([1, 1, 1, 0, 0]),  # too few fields
    msgspec.msgpack.encode([2, 1, 1, 0, 0, "px", 1.0, 1]),  # trade price as str
])
def test_undecodable_frames_are_decode_errors(frame):
    msg, reason = _check(frame)
    assert msg is None and reason == Reason.DECODE_ERROR


def test_truncated_frame_is_decode_error():
    frame = encode(Quote(1, 1, 0, 0, 2, pack_book(_levels(2))))
    for cut in (1, 5, len(frame) // 2, len(frame) - 1):
        assert _check(frame[:cut])[1] == Reason.DECODE_ERROR


def test_trailing_bytes_are_decode_error():
    frame = encode(Quote(1, 1, 0, 0, 1, pack_book(_levels(1))))
    assert _check(frame + b"\x00")[1] == Reason.DECODE_ERROR


def test_oversized_frame_is_rejected_before_decoding():
    frame = encode(Quote(1, 1, 0, 0, 10, pack_book(_levels(10))))
    assert _check(frame, max_frame_bytes=len(frame) - 1) == (None, Reason.OVERSIZED)


def test_trade_round_trip_and_validation():
    msg, reason = _check(encode(Trade(2, 9, 1, 2, 101.25, 3.0, -1)))
    assert reason == Reason.NONE and (msg.price, msg.size, msg.side) == (101.25, 3.0, -1)
    # integers are accepted for float fields (foreign clients)
    msg, reason = _check(msgspec.msgpack.encode([2, 2, 9, 1, 2, 101, 3, 1]))
    assert reason == Reason.NONE and msg.price == 101.0
    assert _check(encode(Trade(2, 9, 1, 2, math.nan, 3.0, 1)))[1] == Reason.NON_FINITE
    assert _check(encode(Trade(2, 9, 1, 2, 1.0, -3.0, 1)))[1] == Reason.NON_FINITE
    assert _check(encode(Trade(2, 9, 1, 2, 1.0, 3.0, 0)))[1] == Reason.BAD_FIELD
    assert _check(encode(Trade(77, 9, 1, 2, 1.0, 3.0, 1)))[1] == Reason.UNKNOWN_INSTRUMENT


def test_heartbeat_is_not_an_event():
    msg, reason = _check(encode(Heartbeat(123, "feed-a")))
    assert isinstance(msg, Heartbeat) and reason == Reason.NONE


def test_a_decision_on_the_feed_is_an_unexpected_kind():
    d = Decision(1, 2, 0, 0, 1, 0.5, 0, 1, 2, 3, "m")
    assert _check(encode(d))[1] == Reason.UNEXPECTED_KIND
    s = Status(1, 10, 5, 1, 2, 2, 0, 0, 0, [0, 1, 1])
    assert _check(encode(s))[1] == Reason.UNEXPECTED_KIND


def test_egress_round_trip_with_reusable_encoder():
    enc = ReusableEncoder(16)  # grows as needed
    dec = EgressDecoder()
    d = Decision(5, 77, 0, 0, -1, -0.75, 2, 10, 20, 30, "mlp_small@abc")
    assert dec.decode(bytes(enc.encode(d))) == d
    s = Status(1, 10, 5, 1, 2, 2, 0, 0, 0, [0, 1, 1], final=True, engine="eager")
    assert dec.decode(bytes(enc.encode(s))) == s
    assert dec.decode(bytes(enc.encode(d))) == d  # buffer reuse after a longer message


def test_topic_frames():
    assert topic_for(7) == b"\x00\x00\x00\x07"
    assert instrument_of_topic(topic_for(0xABCDEF01)) == 0xABCDEF01
    with pytest.raises(ValueError):
        instrument_of_topic(b"\x00\x07")


def test_message_tag_reads_fixarray_and_array16_headers():
    from hft_infer.transport.codec import message_tag
    from hft_infer.transport.schema import Heartbeat, Status

    status = encode(Status(0, 1, 2, 3, 4, 5, 6, 7, 8, [0] * len(Reason), final=True))
    assert status[0] == 0xDC and message_tag(status) == 17  # 19 fields: an array16 header
    assert message_tag(encode(Heartbeat(1, "x"))) == 3  # fixarray
    assert message_tag(encode(Quote(1, 1, 0, 0, 1, pack_book(_levels(1))))) == 1
    for junk in (b"", b"\x93", b"\xdc\x00", b"\xc1\x01", b"\x91\xcc"):
        assert message_tag(junk) == -1
