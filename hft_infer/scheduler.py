"""Priority scheduling with aging, deadline shedding, conflation and batch policies.

Unit of scheduling: the *instrument slot*. Each priority class has a FIFO of
slots that have pending work; a slot is in at most one FIFO at a time. What
"pending work" means depends on the model:

- conflating (window models that read their window from the feature ring):
  one pending request per slot. A newer event of a queued slot replaces the
  trigger in place (the older event's outcome is CONFLATED; the decision
  carries `n_conflated`), keeping the slot's place in its FIFO, so a busy
  instrument cannot push itself to the back of the queue.
- sequential (stateful models -- stream LSTM, incremental-window LSTM -- and
  window models with conflation off): every event reaches the model in order,
  so a slot holds a FIFO of its pending events, a batch takes at most one
  event per slot (the oldest), and a slot with more events goes back into its
  class FIFO after the batch is formed.

Aging: the effective priority of a queued slot is `class - wait / aging`.
Comparing two heads at the same instant `now`, the smaller of
`class * aging_ns + enqueue_ns` wins -- `now` cancels -- so the pick is a
k-way merge of FIFOs that are each sorted by enqueue time, O(classes) per
pick with no allocation. A class-c request enqueued at t therefore goes before
every class-0 request enqueued after t + c * aging: no class starves.

Deadlines: every request carries its trigger's *origin* (perf_counter_ns):
the publisher's send time (`ts_send_ns`, converted) when the event had one,
else its receive time, so time spent in the publisher's and the socket's
queues counts. A request older than `max_age_us` from its origin when its
turn comes is shed (answered SHED/STALE). Conflating models skip the step for
it; sequential ones still run it (a stateful model's state needs every row)
but the decision is withheld and answered SHED. Events that are already stale
on arrival are handled by the ingest (hft_infer/ingest.py): shed at once under
conflation; in sequential mode shed LATE, unapplied, under deadline admission
(below) and queued apply-only (`stale=True`) under depth admission. Under
conflation the ingest also conflates within each burst it reads: only an
instrument's newest event of the burst is pushed, with `superseded` = the
older ones, which this scheduler counts as conflated like its own.

Admission (sequential models). Without a bound in time, a stateful model
offered more rows than it can step fills every queue to max_pending: at 64
deep that is ~90 ms of rows on the dev VM, every row is stale when picked, it
is stepped and its decision withheld, and the service decides almost nothing
however fast it steps (measured: 49,555 of 300,000 decided at 3x capacity, of
230k rows stepped). That is `admission = "depth"`, kept for users who want
every admitted row applied at any load. Under `"deadline"` (the default):

- a slot queues at most `admit_depth` events, the number the service steps
  within the deadline at its measured pace. A batch takes one event per slot,
  so an event behind k others is picked k to k + 1 batches later, `rounds`
  times that when more slots are queued than a batch holds. `place_ns` =
  period x rounds is the wait one queue place means, with `step_period_ns` the
  period between batches while some slot is backlogged (an EWMA kept by
  `_pace`; a shorter period without a backlog may also pull it down), and
  admit_depth = 7/8 max_age / place_ns, at least 1, at most max_pending. An
  event beyond it is refused like one beyond max_pending (QUEUE_FULL: not
  applied, position not taken).
- the ingest sheds LATE (unapplied) an event whose age on arrival plus
  `queue_wait_ns(slot)`, the expected wait of (queued + 1/2) places, passes
  max_age: it would be stale when picked, stepped for nothing but its row. An
  event for an empty queue waits for its slot's turn: one period per full batch
  of the slots queued ahead of it and half a period (`turn_wait_ns`), none while
  fewer than a batch are queued, so it is LATE only when already stale whenever the queue is
  short and batches keep forming for the pace to be measured. Before
  2026-12-04 it waited none at any depth: with 1,024 instruments, past capacity,
  most events queued a slot anew behind ~1,000 others (16 batches, ~16 ms), were
  admitted, and were stale when picked (dev VM, mlp_small with conflation off at
  120k events/s: 325 of 480,000 decided, 218k stepped stale; the H200 host, lstm_a
  at 100k/s: 241 of 250,000). On the H200 host (lstm_a, BENCHMARKS.md wave 12) counting the whole last
  place (134d8e3) decided fewer over EventBatch frames under overload, where a
  place is longest; counting none (before 134d8e3) left 90-110k of 400k events
  stale when picked at 100k events/s in single-event frames.
- the margin: the pace model counts from an event's receipt, but the loop
  reads a burst before it handles it and forms the next batch only after the
  whole burst (and, in a loop past capacity, its complete and publish): on
  the H200 host a saturated shard's burst took ~75 % of its loop, so the next
  batch came ~3/4 of a period after receipt, not the half the model expects.
  Past capacity admission fills every queue to the deadline, so any such bias
  leaves the admitted events stale when picked: lstm_a over 1,024
  instruments at 100k/s stepped half of its rows stale (55k STALE, 55k
  decided), and a simulation of that loop (tests/unit/test_scheduler_admission.py,
  docs/bench/devvm-87f86b8/admission_sim.log) stepped 47 fresh rows of 64 a batch
  with the batch 3/4 of a period after receipt, 30 at a whole period. So the expected wait
  carries a learned margin, `admit_margin_ns`: a batch that picks a stale
  event adds a quarter period (at most max_age / 2), one that picks none
  takes a 32nd off; the ingest sheds LATE an event older than
  `admit_age_ns` = max_age - margin, less its expected wait. It is 0 until a
  batch picks a stale event (below capacity, and wherever the model holds)
  and fades to nothing (under 32 ns) once batches stop picking them, and it
  corrects any systematic error of the model, whatever its cause. Exported as the gauge `admit_margin_us`.

State is preallocated at start-up in numpy arrays that the per-event code reads
and writes through memoryviews of them (`r_slot`, `s_len`, ...: a scalar store
~23 ns on the dev VM, against ~10 into a list and ~35 into the array itself),
so that the EventBatch column path can queue a whole run with a few numpy
scatters (`push_columns`) where a loop over lists cost ~0.7-1.5 µs an event
(BENCHMARKS.md wave 24). The request table's integer columns are the rows of one
int64 array (`request_table`, seq's row seen as uint64), so that a step's answers
gather every column a request echoes in ONE `take` (Stepper._answer_columns: in the
loop, each numpy call costs ~1-2 µs on the dev VM, several times its cost in a tight
loop); `stale` stays a bool array of its own (its memoryview takes numpy's bools, an
int64 one refuses them). Request ids come from a free list, so
`live_requests()` (ids handed out and not yet released) is counted
independently of the service's outcome counters.
"""

