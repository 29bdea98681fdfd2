"""Answers out: decisions, shed and rejected answers, and Status, without ever blocking.

Everything the loop answers in one iteration (a step's decisions, events shed
or rejected at ingest, requests shed at pick time) is collected in
`Answers`, columnar (one Python list per field: cheap appends and bulk
extends), and `Egress.flush` sends it once per iteration:

- `mode = "batch"`: ONE `DecisionBatch` frame (topic ff ff ff fe), its
  msgpack framing and all nine columns packed by one cached `struct.Struct`
  per batch size (one C call; byte for byte what msgspec would write). Per
  decision this costs a few list operations instead of a msgpack encode and
  two sends.
- `mode = "per_instrument"`: one `Decision` frame per answer on the
  instrument's topic, for subscribers that filter by instrument.

The socket is an XPUB with XPUB_NODROP (transport/sockets.py says why): a
send that meets a full subscriber pipe raises zmq.Again, which is counted in
`dropped` (per frame) and never waited on. Over iceoryx2 (`ShmEgress`) the publisher
discards a frame for a subscriber whose buffer is full, which is counted the same way.
"""

from __future__ import annotations

import struct

import msgspec
import zmq

from hft_infer.transport.codec import BATCH_TOPIC, SERVICE_TOPIC, ReusableEncoder, topic_for
from hft_infer.transport.schema import DECISION_BATCH_COLUMNS, Decision, DecisionBatch, Outcome, Status

_MORE_NOBLOCK = int(zmq.SNDMORE) | int(zmq.NOBLOCK)  # plain ints: enum flags cost an enum per send
_NOBLOCK = int(zmq.NOBLOCK)
_SHED = int(Outcome.SHED)
_U32_MAX = (1 << 32) - 1
# struct codes of DECISION_BATCH_COLUMNS, in wire order
_CODES = {"<u4": "I", "<u8": "Q", "u1": "B", "i1": "b", "<f4": "f", "<i8": "q"}
_COLUMN_CODES = tuple(_CODES[dt] for _, dt in DECISION_BATCH_COLUMNS)
assert [name for name, _ in DECISION_BATCH_COLUMNS] == ["instrument", "seq", "status", "reason", "action", "score",
                                                        "n_conflated", "ts_send_ns", "ts_recv_ns"]


def _bin_header(size: int) -> bytes:
    """msgpack's bin header for `size` bytes (bin 8 / 16 / 32)."""
    if size < 1 << 8:
        return bytes((0xC4, size))
    if size < 1 << 16:
        return b"\xc5" + size.to_bytes(2, "big")
    return b"\xc6" + size.to_bytes(4, "big")


_TS_PROBE = 1 << 62  # an epoch in ns takes msgpack's uint 64 form (0xcf + 8 bytes, big-endian) until 2554


def _frame_template(n: int, model_version: str) -> tuple[struct.Struct, bytes, bytes, list[bytes]]:
    """The whole DecisionBatch frame of n answers as ONE struct, and its constant parts: the msgpack
    bytes msgspec writes before ts_decision_ns (array header, tag, 0xcf), those between it and the
    first column (model_version, n), and each column's bin header, all packed as `s` fields; the
    timestamp as an `8s` field (msgpack's integers are big-endian), the columns' values with the
    struct's own codes. `Egress.batch_bytes` packs it in one call: building a DecisionBatch of its
    columns and encoding it with msgspec cost 3.9 against 2.3 µs per flush of one answer on the dev
    VM (tests/unit/test_egress_frame.py holds the bytes equal to msgspec's)."""
    empty = msgspec.msgpack.encode(DecisionBatch(_TS_PROBE, model_version, n, *([b""] * 9)))
    ts_at = empty.index(b"\xcf" + _TS_PROBE.to_bytes(8, "big")) + 1
    before_ts, after_ts = empty[:ts_at], empty[ts_at + 8: len(empty) - 2 * 9]  # less the nine empty bins
    heads = [_bin_header(n * struct.calcsize(code)) for code in _COLUMN_CODES]
    fmt = f"<{len(before_ts)}s8s{len(after_ts)}s" + "".join(f"{len(h)}s{n}{c}" for h, c in zip(heads, _COLUMN_CODES))
    return struct.Struct(fmt), before_ts, after_ts, heads


class Answers:
    """Answers waiting for the next flush, one list per DecisionBatch column."""

    __slots__ = ("inst", "seq", "status", "reason", "action", "score", "nconf", "ts_send", "ts_recv")

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, [])

    def __len__(self) -> int:
        return len(self.inst)

    def add(self, inst: int, seq: int, status: int, reason: int, action: int, score: float, nconf: int,
            ts_send: int, ts_recv: int) -> None:
        """One answer (cold paths: rejects, sheds)."""
        self.inst.append(inst)
        self.seq.append(seq)
        self.status.append(status)
        self.reason.append(reason)
        self.action.append(action)
        self.score.append(score)
        self.nconf.append(nconf)
        self.ts_send.append(ts_send)
        self.ts_recv.append(ts_recv)

    def add_shed(self, inst: list[int], seq: list[int], reason: int, nconf: list[int] | None, ts_send: list[int],
                 ts_recv: list[int]) -> None:
        """Shed answers of one reason as columns (equal-length lists; nconf None: none conflated).
        Under overload most answers are sheds: a list extend per column costs ~10x less per
        answer than `add`."""
        n = len(inst)
        self.inst.extend(inst)
        self.seq.extend(seq)
        self.status.extend([_SHED] * n)
        self.reason.extend([reason] * n)
        self.action.extend([0] * n)
        self.score.extend([0.0] * n)
        self.nconf.extend([0] * n if nconf is None else nconf)
        self.ts_send.extend(ts_send)
        self.ts_recv.extend(ts_recv)

    def columns(self) -> tuple[list, ...]:
        return (self.inst, self.seq, self.status, self.reason, self.action, self.score, self.nconf,
                self.ts_send, self.ts_recv)

    def clear(self) -> None:
        for col in self.columns():
            col.clear()


