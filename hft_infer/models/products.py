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
"""

from __future__ import annotations

import time
from functools import partial
from typing import Callable

import numpy as np

PRODUCT_BACKENDS = ("auto", "numpy", "torch")
TIMED_MIN = 1 << 17
"""Multiply-adds below which "auto" does not time a product (numpy: torch's call overhead of
a few µs is more than such a product costs in either)."""
TORCH_MARGIN = 0.9
"""auto takes torch only when its best time is below this fraction of numpy's (a near tie stays
numpy: the cheaper call, and no choice that flips with the machine's noise)."""
_ROUNDS = 9


class BoundProduct:
    """out = a @ b on fixed buffers, bound to one backend: call it with no arguments."""

    __slots__ = ("backend", "run")

    def __init__(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, backend: str) -> None:
        if backend not in ("numpy", "torch"):
            raise ValueError(f"product backend must be 'numpy' or 'torch', got {backend!r}")
        self.backend = backend
        if backend == "numpy":
            self.run: Callable[[], object] = partial(np.matmul, a, b, out=out)
        else:
            import torch

            ta, tb, tout = (torch.from_numpy(x) for x in (a, b, out))
            if tout.data_ptr() != out.ctypes.data:  # from_numpy shares memory; never a copy
                raise AssertionError("torch view of the product's output is not the buffer itself")
            self.run = partial(torch.mm, ta, tb, out=tout)

    def __call__(self) -> None:
        self.run()


def bind_product(a: np.ndarray, b: np.ndarray, out: np.ndarray, backend: str) -> BoundProduct:
    """`out = a @ b` (2-D arrays of one float dtype, no allocation per call) bound to `backend`
    ("auto": the faster here). The inputs are only read and `out` is written; "auto" runs the
    product a few times on the buffers as they are at bind time while timing it, so `out` must
    be scratch and the inputs must hold finite values (zeros are fine)."""
    if backend not in PRODUCT_BACKENDS:
        raise ValueError(f"products must be one of {PRODUCT_BACKENDS}, got {backend!r}")
    if backend != "auto":
        return BoundProduct(a, b, out, backend)
    numpy_product = BoundProduct(a, b, out, "numpy")
    if a.shape[0] * a.shape[1] * b.shape[1] < TIMED_MIN:
        return numpy_product
    torch_product = BoundProduct(a, b, out, "torch")
    t_numpy, t_torch = _best_times(numpy_product, torch_product)
    return torch_product if t_torch < TORCH_MARGIN * t_numpy else numpy_product


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
    _plans: dict

    def _plan(self, n: int):
        raise NotImplementedError

    def prepare(self, batch_sizes) -> None:
        for n in sorted(set(batch_sizes)):
            if 1 < n <= self.max_batch and n not in self._plans:
                self._plan(n)

    def describe(self) -> str:
        """e.g. "products auto: torch for 4 of 18 (batches 8-64)" over the plans made so far."""
        chosen = [(n, p.backend) for n, plan in sorted(self._plans.items()) for p in plan.products]
        torch_at = sorted({n for n, backend in chosen if backend == "torch"})
        if not torch_at:
            return f"products {self.products}: numpy"
        span = str(torch_at[0]) if len(torch_at) == 1 else f"{torch_at[0]}-{torch_at[-1]}"
        n_torch = sum(backend == "torch" for _, backend in chosen)
        return f"products {self.products}: torch for {n_torch} of {len(chosen)} (batches {span})"