from __future__ import annotations

from operator import itemgetter

import numpy as np

from hft_infer.config import SchedulerConfig

NO_REQUEST = -1
# a request's n_conflated saturates at the wire's uint32 as it is counted, so that an answer takes
# the table's column as it is (the `conflated` counter keeps the exact count)
NCONF_MAX = (1 << 32) - 1
_KEY = itemgetter(0)
# the request table's integer columns (Scheduler.r_<name>), in the order of `request_table`'s rows:
# seq and ts_send_ns are what the codec accepts (uint64, seq's row seen as such; int64,
# transport/codec.py TS_LIMIT), the clocks perf_counter_ns. Plus `stale`, a bool column of its own.
REQUEST_ROWS = ("slot", "pos", "seq", "cls", "recv_ns", "origin_ns", "send_epoch_ns", "nconf")
ROW = {name: i for i, name in enumerate(REQUEST_ROWS)}


def slot_runs(slots) -> tuple:
    """(uniq, counts, rank) of a column of slots in feed order: the distinct slots (ascending),
    how many events each has, and each event's place among its slot's events (feed order):
    what Scheduler.push_columns needs to place events in their slots' rings."""
    k = len(slots)
    order = slots.argsort(kind="stable")  # a radix sort for the column path's int16 slots
    s_sorted = slots.take(order)
    edge = np.empty(k + 1, dtype=bool)
    edge[0] = edge[k] = True
    np.not_equal(s_sorted[1:], s_sorted[:-1], out=edge[1:k])
    bounds = np.flatnonzero(edge)
    starts = bounds[:-1]
    counts = bounds[1:] - starts
    rank = np.empty(k, dtype=np.int64)
    rank[order] = np.arange(k) - np.repeat(starts, counts)
    return s_sorted.take(starts).astype(np.int64), counts, rank


