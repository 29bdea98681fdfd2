#!/usr/bin/env python3
"""CPU step time of each model preset and executor, as the eager engine runs them, side by side.

    taskset -c 1 python tools/bench_models_cpu.py                      # all presets, batch 1/8/64
    taskset -c 1 python tools/bench_models_cpu.py --presets mlp_small lstm_a --batches 1 64
    taskset -c 1 python tools/bench_models_cpu.py --profile            # where a numpy step's time goes

Per preset and batch size, every variant of the step (gather rows from the ring -> row
transform -> model -> scores): the numpy executors the eager engine runs, the eager engine's
whole step around one (staging, bucket padding, the decision policy: what the service's CPU
engine runs), the same two with runner.precision = "bf16" (models/products.py; their ratio is
to the fp32 numpy executor), the torch executors they replace, `torch.compile` of the same step (mlp window
and lstm stream; its steady state, one new row per trigger), and for LSTM window mode the
nn.LSTM recompute (oneDNN's fused cell). Variants run interleaved in rounds (a burst of steps each, round
after round), so a slow spell of the shared machine hits them all alike; the table gives
median / p99 in µs, the ratio to the numpy executor's median, the spread of the per-round
medians (noise) and the transient memory a step allocates (tracemalloc peak above the
baseline: what is left of per-step allocation). The batch holds distinct instruments with
full windows; positions advance by one per step, so stateful executors see rows in order.
One torch and one BLAS thread, as the service runs (runner.eager.limit_cpu_threads).

`--profile` times the pieces of the numpy steps alone (the row transform, each matrix
product, the elementwise calls, the score), interleaved with the whole step; "glue" is
what is left (index arithmetic, gathers, scatters, Python), and a matrix product of the
same call shape on a 1x1 problem gives the call overhead inside the product's time.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
import tracemalloc
import warnings

import numpy as np
import torch
from benchlib import cpu_model

from hft_infer.kernels import reference
from hft_infer.models import PRESETS, build_model, dataset as ds
from hft_infer.models.build import build_executor
from hft_infer.models.decision import DecisionPolicy
from hft_infer.models.numpy_lstm import lstm_cell
from hft_infer.replay.synthetic import SyntheticConfig, generate
from hft_infer.runner.eager import EagerEngine, limit_cpu_threads


def cpu_name() -> str:
    return cpu_model() or platform.processor() or "unknown CPU"


# ------------------------------------------------------------ torch.compile of the same steps


class CompiledMlpStep:
    """The numpy MLP executor's steady-state step (one new row per trigger: transform it into
    a normalised feature ring, gather the windows, the MLP, the scores) in torch, compiled."""

    def __init__(self, model, ring: np.ndarray, batch: int) -> None:
        s, r, f = ring.shape
        w = model.spec.window
        self.ring = torch.from_numpy(ring).view(s * r, f)
        self.r, self.w = r, w
        self.params = [t.detach() for t in (model.norm_mean, model.norm_inv_std)]
        self.feat = reference.features(self.ring, *self.params)  # rows already in the ring: done
        self.zero = reference.features(torch.zeros(f), *self.params)  # rows before an instrument's first
        self.layers = [(layer.weight.detach(), layer.bias.detach()) for layer in model.layers]
        self.head = (model.head.weight.detach(), model.head.bias.detach())
        self.offsets = torch.arange(-w + 1, 1)
        self.fn = torch.compile(self._step, dynamic=False)

    def _step(self, slots, positions):
        r = self.r
        base = slots * r
        new = reference.features(self.ring[base + positions % r], *self.params)
        self.feat.index_copy_(0, base + positions % r, new)
        pw = positions[:, None] + self.offsets
        idx = base[:, None] + pw % r
        x = torch.where((pw < 0)[..., None], self.zero, self.feat[idx]).reshape(slots.shape[0], -1)
        for wt, b in self.layers:
            x = torch.relu(torch.addmm(b, x, wt.t()))
        return reference.scores(torch.addmm(self.head[1], x, self.head[0].t()))

    def step(self, slots, positions, out) -> None:
        with torch.inference_mode():
            out[:] = self.fn(torch.from_numpy(slots), torch.from_numpy(positions)).numpy()


class CompiledStreamStep:
    """The LSTM stream step (newest row -> every layer's cell from the slots' (h, c) -> head),
    nn.LSTM's math and gate order, in torch, compiled."""

    def __init__(self, model, ring: np.ndarray, batch: int) -> None:
        s, r, f = ring.shape
        spec = model.spec
        self.ring = torch.from_numpy(ring).view(s * r, f)
        self.r = r
        self.h = torch.zeros(spec.layers, s, spec.hidden[0])
        self.c = torch.zeros_like(self.h)
        lstm = model.lstm
        self.cells = [(getattr(lstm, f"weight_ih_l{k}").detach(), getattr(lstm, f"weight_hh_l{k}").detach(),
                       (getattr(lstm, f"bias_ih_l{k}") + getattr(lstm, f"bias_hh_l{k}")).detach())
                      for k in range(spec.layers)]
        self.params = [t.detach() for t in (model.norm_mean, model.norm_inv_std)]
        self.head = (model.head.weight.detach(), model.head.bias.detach())
        self.fn = torch.compile(self._step, dynamic=False)

    def _step(self, slots, positions):
        x = reference.features(self.ring[slots * self.r + positions % self.r], *self.params)
        for k, (w_ih, w_hh, b) in enumerate(self.cells):
            h, c = self.h[k, slots], self.c[k, slots]
            i, f, g, o = (torch.addmm(b, x, w_ih.t()) + h @ w_hh.t()).chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            x = torch.sigmoid(o) * torch.tanh(c)
            self.h[k, slots] = x
            self.c[k, slots] = c
        return reference.scores(torch.addmm(self.head[1], x, self.head[0].t()))

    def step(self, slots, positions, out) -> None:
        with torch.inference_mode():
            out[:] = self.fn(torch.from_numpy(slots), torch.from_numpy(positions)).numpy()


