"""CPU reference executors: the model step the service's eager engine runs.

`build_executor(model, ring, ...)` returns an `Executor` bound to the feature
store's raw-row ring, float32 [n_slots, R, F]; the row at absolute position p
of slot s lives at ring[s, p % R]. The last slot is the engine's padding sink.

    step(slots, positions, out)   int64 [n], int64 [n], float32 [n] scores

Window semantics (the GPU kernels follow the same): the decision for row t
sees rows max(0, t-W+1)..t. LSTM: zero state at the window start (so for
t < W-1 the window is rows 0..t). MLP: missing rows are all-zero *raw* rows,
oldest row first.

Executors:
- `MlpWindowExecutor` (the reference), `MlpCachedExecutor` (cached.py; the
  default: the same numbers, each row's features computed once),
  `LstmRecomputeExecutor`: read whole windows from the ring; stateless, so
  the scheduler may conflate triggers.
- `LstmIncrementalExecutor` (incremental.py; the default for LSTM window mode
  on CPU) and `LstmStreamExecutor`: keep per-slot recurrent state, so rows
  must be applied in order, at most one per slot per step.

Everything a step touches is allocated at build for `max_batch`; steps run
under `torch.inference_mode()` with no host syncs and no Python per batch row.
The features/preprocess part allocates small temporaries (features.py is the
single definition of the row transform and is shared with the GPU references).
"""

from __future__ import annotations

import torch

from hft_infer.models.base import WindowModel, scores_into
from hft_infer.models.lstm import LstmModel

MODES = ("window", "stream")
WINDOW_METHODS = ("incremental", "recompute")


class Executor:
    """Runs one model step over a batch of (slot, position) triggers."""

    stateful: bool = False
    """True: rows must be applied in order, at most one per slot per step (distinct slots,
    except the padding sink). False: the window is read from the ring; triggers may be conflated."""
    window: int
    """W: rows per decision of the model (the window semantics)."""
    ring_rows: int
    """Most recent rows per slot that must still be in the ring when a step runs."""

    def __init__(self, model: WindowModel, ring: torch.Tensor, max_batch: int) -> None:
        if ring.dim() != 3 or ring.dtype != torch.float32:
            raise ValueError(f"ring must be float32 [n_slots, R, F], got {ring.dtype} {tuple(ring.shape)}")
        n_slots, r, f = ring.shape
        if f != model.spec.features:
            raise ValueError(f"ring rows are {f} wide, the model reads {model.spec.features} "
                             f"({model.spec.levels} levels)")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.model = model
        self.ring = ring
        self.n_slots, self.ring_len, self.width = n_slots, r, f
        self.max_batch = max_batch
        self.window = model.spec.window
        self.dtype = model.spec.torch_dtype
        self._ring_flat = ring.view(n_slots * r, f)
        if r < self.ring_rows:
            raise ValueError(f"ring holds {r} rows per slot, this executor needs >= {self.ring_rows}")
        self._head_w = model.head.weight.detach()
        self._head_b = model.head.bias.detach()
        self._logits = torch.empty(max_batch, model.spec.outputs, dtype=self.dtype)
        self._sums = torch.empty(max_batch, 1, dtype=self.dtype)
        self._base = torch.empty(max_batch, dtype=torch.int64)
        self._flat = torch.empty(max_batch, dtype=torch.int64)
        self._latest = torch.empty(max_batch, f, dtype=torch.float32)

    def step(self, slots: torch.Tensor, positions: torch.Tensor, out: torch.Tensor) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Zero all recurrent / open-window state (nothing for stateless executors)."""

    def reset_slots(self, slots) -> None:
        """Zero the state of these slots (a Reset on the feed; nothing for stateless executors)."""

    def _head_into(self, h: torch.Tensor, out: torch.Tensor) -> None:
        n = h.shape[0]
        logits = torch.addmm(self._head_b, h, self._head_w.t(), out=self._logits[:n])
        scores_into(logits, out, self._sums[:n])

    def _latest_rows(self, slots: torch.Tensor, positions: torch.Tensor, n: int) -> torch.Tensor:
        """float32 [n, F]: each trigger's own row, ring[slot, position % R]."""
        flat = torch.remainder(positions, self.ring_len, out=self._flat[:n])
        flat.add_(torch.mul(slots, self.ring_len, out=self._base[:n]))
        return torch.index_select(self._ring_flat, 0, flat, out=self._latest[:n])

    def _check_batch(self, slots: torch.Tensor) -> int:
        n = slots.shape[0]
        if n > self.max_batch:  # cold branch: a sizing bug in the caller
            raise ValueError(f"batch of {n} exceeds max_batch {self.max_batch}")
        return n


