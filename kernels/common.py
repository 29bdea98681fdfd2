"""Pieces every model kernel shares: the row transform, the decision, the grid
barrier, the matrix-product precision switch, and their plain-torch references.

Row transform (raw float32 row of width F = 4L+2 -> normalised features; the
same definition as the CPU models'):

    mid   = (row[0] + row[2]) / 2
    even positions (bid/ask prices, trade price): (px - mid) / mid * 1e4 where
          px > 0 and mid > 0, else 0
    odd positions (sizes, signed trade size): sign(s) * log1p(|s|)
    x     = (feature - mean) * inv_std

(For F = 4L+2 the price positions 4i, 4i+2 and 4L are exactly the even ones.)
The kernels apply the transform in registers right before the first layer's
product, so the first layer reads raw rows straight from the ring or the
staged batch. Normalising before the product (rather than folding mean and
inv_std into W1 and b1) keeps the bf16 variant accurate: the bps features have
means far from zero, and a folded bias would cancel a large product.

Decision (one row per batch entry, float32 `out[n, OUT_COLS]`):

    out[:, 0] score  = softmax(logits)[2] - softmax(logits)[0]     (up - down)
    out[:, 1] action = +1 / 0 / -1 (as float), see `decide_reference`; the
              per-slot held position (hysteresis) is updated in place
    out[:, 2:5] the three logits (down, flat, up), for error checks

Thresholds live on the device (`thresholds` float32 [2] = threshold,
hysteresis) so a captured CUDA graph picks up a new value without recapture.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from hft_infer.kernels import reference

OUT_COLS = 5
"""Columns of every model kernel's `out`: score, action, logit down, flat, up."""
COL_SCORE, COL_ACTION, COL_LOGITS = 0, 1, 2

BPS = reference.BPS

PRECISIONS = ("fp32", "tf32", "bf16")
"""fp32: fp32 weights, fp32 FMA products (tl.dot input_precision="ieee");
tf32: fp32 weights, tensor-core tf32 products, fp32 accumulation;
bf16: bf16 weights, activations rounded to bf16 at each product, fp32
accumulation. Cell/state math, biases, the head and the decision are fp32 in
every variant."""


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1).

    Read when a launcher runs; the kernels themselves were decorated at import
    time, so the variable must be set before this package is imported."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def dot_flags(precision: str) -> tuple[str, bool]:
    """(input_precision for fp32 products, whether weights are bf16)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return ("tf32" if precision == "tf32" else "ieee"), precision == "bf16"


def weight_dtype(precision: str) -> torch.dtype:
    return torch.bfloat16 if dot_flags(precision)[1] else torch.float32


# --------------------------------------------------------------------------- jit helpers


@triton.jit
def _cell(gi, gf, gg, go, c):
    """LSTM cell on gate pre-activations: (h', c'). One helper for the whole cell:
    every device-function call costs the interpreter a re-patch of triton.language."""
    si = 1.0 / (1.0 + tl.exp(-gi))
    sf = 1.0 / (1.0 + tl.exp(-gf))
    so = 1.0 / (1.0 + tl.exp(-go))
    # tanh through exp of a non-positive argument: no overflow for any finite input
    tg = tl.exp(-2.0 * tl.abs(gg))
    tg = (1.0 - tg) / (1.0 + tg)
    c_new = sf * c + si * tl.where(gg < 0.0, -tg, tg)
    tc = tl.exp(-2.0 * tl.abs(c_new))
    tc = (1.0 - tc) / (1.0 + tc)
    return so * tl.where(c_new < 0.0, -tc, tc), c_new


@triton.jit
def _features(raw, bid0, ask0, f, mean, istd, valid):
    """Raw values -> normalised features, elementwise (all arguments broadcast):
    raw value, the row's level-0 bid and ask price, the feature index f, the
    feature's mean and inv_std, and where the result is valid (0 elsewhere)."""
    mid = 0.5 * (bid0 + ask0)
    mid_ok = mid > 0.0
    safe = tl.where(mid_ok, mid, 1.0)
    price = tl.where((raw > 0.0) & mid_ok, (raw - safe) / safe * 1e4, 0.0)
    # Kahan's log1p(|raw|): a few ulp with a plain log, which both the
    # interpreter and every backend have (libdevice's does not run under the
    # interpreter).
    a = tl.abs(raw)
    u = 1.0 + a
    d = u - 1.0
    mag = tl.where(d == 0.0, a, tl.log(u) * (a / tl.where(d == 0.0, 1.0, d)))
    size = tl.where(raw < 0.0, -mag, mag)
    feat = tl.where((f % 2) == 0, price, size)
    return tl.where(valid, (feat - mean) * istd, 0.0)


@triton.jit
def _mm(a, w, acc, PREC: tl.constexpr, BF16: tl.constexpr, UPCAST: tl.constexpr):
    """acc += a @ w in the variant's precision (acc is fp32)."""
    if BF16:
        a16 = a.to(tl.bfloat16)
        if UPCAST:
            # The interpreter's bf16 dot multiplies raw bit patterns (Triton
            # 3.8): upcast the bf16 operands instead. Their products are exact
            # in fp32, so this is the same math as a bf16 dot with fp32
            # accumulation.
            acc = tl.dot(a16.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a16, w, acc)
    else:
        acc = tl.dot(a, w, acc, input_precision=PREC)
    return acc


