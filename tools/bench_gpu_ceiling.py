#!/usr/bin/env python3
"""How many rows a second one GPU steps when N processes step it at once (needs CUDA; run
under MPS as the shards are: `bash tools/with_mps.sh python tools/bench_gpu_ceiling.py ...`).

    python tools/bench_gpu_ceiling.py --procs 11 --batches 42,64 --precisions fp32,tf32,bf16 \
        [--inflight 3] [--seconds 3] [--cores 5-15] [--json out.json]

Why: N lstm_a shards at ~1M events/s together stepped ~24k steps (~1M rows) a second whatever
their layout (BENCHMARKS.md wave 27), each step's wall time ~1.2 ms against ~45 µs of device
time alone. This measures that ceiling without the service: no feed, no ingest, no publish, only
the engine the service runs (`build_runtime` from a config like configs/gpu.toml: lstm_a window,
incremental, graph engine, `runner.precision` per row), each process keeping `--inflight` steps
of B rows (each of `--batches`) in flight back to back, all processes started together. Each
precision and batch is run by one process alone (the solo row) and by all N, so the table says what
sharing the GPU costs; rows/s that grows with the batch says the steps, not the arithmetic, are
what the GPU runs out of.

Every process is pinned to its own core (`--cores`, as bench --shards pins the shards), builds its
engine (self-checked as serve does), says it is ready, and waits for the start time the parent
sends once all are ready; rows/s is the sum over processes of rows stepped over the same window.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
from benchlib import table, write_json

from hft_infer.topology import parse_cpulist

N_SLOTS = 96  # ~1,024 instruments over 11 shards
HEADERS = ["precision", "processes", "batch", "in flight", "steps/s", "rows/s", "step p50 µs (median proc)",
           "step p99 µs (worst proc)"]


def _batches(spec: str) -> list[int]:
    return [int(b) for b in spec.split(",")]


# ------------------------------------------------------------------ worker (one process)

def _build(precision: str, inflight: int, batches: list[int], engine: str, device: str):
    from hft_infer.config import load_config
    from hft_infer.runner.select import build_runtime

    buckets = sorted({1, 2, 4, 8, 16, 32, 64, *batches})
    cfg = load_config(None, ['model.checkpoint=""', 'model.preset="lstm_a"', 'model.mode="window"',
                             'model.window_method="incremental"', f'runner.engine="{engine}"',
                             f'runner.device="{device}"', f'runner.precision="{precision}"',
                             f"runner.max_inflight={inflight}", f"runner.buckets={buckets}",
                             f"scheduler.max_batch={max(buckets)}", f"universe.instruments={N_SLOTS}"])
    rt = build_runtime(cfg, N_SLOTS)
    rng = np.random.default_rng(os.getpid())
    store = rt.store
    store.array[:N_SLOTS] = (rng.random((N_SLOTS, store.depth, store.width)) * 10 + 95).astype(np.float32)
    for slot in range(N_SLOTS):
        store.count[slot] = store.depth
    return rt


def _run(eng, batch: int, start_epoch: float, seconds: float) -> dict:
    """Keep the engine's buffers full of `batch`-row steps from start_epoch for `seconds`."""
    lat = []
    t_submit = []
    ring = np.tile(np.arange(N_SLOTS), 2)  # ring[k:k + batch]: the next `batch` slots from k, wrapping
    pos = 1
    k = 0
    while time.time() < start_epoch:
        pass
    t_end = time.perf_counter_ns() + int(seconds * 1e9)
    steps = 0
    while True:
        now = time.perf_counter_ns()
        if now >= t_end and not eng.in_flight:
            break
        if now < t_end and eng.can_submit:
            slots, positions = eng.request()
            slots[:batch] = ring[k:k + batch]  # a different set of slots each step
            positions[:batch] = pos
            k = (k + batch) % N_SLOTS
            pos += 1
            t_submit.append(time.perf_counter_ns())
            eng.submit(batch)
            continue
        if eng.poll():
            eng.collect()
            lat.append(time.perf_counter_ns() - t_submit[steps])
            steps += 1
    us = np.array(lat, dtype=np.float64) / 1e3
    return {"steps": steps, "rows": steps * batch, "seconds": seconds,
            "p50_us": float(np.percentile(us, 50)) if steps else None,
            "p99_us": float(np.percentile(us, 99)) if steps else None}


def worker(args) -> None:
    if args.core >= 0:
        os.sched_setaffinity(0, {args.core})
    for precision in args.precisions.split(","):
        rt = _build(precision, args.inflight, _batches(args.batches), args.engine, args.device)
        print(json.dumps({"ready": precision}), flush=True)
        for line in sys.stdin:
            cmd = line.split()
            if cmd[0] == "run":
                r = _run(rt.engine, int(cmd[2]), float(cmd[1]), args.seconds)
                print(json.dumps(r | {"precision": precision}), flush=True)
            elif cmd[0] == "next":
                break
        rt.engine.close()


