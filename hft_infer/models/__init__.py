"""Model family (mlp, lstm), executors, decision policy and checkpoints.

`build_model(spec, seed)` builds a seeded random model; `custom.load_configured`
(a config's `[model]`: `checkpoint.load_model`, or a user's module through
`custom.load_custom`) is what the service calls; `training` trains the
built-in families (`hft-infer train`).
"""

from __future__ import annotations

import torch

from hft_infer.models.base import WindowModel
from hft_infer.models.spec import PRESETS, ModelSpec, preset


def build_model(spec: ModelSpec, seed: int = 0) -> WindowModel:
    """A model with seeded random weights and identity normalisation, in eval mode."""
    from hft_infer.models.lstm import LstmModel
    from hft_infer.models.mlp import MlpModel

    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = MlpModel(spec) if spec.kind == "mlp" else LstmModel(spec)
    finally:
        torch.random.set_rng_state(gen_state)  # building a model must not disturb the caller's RNG
    return model.eval()


__all__ = ["PRESETS", "ModelSpec", "WindowModel", "build_model", "preset"]
