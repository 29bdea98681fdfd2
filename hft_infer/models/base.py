"""What every model shares: feature normalisation, the score, the window contract.

Pipeline: raw rows -> `features.preprocess` -> `(x - mean) * inv_std` (constants
from the checkpoint; identity for a random init) -> body -> 3 logits ->
score = softmax[up] - softmax[down], in [-1, 1].
"""

from __future__ import annotations

import torch
from torch import nn

from hft_infer.kernels.reference import DOWN, FLAT, UP, scores
from hft_infer.models.features import normalise, preprocess
from hft_infer.models.spec import ModelSpec

__all__ = ["DOWN", "FLAT", "UP", "WindowModel", "scores_from_logits", "scores_into"]


def scores_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """softmax[UP] - softmax[DOWN]: `hft_infer.kernels.reference.scores`."""
    return scores(logits)


def scores_into(logits: torch.Tensor, out: torch.Tensor, sums: torch.Tensor) -> None:
    """`reference.scores` without allocation (tested against it): overwrites `logits` [n, 3] with exp(l - max);
    `sums` is scratch [n, 1] in the logits' dtype; writes the scores into `out` [n] (any float dtype)."""
    torch.amax(logits, dim=1, keepdim=True, out=sums)
    logits.sub_(sums).exp_()
    torch.sum(logits, dim=1, keepdim=True, out=sums)
    logits.div_(sums)
    torch.sub(logits[:, UP], logits[:, DOWN], out=sums[:, 0])
    out.copy_(sums[:, 0])


class WindowModel(nn.Module):
    """Base of the model family; subclasses define `logits(x)` over normalised features."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        f, dt = spec.features, spec.torch_dtype
        # Not in state_dict: checkpoints carry them in the typed header.
        self.register_buffer("norm_mean", torch.zeros(f, dtype=dt), persistent=False)
        self.register_buffer("norm_inv_std", torch.ones(f, dtype=dt), persistent=False)

    def set_normalisation(self, mean: torch.Tensor, inv_std: torch.Tensor) -> None:
        f = self.spec.features
        if mean.shape != (f,) or inv_std.shape != (f,):
            raise ValueError(f"normalisation constants must have shape ({f},)")
        self.norm_mean.copy_(mean)
        self.norm_inv_std.copy_(inv_std)

    def features(self, raw: torch.Tensor) -> torch.Tensor:
        """Raw rows (..., F), any float dtype -> normalised features in the model's dtype."""
        x = preprocess(raw.to(self.spec.torch_dtype), self.spec.levels)
        return normalise(x, self.norm_mean, self.norm_inv_std)

    def logits(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward_window(self, raw: torch.Tensor) -> torch.Tensor:
        """Recompute reference: raw windows [B, T, F], oldest row first -> scores [B]."""
        return scores_from_logits(self.logits(self.features(raw)))

    def forward(self, raw: torch.Tensor) -> torch.Tensor:
        return self.forward_window(raw)
