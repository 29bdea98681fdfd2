"""The ingest: drain a burst of frames, then validate, write feature rows and queue it as a burst.

`Ingest.drain(max_frames)` works in three phases, so that the per-event Python is what the data
needs and the rest is done once per burst:

1. read: a tight recv loop until the socket is empty (`zmq.Again`, one exception per burst) or
   `max_frames` frames were read. Per message: recv topic (4 bytes, bytes) and payload (a
   zmq.Frame, whose .more recv read in C: getsockopt(RCVMORE) costs ~1.3 µs in pyzmq 27, the
   Frame ~0.5 µs, tools/bench_hotpath.py), the framing checks, the size limit, the receive
   time. Framing anomalies are counted at once (below).
2. decode: one `map` of the typed msgspec decoder over the payloads (the book stays a
   memoryview into the frame); if any frame fails, the burst is decoded frame by frame and
   each failure rejected with its reason. (One msgspec call over the burst framed as one
   msgpack array cannot tell frame boundaries: docs/notes/ingest.md says what it cost.)
3. handle, per chunk of at most the ring depth (so that no slot's ring wraps within one):
   from 16 events on, when every quote's book has the model's size, the NaN/sign check of
   every book is one numpy max() over the chunk's books joined (a float32 whose high byte is
   >= 0x7F: NaN, inf, negative, >= 2**127; the rows only when one is bad; the per-event
   big-int check of transport/codec.py, used below 16, costs ~0.4-0.6 µs); then the loop:
   type, instrument, the inlined `codec.validate_quote/trade` checks, topic == instrument's
   topic, sequence (next -> fast; a gap is counted and accepted; 0 after more is a publisher
   restart; anything else not above the last is OUT_OF_ORDER). An accepted event takes the
   slot's next ring position at once; the rows are written when the chunk is done (the
   quotes with one numpy assignment where the books were checked together and there are
   16 or more, else a memoryview copy each; then the trades in feed order: a trade repeats
   the row before it, which is then written).

Conflating models: only the newest accepted event of each instrument in a chunk can lead
to a decision. The older ones end as CONFLATED (counted by the scheduler, carried in the
newest one's n_conflated, not answered on their own), after their rows were written (the
window reads them). The newest is judged against its deadline -- from the publisher's
ts_send_ns if present, else its receive time -- and is queued (replacing or joining the
slot's pending request, as conflation in the scheduler does), or shed STALE at once (with
its n_conflated) if it is already older than scheduler.max_age_us. So past the service's
capacity a stale or superseded event costs its read, decode, checks and its share of one
numpy row write, and no scheduler push, answer or model step.

Sequential (stateful) models: every accepted event is queued, in feed order, with its chunk:
the loop takes its position and appends push's arguments, and the chunk goes to the scheduler
in one `Scheduler.push_many` call before its rows are written (no room -> QUEUE_FULL, its row
NOT written and its position given back, so the model's state never has a hole it does not
know about: push_many says why a refused event's position is free to give back). A stale one
(past max_age when read, or by its turn given its queue: Scheduler.queue_wait_ns, with the
scheduler's learned margin: Scheduler.admit_age_ns) is shed LATE
at once, unapplied and taking no position, under
`scheduler.admission = "deadline"` (the default: a service behind its feed catches up by
reading, not by stepping rows whose decisions it would withhold); under "depth" it is queued
apply-only (stepped, decision withheld).

Framing costs one RCVMORE flag read per message (after the payload), and stays exact: a lone
frame that is not 4 bytes, a lone 4-byte frame with nothing behind it (recv raises Again),
and a lone 4-byte frame followed by a message (the "payload" is then a 4-byte frame with more
behind it: that message's topic) are each one BAD_FRAMING, and the message after it is read
normally; a third frame makes a message BAD_FRAMING and is drained. The one ambiguity left: a
lone 4-byte frame followed by a single-frame message (any length) reads as one [topic, payload]
message when both are queued (the topic is read as bytes, without its more flag: reading it as a
Frame to see that flag costs ~0.7-1 µs more per event on the dev VM, for a feed that is malformed
anyway); the two messages then end as one event (rejected, or decided when the second frame is a
valid event of that topic). README, Framing.

Why this file runs a little past ~450 lines: the burst loop is one function with
hoisted locals on purpose (a helper call per event costs ~0.1 µs of CPython);
the cold paths already live in ingest_cold.py.

EventBatch frames (many events in one frame, transport/schema.py) are decoded in phase 2 like
any frame; a burst holding them goes to ingest_batch.py (`_handle_mixed`), which handles runs of
batches as columns and everything else through `_handle_frames`, in feed order.

Over iceoryx2 (`ShmIngest`, chosen by channels.py) only phase 1 differs: one sample is one whole
frame with no topic frame (transport/shm.py copies it into bytes); phases 2 and 3 (`_finish`)
are the same code, so checks, reasons, stages and accounting do not depend on the transport.

Cost is measured per burst (the `ingest` stage: mean receive->queued time of the burst's
events, one sample per burst) and in tools/bench_hotpath.py. The cold branches are in
ingest_cold.py.
"""

