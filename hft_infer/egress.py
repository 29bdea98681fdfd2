"""Answers out: decisions, shed and rejected answers, and Status, without ever blocking.

Everything the loop answers in one iteration (a step's decisions, events shed
or rejected at ingest, requests shed at pick time) is collected in
`Answers`, columnar, in each field's wire type: whole columns that come as
numpy arrays kept as blocks until the flush, answers that come one at a time
or as lists in one `array.array` per field. `Egress.flush` sends it once per
iteration:

- `mode = "batch"`: ONE `DecisionBatch` frame (topic ff ff ff fe). The
  columns are buffers of the wire's own types (little-endian hosts), so the
  frame is one `bytes.join` of the cached msgpack framing and the nine
  columns' buffers, byte for byte what msgspec would write. Values are
  converted as they go in, not at flush (one struct call over 64 answers
  cost ~16 µs on the dev VM, the join ~1.5), and a large step's columns go
  in as the arrays its gather made (a block: no copy into ours; BENCHMARKS.md
  wave 40).
- `mode = "per_instrument"`: one `Decision` frame per answer on the
  instrument's topic, for subscribers that filter by instrument.

The socket is an XPUB with XPUB_NODROP (transport/sockets.py says why): a
send that meets a full subscriber pipe raises zmq.Again, which is counted in
`dropped` (per frame) and never waited on. Over iceoryx2 (`ShmEgress`) the publisher
discards a frame for a subscriber whose buffer is full, which is counted the same way.
"""

from __future__ import annotations

import array
import struct
import sys

import msgspec
import numpy as np
import zmq

from hft_infer.transport.codec import BATCH_TOPIC, SERVICE_TOPIC, ReusableEncoder, topic_for
from hft_infer.transport.schema import DECISION_BATCH_COLUMNS, Decision, DecisionBatch, Outcome, Status

_MORE_NOBLOCK = int(zmq.SNDMORE) | int(zmq.NOBLOCK)  # plain ints: enum flags cost an enum per send
_NOBLOCK = int(zmq.NOBLOCK)
# pyzmq's own send, under its Python `Socket.send` (which only adds the options we never pass:
# routing ids, tracking, zero-copy above copy_threshold): ~0.35 µs less per frame on the dev VM
_raw_send = zmq.backend.Socket.send
_SHED_BYTE, _DECIDED_BYTE = bytes((int(Outcome.SHED),)), bytes((int(Outcome.DECIDED),))
_U32_MAX = (1 << 32) - 1
_U32 = np.dtype(np.uint32)
_NO_COLUMNS = (b"",) * 9
# array/struct codes of DECISION_BATCH_COLUMNS, in wire order; the arrays hold native values, which
# are the wire's on a little-endian host (batch_bytes encodes through msgspec elsewhere)
_CODES = {"<u4": "I", "<u8": "Q", "u1": "B", "i1": "b", "<f4": "f", "<i8": "q"}
_COLUMN_CODES = tuple(_CODES[dt] for _, dt in DECISION_BATCH_COLUMNS)
_LITTLE_ENDIAN = sys.byteorder == "little"
# each column's native numpy type, by numpy's own char (its singleton: an int64 array's dtype is
# np.dtype("l") on Linux, not np.dtype("q")), and the same-sized integer twin a block may hand in as
# it is (_wire_buffer: int64 for uint64, ...); identity tells them
_NUMPY_TYPES = {_CODES[dt]: np.dtype(np.dtype(dt).newbyteorder("=").char) for _, dt in DECISION_BATCH_COLUMNS}
_TWIN_DTYPES = {c: np.dtype(t.char.swapcase()) if t.kind in "iu" else t for c, t in _NUMPY_TYPES.items()}
assert all(array.array(c).itemsize == struct.calcsize(f"<{c}") for c in _COLUMN_CODES), "array item sizes"
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


