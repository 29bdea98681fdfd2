"""Run `hft-infer serve` as a child process with a feed publisher and a decision subscriber.

Used by `bench`, the replay command, the fault/soak tools and the tests, so
that all of them drive the service exactly as a user starts it (CLI, config,
real sockets) and agree on what "ready" means: every subscription has reached
the feed publisher (an XPUB, so we can see them) and the service's first
Status has arrived on the decision socket.

CLI level: may use `replay` (the collector); the service core may not.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

from hft_infer.clock import perf_ns
from hft_infer.errors import UserError
from hft_infer.replay.collector import Collector
from hft_infer.transport.sockets import bind, open_subscriber

READY_TIMEOUT_S = 180.0


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def open_feed_publisher(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """The feed side: an XPUB (we see the service's subscriptions), unlimited HWM."""
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.setsockopt(zmq.LINGER, 1000)
    bind(pub, endpoint)
    return pub


def wait_ready(child: subprocess.Popen, pub: zmq.Socket, collector: Collector, *, n_topics: int,
               log_path: Path, timeout_s: float = READY_TIMEOUT_S) -> None:
    """READY = `n_topics` subscriptions reached `pub` and the first Status arrived."""
    deadline = perf_ns() + int(timeout_s * 1e9)
    subscribed = 0
    while perf_ns() < deadline:
        if child.poll() is not None:
            raise UserError(f"the service exited during start-up (code {child.returncode}):\n{tail(log_path)}")
        while pub.poll(0):
            if pub.recv()[:1] == b"\x01":
                subscribed += 1
        collector.poll()
        if subscribed >= n_topics and collector.frames:
            collector.frames.clear()
            collector.recv_ns.clear()
            return
        time.sleep(0.01)
    raise UserError(f"the service was not ready within {timeout_s:.0f} s; see {log_path}")


class ServiceProcess:
    """`hft-infer serve` in a child process, its output in `log_dir`."""

    def __init__(self, *, config: str | None, overrides: list[str], run_dir: Path, log_dir: Path,
                 env: dict[str, str], extra_args: list[str] | None = None, control: bool = False) -> None:
        self.cmd = [sys.executable, "-m", "hft_infer", "serve", "--run-dir", str(run_dir)]
        if not control:
            self.cmd.append("--no-control")
        if config:
            self.cmd += ["-c", config]
        for o in overrides:
            self.cmd += ["--set", o]
        self.cmd += extra_args or []
        self.env = env
        self.run_dir = run_dir
        self.log_path = log_dir / "service.log"
        self.out_path = log_dir / "service.out"
        self.proc: subprocess.Popen | None = None

    def start(self) -> subprocess.Popen:
        self._log = open(self.log_path, "w")
        self._out = open(self.out_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._out, stderr=self._log,
                                     env=dict(self.env, PYTHONUNBUFFERED="1"))
        return self.proc

    def wait_ready(self, pub: zmq.Socket, collector: Collector, n_topics: int,
                   timeout_s: float = READY_TIMEOUT_S) -> None:
        wait_ready(self.proc, pub, collector, n_topics=n_topics, log_path=self.log_path, timeout_s=timeout_s)

    def terminate_and_wait(self, collector: Collector, timeout_s: float = 30.0) -> bool:
        """SIGTERM, receive until the final Status, wait for the exit. True if the final Status came."""
        self.proc.send_signal(signal.SIGTERM)
        got_final = collector.wait_final(timeout_s)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise UserError(f"the service did not exit after SIGTERM; see {self.log_path}") from None
        return got_final

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.kill()
        for f in ("_log", "_out"):
            if hasattr(self, f):
                getattr(self, f).close()


def subscribe_decisions(ctx: zmq.Context, endpoint: str, *, topic_frame: bool = True) -> Collector:
    return Collector(open_subscriber(ctx, endpoint), topic_frame=topic_frame)


def private_runtime_dir(prefix: str = "hft-") -> str:
    """A fresh, short runtime dir for ipc sockets (paths must stay under ~100 bytes)."""
    path = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.chmod(path, 0o700)
    return path
