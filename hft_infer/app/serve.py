"""`hft-infer serve`: run the service until SIGINT/SIGTERM, then drain and report.

Start-up order: config and pre-flight (malformed, refused and busy endpoints
fail here, in milliseconds, before torch is imported) -> placement, zmq
context, authenticator -> model and engine -> sockets -> run directory and
control process -> warm-up (systemd is first asked to extend its start
timeout) -> READY (start-up line, Status on the decision socket, systemd
notification) -> loop. On stop: drain, final Status, per-stage table on
stdout, summary JSON (and .hgrm files) in the run dir, exit 0.

A failed start exits 2 with one line: every socket it opened is closed and
the zmq context ends with linger 0 (a socket left open, such as one whose
bind failed, makes Context.term() wait forever), and it leaves no empty run
directory behind. A fatal error later logs once and exits non-zero so
systemd restarts it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import uvloop
import zmq

from hft_infer.affinity import (
    apply_placement,
    configure_zmq_context,
    confine_process,
    finish_warmup,
    plan_for_config,
)
from hft_infer.channels import check_transports
from hft_infer.config import Config, ConfigError, load_config, to_toml_dict
from hft_infer.control.process import (
    start_control_process,
    stop_control_process,
    wait_for_url,
)
from hft_infer.metrics import format_table
from hft_infer.metrics.hlog import write_hgrm as write_one
from hft_infer.sdnotify import Notifier, watchdog_interval_s
from hft_infer.security import (
    check_security,
    config_endpoints,
    curve_for_egress,
    curve_for_ingest,
    start_authenticator,
)
from hft_infer.transport.sockets import EndpointError, ensure_bindable


def parse_shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ConfigError(f"--shard {text!r}: expected I/N, e.g. 0/2") from None
    if not (n >= 1 and 0 <= i < n):
        raise ConfigError(f"--shard {text!r}: need 0 <= I < N")
    return i, n


def with_shard(args: argparse.Namespace) -> list[str]:
    """The --set overrides, and --shard I/N's as two more."""
    overrides = list(getattr(args, "overrides", []) or [])
    if getattr(args, "shard", None):
        i, n = parse_shard(args.shard)
        overrides += [f"universe.shard_index={i}", f"universe.shard_count={n}"]
    return overrides


def resolve_config(args: argparse.Namespace) -> Config:
    overrides = with_shard(args)
    try:
        return load_config(args.config, overrides)
    except ConfigError as e:  # a problem of --shard's own overrides is blamed on --shard, which the user typed
        msg = str(e)
        for o in overrides[-2:] if getattr(args, "shard", None) else []:
            prefix = f"--set {o}: "
            if msg.startswith(prefix):
                raise ConfigError(f"--shard {args.shard}: {msg[len(prefix):]}") from None
        raise


def run_dir_path(cfg: Config, explicit: str | None) -> Path:
    """Where this run's summary and histograms go (created once the sockets are open)."""
    return Path(explicit or cfg.service.run_dir or os.path.join(
        "runs", f"{cfg.service.name}-{time.strftime('%Y%m%d-%H%M%S')}"))


def preflight(cfg: Config) -> list[str]:
    """What `serve` refuses, checked before anything slow: the security policy and every
    endpoint's syntax (ConfigError naming the field), and that each endpoint to bind is free
    (EndpointError). Returns the policy's warnings."""
    warnings = check_security(cfg)
    check_transports(cfg)
    shm_sides = {f"{side}.endpoint" for side in ("ingest", "egress") if getattr(cfg, side).transport != "zmq"}
    for name, endpoint, binds in config_endpoints(cfg):
        if binds and name not in shm_sides:  # an iceoryx2 side binds nothing
            try:
                ensure_bindable(endpoint)
            except EndpointError as e:
                raise EndpointError(f"{name}: {e}") from None
    return warnings