from __future__ import annotations

import numpy as np
import zmq

from hft_infer.clock import perf_ns
from hft_infer.ingest_batch import EventBatchPaths
from hft_infer.ingest_cold import IngestColdPaths
from hft_infer.scheduler import NO_REQUEST
from hft_infer.transport.codec import (
    BATCH_TOPIC,
    FLOAT_LIMIT,
    TS_LIMIT,
    IngressDecoder,
    _high_byte_masks,
    topic_for,
)
from hft_infer.transport.schema import BYTES_PER_LEVEL, EventBatch, Kind, Quote, Reason, Trade

# plain ints: enum flags build an enum per use
_NOBLOCK, _EVENTS, _POLLIN = int(zmq.NOBLOCK), int(zmq.EVENTS), int(zmq.POLLIN)
KIND_QUOTE, KIND_TRADE = int(Kind.QUOTE), int(Kind.TRADE)
STALE, QUEUE_FULL, NON_FINITE, OVERSIZED = (int(Reason.STALE), int(Reason.QUEUE_FULL), int(Reason.NON_FINITE),
                                            int(Reason.OVERSIZED))
LATE = int(Reason.LATE)
# events (or quotes to write) from which numpy's per-call cost pays: write_books costs ~2.4 /
# 0.96 / 0.61 / 0.31 µs per row at 4 / 8 / 16 / 64 rows against ~0.6-0.9 for a memoryview copy
BULK_MIN = 16
_BAD_HIGH = 0x7F000000  # a little-endian float32 with a high byte >= 0x7F is >= this as a uint32