class Egress:
    def __init__(self, sock: zmq.Socket, instrument_ids: list[int], *, mode: str, topic_frame: bool,
                 model_version: str) -> None:
        if mode not in ("batch", "per_instrument"):
            raise ValueError(f"egress mode must be batch or per_instrument, not {mode!r}")
        self.sock = sock
        self.mode = mode
        self.topic_frame = topic_frame
        self.model_version = model_version
        self._topics = {i: topic_for(i) for i in instrument_ids}
        self._encoder = ReusableEncoder()
        self._frames: dict[int, tuple[struct.Struct, bytes, bytes, list[bytes]]] = {}
        self.answers = Answers()
        self.sent = 0  # frames sent
        self.dropped = 0  # frames not sent (a subscriber's pipe was full)

    # ------------------------------------------------------------ answers

    def flush(self, ts_decision_ns: int) -> int:
        """Send what has been answered since the last flush; returns the number of answers."""
        a = self.answers
        n = len(a.inst)
        if n == 0:
            return 0
        if self.mode == "batch":
            self._send(BATCH_TOPIC, self.batch_bytes(ts_decision_ns))
        else:
            self._send_each(ts_decision_ns)
        a.clear()
        return n

    def batch_bytes(self, ts_decision_ns: int) -> bytes:
        """The pending answers as the bytes of one DecisionBatch frame (does not clear them): one
        cached struct per batch size packs the msgpack framing and all nine columns at once
        (_frame_template). Cold cases (a timestamp outside the uint 64 form, four billion
        conflations) go through msgspec."""
        cols = self.answers.columns()
        n = len(cols[0])
        if not _U32_MAX < ts_decision_ns < 1 << 64 or (n and max(cols[6]) > _U32_MAX):
            return bytes(self._encoder.encode(self.batch_frame(ts_decision_ns)))
        frame = self._frames.get(n)
        if frame is None:
            frame = _frame_template(n, self.model_version)
            if len(self._frames) < 4096:  # sizes seen (a flush of sheds can be large): bounded
                self._frames[n] = frame
        st, before_ts, after_ts, heads = frame
        values = [before_ts, ts_decision_ns.to_bytes(8, "big"), after_ts]
        for head, col in zip(heads, cols):
            values.append(head)
            values += col
        return st.pack(*values)

    def batch_frame(self, ts_decision_ns: int) -> DecisionBatch:
        """The pending answers as one DecisionBatch (does not clear them), n_conflated saturated at
        uint32: what `batch_bytes` encodes through msgspec in its cold cases, and the reference
        its packed bytes are tested against. One struct call per column."""
        cols = self.answers.columns()
        n = len(cols[0])
        nconf = cols[6]
        if nconf and max(nconf) > _U32_MAX:  # cold: four billion conflations
            cols = (*cols[:6], [min(x, _U32_MAX) for x in nconf], *cols[7:])
        return DecisionBatch(ts_decision_ns, self.model_version, n,
                             *(struct.pack(f"<{n}{code}", *col) for code, col in zip(_COLUMN_CODES, cols)))

    def _send_each(self, ts_decision_ns: int) -> None:
        a = self.answers
        topics = self._topics
        enc = self._encoder.encode
        mv = self.model_version
        for inst, seq, status, reason, action, score, nconf, ts_send, ts_recv in zip(*a.columns()):
            topic = topics.get(inst)
            if topic is None:
                topic = topic_for(inst)
            self._send(topic, enc(Decision(inst, seq, status, reason, action, score, nconf, ts_send, ts_recv,
                                           ts_decision_ns, mv)))

    # ------------------------------------------------------------ status and frames

    def send_status(self, status: Status) -> bool:
        return self._send(SERVICE_TOPIC, self._encoder.encode(status))

    def _send(self, topic: bytes, payload) -> bool:
        sock = self.sock
        try:
            if self.topic_frame:
                sock.send(topic, _MORE_NOBLOCK)
            sock.send(payload, _NOBLOCK)
        except zmq.Again:
            self.dropped += 1
            return False
        self.sent += 1
        return True


class ShmEgress(Egress):
    """Egress over iceoryx2 (transport/shm.py): one sample per frame, no topic frame. The
    publisher discards a frame for a subscriber whose buffer is full (never waits); such a
    frame is counted in `dropped`, as a full ZeroMQ pipe is."""

    def __init__(self, sock, instrument_ids: list[int], *, mode: str, topic_frame: bool = False,
                 model_version: str) -> None:
        super().__init__(sock, instrument_ids, mode=mode, topic_frame=False, model_version=model_version)
        self._shm_send = sock.send

    def _send(self, topic: bytes, payload) -> bool:
        if self._shm_send(payload):
            self.sent += 1
            return True
        self.dropped += 1
        return False
