"""The ingest of EventBatch frames: many events (quotes and trades) in one frame, handled as columns.

An EventBatch (transport/schema.py) stands for the same events sent one frame each, in order,
and ends exactly as they would: every event is checked, sequenced, counted and answered as the
per-frame path does (ingest.py). What changes is the cost. Past the rate at which one core can
read single-event frames (two recv calls, a decode and ~1 µs of Python each: ~2.5 µs per event
on the H200 host, docs/notes/ingest.md), a feed that never drops queues up and every event is
stale when read; a batch is one recv pair and one decode however many events it holds, and this
module handles a run of consecutive batches (merged, up to RUN_MAX events) with numpy over the
columns, so an event costs its share of a few numpy passes (~0.3 µs on the H200 host in frames
of 256, tools/bench_hotpath.py) and an instrument its trigger.

The column path (the model's number of levels, a clean run of COLUMNS_MIN or more events): one numpy
pass checks the whole run -- every instrument known, ts_send_ns and priority in range, every book
finite and non-negative (the high-byte rule of transport/codec.py), trades' price, size and side as
codec.validate_trade, and each instrument's sequence numbers consecutive from its last one. Then,
for a conflating model, each slot's last `rows_kept` rows of the run (the model's window, at most
the ring's depth: no step reads further back before newer rows replace them) are scattered into the
ring as whole rows (a trade repeats the book of the slot's row before it), its position count and
last sequence advance, and its newest event is the trigger, queued or shed STALE exactly as
Ingest._queue_newest does for a burst of frames (the earlier ones are CONFLATED into it). For a
sequential (stateful) model every event is queued in feed order, as the per-frame path's
Scheduler.push_many would queue it: each slot's events up to its room in the scheduler (the rest
shed QUEUE_FULL, rows unwritten), their rows scattered into the ring, deadlines judged over the
columns (a stale event shed LATE, unapplied, under deadline admission; queued apply-only under
depth admission), and the pushes numpy scatters into the scheduler's tables
(Scheduler.push_columns) instead of ~2 µs of per-event Python each (tools/bench_hotpath.py's
"sequential" rows).

Everything else -- a shorter run, another number of levels, any event that fails a check, a
gap, a restart or a repeat in the sequence, a batch under another topic than the service's batch
topic (BATCH_TOPIC, or its shard's: codec.shard_batch_topic), a
sequential run that would need more request ids than are free -- takes the general path: the
batch is expanded into its Quote and Trade messages (codec.events_of_batch) and handled with the
burst's other frames by the per-frame code, the one definition of every rule
(tests/unit/test_ingest_batch.py holds the column path to it). A batch whose columns do not match
its `n` and `n_levels` is one DECODE_ERROR, as any frame that is not our schema.
"""

from __future__ import annotations

from operator import attrgetter

import numpy as np

from hft_infer.transport.codec import (
    FLOAT_LIMIT,
    event_batch_shape_ok as shape_ok,
    events_of_batch,
    merged_event_columns,
    message_tag,
)
from hft_infer.transport.schema import TAG_EVENT_BATCH, EventBatch, Kind, Quote, Reason, Trade