@triton.jit
def _grid_barrier(sync_ptr, ncta):
    """All ncta programs of the launch meet here. sync_ptr -> int32 [count, generation],
    zero before the first launch; the last arriver resets count, so it is zero again
    after every barrier and every launch.

    Needs all ncta programs resident at once (ncta <= SMs free for this launch):
    a program spinning here waits for programs that have not started. The
    interpreter runs programs one after another, so it can only run ncta == 1.
    Stores before the barrier are visible after it; read data that other programs
    wrote with cache_modifier=".cg" (L1 is not coherent between SMs)."""
    tl.debug_barrier()  # every thread's stores are issued before thread 0 arrives
    gen = tl.atomic_add(sync_ptr + 1, 0, sem="acquire")
    old = tl.atomic_add(sync_ptr, 1, sem="acq_rel")
    if old == ncta - 1:
        tl.atomic_xchg(sync_ptr, 0, sem="relaxed")
        tl.atomic_add(sync_ptr + 1, 1, sem="release")  # orders the reset before the release
    else:
        # Spin with plain volatile loads (served by L2 side by side) rather than atomics,
        # which would queue behind each other at the counter's L2 slice; one acquire
        # once the generation moved orders this program's later reads after it.
        cur = tl.load(sync_ptr + 1, volatile=True)
        while cur == gen:
            cur = tl.load(sync_ptr + 1, volatile=True)
        tl.atomic_add(sync_ptr + 1, 0, sem="acquire")
    tl.debug_barrier()


@triton.jit
def _ld_l2(ptrs, mask, VOL: tl.constexpr):
    """Load data another program wrote in this launch: .cg (L2; L1 is not coherent between SMs),
    or volatile in a persistent kernel (PTX allows no .cg on a volatile load)."""
    if VOL:
        v = tl.load(ptrs, mask=mask, other=0.0, volatile=True)
    else:
        v = tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg")
    return v


@triton.jit
def _decide_store(l0, l1, l2, b, bmask, slots, thr_ptr, held_ptr, out_ptr, OUT_C: tl.constexpr):
    """Logits (down, flat, up) of batch rows b -> score, action; updates held[slot]."""
    prev = tl.load(held_ptr + slots, mask=bmask, other=0)
    _decide_store_held(l0, l1, l2, b, bmask, slots, prev, thr_ptr, held_ptr, out_ptr, OUT_C)


@triton.jit
def _decide_store_held(l0, l1, l2, b, bmask, slots, prev, thr_ptr, held_ptr, out_ptr, OUT_C: tl.constexpr):
    """`_decide_store` with held[slots] already loaded as `prev` (a caller that can load it before
    its logits are ready: the persistent LSTM's emitted pass)."""
    m = tl.maximum(tl.maximum(l0, l1), l2)
    e0 = tl.exp(l0 - m)
    e1 = tl.exp(l1 - m)
    e2 = tl.exp(l2 - m)
    score = (e2 - e0) / (e0 + e1 + e2)
    thr = tl.load(thr_ptr)
    hyst = tl.load(thr_ptr + 1)
    keep_up = (prev == 1) & (score >= thr - hyst)
    keep_dn = (prev == -1) & (score <= hyst - thr)
    act = tl.where(score > thr, 1, tl.where(score < -thr, -1, tl.where(keep_up, 1, tl.where(keep_dn, -1, 0))))
    tl.store(held_ptr + slots, act.to(held_ptr.dtype.element_ty), mask=bmask)
    o = out_ptr + b * OUT_C
    tl.store(o + 0, score, mask=bmask)
    tl.store(o + 1, act.to(tl.float32), mask=bmask)
    tl.store(o + 2, l0, mask=bmask)
    tl.store(o + 3, l1, mask=bmask)
    tl.store(o + 4, l2, mask=bmask)


# --------------------------------------------------------------------------- torch references
# The math itself is defined once in `reference` (numpy or torch); these wrap it
# in the kernels' calling conventions (thresholds on the device, `out` columns).


def preprocess_reference(raw: torch.Tensor) -> torch.Tensor:
    """Raw rows (..., F) -> features (..., F) in raw's dtype (F = 4L+2): `reference.preprocess`."""
    return reference.preprocess(raw)


def features_reference(raw: torch.Tensor, mean: torch.Tensor, inv_std: torch.Tensor) -> torch.Tensor:
    """Raw rows -> normalised features in raw's dtype: `reference.features`."""
    return reference.features(raw, mean.to(raw.dtype), inv_std.to(raw.dtype))


def decide_reference(logits: torch.Tensor, thresholds: torch.Tensor, held: torch.Tensor,
                     slots: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """logits [n, 3] -> out [n, OUT_COLS] (in out's dtype); updates held[slots] in place.

    Score and action as `reference.scores` and `reference.decide`, thresholds read from
    the device tensor [threshold, hysteresis]. held: int8 or int32 [n_slots]."""
    score = reference.scores(logits)
    sl = slots.long()
    act = reference.decide(score, held[sl], thresholds[0], thresholds[1])
    held[sl] = act.to(held.dtype)
    out[:, COL_SCORE] = score
    out[:, COL_ACTION] = act.to(out.dtype)
    out[:, COL_LOGITS:COL_LOGITS + 3] = logits
    return out
