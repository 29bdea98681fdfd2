"""The ingest's cold paths: every event that is not a well-formed Quote or Trade of the model's
shape, for a known instrument, next in sequence (ingest.py has the fast path and says why each
branch is cold). Each one counts its outcome with a reason, and answers where it can name the
event: none raises, none is silent.

A mixin of `Ingest`: it reads the state that Ingest.__init__ sets, and calls
`Ingest._flush_burst` before anything that must see the burst's earlier events queued (a Reset,
a quote of another number of levels, which takes the general write path). Also here: the
per-frame decode of a burst in which a frame failed, and the column answers of the STALE
triggers of a chunk (under overload, every burst's lot).
"""

from __future__ import annotations

import msgspec
import zmq

from hft_infer.scheduler import NO_REQUEST
from hft_infer.transport.codec import BATCH_TOPIC, TS_LIMIT, reset_topic_ok, validate_quote, validate_trade
from hft_infer.transport.schema import (
    ALL_INSTRUMENTS,
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

_NOBLOCK, _RCVMORE = int(zmq.NOBLOCK), int(zmq.RCVMORE)
KIND_QUOTE = int(Kind.QUOTE)
SHED, REJECTED = int(Outcome.SHED), int(Outcome.REJECTED)
STALE, QUEUE_FULL = int(Reason.STALE), int(Reason.QUEUE_FULL)
_U64_LIMIT = 1 << 64
_peek = msgspec.msgpack.Decoder().decode  # untyped: names the instrument/seq of a frame that failed


class IngestColdPaths:
    def _decode_each(self, pays: list, recvs: list[int], offset: int) -> list:
        """Cold: a frame of the burst is not our schema; decode one by one, None where one fails
        (rejected here with its reason)."""
        decode = self._decode
        out = []
        for payload, t_recv in zip(pays, recvs):
            try:
                out.append(decode(payload))
            except Exception:  # noqa: BLE001 - msgspec.DecodeError / ValidationError
                self._undecodable(payload, t_recv, offset)
                out.append(None)
        return out

    def _shed_stale(self, slots: list[int]) -> None:
        """Shed STALE the newest event of each of `slots` (and count its superseded ones as
        conflated), answering them as columns: under overload this is every burst's lot."""
        msgs, recvs, offset = self._msgs, self._recvs, self._offset
        b_n, b_last = self._b_n, self._b_last
        idx = [b_last[s] for s in slots]
        nconf = [b_n[s] - 1 for s in slots]
        for s in slots:
            b_n[s] = 0
        self.sched.count_conflated(sum(nconf))
        n = len(slots)
        self.acct.shed_some(STALE, n)
        if self.publish_shed:
            ids = self.ids
            self.answers.add_shed([ids[s] for s in slots], [msgs[i].seq for i in idx], STALE, nconf,
                                  [msgs[i].ts_send_ns for i in idx], [recvs[i] + offset for i in idx])

    def _refused(self, refused: list[int]) -> None:
        """Sequential: the events of the chunk that Scheduler.push_many refused (indices into
        `_p_events`) are shed QUEUE_FULL, as received and not applied: their rows are taken
        out of the chunk's writes and their positions given back (the refused events of a slot
        are its last ones in the chunk, push_many says why, so its count goes back to the
        first one's position)."""
        events, count, offset = self._p_events, self.store.count, self._offset
        gone = set()
        shed = [events[j] for j in refused]
        for slot, pos, *_ in shed:
            gone.add((slot, pos))
            if pos < count[slot]:
                count[slot] = pos
        self.acct.shed_some(QUEUE_FULL, len(shed))
        if self.publish_shed:
            ids = self.ids
            self.answers.add_shed([ids[e[0]] for e in shed], [e[2] for e in shed], QUEUE_FULL, None,
                                  [e[6] for e in shed], [e[4] + offset for e in shed])
        for slots, positions, index in ((self._q_slot, self._q_pos, self._q_i), (self._t_slot, self._t_pos, self._t_i)):
            kept = [w for w in zip(slots, positions, index) if (w[0], w[1]) not in gone]
            slots[:] = [w[0] for w in kept]
            positions[:] = [w[1] for w in kept]
            index[:] = [w[2] for w in kept]

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
        self._flush_burst()  # what the burst accepted before it is queued first (feed order)
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

    def _shed(self, reason: int, slot: int, seq: int, ts_send: int, t_recv: int, offset: int,
              nconf: int = 0) -> None:
        self.acct.shed_some(reason)
        if self.publish_shed:
            self.answers.add(self.ids[slot], seq, SHED, reason, 0, 0.0, nconf, ts_send, t_recv + offset)

    def _reject(self, reason: int, instrument, seq, t_recv: int, offset: int, ts_send: int = 0) -> None:
        """Count a rejected event; answer it when its instrument and seq can be named."""
        self.acct.reject(reason)
        if (self.publish_rejected and isinstance(instrument, int) and isinstance(seq, int)
                and 0 <= instrument <= MAX_INSTRUMENT_ID and 0 <= seq < _U64_LIMIT):
            ts = ts_send if isinstance(ts_send, int) and 0 <= ts_send < TS_LIMIT else 0
            self.answers.add(instrument, seq, REJECTED, int(reason), 0, 0.0, 0, ts, t_recv + offset)

    def _batch_topic_ok(self, topic: bytes) -> bool:
        """An 8-byte topic frame: our shard's batch topic (codec.shard_batch_topic), or any
        shard's when this service serves the whole universe (its batches hold our instruments)."""
        return topic == self.batch_topic or (self._any_shard_batch and topic[:4] == BATCH_TOPIC)

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

    def _not_an_event(self, msg, typ, t_recv: int, offset: int, top=None) -> int:
        """Heartbeat or Reset: not events (returns 1: uncount it). A Reset on a topic where it does
        not belong (codec.reset_topic_ok) is TOPIC_MISMATCH, counted as a rejected message (returns
        0) and not applied: a publisher's mistake shows instead of half-resetting a universe."""
        if typ is Heartbeat:
            self.acct.heartbeats += 1
            return 1
        if typ is Reset:
            if top is not None and not reset_topic_ok(top, msg.instrument):
                self._reject(Reason.TOPIC_MISMATCH, None, None, t_recv, offset)  # no seq: counted, not answered
                return 0
            self._reset(msg)
            return 1
        raise AssertionError(f"decoder returned {typ.__name__}")  # IngressDecoder's union is closed

    def _reset(self, msg: Reset) -> None:
        self._flush_burst()  # events before the Reset are decided on the old state
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