DECODE_ERROR, QUEUE_FULL, LATE = int(Reason.DECODE_ERROR), int(Reason.QUEUE_FULL), int(Reason.LATE)
KIND_TRADE = int(Kind.TRADE)
# events in a run of batches from which the column path pays: its ~85 numpy calls cost ~100 µs
# however few events it holds, the per-event path ~1.5-2.5 µs an event. Measured where they cross
# (`tools/bench_hotpath.py --run-sizes 1024 --columns-min 32,48,64,96`, dev VM, Intel Xeon,
# 2026-12-04, BENCHMARKS.md wave 18; on the H200 host's core, wave 19, the conflating sweep was noisy
# both ways and the sequential one did not finish, so 64 stands there too): a
# sequential model's runs of 32 / 48 / 64 events cost 3.7 / 2.7 / 2.1 µs an event as columns
# against 2.4 / 2.1 / 1.9 per event, of 96 1.7 against 1.8-1.9; a conflating model's 2.7 / 1.8 /
# 1.5 (32 / 64 / 96) against 2.1 / 1.8-1.9 / 1.8. (32 until then, chosen on an AMD VM where the
# per-event path cost 3-5 µs an event.)
COLUMNS_MIN = 64
# most events handled as one run: past a few thousand the run's columns leave the CPU's caches
# and the cost per event rises again (dev VM: ~0.75 µs/event in runs of 64, ~1.3 in one of 30,000)
RUN_MAX = 4096
SLOT_TABLE_MAX = 1 << 20  # instrument ids below this: a lookup table (4 MB at most) instead of a search
_BAD_HIGH = 0x7F000000  # as ingest.py: a float32 whose high byte is >= 0x7F, read as a uint32
_EMPTY = b""
_INSTRUMENT = attrgetter("instrument")


