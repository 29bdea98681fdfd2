#!/usr/bin/env python3
"""What one ingest burst costs after the loop has done something else: back to back, after a
spin, after a sleep, after a model step, after touching a large array.

    python tools/bench_cold_burst.py [--model lstm_a] [--instruments 1024] [--frames 13]
                                     [--events-per-frame 8] [--reps 40] [--json PATH]

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

import hft_infer.ingest_batch as ingest_batch

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
    rig = Rig([f'model.preset="{a.model}"', "scheduler.capacity=262144", f"ingest.max_drain={a.frames}",
               "scheduler.max_pending_per_instrument=4096", f"scheduler.max_age_us={a.max_age_us}"],
              n_inst=a.instruments)
    frames = event_batches(per_burst * 3 * len(CONDITIONS) * a.reps, a.events_per_frame, n_inst=a.instruments)
    got: dict[str, list[int]] = {name: [] for name in CONDITIONS}
    shed: dict[str, list[int]] = {name: [] for name in CONDITIONS}  # events of the measured burst shed
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
                t0 = time.thread_time_ns()
                n = step.ingest()
                got[name].append(time.thread_time_ns() - t0)
                shed[name].append(rig.svc.acct.shed - shed0)
                if n != a.frames:
                    raise SystemExit(f"bench_cold_burst: the measured burst read {n} of {a.frames} frames")
    finally:
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
    if a.json:
        write_json(a.json, {"model": a.model, "instruments": a.instruments, "frames": a.frames,
                            "events_per_frame": a.events_per_frame, "reps": a.reps,
                            "max_age_us": a.max_age_us,
                            "rows": [dict(zip(("then", "p50_us", "p90_us", "ns_per_event", "ratio", "shed"), r))
                                     for r in rows]})
    if len({s for per in shed.values() for s in per}) > 1:
        raise SystemExit(f"bench_cold_burst: the measured bursts shed different numbers of events "
                         f"({ {k: sorted(set(v)) for k, v in shed.items()} }): the rows did different work")


if __name__ == "__main__":
    main()
