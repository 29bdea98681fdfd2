"""The torch executors: the CPU path before the numpy one (see executor.py).

Eager torch ops on preallocated tensors under `torch.inference_mode()`, no
host syncs, no Python per batch row; each op costs ~3-7 µs of dispatch on
the 2-core dev VM, which is why the CPU engine now runs the numpy executors.
Kept as the comparison in tools/bench_models_cpu.py and as a second
implementation the tests cross-check; `LstmRecomputeExecutor` (nn.LSTM over
each window, oneDNN's fused kernel) is also the window-mode reference and
what `window_method = "recompute"` serves. The features/preprocess part
allocates small temporaries (kernels/reference.py is the single definition
of the row transform and is shared with the GPU references).

`step` takes numpy arrays (the contract) or torch tensors (the same memory
either way; tensors skip the wrapping).
"""

from __future__ import annotations

import numpy as np
import torch

from hft_infer.models.base import WindowModel, scores_into
from hft_infer.models.executor import Executor
from hft_infer.models.lstm import LstmModel


def as_tensors(*arrays):
    """torch views of numpy arrays (tensors pass through): no copy."""
    return tuple(torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in arrays)


class TorchExecutor(Executor):
    """Shared torch scratch: the head, the scores and the newest-row gather."""

    backend = "torch"

    def __init__(self, model: WindowModel, ring, max_batch: int) -> None:
        super().__init__(model, ring, max_batch)
        f = self.width
        self._ring_flat = self.ring.view(self.n_slots * self.ring_len, f)
        self._head_w = model.head.weight.detach()
        self._head_b = model.head.bias.detach()
        self._logits = torch.empty(max_batch, model.spec.outputs, dtype=self.dtype)
        self._sums = torch.empty(max_batch, 1, dtype=self.dtype)
        self._base = torch.empty(max_batch, dtype=torch.int64)
        self._flat = torch.empty(max_batch, dtype=torch.int64)
        self._latest = torch.empty(max_batch, f, dtype=torch.float32)

    def _head_into(self, h: torch.Tensor, out: torch.Tensor) -> None:
        n = h.shape[0]
        logits = torch.addmm(self._head_b, h, self._head_w.t(), out=self._logits[:n])
        scores_into(logits, out, self._sums[:n])

    def _latest_rows(self, slots: torch.Tensor, positions: torch.Tensor, n: int) -> torch.Tensor:
        """float32 [n, F]: each trigger's own row, ring[slot, position % R]."""
        flat = torch.remainder(positions, self.ring_len, out=self._flat[:n])
        flat.add_(torch.mul(slots, self.ring_len, out=self._base[:n]))
        return torch.index_select(self._ring_flat, 0, flat, out=self._latest[:n])
class _WindowReader(TorchExecutor):
    """Shared gather of [n, W] ring rows per trigger."""

    def __init__(self, model: WindowModel, ring, max_batch: int) -> None:
        self.ring_rows = model.spec.window
        super().__init__(model, ring, max_batch)
        w = self.window
        self._idx = torch.empty(max_batch, w, dtype=torch.int64)
        self._mask = torch.empty(max_batch, w, dtype=torch.bool)
        self._rows = torch.empty(max_batch * w, self.width, dtype=torch.float32)

    def _gather(self, slots: torch.Tensor, n: int) -> torch.Tensor:
        """Rows at positions self._idx[:n] (absolute) of each slot -> float32 [n, W, F]."""
        return gather_windows(self, slots, n)


def window_rows(ex, slots: torch.Tensor, positions: torch.Tensor, n: int) -> torch.Tensor:
    """Each trigger's window, rows t-W+1..t of its slot (ex._offsets = -W+1..0), oldest first, as
    float32 [n, W, F] in ex._rows; rows before the instrument's first are zero raw rows."""
    idx = torch.add(positions[:, None], ex._offsets, out=ex._idx[:n])
    missing = torch.lt(idx, 0, out=ex._mask[:n])
    return gather_windows(ex, slots, n).masked_fill_(missing[:, :, None], 0.0)


def gather_windows(ex, slots: torch.Tensor, n: int) -> torch.Tensor:
    """The ring rows at absolute positions ex._idx[:n] ([n, W], overwritten) of each slot, as
    float32 [n, W, F] in ex._rows, through the executor's preallocated ex._base; no allocation."""
    idx = ex._idx[:n]
    torch.remainder(idx, ex.ring_len, out=idx)
    torch.mul(slots, ex.ring_len, out=ex._base[:n])
    idx.add_(ex._base[:n, None])
    rows = torch.index_select(ex._ring_flat, 0, idx.view(-1), out=ex._rows[: n * ex.window])
    return rows.view(n, ex.window, ex.width)


