#!/usr/bin/env python3
"""KERNEL-LEVEL benchmark of the fused model steps on one GPU. NOT the service's path:
tools/bench_engines.py measures steps through the runner the service runs; this one drives
the kernels directly, with rows already in the pinned host feature ring.

    python3 tools/bench_kernels.py [--models lstm_a,lstm_b,mlp_small,lstm_a_stream]
                                   [--batches 1,8,64] [--precision fp32] [--steps 2000]
                                   [--quick] [--json PATH] [--cpu CORE] [--max-programs N]

Rows per model and batch size (window mode unless "_stream"):

  floor            trivial persistent kernel (flag in, flag out, the same polling code):
                   host-observed submit -> done, batch 1 (one row per model block)
  persistent       the persistent kernel behind the request ring (kernels/persistent.py):
                   host-observed submit -> done p50/p99/p99.9 (one request in flight),
                   device time = %globaltimer stamps in the kernel from "request seen" to
                   "done released" (median), error vs float64 on the same rows
  graph-copies     today's graph engine step: CUDA graph of H2D (rows, slots, positions) +
                   launched kernel + D2H; host-observed replay -> event done
  graph-1node      the launched kernel reading rows from the pinned ring and slots/positions/
                   out in pinned memory: a graph of one kernel node
  device (launch)  CUDA events around a graph of K launched steps, / K

Kernels compile in parallel child processes first (they fill Triton's disk cache). The
table is printed last; --json writes every figure. Exits 2 without CUDA.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import numpy as np
import torch
from benchlib import graph_device_us

MODELS = {"lstm_a": ("lstm_a", "window"), "lstm_b": ("lstm_b", "window"), "mlp_small": ("mlp_small", "mlp"),
          "lstm_a_stream": ("lstm_a", "stream")}
N_INST, DEPTH, MAX_B, NREQ = 64, 64, 64, 4
THR = (0.1, 0.05)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "tf32", "bf16"))
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--device-k", type=int, default=20)
    ap.add_argument("--max-programs", type=int, default=None)
    ap.add_argument("--cpu", type=int, default=None, help="pin this process to a core")
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="300 steps per row (< 3 min with compiles)")
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1))
    a = ap.parse_args(argv)
    a.models = [m for m in a.models.split(",") if m]
    a.batches = [int(b) for b in a.batches.split(",") if b]
    bad = [m for m in a.models if m not in MODELS] + [b for b in a.batches if not 1 <= b <= MAX_B]
    if bad:
        ap.error(f"unknown model or batch outside 1..{MAX_B}: {bad}")
    if a.quick:
        a.steps = 300
    return a


def pct(ns) -> dict:
    us = np.asarray(ns, dtype=np.float64) / 1e3
    return {"p50": float(np.percentile(us, 50)), "p99": float(np.percentile(us, 99)),
            "p99.9": float(np.percentile(us, 99.9)), "max": float(us.max())}


class Setup:
    """One model: packed weights, pinned host ring, device thresholds/held, float64 references."""

    def __init__(self, name: str, precision: str, dev: torch.device):
        from hft_infer.kernels.lstm import prepare_lstm_weights
        from hft_infer.kernels.mlp import prepare_mlp_weights

        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "kernels"))
        from kernels_testlib import make_rows, preset_params

        self.make_rows = make_rows
        self.name, self.precision, self.dev = name, precision, dev
        preset, self.family = MODELS[name]
        self.spec, self.params = preset_params(preset, seed=1234)
        self.f = self.spec.features
        self.ring_h = torch.zeros(N_INST + 1, DEPTH, self.f).pin_memory()
        self.ring_np = self.ring_h.numpy()
        self.thr = torch.tensor(THR, device=dev)
        self.held = torch.zeros(N_INST + 1, dtype=torch.int32, device=dev)
        if self.family == "mlp":
            self.w = prepare_mlp_weights(self.params, precision=precision, device=dev)
        else:
            self.w = prepare_lstm_weights(self.params, precision=precision, device=dev)
        self.window = self.spec.window if self.family == "window" else None

    def persistent(self, ring, max_programs=None, timing=True):
        from hft_infer.kernels.lstm_persistent import LstmPersistent, pack_wide
        from hft_infer.kernels.mlp_persistent import MlpPersistent

        if self.family == "mlp":
            return MlpPersistent(self.w, ring, self.thr, self.held, timing=timing)
        # window mode: both tilings, as the engine builds it (runner/gpu.py)
        wide = pack_wide(self.params, self.w) if self.family == "window" else None
        return LstmPersistent(self.w, ring, N_INST + 1, self.thr, self.held, window=self.window,
                              max_programs=max_programs, timing=timing, wide=wide)

    def ring(self):
        """The persistent kernels' request ring for this model (rows per entry: W for the MLP)."""
        from hft_infer.kernels.persistent import RequestRing

        g = self.spec.window if self.family == "mlp" else 1
        return RequestRing(MAX_B, rows_per_entry=g, width=self.f, n_requests=NREQ, device=self.dev)

    def launched(self, batch: int):
        """(step(rows, slots, positions, out, ring_h), state) for the launched kernel at this batch."""
        from hft_infer.kernels import lstm_stream as ls, lstm_window as lw
        from hft_infer.kernels.mlp import alloc_mlp_workspace, mlp_step

        w, dev = self.w, self.dev
        if self.family == "mlp":
            ws = alloc_mlp_workspace(w, MAX_B)
            ring_d = torch.zeros(N_INST + 1, DEPTH, self.f, device=dev)
            return lambda rows, s, p, out, rh=None: mlp_step(w, ws, rh if rh is not None else ring_d, s, p, self.thr,
                                                             self.held, out, rows=None if rh is not None else rows)
        if self.family == "window":
            ws = lw.alloc_window_workspace(w, MAX_B, self.window)
            h, c = lw.alloc_window_state(w, N_INST + 1, self.window)
            return lambda rows, s, p, out, rh=None: lw.lstm_window_step(w, ws, h, c, rows if rh is None else None, s, p,
                                                                        self.thr, self.held, out, ring_h=rh)
        ws = ls.alloc_stream_workspace(w, MAX_B)
        h, c = ls.alloc_stream_state(w, N_INST + 1)
        return lambda rows, s, p, out, rh=None: ls.lstm_stream_step(w, ws, h, c, rows if rh is None else None, s,
                                                                    self.thr, self.held, out, positions=p, ring_h=rh)


