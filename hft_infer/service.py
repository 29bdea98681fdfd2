"""The hot loop: one thread, run to completion, on uvloop; the device never blocks it.

    while running:
        step.ingest()    drain a burst: recv -> decode -> validate -> row -> queue (ingest.py);
                         with ingest.coalesce_us, at most once per that while a full batch is
                         queued (stepper.py: a burst's cost is mostly fixed)
        step.complete()  the oldest in-flight step is done? collect it, answer its events,
        step.flush()       and send them at once, in one frame (egress.py)
        step.submit()    the device can take a step and a batch is due? form, stage, submit
        step.flush()     what submit answered (stale, shed), in one frame
        _housekeeping()  when due: snapshot to the control process, Status, GC, watchdog, feed monitor
        idle             fold one stage's histogram samples once it has a chunk's worth, adapt the
                         batching wait, then spin (busy) / spin then sleep on the socket FD
                         (hybrid) / sleep (event)

The step phase lives in stepper.py: a step may be in flight while the loop
keeps ingesting (GPU engines; the CPU engine with `runner.cpu_worker`), and
steps complete in submission order.

Every event that is read ends as exactly one of decided, shed, conflated or
rejected (accounting.py); until then it holds a scheduler request id, which
is what `pending` counts. Stages (metrics.SERVICE_STAGES) are recorded per
batch or per burst, never per event, and folded in bounded chunks.

Signals only flip state: the first SIGTERM/SIGINT stops intake and drains,
a second is logged, a third forces the drain (what is still queued is shed,
answered and counted).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import zmq

from hft_infer import channels
from hft_infer.accounting import Accounting
from hft_infer.clock import EpochClock, perf_ns
from hft_infer.config import Config, expand_endpoint
from hft_infer.egress import Egress
from hft_infer.feed_monitor import FeedMonitor
from hft_infer.heap import FrozenHeap
from hft_infer.hot_thread_stats import ThreadSchedStats
from hft_infer.ingest import Ingest
from hft_infer.late_feed import LateFeedWatch
from hft_infer.loop_stalls import LoopStalls
from hft_infer.metrics import SERVICE_STAGES, StageHistograms, to_wire
from hft_infer.runner.base import EngineFailure
from hft_infer.runner.select import build_runtime
from hft_infer.runner.worker import WorkerEngine
from hft_infer.scheduler import Scheduler
from hft_infer.stepper import Stepper
from hft_infer.transport import sockets
from hft_infer.transport.codec import feed_topics, shard_batch_topic
from hft_infer.transport.schema import Kind, Reason
from hft_infer.transport.stats import Snapshot, encode_snapshot

STALE = int(Reason.STALE)
KIND_QUOTE, KIND_TRADE = int(Kind.QUOTE), int(Kind.TRADE)
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
GAP_WINDOW_NS = 100_000  # loop_gap: the worst gap between iterations per 100 us of loop time
SHM_IDLE_TICK_NS = 200_000  # hybrid/event over iceoryx2, idle: sleep this long, then look again
DRAIN_QUIET_NS = 100_000_000  # on stop: the feed is drained once it has been silent this long



class Service:
    def __init__(self, cfg: Config, *, log=None) -> None:
        self.cfg = cfg
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        ids = cfg.universe.owned_ids()
        self.instrument_ids = ids
        # EventBatch frames of this shard's instruments come under their own topic (codec.py)
        self.batch_topic = shard_batch_topic(cfg.universe.shard_index, cfg.universe.shard_count)
        self.n_slots = len(ids)
        rt = build_runtime(cfg, self.n_slots)
        self.model_version = rt.model_version
        self.store = rt.store
        self.engine = WorkerEngine(rt.engine) if cfg.runner.cpu_worker and rt.engine.name == "eager" else rt.engine
        self._inflight_rows = rt.inflight_rows
        self.levels = rt.model.spec.levels
        self.window = rt.model.spec.window  # the newest rows per instrument a step reads
        self.class_table = self._class_table(cfg, ids)
        self.sched = Scheduler(cfg.scheduler, self.n_slots, sequential=rt.sequential, conflate=rt.conflate,
                               class_by_slot_kind=self.class_table)
        self.acct = Accounting()
        self.late_feed = LateFeedWatch(self.acct, cfg.scheduler.max_age_us, self.log)
        self.clock = EpochClock()
        m = cfg.metrics
        self.stages = StageHistograms(SERVICE_STAGES, m.sample_capacity, m.highest_trackable_us * 1000,
                                      m.significant_digits)
        self.bufs = self.stages.buffers
        # sockets and what uses them: set by open_sockets, closed by close (in any state)
        self.ctx: zmq.Context | None = None
        self._owns_ctx = False
        self.ingest_sock = self.egress_sock = self.control_sock = None
        self._ingest_shm = self._egress_shm = False  # iceoryx2 (transport/shm.py) instead of zmq
        self.egress: Egress | None = None
        self.ingest: Ingest | None = None
        self.step: Stepper | None = None
        self.feed_monitor: FeedMonitor | None = None
        self.endpoints: dict[str, str] = {}
        self.placement: dict[str, str] = {}
        self.started_epoch_ns = 0
        self.on_housekeeping = None  # callback (systemd watchdog), set by serve
        self.on_stopping = None  # callback (systemd STOPPING=1), set by serve
        # loop state
        self._signals = 0
        self._stop_requested = False
        self._force = False
        self.failure = ""  # set when the engine failed: the final Status names it, serve exits non-zero
        self.hot_thread: ThreadSchedStats | None = None  # set by run(), on the thread that runs the loop
        self.stalls = LoopStalls(cfg.metrics.stall_us * 1000)  # the phases of the loop's long iterations
        self._fd_future: asyncio.Future | None = None
        self.heap = FrozenHeap(enabled=cfg.cpu.gc_freeze)
        self._engine_closed = False
        self._next_ship_ns = self._next_status_ns = self._last_ship_ns = 0

    # ------------------------------------------------------------ set-up

    @staticmethod
    def _class_table(cfg: Config, ids: list[int]) -> list[list[int]]:
        sc = cfg.scheduler
        by_kind = [sc.class_by_kind.get("quote", sc.default_class), sc.class_by_kind.get("trade", sc.default_class)]
        table = [[by_kind[k]] * len(ids) for k in (KIND_QUOTE, KIND_TRADE)]
        slot_of = {iid: s for s, iid in enumerate(ids)}
        for key, cls in sc.class_by_instrument.items():
            slot = slot_of.get(int(key))
            if slot is not None:
                table[KIND_QUOTE][slot] = table[KIND_TRADE][slot] = cls
        return table

    def open_sockets(self, ctx: zmq.Context | None = None, *, curve_ingest=None, curve_egress=None) -> None:
        """Bind/connect every socket; raises EndpointError with a clear message if one is busy
        (sockets opened before the failure are closed by `close()`).

        `ctx` should be created (and its IO threads placed) before the hot thread is pinned:
        libzmq's IO thread must not share the spinning core."""
        cfg = self.cfg
        self._owns_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        allow = cfg.security.allow_remote
        topics = None
        if cfg.ingest.topic_frame and cfg.ingest.transport == "zmq":  # instruments, service and batch topics
            topics = feed_topics(self.instrument_ids, self.batch_topic)
        egr = channels.open_egress(cfg, self.ctx, curve=curve_egress)
        self.egress_sock, self.endpoints["decisions"] = egr.sock, egr.address
        ing = channels.open_ingest(cfg, self.ctx, topics=topics, curve=curve_ingest)
        self.ingest_sock, self.endpoints["ingest"] = ing.sock, ing.address
        self._ingest_shm, self._egress_shm = ing.shm, egr.shm
        for ch in (ing, egr):
            if ch.shm:  # what the start-up removed of nodes that died without cleaning up (kill -9)
                self.log(f"{ch.address}: iceoryx2 dead-node cleanup: {ch.sock.cleanup}")
        if not cfg.ingest.bind and not ing.shm:  # a connecting socket: watch it (libzmq may not restore it)
            self.feed_monitor = FeedMonitor(self.ingest_sock, self.endpoints["ingest"], self.acct, self.log)
        # Stats to the control process: never wait for it (IMMEDIATE: no queue without a live
        # peer; tiny HWM; NOBLOCK sends, drops counted).
        ctl = expand_endpoint(cfg.metrics.control_endpoint, cfg)
        sockets.check_endpoint(ctl, allow_remote=allow)
        self.control_sock = self.ctx.socket(zmq.PUSH)
        self.control_sock.setsockopt(zmq.IMMEDIATE, 1)
        self.control_sock.setsockopt(zmq.SNDHWM, 4)
        self.control_sock.setsockopt(zmq.LINGER, 0)
        self.control_sock.connect(ctl)
        self.endpoints["control"] = ctl
        self.egress = egr.cls(self.egress_sock, self.instrument_ids, mode=cfg.egress.mode,
                              topic_frame=egr.topic_frame, model_version=self.model_version)
        sc = cfg.scheduler
        self.ingest = ing.cls(
            self.ingest_sock, instrument_ids=self.instrument_ids, store=self.store, sched=self.sched,
            acct=self.acct, answers=self.egress.answers, clock=self.clock, topic_frame=ing.topic_frame,
            max_frame_bytes=cfg.ingest.max_frame_bytes, max_batch_frame_bytes=cfg.ingest.batch_frame_limit(),
            max_levels=cfg.ingest.max_levels,
            model_levels=self.levels, max_age_us=sc.max_age_us, class_by_slot_kind=self.class_table,
            honour_message_priority=sc.honour_message_priority, classes=sc.classes,
            publish_shed=cfg.egress.publish_shed, publish_rejected=cfg.egress.publish_rejected,
            on_reset=self._reset_slots, rows_read=self.window, batch_topic=self.batch_topic)
        self.step = Stepper(engine=self.engine, sched=self.sched, store=self.store, ingester=self.ingest,
                            egress=self.egress, acct=self.acct, clock=self.clock, stages=self.stages,
                            instrument_ids=self.instrument_ids, inflight_rows=self._inflight_rows,
                            max_drain=cfg.ingest.max_drain, publish_shed=cfg.egress.publish_shed,
                            coalesce_ns=cfg.ingest.coalesce_us * 1000, read_gap_ns=cfg.ingest.read_gap_us * 1000)

    def _reset_slots(self, slots: list[int]) -> None:
        self.step.reset_slots(slots)

    def warm_up(self) -> None:
        """Run every bucket before serving (lazy init, allocator, caches), then reset state."""
        if not self.engine.ready:  # GPU engines warm up (capture, launch) when they are chosen
            self.engine.warm_up()
        self.store.reset()

    # ------------------------------------------------------------ control

    def request_stop(self) -> None:
        """Signal handler: 1st stops intake and drains, 2nd is noted, 3rd forces the drain."""
        self._signals += 1
        if self._signals == 2:
            self.log("still draining; a third signal forces it (what is queued is shed)")
        elif self._signals >= 3:
            self._force = True
        self._stop_requested = True
        self._wake()

    def _wake(self) -> None:
        fut = self._fd_future
        if fut is not None and not fut.done():
            fut.set_result(None)

    # ------------------------------------------------------------ step: submit, complete

    # ------------------------------------------------------------ housekeeping

    def pending(self) -> int:
        return self.sched.live_requests()

    def counters(self) -> dict[str, int]:
        a = self.acct
        a.egress_dropped = self.egress.dropped if self.egress else 0
        out = a.counters(self.sched.conflated)
        out.update(self.stalls.counters())
        if self.hot_thread is not None:  # the hot thread's preemptions since serving began
            out.update(self.hot_thread.counters())
        return out

    def gauges(self) -> dict[str, float]:
        """The point-in-time values of transport/stats.GAUGES: in every stats snapshot, and at stop
        in service.json (where a saturated run's admission depth and margin ended)."""
        return {"queue_depth": float(self.pending()), "batch_wait_us": self.sched.current_wait_ns() / 1e3,
                "last_batch_size": float(self.step.last_batch), "rss_bytes": float(_rss_bytes()),
                "admit_depth": float(self.sched.admit_depth), "admit_margin_us": self.sched.admit_margin_ns / 1e3,
                "feed_late_us": self.late_feed.late_ns(perf_ns()) / 1e3}

    def status_message(self, final: bool = False):
        return self.acct.status(self.clock.epoch(perf_ns()), conflated=self.sched.conflated,
                                pending=self.pending(), final=final, engine=self.engine.name,
                                model_version=self.model_version, error=self.failure,
                                precision=self.engine.precision)

    def _ship(self, now: int, final: bool = False) -> None:
        interval = self.stages.take_interval()
        snap = Snapshot(
            service=self.cfg.service.name, pid=os.getpid(), ts_ns=self.clock.epoch(now),
            interval_ns=now - self._last_ship_ns, engine=self.engine.name, engine_reason=self.engine.reason,
            precision=self.engine.precision,
            model_version=self.model_version, counters=self.counters(), rejected_by_reason=self.acct.reasons(),
            gauges=self.gauges(),
            stages={k: to_wire(v) for k, v in interval.items()},
            histogram_highest_ns=self.cfg.metrics.highest_trackable_us * 1000,
            histogram_digits=self.cfg.metrics.significant_digits, placement=self.placement, final=final)
        self._last_ship_ns = now
        try:
            self.control_sock.send(encode_snapshot(snap), zmq.NOBLOCK)
        except zmq.Again:
            self.acct.control_dropped += 1

    def _housekeeping(self, now: int) -> None:
        if self.feed_monitor is not None:
            self.feed_monitor.check(now)
        if now >= self._next_status_ns:
            self._next_status_ns = now + self.cfg.egress.status_interval_ms * 1_000_000
            self.egress.send_status(self.status_message())
        if now >= self._next_ship_ns:
            self._next_ship_ns = now + self.cfg.metrics.stats_interval_ms * 1_000_000
            # judged before the snapshot is shipped, so that its feed_late_us gauge covers this interval
            self.late_feed.check(now, idle=not self.step.inflight and not self.sched.queued_slots)
            self._ship(now)
            if not self._egress_shm:
                sockets.drain_subscriptions(self.egress_sock)
            self.clock.refresh()
            self.heap.collect_young()  # young generation only, here and never mid-burst
            if self.on_housekeeping is not None:
                self.on_housekeeping()

    # ------------------------------------------------------------ the loop

    async def run(self, *, on_ready=None) -> None:
        """Serve until request_stop(); then drain and return."""
        loop = asyncio.get_running_loop()
        cfg = self.cfg
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        fd = None if self._ingest_shm else self.ingest_sock.getsockopt(zmq.FD)
        if fd is not None:  # iceoryx2 has no FD to wait on: _wait_readable sleeps in short ticks
            loop.add_reader(fd, self._wake)
        done_fd = self.engine.done_fd
        if done_fd is not None:  # a step on a worker thread: its end wakes the idle loop (runner/worker.py)
            loop.add_reader(done_fd, self._wake)
        self.heap.freeze()  # no-op if finish_warmup froze it already (serve passes it this heap)
        self.hot_thread = ThreadSchedStats()  # this thread runs the loop: count its preemptions from here
        now = perf_ns()
        self._last_ship_ns = now
        self._next_ship_ns = now + cfg.metrics.stats_interval_ms * 1_000_000
        self._next_status_ns = now + cfg.egress.status_interval_ms * 1_000_000
        self.started_epoch_ns = self.clock.epoch(now)
        self.egress.send_status(self.status_message())
        if on_ready is not None:
            on_ready()
        try:
            await self._loop()
            await self._drain()
        except EngineFailure as e:
            self._fail(e)
        finally:
            if fd is not None:
                loop.remove_reader(fd)
            if done_fd is not None:
                loop.remove_reader(done_fd)
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            self.heap.restore()

    async def _loop(self) -> None:
        cfg = self.cfg.ingest
        mode = cfg.poll_mode
        spin_ns = cfg.spin_budget_us * 1000
        yield_ns = cfg.yield_interval_us * 1000
        engine, sched, stages, step = self.engine, self.sched, self.stages, self.step
        # a step on a worker thread needs the GIL that a spinning loop holds: sleep instead
        sleep_in_flight = engine.done_fd is not None
        # runner.chain_steps: every finished step collected and steps submitted while the engine
        # takes them, in one iteration (an asynchronous engine on this thread only: a CPU engine's
        # submit runs the step, and a worker's loop sleeps while one is in flight)
        chain = self.cfg.runner.chain_steps and not engine.done_at_submit and not sleep_in_flight
        gap_buf = self.bufs["loop_gap"]
        idle_fold_min = stages.IDLE_FOLD_MIN
        last_yield = last_work = last_iter = perf_ns()
        gap_max = 0
        gap_window_end = last_iter + GAP_WINDOW_NS
        # the previous iteration's phase boundaries (loop_stalls.py); p_start 0: nothing to judge
        stalls = self.stalls
        stall_ns = stalls.threshold_ns
        p_start = p_ingest = p_complete = p_submit = p_end = 0
        while not self._stop_requested:
            now = perf_ns()
            if p_start and now - p_start > stall_ns:
                stalls.record(p_ingest - p_start, p_complete - p_ingest, p_submit - p_complete, p_end - p_submit,
                              now - p_end)
            gap = now - last_iter
            last_iter = now
            if gap > gap_max:
                gap_max = gap
            if now >= gap_window_end:
                gap_buf.add(gap_max)
                gap_max = 0
                gap_window_end = now + GAP_WINDOW_NS
            worked = step.ingest(now) if step.feed_due(now) else 0
            t_ingest = perf_ns()
            if step.inflight and engine.poll():
                step.complete()
                while chain and step.inflight and engine.poll():
                    step.complete()
                # decisions out before the next submit, which gathers, stages and replays a graph
                # (~tens of µs on the H200 host: measured as the publish stage when it came first)
                step.flush()
                worked += 1
            t_complete = perf_ns()
            if engine.can_submit and sched.queued_slots:
                worked += step.submit()
                if chain:
                    worked += step.submit_chained()
            t_submit = perf_ns()
            step.flush()
            self._housekeeping(now)
            p_start, p_ingest, p_complete, p_submit = now, t_ingest, t_complete, t_submit
            if worked:
                last_work = now
                if stages.pressure():  # a buffer is filling: fold a bounded chunk even when busy
                    stages.fold_some()
                p_end = perf_ns()
                continue
            # idle: fold one stage, once it holds a chunk's worth (each fold's cost is mostly fixed),
            # but not while a step is in flight: a fold (~40-300 µs) would delay collecting it
            if not step.inflight and not stages.fold_one(idle_fold_min) and sched.adaptive is not None:
                sched.adaptive.update(self.acct.received, now)
            p_end = perf_ns()
            if step.inflight:
                spin = not sleep_in_flight
            else:
                spin = mode == "busy" or (mode == "hybrid" and now - last_work < spin_ns)
            if spin:
                if now - last_yield >= yield_ns:
                    await asyncio.sleep(0)  # timers, signals, the FD reader
                    last_yield = perf_ns()
                continue
            await self._wait_readable(now)
            last_yield = last_work = last_iter = perf_ns()
            p_start = 0  # a sleep on the socket at idle is not a stall

    async def _wait_readable(self, now: int) -> None:
        """Sleep until the ingest socket may have input, a batch falls due, or housekeeping."""
        sock = self.ingest_sock
        # ZeroMQ's FD signals edges: input that arrived before we got here raises no new
        # edge, so look first.
        if self._ingest_shm:
            if sock.has_samples():
                return
        elif sock.getsockopt(_EVENTS) & _POLLIN:
            return
        wake_ns = min(self._next_ship_ns, self._next_status_ns)
        if self.feed_monitor is not None:
            wake_ns = min(wake_ns, self.feed_monitor.next_check_ns)
        # a batch that falls due while the engine is busy waits for the step's end (done_fd)
        due = self.sched.batch_due_ns(now) if self.engine.can_submit else -1
        if due == 0:
            return
        if due > 0:
            wake_ns = min(wake_ns, due)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._fd_future = fut
        if self._ingest_shm:  # no FD: look again after a tick (the idle cost of hybrid/event over iceoryx2)
            wake_ns = min(wake_ns, now + SHM_IDLE_TICK_NS)
        timer = loop.call_later(max(0.0, (wake_ns - now) / 1e9), self._wake)
        try:
            await fut
        finally:
            timer.cancel()
            self._fd_future = None

    async def _drain(self) -> None:
        """Stop intake once the feed is quiet, step everything pending, answer, final Status."""
        if self.on_stopping is not None:
            self.on_stopping()
        deadline = perf_ns() + self.cfg.service.drain_timeout_ms * 1_000_000
        quiet_since = last_yield = perf_ns()
        step = self.step
        sleep_in_flight = self.engine.done_fd is not None  # as in _loop: a worker's step needs the GIL
        # Frames already sent may still be in libzmq's I/O thread when the socket first looks
        # empty: read until the feed has been silent for DRAIN_QUIET_NS.
        while not self._force:
            now = perf_ns()
            if now >= deadline:
                break
            worked = step.ingest()
            if worked:
                quiet_since = now
            if step.inflight and self.engine.poll():
                step.complete()
            elif self.engine.can_submit and self.sched.queued_slots:
                step.submit(force=True)
            elif not worked and not step.inflight and now - quiet_since > DRAIN_QUIET_NS:
                break
            step.flush()
            self._housekeeping(now)
            if not worked and step.inflight and sleep_in_flight:
                await self._wait_readable(now)
                last_yield = perf_ns()
            elif now - last_yield > 1_000_000:
                await asyncio.sleep(0)  # signals (a third one forces the drain)
                last_yield = perf_ns()
        step.drain_inflight()
        if self._force:
            self.log(f"drain forced by a third signal: shedding {self.sched.pending} queued requests")
        elif self.sched.queued_slots:
            self.log(f"drain timed out: shedding {self.sched.pending} queued requests")
        step.shed_queued(STALE)  # what is left (out of time, or forced): never unaccounted
        step.flush()
        now = perf_ns()
        self._ship(now, final=True)
        self.egress.send_status(self.status_message(final=True))

    def _fail(self, e: EngineFailure) -> None:
        """The engine cannot go on: answer everything in flight and queued as shed, say why in a
        final Status, and let serve exit non-zero (systemd restarts the service)."""
        self.failure = f"{type(e).__name__}: {e}"
        self.log(f"fatal: {self.failure}")
        self.step.abandon()
        self.step.flush()
        self._ship(perf_ns(), final=True)
        self.egress.send_status(self.status_message(final=True))

    def close(self) -> None:
        """Close whatever was opened (also after a failed start); idempotent."""
        if self.feed_monitor is not None:
            self.feed_monitor.close()
            self.feed_monitor = None
        if self.ingest_sock is not None:
            self.ingest_sock.close() if self._ingest_shm else self.ingest_sock.close(0)
        if self.control_sock is not None:
            self.control_sock.close(0)
        if self.egress_sock is not None:
            self.egress_sock.close()  # zmq linger: let the final decisions and Status out
        self.ingest_sock = self.control_sock = self.egress_sock = None
        if not self._engine_closed:
            self._engine_closed = True
            self.engine.close()
        if self._owns_ctx and self.ctx is not None:
            self.ctx.term()
        self.ctx = None

    # ------------------------------------------------------------ results

    def summary(self) -> dict:
        counters = self.counters()
        acc = {k: counters[k] for k in ("received", "decided", "shed", "conflated", "rejected")}
        return {
            "service": self.cfg.service.name,
            "engine": self.engine.name,
            "engine_reason": self.engine.reason,
            "precision": self.engine.precision,
            "model_version": self.model_version,
            "endpoints": self.endpoints,
            "stages": self.stages.summary(),
            "accounting": acc | {"pending": self.pending()},
            "identity_holds": self.acct.identity_holds(self.sched.conflated, self.pending()),
            "counters": counters,
            "gauges": self.gauges(),
            "rejected_by_reason": self.acct.reasons(),
            "failure": self.failure,
        }


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0