class Ingest(EventBatchPaths, IngestColdPaths):
    """Owns the ingest socket's drain loop; writes into the feature store and the scheduler it
    is given and answers through `answers` (egress.Answers)."""

    def __init__(self, sock: zmq.Socket, *, instrument_ids: list[int], store, sched, acct, answers, clock,
                 topic_frame: bool, max_frame_bytes: int, max_levels: int, model_levels: int, max_age_us: int,
                 class_by_slot_kind: list[list[int]], honour_message_priority: bool, classes: int,
                 publish_shed: bool, publish_rejected: bool, on_reset, max_batch_frame_bytes: int = 65536,
                 rows_read: int = 0, batch_topic: bytes = BATCH_TOPIC) -> None:
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
        # EventBatch frames come under this topic (codec.shard_batch_topic: BATCH_TOPIC unsharded,
        # 8 bytes for a shard); an unsharded service also takes any shard's (its universe is all)
        self.batch_topic = batch_topic
        self._any_shard_batch = batch_topic == BATCH_TOPIC
        self.max_frame_bytes = max_frame_bytes
        self.max_batch_frame_bytes = max(max_batch_frame_bytes, max_frame_bytes)
        self.max_levels = max_levels
        self.levels = model_levels
        self.max_age_ns = max_age_us * 1000
        self.class_q, self.class_t = class_by_slot_kind[KIND_QUOTE], class_by_slot_kind[KIND_TRADE]
        self.honour_priority = honour_message_priority
        self.max_class = classes - 1
        self.publish_shed = publish_shed
        self.publish_rejected = publish_rejected
        self.on_reset = on_reset  # callback(slots): the service finishes pending work, then resets them
        # callback(events): called with a burst's exact event count once it is decoded and before any
        # of its rows is written (stepper.py sets it for engines that read the ring while in flight)
        self.before_rows = None
        self.last_seq = [-1] * len(instrument_ids)
        self._decode = IngressDecoder().decode
        self._masks = _high_byte_masks(model_levels)
        self._zero_book = bytes(model_levels * BYTES_PER_LEVEL)
        self._chunk = store.depth  # events handled together: no slot's ring wraps within a chunk
        # the newest rows per slot a model step reads (its window; 0: the whole ring): a conflating
        # EventBatch run writes only these of each slot, since no step reads the older ones before
        # newer rows replace them (ingest_batch.py; under overload a run holds many rows per slot)
        self.rows_kept = min(rows_read, store.depth) if rows_read > 0 else store.depth
        self.burst_ns = 0  # receive -> queued time of the last burst, per event (the `ingest` stage)
        # the chunk being handled: its decoded messages, receive times, the rows to write and,
        # conflating, each touched slot's newest event (index, position) and accepted count
        n = len(instrument_ids)
        self._b_n = [0] * n
        self._b_last = [0] * n
        self._b_pos = [0] * n
        self._touched: list[int] = []
        # sequential: the slots the chunk queues events on (their counts in _b_n: the chunk's
        # pushes go in at its end), and how many of them it queues anew (deadline admission)
        self._s_touched: list[int] = []
        self._s_anew = 0
        self._q_slot: list[int] = []
        self._q_pos: list[int] = []
        self._q_i: list[int] = []
        self._t_slot: list[int] = []
        self._t_pos: list[int] = []
        self._t_i: list[int] = []
        self._p_events: list[tuple] = []  # sequential: the chunk's accepted events, push's arguments
        self._msgs: list = []
        self._recvs: list[int] = []
        self._books: np.ndarray | None = None
        self._offset = 0
        self._init_batches()

    # ------------------------------------------------------------------ hot path

    def drain(self, max_frames: int) -> int:
        """Read and handle up to `max_frames` frames; returns how many were read."""
        sock = self.sock
        get = sock.get
        # Readiness: an EVENTS check costs a fraction of the zmq.Again exception a recv on an
        # empty socket raises (tools/bench_hotpath.py), so an idle loop checks first, and so
        # does each of the first messages of a burst; a longer burst reads until Again.
        if not get(_EVENTS) & _POLLIN:
            return 0
        recv = sock.recv
        topic_frame = self.topic_frame
        max_frame = self.max_frame_bytes
        offset = self.clock.sync()  # epoch = mono + offset; re-read once per burst (clock.py says why)
        tops: list = []
        pays: list = []
        recvs: list[int] = []
        tops_append, pays_append, recvs_append = tops.append, pays.append, recvs.append
        events = 0  # counted on this phase's cold branches
        n = 0
        t_first = perf_ns()
        while n < max_frames:
            if 0 < n < 3 and not get(_EVENTS) & _POLLIN:
                break
            try:
                # a topic frame as bytes (compared with the instrument's topic); without topic
                # framing the payload as a Frame, whose .more needs no getsockopt
                first = recv(_NOBLOCK, topic_frame)
            except zmq.Again:
                break
            n += 1
            if topic_frame:
                if len(first) != 4:
                    if len(first) != 8:
                        events += self._framing(first, None, perf_ns(), offset)
                        continue
                    if not self._batch_topic_ok(first):  # another shard's batch: drop the whole message
                        events += self._framing(first, first, perf_ns(), offset)
                        continue
                    first = self.batch_topic  # a shard's batch topic: handled as ours from here on
                try:
                    payload = recv(_NOBLOCK, False)  # a Frame: .more was read by recv, in C
                except zmq.Again:  # the 4-byte frame was a whole message
                    events += self._framing(first, None, perf_ns(), offset)
                    continue
                if payload.more:
                    if len(payload) != 4:  # a third frame: the message is malformed (drained)
                        events += self._framing(first, payload, perf_ns(), offset)
                        continue
                    # `first` was a whole 4-byte message and `payload` is the next one's topic
                    events += self._framing(first, None, perf_ns(), offset)
                    first = payload.bytes
                    payload = recv(_NOBLOCK, False)  # libzmq delivers a message's frames together
                    if payload.more:
                        events += self._framing(first, payload, perf_ns(), offset)
                        continue
            else:
                payload = first  # a Frame (read with copy=False, above)
                first = None  # no topic frame to check
                if payload.more:
                    events += self._framing(None, payload, perf_ns(), offset)
                    continue
            if len(payload) > max_frame and not self._batch_sized(payload):
                events += 1
                self._reject(OVERSIZED, None, None, perf_ns(), offset)
                continue
            tops_append(first)
            pays_append(payload)
            recvs_append(perf_ns())
        if n:
            self._finish(tops, pays, recvs, events, n, offset, t_first)
        return n

    def _finish(self, tops: list, pays: list, recvs: list[int], events: int, n: int, offset: int,
                t_first: int) -> None:
        """Phases 2 and 3 of a burst of `n` frames read (the same for every transport): decode,
        handle, count; `events` were counted by the read phase's cold branches."""
        if pays:
            try:
                msgs = list(map(self._decode, pays))
            except Exception:  # noqa: BLE001 - msgspec.DecodeError / ValidationError: not our schema
                msgs = self._decode_each(pays, recvs, offset)
            if self.before_rows is not None:  # an EventBatch carries `n` events; anything else one at most
                self.before_rows(sum([m.n if type(m) is EventBatch else 1 for m in msgs]))
            if len(msgs) == 1 and type(msgs[0]) is not EventBatch:  # the usual burst below saturation
                events += self._handle_one(msgs[0], tops[0], recvs[0], offset)  # no chunk machinery
            elif EventBatch in set(map(type, msgs)):  # ingest_batch.py: handled as columns
                events += self._handle_mixed(msgs, tops, recvs, offset)
            else:
                events += self._handle_frames(msgs, tops, recvs, offset)
        self.acct.received += events
        self.burst_ns = (perf_ns() - t_first) // max(n, events)  # per event (an EventBatch holds many)

    def _handle_frames(self, msgs: list, tops: list, recvs: list[int], offset: int) -> int:
        """Decoded single-event frames (and heartbeats, resets, failures), in chunks of at most the
        ring depth; returns the events in them."""
        k = len(msgs)
        chunk = self._chunk
        if k <= chunk:
            return self._handle(msgs, tops, recvs, offset)
        events = 0
        for c in range(0, k, chunk):
            events += self._handle(msgs[c:c + chunk], tops[c:c + chunk], recvs[c:c + chunk], offset)
        return events

    def _handle(self, msgs: list, tops: list, recvs: list[int], offset: int) -> int:
        """Validate, sequence and take positions for a chunk, then write and queue it; returns
        the events in it (frames that are not events, heartbeats and resets, are not)."""
        k = len(msgs)
        self._msgs, self._recvs, self._offset = msgs, recvs, offset
        levels = self.levels
        book_bytes = levels * BYTES_PER_LEVEL
        bulk = k >= BULK_MIN
        badl = None
        self._books = None
        if bulk:
            zb = self._zero_book
            books = [m.book if type(m) is Quote else zb for m in msgs]
            if set(map(len, books)) == {book_bytes}:  # rows line up: every book has the model's shape
                words = np.frombuffer(b"".join(books), dtype="<u4").reshape(k, -1)
                if words.max() >= _BAD_HIGH:  # one reduction; which rows only when some are bad
                    badl = (words >= _BAD_HIGH).any(axis=1).tolist()
                self._books = words.view("<f4")
            else:
                bulk = False
        slot_of_get = self.slot_of.get
        topics = self.topics
        check_topic = self.topic_frame
        m80, m7f, m01 = self._masks
        from_bytes = int.from_bytes
        count = self.store.count
        last_seq = self.last_seq
        sched = self.sched
        sequential = sched.sequential
        drop_late = sched.deadline_admission
        # Scheduler.queue_wait_ns, inlined below, counting the chunk's own events (pushed at its end),
        # against admit_age_ns (max_age less the scheduler's learned margin)
        place = sched.place_ns
        admit_age = sched.admit_age_ns
        s_touched = self._s_touched.append
        s_len = sched.s_len if sequential else None
        p_append = self._p_events.append
        max_age = self.max_age_ns
        class_q, class_t = self.class_q, self.class_t
        b_n, b_last, b_pos = self._b_n, self._b_last, self._b_pos
        touched_append = self._touched.append
        q_slot, q_pos, q_i = self._q_slot.append, self._q_pos.append, self._q_i.append
        t_slot, t_pos, t_i = self._t_slot.append, self._t_pos.append, self._t_i.append
        sized = bulk  # every quote's book is book_bytes long (checked over the burst above)
        events = k
        for i, msg in enumerate(msgs):
            typ = type(msg)
            if typ is Quote:
                slot = slot_of_get(msg.instrument, -1)
                seq = msg.seq
                ts_send = msg.ts_send_ns
                prio = msg.priority
                if (slot < 0 or msg.n_levels != levels or (not sized and len(msg.book) != book_bytes) or seq < 0
                        or prio < -1 or not 0 <= ts_send < TS_LIMIT or (check_topic and tops[i] != topics[slot])):
                    if not self._quote_slow(msg, slot, tops[i], recvs[i], offset):
                        continue
                elif badl is not None:
                    if badl[i]:
                        self._reject(NON_FINITE, msg.instrument, seq, recvs[i], offset, ts_send)
                        continue
                elif not bulk:
                    x = from_bytes(msg.book, "little")
                    if x & m80 or ((x & m7f) + m01) & m80:
                        self._reject(NON_FINITE, msg.instrument, seq, recvs[i], offset, ts_send)
                        continue
            elif typ is Trade:
                slot = slot_of_get(msg.instrument, -1)
                seq = msg.seq
                ts_send = msg.ts_send_ns
                prio = msg.priority
                side = msg.side
                if (slot < 0 or not (0.0 <= msg.price < FLOAT_LIMIT and 0.0 <= msg.size < FLOAT_LIMIT)
                        or (side != 1 and side != -1) or seq < 0 or prio < -1 or not 0 <= ts_send < TS_LIMIT
                        or (check_topic and tops[i] != topics[slot])):
                    self._trade_slow(msg, slot, tops[i], recvs[i], offset)
                    continue
            elif msg is None:  # failed to decode: rejected with its reason already (an event)
                continue
            else:
                events -= self._not_an_event(msg, typ, recvs[i], offset, tops[i])
                continue
            last = last_seq[slot]
            if seq != last + 1 and last >= 0 and not self._sequence(slot, seq, last, recvs[i], offset, ts_send):
                continue
            last_seq[slot] = seq
            if sequential:
                t_recv = recvs[i]
                # deadline origin (perf_counter_ns): the publisher's send time when it gave one
                if ts_send:
                    origin = ts_send - offset
                    if origin > t_recv:  # a publisher clock ahead of ours: count from receipt
                        origin = t_recv
                else:
                    origin = t_recv
                stale = t_recv - origin > max_age
                # deadline admission: stale when its turn would come -> not applied, no position taken
                q = s_len[slot] + b_n[slot]
                if drop_late and (stale or t_recv - origin > admit_age - (
                        q * place + (place >> 1) if q else sched.turn_wait_ns(self._s_anew))):
                    self._shed(LATE, slot, seq, ts_send, t_recv, offset)
                    continue
                if not b_n[slot]:
                    s_touched(slot)
                    if not q:
                        self._s_anew += 1
                b_n[slot] += 1
            pos = count[slot]
            count[slot] = pos + 1
            if typ is Quote:
                q_slot(slot)
                q_pos(pos)
                q_i(i)
                table = class_q
            else:
                t_slot(slot)
                t_pos(pos)
                t_i(i)
                table = class_t
            if sequential:
                cls = table[slot] if prio < 0 else self._class(prio, slot, table)
                # queued with the chunk (Scheduler.push_many), its position taken as if it will be
                p_append((slot, pos, seq, cls, t_recv, origin, ts_send, stale))
            else:
                nb = b_n[slot]
                if not nb:
                    touched_append(slot)
                b_n[slot] = nb + 1
                b_last[slot] = i
                b_pos[slot] = pos
        self._flush_burst()
        return events

    def _handle_one(self, msg, top, t_recv: int, offset: int) -> int:
        """A burst of one frame: what `_handle` does for a chunk of one, without the lists.
        Returns the events in it (0 or 1)."""
        typ = type(msg)
        if typ is Quote:
            slot = self.slot_of.get(msg.instrument, -1)
            seq = msg.seq
            ts_send = msg.ts_send_ns
            prio = msg.priority
            if (slot < 0 or msg.n_levels != self.levels or len(msg.book) != self.levels * BYTES_PER_LEVEL or seq < 0
                    or prio < -1 or not 0 <= ts_send < TS_LIMIT or (top is not None and top != self.topics[slot])):
                if not self._quote_slow(msg, slot, top, t_recv, offset):
                    return 1
            else:
                m80, m7f, m01 = self._masks
                x = int.from_bytes(msg.book, "little")
                if x & m80 or ((x & m7f) + m01) & m80:
                    self._reject(NON_FINITE, msg.instrument, seq, t_recv, offset, ts_send)
                    return 1
            table = self.class_q
        elif typ is Trade:
            slot = self.slot_of.get(msg.instrument, -1)
            seq = msg.seq
            ts_send = msg.ts_send_ns
            prio = msg.priority
            side = msg.side
            if (slot < 0 or not (0.0 <= msg.price < FLOAT_LIMIT and 0.0 <= msg.size < FLOAT_LIMIT)
                    or (side != 1 and side != -1) or seq < 0 or prio < -1 or not 0 <= ts_send < TS_LIMIT
                    or (top is not None and top != self.topics[slot])):
                self._trade_slow(msg, slot, top, t_recv, offset)
                return 1
            table = self.class_t
        elif msg is None:  # failed to decode: rejected with its reason already (an event)
            return 1
        else:
            self._msgs, self._recvs, self._offset = [msg], [t_recv], offset  # a Reset flushes "the chunk"
            return 1 - self._not_an_event(msg, typ, t_recv, offset, top)
        last_seq = self.last_seq
        last = last_seq[slot]
        if seq != last + 1 and last >= 0 and not self._sequence(slot, seq, last, t_recv, offset, ts_send):
            return 1
        last_seq[slot] = seq
        if ts_send:  # the deadline's origin, as in _handle
            origin = ts_send - offset
            if origin > t_recv:
                origin = t_recv
        else:
            origin = t_recv
        stale = t_recv - origin > self.max_age_ns
        cls = table[slot] if prio < 0 else self._class(prio, slot, table)
        store = self.store
        pos = store.count[slot]
        sched = self.sched
        if sched.sequential:
            # stale, or stale by its turn (Scheduler.queue_wait_ns)
            if sched.deadline_admission and t_recv - origin > sched.admit_age_ns - sched.queue_wait_ns(slot):
                self._shed(LATE, slot, seq, ts_send, t_recv, offset)
                return 1
            if sched.push(slot, pos, seq, cls, t_recv, origin, ts_send, stale) == NO_REQUEST:
                self._shed(QUEUE_FULL, slot, seq, ts_send, t_recv, offset)  # received, not applied
                return 1
        elif stale:
            self._shed(STALE, slot, seq, ts_send, t_recv, offset)
        elif sched.push(slot, pos, seq, cls, t_recv, origin, ts_send) == NO_REQUEST:
            self._shed(QUEUE_FULL, slot, seq, ts_send, t_recv, offset)
        store.count[slot] = pos + 1
        if typ is Quote:
            store.write_quote_at(slot, pos, msg.book, self.levels)
        else:
            store.write_trade_at(slot, pos, msg.price, msg.size * side)
        return 1

    def _flush_burst(self) -> None:
        """Sequential: queue the chunk's events (one push_many); then write the rows accepted
        so far in this chunk; then, conflating, queue or shed the newest event of each slot they
        touched. Also called by cold paths mid-chunk."""
        store = self.store
        msgs = self._msgs
        if self._p_events:
            refused = self.sched.push_many(self._p_events)
            if refused:  # QUEUE_FULL: shed, their rows not written and their positions given back
                self._refused(refused)
            self._p_events.clear()
        if self._s_touched:  # pushed: the queues count them now
            b_n = self._b_n
            for slot in self._s_touched:
                b_n[slot] = 0
            self._s_touched.clear()
            self._s_anew = 0
        q_i = self._q_i
        if q_i:
            books = self._books
            if books is not None and len(q_i) >= BULK_MIN:
                store.write_books(self._q_slot, self._q_pos, books, q_i)
            else:
                write, levels = store.write_quote_at, self.levels
                for slot, pos, i in zip(self._q_slot, self._q_pos, q_i):
                    write(slot, pos, msgs[i].book, levels)
            self._q_slot.clear()
            self._q_pos.clear()
            q_i.clear()
        if self._t_i:
            # after the quotes: a trade repeats the row before it, written by now (a quote of this
            # chunk, a trade written just before in feed order, or an earlier row)
            write = store.write_trade_at
            for slot, pos, i in zip(self._t_slot, self._t_pos, self._t_i):
                m = msgs[i]
                write(slot, pos, m.price, m.size * m.side)
            self._t_slot.clear()
            self._t_pos.clear()
            self._t_i.clear()
        if self._touched:
            self._queue_newest()

    def _queue_newest(self) -> None:
        """Conflating: per slot touched by the chunk, its newest event is the trigger and the
        slot's earlier events of the chunk are conflated into it."""
        sched = self.sched
        push = sched.push
        msgs, recvs, offset = self._msgs, self._recvs, self._offset
        b_n, b_last, b_pos = self._b_n, self._b_last, self._b_pos
        max_age = self.max_age_ns
        class_q, class_t = self.class_q, self.class_t
        stale: list[int] = []  # slots whose trigger is shed STALE: answered together below
        for slot in self._touched:
            i = b_last[slot]
            superseded = b_n[slot] - 1
            msg = msgs[i]
            t_recv = recvs[i]
            ts_send = msg.ts_send_ns
            if ts_send:  # the deadline's origin, as in the sequential branch of _handle
                origin = ts_send - offset
                if origin > t_recv:
                    origin = t_recv
            else:
                origin = t_recv
            if t_recv - origin > max_age:  # already past its deadline: no request, no step
                stale.append(slot)
                continue
            b_n[slot] = 0
            prio = msg.priority
            table = class_q if type(msg) is Quote else class_t
            cls = table[slot] if prio < 0 else self._class(prio, slot, table)
            if push(slot, b_pos[slot], msg.seq, cls, t_recv, origin, ts_send, False, superseded) == NO_REQUEST:
                if superseded:
                    sched.count_conflated(superseded)
                self._shed(QUEUE_FULL, slot, msg.seq, ts_send, t_recv, offset, superseded)
        self._touched.clear()
        if stale:
            self._shed_stale(stale)


class ShmIngest(Ingest):
    """The ingest over iceoryx2 (transport/shm.py): each sample is one whole frame, with no
    topic frame, so the read phase is the recv loop, the size limit and the receive time;
    decoding, checks, sequencing, accounting and answers are Ingest's (`_finish`)."""

    def drain(self, max_frames: int) -> int:
        sock = self.sock
        if not sock.has_samples():  # ~0.2 us: cheaper than a receive that finds nothing
            return 0
        recv = sock.recv
        max_frame = self.max_frame_bytes
        offset = self.clock.sync()
        pays: list = []
        recvs: list[int] = []
        pays_append, recvs_append = pays.append, recvs.append
        events = 0
        n = 0
        t_first = perf_ns()
        while n < max_frames:
            payload = recv()
            if payload is None:
                break
            n += 1
            if len(payload) > max_frame and not self._batch_sized(payload):
                events += 1
                self._reject(OVERSIZED, None, None, perf_ns(), offset)
                continue
            pays_append(payload)
            recvs_append(perf_ns())
        if n:
            self._finish([None] * len(pays), pays, recvs, events, n, offset, t_first)
        return n