# ------------------------------------------------------------ timing


class Variant:
    def __init__(self, name: str, runner, batch: int, start: int, tensors: bool = False) -> None:
        self.name, self.runner = name, runner
        self.slots = np.arange(batch, dtype=np.int64)
        self.pos = np.full(batch, start, dtype=np.int64)
        self.out = np.empty(batch, dtype=np.float32)
        # The torch executors get torch views (what the engine passed them before).
        self.args = [torch.from_numpy(a) for a in (self.slots, self.pos, self.out)] if tensors else \
            [self.slots, self.pos, self.out]
        self.times: list[int] = []
        self.round_medians: list[float] = []
        self.transient = 0

    def burst(self, k: int, record: bool = True) -> None:
        step, args, pos = self.runner.step, self.args, self.pos
        times = []
        for _ in range(k):
            t0 = time.perf_counter_ns()
            step(*args)
            times.append(time.perf_counter_ns() - t0)
            pos += 1
        if record:
            self.times += times
            self.round_medians.append(float(np.median(times)))

    def measure_allocation(self) -> None:
        self.burst(2, record=False)
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        self.burst(1, record=False)
        self.transient = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()


def interleave(variants: list[Variant], rounds: int, burst: int) -> None:
    for v in variants:
        v.burst(3, record=False)  # first touch of scratch, BLAS dispatch, compiled-graph guards
    for _ in range(rounds):
        for v in variants:
            v.burst(burst)
    for v in variants:
        v.measure_allocation()


def us(ns: float) -> str:
    v = ns / 1e3
    return f"{v / 1e3:.1f} ms" if v >= 10_000 else (f"{v:.0f}" if v >= 100 else f"{v:.1f}")


def calibration() -> Variant:
    """A fixed numpy call beside the variants: its per-round medians show the machine's drift."""
    a = np.ones((1, 42), np.float32)

    class _Add:
        def step(self, *_):
            np.add(a, 1.0, out=a)
    return Variant("calibration: np.add [1, 42]", _Add(), 1, 0)


