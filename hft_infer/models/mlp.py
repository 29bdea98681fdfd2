"""`mlp`: the flattened window -> ReLU hidden layers -> linear head to 3 logits."""

from __future__ import annotations

import torch
from torch import nn

from hft_infer.models.base import WindowModel
from hft_infer.models.spec import ModelSpec


class MlpModel(WindowModel):
    def __init__(self, spec: ModelSpec) -> None:
        if spec.kind != "mlp":
            raise ValueError(f"MlpModel needs kind 'mlp', got {spec.kind!r}")
        super().__init__(spec)
        widths = [spec.window * spec.features, *spec.hidden]
        dt = spec.torch_dtype
        self.layers = nn.ModuleList(nn.Linear(a, b, dtype=dt) for a, b in zip(widths, widths[1:]))
        self.head = nn.Linear(widths[-1], spec.outputs, dtype=dt)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x: normalised features [B, W, F] (missing rows are zero *raw* rows, preprocessed)."""
        if x.shape[-2] != self.spec.window:
            raise ValueError(f"mlp window is {self.spec.window} rows, got {x.shape[-2]}")
        h = x.reshape(x.shape[0], -1)
        for layer in self.layers:
            h = torch.relu(layer(h))
        return self.head(h)
