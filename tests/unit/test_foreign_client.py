"""A client written from README.md alone, with the `msgpack` package (not msgspec).

If this fails, either the README or the schema changed without the other.
"""

from __future__ import annotations

import struct

import msgpack

from hft_infer.transport.codec import EgressDecoder, IngressDecoder, ReusableEncoder, book_array
from hft_infer.transport.schema import Decision, Quote, Status, Trade


def readme_quote(instrument, seq, ts_exchange_ns, ts_send_ns, levels, priority=None):
    """As the README says: array [1, instrument, seq, ts_ex, ts_send, n_levels, bin(book), priority?];
    book = per level bid_px, bid_size, ask_px, ask_size as little-endian float32."""
    book = b"".join(struct.pack("<4f", *lvl) for lvl in levels)
    fields = [1, instrument, seq, ts_exchange_ns, ts_send_ns, len(levels), book]
    if priority is not None:
        fields.append(priority)
    return msgpack.packb(fields, use_bin_type=True)


def test_readme_example_bytes():
    frame = readme_quote(7, 42, 0, 0, [(100.0, 10.0, 100.55, 5.0)])
    assert frame.hex(" ") == ("97 01 07 2a 00 00 01 c4 10 00 00 c8 42 00 00 20 41 "
                              "9a 19 c9 42 00 00 a0 40")


def test_msgpack_quote_decodes():
    levels = [(100.0, 10.0, 100.5, 5.0), (99.5, 20.0, 101.0, 7.5), (99.0, 1.0, 101.5, 2.0)]
    frame = readme_quote(11, 123456, 1_700_000_000_000_000_000, 1_700_000_000_000_000_500, levels, priority=0)
    msg = IngressDecoder().decode(frame)
    assert isinstance(msg, Quote)
    assert (msg.instrument, msg.seq, msg.n_levels, msg.priority) == (11, 123456, 3, 0)
    assert msg.ts_exchange_ns == 1_700_000_000_000_000_000
    assert book_array(msg).reshape(3, 4).tolist() == [list(lv) for lv in levels]


def test_msgpack_trade_with_float32_and_int_encodings():
    frame = msgpack.packb([2, 3, 9, 0, 0, 101.25, 4, -1], use_bin_type=True, use_single_float=True)
    msg = IngressDecoder().decode(frame)
    assert isinstance(msg, Trade) and (msg.price, msg.size, msg.side) == (101.25, 4.0, -1)


def test_msgpack_client_reads_decisions_and_status():
    enc = ReusableEncoder()
    d = Decision(11, 123456, 0, 0, 1, 0.5, 3, 10, 20, 30, "m@1")
    fields = msgpack.unpackb(bytes(enc.encode(d)))
    assert fields == [16, 11, 123456, 0, 0, 1, 0.5, 3, 10, 20, 30, "m@1"]
    s = Status(5, 100, 90, 4, 3, 3, 0, 1, 2, [0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0], True, "eager", "m@1")
    f = msgpack.unpackb(bytes(enc.encode(s)))
    assert f[0] == 17 and f[2:10] == [100, 90, 4, 3, 3, 0, 1, 2] and f[11] is True
    assert EgressDecoder().decode(msgpack.packb(f)) == s


def readme_decision_batch_columns(frame: bytes) -> list[dict]:
    """As the README says: [18, ts_decision_ns, model_version, n, then 9 bin columns of n packed
    little-endian values: instrument u32, seq u64, status u8, reason u8, action i8, score f32,
    n_conflated u32, ts_send_ns i64, ts_recv_ns i64]."""
    f = msgpack.unpackb(frame, raw=False)
    assert f[0] == 18
    n = f[3]
    formats = ("I", "Q", "B", "B", "b", "f", "I", "q", "q")
    names = ("instrument", "seq", "status", "reason", "action", "score", "n_conflated", "ts_send_ns", "ts_recv_ns")
    cols = [struct.unpack(f"<{n}{fmt}", col) for fmt, col in zip(formats, f[4:13])]
    return [dict(zip(names, row), ts_decision_ns=f[1], model_version=f[2]) for row in zip(*cols)]


def test_readme_decision_batch_example_bytes():
    from hft_infer.transport.codec import decisions_of_batch
    from hft_infer.transport.schema import DecisionBatch

    hexbytes = ("9d 12 00 a1 6d 01 c4 04 07 00 00 00 c4 08 2a 00 00 00 00 00 00 00 c4 01 00 c4 01 00 "
                "c4 01 01 c4 04 00 00 00 3f c4 04 00 00 00 00 c4 08 00 00 00 00 00 00 00 00 "
                "c4 08 00 00 00 00 00 00 00 00")
    frame = bytes.fromhex(hexbytes.replace(" ", ""))
    assert len(frame) == 63
    rows = readme_decision_batch_columns(frame)
    assert rows == [dict(instrument=7, seq=42, status=0, reason=0, action=1, score=0.5, n_conflated=0,
                         ts_send_ns=0, ts_recv_ns=0, ts_decision_ns=0, model_version="m")]
    batch = EgressDecoder().decode(frame)
    assert isinstance(batch, DecisionBatch)
    (d,) = decisions_of_batch(batch)
    assert (d.instrument, d.seq, d.action, d.score) == (7, 42, 1, 0.5)
