"""The ingest: drain a burst of frames, validate, write feature rows, queue requests.

`Ingest.drain(max_frames)` reads until the socket is empty (`zmq.Again`, one
exception per burst) or `max_frames` frames were read, and handles each frame
inline with hoisted locals: no per-event attribute chains, method calls or
allocations on the fast path, which is a Quote or Trade of the model's shape
whose instrument is known, fresh and next in sequence. Everything else takes
a cold branch that says why (`_reject`, `_framing`, `_sequence`, ...).

Per frame (topic framing on):

    recv topic (4 bytes; else: a message without a topic frame -> BAD_FRAMING)
    recv payload as a zmq.Frame, whose .more recv read in C (a third frame ->
        BAD_FRAMING, drained); getsockopt(RCVMORE) costs ~1.3 µs in pyzmq 27 (it
        builds a SocketOption enum per call), the Frame ~0.5 µs (tools/bench_hotpath.py)
    decode (msgspec, typed; the book stays a memoryview into the frame)
    checks (the inlined `codec.validate_quote/trade`), topic == instrument's topic
    sequence: next -> fast; a gap is counted and accepted; 0 after more is a
        publisher restart; anything else not above the last is OUT_OF_ORDER
    deadline origin: the publisher's ts_send_ns if present, else receive time;
        an event already older than scheduler.max_age_us is *stale*
    conflating models: write the row (the window needs it); a stale event is
        shed STALE at once (nothing queued), a fresh one queued or conflated
    sequential models: queue first (no room -> QUEUE_FULL, row NOT written, so
        the model's state never has a hole it does not know about), then write
        the row; a stale event is queued as apply-only (decision withheld)

Framing costs one RCVMORE flag read per message (after the payload), and stays
exact: a lone frame that is not 4 bytes, a lone 4-byte frame with nothing
behind it (recv raises Again), and a lone 4-byte frame followed by a message
(the "payload" is then a 4-byte frame with more behind it: that message's
topic) are each one BAD_FRAMING, and the message after it is read normally;
a third frame makes a message BAD_FRAMING and is drained. The one ambiguity
left: a lone 4-byte frame followed by another lone 4-byte frame reads as one
[topic, payload] message.

Cost is measured per burst (the `ingest` stage: mean receive->queued time of
the burst's events, one sample per burst) and in tools/bench_hotpath.py.
"""

from __future__ import annotations

import msgspec
import zmq

from hft_infer.clock import perf_ns
from hft_infer.scheduler import NO_REQUEST
from hft_infer.transport.codec import (
    FLOAT_LIMIT,
    TS_LIMIT,
    IngressDecoder,
    _high_byte_masks,
    topic_for,
    validate_quote,
    validate_trade,
)
from hft_infer.transport.schema import (
    ALL_INSTRUMENTS,
    BYTES_PER_LEVEL,
    MAX_INSTRUMENT_ID,
    TAG_DECISION,
    TAG_DECISION_BATCH,
    TAG_QUOTE,
    TAG_STATUS,
    TAG_TRADE,
    Heartbeat,
    Kind,
    Outcome,
    Quote,
    Reason,
    Reset,
    Trade,
)

# plain ints: enum flags build an enum per use
_NOBLOCK, _RCVMORE, _EVENTS, _POLLIN = int(zmq.NOBLOCK), int(zmq.RCVMORE), int(zmq.EVENTS), int(zmq.POLLIN)
KIND_QUOTE, KIND_TRADE = int(Kind.QUOTE), int(Kind.TRADE)
SHED, REJECTED = int(Outcome.SHED), int(Outcome.REJECTED)
STALE, QUEUE_FULL = int(Reason.STALE), int(Reason.QUEUE_FULL)
_U64_LIMIT = 1 << 64
_peek = msgspec.msgpack.Decoder().decode  # untyped: names the instrument/seq of a frame that failed


