"""Wire schema: every message that crosses a ZeroMQ socket.

msgpack via msgspec. Each message is a msgpack *array* whose first element is
a small integer tag, followed by the fields in declaration order
(``array_like=True``): ``[1, instrument, seq, ts_exchange_ns, ...]``. Trailing
fields that have defaults may be omitted by the sender. README.md documents
every field with byte-level notes so that clients in any language can speak
this without reading our code; keep the two in step.

The order-book levels of a ``Quote`` travel as one msgpack ``bin`` holding
packed little-endian float32 values, four per level in the order
``bid_px, bid_size, ask_px, ask_size``. The service decodes that field as a
``memoryview`` into the receive buffer and reads it with ``numpy.frombuffer``:
no Python float is ever made per level.
"""

from __future__ import annotations

import enum

import msgspec

# Tags are part of the wire format: never renumber.
TAG_QUOTE = 1
TAG_TRADE = 2
TAG_HEARTBEAT = 3
TAG_RESET = 4
TAG_EVENT_BATCH = 5
TAG_DECISION = 16
TAG_STATUS = 17
TAG_DECISION_BATCH = 18

# Floats per book level in the packed block, and bytes per level.
FIELDS_PER_LEVEL = 4
BYTES_PER_LEVEL = FIELDS_PER_LEVEL * 4

# Topic frames are 4-byte big-endian instrument ids, so a SUB prefix filter
# on them is an exact match. Service-level messages (Status; on the feed,
# Heartbeat and a Reset of every instrument) use SERVICE_TOPIC_ID;
# DecisionBatch frames use BATCH_TOPIC_ID. Instrument ids are therefore
# 0..MAX_INSTRUMENT_ID.
SERVICE_TOPIC_ID = 0xFFFFFFFF
BATCH_TOPIC_ID = 0xFFFFFFFE
MAX_INSTRUMENT_ID = 0xFFFFFFFD
ALL_INSTRUMENTS = SERVICE_TOPIC_ID  # Reset.instrument: every instrument
NO_PRIORITY = -1


class Kind(enum.IntEnum):
    """Message kinds that are model events (used for per-kind priority)."""

    QUOTE = 0
    TRADE = 1


class Outcome(enum.IntEnum):
    """What happened to an event. Every received event ends in exactly one."""

    DECIDED = 0
    SHED = 1  # too old when its turn came (max_age_us), or queue overflow
    REJECTED = 2  # bad input; `reason` says why
    CONFLATED = 3  # superseded by a newer event of the same instrument (never sent)


class Reason(enum.IntEnum):
    """Why an event was rejected or shed. Stable numbers: they are on the wire."""

    NONE = 0
    DECODE_ERROR = 1  # not msgpack, wrong field types, wrong tag, truncated, trailing bytes
    OVERSIZED = 2  # frame larger than ingest.max_frame_bytes
    BAD_LEVELS = 3  # n_levels outside 1..max_levels, or block size != 16 * n_levels
    NON_FINITE = 4  # NaN/inf, or a negative price/size, in the book or trade fields
    UNKNOWN_INSTRUMENT = 5  # instrument id not in the configured universe
    TOPIC_MISMATCH = 6  # topic frame names another instrument than the message
    UNEXPECTED_KIND = 7  # a decodable message that is not an event (e.g. a Decision)
    BAD_FRAMING = 8  # wrong number of frames for the configured topic framing
    STALE = 9  # shed: older than scheduler.max_age_us when picked
    QUEUE_FULL = 10  # shed: no free request slot (scheduler.capacity)
    BAD_FIELD = 11  # a field outside its range (negative seq, side not +-1, bad priority, ts_send_ns)
    OUT_OF_ORDER = 12  # seq not above the instrument's last one (duplicate or late), and not a restart at 0
    ENGINE_FAILURE = 13  # shed: the model engine failed (the service then stops, non-zero)
    LATE = 14  # shed at ingest, stateful models under scheduler.admission = "deadline": past max_age_us when
    # received, or would be by its turn (its age plus its queue's expected wait); not applied to the model's state


SHED_REASONS = frozenset({Reason.STALE, Reason.QUEUE_FULL, Reason.ENGINE_FAILURE, Reason.LATE})
"""The reasons of events shed (answered status SHED: the service could not decide them in time or
at all), as against rejected as bad input (every other reason but NONE)."""


