"""Starting and stopping the control process (snapshots in, dashboard + /metrics + HDR
logs out) as a child of `serve`.

`hft-infer dashboard` (hft_infer.app.dashboard) runs it on its own; `serve`
starts it as a subprocess with `start_control_process` and stops it with
`stop_control_process`. This module is the process handling (light to
import); the running process is server.py, its settings settings.py.

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

import os
import signal
import subprocess
import sys
import time

from hft_infer.control.settings import LOG_FILE, URL_FILE


def control_command(config_path: str | None = None, overrides=(), run_dir: str | None = None, *,
                    endpoint: str | None = None, host: str | None = None, port: int | None = None,
                    extra=()) -> list[str]:
    cmd = [sys.executable, "-m", "hft_infer", "dashboard"]
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
