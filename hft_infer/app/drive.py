"""Drive a service with a prepared feed and measure it: shared by `bench` and `replay`.

    feed (encoded frames) + intended send offsets
      -> [start `hft-infer serve` as a child | use a running service]
      -> wait until it has subscribed and published a Status (READY)
      -> pace open-loop (replay.pacer) while collecting decisions (replay.collector)
         and, for a child service, its per-interval stage histograms
      -> drain: a child gets SIGTERM and sends its final Status; a running
         service is left running and its counters are read from the next Status
      -> account for every event, write the run directory, return the result.

The run directory holds `summary.json` (the bench schema), the
`tick_to_decision` and pacer-lateness `.hgrm` distributions, a
`tick_to_decision` `.hlog` interval log and, for a child service, its own
`service/` directory (service.json, per-stage .hgrm) and log.

CLI level: may use `replay` (the service core may not).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

from hft_infer.app.launcher import (
    ServiceProcess,
    open_feed_publisher,
    private_runtime_dir,
    subscribe_decisions,
)
from hft_infer.clock import perf_ns
from hft_infer.config import Config, expand_endpoint, to_toml_dict
from hft_infer.errors import UserError
from hft_infer.metrics import (
    SERVICE_STAGES,
    TICK_TO_DECISION,
    add_sparse,
    from_wire,
    new_histogram,
    record_array,
    summarize,
)
from hft_infer.metrics.hlog import write_hgrm
from hft_infer.replay.pacer import Pacer
from hft_infer.transport.schema import Status
from hft_infer.transport.sockets import bind
from hft_infer.transport.stats import decode_snapshot


class StatsReceiver:
    """Binds the control endpoint and folds the child service's interval snapshots."""

    def __init__(self, ctx: zmq.Context, endpoint: str) -> None:
        self.sock = ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        bind(self.sock, endpoint)
        self.snapshots = []
        self.measure_after_ns = None  # epoch ns: intervals that started before this are warm-up
        self.hists = {}

    def poll(self) -> None:
        while self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            snap = decode_snapshot(self.sock.recv(zmq.NOBLOCK))
            self.snapshots.append(snap)
            if self.measure_after_ns is not None and snap.ts_ns - snap.interval_ns < self.measure_after_ns:
                continue
            for stage, wire in snap.stages.items():
                h = self.hists.get(stage)
                if h is None:
                    h = self.hists[stage] = new_histogram(snap.histogram_highest_ns, snap.histogram_digits)
                add_sparse(h, from_wire(wire))

    def summary(self) -> dict:
        return {s: summarize(self.hists[s]) if s in self.hists else summarize(new_histogram())
                for s in SERVICE_STAGES}


@dataclass
class Load:
    """What to send: the event table (for matching), its frames and intended send offsets (ns)."""

    events: np.ndarray
    feed: object  # replay.pacer.EncodedFeed
    offsets_ns: np.ndarray
    measure_from: int = 0  # events before this index are warm-up (accounted, not in latency)
    description: str = ""
    event_record: np.ndarray | None = None  # event i was sent as feed frame event_record[i] (None: i)


@dataclass
class Target:
    cfg: Config
    config_path: str | None
    overrides: list[str]
    start_service: bool  # True: run `serve` as a child on a private runtime dir


