"""Feature rows: what the feature store holds and how the model reads it.

The hot loop copies the quote's packed book straight into a *raw* row (no
per-level Python work); everything derived is computed in the model step,
batched, on whatever device runs the model. This module is the single
definition of both layouts; the models, the Triton kernels and the synthetic
data pipeline all follow it.

Raw row (float32, width F = 4 * L + 2 for a model of L book levels):

    [4*i + 0]  bid price, level i        (0 where the quote had fewer levels)
    [4*i + 1]  bid size,  level i
    [4*i + 2]  ask price, level i
    [4*i + 3]  ask size,  level i
    [4*L]      trade price               (0 on quote rows)
    [4*L + 1]  signed trade size         (+size buyer-initiated, -size seller; 0 on quote rows)

A trade row repeats the instrument's last book (levels part) so that the
model always sees a book; a quote row has zero trade fields.

Features (same width), computed by `preprocess`:

    mid        = (bid_px_0 + ask_px_0) / 2
    price px   -> (px - mid) / mid * 1e4     basis points from mid; 0 where px <= 0 or mid <= 0
    size s     -> log1p(s)
    trade px   -> as a price
    trade size -> sign(s) * log1p(|s|)

then normalised per feature with constants from the checkpoint:
`x_norm = (x - mean) * inv_std` (fused into the first layer's weights by the
GPU kernels).
"""

from __future__ import annotations

from hft_infer.kernels.reference import BPS, normalise, preprocess as _preprocess

__all__ = ["BPS", "normalise", "preprocess", "row_width", "trade_price_index", "trade_size_index"]


def row_width(levels: int) -> int:
    return 4 * levels + 2


def trade_price_index(levels: int) -> int:
    return 4 * levels


def trade_size_index(levels: int) -> int:
    return 4 * levels + 1


def preprocess(raw, levels: int):
    """Raw rows (..., F) -> features (..., F), in the dtype of `raw` (numpy or torch):
    `hft_infer.kernels.reference.preprocess`, the one definition, with the width checked
    against the model's levels."""
    f = row_width(levels)
    if raw.shape[-1] != f:
        raise ValueError(f"raw rows have width {raw.shape[-1]}, expected {f} for {levels} levels")
    return _preprocess(raw)
