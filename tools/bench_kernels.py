#!/usr/bin/env python3
"""Fused Triton model steps vs torch (cuDNN) on one GPU: device time, host-observed step
time and error against float64, in one run.

    python3 tools/bench_kernels.py [--models lstm_a,lstm_b,mlp_small] [--batches 1,8,64]
                                   [--precisions fp32,tf32,bf16] [--steps 2000] [--quick]

For each model and batch size (window mode, W rows per decision):

  variants   triton-<precision>  the fused kernel (one launch per step; the LSTM's
                                 persistent kernel with a grid barrier per layer)
             triton-fp32-phased  the same LSTM kernel, one launch per layer (no barrier)
             triton-fp32-nosplit the LSTM kernel on NB = H/4 programs only (no row split)
             triton-fp32-stream  stream mode (one recurrent step per event; other semantics)
             cudnn / torch       plain torch: ring scatter + window gather + features +
                                 torch.nn.LSTM (cuDNN) or Linear layers + decision
  device     CUDA events around a graph of K compute-only steps, / K; median of reps
  host       per step: pinned H2D of the staged batch (rows, slots, positions in one
             buffer), the model step, D2H of the outputs, stream sync; perf_counter_ns
             around it; p50/p99/p99.9/max over --steps steps. "eager" launches from
             Python, "graph" replays one CUDA graph holding H2D + step + D2H.
  engine     (LSTMs) triton-<precision>-engine: the persistent kernel spinning on a
             request flag in pinned memory (kernels/engine.py); host-observed submit ->
             done flag, with rows/slots/positions read by the kernel from pinned memory
             and decisions written back there. Runs in a child process with a timeout
             (a hung kernel costs the engine rows, not the run).
  error      one step after W+5 steps of history per instrument, logits vs float64
             (torch.nn.LSTM / the MLP in float64 over the same raw window rows).

Ceilings (device copy bandwidth, fp32 / tf32 / bf16 matrix rates) are measured first;
floor = max(bytes / bandwidth, FLOPs / rate) per METHOD.md. A compact table is printed
last; with OUT set (or --json), the full results go to $OUT/bench_kernels.json.
Kernels compile in parallel child processes first (they fill Triton's disk cache).
Exits 2 without CUDA.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

import numpy as np
import torch

MODELS = {
    "lstm_a": dict(kind="lstm", levels=10, window=50, hidden=128, layers=2),
    "lstm_b": dict(kind="lstm", levels=10, window=50, hidden=256, layers=3),
    "mlp_small": dict(kind="mlp", levels=10, window=32, hidden=(128, 64)),
}
N_INST = 64  # instruments with state; slot 64 is the padding sink
OUT_COLS = 5


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="lstm_a,lstm_b,mlp_small")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--precisions", default="fp32,tf32,bf16")
    ap.add_argument("--steps", type=int, default=2000, help="host-observed steps per variant and mode")
    ap.add_argument("--warmup", type=int, default=200, help="untimed steps before each host loop")
    ap.add_argument("--device-k", type=int, default=20, help="steps per graph for device timing")
    ap.add_argument("--device-budget-s", type=float, default=0.25, help="device-timing budget per variant")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1),
                    help="parallel compile processes (0: compile in this process)")
    ap.add_argument("--cpu", type=int, default=None, help="pin this process to a CPU core")
    ap.add_argument("--json", default=None, help="results path (default $OUT/bench_kernels.json if OUT is set)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 200 steps, small device budget")
    ap.add_argument("--no-engine", action="store_true", help="skip the persistent-engine measurement")
    ap.add_argument("--engine-timeout-s", type=float, default=150.0)
    ap.add_argument("--engine-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.batches = [int(b) for b in args.batches.split(",") if b]
    args.precisions = [p for p in args.precisions.split(",") if p]
    for m in args.models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r} (known: {', '.join(MODELS)})")
    for p in args.precisions:
        if p not in ("fp32", "tf32", "bf16"):
            ap.error(f"unknown precision {p!r}")
    if any(b < 1 or b > N_INST for b in args.batches):
        ap.error(f"batches must be in 1..{N_INST}")
    if args.quick:
        args.steps, args.warmup, args.device_budget_s = 200, 50, 0.05
    return args


def _ensure_package() -> None:
    """The kernels import as hft_infer.kernels: the project must be installed (pip install -e .,
    as tools/gpu_session.sh does on the GPU machine)."""
    try:
        import hft_infer.kernels  # noqa: F401
    except ImportError:
        sys.exit("bench_kernels: install the project first (pip install -e . --no-deps)")


def make_rows(n: int, levels: int, gen: torch.Generator) -> torch.Tensor:
    """Raw rows that look like a book (prices on a 1/128 grid around 100)."""
    f = 4 * levels + 2
    rows = torch.zeros(n, f)
    mids = 100.0 + torch.randint(-640, 640, (n,), generator=gen).float() / 128
    spread = torch.randint(1, 4, (n,), generator=gen).float() / 128
    for i in range(levels):
        rows[:, 4 * i] = mids - spread - i / 64
        rows[:, 4 * i + 1] = torch.randint(1, 2000, (n,), generator=gen).float()
        rows[:, 4 * i + 2] = mids + spread + i / 64
        rows[:, 4 * i + 3] = torch.randint(1, 2000, (n,), generator=gen).float()
    trade = torch.rand(n, generator=gen) < 0.4
    rows[:, 4 * levels] = torch.where(trade, mids + torch.randint(-4, 5, (n,), generator=gen).float() / 128, 0.0)
    size = torch.randint(1, 500, (n,), generator=gen).float() * torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
    rows[:, 4 * levels + 1] = torch.where(trade, size, 0.0)
    return rows


@dataclass
class Model:
    name: str
    spec: dict
    params: object  # LstmParams | MlpParams (fp32, on the device)
    params64: object
    torch_fp32: object  # nn modules of the baseline
    torch_fp64: object

    @property
    def features(self) -> int:
        return 4 * self.spec["levels"] + 2


MODELS_BY_NAME: dict[str, Model] = {}


def build_model(name: str, dev: torch.device) -> Model:
    from hft_infer.kernels.common import features_reference
    from hft_infer.kernels.lstm import LstmParams
    from hft_infer.kernels.mlp import MlpParams

    spec = MODELS[name]
    gen = torch.Generator().manual_seed(1234)
    torch.manual_seed(1234)
    f = 4 * spec["levels"] + 2
    feats = features_reference(make_rows(4096, spec["levels"], gen).double(), torch.zeros(f, dtype=torch.float64),
                               torch.ones(f, dtype=torch.float64))
    mean, inv_std = feats.mean(0).float(), (1.0 / feats.std(0).clamp_min(1e-3)).float()
    if spec["kind"] == "lstm":
        lstm = torch.nn.LSTM(f, spec["hidden"], num_layers=spec["layers"], batch_first=True)
        head = torch.nn.Linear(spec["hidden"], 3)
        params = LstmParams.from_state_dict(lstm.state_dict(), head.weight, head.bias, mean, inv_std)
        base32 = (lstm.to(dev).eval(), head.to(dev).eval())
        base64 = (torch.nn.LSTM(f, spec["hidden"], num_layers=spec["layers"], batch_first=True,
                                dtype=torch.float64).to(dev).eval(), None)
        base64[0].load_state_dict({k: v.double() for k, v in lstm.state_dict().items()})
        base32[0].flatten_parameters()
    else:
        widths = [spec["window"] * f, *spec["hidden"], 3]
        layers = [torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:])]
        params = MlpParams(tuple(l.weight.detach() for l in layers), tuple(l.bias.detach() for l in layers),
                           mean, inv_std, spec["window"])
        base32 = tuple(l.to(dev).eval() for l in layers)
        base64 = None
    model = Model(name, spec, params.to(torch.float32, dev), params.to(torch.float64, dev), base32, base64)
    MODELS_BY_NAME[name] = model
    return model


# --------------------------------------------------------------------------- staging and variants


def _round4(n: int) -> int:
    return (n + 3) // 4 * 4


class Staging:
    """One pinned host buffer and its device twin holding rows | slots | positions (int32
    sections, 16-byte aligned), so the step's input crosses PCIe in one copy."""

    def __init__(self, batch: int, f: int, dev: torch.device) -> None:
        self.off_slots = _round4(batch * f)
        self.off_pos = self.off_slots + _round4(batch)
        n = self.off_pos + _round4(batch)
        self.host = torch.zeros(n, dtype=torch.int32).pin_memory()
        self.dev = torch.zeros(n, dtype=torch.int32, device=dev)
        self.rows_h, self.slots_h, self.pos_h = self._views(self.host, batch, f)
        self.rows_d, self.slots_d, self.pos_d = self._views(self.dev, batch, f)

    def _views(self, buf, batch, f):
        return (buf[: batch * f].view(torch.float32).view(batch, f), buf[self.off_slots:self.off_slots + batch],
                buf[self.off_pos:self.off_pos + batch])

    def h2d(self) -> None:
        self.dev.copy_(self.host, non_blocking=True)