class EventBatchPaths:
    """A mixin of `Ingest` (ingest.py): the EventBatch frames of a burst."""

    def _init_batches(self) -> None:
        ids = np.asarray(self.ids, dtype=np.int64)
        self._ids_np = ids  # slot -> instrument id (a column run's shed answers, as numpy)
        order = np.argsort(ids, kind="stable")
        self._ids_sorted = ids[order]
        self._slot_by_sorted = order.astype(np.int64)
        # instrument id -> slot (-1: not ours) as one take where the ids are small enough for a
        # table (the usual 0..N-1 universe), else a binary search of the sorted ids
        self._slot_table = None
        if len(ids) and int(ids.max()) < SLOT_TABLE_MAX:
            self._slot_table = np.full(int(ids.max()) + 2, -1, dtype=np.int16 if len(ids) < 2**15 else np.int64)
            self._slot_table[ids] = np.arange(len(ids))
        # slots as int16 let numpy's stable argsort be a radix sort (O(n))
        self._slot_dtype = np.int16 if len(ids) < 2**15 else np.int64
        # each slot's configured class of a quote and of a trade (the sequential column path)
        self._class_q_np = np.asarray(self.class_q, dtype=np.int64)
        self._class_t_np = np.asarray(self.class_t, dtype=np.int64)
        self._topic_of_id = dict(zip(self.ids, self.topics)).get

    def _batch_sized(self, payload) -> bool:
        """Cold: a frame over max_frame_bytes is still read if it is an EventBatch within
        max_batch_frame_bytes (its tag is read from the msgpack header, nothing decoded)."""
        return len(payload) <= self.max_batch_frame_bytes and message_tag(memoryview(payload)) == TAG_EVENT_BATCH

    def _handle_mixed(self, msgs: list, tops: list, recvs: list[int], offset: int) -> int:
        """A burst holding EventBatch frames, in feed order: a run of consecutive batches with
        COLUMNS_MIN or more events (and a model the column path serves) goes to `_handle_batches`;
        everything else -- single frames, shorter runs of batches expanded into their events --
        is gathered and handled by the per-frame chunk path together. Returns the events."""
        events = 0
        flat_m: list = []
        flat_t: list = []
        flat_r: list[int] = []
        i, k = 0, len(msgs)
        while i < k:
            if type(msgs[i]) is not EventBatch:
                flat_m.append(msgs[i])
                flat_t.append(tops[i])
                flat_r.append(recvs[i])
                i += 1
                continue
            j, size = i, 0
            while j < k and type(msgs[j]) is EventBatch:
                size += msgs[j].n
                j += 1
            if size >= COLUMNS_MIN:
                if flat_m:  # what came before, first
                    events += self._handle_frames(flat_m, flat_t, flat_r, offset)
                    flat_m, flat_t, flat_r = [], [], []
                events += self._handle_batches(msgs[i:j], tops[i:j], recvs[i:j], offset)
            else:
                for batch, top, t_recv in zip(msgs[i:j], tops[i:j], recvs[i:j]):
                    events += self._expand_into(batch, top, t_recv, offset, flat_m, flat_t, flat_r)
            i = j
        if flat_m:
            events += self._handle_frames(flat_m, flat_t, flat_r, offset)
        return events

    def _handle_batches(self, batches: list, tops: list, recvs: list[int], offset: int) -> int:
        """Consecutive EventBatch frames, in runs of up to RUN_MAX events: the column path for a
        run when it qualifies, else its batches expanded into their events. Returns the events
        (a malformed batch counts 1)."""
        events = 0
        run: list[tuple] = []
        size = 0
        for batch, top, t_recv in zip(batches, tops, recvs):
            if not shape_ok(batch):
                events += self._handle_run(run, offset) + 1
                run, size = [], 0
                self._reject(DECODE_ERROR, None, None, t_recv, offset)
                continue
            run.append((batch, top, t_recv))
            size += batch.n
            if size >= RUN_MAX:
                events += self._handle_run(run, offset)
                run, size = [], 0
        return events + self._handle_run(run, offset)

    def _handle_run(self, run: list[tuple], offset: int) -> int:
        """A run of well-shaped batches (batch, topic, receive time); returns its events."""
        if not run:
            return 0
        levels = self.levels
        if (all(r[0].n_levels == levels for r in run)
                and (not self.topic_frame or all(r[1] == self.batch_topic for r in run))
                and self._batch_columns([r[0] for r in run], [r[2] for r in run], offset)):
            return sum(r[0].n for r in run)
        flat_m: list = []
        flat_t: list = []
        flat_r: list[int] = []
        events = 0
        for batch, top, t_recv in run:
            events += self._expand_into(batch, top, t_recv, offset, flat_m, flat_t, flat_r)
        return events + self._handle_frames(flat_m, flat_t, flat_r, offset)

    def _expand_into(self, batch: EventBatch, top, t_recv: int, offset: int, msgs: list, tops: list,
                     recvs: list[int]) -> int:
        """The general path: the batch's events appended to a list the per-frame code handles, each
        as if it had come alone under its instrument's topic (or, under a wrong topic, under that
        one). A malformed batch is rejected here (DECODE_ERROR, 1 event); else returns 0 (its
        events are counted when the list is handled)."""
        events = events_of_batch(batch)
        if events is None:
            self._reject(DECODE_ERROR, None, None, t_recv, offset)
            return 1
        msgs.extend(events)
        if not self.topic_frame:
            tops.extend([None] * len(events))
        elif top == self.batch_topic:
            # each event as if under its instrument's topic: a C-level map (an id the service does not
            # serve maps to None, and is rejected as unknown before any topic is compared)
            tops.extend(map(self._topic_of_id, map(_INSTRUMENT, events)))
        else:
            tops.extend([top] * len(events))
        recvs.extend([t_recv] * len(events))
        return 0

    def _batch_columns(self, batches: list, times: list[int], offset: int) -> bool:
        """The column path over a run of batches of the model's levels; False, having changed
        nothing, when any event needs the general path."""
        c = merged_event_columns(batches)
        inst, seq, ts_send, prio, kind, books = (c["instrument"], c["seq"], c["ts_send_ns"], c["priority"],
                                                 c["kind"], c["book"])
        price, size, side = c["price"], c["size"], c["side"]
        recv = None if len(batches) == 1 else np.repeat(np.asarray(times, dtype=np.int64), [b.n for b in batches])
        n = len(seq)
        if n < COLUMNS_MIN:  # numpy's per-call cost is fixed: the per-event path is cheaper
            return False
        # checks, all at once: known instruments, fields in range, books finite and >= 0, trades'
        # price and size as validate_trade's, side +-1
        table = self._slot_table
        if table is not None:  # ids past the table's end read its last entry, -1
            slots = table.take(inst, mode="clip")
            if slots.min() < 0:
                return False
        else:
            ids = self._ids_sorted
            j = np.searchsorted(ids, inst)
            np.minimum(j, len(ids) - 1, out=j)
            if not (ids[j] == inst).all():
                return False
            slots = self._slot_by_sorted[j].astype(self._slot_dtype)
        if ts_send.min() < 0 or prio.min() < -1:
            return False
        trades = None
        if price is not None and kind.any():
            if kind.max() > KIND_TRADE:  # not our schema: the general path rejects the batch
                return False
            trades = kind == KIND_TRADE
            pt, st, sd = price[trades], size[trades], side[trades]
            if not (((pt >= 0.0) & (pt < FLOAT_LIMIT) & (st >= 0.0) & (st < FLOAT_LIMIT)).all()
                    and (np.abs(sd.astype(np.int16)) == 1).all()):
                return False
        # every row's book, trades' too (ignored, sent as zeros: a publisher that fills them with
        # anything else only costs itself the general path)
        if books.size and books.view("<u4").max() >= _BAD_HIGH:
            return False
        # per instrument, in feed order: each seq is the one before + 1, from the slot's last
        order = slots.argsort(kind="stable")
        s_sorted = slots[order]
        q_sorted = seq[order]
        first = np.empty(n, dtype=bool)
        first[0] = True
        np.not_equal(s_sorted[1:], s_sorted[:-1], out=first[1:])
        if not (q_sorted[1:] == q_sorted[:-1] + np.uint64(1))[~first[1:]].all():
            return False
        starts = np.flatnonzero(first)
        uniq = s_sorted[starts].tolist()
        last_seq = self.last_seq
        for slot, s0 in zip(uniq, q_sorted[starts].tolist()):
            last = last_seq[slot]
            if last >= 0 and s0 != last + 1:
                return False
        ends = np.append(starts[1:], n)
        group = np.repeat(np.arange(len(uniq)), ends - starts)  # each sorted event's slot, as an index into uniq
        rank = np.arange(n) - starts[group]  # its place among its slot's events of the run
        cols = (inst, seq, ts_send, prio, trades, price, size, side, books)
        before = np.fromiter(map(self.store.count.__getitem__, uniq), dtype=np.int64, count=len(uniq))  # positions
        if self.sched.sequential:
            return self._queue_run_in_order(cols, slots, order, s_sorted, starts, ends, group, rank, uniq, before,
                                            q_sorted, times, recv, offset)
        # accepted: every event of the run; a slot's last `rows_kept` rows are written (the model's
        # window: older ones are never read by a step before newer rows replace them)
        n_per = ends - starts
        self._write_rows(cols, order, s_sorted, starts, group, rank, rank >= (n_per - self.rows_kept)[group], before)
        newest = order[ends - 1].tolist()  # original index of each instrument's newest event
        n_per = n_per.tolist()
        q_last = q_sorted[ends - 1].tolist()
        count = self.store.count
        b_n, b_last, b_pos = self._b_n, self._b_last, self._b_pos
        # the triggers, as Ingest._queue_newest reads them: a Quote or Trade per instrument (a
        # quote without its book: its row is written), its receive time, its position
        levels = self.levels
        insts, sends, prios = inst[newest].tolist(), ts_send[newest].tolist(), prio[newest].tolist()
        is_trade = trades[newest].tolist() if trades is not None else None
        msgs = []
        trecv = []
        for k, (slot, i, c, seq_last) in enumerate(zip(uniq, newest, n_per, q_last)):
            pos = count[slot] + c - 1
            count[slot] = pos + 1
            last_seq[slot] = seq_last
            b_n[slot] = c
            b_last[slot] = k
            b_pos[slot] = pos
            if is_trade is not None and is_trade[k]:
                msgs.append(Trade(insts[k], seq_last, 0, sends[k], float(price[i]), float(size[i]), int(side[i]),
                                  prios[k]))
            else:
                msgs.append(Quote(insts[k], seq_last, 0, sends[k], levels, _EMPTY, prios[k]))
            trecv.append(times[0] if recv is None else int(recv[i]))
        self._msgs, self._recvs, self._offset = msgs, trecv, offset
        self._touched.extend(uniq)
        self._queue_newest()
        return True

    def _queue_run_in_order(self, cols: tuple, slots, order, s_sorted, starts, ends, group, rank, uniq: list[int],
                            before, q_sorted, times: list[int], recv, offset: int) -> bool:
        """A sequential (stateful) model: every event of a checked run is queued in feed order, as
        the per-frame path's push_many would queue it (each slot's events up to its room; the
        rest, its last ones, shed QUEUE_FULL with their rows unwritten and their positions not
        taken), with its deadline judged now (a stale one is queued apply-only; under deadline
        admission it is shed LATE instead, unapplied, as the per-frame path does, and the
        positions of its slot's later events close up). False, having changed nothing, when the
        free request ids would run out (the general path decides which events go without). The
        pushes are numpy scatters into the scheduler's tables (Scheduler.push_columns), as the rest."""
        _, seq, ts_send, prio, trades, *_ = cols
        sched = self.sched
        n = len(seq)
        t_recv = np.full(n, times[0], dtype=np.int64) if recv is None else recv
        send = ts_send.astype(np.int64)
        # deadline origin (perf_counter_ns): the publisher's send time when it gave one, but never
        # after receipt (a publisher clock ahead of ours), as Ingest._handle
        origin = np.where(send != 0, np.minimum(send - offset, t_recv), t_recv)
        stale = (t_recv - origin) > self.max_age_ns
        applied = None  # slot-sorted: the events that will take a position (None: all)
        n_applied = ends - starts
        late = stale
        uniq_np = s_sorted.take(starts).astype(np.int64)  # `uniq` as numpy: the scheduler's takes and scatters
        waits = sched.run_waits_ns(uniq_np, group, rank, order[starts]) if sched.deadline_admission else None
        if waits is not None:  # stale by its turn, each event behind the run's earlier ones (as _handle)
            wait = np.empty(n, dtype=np.int64)
            wait[order] = waits
            late = (t_recv - origin) > sched.admit_age_ns - wait  # stale ones too: wait and margin are >= 0
        if sched.deadline_admission and late.any():
            applied = ~late[order]
            upto = np.cumsum(applied)
            skipped = (upto - applied)[starts]  # applied events of the run before each slot's first
            rank = upto - 1 - skipped[group]  # place among its slot's applied events
            n_applied = upto[ends - 1] - skipped
        accepted = np.minimum(n_applied, sched.rooms(uniq_np))
        total = int(accepted.sum())
        if total > sched.free_requests():
            return False
        # every event kept (the usual case below capacity: then no mask and no picks below): none
        # shed LATE, and each slot's accepted count its whole count, as the sums say
        every = applied is None and total == n
        keep = None if every else rank < accepted[group]
        if applied is not None:
            keep &= applied
        if total:  # 0: none accepted (a run shed LATE whole, a saturated service's usual run), no row to store
            self._write_rows(cols, order, s_sorted, starts, group, rank, keep, before, applied)
        # per event, in feed order: push's arguments (of the accepted ones)
        positions = np.empty(n, dtype=np.int64)
        positions[order] = before[group] + rank
        cls = self._class_q_np.take(slots)
        if trades is not None:
            cls = np.where(trades, self._class_t_np.take(slots), cls)
        if self.honour_priority:
            p = prio.astype(np.int64)
            cls = np.where(p < 0, cls, np.minimum(p, self.max_class))
        # each event's rank among its slot's events queued (feed order): push_columns's slot_runs,
        # from the sort done here already
        rank_in_feed = np.empty(n, dtype=np.int64)
        rank_in_feed[order] = rank
        args = (slots, positions, seq, cls, t_recv, origin, send, stale, rank_in_feed)
        if every:
            in_feed = None
            k = n
        else:
            in_feed = np.empty(n, dtype=bool)
            in_feed[order] = keep
            ok = np.flatnonzero(in_feed)
            k = len(ok)
            args = [a.take(ok) for a in args]
        sched.push_columns(*args[:-1], runs=(uniq_np, accepted, args[-1]))
        count, last_seq = self.store.count, self.last_seq
        for slot, b, a, q in zip(uniq, before.tolist(), accepted.tolist(), q_sorted[ends - 1].tolist()):
            count[slot] = b + a
            last_seq[slot] = q
        if k < n:  # received, not applied; answered as the per-frame path does (past capacity: many):
            # the LATE ones in feed order as it reads them, then the QUEUE_FULL ones push_many refused
            refused = ~in_feed  # a LATE event is never kept
            sheds = ((QUEUE_FULL, refused),) if applied is None else ((LATE, late), (QUEUE_FULL, refused & ~late))
            for reason, mask in sheds:
                out = np.flatnonzero(mask)
                if not len(out):
                    continue
                self.acct.shed_some(reason, len(out))
                if self.publish_shed:  # as numpy columns: no Python int per answer (Answers takes their bytes)
                    self.answers.add_shed(self._ids_np.take(slots.take(out)), seq.take(out), reason, None,
                                          send.take(out), t_recv.take(out) + offset)
        return True

    def _write_rows(self, cols: tuple, order, s_sorted, starts, group, rank, keep, before, applied=None) -> None:
        """The rows of the run's events marked in `keep` (in slot-sorted order: a conflating
        model's last `depth` of each slot, a sequential one's accepted events; None: all) into the ring at
        `before[group] + rank` (`before`: each slot's count before the run), as the per-frame path
        writes them: a quote's row is its book with zero trade fields; a trade's repeats the book
        of the slot's row before it (a quote of the run, or the ring's newest row before the run)
        with its price and signed size. `applied` (slot-sorted; None: every event) leaves out the
        quotes a trade may take its book from: those shed LATE took no row. Each row's book is gathered
        as one item (from the frames' columns, or the ring) and stored with its trade fields by
        FeatureStore.put_rows, with no scratch array of whole rows."""
        _, _, _, _, trades, price, size, side, books = cols
        store = self.store
        depth = store.depth
        positions = before[group] + rank  # a new array: reduced to ring rows in place below
        sel = None if keep is None or keep.all() else np.flatnonzero(keep)
        if sel is not None:
            s_sorted, positions = s_sorted.take(sel), positions.take(sel)
        at = s_sorted.astype(np.int64)  # slot * depth + position % depth (int16 slots: the product overflows)
        at *= depth
        positions %= depth
        at += positions
        items = store.book_items(books)
        if trades is None:  # quotes only: their books, and zero trade fields
            store.put_rows(at, items.take(order if sel is None else order.take(sel)))
            return
        n = len(order)
        t_sorted = trades[order]
        # the book of each row: its own (a quote), else the slot's last quote before it in the run
        last_quote = np.where(t_sorted if applied is None else t_sorted | ~applied, -1, np.arange(n))
        np.maximum.accumulate(last_quote, out=last_quote)
        if sel is not None:
            last_quote, t_sorted, in_group = last_quote.take(sel), t_sorted.take(sel), group.take(sel)
            source = order.take(sel)
        else:
            in_group, source = group, order
        row_books = items.take(order.take(last_quote, mode="clip"))
        ring = last_quote < starts[in_group]  # -1, or another slot's: no quote of this slot before it
        if ring.any():  # trades before the run's first quote of their slot: the ring's newest row
            # before the run (read before any row of the run is stored: the run may wrap onto it)
            prev = before[in_group[ring]] - 1
            prev_at = s_sorted[ring].astype(np.int64) * depth + prev % depth
            row_books[ring] = np.where(prev >= 0, store.row_books[prev_at], np.zeros(1, store.book_item_dtype))
        fields = np.zeros((len(at), 2), np.float32)
        o = source[t_sorted]
        fields[t_sorted, 0] = price[o]
        fields[t_sorted, 1] = size[o] * side[o]
        store.put_rows(at, row_books, fields)


__all__ = ["EventBatchPaths"]