def _compile_job(name: str, precision: str, batches: list[int]) -> str:
    """Child process: load every kernel once (fills Triton's disk cache for the parent)."""
    t0 = time.time()
    from hft_infer.kernels.persistent import FloorKernel, RequestRing

    dev = torch.device("cuda")
    st = Setup(name, precision, dev)
    st.persistent(st.ring()).precompile()
    FloorKernel(RequestRing(MAX_B, n_requests=NREQ, device=dev), dev, timing=True).precompile()
    step = st.launched(MAX_B)
    for b in batches:
        s = torch.zeros(b, dtype=torch.int64, device=dev)
        out = torch.zeros(b, 5, device=dev)
        step(torch.zeros(b, st.f, device=dev), s, s, out)
        sp = torch.zeros(b, dtype=torch.int64).pin_memory()
        step(None, sp, sp, torch.zeros(b, 5).pin_memory(), st.ring_h)
    torch.cuda.synchronize()
    return f"{name}: {time.time() - t0:.1f}s"


def precompile(args) -> None:
    import multiprocessing as mp

    t0 = time.time()
    with ProcessPoolExecutor(max_workers=max(1, min(args.jobs, len(args.models))),
                             mp_context=mp.get_context("spawn")) as ex:
        futs = {ex.submit(_compile_job, m, args.precision, args.batches): m for m in args.models}
        for fu in as_completed(futs, timeout=240):
            try:
                print(f"  compiled {fu.result()}", flush=True)
            except Exception as e:  # noqa: BLE001 - the main process reports it when it runs the model
                print(f"  compile job {futs[fu]} failed: {e!r}", flush=True)
    print(f"  compile phase {time.time() - t0:.1f}s", flush=True)


