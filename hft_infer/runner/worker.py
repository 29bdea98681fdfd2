"""A CPU engine whose steps run on a worker thread, so that the hot loop keeps ingesting.

`runner.cpu_worker = true` wraps the eager engine: `submit` hands the step to
a worker thread and returns; `poll` is True once the worker has finished.
torch and numpy release the GIL inside their kernels, so on a machine with a
core to spare the ingest runs while the model computes. What it costs: a
thread hand-off per step (tens of microseconds in CPython: a condition
variable wake-up), which is why it is off by default and pays only when a
step is long against the per-event work (measured in BENCHMARKS.md).

One step in flight at a time (the eager engine has one staging buffer), in
submission order, so the engine's per-slot state sees steps in order.

The GIL. An eager step is tens of torch and numpy calls, and the worker needs
the GIL for each call's Python and dispatch between the kernels. A loop that
spins while the step is in flight holds the GIL, and the worker gets it back
only when the interpreter forces a switch (`sys.getswitchinterval()`, 5 ms).
On the dev VM (2 cores), lstm_a stream at 20k events/s: the service decided
14-44 % of the events with the spinning loop (step p50 0.7-7.3 ms against
0.25 ms inline), 78-88 % with the sleeping one (step p50 0.7-1.4 ms) and
100 % without the worker (BENCHMARKS.md, wave 17: two cores leave the worker
no core of its own). So a finished step raises `done_fd` (an eventfd) and the
loop, with nothing to ingest, sleeps on it and on the ingest socket instead
of spinning (service.py); `finish` and `reset_slots` block on an Event.
"""

from __future__ import annotations

import ctypes
import os
import threading

from hft_infer.runner.base import Engine, EngineFailure
from hft_infer.topology import format_cpulist

PR_SET_NAME = 15  # linux/prctl.h
THREAD_NAME = "hft-infer-step"  # what top -H, ps -L and the placement report show for the worker


def name_os_thread(name: str) -> None:
    """Give the calling thread `name` in the OS (Python's Thread.name stays inside Python),
    so an operator can tell the step thread from the loop's; a failure is harmless."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def shared_core_warning(report, allowed: set[int] | None = None) -> str | None:
    """Why the step thread would share the loop's core, or None. The worker pays only with a core
    of its own (module docstring; BENCHMARKS.md, wave 17): on a shared one it adds a hand-off per
    step and competes with the loop. `report`: the placement (pinning.py) after warm-up, which
    moved the threads born meanwhile, this one too, onto the helper cores; `allowed`: this
    process's cores (os.sched_getaffinity), for an unpinned loop."""
    if report.outcome("pin") == "applied":
        if report.plan.helper_cores:
            return None
        return (f"the placement plans no helper core, so the step thread stays on the hot core "
                f"{format_cpulist(report.plan.hot_cores)} beside the loop")
    allowed = os.sched_getaffinity(0) if allowed is None else allowed
    if len(allowed) < 2:
        return f"this process may run on core {format_cpulist(allowed)} only, so the step thread shares it"
    return None


class WorkerEngine(Engine):
    JOIN_TIMEOUT_S = 5.0  # close(): how long a step still running may take to end
    max_inflight = 1
    reads_ring_in_flight = True  # the worker reads the ring while the loop ingests
    done_at_submit = False

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.name = inner.name
        self.precision = inner.precision
        self.reason = inner.reason + "; steps on a worker thread (runner.cpu_worker)"
        self.bucket_map = inner.bucket_map
        self.max_batch = inner.max_batch
        self.sink_slot = inner.sink_slot
        self.stateful = inner.stateful
        self.ready = inner.ready
        self.in_flight = 0
        self._job = threading.Condition()
        self._todo: tuple[int, int] | None = None
        self._done = threading.Event()  # set at a step's end (its writes are done): what poll reads, finish waits on
        # readable from the end of a step until it is collected: the idle loop sleeps on it
        self.done_fd: int | None = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._error: BaseException | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    @property
    def can_submit(self) -> bool:
        return self.in_flight == 0

    def request(self):
        return self.inner.request()

    def submit(self, n: int) -> None:
        if self.in_flight:
            raise RuntimeError("submit with the worker's step in flight")
        self.in_flight = 1
        self._done.clear()
        with self._job:
            self._todo = (0, n)
            self._job.notify()

    def poll(self) -> bool:
        if self._error is not None:
            raise EngineFailure(f"CPU step failed on the worker: {type(self._error).__name__}: {self._error}")
        return self.in_flight > 0 and self._done.is_set()

    def collect(self):
        self.in_flight = 0
        try:
            os.eventfd_read(self.done_fd)  # not readable again until the next step ends
        except BlockingIOError:
            pass
        return self.inner.collect()

    def finish(self):
        """Wait for the step in flight, then collect it."""
        self._wait_step()
        return self.collect()

    def _wait_step(self) -> None:
        """Block until the step in flight (if any) has ended, without holding the GIL the worker
        needs; raise its error, if any."""
        if self.in_flight:
            self._done.wait()
        self.poll()

    def _run(self) -> None:
        name_os_thread(THREAD_NAME)
        inner = self.inner
        while True:
            with self._job:
                while self._todo is None and not self._stop:
                    self._job.wait()
                if self._stop:
                    return
                _, n = self._todo
                self._todo = None
            try:
                inner.submit(n)  # the eager engine's submit is the step
            except BaseException as e:  # noqa: BLE001 - reported by the next poll, on the loop's thread
                self._error = e
            self._done.set()
            os.eventfd_write(self.done_fd, 1)

    def warm_up(self, rounds: int = 3) -> None:
        self.inner.warm_up(rounds)
        self.ready = True

    def reset(self) -> None:
        self.inner.reset()

    def reset_slots(self, slots) -> None:
        self._wait_step()  # the step in flight still reads those slots' state
        self.inner.reset_slots(slots)

    def close(self) -> None:
        with self._job:
            self._stop = True
            self._job.notify()
        self._thread.join(timeout=self.JOIN_TIMEOUT_S)
        self.inner.close()
        # a worker still in a step (the join timed out) would write to the FD when it ends: one
        # closed meanwhile could by then be another file's, so it stays open (a leak at exit)
        if self.done_fd is not None and not self._thread.is_alive():
            os.close(self.done_fd)
            self.done_fd = None
