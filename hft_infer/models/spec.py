"""Declared model configurations and the named presets.

A `ModelSpec` is all it takes to rebuild a model's modules; checkpoints carry
it in their header. Presets are sized like the STAC-ML Tacana models as
vendors publish them: LSTM_A 2 x 128, LSTM_B 3 x 256, LSTM_C about 200x
LSTM_A's parameters (4 x 1280: 46.1M vs 0.22M parameters), window 50 rows of
10-level books; `mlp_small` is sized for the CPU service at high event rates.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
import torch
from msgspec import Meta

from hft_infer.models.features import row_width

OUTPUTS = 3  # class order: 0 = down, 1 = flat, 2 = up


class ModelSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.-]{1,64}$")] = "custom"
    """Preset name, or a user's label; the first part of the version string."""
    kind: Literal["mlp", "lstm"]
    """mlp: flattened window -> hidden layers; lstm: stacked LSTM + linear head."""
    levels: Annotated[int, Meta(ge=1, le=64)] = 10
    """Book levels the model reads; raw rows are F = 4 * levels + 2 wide."""
    window: Annotated[int, Meta(ge=1, le=4096)]
    """W: rows per decision (window mode)."""
    hidden: tuple[Annotated[int, Meta(ge=1)], ...]
    """mlp: widths of the hidden layers; lstm: hidden size per layer (all equal)."""
    outputs: int = OUTPUTS
    """Logits: down, flat, up."""
    dtype: Literal["float32", "float64"] = "float32"
    """Parameter and compute dtype (float64 for reference checks)."""

    def __post_init__(self) -> None:
        if self.outputs != OUTPUTS:
            raise ValueError(f"outputs must be {OUTPUTS} (down, flat, up), got {self.outputs}")
        if not self.hidden:
            raise ValueError("hidden must name at least one layer")
        if self.kind == "lstm" and len(set(self.hidden)) != 1:
            raise ValueError(f"lstm layers must share one hidden size, got {list(self.hidden)}")

    @property
    def features(self) -> int:
        return row_width(self.levels)

    @property
    def layers(self) -> int:
        return len(self.hidden)

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.float64 if self.dtype == "float64" else torch.float32


PRESETS: dict[str, ModelSpec] = {
    "mlp_small": ModelSpec(name="mlp_small", kind="mlp", levels=10, window=32, hidden=(128, 64)),
    "lstm_a": ModelSpec(name="lstm_a", kind="lstm", levels=10, window=50, hidden=(128,) * 2),
    "lstm_b": ModelSpec(name="lstm_b", kind="lstm", levels=10, window=50, hidden=(256,) * 3),
    "lstm_c": ModelSpec(name="lstm_c", kind="lstm", levels=10, window=50, hidden=(1280,) * 4),
}


def preset(name: str) -> ModelSpec:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r} (known: {', '.join(PRESETS)})") from None