# ------------------------------------------------------------------ parent

def _expect(p: subprocess.Popen, key: str) -> dict:
    line = p.stdout.readline()
    if not line:
        raise SystemExit(f"bench_gpu_ceiling: a worker exited early (exit {p.wait()}); its stderr is above")
    msg = json.loads(line)
    if key not in msg:
        raise SystemExit(f"bench_gpu_ceiling: a worker said {line.strip()!r}, expected {key!r}")
    return msg


def _phase(workers: list, batch: int) -> list[dict]:
    start = time.time() + 0.5
    for p in workers:
        p.stdin.write(f"run {start} {batch}\n")
        p.stdin.flush()
    return [_expect(p, "steps") for p in workers]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=11, help="processes stepping the GPU at once (default 11)")
    ap.add_argument("--batches", default="42,64", help="rows a step, each in turn (default 42,64: 42 is what 11 "
                    "shards at ~91k events/s stepping ~2,200 times a second carry)")
    ap.add_argument("--precisions", default="fp32,tf32,bf16")
    ap.add_argument("--inflight", type=int, default=3, help="steps each process keeps in flight (runner.max_inflight)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--cores", default="5-15", help="cores to pin the processes to, one each (default 5-15)")
    ap.add_argument("--engine", default="graph", help="runner.engine (default graph, as gpu.toml picks)")
    ap.add_argument("--device", default="cuda", help="runner.device (cpu with --engine eager: a dry run of the tool)")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--core", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    try:
        batches = _batches(args.batches)
    except ValueError:
        ap.error(f"--batches {args.batches!r}: a comma-separated list of whole numbers")
    if not all(1 <= b <= 64 for b in batches):
        ap.error("--batches: each 1 to 64 (the largest bucket)")
    try:
        cores = parse_cpulist(args.cores)
    except ValueError:
        ap.error(f"--cores {args.cores!r}: a cpulist such as 5-15 or 2,4-6")
    if len(cores) < args.procs:
        ap.error(f"--cores {args.cores}: {len(cores)} cores for {args.procs} processes")
    cmd = [sys.executable, __file__, "--worker", "--batches", args.batches, "--precisions", args.precisions,
           "--inflight", str(args.inflight), "--seconds", str(args.seconds), "--engine", args.engine,
           "--device", args.device]
    workers = [subprocess.Popen(cmd + ["--core", str(cores[i])], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True) for i in range(args.procs)]
    results = []
    try:
        for precision in args.precisions.split(","):
            for p in workers:
                _expect(p, "ready")
            for batch in batches:
                for label, group in (("solo", workers[:1]), (f"{args.procs} at once", workers)):
                    got = _phase(group, batch)
                    steps = sum(r["steps"] for r in got)
                    n_rows = sum(r["rows"] for r in got)
                    worst_p99 = max((r["p99_us"] or 0.0) for r in got)
                    p50 = float(np.median([r["p50_us"] for r in got if r["p50_us"] is not None]))
                    res = {"precision": precision, "procs": len(group), "solo": label == "solo", "batch": batch,
                           "inflight": args.inflight,
                           "steps_per_s": steps / args.seconds, "rows_per_s": n_rows / args.seconds,
                           "step_p50_us": p50, "step_p99_us_worst": worst_p99, "per_proc": got}
                    results.append(res)
                    print(table(HEADERS, [[precision, label, batch, args.inflight, round(res["steps_per_s"]),
                                           round(res["rows_per_s"]), p50, worst_p99]]), flush=True)
            for p in workers:
                p.stdin.write("next\n")
                p.stdin.flush()
    finally:
        for p in workers:
            try:
                p.stdin.close()
            except OSError:
                pass
            p.wait(timeout=60)
    first = results[0]["precision"]
    base = {(r["solo"], r["batch"]): r["rows_per_s"] for r in results if r["precision"] == first}
    print()
    print(table(HEADERS[:6] + [f"rows/s vs {first}"] + HEADERS[6:],
                [[r["precision"], r["procs"], r["batch"], r["inflight"], round(r["steps_per_s"]),
                  round(r["rows_per_s"]), r["rows_per_s"] / base.get((r["solo"], r["batch"]), math.nan),
                  r["step_p50_us"], r["step_p99_us_worst"]] for r in results], digits=2))
    print("rows/s: rows stepped by all processes over the same window; a step's time is submit -> collect "
          "as the process saw it (with its other steps in flight)")
    if args.json:
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