class _WindowReader(Executor):
    """Shared gather of [n, W] ring rows per trigger."""

    def __init__(self, model: WindowModel, ring: torch.Tensor, max_batch: int) -> None:
        self.ring_rows = model.spec.window
        super().__init__(model, ring, max_batch)
        w = self.window
        self._idx = torch.empty(max_batch, w, dtype=torch.int64)
        self._mask = torch.empty(max_batch, w, dtype=torch.bool)
        self._rows = torch.empty(max_batch * w, self.width, dtype=torch.float32)

    def _gather(self, slots: torch.Tensor, n: int) -> torch.Tensor:
        """Rows at positions self._idx[:n] (absolute) of each slot -> float32 [n, W, F]."""
        idx = self._idx[:n]
        torch.remainder(idx, self.ring_len, out=idx)
        torch.mul(slots, self.ring_len, out=self._base[:n])
        idx.add_(self._base[:n, None])
        rows = torch.index_select(self._ring_flat, 0, idx.view(-1), out=self._rows[: n * self.window])
        return rows.view(n, self.window, self.width)


class MlpWindowExecutor(_WindowReader):
    """MLP window: rows t-W+1..t, oldest first; rows before the instrument's first are zero raw rows."""

    def __init__(self, model: WindowModel, ring: torch.Tensor, max_batch: int) -> None:
        super().__init__(model, ring, max_batch)
        self._offsets = torch.arange(-self.window + 1, 1, dtype=torch.int64)

    @torch.inference_mode()
    def step(self, slots: torch.Tensor, positions: torch.Tensor, out: torch.Tensor) -> None:
        n = self._check_batch(slots)
        idx = torch.add(positions[:, None], self._offsets, out=self._idx[:n])
        missing = torch.lt(idx, 0, out=self._mask[:n])
        rows = self._gather(slots, n)
        rows.masked_fill_(missing[:, :, None], 0.0)
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

    def __init__(self, model: WindowModel, ring: torch.Tensor, max_batch: int) -> None:
        super().__init__(model, ring, max_batch)
        self._steps = torch.arange(self.window, dtype=torch.int64)
        self._start = torch.empty(max_batch, dtype=torch.int64)
        self._last = torch.empty(max_batch, dtype=torch.int64)
        self._arange = torch.arange(max_batch, dtype=torch.int64)

    @torch.inference_mode()
    def step(self, slots: torch.Tensor, positions: torch.Tensor, out: torch.Tensor) -> None:
        n = self._check_batch(slots)
        start = torch.sub(positions, self.window - 1, out=self._start[:n]).clamp_(min=0)
        idx = torch.add(start[:, None], self._steps, out=self._idx[:n])
        torch.minimum(idx, positions[:, None], out=idx)
        last = torch.sub(positions, start, out=self._last[:n])
        rows = self._gather(slots, n)
        seq, _ = self.model.lstm(self.model.features(rows))
        self._head_into(seq[self._arange[:n], last], out)


class LstmStreamExecutor(Executor):
    """LSTM stream: one recurrent step per event from the slot's (h, c)."""

    stateful = True
    ring_rows = 1

    def __init__(self, model: LstmModel, ring: torch.Tensor, max_batch: int) -> None:
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
    def step(self, slots: torch.Tensor, positions: torch.Tensor, out: torch.Tensor) -> None:
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


def build_executor(model: WindowModel, ring: torch.Tensor, *, max_batch: int, mode: str = "window",
                   window_method: str = "incremental") -> Executor:
    """The CPU executor for a model and mode. MLPs are window models (mode 'window' only;
    `window_method` does not apply to them)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if window_method not in WINDOW_METHODS:
        raise ValueError(f"window_method must be one of {WINDOW_METHODS}, got {window_method!r}")
    kind = model.spec.kind
    if kind == "mlp":
        if mode != "window":
            raise ValueError(f"model {model.spec.name} is an mlp: mode 'stream' needs an lstm model")
        from hft_infer.models.cached import MlpCachedExecutor

        return MlpCachedExecutor(model, ring, max_batch)  # same numbers as MlpWindowExecutor, row features once
    if mode == "stream":
        return LstmStreamExecutor(model, ring, max_batch)
    if window_method == "recompute":
        return LstmRecomputeExecutor(model, ring, max_batch)
    from hft_infer.models.incremental import LstmIncrementalExecutor

    return LstmIncrementalExecutor(model, ring, max_batch)
