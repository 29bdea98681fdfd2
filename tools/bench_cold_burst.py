#!/usr/bin/env python3
"""What one ingest burst costs after the loop has done something else: back to back, after a
spin, after a sleep, after a model step, after touching a large array.

    python tools/bench_cold_burst.py [--model lstm_a] [--instruments 1024] [--frames 13]
                                     [--events-per-frame 8] [--reps 40] [--phases] [--json PATH]

Why: a saturated shard on the H200 host spends ~75 % of its loop in ingest at ~7 µs per event
(the `ingest` stage and the stall counters of `gpu_session.sh wave23`), where
`tools/bench_hotpath.py` measures ~1-2 µs per event for the same frames read back to back. Each
row here is the same burst (--frames EventBatch frames of --events-per-frame events over
--instruments instruments, a sequential model unless --model says otherwise) read by the
service's own Stepper.ingest after two warm-up bursts and then one of:

  back to back         nothing (the microbenchmark's case)
  spin 1 ms            a Python loop on the clock: no memory touched (the machine's own noise)
  sleep 1 ms           time.sleep (the core may run other work, or idle)
  model step           the service's own submit (forced) + collect + flush of what the warm-up
                       bursts queued: the code a saturated loop runs between two bursts (the graph
                       engine on a GPU, the CPU engine here)
  touch 8 MB           a numpy pass over 8 MB (caches evicted by data)

Thread CPU time per burst (time.thread_time_ns): median and p90 over --reps, per event, and the
ratio to back to back. The rows are interleaved rep by rep so that a noisy machine hits all alike.

--phases also times the burst's parts (the service's own methods, wrapped: PHASES) per row, in
wall-clock µs (perf_counter: the wrappers' own cost is in them), so that a machine where the burst
is slow says which part is. Every run prints a calibration line first -- one small numpy call
(np.add of 42 floats into a buffer) and one iteration of a plain Python loop, in ns -- to tell a
machine slow at numpy calls from one slow at the interpreter.

Every row's burst must do the same work, or the ratio measures the work and not the caches: the
default scheduler.max_age_us (--max-age-us, 1 s) keeps deadline admission from shedding the burst
LATE (its learned margin and pace carry from one row to the next: with the service's 5 ms, the
bursts after a forced model step were partly shed and those after 8 MB wholly, 2026-12-05), and
the table's `shed` column says what each row's burst shed. The run fails if the rows' sheds differ.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from bench_hotpath import Rig, event_batches
from benchlib import table, write_json

import hft_infer.ingest as ingest_module
import hft_infer.ingest_batch as ingest_batch
import hft_infer.scheduler as scheduler_module

_TOUCH = np.ones(1 << 20)  # 8 MB of float64


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _model_step(rig: Rig) -> None:
    step = rig.svc.step
    step.submit(force=True)
    step.drain_inflight()
    step.flush()


CONDITIONS = {
    "back to back": lambda rig: None,
    "spin 1 ms": lambda rig: _spin(0.001),
    "sleep 1 ms": lambda rig: time.sleep(0.001),
    "model step": _model_step,
    "touch 8 MB": lambda rig: _TOUCH.sum(),
}


# the parts of a burst, outermost first: (owner, attribute, label)
PHASES = (
    (ingest_module.Ingest, "drain", "Ingest.drain (the burst)"),
    (ingest_module.Ingest, "_finish", "  _finish (decode + handle)"),
    (ingest_batch, "merged_event_columns", "    merged_event_columns"),
    (ingest_batch.EventBatchPaths, "_batch_columns", "    _batch_columns"),
    (ingest_batch.EventBatchPaths, "_queue_run_in_order", "      _queue_run_in_order"),
    (scheduler_module.Scheduler, "run_waits_ns", "        Scheduler.run_waits_ns"),
    (ingest_batch.EventBatchPaths, "_write_rows", "        _write_rows"),
    (scheduler_module.Scheduler, "push_columns", "        Scheduler.push_columns"),
    # push_many's loop: the per-event path's chunks (a run under COLUMNS_MIN), and a baseline tree's
    # column path before push_columns (when this tool times one)
    (scheduler_module.Scheduler, "push_in_order", "        Scheduler.push_in_order"),
)


class PhaseClock:
    """Wraps each of PHASES so that, while `on`, the wall-clock ns spent inside it is summed."""

    def __init__(self) -> None:
        self.on = False
        self.ns: dict[str, int] = {}
        self._saved = []
        for owner, attr, label in PHASES:
            if not hasattr(owner, attr):  # another tree's parts (PYTHONPATH): its own rows only
                continue
            self._saved.append((owner, attr, getattr(owner, attr)))
            setattr(owner, attr, self._wrap(getattr(owner, attr), label))

    def _wrap(self, f, label: str):
        perf = time.perf_counter_ns
        acc = self.ns

        def timed(*args, **kwargs):
            if not self.on:
                return f(*args, **kwargs)
            t0 = perf()
            try:
                return f(*args, **kwargs)
            finally:
                acc[label] = acc.get(label, 0) + perf() - t0
        return timed

    def restore(self) -> None:
        for owner, attr, f in self._saved:
            setattr(owner, attr, f)


def calibration(n: int = 20000) -> tuple[float, float]:
    """(ns per small numpy call, ns per plain Python loop iteration), medians of 5."""
    a, b, out = np.ones(42), np.ones(42), np.empty(42)
    add = np.add
    calls, loops = [], []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _i in range(n):
            add(a, b, out=out)
        calls.append((time.perf_counter_ns() - t0) / n)
        t0 = time.perf_counter_ns()
        x = 0
        for i in range(n):
            x += i & 7
        loops.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(calls), statistics.median(loops)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="lstm_a", help="model.preset (default lstm_a: sequential in window mode)")
    ap.add_argument("--instruments", type=int, default=1024)
    ap.add_argument("--frames", type=int, default=13, help="EventBatch frames per burst (default 13)")
    ap.add_argument("--events-per-frame", type=int, default=8)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--columns-min", type=int, default=0, metavar="N",
                    help="ingest_batch.COLUMNS_MIN for this run (default: the code's own; a run of fewer events "
                         "takes the per-event path)")
    ap.add_argument("--max-age-us", type=int, default=1_000_000, metavar="US",
                    help="scheduler.max_age_us (default 1 s: no burst is shed LATE, so every row queues the "
                         "same events; the service's 5000 sheds some rows' bursts and not others')")
    ap.add_argument("--phases", action="store_true",
                    help="also time the burst's parts (PHASES) per row, wall clock")
    ap.add_argument("--json", metavar="PATH")
    a = ap.parse_args()
    if (a.frames < 1 or a.events_per_frame < 1 or a.reps < 1 or a.instruments < 1 or a.columns_min < 0
            or a.max_age_us < 1):
        ap.error("--frames, --events-per-frame, --reps, --instruments and --max-age-us must be >= 1, "
                 "--columns-min >= 0")
    if a.columns_min:
        ingest_batch.COLUMNS_MIN = a.columns_min
    per_burst = a.frames * a.events_per_frame
    # ingest.max_drain = the burst's frames: each Stepper.ingest reads exactly one burst (the
    # in-flight cap, max(16, max_drain // 8), never binds: the step below is collected first)
    cal_call, cal_loop = calibration()
    print(f"calibration: np.add of 42 floats {cal_call:.0f} ns a call; a Python loop {cal_loop:.0f} ns an iteration")
    rig = Rig([f'model.preset="{a.model}"', "scheduler.capacity=262144", f"ingest.max_drain={a.frames}",
               "scheduler.max_pending_per_instrument=4096", f"scheduler.max_age_us={a.max_age_us}"],
              n_inst=a.instruments)
    frames = event_batches(per_burst * 3 * len(CONDITIONS) * a.reps, a.events_per_frame, n_inst=a.instruments)
    got: dict[str, list[int]] = {name: [] for name in CONDITIONS}
    shed: dict[str, list[int]] = {name: [] for name in CONDITIONS}  # events of the measured burst shed
    parts: dict[str, dict[str, list[int]]] = {name: {} for name in CONDITIONS}
    clock = PhaseClock() if a.phases else None
    k = 0
    try:
        for _ in range(a.reps):
            for name, between in CONDITIONS.items():
                rig.reset()
                rig.fill(frames[k:k + 3 * a.frames])
                k += 3 * a.frames
                step = rig.svc.step
                for _warm in range(2):
                    if step.ingest() != a.frames:
                        raise SystemExit("bench_cold_burst: a warm-up burst did not read its frames")
                between(rig)
                shed0 = rig.svc.acct.shed
                if clock is not None:
                    clock.ns.clear()
                    clock.on = True
                t0 = time.thread_time_ns()
                n = step.ingest()
                got[name].append(time.thread_time_ns() - t0)
                if clock is not None:
                    clock.on = False
                    for label, ns in clock.ns.items():
                        parts[name].setdefault(label, []).append(ns)
                shed[name].append(rig.svc.acct.shed - shed0)
                if n != a.frames:
                    raise SystemExit(f"bench_cold_burst: the measured burst read {n} of {a.frames} frames")
    finally:
        if clock is not None:
            clock.restore()
        rig.close()
    base = statistics.median(got["back to back"])
    rows = []
    for name, ns in got.items():
        med = statistics.median(ns)
        p90 = sorted(ns)[int(0.9 * (len(ns) - 1))]
        rows.append((name, med / 1e3, p90 / 1e3, med / per_burst, med / base, statistics.median(shed[name])))
    print(f"one burst of {a.frames} EventBatch frames x {a.events_per_frame} events over {a.instruments} "
          f"instruments ({a.model}, COLUMNS_MIN {ingest_batch.COLUMNS_MIN}), after two warm-up bursts and then ...; "
          f"thread CPU time, {a.reps} reps")
    print(table(["then", "burst p50 µs", "p90 µs", "ns/event", "x back to back", "shed"], rows, digits=2))
    phase_rows = []
    if clock is not None:
        labels = [label for _, _, label in PHASES if label in parts["back to back"]]
        phase_rows = [(label, *(statistics.median(parts[c].get(label, [0])) / 1e3 for c in CONDITIONS))
                      for label in labels]
        print("\nthe burst's parts, p50 wall-clock µs (each includes the parts indented below it)")
        print(table(["part", *CONDITIONS], phase_rows, digits=1))
    if a.json:
        write_json(a.json, {"model": a.model, "instruments": a.instruments, "frames": a.frames,
                            "events_per_frame": a.events_per_frame, "reps": a.reps,
                            "max_age_us": a.max_age_us, "calibration_ns": {"np_add_call": cal_call,
                                                                           "python_loop_iteration": cal_loop},
                            "phases": [dict(zip(("part", *CONDITIONS), r)) for r in phase_rows],
                            "rows": [dict(zip(("then", "p50_us", "p90_us", "ns_per_event", "ratio", "shed"), r))
                                     for r in rows]})
    if len({s for per in shed.values() for s in per}) > 1:
        raise SystemExit(f"bench_cold_burst: the measured bursts shed different numbers of events "
                         f"({ {k: sorted(set(v)) for k, v in shed.items()} }): the rows did different work")


if __name__ == "__main__":
    main()
