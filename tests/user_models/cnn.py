"""An example user model for `model.module`: a small 1-D CNN over the window of feature rows.

    model.module = "tests/user_models/cnn.py:make_model"      (path from the repo root)

Input float32 [B, W, F] (F = 42: 10-level built-in feature rows, oldest first), output [B, 3]
logits (down, flat, up). Seeded weights, so every process builds the same model.
"""

from __future__ import annotations

import torch
from torch import nn


class WindowCnn(nn.Module):
    def __init__(self, features: int = 42, channels: int = 16, kernel: int = 5) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((features,), 0.05))  # bps features are O(10): bring them to O(1)
        self.conv1 = nn.Conv1d(features, channels, kernel, padding=kernel // 2)
        self.conv2 = nn.Conv1d(channels, channels, kernel, padding=kernel // 2)
        self.head = nn.Linear(2 * channels, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = (x * self.scale).transpose(1, 2)  # [B, F, W]
        h = torch.relu(self.conv1(h))
        h = torch.relu(self.conv2(h))
        return self.head(torch.cat([h.mean(dim=2), h[:, :, -1]], dim=1))  # window mean and the newest step


class WindowGru(nn.Module):
    def __init__(self, features: int = 42, hidden: int = 24) -> None:
        super().__init__()
        self.gru = nn.GRU(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x * 0.05)
        return self.head(out[:, -1])


def make_model(seed: int = 3, channels: int = 16) -> nn.Module:
    gen = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return WindowCnn(channels=channels)
    finally:
        torch.random.set_rng_state(gen)


def make_gru(seed: int = 4) -> nn.Module:
    gen = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return WindowGru()
    finally:
        torch.random.set_rng_state(gen)


def make_wrong_shape() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.LazyLinear(2))


def make_not_a_module():
    return "not a module"


class _FailsOnBigBatches(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 3:
            raise RuntimeError("this model breaks on batches of more than 3")
        return torch.zeros(x.shape[0], 3)


def make_fails_later() -> nn.Module:
    """Passes the start-up check (batches 1 and 3), fails on a batch of 4: for tests."""
    return _FailsOnBigBatches()
