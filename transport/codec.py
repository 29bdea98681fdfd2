"""Codecs built once: typed decoders, reusable encoders, and input validation.

Validation is split from decoding so that the hot path can call it on the
already-decoded Struct and get a `Reason` back (0 = fine) without raising:
exceptions are reserved for input that is not our schema at all.
"""

from __future__ import annotations

import struct

import msgspec
import numpy as np

from .schema import (
    BATCH_TOPIC_ID,
    BYTES_PER_LEVEL,
    DECISION_BATCH_COLUMNS,
    NO_PRIORITY,
    SERVICE_TOPIC_ID,
    Decision,
    DecisionBatch,
    EgressMessage,
    IngressMessage,
    Quote,
    Reason,
    Status,
    Trade,
)


# The most significant byte of a little-endian float32 (every 4th byte of the
# block) holds the sign bit and the top 7 exponent bits. It is < 0x7F exactly
# for non-negative values below 2**127; NaN, +-inf, every negative number
# (and -0.0) and absurdly large values have it >= 0x7F. The block is checked
# as one big integer: with M80 / M7F / M01 the masks of 0x80 / 0x7F / 0x01 in
# every 4th byte, a high byte is bad iff its bit 7 is set, or its low 7 bits
# are all ones -- which adding 0x01 carries into bit 7 (never across bytes).
# Five big-int operations on 160 bytes (~1.0 us on the dev VM) against ~2.3 us
# for a strided memoryview copy + bytes.translate and ~2.4 us for a numpy
# reduction (tools/bench_wire.py).
def _high_byte_masks(levels: int) -> tuple[int, int, int]:
    floats = levels * 4
    return (int.from_bytes(b"\x00\x00\x00\x80" * floats, "little"),
            int.from_bytes(b"\x00\x00\x00\x7f" * floats, "little"),
            int.from_bytes(b"\x00\x00\x00\x01" * floats, "little"))


_MASKS = [_high_byte_masks(n) for n in range(257)]  # by n_levels (ingest.max_levels <= 256)
_from_bytes = int.from_bytes


_TOPIC = struct.Struct(">I")


def topic_for(instrument: int) -> bytes:
    """The 4-byte big-endian topic frame of an instrument id."""
    return _TOPIC.pack(instrument)


SERVICE_TOPIC = topic_for(SERVICE_TOPIC_ID)
BATCH_TOPIC = topic_for(BATCH_TOPIC_ID)


def decision_batch_columns(batch: DecisionBatch) -> dict[str, np.ndarray]:
    """The columns of a DecisionBatch as numpy arrays (views of the frame's bytes)."""
    return {name: np.frombuffer(getattr(batch, name), dtype=dt, count=batch.n)
            for name, dt in DECISION_BATCH_COLUMNS}


def decisions_of_batch(batch: DecisionBatch) -> list[Decision]:
    """A DecisionBatch as the Decision messages it stands for (tests, clients, cold paths)."""
    cols = decision_batch_columns(batch)
    rows = zip(*(cols[name].tolist() for name, _ in DECISION_BATCH_COLUMNS))
    return [Decision(inst, seq, status, reason, action, score, nconf, ts_send, ts_recv, batch.ts_decision_ns,
                     batch.model_version)
            for inst, seq, status, reason, action, score, nconf, ts_send, ts_recv in rows]


def instrument_of_topic(topic) -> int:
    """Inverse of `topic_for`; raises ValueError for a frame of the wrong size."""
    if len(topic) != 4:
        raise ValueError(f"topic frame must be 4 bytes, got {len(topic)}")
    return _TOPIC.unpack(topic)[0]


def book_array(quote: Quote) -> np.ndarray:
    """The quote's levels as a float32 view of the receive buffer, shape (n_levels*4,)."""
    return np.frombuffer(quote.book, dtype="<f4")


def pack_book(levels: np.ndarray) -> bytes:
    """Pack an (n_levels, 4) array of bid_px, bid_size, ask_px, ask_size as the wire block."""
    return np.ascontiguousarray(levels, dtype="<f4").tobytes()


TS_LIMIT = 1 << 63  # ts_send_ns must fit int64 (stage arithmetic, DecisionBatch's int64 column)
FLOAT_LIMIT = 2.0 ** 127  # the same bound the book check enforces on float32 values


