"""Codecs built once: typed decoders, reusable encoders, and input validation.

Validation is split from decoding so that the hot path can call it on the
already-decoded Struct and get a `Reason` back (0 = fine) without raising:
exceptions are reserved for input that is not our schema at all.
"""

from __future__ import annotations

import struct
import sys
from operator import attrgetter

import msgspec
import numpy as np

from .schema import (
    ALL_INSTRUMENTS,
    BATCH_TOPIC_ID,
    BYTES_PER_LEVEL,
    DECISION_BATCH_COLUMNS,
    EVENT_BATCH_COLUMNS,
    EVENT_BATCH_OPTIONAL_COLUMNS,
    NO_PRIORITY,
    SERVICE_TOPIC_ID,
    Decision,
    DecisionBatch,
    EgressMessage,
    EventBatch,
    IngressMessage,
    Kind,
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


_SHARD = struct.Struct(">HH")


def shard_batch_topic(index: int, count: int) -> bytes:
    """The topic of EventBatch frames for shard `index` of `count` (8 bytes: BATCH_TOPIC, then
    index and count as big-endian u16); BATCH_TOPIC itself for an unsharded service (count 1).

    A shard owns some instruments only (universe.owned_ids), so a batch of the whole feed would
    carry others' events, which it would reject; a publisher that knows the split sends each shard
    a batch of its own instruments under this topic. ZeroMQ matches subscriptions by prefix: a
    shard subscribes to its 8 bytes exactly, so it receives neither the other shards' batches nor
    the unsharded BATCH_TOPIC's; an unsharded service subscribes to the 4-byte BATCH_TOPIC, which
    is a prefix of every shard's topic, so it receives all of them (each holds its instruments)."""
    if count < 1 or not 0 <= index < count or count > 0xFFFF:
        raise ValueError(f"shard {index}/{count}: need 0 <= index < count <= 65535")
    return BATCH_TOPIC if count == 1 else BATCH_TOPIC + _SHARD.pack(index, count)


def reset_topic_ok(topic: bytes, instrument: int) -> bool:
    """Where a Reset of `instrument` (ALL_INSTRUMENTS: all) may come (README, Reset): on the service
    topic, which every shard receives (each applies what it serves), or on the topic of the one
    instrument it names. Elsewhere only the shard serving that topic would see it, so the ingest
    rejects it (TOPIC_MISMATCH) rather than apply it on part of a universe."""
    return topic == SERVICE_TOPIC or (instrument != ALL_INSTRUMENTS and int.from_bytes(topic, "big") == instrument)


def feed_topics(instrument_ids, batch_topic: bytes = BATCH_TOPIC) -> list[bytes]:
    """The topics a service subscribes to on a topic-framed feed: each of its instruments', the
    service topic (Heartbeat, Reset) and its batch topic (EventBatch: `shard_batch_topic`)."""
    return [topic_for(i) for i in instrument_ids] + [SERVICE_TOPIC, batch_topic]


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


def event_batch_shape_ok(batch: EventBatch) -> bool:
    """The columns' lengths match `n` and `n_levels` (n >= 1, n_levels >= 0, each column n values or,
    optional ones, empty; the trade columns all present or all empty), in plain Python: the checks
    of a frame, before its columns are read (event_batch_columns, merged_event_columns). Once per
    frame on the ingest's hot path: the lengths are read by one attrgetter and compared as tuples
    with those expected for `n`, cached (~1.9 against ~3.1 µs for a loop over the column table, dev
    VM); tests/unit/test_ingest_batch.py holds it to the column table's rule."""
    n, levels = batch.n, batch.n_levels
    if n < 1 or levels < 0 or len(batch.book) != n * levels * BYTES_PER_LEVEL:
        return False
    lens = tuple(map(len, _COLUMNS_OF(batch)))
    required, priority, trade, no_trade = _SHAPES.get(n) or _expected_lengths(n)
    p = lens[_N_REQUIRED]
    t = lens[_N_REQUIRED + 1:]
    return lens[:_N_REQUIRED] == required and (p == 0 or p == priority) and (t == trade or t == no_trade)


def _expected_lengths(n: int) -> tuple:
    """For a batch of n events: the required columns' byte lengths, priority's, the trade columns'
    (kind, price, size, side) when present, and when absent; cached for up to 4,096 sizes."""
    full = tuple(n * size for size in _COLUMN_SIZES)
    shape = (full[:_N_REQUIRED], full[_N_REQUIRED], full[_N_REQUIRED + 1:], (0,) * (len(full) - _N_REQUIRED - 1))
    if len(_SHAPES) < 4096:
        _SHAPES[n] = shape
    return shape


def merged_event_columns(batches: list[EventBatch]) -> dict[str, np.ndarray]:
    """The columns of consecutive well-shaped batches of one `n_levels` (event_batch_shape_ok), as
    if they were one batch: each column's bytes joined once, then one numpy view of it (a numpy
    call per batch and column cost more than the rest of a short batch's handling). Keys: as
    event_batch_columns; price, size and side are None when no batch holds a trade. Event kinds
    are not checked here (a kind above TRADE is the caller's to refuse)."""
    one = len(batches) == 1

    def joined(name: str, fill: bytes, size: int):
        parts = [getattr(b, name) for b in batches]
        if one:
            return parts[0]
        if all(map(len, parts)):
            return b"".join(parts)
        return b"".join(p if len(p) else fill * (b.n * size) for p, b in zip(parts, batches))

    cols = {name: np.frombuffer(joined(name, b"", 0), dtype=dt) for name, dt in EVENT_BATCH_COLUMNS}
    n = len(cols["seq"])
    if any(len(b.priority) for b in batches):
        cols["priority"] = np.frombuffer(joined("priority", b"\xff", 1), dtype="i1")
    else:
        cols["priority"] = np.full(n, NO_PRIORITY, dtype="i1")
    if any(len(b.kind) for b in batches):
        for name, dt in EVENT_BATCH_OPTIONAL_COLUMNS[1:]:
            cols[name] = np.frombuffer(joined(name, b"\x00", _ITEMSIZE[dt]), dtype=dt)
    else:
        cols["kind"] = np.zeros(n, dtype="u1")
        cols["price"] = cols["size"] = cols["side"] = None
    cols["book"] = np.frombuffer(joined("book", b"", 0), dtype="<f4").reshape(n, batches[0].n_levels * 4)
    return cols


def event_batch_columns(batch: EventBatch) -> dict[str, np.ndarray] | None:
    """The columns of an EventBatch as numpy views of the frame's bytes: instrument, seq,
    ts_exchange_ns, ts_send_ns, priority (int8, -1 each when empty), kind (uint8, 0 each when
    empty), price, size, side (None when `kind` is empty), book (float32, (n, n_levels * 4)).
    None when the frame is not our schema: its columns do not match `n` and `n_levels`
    (event_batch_shape_ok), or a kind is neither quote nor trade."""
    if not event_batch_shape_ok(batch):
        return None
    cols = merged_event_columns([batch])
    if cols["price"] is not None and cols["kind"].max() > _KIND_TRADE:
        return None
    return cols


_ITEMSIZE = {"<u4": 4, "<u8": 8, "<i8": 8, "<f8": 8, "i1": 1, "u1": 1}
_KIND_QUOTE, _KIND_TRADE = int(Kind.QUOTE), int(Kind.TRADE)
# event_batch_shape_ok: every column's length in one call, and the lengths expected per n
_COLUMNS_OF = attrgetter(*(name for name, _ in EVENT_BATCH_COLUMNS + EVENT_BATCH_OPTIONAL_COLUMNS))
_COLUMN_SIZES = tuple(_ITEMSIZE[dt] for _, dt in EVENT_BATCH_COLUMNS + EVENT_BATCH_OPTIONAL_COLUMNS)
_N_REQUIRED = len(EVENT_BATCH_COLUMNS)
_SHAPES: dict[int, tuple] = {}
# the shape rule reads the optional columns as priority, then the trade group
assert [name for name, _ in EVENT_BATCH_OPTIONAL_COLUMNS] == ["priority", "kind", "price", "size", "side"]


# EventBatch columns as Python lists, for the per-event path: memoryview.cast reads the packed
# values in C (~0.2 µs a column against ~0.6 µs for numpy.frombuffer + tolist on the dev VM); the
# wire is little-endian, so a big-endian host takes numpy's byte-swapping route instead.
_CAST = {"<u4": "I", "<u8": "Q", "<i8": "q", "<f8": "d", "i1": "b", "u1": "B"}
_LITTLE = sys.byteorder == "little"


def _column_list(raw, dt: str) -> list:
    if _LITTLE:
        return memoryview(raw).cast("B").cast(_CAST[dt]).tolist()
    return np.frombuffer(raw, dtype=dt).tolist()


def events_of_batch(batch: EventBatch) -> list[Quote | Trade] | None:
    """An EventBatch as the Quote and Trade messages it stands for, in order (the ingest's
    per-event path for short or irregular batches, captures, tests); None when its columns do
    not match (the rules of event_batch_columns, checked without numpy)."""
    if not event_batch_shape_ok(batch):
        return None
    n, levels = batch.n, batch.n_levels
    optional = {}
    for name, dt in EVENT_BATCH_OPTIONAL_COLUMNS:
        raw = getattr(batch, name)
        optional[name] = _column_list(raw, dt) if len(raw) else None
    trades = [optional["kind"] is not None]
    step = levels * BYTES_PER_LEVEL
    book = memoryview(batch.book)
    prios = optional["priority"] or [NO_PRIORITY] * n
    rows = zip(_column_list(batch.instrument, "<u4"), _column_list(batch.seq, "<u8"),
               _column_list(batch.ts_exchange_ns, "<i8"), _column_list(batch.ts_send_ns, "<i8"), prios)
    if not trades[0]:
        return [Quote(inst, seq, ts_x, ts_send, levels, book[i * step:(i + 1) * step], prio)
                for i, (inst, seq, ts_x, ts_send, prio) in enumerate(rows)]
    out: list[Quote | Trade] = []
    for i, (inst, seq, ts_x, ts_send, prio), kind, price, size, side in zip(
            range(n), rows, optional["kind"], optional["price"], optional["size"], optional["side"]):
        if kind == _KIND_QUOTE:
            out.append(Quote(inst, seq, ts_x, ts_send, levels, book[i * step:(i + 1) * step], prio))
        elif kind == _KIND_TRADE:
            out.append(Trade(inst, seq, ts_x, ts_send, price, size, side, prio))
        else:
            return None
    return out


def event_batch(instrument, seq, ts_exchange_ns, ts_send_ns, books, priority=None, *, kind=None, price=None,
                size=None, side=None) -> EventBatch:
    """Build an EventBatch from per-event sequences or arrays (books: shape (n, n_levels, 4) or
    (n, n_levels * 4), float32-convertible, a trade's row ignored; priority: None for "the config
    decides"; kind (Kind per event) with price, size and side for a batch that holds trades)."""
    books = np.ascontiguousarray(books, dtype="<f4")
    n = books.shape[0]
    books = books.reshape(n, -1)
    if books.shape[1] % 4:
        raise ValueError(f"a book row holds 4 floats per level, got {books.shape[1]}")
    cols = [np.ascontiguousarray(v, dtype=dt) for v, (_, dt) in
            zip((instrument, seq, ts_exchange_ns, ts_send_ns), EVENT_BATCH_COLUMNS)]
    optional = [None if v is None else np.ascontiguousarray(v, dtype=dt)
                for v, (_, dt) in zip((priority, kind, price, size, side), EVENT_BATCH_OPTIONAL_COLUMNS)]
    if any(c.shape != (n,) for c in cols + [c for c in optional if c is not None]):
        raise ValueError(f"every column needs {n} values (one per book row)")
    if (kind is None) != (price is None) or (kind is None) != (size is None) or (kind is None) != (side is None):
        raise ValueError("kind, price, size and side go together (a batch with trades)")
    return EventBatch(n, books.shape[1] // 4, *(c.tobytes() for c in cols), books.tobytes(),
                      *(b"" if c is None else c.tobytes() for c in optional))


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
    "shard_batch_topic",
    "Decision",
    "DecisionBatch",
    "EgressDecoder",
    "IngressDecoder",
    "ReusableEncoder",
    "SERVICE_TOPIC",
    "EventBatch",
    "Status",
    "book_array",
    "decision_batch_columns",
    "decisions_of_batch",
    "encode",
    "feed_topics",
    "merged_event_columns",
    "instrument_of_topic",
    "message_tag",
    "pack_book",
    "event_batch",
    "event_batch_columns",
    "event_batch_shape_ok",
    "events_of_batch",
    "topic_for",
    "validate_quote",
    "validate_trade",
]
