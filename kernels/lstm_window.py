"""Window-mode LSTM, exact and incremental: one launch per step (`persistent=True`).

Per slot and layer, W open-window states (h, c) in a circular buffer indexed by
the window's start position mod W, fp32 [n_slots, L, W, H]. For the event at
absolute row position t of slot s:

  1. advance all W states of every layer by the row: layer 1's input
     projection W_ih x_t is computed once and shared by the W states; layer k>1
     takes layer k-1's new h of the same window;
  2. emit the head output of the top-layer state at e = (t+1) mod W (the window
     that started at t-W+1 has now seen W rows; for t < W-1 that state has been
     zero since the slot's start, so it is the window over rows 0..t);
  3. zero index e in every layer (the fresh window starting at t+1).

Same result as recomputing torch.nn.LSTM over rows max(0, t-W+1)..t from zero
state. Every row of a slot must be applied once, in order: a slot's states are
all zero at its position 0 (zero h[s] and c[s] when an instrument restarts).
A batch holds distinct slots, except the padding sink.

Launch, grid and precision: see `lstm.py` (the kernel) and docs/notes/kernels.md.
"""

from __future__ import annotations

import torch

from hft_infer.kernels.common import decide_reference, features_reference
from hft_infer.kernels.lstm import (
    LstmParams,
    LstmWeights,
    LstmWorkspace,
    alloc_lstm_workspace,
    launch_lstm,
    prepare_lstm_weights,
)
from hft_infer.kernels.ring import ring_scatter_reference

__all__ = ["LstmParams", "alloc_window_state", "alloc_window_workspace", "lstm_window_step",
           "lstm_window_reference", "lstm_recompute_logits_reference", "prepare_lstm_weights"]


def alloc_window_state(w: LstmWeights, n_slots: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, c): zeros, fp32 [n_slots, L, W, H] on the weights' device."""
    shape = (n_slots, w.layers, window, w.hidden)
    dev = w.wh.device
    return torch.zeros(shape, dtype=torch.float32, device=dev), torch.zeros(shape, dtype=torch.float32, device=dev)


def alloc_window_workspace(w: LstmWeights, max_batch: int, window: int, *,
                           max_programs: int | None = None) -> LstmWorkspace:
    """Scratch for steps of up to max_batch entries; max_programs caps the grid (default:
    the GPU's multiprocessor count; a persistent launch needs them all resident)."""
    return alloc_lstm_workspace(w, max_batch, window, max_programs=max_programs)


def lstm_window_step(w: LstmWeights, ws: LstmWorkspace, h: torch.Tensor, c: torch.Tensor,
                     rows: torch.Tensor | None, slots: torch.Tensor, positions: torch.Tensor,
                     thresholds: torch.Tensor, held: torch.Tensor, out: torch.Tensor, *,
                     ring: torch.Tensor | None = None, ring_h: torch.Tensor | None = None,
                     persistent: bool = True, num_warps: int = 4, block_m: int | None = None) -> None:
    """One window-mode step: rows float32 [n, F] (the new raw rows), slots and positions [n]
    (int32/int64), thresholds float32 [2], held int8/int32 [n_slots]; h, c updated in place;
    out float32 [n, OUT_COLS]. With `ring` the rows are also written into it (fused scatter).

    ring_h (rows=None): read each entry's new row at ring_h[slot, position mod RH] instead,
    e.g. the pinned host feature ring [n_slots + 1, depth, F] through its UVA mapping; slots,
    positions and out may be pinned host tensors as well (volatile loads). The graph engine
    does not read host memory this way: ~one PCIe read at a time on the H200 host, it stages
    the rows instead (runner/staging.py).

    persistent=True: one launch, grid barrier between layers (needs all its programs
    resident at once: see alloc_lstm_workspace). False: L+1 launches. block_m: rows
    (entry, open window) per tile, a power of two >= 16 (default: the smallest of
    16/32/64 that still gives every allowed program a tile). No allocation,
    no host sync: safe to capture in a CUDA graph."""
    launch_lstm(w, ws, h, c, rows, slots, positions, thresholds, held, out, ring,
                window=True, persistent=persistent, num_warps=num_warps, block_m=block_m, ring_h=ring_h)


def _cell(gates: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    i, f, g, o = gates.chunk(4, dim=-1)
    c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c_new), c_new


def lstm_window_reference(params: LstmParams, h: torch.Tensor, c: torch.Tensor, rows: torch.Tensor,
                          slots: torch.Tensor, positions: torch.Tensor, thresholds: torch.Tensor,
                          held: torch.Tensor, out: torch.Tensor, *, ring: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as `lstm_window_step`, in plain torch, computing in the params' dtype
    (h and c must have that dtype too)."""
    if ring is not None:
        ring_scatter_reference(ring, rows, slots, positions)
    n, window = rows.shape[0], h.shape[2]
    sl = slots.long()
    x = features_reference(rows.to(params.mean.dtype), params.mean, params.inv_std)
    e = torch.remainder(positions.long() + 1, window)
    keep = (torch.arange(window, device=h.device)[None, :] != e[:, None])[:, :, None]
    below = None
    for k in range(params.layers):
        hk, ck = h[sl, k], c[sl, k]  # [n, W, H]
        rec = hk @ params.weight_hh[k].t() + params.bias_hh[k]
        if k == 0:
            gates = (x @ params.weight_ih[0].t() + params.bias_ih[0])[:, None, :] + rec
        else:
            gates = below @ params.weight_ih[k].t() + params.bias_ih[k] + rec
        h_new, c_new = _cell(gates, ck)
        below = h_new
        h[sl, k] = torch.where(keep, h_new, torch.zeros_like(h_new))
        c[sl, k] = torch.where(keep, c_new, torch.zeros_like(c_new))
    emit = below[torch.arange(n, device=h.device), e]
    logits = emit @ params.head_weight.t() + params.head_bias
    return decide_reference(logits, thresholds, held, slots, out)


def lstm_recompute_logits_reference(params: LstmParams, raw: torch.Tensor) -> torch.Tensor:
    """Recompute: raw rows [T, F] (a window, oldest first) from zero state -> logits [3]."""
    x = features_reference(raw.to(params.mean.dtype), params.mean, params.inv_std)
    hid = params.hidden
    hs = [x.new_zeros(hid) for _ in range(params.layers)]
    cs = [x.new_zeros(hid) for _ in range(params.layers)]
    for t in range(x.shape[0]):
        inp = x[t]
        for k in range(params.layers):
            gates = (params.weight_ih[k] @ inp + params.bias_ih[k] + params.weight_hh[k] @ hs[k]
                     + params.bias_hh[k])
            hs[k], cs[k] = _cell(gates, cs[k])
            inp = hs[k]
    return params.head_weight @ hs[-1] + params.head_bias