class Driver:
    """Feeds one persistent kernel: rows into the host ring, requests, float64 references."""

    def __init__(self, st: Setup, args):
        from hft_infer.runner.staging import RowGather

        self.st = st
        self.ring = st.ring()
        self.gather = RowGather(st.ring_h, max_batch=MAX_B, rows_per_entry=self.ring.rows_per_entry)
        self.kernel = st.persistent(self.ring, args.max_programs)
        self.nxt = np.zeros(N_INST + 1, dtype=np.int64)
        self.gen = torch.Generator().manual_seed(5)
        self.pool = st.make_rows(4096, st.spec.levels, self.gen).numpy()
        p64 = st.params.to(torch.float64)
        self.ref = {"p": p64, "held": torch.zeros(N_INST + 1, dtype=torch.int32)}
        if st.family == "window":
            shape = (N_INST + 1, p64.layers, st.window, p64.hidden)
        elif st.family == "stream":
            shape = (N_INST + 1, p64.layers, p64.hidden)
        if st.family != "mlp":
            self.ref["h"] = torch.zeros(shape, dtype=torch.float64)
            self.ref["c"] = torch.zeros(shape, dtype=torch.float64)
        self.i = 0

    def stage(self, b: int) -> tuple[int, np.ndarray, np.ndarray]:
        k = self.ring.next_slot
        slots, positions = self.ring.request_views(k)
        slots[:b] = np.arange(b)
        positions[:b] = self.nxt[:b]
        rows = self.pool[(self.i * MAX_B + np.arange(b)) % self.pool.shape[0]]
        self.st.ring_np[np.arange(b), self.nxt[:b] % DEPTH] = rows
        self.nxt[:b] += 1
        self.i += 1
        self.gather.gather(slots[:b], positions[:b], self.ring.rows(k)[:b])  # the engine's submit does this
        return k, slots[:b].copy(), positions[:b].copy()

    def reference(self, slots, positions) -> torch.Tensor:
        from hft_infer.kernels.lstm_stream import lstm_stream_reference
        from hft_infer.kernels.lstm_window import lstm_window_reference
        from hft_infer.kernels.mlp import mlp_step_reference

        r, st = self.ref, self.st
        sl, pos = torch.from_numpy(slots), torch.from_numpy(positions)
        out = torch.empty(len(slots), 5, dtype=torch.float64)
        thr = torch.tensor(THR, dtype=torch.float64)
        ring = self.st.ring_h.double()
        rows = ring[sl, torch.remainder(pos, DEPTH)]
        if st.family == "window":
            return lstm_window_reference(r["p"], r["h"], r["c"], rows, sl, pos, thr, r["held"], out)
        if st.family == "stream":
            return lstm_stream_reference(r["p"], r["h"], r["c"], rows, sl, thr, r["held"], out)
        return mlp_step_reference(r["p"], ring, sl, pos, thr, r["held"], out)

    def timed_run(self, batches: list[int], steps: int, fill_steps: int) -> tuple[dict, dict]:
        """Start the kernel; `fill_steps` checked steps of MAX_B (state in the windows), the error
        against float64 at each batch, then `steps` requests of each batch one at a time (after 50
        untimed); stop it. Returns ({batch: relative error}, {batch: (first timed seq, host ns each)})."""
        self.kernel.precompile()
        self.kernel.start()
        errs, lat = {}, {}
        try:
            for _ in range(fill_steps):
                self.step(MAX_B, check=True)
            for b in batches:
                errs[b] = self.step(b, check=True)
            gc.collect()
            gc.disable()
            try:
                for b in batches:
                    for _ in range(50):
                        self.step(b)
                    s0 = self.ring.seq + 1
                    lat[b] = (s0, np.array([self.step(b) for _ in range(steps)]))
            finally:
                gc.enable()
        finally:
            self.kernel.stop()
        return errs, lat

    def step(self, b: int, check: bool = False):
        k, slots, positions = self.stage(b)
        ref = self.reference(slots, positions) if check else None
        t0 = time.perf_counter_ns()
        seq = self.ring.submit(b)
        done = self.ring.done
        while not done(seq):
            pass
        t1 = time.perf_counter_ns()
        if check:
            got = torch.from_numpy(self.ring.outputs(k)[:b, 2:5].astype(np.float64))
            return float((got - ref[:, 2:5]).norm() / ref[:, 2:5].norm())
        return t1 - t0


def bench_persistent(st: Setup, args, results: list) -> None:
    d = Driver(st, args)
    errs, lat = d.timed_run(args.batches, args.steps, (st.spec.window if st.family != "stream" else 8) + 2)
    for b in args.batches:
        s0, ns = lat[b]
        dev_ns = d.kernel.device_times_ns(s0, s0 + args.steps - 1)
        results.append({"model": st.name, "batch": b, "variant": "persistent", "precision": st.precision,
                        "programs": d.kernel.programs, "host_us": pct(ns),
                        "device_us": float(np.median(dev_ns)) / 1e3, "logits_rel_err_vs_f64": errs[b]})


def bench_floor(args, results: list, dev) -> None:
    from hft_infer.kernels.persistent import FloorKernel, RequestRing

    ring = RequestRing(MAX_B, n_requests=NREQ, device=dev)
    k = FloorKernel(ring, dev, timing=True)
    k.precompile()
    k.start()
    lat = []
    try:
        for i in range(args.steps + 50):
            s, p = ring.request_views(ring.next_slot)
            s[0], p[0] = i % N_INST, i
            t0 = time.perf_counter_ns()
            seq = ring.submit(1)
            while not ring.done(seq):
                pass
            if i >= 50:
                lat.append(time.perf_counter_ns() - t0)
    finally:
        k.stop()
    dev_ns = k.device_times_ns(51, args.steps + 50)
    results.append({"model": "-", "batch": 1, "variant": "floor", "precision": "-", "programs": 1,
                    "host_us": pct(lat), "device_us": float(np.median(dev_ns)) / 1e3})


