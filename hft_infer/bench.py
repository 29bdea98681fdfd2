"""`hft-infer bench`: the service under open-loop synthetic load, measured end to end.

One process of ours (this one) is the market-data publisher, the decision
collector and the stats receiver; the service runs as a subprocess exactly
as `hft-infer serve` would, on a private runtime dir (so it cannot collide
with a running service). Steps:

1. generate the synthetic feed (replay.synthetic), encode every frame, fix
   every event's intended send time (constant or Poisson at --rate);
2. start `hft-infer serve`, wait until it has subscribed to every instrument
   and published its first Status (READY);
3. pace the feed open-loop (replay.pacer) while collecting decisions
   (replay.collector) and the service's per-interval stage histograms (the
   control-plane snapshots, received here instead of by a dashboard);
4. SIGTERM the service: it drains and sends a final Status; wait for it;
5. account for every event, print the tables, write the JSON.

This module is CLI level: it may use `replay` (the service core may not).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import zmq

from hft_infer.cli import UserError
from hft_infer.clock import perf_ns
from hft_infer.config import Config, expand_endpoint, load_config, to_toml_dict
from hft_infer.metrics import SERVICE_STAGES, TICK_TO_DECISION, add_sparse, format_table, from_wire, new_histogram, summarize

class StatsReceiver:
    """Binds the control endpoint and folds the service's interval snapshots."""

    def __init__(self, ctx: zmq.Context, endpoint: str) -> None:
        from hft_infer.transport.sockets import bind

        self.sock = ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        bind(self.sock, endpoint)
        self.snapshots = []
        self.measure_after_ns = None  # epoch ns: intervals ending before this are warm-up
        self.hists = {}

    def poll(self) -> None:
        from hft_infer.control.protocol import decode_snapshot

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


def main(args: argparse.Namespace) -> int:
    out, _stats = run(args)
    _print_result(out)
    if out["service_exit_code"] != 0:
        print(f"bench: the service exited with code {out['service_exit_code']}; see {out['run_dir']}/service.log",
              file=sys.stderr)
        return 1
    return 0 if out["accounting"]["lost"] == 0 else 1


