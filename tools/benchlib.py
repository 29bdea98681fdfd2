"""What every benchmark script ends with: a table on stdout and, with --json, a file that says where it ran.

    from benchlib import percentile_table, table, write_json

- `table(headers, rows)`: plain text, every column as wide as its widest
  cell, so no value is ever cut or pushes the columns out of line (fixed
  `f"{x:8.0f}"` widths did both); numbers right-aligned, text left-aligned,
  None and NaN shown as "-".
- `percentile_table(stages)`: the usual per-stage latency table from summary
  dicts (`count`, `p50_us`, `p90_us`, `p99_us`, `p999_us`, `max_us`: the
  bench/replay JSON schema, `hft_infer.metrics.summarize`).
- `write_json(path, result)`: the result under "result", beside "meta": the
  command line, the machine (host, CPU model, cores usable here, load
  average, kernel), the date, the git commit (and whether the tree had
  uncommitted changes) and the Python, torch, numpy, pyzmq and msgspec
  versions. A figure without these cannot be compared with another.

Only the standard library: versions are read from the installed
distributions' metadata, so writing them imports nothing (torch alone takes
seconds to import).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

PERCENTILE_COLUMNS = [("count", "count"), ("p50", "p50_us"), ("p90", "p90_us"), ("p99", "p99_us"),
                      ("p99.9", "p999_us"), ("max", "max_us")]
VERSIONED = ("hft-infer", "torch", "triton", "numpy", "pyzmq", "msgspec")


def cell(value: Any, digits: int = 1) -> str:
    """One table cell: "-" for None/NaN, ints as they are, floats with `digits` decimals."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _numeric(text: str) -> bool:
    t = text.replace(",", "").rstrip("x%")
    try:
        float(t)
    except ValueError:
        return t == "-"
    return True


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str = "", digits: int = 1) -> str:
    """A plain-text table whose columns fit their widest cell (header or value)."""
    text_rows = [[v if isinstance(v, str) else cell(v, digits) for v in row] for row in rows]
    columns = len(headers)
    for r in text_rows:
        if len(r) != columns:
            raise ValueError(f"row {r!r} has {len(r)} cells for {columns} headers")
    widths = [max([len(h), *(len(r[i]) for r in text_rows)]) for i, h in enumerate(headers)]
    # a column is right-aligned when every value in it reads as a number
    right = [bool(text_rows) and all(_numeric(r[i]) for r in text_rows) for i in range(columns)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right)).rstrip()

    out = [title] if title else []
    out.append(line(headers))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in text_rows)
    return "\n".join(out)


def percentile_table(stages: dict[str, dict], *, title: str = "", first: str = "stage",
                     unit: str = "µs") -> str:
    """Per-stage percentiles from summary dicts (count, p50_us, ... max_us); values in `unit`."""
    headers = [first] + [name if key == "count" else f"{name} {unit}" for name, key in PERCENTILE_COLUMNS]
    rows = [[name] + [summary.get(key) for _, key in PERCENTILE_COLUMNS] for name, summary in stages.items()]
    return table(headers, rows, title=title)


# --------------------------------------------------------------------------- JSON with provenance


def graph_device_us(graph, steps_per_replay: int, reps: int) -> list[float]:
    """Device µs per step of a captured CUDA graph that holds `steps_per_replay` steps: CUDA
    events around each of `reps` replays, after one untimed replay."""
    import torch

    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / steps_per_replay)
    return times


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                           cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def run_meta(argv: Sequence[str] | None = None) -> dict:
    """Where and how a result was produced (see the module docstring)."""
    argv = list(sys.argv if argv is None else argv)
    # HFT_COMMIT (tools/gpu_session.sh sets it) first: a device copy may carry an older .git
    commit = os.environ.get("HFT_COMMIT") or _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain") if commit and "HFT_COMMIT" not in os.environ else None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    return {
        "command": shlex.join([Path(sys.executable).name, *argv]),
        "argv": argv,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {
            "host": socket.gethostname(),
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "cpus_usable": usable,
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "kernel": platform.release(),
            "platform": platform.platform(),
        },
        "git": {"commit": commit, "dirty": bool(status) if status is not None else None},
        "versions": {"python": platform.python_version(), **{d: _version(d) for d in VERSIONED}},
    }


def write_json(path: str | os.PathLike, result: Any, *, argv: Sequence[str] | None = None) -> dict:
    """Write {"meta": run_meta(), "result": result} to `path`; returns what was written."""
    doc = {"meta": run_meta(argv), "result": result}
    Path(path).write_text(json.dumps(doc, indent=2, default=_plain) + "\n")
    return doc


def _plain(value: Any) -> Any:
    """numpy scalars and arrays, tuples of them, paths: as JSON-able Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


__all__ = ["cell", "cpu_model", "percentile_table", "run_meta", "table", "write_json"]