def bench_launched(st: Setup, args, results: list) -> None:
    for b in args.batches:
        _bench_launched_batch(st, b, args, results)


def _bench_launched_batch(st: Setup, b: int, args, results: list) -> None:
    """One batch size: both variants are captured and timed here, while their buffers are this batch's."""
    dev = st.dev
    step = st.launched(b)
    rows_h = torch.zeros(b, st.f).pin_memory()
    slots_h = torch.arange(b, dtype=torch.int64).pin_memory()
    pos_h = torch.zeros(b, dtype=torch.int64).pin_memory()
    out_h = torch.zeros(b, 5).pin_memory()
    rows_d, slots_d, pos_d = rows_h.to(dev), slots_h.to(dev), pos_h.to(dev)
    out_d = torch.zeros(b, 5, device=dev)
    s = torch.cuda.Stream()

    def copies():
        rows_d.copy_(rows_h, non_blocking=True)
        slots_d.copy_(slots_h, non_blocking=True)
        pos_d.copy_(pos_h, non_blocking=True)
        step(rows_d, slots_d, pos_d, out_d)
        out_h.copy_(out_d, non_blocking=True)

    variants = {"graph-copies": copies, "graph-1node": lambda: step(None, slots_h, pos_h, out_h, st.ring_h)}
    for name, fn in variants.items():
        with torch.cuda.stream(s):
            fn()
        s.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            fn()
        ev = torch.cuda.Event()
        lat = []
        for i in range(args.steps + 50):
            pos_h.add_(1)
            t0 = time.perf_counter_ns()
            g.replay()
            ev.record()
            while not ev.query():
                pass
            if i >= 50:
                lat.append(time.perf_counter_ns() - t0)
        results.append({"model": st.name, "batch": b, "variant": name, "precision": st.precision,
                        "host_us": pct(lat)})
    gk = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gk, stream=s):
        for _ in range(args.device_k):
            step(rows_d, slots_d, pos_d, out_d)
    times = graph_device_us(gk, args.device_k, 20 if args.quick else 100)
    results[-1]["device_us"] = statistics.median(times)
    results[-2]["device_us"] = statistics.median(times)


def table(results: list) -> str:
    lines = [f"{'model':14s} {'b':>3s} {'variant':13s} {'progs':>5s} {'dev us':>7s} {'p50':>7s} {'p99':>7s} "
             f"{'p99.9':>7s} {'err vs f64':>10s}"]
    for r in results:
        h = r.get("host_us", {})
        err = r.get("logits_rel_err_vs_f64")
        dv = r.get("device_us")
        lines.append(f"{r['model']:14s} {r['batch']:3d} {r['variant']:13s} {str(r.get('programs', '')):>5s} "
                     f"{(f'{dv:7.2f}' if dv is not None else '      -')} {h.get('p50', 0):7.1f} {h.get('p99', 0):7.1f} "
                     f"{h.get('p99.9', 0):7.1f} {(f'{err:10.1e}' if err is not None else '         -')}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_kernels: needs a CUDA device", file=sys.stderr)
        return 2
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    try:
        import hft_infer.kernels  # noqa: F401
    except ImportError:
        sys.exit("bench_kernels: install the project first (pip install -e . --no-deps)")
    import triton

    dev = torch.device("cuda")
    meta = {"gpu": torch.cuda.get_device_name(), "sms": torch.cuda.get_device_properties(dev).multi_processor_count,
            "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "args": vars(args), "note": "kernel-level, not the service's path"}
    print(f"== bench_kernels (KERNEL-LEVEL, not the service path): {meta}", flush=True)
    print("== compile (parallel child processes)", flush=True)
    precompile(args)
    results: list = []
    bench_floor(args, results, dev)
    print(table(results[-1:]).splitlines()[-1], flush=True)
    for name in args.models:
        n0 = len(results)
        try:
            st = Setup(name, args.precision, dev)
            bench_persistent(st, args, results)
            torch.cuda.synchronize()  # the persistent kernel has exited: syncs are allowed again
            bench_launched(st, args, results)
        except Exception as e:  # noqa: BLE001 - report and go on with the next model
            results.append({"model": name, "batch": 0, "variant": "FAILED", "error": repr(e)[:500]})
            print(f"  {name} FAILED: {e!r}", flush=True)
        print("\n".join(table(results[n0:]).splitlines()[1:]), flush=True)
    print("\n== summary (us; host = submit/replay -> done seen by the host)")
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
        print(f"== wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