class EagerStep:
    """The CPU engine's step as the service runs it: the batch staged into the engine's buffers,
    `submit` (bucket padding, the numpy executor, the decision policy), `collect`."""

    def __init__(self, executor, max_batch: int) -> None:
        sink = executor.n_slots - 1
        policy = DecisionPolicy(0.2, 0.05, n_slots=executor.n_slots, max_batch=max_batch)
        buckets = sorted({min(2 ** k, max_batch) for k in range(max_batch.bit_length() + 1)})
        self.engine = EagerEngine(executor, policy, buckets, sink, reason="bench_models_cpu")

    def step(self, slots, positions, out) -> None:
        n = slots.shape[0]
        staged_slots, staged_positions = self.engine.request()
        staged_slots[:n] = slots
        staged_positions[:n] = positions
        self.engine.submit(n)
        scores, _ = self.engine.collect()
        out[:] = scores


def variants_for(name: str, model, ring: np.ndarray, batch: int, max_batch: int, compile_: bool) -> list[Variant]:
    spec = model.spec
    start = spec.window  # every window full

    def ex(mode, method, backend, precision="fp32"):
        return build_executor(model, ring, max_batch=max_batch, mode=mode, window_method=method, backend=backend,
                              precision=precision)

    def numpy_pair(family, mode, method, precision="fp32"):
        """The numpy executor and the eager engine's step around one. bf16 (runner.precision) is a
        family of its own: its scores differ from fp32's by up to ~3e-3, past check_same_scores'."""
        tag = family if precision == "fp32" else f"{family} {precision}"
        return [Variant(f"{tag}: numpy", ex(mode, method, "numpy", precision), batch, start),
                Variant(f"{tag}: numpy, the eager engine's step (+ policy)",
                        EagerStep(ex(mode, method, "numpy", precision), max_batch), batch, start)]
    out: list[Variant] = []
    if spec.kind == "mlp":
        out += numpy_pair("mlp window", "window", "recompute")
        out += numpy_pair("mlp window", "window", "recompute", "bf16")
        out.append(Variant("mlp window: torch (cached)", ex("window", "recompute", "torch"), batch, start, True))
        if compile_:
            out.append(Variant("mlp window: torch.compile", CompiledMlpStep(model, ring, batch), batch, start))
        return out
    out += numpy_pair("lstm stream", "stream", "incremental")
    out += numpy_pair("lstm stream", "stream", "incremental", "bf16")
    out.append(Variant("lstm stream: torch", ex("stream", "incremental", "torch"), batch, start, True))
    if compile_:
        out.append(Variant("lstm stream: torch.compile", CompiledStreamStep(model, ring, batch), batch, start))
    out.append(Variant("lstm window incremental: numpy", ex("window", "incremental", "numpy"), batch, start))
    out.append(Variant("lstm window incremental: torch", ex("window", "incremental", "torch"), batch, start, True))
    out.append(Variant("lstm window recompute: nn.LSTM", ex("window", "recompute", "torch"), batch, start, True))
    return out


def check_same_scores(variants: list[Variant]) -> None:
    """Every variant of a family gives the numpy executor's scores on the same first step."""
    by_family: dict[str, list[Variant]] = {}
    for v in variants:
        by_family.setdefault(v.name.split(":")[0], []).append(v)
    for family in by_family.values():
        for v in family:
            v.runner.step(*v.args)
        ref = family[0].out
        for v in family[1:]:
            if not np.allclose(v.out, ref, atol=1e-4, rtol=0):
                raise AssertionError(f"{v.name} disagrees with {family[0].name}: "
                                     f"{np.abs(v.out - ref).max():.2e}")
        for v in family:
            v.pos += 1