class Quote(msgspec.Struct, tag=TAG_QUOTE, array_like=True, frozen=True, gc=False):
    instrument: int  # uint32 instrument id
    seq: int  # per-instrument sequence number, increasing by 1 (gaps are counted)
    ts_exchange_ns: int  # exchange timestamp, ns (any epoch; carried through)
    ts_send_ns: int  # publisher's send time, CLOCK_REALTIME ns since the Unix epoch
    n_levels: int  # number of book levels in `book`
    book: memoryview  # bin: n_levels * 16 bytes, little-endian float32
    priority: int = NO_PRIORITY  # optional scheduling class; -1 = use config


class Trade(msgspec.Struct, tag=TAG_TRADE, array_like=True, frozen=True, gc=False):
    instrument: int
    seq: int
    ts_exchange_ns: int
    ts_send_ns: int
    price: float  # float64 on the wire (msgpack float 64 or 32 both accepted)
    size: float
    side: int  # aggressor: +1 buyer, -1 seller
    priority: int = NO_PRIORITY


class Heartbeat(msgspec.Struct, tag=TAG_HEARTBEAT, array_like=True, frozen=True, gc=False):
    """Publisher liveness; not a model event and not counted as one."""

    ts_send_ns: int
    source: str = ""


class Reset(msgspec.Struct, tag=TAG_RESET, array_like=True, frozen=True, gc=False):
    """Clear per-instrument state (feature window, model state, held position, sequence
    tracking) so that what follows is decided as if the service had just started: a
    replay starts from a clean state. Applied in feed order: events before it are
    decided on the old state. Not a model event (counted as `resets`)."""

    ts_send_ns: int
    instrument: int = ALL_INSTRUMENTS  # one instrument id, or ALL_INSTRUMENTS


class EventBatch(msgspec.Struct, tag=TAG_EVENT_BATCH, array_like=True, frozen=True, gc=False):
    """`n` events (quotes, and trades where `kind` says so) in one frame, columnar: the same
    events as `n` Quote / Trade frames sent in this order, row i of every column being event i,
    for a publisher that has several events to send at once (a feed handler catching up, a
    replay past ~50k events/s). Each column is a msgpack bin of `n` packed little-endian values
    (EVENT_BATCH_COLUMNS); `book` is the `n` rows' level blocks back to back (n * n_levels * 16
    bytes; a trade's row is ignored: send zeros). The optional columns are empty or `n` values:
    `priority` empty = -1 for every event (the config decides); `kind` empty = every event is a
    quote, and then `price`, `size`, `side` are empty too, else all three hold `n` values (a
    quote's ignored). On a topic-framed socket the topic frame is BATCH_TOPIC_ID; each event is
    checked, sequenced, counted and answered as if it had come alone under its instrument's
    topic (an instrument outside the service's universe, e.g. another shard's, is rejected
    UNKNOWN_INSTRUMENT: publish one batch per shard). A frame whose columns do not match `n`
    and `n_levels` is one DECODE_ERROR."""

    n: int  # events in the batch (>= 1)
    n_levels: int  # levels of every quote's book
    # bins, decoded as memoryviews into the receive buffer (no copy), as Quote.book
    instrument: memoryview  # uint32 LE
    seq: memoryview  # uint64 LE
    ts_exchange_ns: memoryview  # int64 LE
    ts_send_ns: memoryview  # int64 LE, publisher's send time (CLOCK_REALTIME ns; 0 = not given)
    book: memoryview  # n * n_levels * 4 little-endian float32: bid_px, bid_size, ask_px, ask_size per level
    priority: memoryview = memoryview(b"")  # empty, or n int8: scheduling class (-1 = use config)
    kind: memoryview = memoryview(b"")  # empty (all quotes), or n uint8: Kind (0 quote, 1 trade)
    price: memoryview = memoryview(b"")  # with kind: n float64, a trade's price
    size: memoryview = memoryview(b"")  # with kind: n float64, a trade's size
    side: memoryview = memoryview(b"")  # with kind: n int8, a trade's aggressor (+1 buyer, -1 seller)


EVENT_BATCH_COLUMNS = (
    ("instrument", "<u4"),
    ("seq", "<u8"),
    ("ts_exchange_ns", "<i8"),
    ("ts_send_ns", "<i8"),
)
"""Column name and numpy dtype of the EventBatch columns every batch fills (book apart)."""