class Variant:
    """A model step implementation with its own state (ring, recurrent state, held)."""
    name = "?"
    precision = "fp32"
    modes = ("eager", "graph")
    window_semantics = True

    def __init__(self, model: Model, dev: torch.device, max_batch: int) -> None:
        self.model = model
        self.dev = dev
        n_slots = N_INST + 1
        self.ring = torch.zeros(n_slots, model.spec["window"] + 14, model.features, device=dev)
        self.held = torch.zeros(n_slots, dtype=torch.int32, device=dev)
        self.thr = torch.tensor([0.1, 0.05], device=dev)

    def run(self, rows, slots, positions, out) -> None:
        raise NotImplementedError


class TritonLstmWindow(Variant):
    def __init__(self, model, dev, max_batch, precision, persistent=True, split=True):
        super().__init__(model, dev, max_batch)
        from hft_infer.kernels.lstm_window import alloc_window_state, alloc_window_workspace, prepare_lstm_weights
        self.precision, self.persistent = precision, persistent
        self.name = f"triton-{precision}" + ("" if persistent else "-phased") + ("" if split else "-nosplit")
        if not persistent or not split:
            self.modes = ("graph",)
        self.w = prepare_lstm_weights(model.params, precision=precision, device=dev)
        # nosplit: one program per hidden block (NB programs), tiles looped inside
        self.ws = alloc_window_workspace(self.w, N_INST + 1, model.spec["window"],
                                         max_programs=None if split else self.w.n_blocks)
        self.h, self.c = alloc_window_state(self.w, N_INST + 1, model.spec["window"])

    def run(self, rows, slots, positions, out):
        from hft_infer.kernels.lstm_window import lstm_window_step
        lstm_window_step(self.w, self.ws, self.h, self.c, rows, slots, positions, self.thr, self.held, out,
                         ring=self.ring, persistent=self.persistent)


