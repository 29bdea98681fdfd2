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
import math

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

# numpy arrays of at most this many elements take the scalar evaluation (below): one or two rows,
# the size the CPU engine transforms per step at batch 1. The whole-row form is ~18 numpy calls
# whatever the size (~19-21 µs for 1-4 rows on the dev VM); the scalar one costs ~7-9 µs a row of 42.
SCALAR_MAX = 96


def preprocess(raw):
    """Raw rows (..., F) -> features (..., F), in raw's dtype. Pure and batched."""
    xp = _namespace(raw)
    if xp is np:
        if raw.size <= SCALAR_MAX:
            return _preprocess_scalar(raw)
        if raw.size >= SPLIT_MIN:
            return _preprocess_split(raw)
    return _preprocess_rows(raw, xp)


def _preprocess_rows(raw, xp):
    """The whole-row form: both formulas on every column, the price positions' kept."""
    prices = _prices(raw, raw, xp)
    sizes = xp.log1p(xp.abs(raw)) * xp.sign(raw)
    return xp.where(price_positions(raw.shape[-1], raw), prices, sizes)


def _prices(px, raw, xp):
    """The price formula on `px` (columns of `raw`'s rows): basis points from the row's level-0
    mid, 0 where the price or the mid is not positive. The whole-row and split forms use it.
    numpy runs the same operations in place on the one new array (bit for bit the expression's:
    a strided `px` is read once, and no temporary per operation)."""
    mid = 0.5 * (raw[..., 0:1] + raw[..., 2:3])
    mid_ok = mid > 0
    safe = xp.where(mid_ok, mid, xp.ones_like(mid))
    if xp is np:
        bps = px - safe
        bps /= safe
        bps *= BPS
        drop = px > 0  # kept where the price and the mid are positive (NaN: not), zeroed elsewhere
        drop &= mid_ok
        np.logical_not(drop, out=drop)
        np.copyto(bps, 0.0, where=drop)
        return bps
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


def _preprocess_scalar(raw: np.ndarray, _log1p=math.log1p, _copysign=math.copysign) -> np.ndarray:
    """`preprocess` of a small numpy array (a row or two) on Python floats: the array form is ~18
    numpy calls of ~1 µs each whatever the size, this one ~0.2 µs per element. The mid is
    computed in raw's dtype (numpy scalars), as the array forms do; each feature is then computed
    in double and rounded once to raw's dtype, where the float32 array forms round after every
    operation: prices within 2 ulp of the whole-row form (the price difference is exact in double;
    float32 rounds the division and the scaling each), sizes within 1 ulp (a correctly rounded
    log1p against libm's log1pf), NaN, inf and signs alike (tests/unit/test_reference_split.py).
    For float64 rows every operation is the array form's own (IEEE double): bit for bit.
    (The math functions are bound as defaults: a local lookup, ~1 µs less a row than math.x.)"""
    rows = raw.reshape(-1, raw.shape[-1])
    half = raw.dtype.type(0.5)
    out: list[float] = []
    push = out.append
    for row, bid, ask in zip(rows.tolist(), rows[:, 0], rows[:, 2]):
        mid = float((bid + ask) * half)
        pairs = iter(row)  # (price, size) pairs: F = 4L + 2 is even
        if mid > 0:  # the mid's test hoisted out of the loop: one branch per row, not per price
            for px in pairs:
                size = next(pairs)
                push((px - mid) / mid * BPS if px > 0 else 0.0)
                push(_copysign(_log1p(abs(size)), size) if size else 0.0)  # sign(-0.0) * 0 is +0.0
        else:
            for _ in pairs:
                size = next(pairs)
                push(0.0)
                push(_copysign(_log1p(abs(size)), size) if size else 0.0)
    return np.array(out, dtype=raw.dtype).reshape(raw.shape)


def normalise(features, mean, inv_std):
    return (features - mean) * inv_std