EVENT_BATCH_OPTIONAL_COLUMNS = (
    ("priority", "i1"),
    ("kind", "u1"),
    ("price", "<f8"),
    ("size", "<f8"),
    ("side", "i1"),
)
"""Column name and numpy dtype of the optional EventBatch columns (empty, or n values)."""


class Decision(msgspec.Struct, tag=TAG_DECISION, array_like=True, frozen=True, gc=False):
    instrument: int
    seq: int  # sequence number of the event that triggered (or was shed/rejected)
    status: int  # Outcome: 0 decided, 1 shed, 2 rejected
    reason: int  # Reason (0 when decided)
    action: int  # -1 sell, 0 flat, +1 buy (0 unless decided)
    score: float  # model output (0.0 unless decided)
    n_conflated: int  # earlier events of this instrument superseded by this trigger
    ts_send_ns: int  # the event's ts_send_ns, echoed (0 when unknown)
    ts_recv_ns: int  # service receive time, CLOCK_REALTIME ns
    ts_decision_ns: int  # time the decision was encoded, CLOCK_REALTIME ns
    model_version: str = ""


class Status(msgspec.Struct, tag=TAG_STATUS, array_like=True, frozen=True, gc=False):
    """Service counters, sent on the decision socket every `egress.status_interval_ms` and at exit.

    `received = decided + shed + conflated + rejected + pending` at any time,
    with `pending` counted from the scheduler's live requests (independently of
    the outcome counters); `pending` is 0 in the final Status (`final = True`).
    Fields after `model_version` were added later: old clients ignore them.
    """

    ts_ns: int
    received: int
    decided: int
    shed: int
    conflated: int
    rejected: int
    pending: int
    egress_dropped: int
    seq_gaps: int
    rejected_by_reason: list[int]  # indexed by Reason (shed reasons too)
    final: bool = False
    engine: str = ""
    model_version: str = ""
    seq_missing: int = 0  # events missing in the gaps (seq_gaps counts the gaps); saturates at 2**63-1
    resets: int = 0  # Reset messages applied
    ingest_disconnects: int = 0  # feed connections lost (and re-established) by the ingest socket
    error: str = ""  # in the final Status of a service that stops on a fatal error: what failed
    precision: str = ""  # the engine's product precision ("fp32", "tf32", "bf16"; "" from a null service)


class DecisionBatch(msgspec.Struct, tag=TAG_DECISION_BATCH, array_like=True, frozen=True, gc=False):
    """The answers of one loop iteration (a model step's decisions, and any shed or
    rejected answers) in one frame, columnar: each column is a msgpack bin of `n`
    packed little-endian values (dtypes in DECISION_BATCH_COLUMNS). Topic
    BATCH_TOPIC_ID. Row i of every column is one answer, as a Decision would carry it;
    `ts_decision_ns` is shared by the batch."""

    ts_decision_ns: int  # CLOCK_REALTIME ns when the batch was encoded
    model_version: str
    n: int  # answers in this batch
    instrument: bytes  # uint32 LE
    seq: bytes  # uint64 LE
    status: bytes  # uint8: Outcome (0 decided, 1 shed, 2 rejected)
    reason: bytes  # uint8: Reason (0 when decided)
    action: bytes  # int8: -1, 0, +1
    score: bytes  # float32 LE
    n_conflated: bytes  # uint32 LE (saturates at 2**32-1)
    ts_send_ns: bytes  # int64 LE, the event's ts_send_ns echoed
    ts_recv_ns: bytes  # int64 LE, CLOCK_REALTIME ns when the service received the event


DECISION_BATCH_COLUMNS = (
    ("instrument", "<u4"),
    ("seq", "<u8"),
    ("status", "u1"),
    ("reason", "u1"),
    ("action", "i1"),
    ("score", "<f4"),
    ("n_conflated", "<u4"),
    ("ts_send_ns", "<i8"),
    ("ts_recv_ns", "<i8"),
)
"""Column name and numpy dtype of every DecisionBatch column, in wire order."""


IngressMessage = Quote | Trade | Heartbeat | Reset | EventBatch
EgressMessage = Decision | Status | DecisionBatch