class TritonLstmStream(Variant):
    window_semantics = False
    modes = ("graph",)

    def __init__(self, model, dev, max_batch, precision="fp32"):
        super().__init__(model, dev, max_batch)
        from hft_infer.kernels.lstm import prepare_lstm_weights
        from hft_infer.kernels.lstm_stream import alloc_stream_state, alloc_stream_workspace
        self.precision = precision
        self.name = f"triton-{precision}-stream"
        self.w = prepare_lstm_weights(model.params, precision=precision, device=dev)
        self.ws = alloc_stream_workspace(self.w, N_INST + 1)
        self.h, self.c = alloc_stream_state(self.w, N_INST + 1)
        self.h64, self.c64 = self.h.double(), self.c.double()  # float64 reference state

    def run(self, rows, slots, positions, out):
        from hft_infer.kernels.lstm_stream import lstm_stream_step
        lstm_stream_step(self.w, self.ws, self.h, self.c, rows, slots, self.thr, self.held, out,
                         positions=positions, ring=self.ring)

    def run64(self, rows, slots, out64):
        from hft_infer.kernels.lstm_stream import lstm_stream_reference
        lstm_stream_reference(self.model.params64, self.h64, self.c64, rows, slots, self.thr.double(),
                              torch.zeros_like(self.held), out64)


class TritonMlp(Variant):
    def __init__(self, model, dev, max_batch, precision):
        super().__init__(model, dev, max_batch)
        from hft_infer.kernels.mlp import alloc_mlp_workspace, prepare_mlp_weights
        self.precision = precision
        self.name = f"triton-{precision}"
        self.w = prepare_mlp_weights(model.params, precision=precision, device=dev)
        self.ws = alloc_mlp_workspace(self.w, N_INST + 1)

    def run(self, rows, slots, positions, out):
        from hft_infer.kernels.mlp import mlp_step
        mlp_step(self.w, self.ws, self.ring, slots, positions, self.thr, self.held, out, rows=rows)


class TorchWindow(Variant):
    """The plain-torch pipeline: index_put into the ring, gather + features, cuDNN LSTM or
    Linear layers, decision. Windows here always hold W rows (positions >= W-1), where
    zero-row padding and the LSTM's shorter start windows coincide."""

    def __init__(self, model, dev, max_batch):
        super().__init__(model, dev, max_batch)
        self.name = "cudnn" if model.spec["kind"] == "lstm" else "torch"

    def run(self, rows, slots, positions, out):
        from hft_infer.kernels.common import decide_reference
        from hft_infer.kernels.ring import ring_gather_reference
        p = self.model.params
        sl, pos = slots.long(), positions.long()
        self.ring[sl, torch.remainder(pos, self.ring.shape[1])] = rows
        x = ring_gather_reference(self.ring, sl, pos, self.model.spec["window"], p.mean, p.inv_std)
        if self.model.spec["kind"] == "lstm":
            lstm, head = self.model.torch_fp32
            seq, _ = lstm(x)
            logits = head(seq[:, -1])
        else:
            h = x.reshape(x.shape[0], -1)
            layers = self.model.torch_fp32
            for layer in layers[:-1]:
                h = torch.relu(layer(h))
            logits = layers[-1](h)
        decide_reference(logits, self.thr, self.held, slots, out)


