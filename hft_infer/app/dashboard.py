"""`hft-infer dashboard`: the control process (dashboard, /metrics, HDR logs) on its own."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import signal
import sys
import time

import uvloop

from hft_infer.config import expand_endpoint, load_config
from hft_infer.control.server import ControlProcess
from hft_infer.control.settings import ControlSettings
from hft_infer.errors import UserError
from hft_infer.transport.sockets import is_local_endpoint


def settings_from_args(args: argparse.Namespace) -> ControlSettings:
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
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(args: argparse.Namespace) -> int:
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
