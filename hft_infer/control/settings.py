"""What the control process is told at start, and the files it writes in its run directory."""

from __future__ import annotations

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