def variant_keys(kind: str, precisions: list[str]) -> list[str]:
    keys = list(precisions)
    if kind == "lstm" and "fp32" in precisions:
        keys += ["fp32-phased", "fp32-nosplit", "fp32-stream"]
    return keys + ["torch"]


def make_variant(model: Model, dev, key: str, max_batch: int) -> Variant:
    if key == "torch":
        return TorchWindow(model, dev, max_batch)
    if model.spec["kind"] == "lstm":
        if key == "fp32-phased":
            return TritonLstmWindow(model, dev, max_batch, "fp32", persistent=False)
        if key == "fp32-nosplit":
            return TritonLstmWindow(model, dev, max_batch, "fp32", split=False)
        if key == "fp32-stream":
            return TritonLstmStream(model, dev, max_batch)
        return TritonLstmWindow(model, dev, max_batch, key)
    return TritonMlp(model, dev, max_batch, key)


def make_variants(model: Model, dev, precisions, max_batch) -> list[Variant]:
    return [make_variant(model, dev, k, max_batch) for k in variant_keys(model.spec["kind"], precisions)]


# --------------------------------------------------------------------------- compile in parallel


def _compile_job(name: str, key: str, batches: list[int]) -> str:
    """Child process: run one Triton variant once at each batch size, with the argument
    dtypes and alignments the parent uses, which fills Triton's disk cache."""
    _ensure_package()
    t0 = time.time()
    dev = torch.device("cuda")
    with torch.inference_mode():
        model = build_model(name, dev)
        f = model.features
        if key.startswith("engine-"):
            from hft_infer.kernels.engine import LstmWindowEngine
            v = TritonLstmWindow(model, dev, N_INST, key[len("engine-"):])
            for b in sorted(set(batches)):
                eng = LstmWindowEngine(v.w, v.ws, v.h, v.c, v.thr, v.held, max_batch=b, ring=v.ring)
                eng.precompile()
            return f"{name}/{key}: {time.time() - t0:.1f}s"
        v = make_variant(model, dev, key, N_INST)
        for b in sorted(set(batches) | {N_INST}):
            st = Staging(b, f, dev)
            st.slots_d.copy_(torch.arange(b, dtype=torch.int32))
            out = torch.zeros(b, OUT_COLS, device=dev)
            v.run(st.rows_d, st.slots_d, st.pos_d, out)
        torch.cuda.synchronize()
    return f"{name}/{key}: {time.time() - t0:.1f}s"


def precompile(models, precisions, batches, jobs, engine: bool, timeout_s: float = 300.0) -> None:
    import multiprocessing as mp

    todo = [(m, k) for m in models for k in variant_keys(MODELS[m]["kind"], precisions) if k != "torch"]
    if engine:
        todo += [(m, f"engine-{p}") for m in models if MODELS[m]["kind"] == "lstm" for p in precisions]
    t0 = time.time()
    if jobs <= 0:
        return
    ex = ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=mp.get_context("spawn"))
    try:
        futs = {ex.submit(_compile_job, m, k, batches): f"{m}/{k}" for m, k in todo}
        for fu in as_completed(futs, timeout=timeout_s):
            try:
                print(f"  compiled {fu.result()}", flush=True)
            except Exception as e:  # noqa: BLE001 - the main process reports it when it runs the variant
                print(f"  compile job {futs[fu]} failed: {e!r}", flush=True)
    except Exception as e:  # noqa: BLE001 - a stuck child must not stall the benchmark
        print(f"  parallel compile stopped ({e!r}); the rest compiles in this process", flush=True)
        for proc in list(getattr(ex, "_processes", {}).values()):
            proc.kill()
    finally:
        ex.shutdown(wait=False, cancel_futures=True)
    print(f"  compile phase {time.time() - t0:.1f}s", flush=True)


# --------------------------------------------------------------------------- measurement


def measure_ceilings(dev) -> dict:
    out = {}
    n = 1 << 28  # 1 GiB of fp32: several times the L2
    x = torch.empty(n, device=dev).uniform_()
    y = torch.empty_like(x)
    for _ in range(2):
        y.copy_(x)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(5):
        y.copy_(x)
    e1.record()
    torch.cuda.synchronize()
    out["copy_GBps"] = 2 * n * 4 * 5 / (e0.elapsed_time(e1) * 1e-3) / 1e9
    del x, y
    m = 8192
    for prec in ("fp32", "tf32", "bf16"):
        dt = torch.bfloat16 if prec == "bf16" else torch.float32
        a = torch.randn(m, m, device=dev, dtype=dt)
        b = torch.randn(m, m, device=dev, dtype=dt)
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
        reps = 2 if prec == "fp32" else 5
        try:
            a @ b
            e0.record()
            for _ in range(reps):
                a @ b
            e1.record()
            torch.cuda.synchronize()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
        out[f"{prec}_TFLOPs"] = 2 * m ** 3 * reps / (e0.elapsed_time(e1) * 1e-3) / 1e12
        del a, b
    torch.cuda.empty_cache()
    return out