class MlpWindowExecutor(_WindowReader):
    """MLP window: rows t-W+1..t, oldest first; rows before the instrument's first are zero raw rows."""

    def __init__(self, model: WindowModel, ring, max_batch: int) -> None:
        super().__init__(model, ring, max_batch)
        self._offsets = torch.arange(-self.window + 1, 1, dtype=torch.int64)

    @torch.inference_mode()
    def step(self, slots, positions, out) -> None:
        slots, positions, out = as_tensors(slots, positions, out)
        n = self._check_batch(slots)
        rows = window_rows(self, slots, positions, n)
        h = self.model.features(rows).view(n, -1)
        for layer in self.model.layers:
            h = torch.relu_(torch.nn.functional.linear(h, layer.weight, layer.bias))
        self._head_into(h, out)


class LstmRecomputeExecutor(_WindowReader):
    """LSTM window, recomputed with `torch.nn.LSTM` per trigger: the (a) baseline.

    The window's first row is placed at step 0 (rows start..t, start = max(0, t-W+1)) and
    the output is read at step t - start, so shorter windows at an instrument's start are
    exact; the steps after it read the current row again and are ignored.
    """

    def __init__(self, model: WindowModel, ring, max_batch: int) -> None:
        super().__init__(model, ring, max_batch)
        self._steps = torch.arange(self.window, dtype=torch.int64)
        self._start = torch.empty(max_batch, dtype=torch.int64)
        self._last = torch.empty(max_batch, dtype=torch.int64)
        self._arange = torch.arange(max_batch, dtype=torch.int64)

    @torch.inference_mode()
    def step(self, slots, positions, out) -> None:
        slots, positions, out = as_tensors(slots, positions, out)
        n = self._check_batch(slots)
        start = torch.sub(positions, self.window - 1, out=self._start[:n]).clamp_(min=0)
        idx = torch.add(start[:, None], self._steps, out=self._idx[:n])
        torch.minimum(idx, positions[:, None], out=idx)
        last = torch.sub(positions, start, out=self._last[:n])
        rows = self._gather(slots, n)
        seq, _ = self.model.lstm(self.model.features(rows))
        self._head_into(seq[self._arange[:n], last], out)


class LstmStreamExecutor(TorchExecutor):
    """LSTM stream: one recurrent step per event from the slot's (h, c)."""

    stateful = True
    ring_rows = 1

    def __init__(self, model: LstmModel, ring, max_batch: int) -> None:
        super().__init__(model, ring, max_batch)
        spec = model.spec
        hid, nl = spec.hidden[0], spec.layers
        self._cells = [model.cell_weights(layer) for layer in range(nl)]
        # h and c of every layer in one tensor [layer, h|c, slot, H]: one gather and one
        # scatter per step (each torch op costs microseconds of dispatch), contiguous h and c.
        self._state = torch.zeros(nl, 2, self.n_slots, hid, dtype=self.dtype)
        self._scratch = torch.empty(nl * 2 * max_batch * hid, dtype=self.dtype)
        self._gates = torch.empty(max_batch, 4 * hid, dtype=self.dtype)

    def reset(self) -> None:
        self._state.zero_()

    def reset_slots(self, slots) -> None:
        self._state[:, :, torch.as_tensor(slots, dtype=torch.int64)] = 0

    @torch.inference_mode()
    def step(self, slots, positions, out) -> None:
        slots, positions, out = as_tensors(slots, positions, out)
        n = self._check_batch(slots)
        nl, _, _, hid = self._state.shape
        x = self.model.features(self._latest_rows(slots, positions, n))
        st = torch.index_select(self._state, 2, slots, out=self._scratch[: nl * 2 * n * hid].view(nl, 2, n, hid))
        gates = self._gates[:n]
        for layer, (w_ih, w_hh, bias) in enumerate(self._cells):
            h, c = st[layer, 0], st[layer, 1]
            torch.addmm(bias, x, w_ih.t(), out=gates)
            gates.addmm_(h, w_hh.t())
            lstm_cell_(gates, c, h)
            x = h
        self._state.index_copy_(2, slots, st)
        self._head_into(x, out)


def lstm_cell_(gates: torch.Tensor, c: torch.Tensor, h: torch.Tensor) -> None:
    """In place: gates [M, 4H] pre-activations in (i, f, o, g) order (`LstmModel.cell_weights`),
    c [M, H] -> c', h [M, H] <- h'. torch.nn.LSTM's math: c' = f * c + i * g, h' = o * tanh(c')."""
    hid = c.shape[-1]
    gates[:, : 3 * hid].sigmoid_()
    gates[:, 3 * hid:].tanh_()
    c.mul_(gates[:, hid: 2 * hid]).addcmul_(gates[:, :hid], gates[:, 3 * hid:])
    torch.tanh(c, out=h)
    h.mul_(gates[:, 2 * hid: 3 * hid])
