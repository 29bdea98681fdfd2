"""The CPU executors' batched matrix products: numpy's or torch's, whichever is faster here.

numpy's matmul goes to its bundled OpenBLAS, torch's mm to MKL (x86 wheels). Which one is
faster depends on the shape and the machine by up to ~3x either way: on the dev VM (Intel
Xeon, AVX-512, one thread) mlp_small's first layer at batch 8, [8, 1376] x [1376, 128], takes
42 µs in numpy and 15 in torch, at batch 64 143 against 110; a small product such as the
head's [64, 65] x [65, 3] takes 1.1 µs in numpy and 1.7 in torch (torch's call costs more).
So each product of a batch size's plan is bound once to one of the two, on the executor's own
preallocated buffers (views made once; torch.from_numpy shares their memory, and torch's mm
writes into a strided `out` such as a hidden buffer without its trailing 1 column in place):

    backend "numpy" / "torch": that one for every product;
    backend "auto" (the service's default, `runner.cpu_products`): products of at least
        TIMED_MIN multiply-adds are timed both ways when the plan is made (the eager engine
        makes its buckets' plans at start-up, `Executor.prepare`), and torch is taken when
        its best time is below TORCH_MARGIN x numpy's; smaller products stay numpy.

The two differ only in fp32 summation order (results within a few ulp of each other); a
process keeps its choice for its life. Batch 1's matrix x vector products are numpy's gemv
in every mode (the fastest form there: no torch call beats it).

bf16 (`runner.precision = "bf16"`, opt-in): a product whose one operand is a weight matrix (the
caller says which: `bf16_weights="a"` or `"b"`) may also run as torch's bf16 mm, which oneDNN
runs on AMX or AVX512-BF16 where the core has them: the weights converted once at bind, the
activations rounded to bf16 on the way in (one copy), the product accumulated in fp32 and
rounded to bf16 on the way out, then copied into the fp32 `out`. On the dev VM (Xeon with AMX)
mlp_small's first layer at batch 64 takes ~50 µs called back to back against ~111-123 in fp32
(but ~88 inside a step, whose other work evicts its operands from L2); at batch 2-8 it is
slower than fp32 (~20 µs: oneDNN's fixed cost); lstm_c's layers, whose fp32 weights are read
from memory at every step, run ~3-4x faster. So under "auto" it is one more timed candidate,
taken when below TORCH_MARGIN x the faster fp32 backend's time; with a forced backend ("numpy"
/ "torch") the eligible products are bf16 untimed. Scores move by up to ~3e-3 (measured
on the presets: 2.3e-3 to 3.2e-3 of the largest score against float64; runner/self_check.py's bf16
tolerance is checked against the fp32 engine at start-up). Biases
ride in the weights (the constant-1 input column), so they are rounded too; the head and
everything elementwise stay fp32.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Callable

import numpy as np

PRODUCT_BACKENDS = ("auto", "numpy", "torch")
PRECISIONS = ("fp32", "bf16")
TIMED_MIN = 1 << 17
"""Multiply-adds below which "auto" does not time a product (numpy: torch's call overhead of
a few µs is more than such a product costs in either)."""
TORCH_MARGIN = 0.9
"""auto takes torch only when its best time is below this fraction of numpy's (a near tie stays
numpy: the cheaper call, and no choice that flips with the machine's noise)."""
_ROUNDS = 9


class BoundProduct:
    """out = a @ b on fixed buffers, bound to one backend: call it with no arguments.
    backend "bf16" needs `weights` ("a" or "b"): the operand converted to bf16 once, here."""

    __slots__ = ("backend", "run")

    def __init__(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, backend: str, *,
                 weights: str | None = None) -> None:
        if backend not in ("numpy", "torch", "bf16"):
            raise ValueError(f"product backend must be 'numpy', 'torch' or 'bf16', got {backend!r}")
        self.backend = backend
        if backend == "numpy":
            self.run: Callable[[], object] = partial(np.matmul, a, b, out=out)
            return
        import torch

        ta, tb, tout = (torch.from_numpy(x) for x in (a, b, out))
        if tout.data_ptr() != out.ctypes.data:  # from_numpy shares memory; never a copy
            raise AssertionError("torch view of the product's output is not the buffer itself")
        if backend == "torch":
            self.run = partial(torch.mm, ta, tb, out=tout)
        else:
            self.run = _bf16_product(ta, tb, tout, weights)

    def __call__(self) -> None:
        self.run()


def _bf16_product(ta, tb, tout, weights: str | None) -> Callable[[], None]:
    """out = a @ b with the `weights` operand held in bf16 (converted now: it must not change
    afterwards) and the other rounded to bf16 at each call; fp32 accumulation (oneDNN), the
    bf16 result copied into `tout`. Three torch calls per product, on buffers made here."""
    import torch

    if weights not in ("a", "b"):
        raise ValueError(f"a bf16 product needs its weight operand named ('a' or 'b'), got {weights!r}")
    if tout.dtype != torch.float32:
        raise ValueError(f"a bf16 product writes float32 buffers, got {tout.dtype}")
    act = ta if weights == "b" else tb  # the operand that changes from call to call
    act_bf16 = torch.empty(act.shape, dtype=torch.bfloat16)
    w_bf16 = (tb if weights == "b" else ta).to(torch.bfloat16).contiguous()
    out_bf16 = torch.empty(tout.shape, dtype=torch.bfloat16)
    left, right = (act_bf16, w_bf16) if weights == "b" else (w_bf16, act_bf16)
    copy_in, product, copy_out = partial(act_bf16.copy_, act), partial(torch.mm, left, right, out=out_bf16), \
        partial(tout.copy_, out_bf16)

    def run() -> None:
        copy_in()
        product()
        copy_out()
    return run


