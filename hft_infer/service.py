"""The hot loop: one thread, run to completion, on uvloop.

    while running:
        _drain_ingest()       recv -> decode -> validate -> FeatureStore.write -> Scheduler.push
        _step()               aged-priority batch -> Engine.step -> publish decisions
        _housekeeping()       when due: fold histograms, ship stats, Status, clocks, GC
        _idle()               busy: spin (yield to the loop every yield_interval_us)
                              hybrid: spin spin_budget_us, then sleep on the socket FD
                              event: sleep on the socket FD

Every event that is read ends as exactly one of decided, shed, conflated or
rejected; `Accounting.pending()` is what is still queued, 0 after `drain`.

Hot-path rules (STYLE.md): no per-event containers, logging or f-strings;
validation on the cold branch; bound methods and attributes hoisted into
locals in the per-frame loop; exceptions only for bad input.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys

import zmq

from hft_infer.clock import EpochClock, perf_ns
from hft_infer.config import Config, expand_endpoint
from hft_infer.egress import DecisionPublisher
from hft_infer.metrics import SERVICE_STAGES, StageHistograms, to_wire
from hft_infer.runner.select import build_runtime
from hft_infer.scheduler import NO_REQUEST, Scheduler
from hft_infer.transport import sockets
from hft_infer.transport.codec import IngressDecoder, topic_for, validate_quote, validate_trade
from hft_infer.transport.schema import Heartbeat, Kind, Outcome, Quote, Reason, Status, Trade
from hft_infer.transport.stats import Snapshot, encode_snapshot

KIND_QUOTE = int(Kind.QUOTE)
KIND_TRADE = int(Kind.TRADE)
DECIDED, SHED, REJECTED = int(Outcome.DECIDED), int(Outcome.SHED), int(Outcome.REJECTED)
N_REASONS = len(Reason)
# zmq constants as plain ints (pyzmq's enum flags build an enum per use).
_EVENTS, _POLLIN, _RCVMORE, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.RCVMORE), int(zmq.NOBLOCK)
# Idle folding of raw samples: often enough that a fold is small (a fold
# costs ~40 ns per sample), never in the middle of a burst.
IDLE_FOLD_NS = 50_000_000
DRAIN_QUIET_NS = 100_000_000  # on stop: the feed is drained once it has been silent this long


class Accounting:
    """Event outcome counters. received = decided + shed + conflated + rejected + pending."""

    __slots__ = ("received", "decided", "shed", "rejected", "by_reason", "seq_gaps", "seq_resets",
                 "heartbeats", "batches")

    def __init__(self) -> None:
        self.received = 0
        self.decided = 0
        self.shed = 0
        self.rejected = 0
        self.by_reason = [0] * N_REASONS  # rejections and shed reasons
        self.seq_gaps = 0
        self.seq_resets = 0
        self.heartbeats = 0
        self.batches = 0


class Service:
    def __init__(self, cfg: Config, *, log=None) -> None:
        self.cfg = cfg
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        ids = cfg.universe.owned_ids()
        self.instrument_ids = ids
        self.slot_of = {iid: s for s, iid in enumerate(ids)}
        self.n_slots = len(ids)

        rt = build_runtime(cfg, self.n_slots)
        self.model_version = rt.model_version
        self.store = rt.store
        self.engine = rt.engine
        self.levels = rt.model.spec.levels
        self.sched = Scheduler(cfg.scheduler, self.n_slots, sequential=rt.sequential, conflate=rt.conflate,
                               class_by_slot_kind=self._class_table(cfg, ids))
        self.acct = Accounting()
        self.clock = EpochClock()
        m = cfg.metrics
        self.stages = StageHistograms(SERVICE_STAGES, m.sample_capacity, m.highest_trackable_us * 1000,
                                      m.significant_digits)
        self._last_seq = [-1] * self.n_slots
        self._decode = IngressDecoder().decode
        self._stop_requested = False
        self._intake_closed = False
        self._fd_future: asyncio.Future | None = None
        self.ctx: zmq.Context | None = None
        self.endpoints: dict[str, str] = {}
        self.started_epoch_ns = 0
        self.placement: dict[str, str] = {}

    # ------------------------------------------------------------ set-up

    @staticmethod
    def _class_table(cfg: Config, ids: list[int]) -> list[list[int]]:
        sc = cfg.scheduler
        by_kind = [sc.class_by_kind.get("quote", sc.default_class), sc.class_by_kind.get("trade", sc.default_class)]
        table = [[by_kind[k]] * len(ids) for k in (KIND_QUOTE, KIND_TRADE)]
        for key, cls in sc.class_by_instrument.items():
            iid = int(key)
            if iid in ids:
                slot = ids.index(iid)
                table[KIND_QUOTE][slot] = cls
                table[KIND_TRADE][slot] = cls
        return table

    def open_sockets(self, ctx: zmq.Context | None = None, *, curve_ingest=None, curve_egress=None) -> None:
        """Bind/connect every socket; raises EndpointError with a clear message if one is busy.

        `ctx` should be created (and its IO threads placed) before the hot
        thread is pinned: libzmq's IO thread must not share the spinning core."""
        cfg = self.cfg
        self._owns_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        allow = cfg.security.allow_remote
        topics = [topic_for(i) for i in self.instrument_ids] if cfg.ingest.topic_frame else None
        ing = expand_endpoint(cfg.ingest.endpoint, cfg)
        egr = expand_endpoint(cfg.egress.endpoint, cfg)
        ctl = expand_endpoint(cfg.metrics.control_endpoint, cfg)
        self.egress_sock, self.endpoints["decisions"] = sockets.open_egress(
            self.ctx, egr, bind_socket=cfg.egress.bind, snd_hwm=cfg.egress.snd_hwm, allow_remote=allow,
            curve=curve_egress)
        self.ingest_sock, self.endpoints["ingest"] = sockets.open_ingest(
            self.ctx, ing, socket_type=cfg.ingest.socket_type, bind_socket=cfg.ingest.bind, topics=topics,
            rcv_hwm=cfg.ingest.rcv_hwm, max_msg_size=cfg.ingest.max_msg_size_bytes, allow_remote=allow,
            curve=curve_ingest)
        # Stats to the control process: never wait for it (IMMEDIATE: no queue
        # without a live peer; tiny HWM; NOBLOCK sends, drops counted).
        self.control_sock = self.ctx.socket(zmq.PUSH)
        self.control_sock.setsockopt(zmq.IMMEDIATE, 1)
        self.control_sock.setsockopt(zmq.SNDHWM, 4)
        self.control_sock.setsockopt(zmq.LINGER, 0)
        sockets.check_endpoint(ctl, allow_remote=allow)
        self.control_sock.connect(ctl)
        self.endpoints["control"] = ctl
        self.control_dropped = 0
        self.publisher = DecisionPublisher(self.egress_sock, self.instrument_ids,
                                           topic_frame=cfg.egress.topic_frame, model_version=self.model_version)

    def warm_up(self) -> None:
        """Run every bucket before serving (lazy init, allocator, caches), then reset state."""
        if not self.engine.ready:  # GPU engines warm up (capture, launch) when they are chosen
            self.engine.warm_up()
        self.store.reset()

    # ------------------------------------------------------------ control

    def request_stop(self) -> None:
        """Signal handlers only flip state (and wake the loop if it sleeps on the FD)."""
        self._stop_requested = True
        fut = self._fd_future
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _on_fd_readable(self) -> None:
        fut = self._fd_future
        if fut is not None and not fut.done():
            fut.set_result(None)

    # ------------------------------------------------------------ ingest

    def _drain_ingest(self, max_frames: int) -> int:
        """Read and process up to `max_frames` frames; returns how many were read.

        Readiness: the EVENTS getsockopt is the cheapest check that does not
        raise (tools/bench_hotpath.py), but it is a system call per check. So
        the first two messages of a drain are each preceded by it, and once a
        burst is evident (two read) the loop just receives until zmq.Again: one
        exception per burst instead of a check per message. Flags are plain
        ints: pyzmq's enum flags cost an enum construction per `&`.
        """
        sock = self.ingest_sock
        getsockopt = sock.getsockopt
        recv = sock.recv
        topic_frame = self.cfg.ingest.topic_frame
        on_frame = self._on_frame
        n = 0
        while n < max_frames:
            if n < 2 and not getsockopt(_EVENTS) & _POLLIN:
                break
            try:
                first = recv(_NOBLOCK)
            except zmq.Again:
                break
            t_recv = perf_ns()
            if n == 0:
                self.clock.sync()  # the epoch offset drifts: re-read it once per burst
            n += 1
            if topic_frame:
                if not getsockopt(_RCVMORE):
                    self._reject(Reason.BAD_FRAMING, None, t_recv)
                    continue
                payload = recv(_NOBLOCK)
                if getsockopt(_RCVMORE):
                    while getsockopt(_RCVMORE):
                        recv(_NOBLOCK)
                    self._reject(Reason.BAD_FRAMING, None, t_recv)
                    continue
                on_frame(first, payload, t_recv)
            else:
                if getsockopt(_RCVMORE):
                    while getsockopt(_RCVMORE):
                        recv(_NOBLOCK)
                    self._reject(Reason.BAD_FRAMING, None, t_recv)
                    continue
                on_frame(None, first, t_recv)
        return n

    def _on_frame(self, topic, payload: bytes, t_recv: int) -> None:
        if len(payload) > self.cfg.ingest.max_frame_bytes:
            self._reject(Reason.OVERSIZED, None, t_recv)
            return
        try:
            msg = self._decode(payload)
        except Exception:  # noqa: BLE001 - msgspec.DecodeError and friends: any undecodable frame
            self._reject(Reason.DECODE_ERROR, None, t_recv)
            return
        t_dec = perf_ns()
        typ = type(msg)
        if typ is Quote:
            reason = validate_quote(msg, self.cfg.ingest.max_levels)
        elif typ is Trade:
            reason = validate_trade(msg)
        else:
            if typ is Heartbeat:
                self.acct.heartbeats += 1
                return
            self._reject(Reason.UNEXPECTED_KIND, None, t_recv)
            return
        slot = self.slot_of.get(msg.instrument, -1)
        if reason or slot < 0 or (topic is not None and topic != self.publisher.topics[slot]):
            if not reason:
                reason = Reason.UNKNOWN_INSTRUMENT if slot < 0 else Reason.TOPIC_MISMATCH
            self._reject(reason, msg, t_recv)
            return
        acct = self.acct
        acct.received += 1
        seq = msg.seq
        last = self._last_seq[slot]
        if seq != last + 1 and last >= 0:
            if seq > last:
                acct.seq_gaps += seq - last - 1
            else:
                acct.seq_resets += 1  # publisher restarted (or replayed): follow the new sequence
        self._last_seq[slot] = seq
        store = self.store
        if typ is Quote:
            pos = store.write_quote(slot, msg.book, msg.n_levels)
            kind = KIND_QUOTE
        else:
            pos = store.write_trade(slot, msg.price, msg.size * msg.side)
            kind = KIND_TRADE
        sched = self.sched
        ts_send = msg.ts_send_ns
        rid = sched.push(slot, pos, seq, sched.class_of(slot, kind, msg.priority), t_recv, t_dec, ts_send)
        if rid == NO_REQUEST:
            self._shed_unqueued(slot, msg, t_recv)
        stages = self.stages.buffers
        stages["decode"].add(t_dec - t_recv)
        if ts_send:
            stages["wire"].add(t_recv + self.clock.offset_ns - ts_send)

    def _reject(self, reason: Reason, msg, t_recv: int) -> None:
        """Cold path: count, and answer when the event can be named."""
        acct = self.acct
        acct.received += 1
        acct.rejected += 1
        acct.by_reason[reason] += 1
        if msg is None or not self.cfg.egress.publish_rejected:
            return
        inst = msg.instrument
        if not (0 <= inst < 0xFFFFFFFF) or msg.seq < 0:
            return
        now = self.clock.epoch(perf_ns())
        self.publisher.send_decision(self.slot_of.get(inst, -1), inst, msg.seq, REJECTED, int(reason), 0, 0.0, 0,
                                     msg.ts_send_ns, self.clock.epoch(t_recv), now)

    def _shed_unqueued(self, slot: int, msg, t_recv: int) -> None:
        acct = self.acct
        acct.shed += 1
        acct.by_reason[Reason.QUEUE_FULL] += 1
        if self.cfg.egress.publish_shed:
            self.publisher.send_decision(slot, msg.instrument, msg.seq, SHED, int(Reason.QUEUE_FULL), 0, 0.0, 0,
                                         msg.ts_send_ns, self.clock.epoch(t_recv), self.clock.epoch(perf_ns()))

    # ------------------------------------------------------------ step + publish

    def _step(self, force: bool = False) -> int:
        """Form one batch by policy (or regardless of it when `force`), run it, publish it."""
        sched = self.sched
        now = perf_ns()
        n = sched.form_batch(now, force=force)
        if sched.n_shed:
            self._publish_stale(sched.n_shed)
        if n == 0:
            return 0
        rids = sched.batch_rids[:n]
        r_slot, r_pos = sched.r_slot, sched.r_pos
        engine = self.engine
        e_slots, e_positions = engine.request()
        e_slots[:n] = [r_slot[r] for r in rids]
        e_positions[:n] = [r_pos[r] for r in rids]
        t0 = perf_ns()
        scores, actions = engine.step(n)
        t1 = perf_ns()
        scores = scores.tolist()
        actions = actions.tolist()
        send = self.publisher.send_decision
        ids = self.instrument_ids
        offset = self.clock.offset_ns
        r_seq, r_recv, r_push = sched.r_seq, sched.r_recv_ns, sched.r_push_ns
        r_send, r_nconf, r_stale = sched.r_send_epoch_ns, sched.r_nconf, sched.r_stale
        queue_add = self.stages.buffers["queue"].add
        service_add = self.stages.buffers["service"].add
        release = sched.release
        decided = 0
        worst_queue = 0
        for i in range(n):
            rid = rids[i]
            slot = r_slot[rid]
            recv_ns = r_recv[rid]
            q = t0 - r_push[rid]
            if q > worst_queue:
                worst_queue = q
            queue_add(q)
            t_dec = perf_ns()
            if r_stale[rid]:
                self.acct.shed += 1
                self.acct.by_reason[Reason.STALE] += 1
                if self.cfg.egress.publish_shed:
                    send(slot, ids[slot], r_seq[rid], SHED, int(Reason.STALE), 0, 0.0, r_nconf[rid], r_send[rid],
                         recv_ns + offset, t_dec + offset)
            else:
                send(slot, ids[slot], r_seq[rid], DECIDED, 0, actions[i], scores[i], r_nconf[rid], r_send[rid],
                     recv_ns + offset, t_dec + offset)
                decided += 1
                service_add(perf_ns() - recv_ns)
            release(rid)
        t2 = perf_ns()
        self.acct.decided += decided
        self.acct.batches += 1
        self._last_batch = n
        bufs = self.stages.buffers
        bufs["step"].add(t1 - t0)
        bufs["publish"].add(t2 - t1)
        if sched.adaptive is not None:
            sched.adaptive.observe_batch(worst_queue + (t1 - t0), self.acct.received, t2)
        return n

    def _publish_stale(self, n_shed: int) -> None:
        sched = self.sched
        acct = self.acct
        acct.shed += n_shed
        acct.by_reason[Reason.STALE] += n_shed
        offset = self.clock.offset_ns
        for i in range(n_shed):
            rid = sched.shed_rids[i]
            if self.cfg.egress.publish_shed:
                slot = sched.r_slot[rid]
                self.publisher.send_decision(slot, self.instrument_ids[slot], sched.r_seq[rid], SHED,
                                             int(Reason.STALE), 0, 0.0, sched.r_nconf[rid],
                                             sched.r_send_epoch_ns[rid], sched.r_recv_ns[rid] + offset,
                                             perf_ns() + offset)
            sched.release(rid)

    # ------------------------------------------------------------ housekeeping

    def counters(self) -> dict[str, int]:
        a = self.acct
        return {
            "received": a.received, "decided": a.decided, "shed": a.shed, "conflated": self.sched.conflated,
            "rejected": a.rejected, "egress_dropped": self.publisher.dropped,
            "control_dropped": self.control_dropped, "seq_gaps": a.seq_gaps, "seq_resets": a.seq_resets,
            "heartbeats": a.heartbeats, "batches": a.batches,
        }

    def pending(self) -> int:
        a = self.acct
        return a.received - a.decided - a.shed - self.sched.conflated - a.rejected

    def status_message(self, final: bool = False) -> Status:
        a = self.acct
        return Status(self.clock.epoch(perf_ns()), a.received, a.decided, a.shed, self.sched.conflated, a.rejected,
                      self.pending(), self.publisher.dropped, a.seq_gaps, list(a.by_reason), final,
                      self.engine.name, self.model_version)

    def _fold_and_ship(self, now: int, final: bool = False) -> None:
        interval = self.stages.take_interval()
        snap = Snapshot(
            service=self.cfg.service.name, pid=os.getpid(), ts_ns=self.clock.epoch(now),
            interval_ns=now - self._last_ship_ns, engine=self.engine.name, engine_reason=self.engine.reason,
            model_version=self.model_version, counters=self.counters(),
            rejected_by_reason={r.name: self.acct.by_reason[r] for r in Reason if self.acct.by_reason[r]},
            gauges={"queue_depth": float(self.pending()), "batch_wait_us": self.sched.current_wait_ns() / 1e3,
                    "last_batch_size": float(self._last_batch), "rss_bytes": float(_rss_bytes())},
            stages={k: to_wire(v) for k, v in interval.items()},
            histogram_highest_ns=self.cfg.metrics.highest_trackable_us * 1000,
            histogram_digits=self.cfg.metrics.significant_digits, placement=self.placement, final=final)
        self._last_ship_ns = now
        try:
            self.control_sock.send(encode_snapshot(snap), zmq.NOBLOCK)
        except zmq.Again:
            self.control_dropped += 1

    def _housekeeping(self, now: int) -> None:
        self._fold_and_ship(now)
        self._last_fold_ns = now
        self.publisher.send_status(self.status_message())
        sockets.drain_subscriptions(self.egress_sock)
        self.clock.refresh()
        if self._gc_frozen and gc.get_count()[0] > 10_000:
            gc.collect(0)  # young generation only, here and never mid-burst
        if self.on_housekeeping is not None:
            self.on_housekeeping()
        self._next_housekeeping_ns = now + self.cfg.metrics.stats_interval_ms * 1_000_000

    # ------------------------------------------------------------ the loop

    on_housekeeping = None  # callback (systemd watchdog), set by serve

    async def run(self, *, on_ready=None) -> None:
        """Serve until request_stop(); then drain and return."""
        loop = asyncio.get_running_loop()
        cfg = self.cfg
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        fd = self.ingest_sock.getsockopt(zmq.FD)
        loop.add_reader(fd, self._on_fd_readable)
        self._gc_frozen = False
        if cfg.cpu.gc_freeze:
            gc.collect()
            gc.freeze()  # everything allocated so far is permanent: never scanned again
            gc.disable()  # young collections run in housekeeping instead
            self._gc_frozen = True
        now = perf_ns()
        self._last_ship_ns = self._last_fold_ns = now
        self._last_batch = 0
        self._next_housekeeping_ns = now + cfg.metrics.stats_interval_ms * 1_000_000
        self.started_epoch_ns = self.clock.epoch(now)
        self.publisher.send_status(self.status_message())
        if on_ready is not None:
            on_ready()
        try:
            await self._loop()
        finally:
            loop.remove_reader(fd)
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            if self._gc_frozen:
                gc.enable()
        await self._drain()

    async def _loop(self) -> None:
        cfg = self.cfg.ingest
        mode = cfg.poll_mode
        spin_ns = cfg.spin_budget_us * 1000
        yield_ns = cfg.yield_interval_us * 1000
        max_drain = cfg.max_drain
        drain = self._drain_ingest
        step = self._step
        last_yield = last_work = perf_ns()
        while not self._stop_requested:
            worked = drain(max_drain)
            worked += step()
            now = perf_ns()
            if now >= self._next_housekeeping_ns:
                self._housekeeping(now)
            if worked:
                last_work = now
            if (not worked and now - self._last_fold_ns > IDLE_FOLD_NS) or self.stages.any_full():
                # Fold raw samples while idle (or when a buffer fills), so that
                # housekeeping never folds a large buffer mid-burst.
                self.stages.fold()
                self._last_fold_ns = now
            if mode == "busy" or (mode == "hybrid" and (worked or now - last_work < spin_ns)):
                if now - last_yield >= yield_ns:
                    await asyncio.sleep(0)  # timers, signals, the FD reader
                    last_yield = perf_ns()
                continue
            await self._wait_readable(now)
            last_yield = last_work = perf_ns()

    async def _wait_readable(self, now: int) -> None:
        """Sleep until the ingest socket may have input, a batch falls due, or housekeeping."""
        sock = self.ingest_sock
        # ZeroMQ's FD signals edges: input that arrived before we got here
        # raises no new edge, so look first.
        if sock.getsockopt(_EVENTS) & _POLLIN:
            return
        wake_ns = self._next_housekeeping_ns
        due = self.sched.batch_due_ns(now)
        if due > 0:
            wake_ns = min(wake_ns, due)
        elif due == 0:
            return
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._fd_future = fut
        timer = loop.call_later(max(0.0, (wake_ns - now) / 1e9), self._on_fd_readable)
        try:
            await fut
        finally:
            timer.cancel()
            self._fd_future = None

    on_stopping = None  # callback (systemd STOPPING=1), set by serve

    async def _drain(self) -> None:
        """Stop intake: read what is already queued, step until nothing is pending, flush."""
        if self.on_stopping is not None:
            self.on_stopping()
        deadline = perf_ns() + self.cfg.service.drain_timeout_ms * 1_000_000
        # Read until the feed has been quiet for DRAIN_QUIET_NS: frames already sent may
        # still be on their way through libzmq's I/O thread when the socket first looks
        # empty, and a drain that stopped there would lose them.
        quiet_since = perf_ns()
        while perf_ns() < deadline:
            if self._drain_ingest(self.cfg.ingest.max_drain):
                quiet_since = perf_ns()
                while self.sched.queued_slots and self._step(force=True):
                    pass
            elif perf_ns() - quiet_since > DRAIN_QUIET_NS:
                break
        self._intake_closed = True
        while self.sched.queued_slots and perf_ns() < deadline:
            self._step(force=True)
        if self.sched.queued_slots:  # out of time: shed the rest, never leave them unaccounted
            self._shed_all_queued()
        now = perf_ns()
        self._fold_and_ship(now, final=True)
        self.publisher.send_status(self.status_message(final=True))

    def _shed_all_queued(self) -> None:
        sched = self.sched
        saved = sched.max_age_ns
        sched.max_age_ns = -1  # everything is stale now
        try:
            while sched.queued_slots:
                n = sched.form_batch(perf_ns(), force=True)
                if sched.n_shed:
                    self._publish_stale(sched.n_shed)
                for i in range(n):  # sequential discipline keeps stale requests in the batch
                    rid = sched.batch_rids[i]
                    self.acct.shed += 1
                    self.acct.by_reason[Reason.STALE] += 1
                    sched.release(rid)
        finally:
            sched.max_age_ns = saved

    def close(self) -> None:
        if self.ctx is None:
            return
        self.ingest_sock.close(0)
        self.control_sock.close(0)
        self.egress_sock.close()  # linger: let the final decisions and Status out
        self.engine.close()
        if self._owns_ctx:
            self.ctx.term()
        self.ctx = None

    # ------------------------------------------------------------ results

    def summary(self) -> dict:
        counters = self.counters()
        return {
            "service": self.cfg.service.name,
            "engine": self.engine.name,
            "engine_reason": self.engine.reason,
            "model_version": self.model_version,
            "endpoints": self.endpoints,
            "stages": self.stages.summary(),
            "accounting": {k: counters[k] for k in ("received", "decided", "shed", "conflated", "rejected")}
            | {"pending": self.pending()},
            "counters": counters,
            "rejected_by_reason": {r.name: self.acct.by_reason[r] for r in Reason if self.acct.by_reason[r]},
        }


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0