def ring_for(spec, max_batch: int) -> np.ndarray:
    ev = generate(4 * spec.window * (max_batch + 1), SyntheticConfig(instruments=max_batch + 1, seed=1))
    rows = ds.raw_rows(ev, spec.levels)
    return rows[: (max_batch + 1) * spec.window].reshape(max_batch + 1, spec.window, spec.features).copy()


def bench(args) -> None:
    max_batch = max(args.batches)
    print("| preset | batch | variant | median | p99 | vs numpy | round medians min-max | transient KB/step |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    products: set[str] = set()  # the numpy executors' product backends (models/products.py)
    for name in args.presets:
        model = build_model(PRESETS[name], seed=0)
        ring = ring_for(model.spec, max_batch)
        for batch in args.batches:
            vs = variants_for(name, model, ring, batch, max_batch, args.compile)
            check_same_scores(vs)
            cal = calibration()
            slow = any("recompute" in v.name for v in vs) or name == "lstm_c"
            burst = max(3, args.burst // (8 if slow and batch > 1 else 1))
            interleave(vs + [cal], args.rounds, burst)
            described = {getattr(v.runner, "describe", str)() for v in vs if v.name.endswith(": numpy")}
            products.update(f"{name} batch {batch}: {d}" for d in described if d)
            base = {v.name.split(":")[0]: float(np.median(v.times)) for v in vs if v.name.endswith(": numpy")}
            for v in vs + [cal]:
                med = float(np.median(v.times))
                p99 = float(np.percentile(v.times, 99))
                ref = base.get(v.name.split(":")[0].replace(" bf16", ""))  # bf16 against the fp32 executor
                ratio = f"{med / ref:.2f}x" if ref else "-"
                spread = f"{us(min(v.round_medians))}-{us(max(v.round_medians))}"
                print(f"| {name} | {batch} | {v.name} | {us(med)} | {us(p99)} | {ratio} | {spread} | "
                      f"{v.transient / 1024:.1f} |", flush=True)
            del vs
    print("\nbatched products (runner.cpu_products = auto, chosen by timing on this machine; the bf16 variants: "
          "runner.precision = bf16):")
    for line in sorted(products):
        print(f"  {line}")


# ------------------------------------------------------------ profile of the numpy steps


def _timer(fn):
    class _T:
        def step(self, *_):
            fn()
    return _T()


def profile(args) -> None:
    """Pieces of the numpy steps, each timed alone on the executor's own buffers."""
    print("| preset / batch | piece | median µs | share of the step |")
    print("| --- | --- | ---: | ---: |")
    for name, mode, batch in [("mlp_small", "window", 1), ("mlp_small", "window", 64), ("lstm_a", "stream", 1),
                              ("lstm_a", "stream", 64)]:
        _profile_one(args, name, mode, batch)


def _profile_one(args, name: str, mode: str, batch: int) -> None:
    """One preset and batch: its pieces are timed here, while the closures' variables hold."""
    model = build_model(PRESETS[name], seed=0)
    ring = ring_for(model.spec, 64)
    ex = build_executor(model, ring, max_batch=64, mode=mode)
    n = batch
    raw = ring.reshape(-1, ring.shape[-1])[:n].copy()
    mean, inv = ex._mean, ex._inv_std
    pieces = {"whole step": ex}
    pieces["row transform: reference.features"] = _timer(lambda: reference.features(raw, mean, inv))
    # Batch 1 runs matrix x vector products (np.dot, BLAS gemv) on its own views; larger batches
    # matrix products (np.matmul): each piece below is timed as the step calls it.
    if mode == "window" and n == 1:
        h = ex.feat[0, : ex.window].reshape(-1)
        for k, (wt, hb, hb_out) in enumerate(ex._one):
            pieces[f"layer {k + 1} product [{wt.shape[0]}, {wt.shape[1]}] x [{h.shape[0]}] (gemv)"] = _timer(
                lambda h=h, wt=wt, hb_out=hb_out: np.dot(wt, h, out=hb_out))
            pieces[f"layer {k + 1} relu"] = _timer(lambda hb=hb: np.maximum(hb, 0, out=hb))
            h = hb
        pieces["head product"] = _timer(lambda: np.dot(ex._head_t, h, out=ex._logits_one))
    elif mode == "window":
        window = ex.feat[0, : ex.window].reshape(1, -1)
        x = np.ascontiguousarray(np.broadcast_to(window, (n, window.shape[1])))
        h = x
        for k, (wt, buf) in enumerate(zip(ex._weights, ex._hidden)):
            pieces[f"layer {k + 1} product [{n}, {h.shape[1]}] x [{wt.shape[0]}, {wt.shape[1]}]"] = _timer(
                lambda h=h, wt=wt, buf=buf: np.matmul(h, wt, out=buf[:n, :-1]))
            pieces[f"layer {k + 1} relu"] = _timer(lambda buf=buf: np.maximum(buf[:n], 0, out=buf[:n]))
            h = buf[:n]
        pieces["head product"] = _timer(lambda: np.matmul(h, ex._head, out=ex._logits[:n]))
    else:
        one = n == 1
        plan = ex._one if one else ex._plan(n)
        gates = plan.gates_vec if one else plan.gates[0]
        product = np.dot if one else np.matmul
        for k, (wt, (inp, c, hh)) in enumerate(zip(ex._weights, plan.layers)):
            pieces[f"layer {k + 1} product [{wt.shape[0]}, {wt.shape[1]}] x [{inp.shape[0]}, {n}]"
                   f"{' (gemv)' if one else ''}"] = _timer(
                lambda inp=inp, wt=wt: product(wt, inp, out=gates))
            pieces[f"layer {k + 1} cell (8 elementwise calls)"] = _timer(
                lambda c=c, hh=hh: lstm_cell(plan.gates, c, hh))
        pieces["head product"] = _timer(lambda: product(ex._head, plan.head_in, out=plan.logits))
    logits = np.random.default_rng(0).standard_normal((n, 3)).astype(np.float32)
    pieces["score: reference.scores"] = _timer(lambda: reference.scores(logits))
    one, w1 = np.ones((1, 1), np.float32), np.ones((1, 1), np.float32)
    o1 = np.empty((1, 1), np.float32)
    pieces["(call overhead: a 1x1 product)"] = _timer(lambda: np.matmul(one, w1, out=o1))
    vs = [Variant(k, v, n, model.spec.window) for k, v in pieces.items()]
    interleave(vs, args.rounds, args.burst)
    total = float(np.median(vs[0].times))
    parts = 0.0
    for v in vs:
        med = float(np.median(v.times))
        if v is not vs[0] and not v.name.startswith("("):
            parts += med
        print(f"| {name} / {batch} | {v.name} | {med / 1e3:.1f} | {100 * med / total:.0f} % |")
    print(f"| {name} / {batch} | glue (step - pieces) | {(total - parts) / 1e3:.1f} | "
          f"{100 * (total - parts) / total:.0f} % |", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64])
    p.add_argument("--threads", type=int, default=1, help="torch and BLAS threads (default 1, as the service)")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    p.add_argument("--burst", type=int, default=200, help="steps per variant per round (default 200; "
                                                           "fewer for the slow variants)")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="skip the torch.compile variants")
    p.add_argument("--profile", action="store_true", help="where the numpy steps' time goes")
    args = p.parse_args(argv)
    # Dynamo notes once that it traces through reference.price_positions' lru_cache (a constant mask).
    warnings.filterwarnings("ignore", message=".*lru_cache.*")
    threads = limit_cpu_threads(args.threads)
    load = os.getloadavg()
    print(f"# CPU model step, {datetime.date.today()}, {cpu_name()}, affinity {sorted(os.sched_getaffinity(0))}, "
          f"threads {threads}, torch {torch.__version__}, numpy {np.__version__}, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("median / p99 per step in µs (ms where marked)\n")
    profile(args) if args.profile else bench(args)
    load = os.getloadavg()
    print(f"\n# load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
