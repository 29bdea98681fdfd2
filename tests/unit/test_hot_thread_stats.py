"""The hot thread's preemption counters: read from the kernel for the thread that made the reader,
counted from then, absent (not zero) where the kernel does not say."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hft_infer.hot_thread_stats import ThreadSchedStats

HAS_PROC = os.path.exists(f"/proc/self/task/{threading.get_native_id()}/status")


def _fake_proc(root: Path, tid: int, switches: int | None, wait_ns: int | None) -> None:
    d = root / f"self/task/{tid}"
    d.mkdir(parents=True, exist_ok=True)
    if switches is not None:
        (d / "status").write_text("Name:\tpython3\nvoluntary_ctxt_switches:\t7\n"
                                  f"nonvoluntary_ctxt_switches:\t{switches}\n")
    if wait_ns is not None:
        (d / "schedstat").write_text(f"123456 {wait_ns} 42\n")


def test_counts_from_construction(tmp_path):
    _fake_proc(tmp_path, 77, 10, 5_000_000)
    stats = ThreadSchedStats(tid=77, proc_root=str(tmp_path))
    assert stats.counters() == {"hot_preemptions": 0, "hot_runqueue_wait_us": 0}
    _fake_proc(tmp_path, 77, 13, 5_250_999)
    assert stats.counters() == {"hot_preemptions": 3, "hot_runqueue_wait_us": 250}


def test_unreadable_counters_are_absent_not_zero(tmp_path):
    _fake_proc(tmp_path, 5, 10, None)  # no schedstat (a kernel without CONFIG_SCHED_INFO)
    stats = ThreadSchedStats(tid=5, proc_root=str(tmp_path))
    assert stats.counters() == {"hot_preemptions": 0}
    (tmp_path / "self/task/5/status").write_text("nonvoluntary_ctxt_switches:\tgarbage\n")
    assert stats.counters() == {}
    assert ThreadSchedStats(tid=6, proc_root=str(tmp_path)).counters() == {}  # no such thread


@pytest.mark.skipif(not HAS_PROC, reason="needs Linux procfs")
def test_a_thread_sharing_its_core_with_a_spinning_process_is_seen_preempted():
    """A busy process pinned to the core of a spinning thread (the case of another shard's helper,
    or another shard, on a hot core): the kernel switches the thread out for it, and the reader
    made on that thread counts it. Alone on its core, over the same time, it counts (nearly) none."""
    core = sorted(os.sched_getaffinity(0))[-1]
    out: dict = {}

    def spin(seconds: float) -> None:
        os.sched_setaffinity(0, {core})
        stats = ThreadSchedStats()
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            pass
        out.update(stats.counters())

    hog = subprocess.Popen([sys.executable, "-c", f"import os, time; os.sched_setaffinity(0, {{{core}}}); "
                            "t = time.monotonic() + 0.8\nwhile time.monotonic() < t: pass"])
    try:
        time.sleep(0.1)  # the hog spinning first
        t = threading.Thread(target=spin, args=(0.5,))
        t.start()
        t.join()
    finally:
        hog.wait(timeout=30)
    assert out["hot_preemptions"] > 0 and out["hot_runqueue_wait_us"] > 50_000, out  # about half of 0.5 s