def _frame_template(n: int, model_version: str) -> tuple[bytes, bytes, tuple[bytes, ...]]:
    """The constant parts of a DecisionBatch frame of n answers: the msgpack bytes msgspec writes
    before ts_decision_ns (array header, tag, 0xcf), those between it and the first column
    (model_version, n), and each column's bin header. `Egress.batch_bytes` joins them with the
    timestamp (msgpack's integers are big-endian) and the columns' buffers
    (tests/unit/test_egress_frame.py holds the bytes equal to msgspec's)."""
    empty = msgspec.msgpack.encode(DecisionBatch(_TS_PROBE, model_version, n, *([b""] * 9)))
    ts_at = empty.index(b"\xcf" + _TS_PROBE.to_bytes(8, "big")) + 1
    before_ts, after_ts = empty[:ts_at], empty[ts_at + 8: len(empty) - 2 * 9]  # less the nine empty bins
    heads = tuple(_bin_header(n * array.array(code).itemsize) for code in _COLUMN_CODES)
    return before_ts, after_ts, heads


def _fill(col: array.array, values) -> None:
    """Append values to an answer column: a list in one pass (`fromlist`, ~2x faster than `extend`
    of a tuple, which grows the array item by item; a value out of the column's range raises and
    appends nothing), a numpy array as its bytes in the column's type (no Python object per value;
    its values must be in range: the ingest's checks bound every field an answer echoes)."""
    if type(values) is list:
        col.fromlist(values)
    elif type(values) is np.ndarray:
        col.frombytes(values.astype(_NUMPY_TYPES[col.typecode], copy=False).tobytes())
    else:
        col.fromlist(list(values))


def _wire_buffer(values, code: str):
    """A block's column (Answers): `values` as a C-contiguous buffer of the column's wire bytes. An
    integer numpy array of the wire's type, or of its same-sized twin (an int64 of non-negative
    values is the uint64's bytes: the request table's), is taken as it is; any other array is
    converted (a new array); a list or tuple goes through array.array (a value out of range
    raises). The dtype is checked by identity (numpy's native dtypes are singletons)."""
    if type(values) is np.ndarray:
        dt = values.dtype
        if (dt is _NUMPY_TYPES[code] or dt is _TWIN_DTYPES[code]) and values.flags.c_contiguous:
            return values
        return values.astype(_NUMPY_TYPES[code])
    if type(values) is bytes:
        return values
    return array.array(code, values)


def _as_bytes(buf) -> memoryview:
    """A contiguous buffer (bytes, array, numpy array) as bytes: array.frombytes takes byte-sized
    items only (a numpy array of wider items raises "a bytes-like object is required")."""
    return memoryview(buf).cast("B")


def _saturated_nconf(nconf: np.ndarray) -> np.ndarray:
    """n_conflated as the wire's uint32, saturated (numpy would wrap a value past uint32, not raise);
    a uint32 array is taken as it is (the stepper's: the scheduler saturates as it counts)."""
    if nconf.dtype is _U32:
        return nconf
    return np.minimum(nconf, _U32_MAX).astype(_U32)


