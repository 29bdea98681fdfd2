#!/usr/bin/env python3
"""CPU step time of each model preset and executor, as the eager engine runs them.

    nice -n 10 python tools/bench_models_cpu.py                  # all presets, batch 1/8/64
    python tools/bench_models_cpu.py --presets lstm_a --batches 1 8 --budget-s 0.5

Per preset and batch size: one executor step (gather rows from the ring ->
preprocess -> model -> scores) timed with perf_counter_ns, median and p99 in
microseconds. LSTM `window` mode two ways, (a) recompute each window with
torch.nn.LSTM and (b) the incremental open-window method, plus `stream`
(one recurrent step per event); the speedup column is (a) / (b) at the median.
The batch holds distinct instruments, every window full (positions >= W).
Threads default to 1, as the service runs (runner.torch_threads).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time

import numpy as np
import torch

from hft_infer.models import PRESETS, build_model, dataset as ds
from hft_infer.models.build import build_executor
from hft_infer.replay.synthetic import SyntheticConfig, generate


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def time_steps(ex, batch: int, start: int, budget_s: float, min_iters: int, max_iters: int) -> np.ndarray:
    """Step times in ns; positions advance by one per step so stateful executors see in-order rows."""
    slots = torch.arange(batch, dtype=torch.int64)
    out = torch.empty(batch, dtype=torch.float32)
    pos = torch.full((batch,), start, dtype=torch.int64)
    for _ in range(2):  # warm-up: first-touch of scratch, BLAS dispatch
        ex.step(slots, pos, out)
        pos += 1
    times = []
    t_end = time.perf_counter() + budget_s
    while len(times) < max_iters and (len(times) < min_iters or time.perf_counter() < t_end):
        t0 = time.perf_counter_ns()
        ex.step(slots, pos, out)
        times.append(time.perf_counter_ns() - t0)
        pos += 1
    return np.asarray(times, dtype=np.float64)


def stats_us(ns: np.ndarray) -> tuple[float, float]:
    return float(np.median(ns)) / 1e3, float(np.percentile(ns, 99)) / 1e3


def fmt(cell: tuple[float, float] | None) -> str:
    if cell is None:
        return "-"
    med, p99 = cell

    def one(v: float) -> str:
        return f"{v / 1e3:.1f} ms" if v >= 10_000 else f"{v:.0f}"
    return f"{one(med)} / {one(p99)}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64])
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1, as the service)")
    p.add_argument("--budget-s", type=float, default=1.0, help="time budget per cell (default 1 s)")
    p.add_argument("--min-iters", type=int, default=5)
    p.add_argument("--max-iters", type=int, default=3000)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    max_batch = max(args.batches)

    print(f"# CPU model step, {datetime.date.today()}, {cpu_name()}, {torch.get_num_threads()} thread(s), "
          f"torch {torch.__version__}")
    print("median / p99 per step in µs (ms where marked); speedup = recompute / incremental (median)\n")
    print("| preset | params | batch | window: recompute (nn.LSTM) | window: incremental | speedup | stream |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.presets:
        spec = PRESETS[name]
        model = build_model(spec, seed=0)
        n_params = sum(t.numel() for t in model.parameters())
        ev = generate(4 * spec.window * (max_batch + 1), SyntheticConfig(instruments=max_batch + 1, seed=1))
        rows = torch.from_numpy(ds.raw_rows(ev, spec.levels))
        ring = rows[: (max_batch + 1) * spec.window].reshape(max_batch + 1, spec.window, spec.features).clone()
        start = spec.window  # every window full
        for batch in args.batches:
            cells: dict[str, tuple[float, float] | None] = {"recompute": None, "incremental": None, "stream": None}
            runs = [("recompute", "window", "recompute")]
            if spec.kind == "lstm":
                runs += [("incremental", "window", "incremental"), ("stream", "stream", "incremental")]
            for key, mode, method in runs:
                ex = build_executor(model, ring, max_batch=max_batch, mode=mode, window_method=method)
                ns = time_steps(ex, batch, start, args.budget_s, args.min_iters, args.max_iters)
                cells[key] = stats_us(ns)
                del ex
            if spec.kind == "mlp":  # one window method: the MLP reads its window from the ring
                row = (f"| {name} | {n_params / 1e6:.2f}M | {batch} | {fmt(cells['recompute'])} (mlp window) "
                       f"| - | - | - |")
            else:
                speedup = cells["recompute"][0] / cells["incremental"][0]
                row = (f"| {name} | {n_params / 1e6:.2f}M | {batch} | {fmt(cells['recompute'])} | "
                       f"{fmt(cells['incremental'])} | {speedup:.1f}x | {fmt(cells['stream'])} |")
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
