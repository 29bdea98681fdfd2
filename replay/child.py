"""The load generator's processes: how the driver starts and talks to them, and how they place themselves.

The pacer (`replay.pacer_proc`) and the collector (`replay.collector_proc`)
run as separate processes so that neither delays the other: a collector that
shared the pacer's thread could only read decisions when the pacer had time
to spare, and timestamped them late whenever it did not.

Protocol: one line of text per command on the child's stdin, one line per
reply on its stdout (`ready`, `done N`, `error MESSAGE`, ...); the child's
stderr goes to a log file. Commands are rare (start, stop, a few waits at
the end), so a pipe costs nothing during the run. Results come back in a
file the child writes at the end (numpy .npz), never over a socket during
the measurement.

Placement (`pin_self`, `zmq_context`): the driver picks a core per process
(hft_infer.app.launcher.plan_harness); each child pins itself there and puts
its libzmq I/O thread on the driver's helper cores, because a spinning thread
starves an I/O thread that shares its core (DESIGN.md, measured floors).
"""

from __future__ import annotations

import ctypes
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import zmq

PR_SET_TIMERSLACK = 29  # linux/prctl.h


class ChildError(RuntimeError):
    """A harness process failed or did not answer; the message is one line plus its log tail."""


class ChildTimeout(ChildError):
    """A harness process did not send the reply waited for in time (it may still be running)."""


# ------------------------------------------------------------------ child side


def set_timer_slack(ns: int = 1) -> bool:
    """Shrink this thread's timer slack (Linux default 50 us), by which the kernel may
    delay a sleeping thread's wake-up to batch timers: time.sleep(20 us) overshot by
    ~68 us at p50 with the default and ~17 us with 1 ns on the dev VM (2026-12-02)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, ns, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def zmq_context(io_cores: list[int]) -> zmq.Context:
    """A context whose I/O threads run on `io_cores` (set before its first socket: libzmq
    applies the mask when it starts them)."""
    ctx = zmq.Context()
    allowed = os.sched_getaffinity(0)
    for core in io_cores:
        if core in allowed:  # libzmq aborts the process on a core it cannot use
            ctx.set(zmq.THREAD_AFFINITY_CPU_ADD, core)
    return ctx


def pin_self(core: int | None) -> str:
    """Pin the calling thread to `core`; returns what happened, for the log."""
    if core is None:
        return "unpinned"
    try:
        os.sched_setaffinity(0, {core})
    except OSError as e:
        return f"pin to core {core} refused: {e.strerror}"
    return f"pinned to core {core}"


def reply(*words) -> None:
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


class Commands:
    """Non-blocking reader of command lines on stdin. `eof` is set when the driver is gone."""

    def __init__(self) -> None:
        self.fd = sys.stdin.fileno()
        self._buf = b""
        self.eof = False

    def poll(self, timeout_s: float = 0.0) -> list[str]:
        if self.eof:
            return []
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        if not ready:
            return []
        data = os.read(self.fd, 65536)
        if not data:
            self.eof = True
            return []
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        return [ln.decode().strip() for ln in lines if ln.strip()]


def parse_cores(text: str | None) -> list[int]:
    return [int(c) for c in text.split(",") if c] if text else []


# ------------------------------------------------------------------ driver side


class Child:
    """A harness process started by the driver: send commands, wait for replies."""

    def __init__(self, name: str, module: str, args: list[str], log_path: Path,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", module, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, env=env, bufsize=0)
        self._buf = b""
        self.lines: list[str] = []  # replies received but not yet consumed
        self.eof = False

    def send(self, *words) -> None:
        try:
            self.proc.stdin.write((" ".join(str(w) for w in words) + "\n").encode())
        except (BrokenPipeError, OSError):
            raise ChildError(self._failure("exited")) from None

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def read_available(self) -> None:
        data = os.read(self.fileno(), 65536)
        if not data:
            self.eof = True
            return
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        self.lines += [ln.decode().strip() for ln in lines if ln.strip()]

    def take(self, word: str) -> str | None:
        """The first pending reply starting with `word` (removed), or None. An `error`
        reply raises ChildError."""
        for i, line in enumerate(self.lines):
            if line.startswith("error"):
                raise ChildError(f"{self.name}: {line[len('error'):].strip()}")
            if line.split(" ", 1)[0] == word:
                return self.lines.pop(i)
        return None

    def _failure(self, what: str) -> str:
        self._log.flush()
        try:
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-10:])
        except OSError:
            tail = ""
        code = self.proc.poll()
        return f"the {self.name} process {what}" + (f" (exit code {code})" if code is not None else "") + \
            (f"; its log {self.log_path}:\n{tail}" if tail else "")

    def check_alive(self) -> None:
        if self.eof or self.proc.poll() is not None:
            for line in self.lines:  # an error reply explains the exit better than the code
                if line.startswith("error"):
                    raise ChildError(f"{self.name}: {line[len('error'):].strip()}")
            try:
                self.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass
            raise ChildError(self._failure("exited"))

    def close(self, timeout_s: float = 5.0) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b"exit\n")
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def wait_replies(wanted: dict[Child, str], timeout_s: float, *, on_idle=None, on_line=None,
                 idle_s: float = 0.05) -> dict[Child, str]:
    """Block until every child in `wanted` has sent a reply starting with its word.

    `on_idle()` runs at least every `idle_s` (it may raise, e.g. when the service
    died); `on_line(child, line)` sees every other reply (progress lines).
    Raises ChildError on a child's exit or an `error` reply, ChildTimeout on the timeout.
    """
    got: dict[Child, str] = {}
    deadline = time.monotonic() + timeout_s

    def collect() -> None:
        for child, word in wanted.items():
            if child in got:
                continue
            line = child.take(word)
            if line is not None:
                got[child] = line
            elif on_line is not None:
                while child.lines and not child.lines[0].startswith("error"):
                    on_line(child, child.lines.pop(0))

    collect()
    while len(got) < len(wanted):
        if time.monotonic() > deadline:
            # each late child's log tail says how far it got (the pacer: how many subscriptions came)
            raise ChildTimeout("\n".join(c._failure(f"sent no {w!r} reply within {timeout_s:.0f} s")
                                       for c, w in wanted.items() if c not in got))
        pending = [c for c in wanted if c not in got]
        readable, _, _ = select.select(pending, [], [], idle_s)
        for child in readable:
            child.read_available()
        collect()
        for child in pending:
            if child not in got:
                child.check_alive()
        if on_idle is not None:
            on_idle()
    return got