class Ingest:
    """Owns the ingest socket's drain loop; writes into the feature store and the scheduler it
    is given and answers through `answers` (egress.Answers)."""

    def __init__(self, sock: zmq.Socket, *, instrument_ids: list[int], store, sched, acct, answers, clock,
                 topic_frame: bool, max_frame_bytes: int, max_levels: int, model_levels: int, max_age_us: int,
                 class_by_slot_kind: list[list[int]], honour_message_priority: bool, classes: int,
                 publish_shed: bool, publish_rejected: bool, on_reset) -> None:
        self.sock = sock
        self.ids = instrument_ids
        self.slot_of = {iid: s for s, iid in enumerate(instrument_ids)}
        self.topics = [topic_for(i) for i in instrument_ids]
        self.store = store
        self.sched = sched
        self.acct = acct
        self.answers = answers
        self.clock = clock
        self.topic_frame = topic_frame
        self.max_frame_bytes = max_frame_bytes
        self.max_levels = max_levels
        self.levels = model_levels
        self.max_age_ns = max_age_us * 1000
        self.class_q, self.class_t = class_by_slot_kind[KIND_QUOTE], class_by_slot_kind[KIND_TRADE]
        self.honour_priority = honour_message_priority
        self.max_class = classes - 1
        self.publish_shed = publish_shed
        self.publish_rejected = publish_rejected
        self.on_reset = on_reset  # callback(slots): the service finishes pending work, then resets them
        self.last_seq = [-1] * len(instrument_ids)
        self._decode = IngressDecoder().decode
        self._masks = _high_byte_masks(model_levels)
        self.burst_ns = 0  # receive -> queued time of the last burst, per event (the `ingest` stage)

    # ------------------------------------------------------------------ hot path

    def drain(self, max_frames: int) -> int:
        """Read and handle up to `max_frames` frames; returns how many were read."""
        sock = self.sock
        recv, get = sock.recv, sock.get
        decode = self._decode
        slot_of_get = self.slot_of.get
        topics = self.topics
        topic_frame = self.topic_frame
        max_frame = self.max_frame_bytes
        levels = self.levels
        book_bytes = levels * BYTES_PER_LEVEL
        m80, m7f, m01 = self._masks
        from_bytes = int.from_bytes
        store = self.store
        count = store.count
        write_quote, write_trade = store.write_quote, store.write_trade
        sched = self.sched
        push = sched.push
        sequential = sched.sequential
        last_seq = self.last_seq
        max_age = self.max_age_ns
        class_q, class_t = self.class_q, self.class_t
        # Readiness: an EVENTS check costs a fraction of the zmq.Again exception a recv on an
        # empty socket raises (tools/bench_hotpath.py), so an idle loop checks first, and so
        # does each of the first messages of a burst; a longer burst reads until Again.
        if not get(_EVENTS) & _POLLIN:
            return 0
        offset = self.clock.sync()  # epoch = mono + offset; re-read once per burst (clock.py says why)
        events = 0
        n = 0
        t_first = 0
        while n < max_frames:
            if 0 < n < 3 and not get(_EVENTS) & _POLLIN:
                break
            try:
                # a topic frame as bytes (compared with the instrument's topic); without topic
                # framing the payload as a Frame, whose .more needs no getsockopt
                first = recv(_NOBLOCK, topic_frame)
            except zmq.Again:
                break
            t_recv = perf_ns()
            if n == 0:
                t_first = t_recv
            n += 1
            if topic_frame:
                if len(first) != 4:
                    events += self._framing(first, None, t_recv, offset)
                    continue
                try:
                    payload = recv(_NOBLOCK, False)  # a Frame: .more was read by recv, in C
                except zmq.Again:  # the 4-byte frame was a whole message
                    events += self._framing(first, None, t_recv, offset)
                    continue
                if payload.more:
                    if len(payload) != 4:  # a third frame: the message is malformed (drained)
                        events += self._framing(first, payload, t_recv, offset)
                        continue
                    # `first` was a whole 4-byte message and `payload` is the next one's topic
                    events += self._framing(first, None, t_recv, offset)
                    first = payload.bytes
                    payload = recv(_NOBLOCK, False)  # libzmq delivers a message's frames together
                    if payload.more:
                        events += self._framing(first, payload, t_recv, offset)
                        continue
            else:
                payload = first  # a Frame (read with copy=False, below)
                first = None  # no topic frame to check
                if payload.more:
                    events += self._framing(None, payload, t_recv, offset)
                    continue
            events += 1
            if len(payload) > max_frame:
                self._reject(Reason.OVERSIZED, None, None, t_recv, offset)
                continue
            try:
                msg = decode(payload)
            except Exception:  # noqa: BLE001 - msgspec.DecodeError / ValidationError: not our schema
                events -= self._undecodable(payload, t_recv, offset)
                continue
            typ = type(msg)
            if typ is Quote:
                slot = slot_of_get(msg.instrument, -1)
                book = msg.book
                seq = msg.seq
                ts_send = msg.ts_send_ns
                prio = msg.priority
                if (slot < 0 or msg.n_levels != levels or len(book) != book_bytes or seq < 0 or prio < -1
                        or not 0 <= ts_send < TS_LIMIT or (first is not None and first != topics[slot])):
                    if not self._quote_slow(msg, slot, first, t_recv, offset):
                        continue
                else:
                    x = from_bytes(book, "little")
                    if x & m80 or ((x & m7f) + m01) & m80:
                        self._reject(Reason.NON_FINITE, msg.instrument, seq, t_recv, offset, ts_send)
                        continue
                cls = class_q[slot] if prio < 0 else self._class(prio, slot, class_q)
                kind_quote = True
            elif typ is Trade:
                slot = slot_of_get(msg.instrument, -1)
                seq = msg.seq
                ts_send = msg.ts_send_ns
                prio = msg.priority
                price, size, side = msg.price, msg.size, msg.side
                if (slot < 0 or not (0.0 <= price < FLOAT_LIMIT and 0.0 <= size < FLOAT_LIMIT)
                        or (side != 1 and side != -1) or seq < 0 or prio < -1 or not 0 <= ts_send < TS_LIMIT
                        or (first is not None and first != topics[slot])):
                    self._trade_slow(msg, slot, first, t_recv, offset)
                    continue
                cls = class_t[slot] if prio < 0 else self._class(prio, slot, class_t)
                kind_quote = False
            else:
                events -= self._not_an_event(msg, typ, t_recv, offset)
                continue
            last = last_seq[slot]
            if seq != last + 1 and last >= 0 and not self._sequence(slot, seq, last, t_recv, offset, ts_send):
                continue
            last_seq[slot] = seq
            # deadline origin (perf_counter_ns): the publisher's send time when it gave one
            if ts_send:
                origin = ts_send - offset
                if origin > t_recv:  # a publisher clock ahead of ours: count from receipt
                    origin = t_recv
            else:
                origin = t_recv
            stale = t_recv - origin > max_age
            pos = count[slot]
            if sequential:
                if push(slot, pos, seq, cls, t_recv, origin, ts_send, stale) == NO_REQUEST:
                    self._shed(QUEUE_FULL, slot, seq, ts_send, t_recv, offset)  # received, not applied
                    continue
                if kind_quote:
                    write_quote(slot, book, levels)
                else:
                    write_trade(slot, price, size * side)
            else:
                if kind_quote:
                    write_quote(slot, book, levels)
                else:
                    write_trade(slot, price, size * side)
                if stale:
                    self._shed(STALE, slot, seq, ts_send, t_recv, offset)
                elif push(slot, pos, seq, cls, t_recv, origin, ts_send) == NO_REQUEST:
                    self._shed(QUEUE_FULL, slot, seq, ts_send, t_recv, offset)
        if n:
            self.acct.received += events
            self.burst_ns = (perf_ns() - t_first) // n
        return n

    def _class(self, prio: int, slot: int, table: list[int]) -> int:
        if not self.honour_priority:
            return table[slot]
        return prio if prio <= self.max_class else self.max_class

    # ------------------------------------------------------------------ cold paths

    def _quote_slow(self, msg: Quote, slot: int, topic, t_recv: int, offset: int) -> bool:
        """A quote off the fast path's shape: the general checks; True if it is usable."""
        reason = validate_quote(msg, self.max_levels)
        if not reason:
            if slot < 0:
                reason = Reason.UNKNOWN_INSTRUMENT
            elif topic is not None and topic != self.topics[slot]:
                reason = Reason.TOPIC_MISMATCH
        if reason:
            self._reject(reason, msg.instrument, msg.seq, t_recv, offset, msg.ts_send_ns)
            return False
        if msg.n_levels != self.levels:  # fewer levels (zero-filled) or more (cut): the store handles both
            self._event_other_levels(msg, slot, t_recv, offset)
            return False
        return True

    def _event_other_levels(self, msg: Quote, slot: int, t_recv: int, offset: int) -> None:
        """A valid quote with another number of levels than the model's (rare: a generic path)."""
        last = self.last_seq[slot]
        if msg.seq != last + 1 and last >= 0 and not self._sequence(slot, msg.seq, last, t_recv, offset,
                                                                     msg.ts_send_ns):
            return
        self.last_seq[slot] = msg.seq
        self._queue_and_write(slot, msg, t_recv, offset,
                              lambda: self.store.write_quote(slot, msg.book, msg.n_levels), KIND_QUOTE)

    def _trade_slow(self, msg: Trade, slot: int, topic, t_recv: int, offset: int) -> None:
        reason = validate_trade(msg)
        if not reason:
            if slot < 0:
                reason = Reason.UNKNOWN_INSTRUMENT
            elif topic is not None and topic != self.topics[slot]:
                reason = Reason.TOPIC_MISMATCH
            else:  # unreachable: the fast path's checks are validate_trade's
                raise AssertionError(f"trade passed validate_trade but not the fast path: {msg!r}")
        self._reject(reason, msg.instrument, msg.seq, t_recv, offset, msg.ts_send_ns)

    def _queue_and_write(self, slot: int, msg, t_recv: int, offset: int, write, kind: int) -> None:
        ts_send = msg.ts_send_ns
        origin = min(ts_send - offset, t_recv) if ts_send else t_recv
        stale = t_recv - origin > self.max_age_ns
        prio = msg.priority
        table = self.class_q if kind == KIND_QUOTE else self.class_t
        cls = table[slot] if prio < 0 else self._class(prio, slot, table)
        pos = self.store.count[slot]
        sched = self.sched
        if sched.sequential:
            if sched.push(slot, pos, msg.seq, cls, t_recv, origin, ts_send, stale) == NO_REQUEST:
                self._shed(QUEUE_FULL, slot, msg.seq, ts_send, t_recv, offset)
                return
            write()
            return
        write()
        if stale:
            self._shed(STALE, slot, msg.seq, ts_send, t_recv, offset)
        elif sched.push(slot, pos, msg.seq, cls, t_recv, origin, ts_send) == NO_REQUEST:
            self._shed(QUEUE_FULL, slot, msg.seq, ts_send, t_recv, offset)

    def _sequence(self, slot: int, seq: int, last: int, t_recv: int, offset: int, ts_send: int) -> bool:
        """seq is not last + 1: count what it is; True if the event is accepted."""
        acct = self.acct
        if seq > last:
            acct.gap(seq - last - 1)
            return True
        if seq == 0:  # the publisher restarted: follow the new sequence
            acct.seq_resets += 1
            return True
        self._reject(Reason.OUT_OF_ORDER, self.ids[slot], seq, t_recv, offset, ts_send)
        return False

    def _shed(self, reason: int, slot: int, seq: int, ts_send: int, t_recv: int, offset: int) -> None:
        self.acct.shed_some(reason)
        if self.publish_shed:
            self.answers.add(self.ids[slot], seq, SHED, reason, 0, 0.0, 0, ts_send, t_recv + offset)

    def _reject(self, reason: int, instrument, seq, t_recv: int, offset: int, ts_send: int = 0) -> None:
        """Count a rejected event; answer it when its instrument and seq can be named."""
        self.acct.reject(reason)
        if (self.publish_rejected and isinstance(instrument, int) and isinstance(seq, int)
                and 0 <= instrument <= MAX_INSTRUMENT_ID and 0 <= seq < _U64_LIMIT):
            ts = ts_send if isinstance(ts_send, int) and 0 <= ts_send < TS_LIMIT else 0
            self.answers.add(instrument, seq, REJECTED, int(reason), 0, 0.0, 0, ts, t_recv + offset)

    def _framing(self, topic, payload, t_recv: int, offset: int) -> int:
        """Wrong number of frames for the configured framing; returns events counted (1)."""
        if payload is not None:  # more frames follow: drain the rest of this message
            while self.sock.get(_RCVMORE):
                self.sock.recv(_NOBLOCK)
        self._reject(Reason.BAD_FRAMING, None, None, t_recv, offset)
        return 1

    def _undecodable(self, payload: bytes, t_recv: int, offset: int) -> int:
        """Not our schema. Returns 1 if it was not an event after all (a Decision, Status or
        DecisionBatch on the feed: UNEXPECTED_KIND is still a rejection, so 0 here)."""
        try:
            peek = _peek(payload)
        except Exception:  # noqa: BLE001 - not msgpack at all
            peek = None
        instrument = seq = None
        reason = Reason.DECODE_ERROR
        if isinstance(peek, list) and peek and isinstance(peek[0], int) and not isinstance(peek[0], bool):
            if peek[0] in (TAG_DECISION, TAG_STATUS, TAG_DECISION_BATCH):
                reason = Reason.UNEXPECTED_KIND
            elif peek[0] in (TAG_QUOTE, TAG_TRADE) and len(peek) >= 3:
                instrument, seq = peek[1], peek[2]
                if isinstance(instrument, bool) or isinstance(seq, bool):
                    instrument = seq = None
        self._reject(reason, instrument, seq, t_recv, offset)
        return 0

    def _not_an_event(self, msg, typ, t_recv: int, offset: int) -> int:
        """Heartbeat or Reset: not events (returns 1: uncount it)."""
        if typ is Heartbeat:
            self.acct.heartbeats += 1
            return 1
        if typ is Reset:
            self._reset(msg)
            return 1
        raise AssertionError(f"decoder returned {typ.__name__}")  # IngressDecoder's union is closed

    def _reset(self, msg: Reset) -> None:
        if msg.instrument == ALL_INSTRUMENTS:
            slots = list(range(len(self.ids)))
        else:
            slot = self.slot_of.get(msg.instrument, -1)
            if slot < 0:
                return  # an instrument we do not serve (another shard's): nothing to clear
            slots = [slot]
        self.on_reset(slots)
        for s in slots:
            self.last_seq[s] = -1
        self.acct.resets += 1