def run(args: argparse.Namespace) -> tuple[dict, "StatsReceiver"]:
    """Run one bench; returns the result dict (also written to run_dir/summary.json) and the
    stats receiver (every interval snapshot the service shipped, e.g. for soak analysis)."""
    from hft_infer.launcher import ServiceProcess, open_feed_publisher, private_runtime_dir, subscribe_decisions
    from hft_infer.replay.pacer import Pacer, constant_rate, encode_feed, poisson_rate
    from hft_infer.replay.synthetic import SyntheticConfig, generate

    if args.rate <= 0 or args.duration <= 0 or args.warmup < 0:
        raise UserError("--rate and --duration must be > 0, --warmup >= 0")
    cfg: Config = load_config(args.config, args.overrides)
    runtime = private_runtime_dir("hft-bench-")
    os.environ["HFT_INFER_RUNTIME_DIR"] = runtime  # the service child inherits it
    run_dir = Path(args.run_dir or os.path.join("runs", f"bench-{time.strftime('%Y%m%d-%H%M%S')}"))
    run_dir.mkdir(parents=True, exist_ok=True)
    ids = cfg.universe.owned_ids()
    n_inst = args.instruments or len(ids)
    if n_inst > len(ids):
        raise UserError(f"--instruments {n_inst} exceeds the service's universe ({len(ids)} instruments)")
    quiet = args.quiet

    def say(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    n_warm = int(args.rate * args.warmup)
    n_total = n_warm + int(args.rate * args.duration)
    say(f"bench: generating {n_total} synthetic events over {n_inst} instruments ...")
    from hft_infer.models.checkpoint import load_model

    levels = load_model(cfg.model.checkpoint, preset=cfg.model.preset, seed=cfg.model.seed,
                        mode=cfg.model.mode)[0].spec.levels
    events = generate(n_total, SyntheticConfig(instruments=n_inst, levels=levels, seed=args.seed,
                                               rate_hz=args.rate))
    if ids != list(range(len(ids))):  # map generator ids 0..n-1 onto the configured ids
        events["instrument"] = np.asarray(ids, dtype=np.uint32)[events["instrument"]]
    feed = encode_feed(events)
    offsets = poisson_rate(n_total, args.rate, args.seed) if args.poisson else constant_rate(n_total, args.rate)

    ctx = zmq.Context()
    ingest_ep = expand_endpoint(cfg.ingest.endpoint, cfg)
    decisions_ep = expand_endpoint(cfg.egress.endpoint, cfg)
    control_ep = expand_endpoint(cfg.metrics.control_endpoint, cfg)
    if cfg.ingest.socket_type != "sub" or cfg.ingest.bind:
        raise UserError("bench publishes on a PUB the service connects to: needs ingest.socket_type = \"sub\" "
                        "and ingest.bind = false")
    pub = open_feed_publisher(ctx, ingest_ep)
    stats = StatsReceiver(ctx, control_ep)
    service = ServiceProcess(config=args.config, overrides=args.overrides, run_dir=run_dir / "service",
                             log_dir=run_dir, env=os.environ.copy())
    try:
        service.start()
        collector = subscribe_decisions(ctx, decisions_ep, topic_frame=cfg.egress.topic_frame)
        service.wait_ready(pub, collector, n_topics=len(ids) if cfg.ingest.topic_frame else 1)
        say(f"bench: service ready; offering {args.rate:g} events/s for {args.duration:g} s "
            f"(+{args.warmup:g} s warm-up), {'Poisson' if args.poisson else 'constant'} arrivals")

        def idle() -> None:
            collector.poll()
            stats.poll()

        progress = None if quiet else _Progress(n_total)
        pacer = Pacer(pub, feed, offsets, topic_frame=cfg.ingest.topic_frame, idle_hook=idle,
                      progress_hook=progress.update if progress else None)
        stats.measure_after_ns = time.time_ns() + int(args.warmup * 1e9)
        pace = pacer.run()
        if progress:
            progress.done(pace.sent)
        collector.wait_quiet(quiet_s=0.3, timeout_s=10.0)
        if not service.terminate_and_wait(collector):
            say("bench: warning: no final Status from the service within 30 s")
        for _ in range(20):  # the final snapshot may trail the final Status by a moment
            stats.poll()
            if stats.snapshots and stats.snapshots[-1].final:
                break
            time.sleep(0.05)
    finally:
        service.close()
        ctx.destroy(linger=0)
        shutil.rmtree(runtime, ignore_errors=True)
    child = service.proc

    result = collector.analyse(events["instrument"], events["seq"], pace.intended_mono_ns, pace.sent,
                               measure_from=n_warm)
    lateness = new_histogram()
    from hft_infer.metrics import record_array

    record_array(lateness, pace.lateness_ns[n_warm:])
    out = {
        "config": to_toml_dict(cfg),
        "rate_offered": args.rate,
        "rate_achieved": pace.rate_achieved,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "instruments": n_inst,
        "engine": result.service_status.engine if result.service_status else None,
        "model_version": result.service_status.model_version if result.service_status else None,
        "stages": stats.summary(),
        TICK_TO_DECISION: result.tick_to_decision,
        "pacer_lateness": summarize(lateness),
        "accounting": result.accounting,
        "service_exit_code": child.returncode,
        "duplicates": result.duplicates,
        "unmatched_decisions": result.unmatched,
        "run_dir": str(run_dir),
    }
    text = json.dumps(out, indent=2)
    (run_dir / "summary.json").write_text(text)
    if args.json:
        Path(args.json).write_text(text)
    return out, stats


class _Progress:
    """A one-line live progress display (rich), refreshed from the pacer once a second."""

    def __init__(self, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.p = Progress(TextColumn("bench"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                          TimeRemainingColumn(), auto_refresh=False, transient=True)
        self.task = self.p.add_task("send", total=total, rate="")
        self.p.start()
        self._t0 = perf_ns()
        self._last = (self._t0, 0)

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


def _print_result(out: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title=f"hft-infer bench — {out['rate_offered']:g} events/s offered, {out['rate_achieved']:,.0f} achieved, "
                    f"engine={out['engine']}, model={out['model_version']}")
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


__all__ = ["main", "format_table"]