def floor_us(model: Model, batch: int, precision: str, stream: bool, ceil: dict) -> dict:
    s = model.spec
    f = model.features
    wbytes = 2 if precision == "bf16" else 4
    if s["kind"] == "lstm":
        hid, nl = s["hidden"], s["layers"]
        states = 1 if stream else s["window"]
        mac = sum(4 * hid * ((f if k == 0 else hid) + hid) for k in range(nl))
        n_w = mac + nl * 8 * hid + 3 * hid
        flops = 2 * batch * (states * sum(4 * hid * hid + (0 if k == 0 else 4 * hid * hid) for k in range(nl))
                             + 4 * hid * f)
        state_bytes = 4 * nl * batch * states * hid * 4  # h and c, read and written
        nbytes = n_w * wbytes + state_bytes + batch * f * 4
    else:
        widths = [s["window"] * f, *s["hidden"], 3]
        n_w = sum(a * b for a, b in zip(widths, widths[1:]))
        flops = 2 * batch * n_w
        nbytes = n_w * wbytes + batch * s["window"] * f * 4
    rate = ceil[f"{precision}_TFLOPs"] * 1e12
    bw = ceil["copy_GBps"] * 1e9
    return {"flops": flops, "bytes": nbytes, "bytes_us": nbytes / bw * 1e6, "flops_us": flops / rate * 1e6,
            "floor_us": max(nbytes / bw, flops / rate) * 1e6}


def pct(lat_ns: np.ndarray) -> dict:
    us = lat_ns / 1e3
    return {"p50": float(np.percentile(us, 50)), "p99": float(np.percentile(us, 99)),
            "p99.9": float(np.percentile(us, 99.9)), "max": float(us.max()), "mean": float(us.mean())}


@dataclass
class Runner:
    """Drives one variant at one batch size: staging, positions, graphs, loops."""
    v: Variant
    batch: int
    st: Staging
    out_d: torch.Tensor
    out_h: torch.Tensor
    next_pos: int
    pool: torch.Tensor  # [n, batch, F] rows to cycle through
    graphs: list = field(default_factory=list)

    def stage(self, i: int) -> None:
        self.st.rows_h.copy_(self.pool[i % self.pool.shape[0]])
        self.st.pos_h.fill_(self.next_pos)
        self.next_pos += 1

    def compute(self) -> None:
        self.v.run(self.st.rows_d, self.st.slots_d, self.st.pos_d, self.out_d)

    def io_step(self) -> None:
        self.st.h2d()
        self.compute()
        self.out_h.copy_(self.out_d, non_blocking=True)

    def host_loop(self, fn, steps: int, warm: int) -> np.ndarray:
        lat = np.empty(steps, dtype=np.int64)
        sync = torch.cuda.current_stream().synchronize
        clock = time.perf_counter_ns
        gc.collect()
        gc.disable()
        try:
            for i in range(warm + steps):
                self.stage(i)
                t0 = clock()
                fn()
                sync()
                t1 = clock()
                if i >= warm:
                    lat[i - warm] = t1 - t0
        finally:
            gc.enable()
        return lat

    def capture(self, fn) -> torch.cuda.CUDAGraph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        self.graphs.append(g)
        return g

    def device_us(self, k: int, budget_s: float) -> float:
        def k_steps():
            for _ in range(k):
                self.compute()
        g = self.capture(k_steps)
        g.replay()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
        one = max(time.perf_counter() - t0, 1e-6)
        reps = int(max(10, min(200, budget_s / one)))
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for a, b in ev:
            a.record()
            g.replay()
            b.record()
        torch.cuda.synchronize()
        return statistics.median(a.elapsed_time(b) * 1e3 / k for a, b in ev)