def write_hgrm(stages_cumulative: dict, run_dir: Path) -> None:
    """Percentile distributions (HdrHistogram .hgrm, values in microseconds), when no
    control process writes them."""
    for stage, hist in stages_cumulative.items():
        if hist.get_total_count():
            write_one(hist, str(run_dir / f"{stage}.hgrm"))


def start_control(cfg: Config, args: argparse.Namespace, run_dir: Path, plan, log):
    """The control process (dashboard, /metrics, .hlog/.hgrm), kept off the hot core.
    It is optional: if it cannot start, the service runs without it."""
    if not cfg.control.enabled or getattr(args, "no_control", False):
        return None
    overrides = with_shard(args)
    port = cfg.control.port
    if port and cfg.universe.shard_count > 1:
        port += cfg.universe.shard_index  # one dashboard per shard on one host
    proc = start_control_process(args.config, overrides, str(run_dir), port=port)
    confine_process(proc.pid, plan)
    try:
        log(f"dashboard {wait_for_url(str(run_dir), proc, 30.0)} (Prometheus at /metrics)")
    except RuntimeError as e:
        log(f"warning: no dashboard: {e}")
        stop_control_process(proc)  # it may still be starting: do not leave it behind
        return None
    return proc


def main(args: argparse.Namespace) -> int:
    cfg = resolve_config(args)
    log = _logger(cfg.service.name)
    for warning in preflight(cfg):
        log(f"warning: {warning}")
    run_dir = run_dir_path(cfg, getattr(args, "run_dir", None))
    created_run_dir = not run_dir.exists()
    try:
        return _serve(cfg, args, run_dir, log)
    except BaseException:
        if created_run_dir:
            with contextlib.suppress(OSError):
                run_dir.rmdir()  # only if still empty: a control.log says what happened
        raise


def _serve(cfg: Config, args: argparse.Namespace, run_dir: Path, log) -> int:
    # After the pre-flight: importing torch (the runner, the service) takes seconds.
    from hft_infer.runner.select import resolve_device
    from hft_infer.service import Service

    control = None
    with contextlib.ExitStack() as cleanup:  # in reverse: service, auth, zmq, notifier, control
        # The control process stops last, after the final snapshot (.hlog, .hgrm).
        cleanup.callback(lambda: control is not None and stop_control_process(control))
        notifier = Notifier.from_env(unset_environment=True)  # children must not notify in our name
        cleanup.callback(notifier.close)
        # Placement first: the zmq context (and its IO thread) is made and placed
        # before the hot thread is pinned, and big buffers are allocated after the
        # pinning so that first touch lands on the hot core's NUMA node.
        plan = plan_for_config(cfg, resolve_device(cfg))
        ctx = zmq.Context()
        # After every socket and the authenticator are closed: after a clean stop only the
        # egress socket's linger (the last decisions) is waited for; after a failed start
        # the sockets still open (one whose bind failed) are closed with linger 0.
        cleanup.callback(ctx.destroy, linger=0)
        zmq_step = configure_zmq_context(ctx, plan)
        report = apply_placement(plan, strict=cfg.cpu.strict, steps=[zmq_step])
        auth = start_authenticator(ctx, cfg)
        if auth is not None:
            cleanup.callback(auth.stop)  # its sockets belong to its thread: stopped before ctx.destroy
        service = Service(cfg, log=log)
        _open_sockets(service, cfg, ctx)
        cleanup.callback(service.close)
        run_dir.mkdir(parents=True, exist_ok=True)
        control = start_control(cfg, args, run_dir, plan, log)
        _prepare(service, cfg, report, notifier, log)

        def on_ready() -> None:
            line = (f"READY engine={service.engine.name} precision={service.engine.precision} "
                    f"({service.engine.reason}) model={service.model_version} "
                    f"ingest={service.endpoints['ingest']} decisions={service.endpoints['decisions']} "
                    f"poll={cfg.ingest.poll_mode} policy={cfg.scheduler.policy} "
                    f"{'conflating' if service.sched.conflate else 'sequential'} "
                    f"instruments={service.n_slots} {ring_summary(service.store)} run_dir={run_dir}")
            log(line)
            notifier.ready(status=line)

        uvloop.run(service.run(on_ready=on_ready))
    return _report(service, cfg, run_dir, args, wrote_hgrm=control is not None, log=log)