def bind_product(a: np.ndarray, b: np.ndarray, out: np.ndarray, backend: str, *,
                 bf16_weights: str | None = None) -> BoundProduct:
    """`out = a @ b` (2-D arrays of one float dtype, no allocation per call) bound to `backend`
    ("auto": the faster here). The inputs are only read and `out` is written; "auto" runs the
    product a few times on the buffers as they are at bind time while timing it, so `out` must
    be scratch and the inputs must hold finite values (zeros are fine). `bf16_weights` ("a" or
    "b": that operand is a weight matrix that never changes; only under runner.precision =
    "bf16") makes bf16 a candidate under "auto" and the product under a forced backend."""
    if backend not in PRODUCT_BACKENDS:
        raise ValueError(f"products must be one of {PRODUCT_BACKENDS}, got {backend!r}")
    if backend != "auto":
        if bf16_weights is not None:
            return BoundProduct(a, b, out, "bf16", weights=bf16_weights)
        return BoundProduct(a, b, out, backend)
    best = BoundProduct(a, b, out, "numpy")
    if a.shape[0] * a.shape[1] * b.shape[1] < TIMED_MIN:
        return best
    candidates = [best, BoundProduct(a, b, out, "torch")]
    if bf16_weights is not None:
        candidates.append(BoundProduct(a, b, out, "bf16", weights=bf16_weights))
    # In order, a later candidate replaces the best so far only when clearly faster than it.
    t_best, *t_rest = _best_times(*candidates)
    for product, t in zip(candidates[1:], t_rest):
        if t < TORCH_MARGIN * t_best:
            best, t_best = product, t
    return best


BF16_FLAGS = ("amx_bf16", "avx512_bf16")
"""CPU flags (Linux /proc/cpuinfo) of native bf16 products: AMX tiles, AVX-512 BF16 dot products."""


def bf16_hardware(cpuinfo: str | None = None) -> list[str] | None:
    """The BF16_FLAGS this CPU has (from /proc/cpuinfo's first flags line, or `cpuinfo`'s text);
    None where that cannot be read (not Linux). Without either flag oneDNN's bf16 product runs
    a converting fallback: "auto" then finds it slower and keeps fp32."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return [flag for flag in BF16_FLAGS if flag in flags]
    return None


def _best_times(*products: BoundProduct) -> list[float]:
    """Each product's fastest call in ns, interleaved round by round, after two calls each
    (first touch, BLAS dispatch). The minimum, not the median: a busy machine (a shared VM, a
    neighbour's burst) only ever adds time, so the best call is the product's own cost."""
    times: list[list[int]] = [[] for _ in products]
    clock = time.perf_counter_ns
    for p in products:
        p()
        p()
    for _ in range(_ROUNDS):
        for p, ts in zip(products, times):
            t0 = clock()
            p()
            ts.append(clock() - t0)
    return [float(min(ts)) for ts in times]


class PlannedProducts:
    """Mixin of the numpy executors, whose per-batch-size plans (`self._plans`, made by
    `self._plan(n)`) hold their bound products in `plan.products`."""

    products: str = "auto"
    precision: str = "fp32"
    _plans: dict

    def _plan(self, n: int):
        raise NotImplementedError

    def prepare(self, batch_sizes) -> None:
        for n in sorted(set(batch_sizes)):
            if 1 < n <= self.max_batch and n not in self._plans:
                self._plan(n)

    def bf16_weights(self, operand: str) -> str | None:
        """What to pass as bind_product's `bf16_weights` for a weight operand: `operand` when
        this executor runs bf16 products (runner.precision = "bf16", float32 buffers), else None."""
        return operand if self.precision == "bf16" and self.np_dtype == np.float32 else None

    def describe(self) -> str:
        """e.g. "products auto: torch for 4 of 18 (batches 8-64)" over the plans made so far;
        with precision bf16 also "bf16 for 6 of 18 (batches 16-64)"."""
        chosen = [(n, p.backend) for n, plan in sorted(self._plans.items()) for p in plan.products]
        parts = []
        for backend in ("torch", "bf16"):
            at = sorted({n for n, b in chosen if b == backend})
            if at:
                span = str(at[0]) if len(at) == 1 else f"{at[0]}-{at[-1]}"
                count = sum(b == backend for _, b in chosen)
                parts.append(f"{backend} for {count} of {len(chosen)} (batches {span})")
        if self.precision == "bf16" and chosen and not any(b == "bf16" for _, b in chosen):
            parts.append("bf16 for none (slower than fp32 here at every batch)")
        head = f"products {self.products}" + (", precision bf16" if self.precision == "bf16" else "")
        return f"{head}: {', '.join(parts) or 'numpy'}"
