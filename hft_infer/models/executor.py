"""The executor contract: one model step over a batch of (slot, position) triggers.

An executor is bound at build to the feature store's raw-row ring, float32
[n_slots, R, F] (a torch CPU tensor or a numpy array: both views of the same
memory are kept); the row at absolute position p of slot s lives at
ring[s, p % R]. The last slot is the engine's padding sink.

    step(slots, positions, out)   numpy int64 [n], int64 [n], float [n] scores (any float dtype)
                                  slots < n_slots, not checked per step: the numpy executors
                                  gather with take(mode="clip"), as numpy's checked mode
                                  buffers the output (an allocation of its size per call)
    reset()                       zero every slot's model state
    reset_slots(slots)            zero exactly these slots' state (a Reset on the feed)

Window semantics (the GPU kernels follow the same): the decision for row t
sees rows max(0, t-W+1)..t. LSTM: zero state at the window start (so for
t < W-1 the window is rows 0..t). MLP: missing rows are all-zero *raw* rows,
oldest row first.

`stateful` executors keep per-slot recurrent state: rows must be applied in
order, at most one per slot per step (the padding sink may repeat; its state
is then arbitrary). Stateless ones read their window from the ring, so the
scheduler may conflate triggers.

Implementations (`build.build_executor` picks one):
- numpy (the CPU engine's default; `numpy_mlp.py`, `numpy_lstm.py`): the
  step's cost is its arithmetic plus about a microsecond per numpy call on
  preallocated buffers;
- torch (`torch_executors.py`, `cached.py`, `incremental.py`): the previous
  CPU path, kept as the comparison in tools/bench_models_cpu.py and as a
  second implementation the tests cross-check; `LstmRecomputeExecutor`
  (nn.LSTM over each window) is also the window-mode reference.

This module imports no executor, so the executor modules import it and
`build.py` imports them: no cycle.
"""

from __future__ import annotations

import numpy as np

from hft_infer.models.base import WindowModel


def ring_views(ring):
    """(numpy view, torch view) of a float32 [n_slots, R, F] ring given either (same memory)."""
    import torch

    if isinstance(ring, np.ndarray):
        if ring.dtype != np.float32 or ring.ndim != 3 or not ring.flags.c_contiguous:
            raise ValueError(f"ring must be C-contiguous float32 [n_slots, R, F], got {ring.dtype} {ring.shape}")
        return ring, torch.from_numpy(ring)
    if ring.dim() != 3 or ring.dtype != torch.float32 or ring.device.type != "cpu" or not ring.is_contiguous():
        raise ValueError(f"ring must be float32 [n_slots, R, F], got {ring.dtype} {tuple(ring.shape)}")
    return ring.numpy(), ring


class Executor:
    """Runs one model step over a batch of (slot, position) triggers (see the module docstring)."""

    stateful: bool = False
    """True: rows must be applied in order, at most one per slot per step (distinct slots,
    except the padding sink). False: the window is read from the ring; triggers may be conflated."""
    window: int
    """W: rows per decision of the model (the window semantics)."""
    ring_rows: int
    """Most recent rows per slot that must still be in the ring when a step runs."""
    backend: str = ""
    """'numpy' or 'torch': what the step computes with."""

    def __init__(self, model: WindowModel, ring, max_batch: int) -> None:
        ring_np, ring_t = ring_views(ring)
        n_slots, r, f = ring_np.shape
        if f != model.spec.features:
            raise ValueError(f"ring rows are {f} wide, the model reads {model.spec.features} "
                             f"({model.spec.levels} levels)")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if r < self.ring_rows:
            raise ValueError(f"ring holds {r} rows per slot, this executor needs >= {self.ring_rows}")
        self.model = model
        self.ring, self.ring_np = ring_t, ring_np
        self.n_slots, self.ring_len, self.width = n_slots, r, f
        self.max_batch = max_batch
        self.window = model.spec.window
        self.levels = model.spec.levels
        self.dtype = model.spec.torch_dtype
        self.np_dtype = np.dtype(model.spec.dtype)

    def step(self, slots: np.ndarray, positions: np.ndarray, out: np.ndarray) -> None:
        raise NotImplementedError

    def prepare(self, batch_sizes) -> None:
        """Make what a step of each of these batch sizes needs before the first such step (the
        eager engine calls it with its buckets at start-up, so no step pays for it). Nothing
        here; the numpy executors make their plans (products.py times their products)."""

    def describe(self) -> str:
        """One line for the engine's reason: how the step computes (empty: nothing to add)."""
        return ""

    def reset(self) -> None:
        """Zero all recurrent / open-window state (nothing for stateless executors)."""

    def reset_slots(self, slots) -> None:
        """Zero the state of these slots (a Reset on the feed; nothing for stateless executors)."""

    def _check_batch(self, slots) -> int:
        n = slots.shape[0]
        if n > self.max_batch:  # cold branch: a sizing bug in the caller
            raise ValueError(f"batch of {n} exceeds max_batch {self.max_batch}")
        return n
