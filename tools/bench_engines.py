#!/usr/bin/env python3
"""Host-observed step latency of the GPU engines (issue 6), one run, one table.

    python tools/bench_engines.py [--steps 3000] [--json out.json]

For lstm_a, lstm_b (window mode, incremental) and mlp_small at batch 1, 8, 64,
the time of one `Engine.step(n)` as the hot loop sees it (stage the rows from
the feature store, run, read the decisions back), over --steps steps after a
warm-up, for:

  eager       the fused kernels launched one step at a time (H2D + kernel + D2H + sync), no graph
  graph       runner.gpu.GraphEngine: one CUDA graph replay per step + one sync
  persistent  runner.gpu.PersistentEngine (window LSTM): no launch; flags in pinned memory
  cudnn-graph torch nn.LSTM (cuDNN) over the whole 50-row window, captured in a CUDA graph
              (mlp_small: the torch MLP in a graph) -- the baseline the fused kernels replace

Prints p50/p99/p99.9/max (µs) and each variant's p99 relative to cudnn-graph.
Needs CUDA (exits 2 without).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def percentiles(ns: np.ndarray) -> dict:
    us = ns / 1e3
    return {"p50": float(np.percentile(us, 50)), "p99": float(np.percentile(us, 99)),
            "p999": float(np.percentile(us, 99.9)), "max": float(us.max())}


def time_steps(fn, steps: int, warm: int = 200) -> np.ndarray:
    for _ in range(warm):
        fn()
    out = np.empty(steps, dtype=np.int64)
    pc = time.perf_counter_ns
    for i in range(steps):
        t0 = pc()
        fn()
        out[i] = pc() - t0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--models", default="lstm_a,lstm_b,mlp_small")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--json")
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("bench_engines: needs a CUDA device", file=sys.stderr)
        return 2
    from hft_infer.features import FeatureStore
    from hft_infer.models import build_model, preset
    from hft_infer.runner.gpu import GraphEngine, KernelStep, PersistentEngine

    n_slots = 64
    buckets = [int(b) for b in a.batches.split(",")]
    results = []
    rng = np.random.default_rng(0)
    for name in a.models.split(","):
        spec = preset(name)
        model = build_model(spec, seed=1)
        depth = spec.window + 64
        store = FeatureStore(n_slots, spec.levels, depth, pin_memory=True)
        # realistic rows: a positive book in every slot
        store.array[:n_slots] = (rng.random((n_slots, depth, spec.features)) * 10 + 95).astype(np.float32)
        for s in range(n_slots):
            store.count[s] = depth

        def kstep(model=model, depth=depth):
            return KernelStep(model, mode="window", window_method="incremental", n_slots=n_slots + 1,
                              ring_depth=depth, max_batch=max(buckets), precision="fp32", threshold=0.2,
                              hysteresis=0.0, device="cuda")

        # One variant at a time: a persistent kernel holds its multiprocessors while it runs,
        # and the graph kernel's grid barrier needs all of its programs resident.
        rows = {b: {"model": name, "batch": b} for b in buckets}
        pos = 10_000

        def measure(vname, eng, rows=rows):
            for b in buckets:
                slots = np.arange(b) % n_slots

                def one(eng=eng, b=b, slots=slots):
                    nonlocal pos
                    e_slots, e_positions = eng.request()
                    e_slots[:b] = slots
                    e_positions[:b] = pos
                    pos += 1
                    eng.step(b)

                rows[b][vname] = percentiles(time_steps(one, a.steps))

        class Eager:  # the graph engine's step body, launched without a graph
            def __init__(self, g):
                self.g = g

            def request(self):
                return self.g._slots[0], self.g._positions[0]

            def step(self, n):
                g = self.g
                b = g.pad(0, n)
                g._stage(b)
                with torch.cuda.stream(g.stream):
                    g._body(b)
                g.stream.synchronize()

        measure("eager", Eager(GraphEngine(kstep(), store, buckets, reason="bench")))
        graph = GraphEngine(kstep(), store, buckets, reason="bench")
        graph.warm_up()
        measure("graph", graph)
        del graph
        torch.cuda.synchronize()
        if spec.kind == "lstm":
            pers = PersistentEngine(kstep(), store, buckets, reason="bench", watchdog_ms=2000)
            pers.warm_up()
            try:
                measure("persistent", pers)
            finally:
                pers.close()
        measure("cudnn-graph", _torch_graph_baseline(model, store, buckets, torch))
        for b in buckets:
            results.append(rows[b])
            print(_line(rows[b]), flush=True)
    print()
    print(f"{'model':10s} {'batch':>5s} {'variant':12s} {'p50 µs':>8s} {'p99 µs':>8s} {'p99.9 µs':>9s} "
          f"{'max µs':>8s} {'p99 vs cudnn-graph':>19s}")
    for row in results:
        base = row["cudnn-graph"]["p99"]
        for v in ("eager", "graph", "persistent", "cudnn-graph"):
            if v in row:
                r = row[v]
                print(f"{row['model']:10s} {row['batch']:5d} {v:12s} {r['p50']:8.1f} {r['p99']:8.1f} "
                      f"{r['p999']:9.1f} {r['max']:8.1f} {r['p99'] / base:18.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def _line(row: dict) -> str:
    return f"{row['model']} b={row['batch']}: " + ", ".join(
        f"{k} p50 {v['p50']:.1f} p99 {v['p99']:.1f}" for k, v in row.items() if isinstance(v, dict))


def _torch_graph_baseline(model, store, buckets, torch):
    """cuDNN LSTM over the 50-row window (or the torch MLP) captured per bucket, with the same
    host staging (gather the window rows into pinned memory, H2D, run, D2H, sync)."""
    spec = model.spec
    dev_model = model.to("cuda").float().eval()
    w = spec.window
    maxb = max(buckets)
    win_h = torch.zeros(maxb, w, spec.features).pin_memory()
    win_np = win_h.numpy()
    win_d = torch.zeros(maxb, w, spec.features, device="cuda")
    out_d = torch.zeros(maxb, device="cuda")
    out_h = torch.zeros(maxb).pin_memory()
    stream = torch.cuda.Stream()
    graphs = {}
    ring = store.array.reshape(-1, store.width)
    offs = np.arange(-w + 1, 1)

    def body(b):
        win_d[:b].copy_(win_h[:b], non_blocking=True)
        with torch.inference_mode(False), torch.no_grad():
            out_d[:b] = dev_model.forward_window(win_d[:b])
        out_h[:b].copy_(out_d[:b], non_blocking=True)

    with torch.cuda.stream(stream):
        for b in buckets:
            for _ in range(3):
                body(b)
    stream.synchronize()
    pool = torch.cuda.graph_pool_handle()
    for b in sorted(buckets, reverse=True):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool, stream=stream):
            body(b)
        graphs[b] = g

    class Baseline:
        def __init__(self):
            self.slots = np.zeros(maxb, np.int64)
            self.positions = np.zeros(maxb, np.int64)

        def step(self, b):
            idx = self.slots[:b, None] * store.depth + (self.positions[:b, None] + offs) % store.depth
            np.take(ring, idx, axis=0, out=win_np[:b])
            with torch.cuda.stream(stream):
                graphs[b].replay()
            stream.synchronize()

    return Baseline()


if __name__ == "__main__":
    sys.exit(main())
