"""The step phase of the hot loop: form a batch, stage and submit it, collect it, answer it.

Owned by the Service (service.py), which calls, once per loop iteration:

    stepper.ingest()      a burst of the feed, within what in-flight steps allow
    stepper.complete()    when engine.poll() says the oldest in-flight step is done
                          (with runner.chain_steps, each done step in turn)
    stepper.submit()      when the engine can take a step and the scheduler has one due
    stepper.submit_chained()  runner.chain_steps: more steps while the engine takes one and
                          slots are still queued
    stepper.flush()       everything answered this iteration, in one egress flush

Chaining (`runner.chain_steps`, off by default; the GPU engines only: a CPU engine's submit runs
the step, and a worker's loop sleeps while one is in flight). A stateful model's step takes one
event of each queued instrument, so an instrument whose events/s pass the loop's iterations/s
fell behind by the difference, and deadline admission shed it LATE: at 11 lstm_a shards x 92k
events/s on an H100 host the shed sat in the shards holding the busiest instruments (5.8k and
4.4k events/s against 2-3.7k steps/s). Chained, the iteration submits steps until the engine is
full (runner.max_inflight) or nothing is queued, each taking the backlogged instruments' next
events (a step's device work is ordered after the one before it on the engine's stream, so an
instrument may be in several steps in flight). On three H100 hosts, alternated, 11 EventBatch
shards chained decided 898-966k/s against 802-958k one step an iteration (+1 to +12 %), and on a
fourth 1,002,550-1,007,693 (shed under 1 %) against 965-996k (wave 32); one gpu.toml
service over per-event frames decided 57k/s against 97k at 100k offered (more steps, each with its
host cost, on a loop already short of time) and shed every event LATE in one of two runs at 200k
(BENCHMARKS.md wave 31): a choice per deployment, off by default.

Steps complete in submission order (a FIFO of `_Batch`). While a step is in
flight on an engine that reads the feature ring while in flight
(`runner.cpu_worker`), the loop ingests at most `inflight_rows` events beyond
what it had when that step was submitted: the ring is sized for it
(runner/select.py), so no row the step reads is overwritten; past that the
loop waits for the step. The burst budget is in frames, which bounds events
only for single-event frames; `make_room` (called by the ingest with a
burst's exact event count, after decoding and before any row is written)
waits for the steps in flight when an EventBatch burst would pass the
allowance (before 2026-12-03 it could, and `replay --verify` found the
worker's scores wrong). The GPU engines copy a step's rows into their
staging at submit and need no guard. Bursts read while a step is in flight are also shorter,
`max(16, ingest.max_drain // 8)` frames (32 by default): the loop looks at
the step again after each, so a finished step is collected, answered and
followed by the next within ~100 µs of ingest rather than a whole burst's
(measured on the H200 host at c9b1e7d, lstm_a at 100k events/s: with bursts of
256 while in flight the `step` stage was p50 1.2 ms against a 153 µs batch-64
step, and the sequential model, one event per instrument per step, stepped
only ~25k rows/s). Stage samples are recorded per step or per burst, as
Python list extends (metrics.SampleBuffer): no numpy call per step, except in a
step of ANSWER_COLUMNS_MIN requests or more, whose answers are numpy columns
gathered from the scheduler's request table in one `take` and kept as they are
until the flush joins them into the frame (egress.Answers' blocks), and whose
samples are differences worked out at the fold (SampleBuffer.add_differences):
in the loop each numpy call costs ~1-2 µs on the dev VM, several times its
cost in a tight run of them, so the count of calls is what a step pays
(fixed costs that a large step's per-answer Python outweighs).

Coalescing (`ingest.coalesce_us`, `feed_due`): while a full batch is already queued (max_batch
rows, or three quarters of the shard's slots where that is fewer), reading more of the feed
changes little of what the next step takes, so the loop reads it at most once per `coalesce_ns`,
in one burst of what arrived. A burst's cost is mostly fixed (an EventBatch column run: ~100-200
µs on the dev VM however few events it holds, tools/bench_hotpath.py --run-sizes; ~470 µs after
the graph step on an H100 host's core), and a loop past capacity otherwise reads the feed every
iteration. The hold counts from the last read that emptied the socket, so only a value past one
loop iteration holds anything: a saturated lstm_a shard's iteration is ~1.2 ms on the GPU hosts,
and gpu.toml's 2500 µs doubled its decided/s (BENCHMARKS.md wave 24) where wave 18's 250 and
1000 held almost no read. A shard whose active instruments are fewer than a full batch never
queues one (12 shards of ~85 instruments: steps of 37-64 rows, 140-306 reads held in 2.5 s), so
past capacity -- no read has found the socket empty for coalesce_ns, which a loop below capacity
does between events -- the read is also held while at least half as many slots are queued as the
last step took: the next step is about as full without it. That branch also needs the last step to
have taken at least half a full batch: "no empty read for coalesce_ns" alone is a weak sign of
overload where a loop iteration is about as long as the gap between events (gpu.toml at 10k/s: one
event a read, steps of 1-2 rows), and one stall then started holds that cost the held events up to
coalesce_ns each (an H100 host, 6337b05: 121 holds, the `service` stage p50 224 against 97 µs
without coalescing, BENCHMARKS.md wave 25); past capacity steps are large. A burst that stopped at
its frame budget leaves the feed due at once (the socket may hold more).
"""

