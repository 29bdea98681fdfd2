"""The model step's shared math, defined once: row transform, score, decision policy.

Triton-free and project-free (numpy and torch only), so that the CPU models,
the CPU engine, the Triton kernels' references and the tests all import the
same definition. Every function takes numpy arrays or torch tensors and
computes in the array's own namespace and dtype; the Triton kernels
(`common._features`, `common._decide_store`) are the fused GPU versions and
are tested against these.

Row transform (raw float32 row of width F = 4L+2 -> features, same width):

    mid   = (row[0] + row[2]) / 2                     (level-0 bid and ask price)
    even positions (bid/ask prices, trade price):  (px - mid) / mid * 1e4
          where px > 0 and mid > 0, else 0
    odd positions (sizes, signed trade size):      sign(s) * log1p(|s|)
    normalised: (feature - mean) * inv_std

(For F = 4L+2 the price positions 4i, 4i+2 and 4L are exactly the even ones.)

Score: softmax(logits)[UP] - softmax(logits)[DOWN], in [-1, 1].

Decision (per slot, with memory for hysteresis):

    +1 if score > threshold, -1 if score < -threshold; otherwise a held +1 stays
    while score >= threshold - hysteresis, a held -1 while
    score <= -(threshold - hysteresis); else 0.
    A fresh signal past the opposite threshold always flips the position.
"""

from __future__ import annotations

import functools

import numpy as np

BPS = 1e4
DOWN, FLAT, UP = 0, 1, 2
"""Logit (and softmax) index of each class."""


def _namespace(x):
    if isinstance(x, np.ndarray):
        return np
    import torch

    return torch


def price_positions(width: int, like):
    """Boolean mask [width] (numpy or torch, on `like`'s device): True at the price positions
    (the even ones). Cached: built once per width and device, never per step (and never
    during a CUDA graph capture, where a host-to-device copy is not allowed)."""
    if isinstance(like, np.ndarray):
        return _mask(width, "numpy")
    return _mask(width, str(like.device))


@functools.lru_cache(maxsize=None)
def _mask(width: int, device: str):
    m = (np.arange(width) % 2) == 0
    if device == "numpy":
        return m
    import torch

    return torch.from_numpy(m).to(device)


# numpy arrays of at least this many elements take the column-split evaluation (below): the same
# formulas, each on the columns it applies to, log1p through torch's vectorised CPU loop. Under it
# the per-call cost of its extra calls wins (dev VM, `features`: 1 row 33 µs whole-row against 38
# split; 64 rows 80 -> 50 µs and 2,048 rows 1,072 -> 446 µs split).
SPLIT_MIN = 512


def preprocess(raw):
    """Raw rows (..., F) -> features (..., F), in raw's dtype. Pure and batched."""
    xp = _namespace(raw)
    if xp is np and raw.size >= SPLIT_MIN:
        return _preprocess_split(raw)
    prices = _prices(raw, raw, xp)
    sizes = xp.log1p(xp.abs(raw)) * xp.sign(raw)
    return xp.where(price_positions(raw.shape[-1], raw), prices, sizes)


def _prices(px, raw, xp):
    """The price formula on `px` (columns of `raw`'s rows): basis points from the row's level-0
    mid, 0 where the price or the mid is not positive. Both forms of `preprocess` use it."""
    mid = 0.5 * (raw[..., 0:1] + raw[..., 2:3])
    mid_ok = mid > 0
    safe = xp.where(mid_ok, mid, xp.ones_like(mid))
    return xp.where((px > 0) & mid_ok, (px - safe) / safe * BPS, xp.zeros_like(px))


def _preprocess_split(raw: np.ndarray) -> np.ndarray:
    """`preprocess` of a large numpy array with each formula evaluated only on its own columns:
    the price formula on the even ones, the size formula on the odd ones (the whole-row form
    computes both on every column and keeps one). log1p was numpy's costliest call here: ~10-13
    ns per element on the dev VM, as numpy calls libm's scalar log1pf per element; torch's CPU
    log1p (a vectorised loop, in place on a numpy buffer, no copy) costs ~2 ns. The two agree to
    1 ulp (torch's vector lanes differ from libm in the last bit for ~3 % of values; its scalar
    tail and numpy agree exactly), so the prices are bit for bit the whole-row form's and the
    sizes within 1 ulp (tests/unit/test_reference_split.py): far inside every tolerance the
    engines are held to (replay --verify's, the GPU kernels' 1e-5). The CPU engine's catch-up of
    conflated windows transforms up to W rows per trigger: this is most of its step under load."""
    import torch

    out = np.empty_like(raw)
    out[..., 0::2] = _prices(raw[..., 0::2], raw, np)
    sz = raw[..., 1::2]
    size = np.abs(sz)  # a new contiguous array: log1p in place on it
    torch.from_numpy(size).log1p_()
    np.multiply(size, np.sign(sz), out=out[..., 1::2])
    return out


def normalise(features, mean, inv_std):
    return (features - mean) * inv_std


def features(raw, mean, inv_std):
    """Raw rows -> normalised features: `normalise(preprocess(raw), mean, inv_std)`."""
    return normalise(preprocess(raw), mean, inv_std)


def scores(logits):
    """logits (..., 3) -> score (...) = softmax[UP] - softmax[DOWN] (max-shifted, no overflow)."""
    xp = _namespace(logits)
    if xp is np:
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return (e[..., UP] - e[..., DOWN]) / e.sum(axis=-1)
    e = (logits - logits.amax(dim=-1, keepdim=True)).exp()
    return (e[..., UP] - e[..., DOWN]) / e.sum(dim=-1)


def decide(score, held, threshold, hysteresis):
    """Actions (+1/0/-1, int8 like numpy / int64 for torch) for scores given the held positions.

    `threshold` and `hysteresis` are Python floats or 0-d arrays; comparisons happen in the
    score's dtype (a float32 score is compared with float32(threshold))."""
    xp = _namespace(score)
    if xp is np:
        dt = score.dtype.type
        thr, stay = dt(threshold), dt(threshold - hysteresis)
    else:
        thr, stay = threshold, threshold - hysteresis
        if not isinstance(thr, float):  # device tensors (the kernels' thresholds): the score's dtype
            thr, stay = thr.to(score.dtype), stay.to(score.dtype)
    keep_up = (held == 1) & (score >= stay)
    keep_dn = (held == -1) & (score <= -stay)
    if xp is np:
        act = np.zeros(score.shape, dtype=np.int8)
        act[keep_up] = 1
        act[keep_dn] = -1
        act[score > thr] = 1
        act[score < -thr] = -1
        return act
    one = xp.ones_like(score, dtype=xp.int64)
    zero = xp.zeros_like(one)
    return xp.where(score > thr, one, xp.where(score < -thr, -one, xp.where(
        keep_up, one, xp.where(keep_dn, -one, zero))))
