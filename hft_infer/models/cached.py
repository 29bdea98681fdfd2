"""Torch MLP executor that computes each row's features once (the previous CPU default; see numpy_mlp.py).

The reference `MlpWindowExecutor` preprocesses and normalises all W rows of
every window at every step: for a window of 32 rows that is 32 times the
row transform work per decision, and most of the CPU step time (profiled:
`where`, `log1p`, `mul` over [n, W, F] dominate a batch-64 step).

Features are a per-row function (models/features.py), so this executor keeps
a second ring of *normalised features* beside the raw ring and, at each
step, transforms only the rows that are new since the slot's last step
(batched over the whole step, never per event in Python): under conflation
that is the rows written since the slot was last decided (at most W), in
sequential mode exactly one per entry. The window is then one gather from the
feature ring. Rows before an instrument's first are the features of a zero
raw row (the MLP's window semantics), kept in the padding sink's rows.

Same numbers as the reference up to float32 rounding of the row transform
(tests/unit/test_models_cached.py compares them over interleaved streams with
conflation gaps).
"""

from __future__ import annotations

import numpy as np
import torch

from hft_infer.kernels.reference import scores
from hft_infer.models.base import WindowModel
from hft_infer.models.features import preprocess
from hft_infer.models.torch_executors import TorchExecutor, as_tensors


def scores_np(logits: np.ndarray, out: np.ndarray) -> None:
    """`reference.scores` of numpy logits, into `out`."""
    out[:] = scores(logits)


class MlpCachedExecutor(TorchExecutor):
    stateful = False  # the window is read from the rings: triggers may be conflated

    def __init__(self, model: WindowModel, ring, max_batch: int) -> None:
        self.ring_rows = model.spec.window
        super().__init__(model, ring, max_batch)
        s, r, f = ring.shape
        w = self.window
        self.feat = torch.zeros(s, r, f, dtype=self.dtype)
        self._feat_flat = self.feat.view(s * r, f)
        # numpy views of the same memory: the per-step tail (new rows' transform, scores)
        # is numpy, where a small operation costs ~1 us against ~5 us in torch.
        self._feat_np = self._feat_flat.numpy()
        self._ring_np = self._ring_flat.numpy()
        self._mean_np = model.norm_mean.detach().numpy().astype(self._feat_np.dtype)
        self._inv_std_np = model.norm_inv_std.detach().numpy().astype(self._feat_np.dtype)
        self._levels = model.spec.levels
        self.upto = np.zeros(s, dtype=np.int64)  # rows < upto[slot] have their features in self.feat
        self._sink_base = (s - 1) * r  # the padding sink's rows hold the zero row's features
        self._offsets = np.arange(-w + 1, 1, dtype=np.int64)
        self._x = torch.empty(max_batch * w, f, dtype=self.dtype)
        self._layers = [(layer.weight.detach(), layer.bias.detach()) for layer in model.layers]
        self._hidden = [torch.empty(max_batch, wt.shape[0], dtype=self.dtype) for wt, _ in self._layers]
        self.reset()

    def reset(self) -> None:
        self.upto[:] = 0
        with torch.inference_mode():
            self.feat.zero_()
            zero_row = self.model.features(torch.zeros(1, self.width, dtype=torch.float32))[0]
            self.feat[self.n_slots - 1] = zero_row

    def reset_slots(self, slots) -> None:
        self.upto[slots] = 0  # the feature store restarts these slots at position 0

    @torch.inference_mode()
    def step(self, slots, positions, out) -> None:
        slots, positions, out = as_tensors(slots, positions, out)
        n = self._check_batch(slots)
        s = slots.numpy()
        p = positions.numpy()
        r = self.ring_len
        sink = self.n_slots - 1
        # 1. transform the rows that are new since each slot's last step (at most the window)
        start = np.maximum(np.maximum(self.upto[s], p - self.window + 1), 0)
        k = np.maximum(p - start + 1, 0)
        k[s == sink] = 0  # padding entries read the sink's fixed rows
        total = int(k.sum())
        if total:
            first = np.repeat(start - (np.cumsum(k) - k), k)  # position of each new row, vectorised
            flat = np.repeat(s, k) * r + (first + np.arange(total)) % r
            raw = self._ring_np[flat].astype(self._feat_np.dtype, copy=False)
            self._feat_np[flat] = (preprocess(raw, self._levels) - self._mean_np) * self._inv_std_np
            np.maximum.at(self.upto, s, p + 1)
        # 2. gather the windows from the feature ring (missing history -> the sink's zero-row features)
        pw = p[:, None] + self._offsets
        idx = np.where(pw >= 0, s[:, None] * r + pw % r, self._sink_base)
        x = torch.index_select(self._feat_flat, 0, torch.from_numpy(idx.reshape(-1)), out=self._x[: n * self.window])
        h = x.view(n, -1)
        for (wt, b), buf in zip(self._layers, self._hidden):
            h = torch.addmm(b, h, wt.t(), out=buf[:n]).relu_()
        logits = torch.addmm(self._head_b, h, self._head_w.t(), out=self._logits[:n]).numpy()
        scores_np(logits, out.numpy())