def bench_pair(model: Model, batch: int, variants: list[Variant], args, ceil, dev) -> list[dict]:
    """Prefill history, check errors, then time every variant at this batch size."""
    from hft_infer.kernels.common import COL_LOGITS, COL_SCORE, features_reference
    from hft_infer.kernels.mlp import mlp_logits_reference
    from hft_infer.kernels.ring import ring_gather_reference

    f, window = model.features, model.spec["window"]
    gen = torch.Generator().manual_seed(99 + batch)
    prefill = window + 5
    hist = make_rows(prefill * N_INST, model.spec["levels"], gen).view(prefill, N_INST, f)
    all_slots = torch.arange(N_INST, dtype=torch.int32, device=dev)
    scratch_out = torch.zeros(N_INST, OUT_COLS, device=dev)
    failed = []
    for t in range(prefill):  # every instrument gets rows 0..prefill-1
        rows = hist[t].to(dev)
        pos = torch.full((N_INST,), t, dtype=torch.int32, device=dev)
        for v in list(variants):
            try:
                v.run(rows, all_slots, pos, scratch_out)
                if isinstance(v, TritonLstmStream):
                    v.run64(rows, all_slots, torch.zeros(N_INST, OUT_COLS, device=dev, dtype=torch.float64))
            except Exception as e:  # noqa: BLE001 - a variant that cannot run is reported, the rest go on
                print(f"  {model.name:9s} b={batch:<3d} {v.name:20s} FAILED: {e!r}", flush=True)
                failed.append({"model": model.name, "batch": batch, "variant": v.name, "precision": v.precision,
                               "failed": repr(e)})
                variants = [x for x in variants if x is not v]
    # error step: instruments 0..batch-1 at position `prefill`
    new = make_rows(batch, model.spec["levels"], gen)
    slots = all_slots[:batch]
    pos = torch.full((batch,), prefill, dtype=torch.int32, device=dev)
    full = torch.cat([hist[:, :batch].permute(1, 0, 2), new[:, None]], dim=1).to(dev, torch.float64)  # [b, T, F]
    p64 = model.params64
    if model.spec["kind"] == "lstm":
        x = features_reference(full[:, -window:], p64.mean, p64.inv_std)
        seq, _ = model.torch_fp64[0](x)
        ref_window = seq[:, -1] @ p64.head_weight.t() + p64.head_bias
    else:
        ref_window = mlp_logits_reference(p64, full[:, -window:])
    results = []
    for v in variants:
        out = torch.full((batch, OUT_COLS), float("nan"), device=dev)
        v.run(new.to(dev), slots, pos, out)
        if isinstance(v, TritonLstmStream):
            ref = torch.zeros(batch, OUT_COLS, device=dev, dtype=torch.float64)
            v.run64(new.to(dev), slots, ref)
            ref_logits = ref[:, COL_LOGITS:COL_LOGITS + 3]
        else:
            ref_logits = ref_window
        got = out[:, COL_LOGITS:COL_LOGITS + 3].double()
        p = torch.softmax(ref_logits, -1)
        ref_score = p[:, 2] - p[:, 0]
        err = {"logits_max_abs": (got - ref_logits).abs().max().item(),
               "logits_rel": ((got - ref_logits).norm() / ref_logits.norm()).item(),
               "score_max_abs": (out[:, COL_SCORE].double() - ref_score).abs().max().item()}
        if v.window_semantics and v.name != "cudnn":
            # the ring the fused kernel wrote holds the same window
            win = ring_gather_reference(v.ring, slots, pos, window)
            assert torch.equal(win.double(), full[:, -window:]), f"{v.name}: ring contents differ"
        results.append({"model": model.name, "batch": batch, "variant": v.name, "precision": v.precision,
                        "error": err, "floor": floor_us(model, batch, v.precision, not v.window_semantics, ceil)})
    # timing
    pool = make_rows(64 * batch, model.spec["levels"], gen).view(64, batch, f).pin_memory()
    for v, res in zip(variants, results):
        st = Staging(batch, f, dev)
        st.slots_h.copy_(torch.arange(batch, dtype=torch.int32))
        st.slots_d.copy_(st.slots_h)
        r = Runner(v, batch, st, torch.zeros(batch, OUT_COLS, device=dev),
                   torch.zeros(batch, OUT_COLS).pin_memory(), prefill + 1, pool)
        t0 = time.time()
        res["device_us"] = float("nan")
        try:  # one variant failing (say, a capture) must not cost the others' numbers
            if "eager" in v.modes:
                res["host_eager"] = pct(r.host_loop(r.io_step, args.steps, args.warmup))
            r.stage(0)
            r.st.h2d()
            r.compute()  # warm on the capture's shapes
            torch.cuda.synchronize()
            g = r.capture(r.io_step)
            res["host_graph"] = pct(r.host_loop(g.replay, args.steps, args.warmup))
            res["device_us"] = r.device_us(args.device_k, args.device_budget_s)
        except Exception as e:  # noqa: BLE001 - recorded in the results and printed
            res["failed"] = repr(e)
            print(f"  {model.name:9s} b={batch:<3d} {v.name:20s} FAILED: {e!r}", flush=True)
            torch.cuda.synchronize()
            continue
        finally:
            res["bench_s"] = time.time() - t0
            r.graphs.clear()
        print(f"  {model.name:9s} b={batch:<3d} {v.name:20s} dev {res['device_us']:8.1f} us  "
              f"graph p50 {res['host_graph']['p50']:7.1f} p99 {res['host_graph']['p99']:7.1f}  "
              f"logits rel err {res['error']['logits_rel']:.1e}", flush=True)
    return results + failed