from __future__ import annotations

import collections
from operator import itemgetter

import numpy as np

from hft_infer.clock import perf_ns
from hft_infer.scheduler import ROW
from hft_infer.transport.schema import Outcome, Reason

DECIDED, SHED = int(Outcome.DECIDED), int(Outcome.SHED)
STALE, ENGINE_FAILURE = int(Reason.STALE), int(Reason.ENGINE_FAILURE)
# A step of at least this many requests is answered from the scheduler's request table as numpy
# columns (Stepper._answer_columns: ~10 numpy calls whatever the step's size, a fixed cost) rather
# than from Python tuples of it (_answer_step: ~0.4 µs an answer). Where the two cross depends on the
# host (`bench_hotpath.py --only-publish`): since the answers go in as blocks (BENCHMARKS.md wave 40)
# at ~12 on the H100 hosts (columns / tuples 0.99-1.04x at 8, 1.01-1.02x at 12, 0.91-0.95x at 16,
# 0.61-0.73x at 64), below 8 on the dev VM (0.93x at 8); 48 before (wave 35: ~20 numpy calls, ~46)
ANSWER_COLUMNS_MIN = 12
# the request table's rows an answer echoes (Scheduler.request_table)
_SLOT, _SEQ, _NCONF, _SEND, _RECV = (ROW[name] for name in ("slot", "seq", "nconf", "send_epoch_ns", "recv_ns"))


class _Batch:
    __slots__ = ("rids", "t_submit", "events_mark")

    def __init__(self, rids: list[int], t_submit: int, events_mark: int) -> None:
        self.rids, self.t_submit, self.events_mark = rids, t_submit, events_mark