def ring_summary(store) -> str:
    """The feature ring's size for the READY line: what a universe and a queue depth cost in memory
    (pinned on a GPU host: runner/select.py, ring_depth, says what sets the depth)."""
    mb = store.tensor.numel() * store.tensor.element_size() / 1e6
    return f"ring_depth={store.depth} ring_mb={mb:.1f}{'(pinned)' if store.tensor.is_pinned() else ''}"


def _open_sockets(service, cfg: Config, ctx) -> None:
    """Bind/connect with CURVE where configured. On failure the engine is closed here:
    Service.close() expects every socket, and the half-open ones are ctx.destroy's."""
    try:
        service.open_sockets(ctx, curve_ingest=curve_for_ingest(cfg), curve_egress=curve_for_egress(cfg))
    except BaseException:
        service.engine.close()
        raise


def _prepare(service, cfg: Config, report, notifier, log) -> None:
    """Warm-up, post-warm-up placement, systemd hooks."""
    from hft_infer.runner.worker import WorkerEngine, shared_core_warning

    # A cold Triton compile and graph capture can take minutes: from here systemd allows
    # start_timeout_s more before it gives up on READY=1 (TimeoutStartSec of the unit).
    notifier.extend_timeout(cfg.service.start_timeout_s)
    service.warm_up()
    finish_warmup(report, strict=cfg.cpu.strict, heap=service.heap)
    service.placement = report.as_labels()
    for line in report.log_block().splitlines():
        log(line)
    if isinstance(service.engine, WorkerEngine) and (why := shared_core_warning(report)):
        log(f"warning: runner.cpu_worker: {why}: the worker then only adds a hand-off per step; give the "
            f"service a second core (cpu.cores) or set runner.cpu_worker = false")
    watchdog_s = watchdog_interval_s()
    if watchdog_s is not None:
        last = [0.0]

        def watchdog() -> None:  # from housekeeping: a wedged loop stops sending it
            now = time.monotonic()
            if now - last[0] >= watchdog_s:
                notifier.watchdog()
                last[0] = now

        service.on_housekeeping = watchdog
    service.on_stopping = lambda: notifier.stopping(status="draining")


def _report(service, cfg: Config, run_dir: Path, args: argparse.Namespace, *, wrote_hgrm: bool, log) -> int:
    """Print the per-stage table and the accounting; write service.json (and .hgrm)."""
    summary = service.summary() | {"config": to_toml_dict(cfg), "run_dir": str(run_dir)}
    title = f"hft-infer serve: latency by stage (µs), engine={service.engine.name}"
    print(format_table(summary["stages"], title=title))
    acc = summary["accounting"]
    print("accounting: " + ", ".join(f"{k}={v}" for k, v in acc.items()))
    extra = {k: v for k, v in summary["counters"].items() if k not in acc and v}
    if extra:
        print("counters: " + ", ".join(f"{k}={v}" for k, v in extra.items()))
    if summary["rejected_by_reason"]:
        print("rejected/shed by reason: " + ", ".join(f"{k}={v}" for k, v in summary["rejected_by_reason"].items()))
    text = json.dumps(summary, indent=2)
    (run_dir / "service.json").write_text(text)
    if not wrote_hgrm:
        write_hgrm(service.stages.cumulative, run_dir)
    if getattr(args, "json", None):
        Path(args.json).write_text(text)
    if service.failure:  # the engine failed: everything was answered as shed; systemd restarts us
        log(f"error: stopped on a fatal engine failure: {service.failure}")
        return 3
    if acc["pending"] != 0:
        log(f"error: {acc['pending']} events left without an outcome")
        return 1
    return 0


def _logger(name: str):
    def log(msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {name}: {msg}", file=sys.stderr, flush=True)

    return log