def _history(model: Model, batch: int, variant: Variant, dev):
    """W+5 rows per instrument through variant.run; returns (hist [T, N_INST, F], prefill)."""
    f = model.features
    gen = torch.Generator().manual_seed(99 + batch)
    prefill = model.spec["window"] + 5
    hist = make_rows(prefill * N_INST, model.spec["levels"], gen).view(prefill, N_INST, f)
    all_slots = torch.arange(N_INST, dtype=torch.int32, device=dev)
    out = torch.zeros(N_INST, OUT_COLS, device=dev)
    for t in range(prefill):
        variant.run(hist[t].to(dev), all_slots, torch.full((N_INST,), t, dtype=torch.int32, device=dev), out)
    return hist, prefill, gen


def _engine_one(model: Model, precision: str, batch: int, args, dev) -> dict:
    from hft_infer.kernels.common import COL_LOGITS, features_reference
    from hft_infer.kernels.engine import LstmWindowEngine

    window = model.spec["window"]
    v = TritonLstmWindow(model, dev, N_INST, precision)
    hist, prefill, gen = _history(model, batch, v, dev)
    new = make_rows(batch, model.spec["levels"], gen)
    full = torch.cat([hist[:, :batch].permute(1, 0, 2), new[:, None]], dim=1).to(dev, torch.float64)
    p64 = model.params64
    seq, _ = model.torch_fp64[0](features_reference(full[:, -window:], p64.mean, p64.inv_std))
    ref = (seq[:, -1] @ p64.head_weight.t() + p64.head_bias).cpu()
    pool = make_rows(64 * batch, model.spec["levels"], gen).view(64, batch, model.features)
    eng = LstmWindowEngine(v.w, v.ws, v.h, v.c, v.thr, v.held, max_batch=batch, ring=v.ring)
    eng.precompile()
    eng.slots[:batch] = torch.arange(batch, dtype=torch.int32)
    eng.rows[:batch] = new
    eng.positions[:batch] = prefill
    lat = np.empty(args.steps, dtype=np.int64)
    clock = time.perf_counter_ns
    eng.start()
    try:
        eng.submit(batch)
        got = eng.wait(timeout_s=5.0)[:, COL_LOGITS:COL_LOGITS + 3].double()
        err = {"logits_max_abs": (got - ref).abs().max().item(),
               "logits_rel": ((got - ref).norm() / ref.norm()).item(), "score_max_abs": float("nan")}
        gc.collect()
        gc.disable()
        for i in range(args.warmup + args.steps):
            eng.rows[:batch] = pool[i % 64]
            eng.positions[:batch] = prefill + 1 + i
            t0 = clock()
            eng.submit(batch)
            eng.wait(timeout_s=5.0)
            t1 = clock()
            if i >= args.warmup:
                lat[i - args.warmup] = t1 - t0
    finally:
        gc.enable()
        eng.stop(timeout_s=5.0)
    torch.cuda.synchronize()
    return {"model": model.name, "batch": batch, "variant": f"triton-{precision}-engine", "precision": precision,
            "programs": eng.programs, "error": err, "host_engine": pct(lat)}


def engine_child(args) -> int:
    """--engine-child: every engine configuration, one after another, one JSON line each."""
    _ensure_package()
    dev = torch.device("cuda")
    with torch.inference_mode():
        for name in args.models:
            if MODELS[name]["kind"] != "lstm":
                continue
            model = build_model(name, dev)
            for prec in args.precisions:
                for batch in args.batches:
                    try:
                        r = _engine_one(model, prec, batch, args, dev)
                    except BaseException as e:  # noqa: BLE001 - a stuck engine may hold the GPU: leave now
                        print(f"engine {name}/{prec}/b={batch} failed: {e!r}", file=sys.stderr, flush=True)
                        os._exit(1)  # skips atexit work that could wait on a running kernel
                    print("ENGINE " + json.dumps(r), flush=True)
    return 0


def run_engine_child(args, ceil, models) -> list[dict]:
    cmd = [sys.executable, os.path.abspath(__file__), "--engine-child", "--models", ",".join(models),
           "--precisions", ",".join(args.precisions), "--batches", ",".join(map(str, args.batches)),
           "--steps", str(args.steps), "--warmup", str(args.warmup)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.engine_timeout_s)
        out, err, status = proc.stdout, proc.stderr, f"exit {proc.returncode}"
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        status = f"timed out after {args.engine_timeout_s:.0f} s"
    results = []
    for line in out.splitlines():
        if line.startswith("ENGINE "):
            r = json.loads(line[len("ENGINE "):])
            r["floor"] = floor_us(MODELS_BY_NAME[r["model"]], r["batch"], r["precision"], False, ceil)
            r["device_us"] = float("nan")
            results.append(r)
            h = r["host_engine"]
            print(f"  {r['model']:9s} b={r['batch']:<3d} {r['variant']:20s} engine p50 {h['p50']:7.1f} "
                  f"p99 {h['p99']:7.1f}  logits rel err {r['error']['logits_rel']:.1e}", flush=True)
    if status != "exit 0":
        print(f"  engine child {status}; stderr tail:\n{err[-3000:]}", flush=True)
    return results


