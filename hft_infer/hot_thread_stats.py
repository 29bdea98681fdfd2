"""Was the hot thread preempted? The kernel's own scheduling counters of one thread.

A busy-polling loop pinned to a core should run there alone. When it does
not (another thread allowed on that core, a core that is not isolated, a
sibling shard's helper threads), the scheduler runs the other task in the
loop's place, and the loop stalls for as long as that task runs: stalls the
`loop_gap` stage shows, with no cause named. The kernel counts what it did
to the thread:

- `/proc/self/task/TID/status`, `nonvoluntary_ctxt_switches`: times the
  thread was switched out while runnable (preempted). A busy-polling loop
  never sleeps while serving, so every one is a stall; an idle loop that
  sleeps on the socket adds voluntary switches only.
- `/proc/self/task/TID/schedstat`, its second field: nanoseconds the thread
  spent runnable on a run queue while something else ran.

`ThreadSchedStats` reads both for the thread that creates it (the service
creates it on the hot thread when it starts serving) and reports them since
then as the counters `hot_preemptions` and `hot_runqueue_wait_us` (the
stats snapshots to the control process, service.json; in `/metrics` the
latter in seconds). Two small procfs reads per call: the service calls it
once per snapshot (metrics.stats_interval_ms, 1 s by default) and for its
final summary, never per event. A kernel without these files (or without schedstats) gives
no counters rather than zeros.
"""

from __future__ import annotations

import threading


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


class ThreadSchedStats:
    """The calling thread's preemptions and run-queue wait, counted from construction."""

    def __init__(self, tid: int | None = None, proc_root: str = "/proc") -> None:
        self.tid = threading.get_native_id() if tid is None else tid
        self._status = f"{proc_root}/self/task/{self.tid}/status"
        self._schedstat = f"{proc_root}/self/task/{self.tid}/schedstat"
        self._base = self.read()

    def read(self) -> tuple[int | None, int | None]:
        """(nonvoluntary context switches, run-queue wait in ns) so far; None for what is unreadable."""
        switches = wait = None
        text = _read(self._status)
        if text:
            for line in text.splitlines():
                if line.startswith("nonvoluntary_ctxt_switches:"):
                    try:
                        switches = int(line.split(":", 1)[1])
                    except ValueError:
                        pass
                    break
        text = _read(self._schedstat)
        if text:
            fields = text.split()
            if len(fields) >= 2 and fields[1].isdigit():
                wait = int(fields[1])
        return switches, wait

    def counters(self) -> dict[str, int]:
        """`hot_preemptions` and `hot_runqueue_wait_us` since construction (each only if readable)."""
        switches, wait = self.read()
        base_switches, base_wait = self._base
        out: dict[str, int] = {}
        if switches is not None and base_switches is not None:
            out["hot_preemptions"] = max(0, switches - base_switches)
        if wait is not None and base_wait is not None:
            out["hot_runqueue_wait_us"] = max(0, wait - base_wait) // 1000
        return out


__all__ = ["ThreadSchedStats"]
