"""runner.cpu_worker's engine (runner/worker.py) and the GIL: its step runs on a thread that needs
the GIL between kernels, so whoever waits for it must not spin. A finished step raises `done_fd`
(the service's idle loop sleeps on it) until it is collected; `finish` blocks, it does not spin.

CPU time, not wall-clock time, is what these tests hold: a thread that spins for a step of
several milliseconds burns about that much CPU, one that blocks burns almost none."""

from __future__ import annotations

import os
import select
import threading
import time

import numpy as np
import pytest
from service_harness import SLOW_MODEL

from hft_infer.config import load_config
from hft_infer.placement import PlacementPlan, Step
from hft_infer.placement_report import PlacementReport
from hft_infer.runner.base import EngineFailure
from hft_infer.runner.select import build_runtime
from hft_infer.runner.worker import WorkerEngine, shared_core_warning

# at batch 64: a CPU step of several milliseconds
WORKER_MODEL = SLOW_MODEL + ['runner.engine="eager"', "universe.instruments=64"]


@pytest.fixture
def worker():
    cfg = load_config(None, WORKER_MODEL)
    rt = build_runtime(cfg, 64)
    engine = WorkerEngine(rt.engine)
    engine.warm_up(1)
    yield engine
    engine.close()


def _submit_full(engine: WorkerEngine) -> int:
    slots, positions = engine.request()
    n = engine.max_batch
    slots[:n] = np.arange(n) % 64
    positions[:n] = 0
    engine.submit(n)
    return n


def _readable(fd: int, timeout_s: float) -> bool:
    return bool(select.select([fd], [], [], timeout_s)[0])


def test_done_fd_is_readable_from_a_steps_end_until_it_is_collected(worker):
    assert not _readable(worker.done_fd, 0)
    n = _submit_full(worker)
    assert _readable(worker.done_fd, 30.0)  # the step ended (and said so without being polled)
    assert worker.poll()
    assert _readable(worker.done_fd, 0)  # still: nothing collected it yet
    scores, actions = worker.collect()
    assert len(scores) == n == len(actions) and np.isfinite(scores).all()
    assert not _readable(worker.done_fd, 0) and not worker.poll()


def test_finish_blocks_without_spinning_while_the_worker_steps(worker):
    # the step's length on this machine: the thread that waits spends less than a fifth of it on CPU
    t0 = time.perf_counter()
    _submit_full(worker)
    worker.finish()
    step_s = time.perf_counter() - t0
    cpu0 = time.thread_time()
    _submit_full(worker)
    scores, _ = worker.finish()
    waited_cpu_s = time.thread_time() - cpu0
    assert np.isfinite(scores).all() and not worker.in_flight and not _readable(worker.done_fd, 0)
    assert waited_cpu_s < step_s / 5, (waited_cpu_s, step_s)


def test_a_failed_step_is_reported_by_finish_and_still_wakes_the_loop(worker):
    def fail(n):
        raise RuntimeError("boom")

    worker.inner.submit = fail
    worker.submit(1)
    assert _readable(worker.done_fd, 30.0)  # a loop asleep on done_fd wakes for the failure too
    with pytest.raises(EngineFailure, match="boom"):
        worker.finish()


def test_close_ends_the_thread_and_the_fd(worker):
    fd, thread = worker.done_fd, worker._thread
    worker.close()
    assert worker.done_fd is None and not thread.is_alive()
    with pytest.raises(OSError):  # EBADF: closed (nothing else opened an FD meanwhile to reuse it)
        os.fstat(fd)
    worker.close()  # twice (the fixture closes it again): no error


def test_close_leaves_the_fd_open_while_a_step_outlasts_the_join(worker):
    """A step still running when close() gives up waiting will write to done_fd when it ends: the FD
    stays open (a closed number could by then be another file's) and the write lands in it."""
    entered, release = threading.Event(), threading.Event()

    def stuck(n):
        entered.set()
        release.wait(30)

    worker.inner.submit = stuck
    worker.JOIN_TIMEOUT_S = 0.05
    worker.submit(1)
    assert entered.wait(30)  # in the step (a close before it starts ends the thread at once)
    worker.close()
    fd = worker.done_fd
    assert fd is not None and worker._thread.is_alive()
    os.fstat(fd)  # still open
    release.set()
    worker._thread.join(30)
    assert _readable(fd, 5.0)  # the step's end was written to the eventfd, not to another file
    os.close(fd)
    worker.done_fd = None


def _report(pinned: bool, hot=(1,), helpers=(0,)) -> PlacementReport:
    plan = PlacementPlan(mode="explicit", hot_cores=hot, helper_cores=helpers, device="cpu", gpu_pci=None,
                         numa_node=None, isolated=(), rt_priority=0, mlockall=False, gc_freeze=False)
    report = PlacementReport(plan)
    report.add(Step("pin", "applied" if pinned else "refused", "test"))
    return report


def test_serve_warns_when_the_step_thread_would_share_the_loops_core():
    """The worker pays only with a core of its own: `serve` warns (shared_core_warning) when the
    placement leaves the step thread on the hot core, or an unpinned process has one core."""
    assert shared_core_warning(_report(True)) is None  # the step thread goes to the helper core
    why = shared_core_warning(_report(True, hot=(3,), helpers=()))
    assert why is not None and "hot core 3" in why
    assert shared_core_warning(_report(False), allowed={0, 1}) is None
    why = shared_core_warning(_report(False), allowed={5})
    assert why is not None and "core 5 only" in why
