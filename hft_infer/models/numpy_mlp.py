"""The CPU engine's MLP step in numpy: each raw row transformed once, the window read in place.

Why numpy: at batch 1 the step is a few dozen small operations, and one
numpy call costs ~1 µs on the 2-core dev VM against ~3-7 µs for a torch op;
the matrix products go to the bundled OpenBLAS (single-threaded, see
runner/eager.py), except that a larger batch's products may be bound to
torch's mm (MKL) where that is faster for the shape on this machine
(products.py: up to ~3x for the first layer at batch 8-16 on the dev VM).

Feature ring. Beside the raw ring (float32 [S, R, F]) the executor keeps the
rows' *normalised features* (`reference.features`, the one definition of the
row transform), so each raw row is transformed once however many windows it
appears in. The feature ring holds 2R rows per slot: the features of the row
at position p are written at index i = p % R and again at i + R, so the
window ending at p is always the contiguous block i + R - W + 1 .. i + R
(W <= R). At batch 1 the first layer reads that block in place; for larger
batches one `take` gathers the windows. Rows before an instrument's first
are the features of a zero raw row (the MLP's window semantics): reset fills
the slot's whole feature ring with them, and a window that reaches before
row 0 reads ring rows not written since (they belong to positions > p).

Each feature row carries a trailing constant 1 and the first layer's weights
a matching row holding bias / W, so the bias rides in the matrix product;
the hidden buffers likewise end in a constant 1 column for the next layer's
bias. ReLU is applied in place to the whole buffer (max(1, 0) = 1).

New rows. A trigger (s, p) needs the rows max(upto[s], p-W+1, 0)..p
transformed (`upto[s]`: rows below it are in the feature ring). In the
common case that is just row p (every trigger has upto >= p): one gather,
one transform, two scatters. Under conflation (several rows per instrument
between decisions) the catch-up path transforms exactly the missing rows,
batched over the step with `np.repeat` (its index arrays are allocated:
bounded by n x W). Lowering `upto` is always safe (a row is transformed
again, to the same value), which is why duplicate triggers need no care.

Batch 1 runs on Python ints (a numpy call on a length-1 index vector costs
~1 µs, a Python int operation ~50 ns) and multiplies transposed [out, in]
weight copies by the window vector read in place (np.dot: BLAS gemv, a few
µs less than matmul's [1, in] x [in, out] on the dev VM); larger batches run
vectorised with matrix products. At batch 1 `reference.features` and
`reference.scores` take their scalar forms (Python floats: ~7 and ~2 µs
against ~19 and ~6 for ~18 and ~7 numpy calls). What still allocates per
step: those two definitions' results and temporaries (a few arrays of n x F
and n x 3) -- the definitions are used as they are, not re-implemented with
`out=`.
"""

from __future__ import annotations

import numpy as np

from hft_infer.kernels.reference import features, scores
from hft_infer.models.base import WindowModel
from hft_infer.models.executor import Executor
from hft_infer.models.products import PlannedProducts, bind_product


class _Plan:
    """Views of the scratch buffers for one batch size (see MlpNumpyExecutor._plan)."""

    __slots__ = ("layers", "head", "products", "logits", "u", "lt", "base", "flat", "last", "raw", "win_idx",
                 "win_idx_flat", "x_rows", "x")


def _augmented(weight, bias) -> np.ndarray:
    """[in + 1, out] float64: W^T with the bias as the last row (the input ends in a constant 1)."""
    w = weight.detach().double().numpy()
    return np.concatenate([w.T, bias.detach().double().numpy()[None, :]], axis=0)