def env_info(dev) -> dict:
    import triton
    p = torch.cuda.get_device_properties(dev)
    info = {"gpu": p.name, "sms": p.multi_processor_count, "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "cudnn": torch.backends.cudnn.version(),
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
        info["nvidia_smi"] = q.stdout.strip()
    except Exception:  # noqa: BLE001 - informational only
        pass
    return info


def print_table(results: list[dict]) -> None:
    base = {(r["model"], r["batch"]): r for r in results
            if r["variant"] in ("cudnn", "torch") and "host_graph" in r}
    hdr = (f"{'model':9s} {'b':>3s} {'variant':20s} {'mode':6s} {'dev us':>8s} {'floor':>6s} {'p50':>7s} "
           f"{'p99':>7s} {'p99.9':>7s} {'max':>8s} {'x p50':>6s} {'x dev':>6s} {'err abs':>8s} {'err rel':>8s}")
    print("\n" + hdr)
    print("-" * len(hdr))
    for r in results:
        if "failed" in r:
            print(f"{r['model']:9s} {r['batch']:3d} {r['variant']:20s} FAILED {r['failed'][:80]}")
            continue
        b = base.get((r["model"], r["batch"]))
        for mode in ("eager", "graph", "engine"):
            h = r.get(f"host_{mode}")
            if h is None:
                continue
            bh = b.get("host_graph") if b else None  # ratios against the baseline captured in a graph
            xp = bh["p50"] / h["p50"] if bh else float("nan")
            xd = b["device_us"] / r["device_us"] if b and r["device_us"] == r["device_us"] else float("nan")
            print(f"{r['model']:9s} {r['batch']:3d} {r['variant']:20s} {mode:6s} {r['device_us']:8.1f} "
                  f"{r['floor']['floor_us']:6.1f} {h['p50']:7.1f} {h['p99']:7.1f} {h['p99.9']:7.1f} {h['max']:8.1f} "
                  f"{xp:6.2f} {xd:6.2f} {r['error']['logits_max_abs']:8.1e} {r['error']['logits_rel']:8.1e}")
    print("times in us; 'x p50' / 'x dev': baseline (cudnn/torch, in a CUDA graph) over this row (>1: faster); "
          "err: logits vs float64 (max abs, norm-wise relative); floor: max(bytes/copy BW, FLOPs/matrix rate); "
          "engine rows: no launch per step (device time n/a)")


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_kernels: no CUDA device here; this benchmark measures the fused kernels on a GPU "
              "(the kernel tests run on the CPU: python -m pytest tests/kernels)", file=sys.stderr)
        return 2
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("bench_kernels: unset TRITON_INTERPRET to measure compiled kernels", file=sys.stderr)
        return 2
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    if args.engine_child:
        return engine_child(args)
    _ensure_package()
    dev = torch.device("cuda")
    t_start = time.time()
    print(f"== bench_kernels: models {args.models}, batches {args.batches}, precisions {args.precisions}", flush=True)
    print("== compile (parallel child processes)", flush=True)
    precompile(args.models, args.precisions, args.batches, args.jobs, not args.no_engine)
    env = env_info(dev)
    print(f"== {env}", flush=True)
    ceil = measure_ceilings(dev)
    print(f"== ceilings: {ceil}", flush=True)
    results = []
    with torch.inference_mode():
        for name in args.models:
            model = build_model(name, dev)
            for batch in args.batches:
                variants = make_variants(model, dev, args.precisions, N_INST)
                results += bench_pair(model, batch, variants, args, ceil, dev)
                del variants
                torch.cuda.empty_cache()
    lstm_models = [m for m in args.models if MODELS[m]["kind"] == "lstm"]
    if lstm_models and not args.no_engine:
        print("== persistent engine (child process)", flush=True)
        torch.cuda.synchronize()
        results += run_engine_child(args, ceil, lstm_models)
    total = time.time() - t_start
    doc = {"env": env, "ceilings": ceil, "args": {k: v for k, v in vars(args).items()}, "results": results,
           "total_s": total}
    path = args.json or (os.path.join(os.environ["OUT"], "bench_kernels.json") if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as fh:
            json.dump(doc, fh, indent=1)
        print(f"== wrote {path}")
    print(f"== total {total:.0f}s")
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