class Answers:
    """Answers waiting for the next flush, in the DecisionBatch columns' wire types, in the order
    they were added, held two ways:

    - blocks: whole columns that come as numpy arrays (a large step's decisions, a column run's
      sheds), kept as the caller's arrays until the flush joins their buffers into the frame:
      no copy into a column of ours, no Python object per answer. In the loop each numpy call
      costs ~1-2 µs on the dev VM, so a block is built with as few as the data allows. An array
      given to Answers must not be written by its caller until the flush (add_decided copies the
      engine's output buffers, which the next step reuses).
    - one `array.array` per column (the `__slots__` fields) for answers added one at a time (`add`:
      cold paths, a step of one) or as lists and tuples. A block added after such answers
      seals them into a block first, so the order holds.

    n_conflated saturates at uint32 as it goes in. `columns()` gathers everything into the
    arrays (tests, per-instrument egress, msgspec's reference encoding); `wire_columns()` is what
    the batch frame joins."""

    __slots__ = ("inst", "seq", "status", "reason", "action", "score", "nconf", "ts_send", "ts_recv",
                 "_blocks", "_in_blocks")

    def __init__(self) -> None:
        self._new_arrays()
        self._blocks: list[tuple] = []
        self._in_blocks = 0  # answers held in blocks

    def _new_arrays(self) -> None:
        for name, code in zip(self.__slots__, _COLUMN_CODES):
            setattr(self, name, array.array(code))

    def __len__(self) -> int:
        return len(self.inst) + self._in_blocks

    def add(self, inst: int, seq: int, status: int, reason: int, action: int, score: float, nconf: int,
            ts_send: int, ts_recv: int) -> None:
        """One answer (cold paths: rejects, sheds)."""
        self.inst.append(inst)
        self.seq.append(seq)
        self.status.append(status)
        self.reason.append(reason)
        self.action.append(action)
        self.score.append(score)
        self.nconf.append(nconf if nconf <= _U32_MAX else _U32_MAX)
        self.ts_send.append(ts_send)
        self.ts_recv.append(ts_recv)

    def add_shed(self, inst, seq, reason: int, nconf, ts_send, ts_recv) -> None:
        """Shed answers of one reason as columns: equal-length lists, or integer numpy arrays (a
        column run's sheds: a block); nconf None: none conflated. Under overload most answers
        are sheds: a column at a time costs ~10x less per answer than `add`."""
        n = len(inst)
        self._add_outcomes(inst, seq, _SHED_BYTE * n, bytes((reason,)) * n, bytes(n), bytes(4 * n),  # 0.0 as f32
                           bytes(4 * n) if nconf is None else nconf, ts_send, ts_recv)

    def add_decided(self, inst, seq, nconf, ts_send, ts_recv, scores: np.ndarray,
                    actions: np.ndarray) -> None:
        """A step's decisions: inst, seq, nconf, ts_send and ts_recv lists or tuples (a small
        step's), or numpy arrays (a large step's, gathered from the scheduler's request table: a
        block); scores and actions the engine's numpy outputs, copied in the wire's types (no
        Python float or int per decision)."""
        n = len(inst)
        self._add_outcomes(inst, seq, _DECIDED_BYTE * n, bytes(n), actions.astype(np.int8),
                           scores.astype(np.float32), nconf, ts_send, ts_recv)

    def _add_outcomes(self, inst, seq, status: bytes, reason: bytes, action, score, nconf, ts_send,
                      ts_recv) -> None:
        """`add_shed` and `add_decided`: numpy inst: a block; else into the arrays, the outcome
        columns as their wire bytes, the others as `_fill` takes them. n_conflated is saturated
        either way (bytes: all zero)."""
        if type(inst) is np.ndarray:
            if len(self.inst):
                self._seal_arrays()
            if type(nconf) is np.ndarray:
                nconf = _saturated_nconf(nconf)
            c = _COLUMN_CODES
            self._blocks.append((_wire_buffer(inst, c[0]), _wire_buffer(seq, c[1]), status, reason, action, score,
                                 _wire_buffer(nconf, c[6]), _wire_buffer(ts_send, c[7]),
                                 _wire_buffer(ts_recv, c[8])))
            self._in_blocks += len(inst)
            return
        _fill(self.inst, inst)
        _fill(self.seq, seq)
        self.status.frombytes(status)
        self.reason.frombytes(reason)
        self.action.frombytes(_as_bytes(action))
        self.score.frombytes(_as_bytes(score))
        if type(nconf) is bytes:
            self.nconf.frombytes(nconf)
        else:
            self.extend_nconf(nconf)
        _fill(self.ts_send, ts_send)
        _fill(self.ts_recv, ts_recv)

    def _seal_arrays(self) -> None:
        """The answers in the arrays become a block (before a block added after them), new arrays."""
        self._blocks.append(self._arrays())
        self._in_blocks += len(self.inst)
        self._new_arrays()

    def add_columns(self, inst, seq, status, reason, action, score, nconf, ts_send, ts_recv) -> None:
        """Answers given column by column, as lists or tuples of equal length (a step with stale
        rows, whose answers mix decisions and sheds)."""
        for col, values in ((self.inst, inst), (self.seq, seq), (self.status, status), (self.reason, reason),
                            (self.action, action), (self.score, score), (self.ts_send, ts_send),
                            (self.ts_recv, ts_recv)):
            _fill(col, values)
        self.extend_nconf(nconf)

    def extend_nconf(self, values) -> None:
        """n_conflated values, saturated at uint32 (the wire's type)."""
        if type(values) is np.ndarray:  # numpy would wrap a value past uint32, not raise
            values = np.minimum(values, _U32_MAX)
        try:
            _fill(self.nconf, values)  # all or none on error
        except OverflowError:  # cold: four billion conflations into one request
            self.nconf.fromlist([v if v <= _U32_MAX else _U32_MAX for v in values])

    def _arrays(self) -> tuple[array.array, ...]:
        return (self.inst, self.seq, self.status, self.reason, self.action, self.score, self.nconf,
                self.ts_send, self.ts_recv)

    def wire_columns(self) -> tuple:
        """Every pending answer's columns as buffers of their wire bytes, in order (the batch
        frame's columns): the arrays alone, or one block alone, as they are; else each column's
        parts joined."""
        if not self._blocks:
            return self._arrays()
        if not len(self.inst) and len(self._blocks) == 1:
            return self._blocks[0]
        parts = self._blocks + [self._arrays()] if len(self.inst) else self._blocks
        return tuple(b"".join(col) for col in zip(*parts))

    def columns(self) -> tuple[array.array, ...]:
        """Every pending answer, one array per column (of Python values): the blocks moved into the
        arrays first (cold: tests, per-instrument egress, msgspec's reference encoding)."""
        if self._blocks:
            if len(self.inst):
                self._seal_arrays()
            blocks = self._blocks
            self._new_arrays()
            for col, parts in zip(self._arrays(), zip(*blocks)):
                for part in parts:
                    col.frombytes(_as_bytes(part))
            self._blocks = []
            self._in_blocks = 0
        return self._arrays()

    def clear(self) -> None:
        if self._blocks:
            self._blocks.clear()
            self._in_blocks = 0
        if len(self.inst):
            for col in self._arrays():
                del col[:]


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
        # DecisionBatch frames' parts by size: framing bytes and the answers' columns (batch_bytes)
        self._frames: dict[int, list] = {}
        self.answers = Answers()
        self.sent = 0  # frames sent
        self.dropped = 0  # frames not sent (a subscriber's pipe was full)

    # ------------------------------------------------------------ answers

    def flush(self, ts_decision_ns: int) -> int:
        """Send what has been answered since the last flush; returns the number of answers."""
        a = self.answers
        n = len(a)
        if n == 0:
            return 0
        if self.mode == "batch":
            self._send(BATCH_TOPIC, self.batch_bytes(ts_decision_ns))
        else:
            self._send_each(ts_decision_ns)
        a.clear()
        return n

    def batch_bytes(self, ts_decision_ns: int) -> bytes:
        """The pending answers as the bytes of one DecisionBatch frame (does not clear them): the
        framing of this batch size (_frame_template), cached per size, and the columns' buffers
        (Answers.wire_columns), joined with the timestamp. A
        timestamp outside msgpack's uint 64 form, or a big-endian host, goes through msgspec."""
        n = len(self.answers)
        if not _U32_MAX < ts_decision_ns < 1 << 64 or not _LITTLE_ENDIAN:
            return bytes(self._encoder.encode(self.batch_frame(ts_decision_ns)))
        parts = self._frames.get(n)
        if parts is None:  # the frame's parts, the columns' places (every other one from the 5th) filled at each use
            before_ts, after_ts, heads = _frame_template(n, self.model_version)
            parts = [before_ts, b"", after_ts]
            for head in heads:
                parts += (head, b"")
            if len(self._frames) < 4096:  # sizes seen (a flush of sheds can be large): bounded
                self._frames[n] = parts
        parts[1] = ts_decision_ns.to_bytes(8, "big")
        parts[4::2] = self.answers.wire_columns()
        frame = b"".join(parts)
        parts[4::2] = _NO_COLUMNS  # the cached parts keep no frame's columns (up to 4096 sizes' worth of arrays)
        return frame

    def batch_frame(self, ts_decision_ns: int) -> DecisionBatch:
        """The pending answers as one DecisionBatch (does not clear them): what `batch_bytes`
        encodes through msgspec in its cold cases, and the reference its joined bytes are tested
        against. One struct call per column, little-endian whatever the host."""
        cols = self.answers.columns()
        n = len(cols[0])
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
                _raw_send(sock, topic, _MORE_NOBLOCK)
            _raw_send(sock, payload, _NOBLOCK)
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
