"""`lstm`: stacked `torch.nn.LSTM` (gate order i, f, g, o; b_ih + b_hh) + linear head
on the top layer's h.

`window` mode: each decision runs the LSTM from a zero state over the last W
rows (fewer at an instrument's start: rows 0..t). `stream` mode: one step per
event from per-instrument (h, c). The executors (`numpy_lstm.py`,
`torch_executors.py`, `incremental.py`) read this module's parameters directly.
"""

from __future__ import annotations

import torch
from torch import nn

from hft_infer.models.base import WindowModel, scores_from_logits
from hft_infer.models.spec import ModelSpec


class LstmModel(WindowModel):
    def __init__(self, spec: ModelSpec) -> None:
        if spec.kind != "lstm":
            raise ValueError(f"LstmModel needs kind 'lstm', got {spec.kind!r}")
        super().__init__(spec)
        dt = spec.torch_dtype
        self.lstm = nn.LSTM(spec.features, spec.hidden[0], num_layers=spec.layers, batch_first=True, dtype=dt)
        self.head = nn.Linear(spec.hidden[0], spec.outputs, dtype=dt)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x: normalised features [B, T, F] with 1 <= T <= W; zero initial state."""
        if not 1 <= x.shape[-2] <= self.spec.window:
            raise ValueError(f"lstm window holds 1..{self.spec.window} rows, got {x.shape[-2]}")
        out, _ = self.lstm(x)
        return self.head(out[:, -1])

    def cell_weights(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(W_ih [4H, in], W_hh [4H, H], b_ih + b_hh [4H]) of one layer, gate rows reordered
        from nn.LSTM's (i, f, g, o) to (i, f, o, g): the three sigmoid gates are then one
        contiguous block (see numpy_lstm and torch_executors.lstm_cell_). A copy: the executors own it."""
        lstm = self.lstm
        hid = self.spec.hidden[0]
        order = torch.cat([torch.arange(0, 2 * hid), torch.arange(3 * hid, 4 * hid), torch.arange(2 * hid, 3 * hid)])
        w_ih = getattr(lstm, f"weight_ih_l{layer}").detach()[order].contiguous()
        w_hh = getattr(lstm, f"weight_hh_l{layer}").detach()[order].contiguous()
        bias = (getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}")).detach()[order]
        return w_ih, w_hh, bias

    def forward_stream(self, raw: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None
                       ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Reference for `stream` mode: raw rows [B, T, F] from `state` (zero if None) ->
        (scores after every row [B, T], final (h, c) [layers, B, H])."""
        out, state = self.lstm(self.features(raw), state)
        return scores_from_logits(self.head(out)), state