def validate_quote(quote: Quote, max_levels: int) -> Reason:
    """Structural and numeric checks of a decoded quote; Reason.NONE if it is usable.

    The ingest's hot path inlines these checks for the common shape (n_levels
    equal to the model's levels); tests/unit/test_ingest_properties.py drives
    the real ingest and checks it agrees with this function."""
    n = quote.n_levels
    if n < 1 or n > max_levels or len(quote.book) != n * BYTES_PER_LEVEL:
        return Reason.BAD_LEVELS
    if quote.seq < 0 or quote.priority < NO_PRIORITY or not 0 <= quote.ts_send_ns < TS_LIMIT:
        return Reason.BAD_FIELD
    m80, m7f, m01 = _MASKS[n]
    x = _from_bytes(quote.book, "little")
    if x & m80 or ((x & m7f) + m01) & m80:
        return Reason.NON_FINITE
    return Reason.NONE


def validate_trade(trade: Trade) -> Reason:
    """Checks of a decoded trade: price and size finite, >= 0 and below 2**127 (so that the
    float32 feature row holds them); side +-1; seq, priority and ts_send_ns in range."""
    if not (0.0 <= trade.price < FLOAT_LIMIT and 0.0 <= trade.size < FLOAT_LIMIT):  # NaN fails too
        return Reason.NON_FINITE
    if (trade.side not in (1, -1) or trade.seq < 0 or trade.priority < NO_PRIORITY
            or not 0 <= trade.ts_send_ns < TS_LIMIT):
        return Reason.BAD_FIELD
    return Reason.NONE


class IngressDecoder:
    """Decodes one ingress frame (Quote | Trade | Heartbeat | Reset).

    `decode` raises `msgspec.DecodeError` (a ValidationError is a subclass) for
    anything that is not our schema: not msgpack, wrong tag, wrong field
    types or count, truncated, trailing bytes. The caller counts that as
    Reason.DECODE_ERROR.
    """

    __slots__ = ("_decoder", "decode")

    def __init__(self) -> None:
        self._decoder = msgspec.msgpack.Decoder(IngressMessage)
        self.decode = self._decoder.decode


class EgressDecoder:
    """Decodes decision-socket frames (Decision | Status), for clients and tests."""

    __slots__ = ("_decoder", "decode")

    def __init__(self) -> None:
        self._decoder = msgspec.msgpack.Decoder(EgressMessage)
        self.decode = self._decoder.decode


class ReusableEncoder:
    """msgspec encoder that writes into one buffer, reused for every message.

    The returned bytearray is the reused buffer itself (msgspec truncates it
    to the message): send it before encoding the next message. zmq copies it
    into its own message with copy=True, which for small frames is cheaper
    than zero-copy (measured in tools/bench_wire.py).
    """

    __slots__ = ("_encoder", "_buf")

    def __init__(self, initial_bytes: int = 512) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._buf = bytearray(initial_bytes)

    def encode(self, msg) -> bytearray:
        self._encoder.encode_into(msg, self._buf)
        return self._buf


def encode(msg) -> bytes:
    """One-off encoding (tests, tools, cold paths)."""
    return msgspec.msgpack.encode(msg)


def message_tag(payload) -> int:
    """The tag of an encoded message without decoding it: the first element of its msgpack
    array (a fixarray up to 15 fields, an array16 above: Status has 19), -1 if the frame does
    not start that way. For sorting frames cheaply (collectors look for Status frames)."""
    if not payload:
        return -1
    head = payload[0]
    at = 1 if 0x90 <= head <= 0x9F else 3 if head == 0xDC else 5 if head == 0xDD else 0
    if not at or len(payload) <= at:
        return -1
    tag = payload[at]
    return tag if tag < 0x80 else -1  # every tag is a positive fixint


__all__ = [
    "BATCH_TOPIC",
    "Decision",
    "DecisionBatch",
    "EgressDecoder",
    "IngressDecoder",
    "ReusableEncoder",
    "SERVICE_TOPIC",
    "Status",
    "book_array",
    "decision_batch_columns",
    "decisions_of_batch",
    "encode",
    "instrument_of_topic",
    "message_tag",
    "pack_book",
    "topic_for",
    "validate_quote",
    "validate_trade",
]