class Stepper:
    def __init__(self, *, engine, sched, store, ingester, egress, acct, clock, stages, instrument_ids: list[int],
                 inflight_rows: int, max_drain: int, publish_shed: bool, coalesce_ns: int = 0,
                 read_gap_ns: int = 0) -> None:
        self.engine, self.sched, self.store = engine, sched, store
        self.ingester, self.egress, self.acct, self.clock = ingester, egress, acct, clock
        self.bufs = stages.buffers
        self.ids = instrument_ids
        self.inflight_rows = inflight_rows
        self.max_drain = max_drain
        self.inflight_drain = max(16, max_drain // 8)  # burst cap while a step is in flight (docstring)
        self.publish_shed = publish_shed
        # off for an engine whose steps run on a thread here (done_fd): that loop sleeps on the socket
        # while a step is in flight, and a held socket would wake it at once
        self.coalesce_ns = 0 if engine.done_fd is not None else coalesce_ns
        self.read_gap_ns = 0 if engine.done_fd is not None else read_gap_ns  # ingest.read_gap_us, as coalesce_ns
        # coalescing's "full batch": max_batch rows, or three quarters of the slots where a shard owns
        # fewer than max_batch / 0.75: a step takes one row per queued slot of a sequential model, and
        # every slot queued at once is rare under a skewed feed (12 shards of ~85 instruments at
        # max_batch 128 held no read in 2.5 s past capacity with "every slot", BENCHMARKS.md wave 24)
        self.full_batch = min(sched.max_batch, max(1, 3 * len(instrument_ids) // 4))
        self._last_read = 0  # when a burst last emptied the socket (coalescing)
        self._last_empty = 0  # when a read last found it empty: never, past capacity (coalescing)
        self._holding = False  # the feed is being left in the socket (coalescing)
        self.inflight: collections.deque[_Batch] = collections.deque()
        self.frames = 0  # frames ingested since start
        self.last_batch = 0
        self._service_recv: list[int] = []  # receive times of events decided since the last flush
        self._service_recv_cols: list[np.ndarray] = []  # ... of those answered as columns
        self.answer_columns_min = ANSWER_COLUMNS_MIN
        self._ids_u32 = np.array(instrument_ids, dtype=np.uint32)  # slot -> instrument id, as the wire's type
        self._t_collect = 0
        if engine.reads_ring_in_flight:
            ingester.before_rows = self.make_room

    def make_room(self, events: int) -> None:
        """Before a burst's rows are written, on an engine that reads the ring while a step is in
        flight: if the burst's events (exact, once decoded: an EventBatch frame carries many) would
        take the events ingested since the oldest in-flight step past the ring's allowance, wait for
        the steps in flight first. `ingest` budgets frames up front; this makes the bound exact."""
        if self.inflight and events > self.inflight_rows - (self.acct.received - self.inflight[0].events_mark):
            self.drain_inflight()

    def feed_due(self, now: int) -> bool:
        """Coalescing (module docstring): False while the socket was emptied less than coalesce_ns
        ago and a full batch is queued -- or, past capacity (no read has found the socket empty
        for coalesce_ns, and the last step took at least half a full batch), at least half as
        many slots as the last step took. With read_gap_ns (ingest.read_gap_us), also False past
        capacity by that measure (no empty read for read_gap_ns) while slots are queued, until
        read_gap_ns since the last read: the loop steps what is queued meanwhile (BENCHMARKS.md
        wave 33: more steps a second past capacity, not longer bursts)."""
        if (self.coalesce_ns and now - self._last_read < self.coalesce_ns and (
                self.sched.queued_slots >= self.full_batch
                or (self.sched.queued_slots * 2 >= self.last_batch and self.last_batch * 2 >= self.full_batch
                    and now - self._last_empty >= self.coalesce_ns))) or (
                self.read_gap_ns and now - self._last_read < self.read_gap_ns
                and now - self._last_empty >= self.read_gap_ns and self.sched.queued_slots):
            if not self._holding:  # one read put off (counted once, however many iterations it waits)
                self._holding = True
                self.acct.coalesced_reads += 1
            return False
        self._holding = False
        return True

    def ingest(self, now: int = 0) -> int:
        """One burst, within what in-flight steps allow the feature ring to take. `now`: the
        loop's clock, recorded as the last read when the burst emptied the socket (coalescing)."""
        budget = self.max_drain
        if self.inflight:
            budget = min(budget, self.inflight_drain)
        if self.inflight and self.engine.reads_ring_in_flight:
            # events (rows), not frames: an EventBatch frame carries many; rejected ones count too
            room = self.inflight_rows - (self.acct.received - self.inflight[0].events_mark)
            if room < budget:
                if room <= 0:  # the oldest step still reads rows the next burst could overwrite
                    self.complete(wait=True)
                    return 0
                budget = room
        n = self.ingester.drain(budget)
        if n < budget:
            self._last_read = now
            if not n:
                self._last_empty = now
        if n:
            self.frames += n
            self.bufs["ingest"].add(self.ingester.burst_ns)
            if self.inflight:
                self.acct.overlapped += n
        return n

    def submit_chained(self) -> int:
        """runner.chain_steps: after the iteration's step, more steps while the engine takes one
        and slots are still queued -- a stateful model's backlogged instruments (a step takes one
        event of each), or more slots than a batch holds. Returns the events submitted."""
        sched, engine = self.sched, self.engine
        total = 0
        while engine.can_submit and sched.queued_slots:
            n = self.submit(chained=True)
            if not n:
                break
            total += n
        return total

    def submit(self, force: bool = False, chained: bool = False) -> int:
        """Form a batch and submit it; returns its events (0: none due). A `chained` step (counted
        as one) leaves `last_batch` to the iteration's first: coalescing judges the loop by that
        one, and a chained step holds only what it left."""
        sched = self.sched
        n = sched.form_batch(perf_ns(), force=force)
        if sched.n_shed:
            self.answer_stale(sched.shed_rids[: sched.n_shed])
        if n == 0:
            return 0
        rids = sched.batch_rids[:n]
        slots, positions = self.engine.request()
        if n == 1:
            slots[0], positions[0] = sched.r_slot[rids[0]], sched.r_pos[rids[0]]
        else:
            g = itemgetter(*rids)
            slots[:n] = g(sched.r_slot)
            positions[:n] = g(sched.r_pos)
        t = perf_ns()
        self.engine.submit(n)
        self.inflight.append(_Batch(rids, t, self.acct.received))
        self.acct.batches += 1
        if chained:
            self.acct.chained_steps += 1
        else:
            self.last_batch = n
        if self.engine.done_at_submit:  # a CPU engine is done already: answer now
            while self.inflight and self.engine.poll():
                self.complete()
        return n

    def complete(self, wait: bool = False) -> None:
        """Collect the oldest in-flight step and answer its events."""
        engine = self.engine
        scores, actions = engine.finish() if wait else engine.collect()
        t = perf_ns()
        b = self.inflight.popleft()
        rids = b.rids
        if len(rids) == 1:
            self._answer_one(rids[0], b.t_submit, t, float(scores[0]), int(actions[0]))
            return
        sched = self.sched
        if len(rids) >= self.answer_columns_min:
            oldest = self._answer_columns(b.t_submit, rids, scores, actions)
        else:
            oldest = self._answer_rows(b.t_submit, rids, scores, actions)
        self.bufs["step"].values.append(t - b.t_submit)
        if oldest and sched.adaptive is not None:
            sched.adaptive.observe_batch(t - oldest)
        sched.release_many(rids)
        if not self._t_collect:
            self._t_collect = t

    def _answer_rows(self, t_submit: int, rids: list[int], scores, actions) -> int:
        """Answer a step of several requests from Python tuples of the scheduler's columns (a small
        step: `_answer_step`). Returns the oldest decided event's receive time (0: none decided)."""
        sched = self.sched
        g = itemgetter(*rids)
        cols = g(sched.r_slot), g(sched.r_seq), g(sched.r_nconf), g(sched.r_send_epoch_ns), g(sched.r_recv_ns)
        return self._answer_step(t_submit, cols, g(sched.r_stale), scores, actions)

    def _answer_columns(self, t_submit: int, rids: list[int], scores, actions) -> int:
        """`_answer_rows` for a large step (ANSWER_COLUMNS_MIN): every column a request echoes
        gathered from the scheduler's request table in one `take`, whatever the step's size, and
        the answers (a block of Answers: the gathered rows themselves where their bytes are the
        wire's) and stage samples taken in as buffers (no Python int per answer). A step holding
        stale rows (a non-conflating model's, applied with their decisions withheld) goes the
        tuple way. Returns the oldest decided event's receive time where an adaptive wait wants
        it (else 0)."""
        sched = self.sched
        idx = np.fromiter(rids, np.intp, len(rids))
        # a conflating model's stale requests are shed at pick, never stepped: only others look
        if not sched.conflate and np.count_nonzero(sched.request_columns["stale"].take(idx)):
            return self._answer_rows(t_submit, rids, scores, actions)
        req = sched.request_table.take(idx, axis=1)
        _, _, _, sends, ts_recv = echo = self._echoed(req)
        self.egress.answers.add_decided(*echo, scores, actions)
        recv = req[_RECV]
        self.acct.decided += len(recv)
        self._service_recv_cols.append(recv)
        bufs = self.bufs
        bufs["queue"].add_differences(t_submit, recv)
        bufs["wire"].add_differences(ts_recv, sends, unless_zero=True)  # an event without a send time has none
        return int(recv.min()) if sched.adaptive is not None else 0

    def _echoed(self, req: np.ndarray) -> tuple:
        """What an answer echoes of the requests `req` (request-table rows, one column a request, as
        `_answer_columns` gathers them): instrument ids, seq (its int64 row: the wire's uint64 bytes),
        n_conflated as uint32 (the scheduler saturates it as it counts), send time, receive time
        on the epoch clock."""
        return (self._ids_u32.take(req[_SLOT]), req[_SEQ], req[_NCONF].astype(np.uint32), req[_SEND],
                req[_RECV] + self.clock.offset_ns)

    def _answer_step(self, t_submit: int, cols: tuple, stales: tuple, scores, actions) -> int:
        """Answer a step of several requests (the scheduler's columns picked by request id) and
        record their queue and wire samples. Returns the oldest decided event's receive time (0:
        none decided)."""
        slots, seqs, nconfs, sends, recvs = cols
        offset = self.clock.offset_ns
        ids = self.ids
        a = self.egress.answers
        inst = [ids[s] for s in slots]
        ts_recv = [r + offset for r in recvs]
        if True in stales:  # sequential models apply stale rows but withhold their decisions
            a.add_columns(inst, seqs, [SHED if st else DECIDED for st in stales],
                          [STALE if st else 0 for st in stales],
                          [0 if st else int(x) for st, x in zip(stales, actions.tolist())],
                          [0.0 if st else x for st, x in zip(stales, scores.tolist())], nconfs, sends, ts_recv)
            fresh = [r for st, r in zip(stales, recvs) if not st]
            sent = [sd for st, sd in zip(stales, sends) if not st]
            self.acct.shed_some(STALE, len(recvs) - len(fresh))
        else:
            a.add_decided(inst, seqs, nconfs, sends, ts_recv, scores, actions)
            fresh, sent = recvs, sends
        self.acct.decided += len(fresh)
        if not fresh:
            return 0
        self._service_recv.extend(fresh)
        bufs = self.bufs
        # array.fromlist of a list: ~2x faster than array.extend of the same list, ~3x than of
        # an iterator (dev VM, 64 samples; comprehensions beat map() over bound methods here)
        bufs["queue"].values.fromlist([t_submit - r for r in fresh])
        bufs["wire"].values.fromlist([r + offset - sd for r, sd in zip(fresh, sent) if sd])
        return min(fresh)

    def _answer_one(self, rid: int, t_submit: int, t: int, score: float, action: int) -> None:
        """`complete` for a step of one request (the usual step at low rates): its scalars, with
        no column built for one value (complete: ~10 -> ~8 µs on the dev VM)."""
        sched = self.sched
        recv, send = sched.r_recv_ns[rid], sched.r_send_epoch_ns[rid]
        offset = self.clock.offset_ns
        stale = sched.r_stale[rid]
        bufs = self.bufs
        bufs["step"].values.append(t - t_submit)
        if stale:  # a sequential model's stale row: applied, its decision withheld
            self.egress.answers.add(self.ids[sched.r_slot[rid]], sched.r_seq[rid], SHED, STALE, 0, 0.0,
                                    sched.r_nconf[rid], send, recv + offset)
            self.acct.shed_some(STALE, 1)
        else:
            self.egress.answers.add(self.ids[sched.r_slot[rid]], sched.r_seq[rid], DECIDED, 0, action, score,
                                    sched.r_nconf[rid], send, recv + offset)
            self.acct.decided += 1
            self._service_recv.append(recv)
            bufs["queue"].values.append(t_submit - recv)
            if send:
                bufs["wire"].values.append(recv + offset - send)
            if sched.adaptive is not None:
                sched.adaptive.observe_batch(t - recv)
        sched.release(rid)
        if not self._t_collect:
            self._t_collect = t

    def answer_stale(self, rids: list[int]) -> None:
        """Requests of conflating models found stale when their turn came (no step for them)."""
        self.answer_shed(rids, STALE)

    def answer_shed(self, rids: list[int], reason: int) -> None:
        sched = self.sched
        self.acct.shed_some(reason, len(rids))
        if self.publish_shed and len(rids) >= self.answer_columns_min:  # as `_answer_columns`
            inst, seq, nconf, sends, ts_recv = self._echoed(
                sched.request_table.take(np.fromiter(rids, np.intp, len(rids)), axis=1))
            self.egress.answers.add_shed(inst, seq, reason, nconf, sends, ts_recv)
        elif self.publish_shed and rids:
            offset, ids = self.clock.offset_ns, self.ids
            slots, seqs, nconfs, sends, recvs = (
                [col[r] for r in rids] for col in (sched.r_slot, sched.r_seq, sched.r_nconf, sched.r_send_epoch_ns,
                                                   sched.r_recv_ns))
            self.egress.answers.add_shed([ids[s] for s in slots], seqs, reason, nconfs, sends,
                                         [r + offset for r in recvs])
        sched.release_many(rids)

    def flush(self) -> None:
        """Send this iteration's answers; record publish and service stages of the decided ones."""
        if not len(self.egress.answers):
            return
        t = perf_ns()
        self.egress.flush(t + self.clock.offset_ns)
        t_sent = perf_ns()
        if self._service_recv:
            self.bufs["service"].values.fromlist([t_sent - r for r in self._service_recv])
            self._service_recv.clear()
        if self._service_recv_cols:
            service = self.bufs["service"]
            for recv in self._service_recv_cols:
                service.add_differences(t_sent, recv)
            self._service_recv_cols.clear()
        if self._t_collect:
            self.bufs["publish"].add(t_sent - self._t_collect)
            self._t_collect = 0

    def reset_slots(self, slots: list[int]) -> None:
        """A Reset on the feed (cold): decide what is pending on the old state, then clear."""
        self.drain_inflight()
        while self.sched.queued_slots:
            self.submit(force=True)
            while self.inflight:
                self.complete(wait=True)
        self.engine.reset_slots(slots)
        self.store.reset_slots(slots)

    def shed_queued(self, reason: int) -> None:
        """Shed every queued request with `reason`, unstepped (a drain out of time or forced, an
        engine failure): never leave one unaccounted."""
        sched = self.sched
        saved = sched.max_age_ns
        sched.max_age_ns = -1  # everything is stale now: conflating models shed it at pick
        try:
            while sched.queued_slots:
                n = sched.form_batch(perf_ns(), force=True)
                if sched.n_shed:
                    self.answer_shed(sched.shed_rids[: sched.n_shed], reason)
                if n:  # the sequential discipline keeps stale requests in the batch
                    self.answer_shed(sched.batch_rids[:n], reason)
        finally:
            sched.max_age_ns = saved

    def drain_inflight(self) -> None:
        """Wait for and answer every step in flight (cold: resets, shutdown)."""
        while self.inflight:
            self.complete(wait=True)

    def abandon(self, reason: int = ENGINE_FAILURE) -> None:
        """The engine failed: its in-flight steps will never be collected; answer them and
        everything queued as shed with `reason`."""
        lost = [r for b in self.inflight for r in b.rids]
        self.inflight.clear()
        self.answer_shed(lost, reason)
        self.shed_queued(reason)
