"""Where the loop's long iterations go: the phases of every iteration past a threshold.

`loop_gap` says how long the loop went between two looks at the feed and the
step, not why. Each iteration of `Service._loop` is four phases: read the feed
(`ingest`), collect and answer a finished step (`complete`), form and launch
the next (`submit`), and the rest (`other`: the flush, housekeeping, a fold
under pressure); between iterations the loop yields to asyncio (`yield`:
timers, signals, and in hybrid/event modes its sleep is not counted, see
below). The loop takes five clock readings per iteration (~30-60 ns each)
and hands them here; only an iteration longer than `threshold_ns`
(`metrics.stall_us`, 250 µs by default) is recorded, so the common short one
costs one comparison.

For the stalled iterations it keeps: how many (`stalls`), and the time each
phase took in them, summed (`stall_<phase>_us`). Cumulative counters, in
the stats snapshots, `/metrics` (as seconds) and service.json: the phase whose
sum grows with `stalls` is the one to look at. The yield after an iteration
counts with it when the loop spins (busy polling, or a step in flight); a
sleep on the socket at idle is not a stall and is not counted.
"""

from __future__ import annotations

PHASES = ("ingest", "complete", "submit", "other", "yield")


class LoopStalls:
    __slots__ = ("threshold_ns", "count", "spent_ns")

    def __init__(self, threshold_ns: int) -> None:
        """`threshold_ns`: metrics.stall_us in ns (250 µs by default: an iteration that long delays the
        next look at the feed and the step by about a GPU step's time)."""
        self.threshold_ns = threshold_ns
        self.count = 0
        self.spent_ns = [0] * len(PHASES)

    def record(self, ingest_ns: int, complete_ns: int, submit_ns: int, other_ns: int, yield_ns: int) -> None:
        """One iteration's phases, called only for one past the threshold (the loop checks)."""
        self.count += 1
        spent = self.spent_ns
        spent[0] += ingest_ns
        spent[1] += complete_ns
        spent[2] += submit_ns
        spent[3] += other_ns
        spent[4] += yield_ns

    def counters(self) -> dict[str, int]:
        out = {"stalls": self.count}
        out.update({f"stall_{p}_us": ns // 1000 for p, ns in zip(PHASES, self.spent_ns)})
        return out


# what `bench` reads back from the service's snapshots (with hot_thread_stats.py's two)
LOOP_COUNTERS = ("stalls", *(f"stall_{p}_us" for p in PHASES), "hot_preemptions", "hot_runqueue_wait_us")


def loop_line(loop: dict | None, who: str = "the service") -> str:
    """One line of `bench` output: the loop's stalls and where their time went, and the hot thread's
    preemptions, over the measured intervals (`loop`: LOOP_COUNTERS' growth and `span_s`)."""
    if not loop:
        return f"loop: - ({who}: no stats interval inside the measured feed)"
    phases = ", ".join(f"{p} {loop[f'stall_{p}_us'] / 1000:,.1f}" for p in PHASES)
    return (f"loop ({who}, {loop['span_s']:.1f} s measured): {loop['stalls']:,} iterations past metrics.stall_us, "
            f"their ms by phase: {phases}; hot thread preempted {loop['hot_preemptions']:,} times, "
            f"{loop['hot_runqueue_wait_us'] / 1000:,.1f} ms waiting to run")


__all__ = ["LOOP_COUNTERS", "PHASES", "LoopStalls", "loop_line"]