class AdaptiveWait:
    """Batching wait tuned against a latency objective (AIMD on a sliding p99).

    `observe_batch` only records the batch's worst queue+step latency (a list
    store). `update(now)`, called by the loop when it has nothing better to
    do and at most every UPDATE_NS, takes the p99 of the recent samples
    against `objective`: above it the wait halves (multiplicative decrease),
    well below it (< 70 %) the wait grows by a sixteenth of its ceiling
    (additive increase). The wait is also capped by the time the current
    arrival rate needs to fill the batch, so at low rates it does not wait
    for requests that will not come.
    """

    UPDATE_NS = 5_000_000

    def __init__(self, max_wait_ns: int, objective_ns: int, max_batch: int, window: int = 256) -> None:
        self.max_wait_ns = max_wait_ns
        self.objective_ns = objective_ns
        self.max_batch = max_batch
        self.wait_ns = 0
        self._samples = [0] * window
        self._n = 0
        self._rate_per_ns = 0.0
        self._last_arrivals = 0
        self._last_ns = 0
        self._next_update_ns = 0

    def observe_batch(self, worst_queue_plus_step_ns: int) -> None:
        self._samples[self._n % len(self._samples)] = worst_queue_plus_step_ns
        self._n += 1

    def update(self, arrivals_total: int, now_ns: int) -> None:
        if now_ns < self._next_update_ns or self._n == 0:
            return
        self._next_update_ns = now_ns + self.UPDATE_NS
        if self._last_ns:
            dt = now_ns - self._last_ns
            if dt > 0:
                inst = (arrivals_total - self._last_arrivals) / dt
                self._rate_per_ns = inst if self._rate_per_ns == 0.0 else 0.7 * self._rate_per_ns + 0.3 * inst
        self._last_ns, self._last_arrivals = now_ns, arrivals_total
        window = np.asarray(self._samples[: min(self._n, len(self._samples))], dtype=np.int64)
        k = min(window.size - 1, int(0.99 * window.size))
        p99 = float(np.partition(window, k)[k])
        if p99 > self.objective_ns:
            self.wait_ns //= 2
        elif p99 < 0.7 * self.objective_ns:
            self.wait_ns = min(self.max_wait_ns, self.wait_ns + max(1000, self.max_wait_ns // 16))

    def current_wait_ns(self, pending: int) -> int:
        if self._rate_per_ns <= 0.0:
            return self.wait_ns
        fill_ns = int((self.max_batch - pending) / self._rate_per_ns)
        return min(self.wait_ns, max(fill_ns, 0))


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, n_slots: int, *, sequential: bool, conflate: bool,
                 class_by_slot_kind: list[list[int]]) -> None:
        """`class_by_slot_kind[kind][slot]` is the configured class of an event."""
        if sequential and conflate:
            raise ValueError("conflation and sequential scheduling are exclusive")
        self.sequential = sequential
        self.conflate = conflate
        self.classes = cfg.classes
        self.max_batch = cfg.max_batch
        self.aging_ns = int(cfg.aging_us * 1000)
        self.max_age_ns = cfg.max_age_us * 1000
        self.policy = cfg.policy
        self.max_wait_ns = cfg.max_wait_us * 1000
        self.class_by_slot_kind = class_by_slot_kind
        self.max_class = cfg.classes - 1
        self.honour_message_priority = cfg.honour_message_priority
        self.adaptive = (AdaptiveWait(self.max_wait_ns, cfg.latency_objective_us * 1000, cfg.max_batch)
                         if cfg.policy == "adaptive" else None)

        cap = cfg.capacity
        self.capacity = cap
        # request table, indexed by request id: numpy columns (push_columns scatters into them; a
        # large step's answers gather from `request_table` at once: Stepper._answer_columns) and a
        # memoryview of each for the scalar code (module docstring). Written through at start-up
        # (np.zeros maps pages lazily): the first pushes would otherwise fault the table in on the
        # hot path (the first event's push ~0.6 ms more on the dev VM, past a 5 ms deadline in
        # tests on a loaded VM; BENCHMARKS.md wave 40)
        self.request_table = np.empty((len(REQUEST_ROWS), cap), np.int64)
        self.request_table.fill(0)
        self._r = {name: self.request_table[i] for i, name in enumerate(REQUEST_ROWS)}
        self._r["seq"] = self.request_table.view(np.uint64)[ROW["seq"]]
        self._r["stale"] = np.empty(cap, np.bool_)
        self._r["stale"].fill(False)
        self.request_columns = self._r  # by name: the rows above, and stale
        r = {name: memoryview(col) for name, col in self._r.items()}
        self.r_slot, self.r_pos, self.r_seq, self.r_cls = r["slot"], r["pos"], r["seq"], r["cls"]
        self.r_recv_ns = r["recv_ns"]  # perf_counter_ns at receive
        self.r_origin_ns = r["origin_ns"]  # perf_counter_ns the deadline counts from (send time, else receive)
        self.r_send_epoch_ns = r["send_epoch_ns"]  # publisher's ts_send_ns (echoed in the decision)
        self.r_nconf, self.r_stale = r["nconf"], r["stale"]
        self._free = list(range(cap - 1, -1, -1))

        # per slot
        self._s_queued = np.zeros(n_slots, np.bool_)
        self._s_enq_ns = np.zeros(n_slots, np.int64)
        self.s_queued = memoryview(self._s_queued)
        self.s_enq_ns = memoryview(self._s_enq_ns)  # aging base of the slot's FIFO entry
        self.s_rid = [NO_REQUEST] * n_slots  # conflating: the one pending request
        self.max_pending = cfg.max_pending_per_instrument
        # admission (module docstring): events a slot may queue, and the pace that sets it
        self.admit_depth = self.max_pending
        self.deadline_admission = sequential and cfg.admission == "deadline"
        self.step_period_ns = 0
        self.place_ns = 0  # the wait one place in a slot's queue means: period x rounds (0: not measured)
        self._admit_budget_ns = self.max_age_ns * 7 // 8
        # max_age less the learned margin (module docstring; `admit_margin_ns` derives the margin
        # from it): the ingest sheds LATE an event older than this less its expected wait
        self.admit_age_ns = self.max_age_ns
        self._t_last_batch = 0
        self._backlogged = False
        if sequential:
            # each slot's FIFO of request ids: a ring of max_pending, one row of a 2-D array
            # (`_s_ring_flat`: push_columns's scatter) seen as a memoryview per slot
            m = self.max_pending
            self._s_ring = np.zeros((n_slots, m), np.int64)
            self._s_ring_flat = self._s_ring.reshape(-1)
            self.s_ring = [memoryview(row) for row in self._s_ring]
            self._s_head = np.zeros(n_slots, np.int64)
            self._s_len = np.zeros(n_slots, np.int64)
            self.s_head = memoryview(self._s_head)
            self.s_len = memoryview(self._s_len)

        # class FIFOs of slots (a slot is in at most one FIFO, so n_slots suffices)
        self.q_buf = [[0] * n_slots for _ in range(cfg.classes)]
        self.q_head = [0] * cfg.classes
        self.q_len = [0] * cfg.classes
        self._n_slots = n_slots

        # outputs of form_batch (preallocated; valid until the next call)
        self.batch_rids = [0] * cfg.max_batch
        self.shed_rids = [0] * max(cap, 1)
        self.n_shed = 0
        self.stale_picks = 0  # sequential: requests of the last batch already stale when picked
        self._requeue = [0] * cfg.max_batch

        # counters
        self.pending = 0  # requests queued and not yet in a formed batch
        self.queued_slots = 0
        self.conflated = 0

    # ------------------------------------------------------------------ push

    def class_of(self, slot: int, kind: int, message_priority: int) -> int:
        if message_priority >= 0 and self.honour_message_priority:
            return message_priority if message_priority <= self.max_class else self.max_class
        return self.class_by_slot_kind[kind][slot]

    def _enqueue_slot(self, slot: int, cls: int, enq_ns: int) -> None:
        n = self.q_len[cls]
        buf = self.q_buf[cls]
        buf[(self.q_head[cls] + n) % self._n_slots] = slot
        self.q_len[cls] = n + 1
        self.s_queued[slot] = True
        self.s_enq_ns[slot] = enq_ns
        self.queued_slots += 1

    def push(self, slot: int, pos: int, seq: int, cls: int, recv_ns: int, origin_ns: int,
             send_epoch_ns: int, stale: bool = False, superseded: int = 0) -> int:
        """Queue an event. Returns the request id, or NO_REQUEST if there is no room (the caller
        sheds it as QUEUE_FULL); a conflated predecessor is counted in `conflated` and in the
        request's n_conflated. `origin_ns` is what the deadline counts from; `stale` (sequential
        only) queues an event that is already past it: its row is applied, its decision withheld.
        `superseded` (conflating only): earlier events of the slot that the ingest conflated
        into this one within its burst, counted here as conflated and in n_conflated; on
        NO_REQUEST they are not counted (the caller counts them with `count_conflated`)."""
        if self.conflate:
            rid = self.s_rid[slot]
            if rid != NO_REQUEST:
                self.r_pos[rid] = pos
                self.r_seq[rid] = seq
                self.r_recv_ns[rid] = recv_ns
                self.r_origin_ns[rid] = origin_ns
                self.r_send_epoch_ns[rid] = send_epoch_ns
                nconf = self.r_nconf[rid] + 1 + superseded
                self.r_nconf[rid] = nconf if nconf < NCONF_MAX else NCONF_MAX
                self.conflated += 1 + superseded
                return rid
        elif self.s_len[slot] >= self.admit_depth:
            return NO_REQUEST
        if not self._free:
            return NO_REQUEST
        rid = self._free.pop()
        self.r_slot[rid] = slot
        self.r_pos[rid] = pos
        self.r_seq[rid] = seq
        self.r_cls[rid] = cls
        self.r_recv_ns[rid] = recv_ns
        self.r_origin_ns[rid] = origin_ns
        self.r_send_epoch_ns[rid] = send_epoch_ns
        self.r_nconf[rid] = superseded if superseded < NCONF_MAX else NCONF_MAX
        self.conflated += superseded
        self.r_stale[rid] = stale
        self.pending += 1
        if self.conflate:
            self.s_rid[slot] = rid
            self._enqueue_slot(slot, cls, recv_ns)
        elif self.sequential:
            n = self.s_len[slot]
            self.s_ring[slot][(self.s_head[slot] + n) % self.max_pending] = rid
            self.s_len[slot] = n + 1
            if not self.s_queued[slot]:
                self._enqueue_slot(slot, cls, recv_ns)
        else:
            raise AssertionError("scheduler needs conflate or sequential")
        return rid

    def push_many(self, events: list[tuple]) -> list[int]:
        """Sequential models: queue a chunk of events in order, exactly as `push(*event)` for
        each in turn would (the same request ids, table, slot and class FIFOs, aging bases and
        counters). An event is push's positional arguments, `(slot, pos, seq, cls, recv_ns,
        origin_ns, send_epoch_ns, stale)`. Returns the indices of the events refused (push's
        NO_REQUEST: the caller sheds them as QUEUE_FULL), in order; usually none.

        Nothing leaves the queues within a call, so a slot's room and the free ids only shrink:
        the events refused are, for each slot, its last ones in the chunk (and, once the ids run
        out, every later one). A caller can therefore take every event's position in advance,
        as if all were queued, and give back only the refused ones'.

        The events up to the first one that push might refuse (its slot full, or no id left for
        it) are queued by `push_in_order` (one loop, no call per event: ~0.4-0.8 µs saved each on
        the dev VM); from there the rest go through `push` itself, so that refusal is decided in
        one place. tests/unit/test_scheduler_push_many.py holds the two to the same state."""
        if not self.sequential:
            raise ValueError("push_many: sequential models only")
        k = len(events)
        done = self.push_in_order(*zip(*events)) if k else 0
        if done == k:
            return []
        push = self.push
        return [j for j in range(done, k) if push(*events[j]) == NO_REQUEST]

    def push_in_order(self, slots, positions, seqs, classes, recvs_ns, origins_ns, sends_epoch_ns, stales) -> int:
        """Sequential models: queue events given as columns (sequences of push's arguments, in
        feed order) as `push` for each in turn would, up to the first one push might refuse (its
        slot full, or no request id left); returns how many were queued. push_many's loop (the
        per-frame path's chunks, lists of Python values); the EventBatch column path, whose caller
        checked `room` and `free_requests` first, uses `push_columns`."""
        k = len(slots)
        free = self._free
        nf = len(free)
        take = k if k <= nf else nf
        rids = free[nf - take:]
        rids.reverse()  # the order push pops them in
        del free[nf - take:]
        max_pending, depth = self.max_pending, self.admit_depth
        s_len, s_head, s_ring, s_queued = self.s_len, self.s_head, self.s_ring, self.s_queued
        r_slot, r_pos, r_seq, r_cls = self.r_slot, self.r_pos, self.r_seq, self.r_cls
        r_recv, r_origin, r_send, r_nconf, r_stale = (self.r_recv_ns, self.r_origin_ns, self.r_send_epoch_ns,
                                                      self.r_nconf, self.r_stale)
        done = take
        for j, (rid, slot, pos, seq, cls, recv_ns, origin_ns, send_ns, stale) in enumerate(
                zip(rids, slots, positions, seqs, classes, recvs_ns, origins_ns, sends_epoch_ns, stales)):
            n = s_len[slot]
            if n >= depth:  # push may refuse it: the caller decides it and the rest
                done = j
                break
            r_slot[rid] = slot
            r_pos[rid] = pos
            r_seq[rid] = seq
            r_cls[rid] = cls
            r_recv[rid] = recv_ns
            r_origin[rid] = origin_ns
            r_send[rid] = send_ns
            r_nconf[rid] = 0
            r_stale[rid] = stale
            s_ring[slot][(s_head[slot] + n) % max_pending] = rid
            s_len[slot] = n + 1
            if not s_queued[slot]:
                self._enqueue_slot(slot, cls, recv_ns)
        self.pending += done
        if done < take:
            free.extend(reversed(rids[done:]))  # the ids not used, back as push would find them
        return done

    def push_columns(self, slots, positions, seqs, classes, recvs_ns, origins_ns, sends_epoch_ns, stales,
                     runs: tuple | None = None) -> None:
        """Sequential models: queue events given as numpy columns (push's arguments, in feed
        order; `stales` bool), every one of which the caller found room for (`rooms`,
        `free_requests`: the EventBatch column path, ingest_batch.py), leaving the state that
        `push` for each in turn would: the same request ids, table, slot rings and class
        FIFOs, aging bases and counters (tests/unit/test_scheduler_push_many.py). Each column is
        one numpy scatter and the slots' rings one more; Python runs per class, not per event.
        `runs`: the events' `slot_runs`, when the caller has them (the column path sorts its run
        by slot anyway: ~13 µs of numpy a call saved on the dev VM). Raises ValueError, having
        changed nothing, if an event does not fit."""
        k = len(slots)
        if k == 0:
            return
        uniq, counts, rank = slot_runs(slots) if runs is None else runs
        queued = self._s_len.take(uniq)
        free = self._free
        nf = len(free)
        if k > nf or (counts > self._rooms_of(queued)).any():
            raise ValueError("push_columns: an event beyond its slot's room or the free request ids")
        rids = np.array(free[nf - k:], dtype=np.int64)[::-1]  # the ids push would pop, in its order
        del free[nf - k:]
        slots = slots.astype(np.int64, copy=False)  # int16 from the column path: slot * max_pending overflows it
        mp = self.max_pending
        # each event's place in its slot's ring: behind what was queued, then its rank in the call
        ring_at = self._s_head.take(slots) + self._s_len.take(slots) + rank
        np.remainder(ring_at, mp, out=ring_at)
        self._s_ring_flat[slots * mp + ring_at] = rids
        self._s_len[uniq] = queued + counts
        r = self._r
        for name, col in (("slot", slots), ("pos", positions), ("seq", seqs), ("cls", classes),
                          ("recv_ns", recvs_ns), ("origin_ns", origins_ns), ("send_epoch_ns", sends_epoch_ns),
                          ("stale", stales)):
            r[name][rids] = col
        r["nconf"][rids] = 0
        self.pending += k
        # the slots this call queues anew go to the end of their class FIFOs in the feed order of
        # their first events (rank 0), each at that event's class and receive time (as push would)
        firsts = np.flatnonzero(rank == 0)
        firsts = firsts[~self._s_queued.take(slots.take(firsts))]
        if not len(firsts):
            return
        new_slots, new_cls = slots.take(firsts), classes.take(firsts)
        self._s_queued[new_slots] = True
        self._s_enq_ns[new_slots] = recvs_ns.take(firsts)
        self.queued_slots += len(firsts)
        nslots = self._n_slots
        # the classes present, by bincount: np.unique's first call in a process imports numpy.ma
        # (numpy 2.4's _unique1d asks np.ma.is_masked), 7-11 ms on the dev VM in a service's first
        # EventBatch burst -- a stall at every feed's start (tests/integration/test_first_burst.py)
        by_class = ((0, new_slots),) if self.classes == 1 else (
            (c, new_slots[new_cls == c]) for c in np.flatnonzero(np.bincount(new_cls)).tolist())
        for c, slots_c in by_class:
            part = slots_c.tolist()
            buf, n = self.q_buf[c], self.q_len[c]
            at = (self.q_head[c] + n) % nslots
            split = nslots - at  # the FIFO's ring wraps after this many
            buf[at:at + len(part)] = part[:split]
            if len(part) > split:
                buf[:len(part) - split] = part[split:]
            self.q_len[c] = n + len(part)

    def room(self, slot: int) -> int:
        """Sequential: events `slot` can still queue before push refuses it."""
        room = self.admit_depth - self.s_len[slot]
        return room if room > 0 else 0  # the depth may have shrunk below what is queued

    def rooms(self, slots) -> np.ndarray:
        """`room` of each of `slots` (a list or an int array), as one int64 array (the EventBatch
        column path: a method call per slot cost more than the rest of a short run's per-slot work)."""
        return self._rooms_of(self._s_len.take(slots))

    def _rooms_of(self, queued: np.ndarray) -> np.ndarray:
        room = self.admit_depth - queued
        return np.maximum(room, 0, out=room)  # the depth may have shrunk below what is queued

    def free_requests(self) -> int:
        """Request ids not handed out: events that can be queued before push refuses for want of one."""
        return len(self._free)

    def count_conflated(self, n: int) -> None:
        """Events conflated into a trigger that was shed at ingest (stale, or no room): the
        scheduler owns the conflated counter, whoever did the conflating."""
        self.conflated += n

    # ------------------------------------------------------------------ pick

    def _pick_class(self) -> int:
        """Class whose head has the best aged priority; -1 if all FIFOs are empty."""
        best = -1
        best_key = 0
        aging = self.aging_ns
        q_len, q_buf, q_head, enq = self.q_len, self.q_buf, self.q_head, self.s_enq_ns
        for c in range(self.classes):
            if q_len[c]:
                key = enq[q_buf[c][q_head[c]]] + c * aging
                if best < 0 or key < best_key:
                    best, best_key = c, key
        return best

    def oldest_enqueue_ns(self) -> int:
        """Enqueue time of the longest-waiting queued slot (0 if none)."""
        oldest = 0
        for c in range(self.classes):
            if self.q_len[c]:
                t = self.s_enq_ns[self.q_buf[c][self.q_head[c]]]
                if oldest == 0 or t < oldest:
                    oldest = t
        return oldest

    def batch_due_ns(self, now_ns: int) -> int:
        """0 if a batch should be formed now, else the time (ns) at which it will be due;
        -1 if nothing is queued."""
        if self.queued_slots == 0:
            return -1
        if self.policy == "greedy" or self.queued_slots >= self.max_batch:
            return 0
        wait = self.max_wait_ns if self.adaptive is None else self.adaptive.current_wait_ns(self.queued_slots)
        due = self.oldest_enqueue_ns() + wait
        return 0 if due <= now_ns else due

    def current_wait_ns(self) -> int:
        if self.policy == "greedy":
            return 0
        return self.max_wait_ns if self.adaptive is None else self.adaptive.current_wait_ns(self.queued_slots)

    def form_batch(self, now_ns: int, force: bool = False) -> int:
        """Pick up to max_batch requests by aged priority, shedding stale ones.

        Fills `batch_rids[:n]` and returns n; stale requests of conflating
        models go to `shed_rids[:n_shed]` (the caller answers and releases
        them); stale requests of sequential models stay in the batch with
        `r_stale` set. `force` ignores the batching policy's wait (drain).
        """
        self.n_shed = 0
        if not force and self.batch_due_ns(now_ns) != 0:
            return 0
        self.stale_picks = 0
        queued_before = self.queued_slots
        if self.sequential:
            n = self._take_every_slot(now_ns) if queued_before <= self.max_batch else \
                self._take_head_of_one_class(now_ns)
            if n:
                if self.deadline_admission:
                    self._pace(now_ns, self.queued_slots > 0, queued_before)
                return n
        n = 0
        n_requeue = 0
        max_age = self.max_age_ns
        q_len, q_buf, q_head = self.q_len, self.q_buf, self.q_head
        nslots = self._n_slots
        while n < self.max_batch:
            c = self._pick_class()
            if c < 0:
                break
            h = q_head[c]
            slot = q_buf[c][h]
            q_head[c] = (h + 1) % nslots
            q_len[c] -= 1
            self.queued_slots -= 1
            self.s_queued[slot] = False
            if self.conflate:
                rid = self.s_rid[slot]
                self.s_rid[slot] = NO_REQUEST
                if now_ns - self.r_origin_ns[rid] > max_age:
                    self.shed_rids[self.n_shed] = rid
                    self.n_shed += 1
                    self.pending -= 1
                    continue
            else:
                head = self.s_head[slot]
                rid = self.s_ring[slot][head]
                self.s_head[slot] = (head + 1) % self.max_pending
                self.s_len[slot] -= 1
                if self.s_len[slot]:
                    self._requeue[n_requeue] = slot
                    n_requeue += 1
                if now_ns - self.r_origin_ns[rid] > max_age:
                    self.r_stale[rid] = True
                    self.stale_picks += 1
            self.batch_rids[n] = rid
            self.pending -= 1
            n += 1
        for i in range(n_requeue):
            slot = self._requeue[i]
            nxt = self.s_ring[slot][self.s_head[slot]]
            self._enqueue_slot(slot, self.r_cls[nxt], now_ns)
        if self.deadline_admission and n:
            self._pace(now_ns, self.queued_slots > 0, queued_before)  # slots left: the next batch is due at once
        return n

    def _take_every_slot(self, now_ns: int) -> int:
        """Sequential, every queued slot fits in the batch (the usual case: instruments <=
        max_batch): the batch is each queued slot's oldest request, in the order the pick loop
        would take them, without its per-pick class scan (~2x less per request on the dev VM).
        That order is the head-by-head merge of the class FIFOs by aged key (ties: the lower
        class); with each FIFO in key order, as enqueue times make it, that merge is a stable
        sort of the FIFOs laid end to end in class order. Returns 0, having changed nothing,
        when a FIFO is out of key order (the pick loop decides then)."""
        q_len, q_buf, q_head, enq = self.q_len, self.q_buf, self.q_head, self.s_enq_ns
        nslots = self._n_slots
        parts = []
        for c in range(self.classes):
            k = q_len[c]
            if k:
                h, buf = q_head[c], q_buf[c]
                e = h + k
                parts.append((c, buf[h:e] if e <= nslots else buf[h:] + buf[:e - nslots]))
        if len(parts) == 1:
            order = parts[0][1]
        else:
            keyed = []
            aging = self.aging_ns
            for c, part in parts:
                base = c * aging
                keys = [enq[slot] + base for slot in part]
                if keys != sorted(keys):
                    return 0
                keyed += zip(keys, part)
            keyed.sort(key=_KEY)  # stable: equal keys keep class order, then FIFO order
            order = [slot for _, slot in keyed]
        for c, _ in parts:
            q_head[c] = (q_head[c] + q_len[c]) % nslots
            q_len[c] = 0
        return self._take_slots(order, now_ns)

    def _take_head_of_one_class(self, now_ns: int) -> int:
        """Sequential, more slots queued than a batch holds, all in one class (the usual case past
        capacity over many instruments): the pick loop would take that FIFO's first max_batch
        slots in order; they are taken as one slice (dev VM, 300 queued slots: ~40 -> ~9 µs per
        batch of 64). 0, having changed nothing, when more than one class is queued."""
        q_len = self.q_len
        queued = [c for c in range(self.classes) if q_len[c]]
        if len(queued) != 1:
            return 0
        c = queued[0]
        k = self.max_batch
        nslots = self._n_slots
        h, buf = self.q_head[c], self.q_buf[c]
        e = h + k
        order = buf[h:e] if e <= nslots else buf[h:] + buf[:e - nslots]
        self.q_head[c] = e % nslots
        q_len[c] -= k
        return self._take_slots(order, now_ns)

    def _take_slots(self, order: list[int], now_ns: int) -> int:
        """The batch is the oldest request of each slot in `order` (already out of the class
        FIFOs); slots with more requests go back to the end of their class's FIFO."""
        q_len, q_buf, q_head, enq = self.q_len, self.q_buf, self.q_head, self.s_enq_ns
        nslots = self._n_slots
        n = len(order)
        self.queued_slots -= n
        self.pending -= n
        s_queued, s_head, s_len, s_ring = self.s_queued, self.s_head, self.s_len, self.s_ring
        r_origin, r_stale, rids = self.r_origin_ns, self.r_stale, self.batch_rids
        mp, max_age = self.max_pending, self.max_age_ns
        requeue = []
        stale = 0
        for i, slot in enumerate(order):
            s_queued[slot] = False
            head = s_head[slot]
            rid = s_ring[slot][head]
            s_head[slot] = (head + 1) % mp
            left = s_len[slot] - 1
            s_len[slot] = left
            if left:
                requeue.append(slot)
            if now_ns - r_origin[rid] > max_age:
                r_stale[rid] = True
                stale += 1
            rids[i] = rid
        # back to the end of their classes' FIFOs (_enqueue_slot's stores, without its call)
        r_cls = self.r_cls
        for slot in requeue:
            c = r_cls[s_ring[slot][s_head[slot]]]
            k = q_len[c]
            q_buf[c][(q_head[c] + k) % nslots] = slot
            q_len[c] = k + 1
            s_queued[slot] = True
            enq[slot] = now_ns
        self.queued_slots += len(requeue)
        self.stale_picks += stale
        return n

    @property
    def admit_margin_ns(self) -> int:
        """Deadline admission's learned margin on the expected wait (module docstring)."""
        return self.max_age_ns - self.admit_age_ns

    @admit_margin_ns.setter
    def admit_margin_ns(self, margin_ns: int) -> None:
        self.admit_age_ns = self.max_age_ns - margin_ns

    def _pace(self, now_ns: int, backlogged: bool, queued_before: int) -> None:
        """Deadline admission: the period between batches while backlogged (a batch formed
        when some slot held more than one event is followed by the next as soon as the
        engine takes one), and the depth it allows (module docstring). Periods measured
        without a backlog say how often events arrive, not how fast they are stepped, except
        that one shorter than the estimate shows the estimate too long (after a stall made it
        so, admit_depth may be 1, and no slot can then be backlogged to correct it)."""
        p = self.step_period_ns
        sample = now_ns - self._t_last_batch
        # a period without a backlog is an upper bound of the pace (the service kept up with it):
        # it may only pull an estimate down, so one stall cannot leave admission tight for good
        if self._backlogged or 0 < sample < p:
            self.step_period_ns = sample if p == 0 else p + (sample - p) // 8
        self._backlogged = backlogged
        self._t_last_batch = now_ns
        p = self.step_period_ns
        # the margin (module docstring): a quarter period more for a batch that picked stale
        # events, at most half of max_age; a 32nd less for one that picked none
        m = self.admit_margin_ns
        if self.stale_picks:
            m = min(m + (p >> 2), self.max_age_ns >> 1)
        else:
            m -= m >> 5
        self.admit_margin_ns = m
        if p > 0:
            rounds = -(-queued_before // self.max_batch)  # batches between two picks of one slot
            self.place_ns = p * rounds
            depth = self._admit_budget_ns // self.place_ns
            self.admit_depth = 1 if depth < 1 else (depth if depth < self.max_pending else self.max_pending)

    def queue_wait_ns(self, slot: int) -> int:
        """Deadline admission: the expected wait of an event joining `slot`'s queue, (queued + 1/2)
        places; for an empty queue, `turn_wait_ns` (module docstring). Ingest._handle inlines it
        per event of a chunk, counting the chunk's own events."""
        queued = self.s_len[slot]
        return queued * self.place_ns + (self.place_ns >> 1) if queued else self.turn_wait_ns()

    def run_waits_ns(self, uniq, group: np.ndarray, rank: np.ndarray, first: np.ndarray):
        """Deadline admission for a run of events queued together (ingest_batch.py's column path),
        as `queue_wait_ns` would judge each one live, counting the run's earlier events as queued
        (a bound: an earlier one may yet be shed): an event `rank` places into its slot's events
        of the run waits (queued + rank + 1/2) places behind a queue, and `turn_wait_ns` with the
        slots the run queues anew before its slot, plus rank places, on a slot the run queues
        anew. `group`: each event's slot as an index into `uniq`; `first`: the feed index of
        each slot's first event. None before a pace is measured (nothing is late by its turn).
        Judging a whole run against the queues as they were before it (until 2026-12-04) let a
        run of hundreds of new slots in at once, stale by their turn: in a simulation at 5x
        capacity over 1,024 slots it decided 31 % of the capacity."""
        p, place = self.step_period_ns, self.place_ns
        if not (p or place):
            return None
        queued = self._s_len.take(uniq)
        anew = np.flatnonzero(queued == 0)
        ahead = np.zeros(len(uniq), dtype=np.int64)  # slots this run queues anew before this one
        ahead[anew[np.argsort(first[anew], kind="stable")]] = np.arange(len(anew))
        turns = (self.queued_slots + ahead) // self.max_batch
        base = np.where(queued == 0, np.where(turns > 0, p * turns + (p >> 1), 0), queued * place + (place >> 1))
        return base[group] + rank * place

    def turn_wait_ns(self, ahead: int = 0) -> int:
        """Deadline admission: the wait of an event that queues a slot anew behind the slots
        queued now (and `ahead` more that its chunk queues first): one period per full batch of
        them, plus half a period, the expected time to the next batch in a busy loop; none while
        fewer than a batch are queued (the next batch takes it, and at low load it forms as soon
        as the event is read)."""
        turns = (self.queued_slots + ahead) // self.max_batch
        return self.step_period_ns * turns + (self.step_period_ns >> 1) if turns else 0

    def release(self, rid: int) -> None:
        """Return a request id to the free list once its outcome is published."""
        self._free.append(rid)

    def release_many(self, rids) -> None:
        """`release` for each of `rids` (a step's, in one C call)."""
        self._free.extend(rids)

    def live_requests(self) -> int:
        """Request ids handed out and not yet released: queued, in a formed batch, or in flight.
        Counted from the free list, independently of the service's outcome counters, so the
        accounting identity `received = decided + shed + conflated + rejected + live` is a
        real check (tests and the final Status rely on it)."""
        return self.capacity - len(self._free)