def features(raw, mean, inv_std):
    """Raw rows -> normalised features: `normalise(preprocess(raw), mean, inv_std)`. A numpy
    result is normalised in place (`preprocess` returns a new array; the same two operations in
    the same dtype, so bit for bit `normalise`'s) where the dtypes and shapes allow it."""
    x = preprocess(raw)
    if (type(x) is np.ndarray and type(mean) is np.ndarray and type(inv_std) is np.ndarray
            and mean.dtype == x.dtype == inv_std.dtype and mean.ndim == inv_std.ndim == 1
            and mean.shape[0] == inv_std.shape[0] == x.shape[-1]):
        x -= mean
        x *= inv_std
        return x
    return normalise(x, mean, inv_std)


# numpy scores and decisions of at most this many rows take the scalar form (Python floats): the
# array forms are ~7 and ~10 numpy calls (~6 and ~8 µs on the dev VM) whatever the size, the
# scalar ones ~1.5 µs plus ~0.3 µs a row.
SCALAR_ROWS = 8


def scores(logits):
    """logits (..., 3) -> score (...) = softmax[UP] - softmax[DOWN] (max-shifted, no overflow)."""
    xp = _namespace(logits)
    if xp is np:
        if logits.size <= 3 * SCALAR_ROWS:
            return _scores_scalar(logits)
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return (e[..., UP] - e[..., DOWN]) / e.sum(axis=-1)
    e = (logits - logits.amax(dim=-1, keepdim=True)).exp()
    return (e[..., UP] - e[..., DOWN]) / e.sum(dim=-1)


def _scores_scalar(logits: np.ndarray) -> np.ndarray:
    """`scores` of a few numpy rows on Python floats, rounded once to the logits' dtype (the
    float32 array form rounds after each operation: within 2e-7 absolute of it, tested)."""
    out = []
    for row in logits.reshape(-1, 3).tolist():
        top = max(row)
        down, flat, up = math.exp(row[DOWN] - top), math.exp(row[FLAT] - top), math.exp(row[UP] - top)
        out.append((up - down) / (down + flat + up))
    return np.array(out, dtype=logits.dtype).reshape(logits.shape[:-1])


def decide_one(score: float, held: int, thr: float, stay: float) -> int:
    """The rule for one score (a Python float) given the held position: `thr` and `stay` are
    the threshold and threshold - hysteresis in the score's dtype (`thresholds_in`). The array
    forms of `decide` are tested against it."""
    if score > thr:
        return 1
    if score < -thr:
        return -1
    if held == 1 and score >= stay:
        return 1
    if held == -1 and score <= -stay:
        return -1
    return 0


def thresholds_in(dtype, threshold: float, hysteresis: float) -> tuple[float, float]:
    """(threshold, threshold - hysteresis) rounded to a numpy float dtype, as Python floats:
    comparing a score of that dtype with them (exactly, in double; or an array of it, which numpy
    does in its own dtype, into which they convert exactly) is comparing in its dtype. `threshold`
    and `hysteresis` may be 0-d arrays."""
    dt = np.dtype(dtype).type
    return float(dt(threshold)), float(dt(threshold - hysteresis))


def decide(score, held, threshold, hysteresis):
    """Actions (+1/0/-1, int8 like numpy / int64 for torch) for scores given the held positions.

    `threshold` and `hysteresis` are Python floats or 0-d arrays; comparisons happen in the
    score's dtype (a float32 score is compared with float32(threshold))."""
    xp = _namespace(score)
    if xp is np:
        thr, stay = thresholds_in(score.dtype, threshold, hysteresis)
        if score.size <= SCALAR_ROWS and isinstance(held, np.ndarray) and held.shape == score.shape:
            act = [decide_one(s, h, thr, stay) for s, h in zip(score.reshape(-1).tolist(), held.reshape(-1).tolist())]
            return np.array(act, dtype=np.int8).reshape(score.shape)
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
