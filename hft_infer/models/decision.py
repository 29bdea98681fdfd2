"""Scores -> actions, vectorised over the batch, with per-slot memory for hysteresis.

action = +1 when score > threshold, -1 when score < -threshold; otherwise a
held long stays long while score >= threshold - hysteresis (a held short
while score <= -(threshold - hysteresis)), else 0. A fresh signal past the
opposite threshold always flips the position. With hysteresis 0 the policy
is stateless except at score == threshold exactly. Comparisons happen in the
scores' dtype (a float32 score is compared with float32(threshold)).
"""

from __future__ import annotations

import numpy as np
import torch


class DecisionPolicy:
    def __init__(self, threshold: float, hysteresis: float = 0.0, n_slots: int = 1, max_batch: int = 64) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        if not 0.0 <= hysteresis <= 1.0:
            raise ValueError(f"hysteresis must be in [0, 1], got {hysteresis}")
        if n_slots < 1:
            raise ValueError(f"n_slots must be >= 1, got {n_slots}")
        self.threshold = float(threshold)
        self.hysteresis = float(hysteresis)
        self.n_slots = n_slots
        self._held = torch.zeros(n_slots, dtype=torch.int8)
        self._held_np = self._held.numpy()  # same memory, for apply_numpy
        self._alloc(max_batch)

    def _alloc(self, n: int) -> None:
        self._cap = n
        self._prev = torch.empty(n, dtype=torch.int8)
        self._act = torch.empty(n, dtype=torch.int8)
        self._b = torch.empty(5, n, dtype=torch.bool)

    def reset(self) -> None:
        self._held.zero_()

    @property
    def held(self) -> torch.Tensor:
        """int8 [n_slots]: the last action per slot (read-only view for tests and snapshots)."""
        return self._held

    def apply_numpy(self, slots: np.ndarray, scores: np.ndarray, out_actions: np.ndarray) -> None:
        """`apply` on numpy arrays (the CPU engine's host buffers): same rule, same held state.
        A batch of a few entries costs ~10 numpy operations instead of ~15 torch ones."""
        dt = scores.dtype.type
        thr, stay = dt(self.threshold), dt(self.threshold - self.hysteresis)
        prev = self._held_np[slots]
        act = np.zeros(slots.shape[0], dtype=np.int8)
        act[(prev == 1) & (scores >= stay)] = 1
        act[(prev == -1) & (scores <= -stay)] = -1
        act[scores > thr] = 1  # a fresh signal beats a held position
        act[scores < -thr] = -1
        self._held_np[slots] = act
        out_actions[:] = act

    def apply(self, slots: torch.Tensor, scores: torch.Tensor, out_actions: torch.Tensor) -> None:
        """slots int64 [n], scores float [n] -> out_actions (int8 or int64) [n]; updates the held state.

        Slots must be distinct except a padding sink (whose state is then arbitrary)."""
        n = slots.shape[0]
        if n > self._cap:  # cold: a caller with a bigger batch than announced
            self._alloc(n)
        thr, stay = self.threshold, self.threshold - self.hysteresis
        prev = torch.index_select(self._held, 0, slots, out=self._prev[:n])
        up, down, hold_long, hold_short, was = (self._b[i, :n] for i in range(5))
        torch.gt(scores, thr, out=up)
        torch.lt(scores, -thr, out=down)
        torch.ge(scores, stay, out=hold_long)
        hold_long.logical_and_(torch.eq(prev, 1, out=was))
        torch.le(scores, -stay, out=hold_short)
        hold_short.logical_and_(torch.eq(prev, -1, out=was))
        act = self._act[:n].zero_()
        act.masked_fill_(hold_long, 1)
        act.masked_fill_(hold_short, -1)
        act.masked_fill_(up, 1)  # a fresh signal beats a held position
        act.masked_fill_(down, -1)
        self._held.index_copy_(0, slots, act)
        out_actions.copy_(act)
