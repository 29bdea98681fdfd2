"""Stream-mode LSTM: one recurrent step per event for a batch of instruments.

State per slot: h, c fp32 [n_slots, L, H], read and written in place. The
kernel is the window-mode kernel's (`lstm.py`) with one state per slot and no
restart: each batch entry is a row of the [M, K] x [K, 4*BH] gate products.
A batch holds distinct slots (except the padding sink); a slot's events are
applied in order, one per step.
"""

from __future__ import annotations

import torch

from hft_infer.kernels.common import decide_reference, features_reference
from hft_infer.kernels.lstm import LstmParams, LstmWeights, LstmWorkspace, alloc_lstm_workspace, launch_lstm
from hft_infer.kernels.lstm_window import _cell
from hft_infer.kernels.ring import ring_scatter_reference

__all__ = ["alloc_stream_state", "alloc_stream_workspace", "lstm_stream_step", "lstm_stream_reference"]


def alloc_stream_state(w: LstmWeights, n_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, c): zeros, fp32 [n_slots, L, H] on the weights' device."""
    shape = (n_slots, w.layers, w.hidden)
    dev = w.wh.device
    return torch.zeros(shape, dtype=torch.float32, device=dev), torch.zeros(shape, dtype=torch.float32, device=dev)


def alloc_stream_workspace(w: LstmWeights, max_batch: int, *, max_programs: int | None = None) -> LstmWorkspace:
    return alloc_lstm_workspace(w, max_batch, 1, max_programs=max_programs)


def lstm_stream_step(w: LstmWeights, ws: LstmWorkspace, h: torch.Tensor, c: torch.Tensor,
                     rows: torch.Tensor | None, slots: torch.Tensor, thresholds: torch.Tensor, held: torch.Tensor,
                     out: torch.Tensor, *, positions: torch.Tensor | None = None, ring: torch.Tensor | None = None,
                     ring_h: torch.Tensor | None = None, persistent: bool = True, num_warps: int = 4,
                     block_m: int | None = None) -> None:
    """One stream step: rows float32 [n, F], slots [n]; h, c updated in place; out float32
    [n, OUT_COLS]. With `ring` (and `positions`) the rows are also written into the ring.
    ring_h (rows=None, positions given): each entry's row read at ring_h[slot, position mod RH]
    (the pinned host feature ring; slots, positions and out may be pinned too), as in
    `lstm_window_step`."""
    if (ring is not None or ring_h is not None) and positions is None:
        raise ValueError("writing the ring or reading ring_h needs the rows' positions")
    launch_lstm(w, ws, h, c, rows, slots, positions if positions is not None else slots, thresholds, held, out,
                ring, window=False, persistent=persistent, num_warps=num_warps, block_m=block_m, ring_h=ring_h)


def lstm_stream_reference(params: LstmParams, h: torch.Tensor, c: torch.Tensor, rows: torch.Tensor,
                          slots: torch.Tensor, thresholds: torch.Tensor, held: torch.Tensor, out: torch.Tensor, *,
                          positions: torch.Tensor | None = None, ring: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as `lstm_stream_step`, in plain torch, in the params' dtype."""
    if ring is not None:
        ring_scatter_reference(ring, rows, slots, positions)
    sl = slots.long()
    inp = features_reference(rows.to(params.mean.dtype), params.mean, params.inv_std)
    for k in range(params.layers):
        gates = (inp @ params.weight_ih[k].t() + params.bias_ih[k] + h[sl, k] @ params.weight_hh[k].t()
                 + params.bias_hh[k])
        h_new, c_new = _cell(gates, c[sl, k])
        h[sl, k] = h_new
        c[sl, k] = c_new
        inp = h_new
    logits = inp @ params.head_weight.t() + params.head_bias
    return decide_reference(logits, thresholds, held, slots, out)
