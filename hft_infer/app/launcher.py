"""Run `hft-infer serve` (or the null service) as a child process, and place the load generator.

Used by `bench`, the replay command, the fault/soak tools and the tests, so
that all of them drive the service exactly as a user starts it (CLI, config,
real sockets) and agree on what "ready" means: every subscription has reached
the feed publisher (an XPUB, so we can see them) and the service's first
Status has arrived on the decision socket. `plan_harness` decides where the
pacer and collector processes of `bench`/`replay` run.

CLI level: may use `replay` (the collector); the service core may not.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import zmq

from hft_infer.affinity import SysFs, format_cpulist, plan_for_config
from hft_infer.clock import perf_ns
from hft_infer.config import Config
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
    """`hft-infer serve` in a child process, its output in `log_dir`; `null=True`: the
    null service (hft_infer.app.null_service) with the same config instead."""

    def __init__(self, *, config: str | None, overrides: list[str], run_dir: Path, log_dir: Path,
                 env: dict[str, str], extra_args: list[str] | None = None, control: bool = False,
                 null: bool = False) -> None:
        if null:
            self.cmd = [sys.executable, "-m", "hft_infer.app.null_service", "--run-dir", str(run_dir)]
        else:
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

    def wait_exit(self, timeout_s: float = 30.0) -> int:
        """Wait for the exit (after SIGTERM); a service that does not exit is killed."""
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise UserError(f"the service did not exit after SIGTERM; see {self.log_path}") from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.kill()
        for f in ("_log", "_out"):
            if hasattr(self, f):
                getattr(self, f).close()


@dataclass
class HarnessPlan:
    """Where the load generator's processes run, and how they wait (hft_infer.app.drive)."""

    pacer_choice: str  # --pacer: auto | spin | sleep
    pacer_spin: bool
    pacer_core: int | None
    collector_spin: bool  # False: it blocks in zmq_poll
    collector_cores: list[int | None]
    helper_cores: list[int]  # libzmq I/O threads, the driver, an unpinned service
    service_cores: list[int]  # the service's hot core(s) as its [cpu] config places it
    cores: int  # the cores this process may use
    reason: str

    def as_dict(self) -> dict:
        return {"pacer": "spin" if self.pacer_spin else "sleep", "pacer_choice": self.pacer_choice,
                "pacer_core": self.pacer_core, "collector": "spin" if self.collector_spin else "block",
                "collector_cores": self.collector_cores, "helper_cores": self.helper_cores,
                "service_cores": self.service_cores, "cores": self.cores, "reason": self.reason}

    def describe(self) -> str:
        where = (f" on core {self.pacer_core}" if self.pacer_core is not None else "")
        cwhere = (f" on core(s) {format_cpulist(c for c in self.collector_cores if c is not None)}"
                  if self.collector_cores and self.collector_cores[0] is not None else "")
        n = len(self.collector_cores)
        return (f"pacer: {'spin' if self.pacer_spin else 'sleep'}{where} (--pacer {self.pacer_choice}); "
                f"collector: {'spin' if self.collector_spin else 'block in poll'}{cwhere}"
                f"{f' x{n}' if n > 1 else ''}; {self.reason}")


MIN_CORES_TO_PIN = 4  # service + pacer + collector + one for I/O threads and everything else


def plan_harness(cfg: Config, pacer_choice: str = "auto", collectors: int = 1,
                 pool: list[int] | None = None, service_cores: list[int] | None = None) -> HarnessPlan:
    """Pick the pacer's and the collectors' cores, away from the service's.

    With MIN_CORES_TO_PIN or more usable cores (this process's affinity mask,
    so `taskset` narrows it) and enough of them beside the service's hot
    core(s): the pacer and each collector get a core of their own, on the
    service's NUMA node first and highest first (core 0 takes most IRQs), the
    collectors spin and the pacer spins unless --pacer sleep; the rest are
    helper cores. With fewer: nothing is pinned, the pacer sleeps (unless
    --pacer spin) and the collectors block in poll, so that no two processes
    spin on a machine that cannot give each its own core. `service_cores`: the
    hot cores of several services (the shards of `bench --shards`), instead of
    the one that `cfg` places.
    """
    pool = sorted(os.sched_getaffinity(0) if pool is None else pool)
    service: list[int] = sorted(set(service_cores or []))
    if service_cores is None and cfg.cpu.cores != "none":
        plan = plan_for_config(cfg, cfg.runner.device, use_torch=False)
        service = list(plan.hot_cores)
    free = [c for c in pool if c not in service]
    need = 1 + collectors + 1
    if len(pool) >= MIN_CORES_TO_PIN and len(free) >= need:
        nodes = SysFs().nodes()
        home = next((n for n, cs in nodes.items() if service and service[0] in cs), None)
        order = sorted(free, key=lambda c: (home is not None and c not in nodes[home], -c))
        chosen = order[:1 + collectors]
        helpers = sorted(c for c in free if c not in chosen)
        return HarnessPlan(pacer_choice, pacer_choice != "sleep", chosen[0], True, chosen[1:], helpers, service,
                           len(pool), f"{len(pool)} cores: one each for the pacer and collector(s), "
                                      f"service on {format_cpulist(service) or 'helper cores (unpinned)'}, "
                                      f"helpers {format_cpulist(helpers)}")
    return HarnessPlan(pacer_choice, pacer_choice == "spin", None, False, [None] * collectors, pool, service,
                       len(pool), f"{len(pool)} cores (fewer than {MIN_CORES_TO_PIN}, or too few beside the "
                                  "service's): nothing pinned, so that no two processes spin")


def subscribe_decisions(ctx: zmq.Context, endpoint: str, *, topic_frame: bool = True) -> Collector:
    return Collector(open_subscriber(ctx, endpoint), topic_frame=topic_frame)


def private_runtime_dir(prefix: str = "hft-") -> str:
    """A fresh, short runtime dir for ipc sockets (paths must stay under ~100 bytes)."""
    path = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.chmod(path, 0o700)
    return path