def drive(load: Load, target: Target, run_dir: Path, *, quiet: bool = False, label: str = "bench",
          extra: dict | None = None, spin: bool = True):
    """Returns (result dict, StatsReceiver | None, CollectorResult)."""
    cfg = target.cfg
    if cfg.ingest.socket_type != "sub" or cfg.ingest.bind:
        raise UserError(f"{label} publishes on a PUB that the service connects to: needs ingest.socket_type = "
                        "\"sub\" and ingest.bind = false")
    run_dir.mkdir(parents=True, exist_ok=True)
    runtime = None
    if target.start_service:
        runtime = private_runtime_dir(f"hft-{label}-")
        os.environ["HFT_INFER_RUNTIME_DIR"] = runtime  # the child inherits it; endpoints expand into it
    n_topics = len(cfg.universe.owned_ids()) if cfg.ingest.topic_frame else 1
    ctx = zmq.Context()
    service = None
    stats = None

    def say(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    try:
        pub = open_feed_publisher(ctx, expand_endpoint(cfg.ingest.endpoint, cfg))
        collector = subscribe_decisions(ctx, expand_endpoint(cfg.egress.endpoint, cfg),
                                        topic_frame=cfg.egress.topic_frame)
        if target.start_service:
            stats = StatsReceiver(ctx, expand_endpoint(cfg.metrics.control_endpoint, cfg))
            service = ServiceProcess(config=target.config_path, overrides=target.overrides,
                                     run_dir=run_dir / "service", log_dir=run_dir, env=os.environ.copy())
            service.start()
            service.wait_ready(pub, collector, n_topics)
            baseline = None
        else:
            baseline = _wait_running_service(pub, collector, n_topics)
        say(f"{label}: service ready; sending {len(load.feed):,} events ({load.description})")

        def idle() -> None:
            collector.poll()
            if stats is not None:
                stats.poll()

        progress = None if quiet else Progress(len(load.feed), label)
        pacer = Pacer(pub, load.feed, load.offsets_ns, topic_frame=cfg.ingest.topic_frame, idle_hook=idle,
                      progress_hook=progress.update if progress else None, spin=spin)
        if stats is not None and load.measure_from:
            stats.measure_after_ns = time.time_ns() + int(load.offsets_ns[load.measure_from] - load.offsets_ns[0])
        pace = pacer.run()
        if progress:
            progress.done(pace.sent)
        collector.wait_quiet(quiet_s=0.3, timeout_s=10.0)
        if service is not None:
            if not service.terminate_and_wait(collector):
                say(f"{label}: warning: no final Status from the service within 30 s")
            for _ in range(20):  # the final snapshot may trail the final Status by a moment
                stats.poll()
                if stats.snapshots and stats.snapshots[-1].final:
                    break
                time.sleep(0.05)
        else:
            _wait_next_status(collector, timeout_s=5.0)
    finally:
        if service is not None:
            service.close()
        ctx.destroy(linger=0)
        if runtime:
            shutil.rmtree(runtime, ignore_errors=True)

    if load.event_record is None:
        intended, sent = pace.intended_mono_ns, pace.sent
    else:  # not every frame is an event (captures hold heartbeats too)
        intended = pace.intended_mono_ns[load.event_record]
        sent = int(np.count_nonzero(load.event_record < pace.sent))
    result = collector.analyse(load.events["instrument"], load.events["seq"], intended, sent,
                               measure_from=load.measure_from, baseline=baseline)
    lateness = new_histogram()
    record_array(lateness, pace.lateness_ns[load.measure_from:])
    status = result.service_status
    out = {
        "config": to_toml_dict(cfg),
        "rate_offered": (extra or {}).get("rate_offered"),
        "rate_achieved": pace.rate_achieved,
        "engine": status.engine if status else None,
        "model_version": status.model_version if status else None,
        "stages": stats.summary() if stats is not None else {},
        TICK_TO_DECISION: result.tick_to_decision,
        "pacer_lateness": summarize(lateness),
        "accounting": result.accounting,
        "service_exit_code": service.proc.returncode if service is not None else None,
        "duplicates": result.duplicates,
        "unmatched_decisions": result.unmatched,
        "run_dir": str(run_dir),
    } | (extra or {})
    _write_histograms(run_dir, result, lateness, pace)
    return out, stats, result


SUBSCRIPTION_SETTLE_NS = 300_000_000


def _wait_running_service(pub: zmq.Socket, collector, n_topics: int, timeout_s: float = 30.0):
    """A service that is already running: wait for its subscriptions and a Status (the baseline).

    Other subscribers (a recorder, a second shard) may connect to the feed at
    the same moment, so after the service's topics have arrived we wait until
    no subscription has come for a moment: everyone connected gets every frame.
    """
    deadline = perf_ns() + int(timeout_s * 1e9)
    subscribed = 0
    status = None
    last_sub = perf_ns()
    while perf_ns() < deadline and (subscribed < n_topics or status is None
                                     or perf_ns() - last_sub < SUBSCRIPTION_SETTLE_NS):
        while pub.poll(0):
            if pub.recv()[:1] == b"\x01":
                subscribed += 1
                last_sub = perf_ns()
        if collector.sock.poll(20):
            collector.poll()
            status = collector.last_status() or status
    if subscribed < n_topics:
        raise UserError(f"no service subscribed to the feed endpoint within {timeout_s:.0f} s "
                        f"({subscribed}/{n_topics} topics): is `hft-infer serve` running with this config?")
    if status is None:
        raise UserError(f"the service published no Status within {timeout_s:.0f} s on its decision endpoint")
    collector.frames.clear()
    collector.recv_ns.clear()
    assert isinstance(status, Status)
    return status


def _wait_next_status(collector, timeout_s: float) -> None:
    """A Status newer than every decision received: its counters include our events."""
    deadline = perf_ns() + int(timeout_s * 1e9)
    n = len(collector.frames)
    while perf_ns() < deadline:
        if collector.sock.poll(50):
            collector.poll()
        if any(collector.is_status(p) for p in collector.frames[n:]):
            return


def _write_histograms(run_dir: Path, result, lateness, pace) -> None:
    if result.tick_histogram.get_total_count():
        write_hgrm(result.tick_histogram, str(run_dir / f"{TICK_TO_DECISION}.hgrm"))
        result.write_hlog(str(run_dir / f"{TICK_TO_DECISION}.hlog"))
    if lateness.get_total_count():
        write_hgrm(lateness, str(run_dir / "pacer_lateness.hgrm"))


class Progress:
    """A one-line live progress display (rich), refreshed from the pacer once a second."""

    def __init__(self, total: int, label: str) -> None:
        self.p = RichProgress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                              TimeRemainingColumn(), auto_refresh=False, transient=True)
        self.task = self.p.add_task("send", total=total, rate="")
        self.p.start()
        self._last = (perf_ns(), 0)

    def update(self, sent: int, total: int) -> None:
        now = perf_ns()
        t, n = self._last
        rate = (sent - n) / ((now - t) / 1e9) if now > t else 0.0
        self._last = (now, sent)
        self.p.update(self.task, completed=sent, rate=f"{rate:,.0f} ev/s")
        self.p.refresh()

    def done(self, sent: int) -> None:
        self.p.update(self.task, completed=sent)
        self.p.stop()


def print_result(out: dict, title: str) -> None:
    console = Console()
    t = Table(title=title)
    for col in ("stage", "count", "p50 µs", "p90 µs", "p99 µs", "p99.9 µs", "max µs"):
        t.add_column(col, justify="right" if col != "stage" else "left")

    def row(name: str, r: dict) -> None:
        def f(x):
            return "-" if x is None else f"{x:,.1f}"

        t.add_row(name, f"{r['count']:,}", f(r["p50_us"]), f(r["p90_us"]), f(r["p99_us"]), f(r["p999_us"]),
                  f(r["max_us"]))

    for stage, r in out["stages"].items():
        row(stage, r)
    row(TICK_TO_DECISION, out[TICK_TO_DECISION])
    row("pacer lateness", out["pacer_lateness"])
    console.print(t)
    acc = out["accounting"]
    console.print("accounting: " + ", ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}"
                                             for k, v in acc.items()))
    console.print(f"results: {out['run_dir']}/summary.json")
