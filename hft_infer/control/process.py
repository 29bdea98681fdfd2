"""The control process: snapshots in, dashboard + /metrics + HDR logs out.

`hft-infer dashboard` runs it on its own; `serve` starts it as a subprocess
with `start_control_process` and stops it with `stop_control_process`. This
module is the CLI and process handling (light to import); the running
process is server.py.

It binds a PULL socket at the service's control endpoint; the service's PUSH
(ZMQ_IMMEDIATE, small HWM, NOBLOCK) connects to it. So the two can start,
die and restart in any order: a dead control process costs the hot loop one
failed send per interval, a dead service leaves the dashboard saying "no
data" until a service (the same or a new pid) sends again, and a restarted
control process rebinds the same endpoint, continues the run's .hlog and
starts from the cumulative histograms logged so far.

Signals only set the stop event. On SIGTERM/SIGINT it reads what is already
queued on the socket (the service's final snapshot), writes one .hgrm per
stage, closes the .hlog and exits 0.

Its bound URL goes to the log and to `<run_dir>/dashboard.url` (removed at
exit), so a caller that asked for port 0 can find it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

URL_FILE = "dashboard.url"
HLOG_FILE = "service.hlog"
LOG_FILE = "control.log"


@dataclass(frozen=True)
class ControlSettings:
    endpoint: str  # where this process binds its PULL (expanded)
    host: str
    port: int
    run_dir: str
    hlog: bool = True
    history_points: int = 600
    service_name: str = "hft-infer"


# --- for serve ---------------------------------------------------------------

def control_command(config_path: str | None = None, overrides=(), run_dir: str | None = None, *,
                    endpoint: str | None = None, host: str | None = None, port: int | None = None,
                    extra=()) -> list[str]:
    cmd = [sys.executable, "-m", "hft_infer.cli", "dashboard"]
    if config_path:
        cmd += ["-c", config_path]
    for item in overrides:
        cmd += ["--set", item]
    if run_dir:
        cmd += ["--run-dir", run_dir]
    if endpoint:
        cmd += ["--connect", endpoint]
    if host:
        cmd += ["--host", host]
    if port is not None:
        cmd += ["--port", str(port)]
    return cmd + list(extra)


def start_control_process(config_path: str | None, overrides, run_dir: str, *, endpoint: str | None = None,
                          host: str | None = None, port: int | None = None, extra=(),
                          env: dict | None = None) -> subprocess.Popen:
    """Start `hft-infer dashboard` for this config and run dir; its output goes to
    <run_dir>/control.log. A new session, so a terminal's Ctrl-C reaches only
    the caller, which stops it after the service's final snapshot
    (`stop_control_process`)."""
    os.makedirs(run_dir, exist_ok=True)
    try:
        os.unlink(os.path.join(run_dir, URL_FILE))  # a stale URL must not be mistaken for ours
    except FileNotFoundError:
        pass
    out = open(os.path.join(run_dir, LOG_FILE), "ab")
    try:
        return subprocess.Popen(control_command(config_path, overrides, run_dir, endpoint=endpoint, host=host,
                                                port=port, extra=extra),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    finally:
        out.close()  # the child holds its own descriptor


def wait_for_url(run_dir: str, proc: subprocess.Popen | None = None, timeout_s: float = 20.0) -> str:
    """The dashboard URL once the control process has bound everything.

    Raises RuntimeError with the last line of its log if it exits first or
    does not come up in time.
    """
    path = os.path.join(run_dir, URL_FILE)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                url = f.read().strip()
            if url:
                return url
        except FileNotFoundError:
            pass
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"control process exited with {proc.returncode}: {_last_log_line(run_dir)}")
        time.sleep(0.05)
    raise RuntimeError(f"control process gave no URL within {timeout_s:.0f} s: {_last_log_line(run_dir)}")


def stop_control_process(proc: subprocess.Popen, timeout_s: float = 10.0) -> int:
    """SIGTERM, wait for it to write its .hgrm files, SIGKILL if it hangs; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def _last_log_line(run_dir: str) -> str:
    try:
        with open(os.path.join(run_dir, LOG_FILE), "rb") as f:
            lines = f.read()[-4096:].decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else "(no output)"
    except OSError:
        return "(no log)"


# --- CLI ---------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", metavar="FILE",
                   help="TOML config (default: the embedded default); supplies the endpoint, host, port")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable)")
    p.add_argument("--connect", metavar="ENDPOINT",
                   help="control endpoint the service ships snapshots to; this process binds it "
                        "(default: metrics.control_endpoint)")
    p.add_argument("--host", help="dashboard bind address (default: control.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="dashboard port, 0 = any free one (default: control.port)")
    p.add_argument("--run-dir", metavar="DIR",
                   help="where service.hlog, <stage>.hgrm and dashboard.url go "
                        "(default: service.run_dir, else ./runs/<name>-dashboard-<time>)")
    p.add_argument("--no-hlog", action="store_true", help="do not write the .hlog interval log")
    p.add_argument("--history-points", type=int, default=600, metavar="N",
                   help="points of percentile history kept and plotted (default 600: 10 min at 1 s)")


def settings_from_args(args: argparse.Namespace) -> ControlSettings:
    from hft_infer.cli import UserError
    from hft_infer.config import expand_endpoint, load_config
    from hft_infer.transport.sockets import is_local_endpoint

    cfg = load_config(args.config, args.overrides)
    endpoint = expand_endpoint(args.connect or cfg.metrics.control_endpoint, cfg)
    host = args.host or cfg.control.host
    port = cfg.control.port if args.port is None else args.port
    if not 0 <= port <= 65535:
        raise UserError(f"--port {port}: must be 0..65535")
    if not (1 <= args.history_points <= 100_000):
        raise UserError(f"--history-points {args.history_points}: must be 1..100000")
    if not _is_loopback_host(host) and not cfg.security.allow_remote:
        raise UserError(f"refusing to serve the dashboard on {host!r}: it is not loopback "
                        "(set security.allow_remote = true to allow it)")
    if not is_local_endpoint(endpoint) and not cfg.security.allow_remote:
        raise UserError(f"refusing non-loopback control endpoint {endpoint!r} "
                        "(set security.allow_remote = true to allow it)")
    run_dir = args.run_dir or cfg.service.run_dir or os.path.join(
        "runs", f"{cfg.service.name}-dashboard-{time.strftime('%Y%m%d-%H%M%S')}")
    return ControlSettings(endpoint=endpoint, host=host, port=port, run_dir=run_dir,
                           hlog=cfg.control.hlog and not args.no_hlog, history_points=args.history_points,
                           service_name=cfg.service.name)


def _is_loopback_host(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(args: argparse.Namespace) -> int:
    import asyncio

    import uvloop

    from hft_infer.control.server import ControlProcess

    settings = settings_from_args(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s control %(levelname)s %(message)s",
                        stream=sys.stderr)

    async def amain() -> int:
        proc = ControlProcess(settings)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, proc.request_stop)
        return await proc.run()

    return uvloop.run(amain())
