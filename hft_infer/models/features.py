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

import functools

import numpy as np
import torch

BPS = 1e4


def row_width(levels: int) -> int:
    return 4 * levels + 2


def trade_price_index(levels: int) -> int:
    return 4 * levels


def trade_size_index(levels: int) -> int:
    return 4 * levels + 1


def price_mask(levels: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Boolean mask over a row: True at price positions (bid/ask prices and the trade price).
    Cached per (levels, device): built once, never per step (and never inside a CUDA graph
    capture, where a host-to-device copy is not allowed)."""
    return _price_mask(levels, str(device))


@functools.lru_cache(maxsize=None)
def _price_mask(levels: int, device: str):
    m = np.zeros(row_width(levels), dtype=bool)
    m[0:4 * levels:4] = True
    m[2:4 * levels:4] = True
    m[4 * levels] = True
    return m if device == "numpy" else torch.from_numpy(m).to(device)


def preprocess(raw, levels: int):
    """Raw rows (..., F) -> features (..., F), in the dtype of `raw`. Pure, batched.

    One definition for torch tensors and numpy arrays (the same operations,
    from the array's own namespace): the CPU engine transforms a few new rows
    per step in numpy, where an operation costs ~1 us against ~5 us in torch
    on small arrays (tools/bench_hotpath.py); models and GPU references use torch.
    """
    f = row_width(levels)
    if raw.shape[-1] != f:
        raise ValueError(f"raw rows have width {raw.shape[-1]}, expected {f} for {levels} levels")
    if isinstance(raw, np.ndarray):
        xp, pmask = np, _price_mask(levels, "numpy")
    else:
        xp, pmask = torch, price_mask(levels, raw.device)
    mid = 0.5 * (raw[..., 0:1] + raw[..., 2:3])
    mid_ok = mid > 0
    safe_mid = xp.where(mid_ok, mid, xp.ones_like(mid))
    prices = xp.where((raw > 0) & mid_ok, (raw - safe_mid) / safe_mid * BPS, xp.zeros_like(raw))
    sizes = xp.log1p(xp.abs(raw)) * xp.sign(raw)  # sign() only matters for the trade size
    return xp.where(pmask, prices, sizes)


def normalise(features, mean, inv_std):
    return (features - mean) * inv_std
