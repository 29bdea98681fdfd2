"""`hft-infer serve`: run the service until SIGINT/SIGTERM, then drain and report.

Start-up order: config -> sockets (a busy endpoint fails before the slow
parts) -> model, engine, warm-up -> READY (start-up line, Status on the
decision socket, systemd notification) -> loop. On stop: drain, final Status,
per-stage table on stdout, summary JSON (and .hgrm files) in the run dir,
exit 0. A fatal error logs once and exits non-zero so systemd restarts it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from hft_infer.config import Config, ConfigError, load_config, to_toml_dict


def parse_shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ConfigError(f"--shard {text!r}: expected I/N, e.g. 0/2") from None
    if not (n >= 1 and 0 <= i < n):
        raise ConfigError(f"--shard {text!r}: need 0 <= I < N")
    return i, n


def resolve_config(args: argparse.Namespace) -> Config:
    overrides = list(getattr(args, "overrides", []) or [])
    if getattr(args, "shard", None):
        i, n = parse_shard(args.shard)
        overrides += [f"universe.shard_index={i}", f"universe.shard_count={n}"]
    return load_config(args.config, overrides)


def make_run_dir(cfg: Config, explicit: str | None) -> Path:
    path = explicit or cfg.service.run_dir or os.path.join(
        "runs", f"{cfg.service.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    return p


def write_hgrm(stages_cumulative: dict, run_dir: Path) -> None:
    """Percentile distributions (HdrHistogram .hgrm text, values in microseconds)."""
    import io

    for stage, hist in stages_cumulative.items():
        if hist.get_total_count() == 0:
            continue
        buf = io.BytesIO()  # hdrh writes bytes
        hist.output_percentile_distribution(buf, 1000.0)
        (run_dir / f"{stage}.hgrm").write_bytes(buf.getvalue())


def main(args: argparse.Namespace) -> int:
    import uvloop
    import zmq

    from hft_infer.affinity import apply_placement, configure_zmq_context, finish_warmup, plan_placement
    from hft_infer.metrics import format_table
    from hft_infer.sdnotify import Notifier, watchdog_interval_s
    from hft_infer.security import check_security, curve_for_egress, curve_for_ingest, start_authenticator
    from hft_infer.service import Service

    cfg = resolve_config(args)
    run_dir = make_run_dir(cfg, getattr(args, "run_dir", None))
    log = _logger(cfg.service.name)
    notifier = Notifier.from_env(unset_environment=True)  # children must not notify in our name
    watchdog_s = watchdog_interval_s()
    for warning in check_security(cfg):
        log(f"warning: {warning}")

    # Placement first: the zmq context (and its IO thread) is made and placed
    # before the hot thread is pinned, and big buffers are allocated after the
    # pinning so that first touch lands on the hot core's NUMA node.
    from hft_infer.runner.select import resolve_device

    plan = plan_placement(cfg.cpu, resolve_device(cfg), slot=cfg.universe.shard_index)
    ctx = zmq.Context()
    zmq_step = configure_zmq_context(ctx, plan)
    auth = start_authenticator(ctx, cfg)
    report = apply_placement(plan, strict=cfg.cpu.strict, steps=[zmq_step])

    service = Service(cfg, log=log)
    try:
        service.open_sockets(ctx, curve_ingest=curve_for_ingest(cfg), curve_egress=curve_for_egress(cfg))
        service.warm_up()
        finish_warmup(report, strict=cfg.cpu.strict)
        service.placement = report.as_labels()
        for line in report.log_block().splitlines():
            log(line)
        if watchdog_s is not None:
            last_watchdog = [0.0]

            def watchdog() -> None:
                now = time.monotonic()
                if now - last_watchdog[0] >= watchdog_s:
                    notifier.watchdog()
                    last_watchdog[0] = now

            service.on_housekeeping = watchdog
        service.on_stopping = lambda: notifier.stopping(status="draining")

        def on_ready() -> None:
            line = (f"READY engine={service.engine.name} ({service.engine.reason}) model={service.model_version} "
                    f"ingest={service.endpoints['ingest']} decisions={service.endpoints['decisions']} "
                    f"poll={cfg.ingest.poll_mode} policy={cfg.scheduler.policy} "
                    f"{'conflating' if service.sched.conflate else 'sequential'} "
                    f"instruments={service.n_slots} run_dir={run_dir}")
            log(line)
            notifier.ready(status=line)

        uvloop.run(service.run(on_ready=on_ready))
    finally:
        service.close()
        if auth is not None:
            auth.stop()
        ctx.term()  # after every socket (the authenticator's too) is closed
        notifier.close()
    summary = service.summary() | {"config": to_toml_dict(cfg), "run_dir": str(run_dir)}
    print(format_table(summary["stages"], title=f"hft-infer serve: latency by stage (µs), engine={service.engine.name}"))
    acc = summary["accounting"]
    print("accounting: " + ", ".join(f"{k}={v}" for k, v in acc.items()))
    extra = {k: v for k, v in summary["counters"].items() if k not in acc and v}
    if extra:
        print("counters: " + ", ".join(f"{k}={v}" for k, v in extra.items()))
    if summary["rejected_by_reason"]:
        print("rejected/shed by reason: " + ", ".join(f"{k}={v}" for k, v in summary["rejected_by_reason"].items()))
    text = json.dumps(summary, indent=2)
    (run_dir / "service.json").write_text(text)
    write_hgrm(service.stages.cumulative, run_dir)
    if getattr(args, "json", None):
        Path(args.json).write_text(text)
    if acc["pending"] != 0:
        log(f"error: {acc['pending']} events left without an outcome")
        return 1
    return 0


def _logger(name: str):
    def log(msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {name}: {msg}", file=sys.stderr, flush=True)

    return log
