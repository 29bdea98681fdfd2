"""Exact sliding-window LSTM without recomputing the window, in torch (the previous CPU default;
numpy_lstm.py has the numpy version the CPU engine runs).

With a zero state at every window's start, the windows that will end at rows
t, t+1, ..., t+W-1 are all *open* when row t arrives. Each slot keeps one
(h, c) per open window and layer, in a circular buffer indexed by the row
position at which that window started, mod W:

    at row t (per slot):
      1. advance all W open states by row t in one batched cell step; the input
         projection W_ih x_t of layer 1 is computed once and shared by the W states
         (layer l > 1 feeds each state its own layer l-1 output);
      2. emit the top-layer h at index e = (t + 1) mod W: the window that started
         at row t-W+1 has now seen exactly W rows. For t < W-1 that state has been
         zero since the slot's start, so it is the window over rows 0..t -- the
         shorter window the semantics ask for;
      3. zero index e in every layer: it becomes the fresh window starting at t+1.

Same result as recomputing the window (see tests/unit/test_models_window.py);
the sequential depth per event is the number of layers, not W x layers, and
the W states form one [n*W, H] x [H, 4H] matrix product per layer. The work is
the same as a recompute, so the gain comes from larger GEMMs and fewer steps.
"""

from __future__ import annotations

import torch

from hft_infer.models.lstm import LstmModel
from hft_infer.models.torch_executors import TorchExecutor, as_tensors, lstm_cell_


class LstmIncrementalExecutor(TorchExecutor):
    stateful = True
    ring_rows = 1

    def __init__(self, model: LstmModel, ring, max_batch: int) -> None:
        super().__init__(model, ring, max_batch)
        spec = model.spec
        w, hid, nl = spec.window, spec.hidden[0], spec.layers
        self._cells = [model.cell_weights(layer) for layer in range(nl)]
        # Open-window states of all layers in one tensor, [layer, h|c, slot, window index
        # (start position mod W), H]: one gather, one restart and one scatter per step for
        # every layer together (each torch op costs microseconds of dispatch), and h, c
        # contiguous for the GEMM and the elementwise cell.
        self._state = torch.zeros(nl, 2, self.n_slots, w, hid, dtype=self.dtype)
        self._scratch = torch.empty(nl * 2 * max_batch * w * hid, dtype=self.dtype)
        self._gates = torch.empty(max_batch * w, 4 * hid, dtype=self.dtype)
        self._xproj = torch.empty(max_batch, 4 * hid, dtype=self.dtype)
        self._emit = torch.empty(max_batch, hid, dtype=self.dtype)
        self._done = torch.empty(max_batch, dtype=torch.int64)
        self._row_base = torch.arange(max_batch, dtype=torch.int64) * w

    def reset(self) -> None:
        self._state.zero_()

    def reset_slots(self, slots) -> None:
        self._state[:, :, torch.as_tensor(slots, dtype=torch.int64)] = 0

    @torch.inference_mode()
    def step(self, slots, positions, out) -> None:
        slots, positions, out = as_tensors(slots, positions, out)
        n = self._check_batch(slots)
        nl, _, _, w, hid = self._state.shape
        x = self.model.features(self._latest_rows(slots, positions, n))
        # Contiguous [layer, h|c, n, W, H] for this batch size.
        st = torch.index_select(self._state, 2, slots,
                                out=self._scratch[: nl * 2 * n * w * hid].view(nl, 2, n, w, hid))
        gates = self._gates[: n * w]
        below = None
        for layer, (w_ih, w_hh, bias) in enumerate(self._cells):
            h, c = st[layer, 0].view(n * w, hid), st[layer, 1].view(n * w, hid)
            torch.mm(h, w_hh.t(), out=gates)
            if below is None:
                # Layer 1: one input projection per row, broadcast over the W open windows.
                xproj = torch.addmm(bias, x, w_ih.t(), out=self._xproj[:n])
                gates.view(n, w, 4 * hid).add_(xproj[:, None, :])
            else:
                gates.addmm_(below, w_ih.t()).add_(bias)
            lstm_cell_(gates, c, h)  # h_old was consumed by the mm above; h now holds h_new
            below = h
        # Emit the window that has now seen W rows (index (t+1) mod W), then restart it.
        done = torch.add(positions, 1, out=self._done[:n])
        done.remainder_(w).add_(self._row_base[:n])
        self._head_into(torch.index_select(below, 0, done, out=self._emit[:n]), out)
        st.view(nl * 2, n * w, hid).index_fill_(1, done, 0.0)
        self._state.index_copy_(2, slots, st)