class MlpNumpyExecutor(PlannedProducts, Executor):
    stateful = False  # the window is read from the rings: triggers may be conflated
    backend = "numpy"

    def __init__(self, model: WindowModel, ring, max_batch: int, *, products: str = "auto",
                 precision: str = "fp32") -> None:
        self.ring_rows = model.spec.window
        self.products = products  # products.py: numpy's or torch's product per batch size
        self.precision = precision  # products.py: "bf16" lets the hidden layers' products run in bf16
        super().__init__(model, ring, max_batch)
        s, r, f, w, dt = self.n_slots, self.ring_len, self.width, self.window, self.np_dtype
        self._mean = model.norm_mean.detach().numpy().astype(dt)
        self._inv_std = model.norm_inv_std.detach().numpy().astype(dt)
        self.feat = np.ones((s, 2 * r, f + 1), dtype=dt)  # column f stays 1: the first layer's bias input
        self._feat_flat = self.feat.reshape(s * 2 * r, f + 1)
        self._ring_flat = self.ring_np.reshape(s * r, f)
        self.upto = np.zeros(s, dtype=np.int64)
        self._zero_features = features(np.zeros((1, f), dt), self._mean, self._inv_std)[0]

        first, *rest = model.layers
        h1 = first.weight.shape[0]
        w1 = np.empty((w, f + 1, h1))
        w1[:, :f] = first.weight.detach().double().numpy().reshape(h1, w, f).transpose(1, 2, 0)
        w1[:, f] = first.bias.detach().double().numpy() / w  # W rows of 1 x bias / W = bias
        self._weights = [w1.reshape(w * (f + 1), h1).astype(dt)]
        self._weights += [_augmented(layer.weight, layer.bias).astype(dt) for layer in rest]
        self._head = _augmented(model.head.weight, model.head.bias).astype(dt)
        # Hidden activations, each with a trailing constant-1 column (set here, never written).
        self._hidden = [np.ones((max_batch, wt.shape[1] + 1), dtype=dt) for wt in self._weights]
        self._logits = np.empty((max_batch, model.spec.outputs), dtype=dt)
        # Batch 1 multiplies a [out, in] matrix by the window vector (np.dot: BLAS gemv, ~1.5-4 µs
        # less than matmul's [1, in] x [in, out] on the dev VM), into row 0 of the same buffers.
        self._one = [(np.ascontiguousarray(wt.T), buf[0], buf[0, :-1]) for wt, buf in zip(self._weights, self._hidden)]
        self._head_t = np.ascontiguousarray(self._head.T)
        self._logits_one = self._logits[0]

        # Batched-path scratch.
        self._u = np.empty(max_batch, np.int64)
        self._lt = np.empty(max_batch, bool)
        self._base = np.empty(max_batch, np.int64)
        self._flat = np.empty(max_batch, np.int64)
        self._last = np.empty(max_batch, np.int64)  # feature-ring index of each window's last row
        self._raw = np.empty((max_batch, f), np.float32)
        self._win_offsets = np.arange(-w + 1, 1, dtype=np.int64)
        self._win_idx = np.empty((max_batch, w), np.int64)
        self._x = np.zeros((max_batch * w, f + 1), dtype=dt)  # finite: "auto" times products on it
        self._plans: dict[int, _Plan] = {}
        self.reset()

    # ------------------------------------------------------------ state

    def reset(self) -> None:
        self.upto[:] = 0
        self.feat[:, :, : self.width] = self._zero_features

    def reset_slots(self, slots) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        self.upto[slots] = 0  # the feature store restarts these slots at position 0
        self.feat[slots, :, : self.width] = self._zero_features

    # ------------------------------------------------------------ the step

    def step(self, slots: np.ndarray, positions: np.ndarray, out: np.ndarray) -> None:
        n = self._check_batch(slots)
        if n == 1:
            self._step_one(slots, positions, out)
            return
        plan = self._plans.get(n) or self._plan(n)
        self._windows(slots, positions, n, plan)  # into plan.x, the first product's input
        for product, hb in plan.layers:
            product.run()
            np.maximum(hb, 0, out=hb)
        plan.head.run()
        out[:] = scores(plan.logits)

    def _plan(self, n: int) -> _Plan:
        """The views of every scratch buffer for a batch of n, made once per n (slicing a
        numpy array costs ~0.2-0.4 µs; a step would otherwise slice a dozen times)."""
        plan = _Plan()
        plan.x_rows = self._x[: n * self.window]
        plan.x = plan.x_rows.reshape(n, -1)
        plan.logits = self._logits[:n]
        plan.layers, h = [], plan.x
        for wt, buf in zip(self._weights, self._hidden):
            plan.layers.append((bind_product(h, wt, buf[:n, :-1], self.products,
                                             bf16_weights=self.bf16_weights("b")), buf[:n]))
            h = buf[:n]
        plan.head = bind_product(h, self._head, plan.logits, self.products)
        plan.products = [product for product, _ in plan.layers] + [plan.head]
        plan.u, plan.lt, plan.base = self._u[:n], self._lt[:n], self._base[:n]
        plan.flat, plan.last, plan.raw = self._flat[:n], self._last[:n], self._raw[:n]
        plan.win_idx = self._win_idx[:n]
        plan.win_idx_flat = plan.win_idx.reshape(-1)
        self._plans[n] = plan
        return plan

    def _step_one(self, slots: np.ndarray, positions: np.ndarray, out: np.ndarray) -> None:
        """Batch of one: matrix-vector products on the window read in place."""
        h = self._window_one(int(slots[0]), int(positions[0]), slots, positions)
        for wt, hb, hb_out in self._one:
            np.dot(wt, h, out=hb_out)
            np.maximum(hb, 0, out=hb)
            h = hb
        out[0] = scores(np.dot(self._head_t, h, out=self._logits_one))

    def _window_one(self, s: int, p: int, slots: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Batch of one: transform row p if needed, return its window [W*(F+1)] (a view)."""
        r, f, w = self.ring_len, self.width, self.window
        i = p % r
        if self.upto[s] < p:  # rows before p are missing too (conflation): the general path
            self._catch_up(slots, positions, 1)
        else:
            raw = self.ring_np[s, i: i + 1]
            row = features(raw.astype(self.np_dtype, copy=False), self._mean, self._inv_std)[0]
            feat = self.feat[s]
            feat[i, :f] = row
            feat[i + r, :f] = row
            self.upto[s] = p + 1
        return self.feat[s, i + r - w + 1: i + r + 1].reshape(-1)

    def _windows(self, slots: np.ndarray, positions: np.ndarray, n: int, plan: _Plan) -> None:
        """Transform the new rows of a batch and gather its windows into plan.x [n, W*(F+1)]."""
        r, f = self.ring_len, self.width
        u = self.upto.take(slots, out=plan.u, mode="clip")
        base = np.multiply(slots, r, out=plan.base)  # s * R
        last = plan.last
        if np.less(u, positions, out=plan.lt).any():
            self._catch_up(slots, positions, n)
            np.remainder(positions, r, out=last)  # feature ring row s * 2R + p % R + R
            np.add(last, base, out=last)
            np.add(last, base, out=last)
            last += r
        else:  # one new row per trigger (or none: transformed again, same value)
            flat = np.remainder(positions, r, out=plan.flat)
            np.add(flat, base, out=flat)  # raw ring row s * R + p % R
            raw = self._ring_flat.take(flat, axis=0, out=plan.raw, mode="clip")
            rows = features(raw.astype(self.np_dtype, copy=False), self._mean, self._inv_std)
            np.add(flat, base, out=last)  # feature ring row s * 2R + p % R ...
            self._feat_flat[last, :f] = rows
            last += r  # ... and its copy R rows on: the window's last row
            self._feat_flat[last, :f] = rows
            np.add(positions, 1, out=u)
            self.upto[slots] = u
        np.add(last[:, None], self._win_offsets, out=plan.win_idx)
        self._feat_flat.take(plan.win_idx_flat, axis=0, out=plan.x_rows, mode="clip")

    def _catch_up(self, slots: np.ndarray, positions: np.ndarray, n: int) -> None:
        """Transform every row a trigger's window needs that is not in the feature ring yet."""
        r, f, w = self.ring_len, self.width, self.window
        s, p = slots[:n], positions[:n]
        u = self.upto[s]
        start = np.maximum(np.maximum(u, p - (w - 1)), 0)
        k = np.maximum(p - start + 1, 0)  # rows to transform per trigger
        total = int(k.sum())
        if total:
            pos = np.repeat(start - (np.cumsum(k) - k), k) + np.arange(total)
            slot_of = np.repeat(s, k)
            i = pos % r
            raw = self.ring_np[slot_of, i]
            rows = features(raw.astype(self.np_dtype, copy=False), self._mean, self._inv_std)
            self.feat[slot_of, i, :f] = rows
            self.feat[slot_of, i + r, :f] = rows
        self.upto[s] = np.maximum(u, p + 1)
