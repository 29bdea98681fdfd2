"""Per-instrument device rings of raw feature rows: scatter new rows, gather windows.

Layout: `ring` float32 [n_slots, R, F]; the row at absolute position p of slot
s sits at ring[s, p mod R] (floored modulo, so any integer position lands in
the slot). The last slot is the padding sink: batches padded to a bucket point
their extra entries at it, and writes there are harmless.

The model kernels fuse the scatter (they write the step's new rows into the
ring themselves and read the newest row from the staged batch), so these two
launches are for what the fused kernels do not cover: rows of conflated
events that trigger nothing, and windows for torch models (the cuDNN baseline).

Windows are rows p-W+1..p of the slot, oldest first; rows at negative
positions are all-zero raw rows (the MLP semantics). With `mean`/`inv_std`
the gather also applies the row transform and normalisation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hft_infer.kernels.common import _features, features_reference


@triton.jit(do_not_specialize=["n_rows", "R"])  # one compile for every batch size
def _ring_scatter_kernel(ring_ptr, rows_ptr, slots_ptr, pos_ptr, n_rows, R,
                         F: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr):
    pid = tl.program_id(0)
    b = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    f = tl.arange(0, BLOCK_F)
    bmask = b < n_rows
    slot = tl.load(slots_ptr + b, mask=bmask, other=0).to(tl.int64)
    pos = tl.load(pos_ptr + b, mask=bmask, other=0).to(tl.int64)
    r = ((pos % R) + R) % R  # floored: a negative (padding) position stays inside its slot
    mask = bmask[:, None] & (f < F)[None, :]
    vals = tl.load(rows_ptr + b[:, None].to(tl.int64) * F + f[None, :], mask=mask)
    tl.store(ring_ptr + (slot * R + r)[:, None] * F + f[None, :], vals, mask=mask)


@triton.jit(do_not_specialize=["R"])  # one compile for every batch size
def _ring_gather_kernel(ring_ptr, slots_ptr, pos_ptr, out_ptr, mean_ptr, istd_ptr, R,
                        F: tl.constexpr, W: tl.constexpr, NORMALISE: tl.constexpr,
                        BLOCK_W: tl.constexpr, BLOCK_F: tl.constexpr):
    b = tl.program_id(0)
    wb = tl.program_id(1)
    w = wb * BLOCK_W + tl.arange(0, BLOCK_W)
    f = tl.arange(0, BLOCK_F)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    pos = tl.load(pos_ptr + b).to(tl.int64)
    p = pos - (W - 1) + w
    r = ((p % R) + R) % R
    wmask = w < W
    fmask = f < F
    live = wmask & (p >= 0)
    row = (slot * R + r) * F
    raw = tl.load(ring_ptr + row[:, None] + f[None, :], mask=live[:, None] & fmask[None, :], other=0.0)
    if NORMALISE:
        bid0 = tl.load(ring_ptr + row, mask=live, other=0.0)
        ask0 = tl.load(ring_ptr + row + 2, mask=live, other=0.0)
        mean = tl.load(mean_ptr + f, mask=fmask, other=0.0)
        istd = tl.load(istd_ptr + f, mask=fmask, other=0.0)
        raw = _features(raw, bid0[:, None], ask0[:, None], f[None, :], mean[None, :], istd[None, :],
                        fmask[None, :])
    o = out_ptr + (b.to(tl.int64) * W + w)[:, None] * F + f[None, :]
    tl.store(o, raw, mask=wmask[:, None] & fmask[None, :])


def ring_scatter(ring: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor) -> None:
    """ring[slots[i], positions[i] mod R] = rows[i]. ring float32 [n_slots, R, F] (written in
    place: it is the out buffer), rows float32 [n, F], slots/positions int32 or int64 [n].
    Slots must be distinct except the padding sink (duplicate writes race)."""
    n, f = rows.shape
    block_n = 16
    _ring_scatter_kernel[(triton.cdiv(n, block_n),)](
        ring, rows, slots, positions, n, ring.shape[1],
        F=f, BLOCK_N=block_n, BLOCK_F=triton.next_power_of_2(f), num_warps=1)


def ring_gather(ring: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, out: torch.Tensor,
                mean: torch.Tensor | None = None, inv_std: torch.Tensor | None = None) -> None:
    """out [n, W, F] (float32) <- windows ending at positions; raw rows, or normalised
    features when mean and inv_std (float32 [F]) are given."""
    n, window, f = out.shape
    normalise = mean is not None
    block_w = min(64, triton.next_power_of_2(window))
    _ring_gather_kernel[(n, triton.cdiv(window, block_w))](
        ring, slots, positions, out, mean if normalise else ring, inv_std if normalise else ring,
        ring.shape[1], F=f, W=window, NORMALISE=normalise,
        BLOCK_W=block_w, BLOCK_F=triton.next_power_of_2(f), num_warps=4)


def ring_scatter_reference(ring: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor,
                           positions: torch.Tensor) -> None:
    ring[slots.long(), torch.remainder(positions.long(), ring.shape[1])] = rows.to(ring.dtype)


def ring_gather_reference(ring: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, window: int,
                          mean: torch.Tensor | None = None, inv_std: torch.Tensor | None = None,
                          out: torch.Tensor | None = None) -> torch.Tensor:
    """[n, W, F] windows in ring's dtype (zero raw rows before position 0)."""
    p = positions.long()[:, None] + torch.arange(-window + 1, 1, device=ring.device)
    rows = ring[slots.long()[:, None], torch.remainder(p, ring.shape[1])]
    rows = torch.where((p >= 0)[:, :, None], rows, torch.zeros_like(rows))
    if mean is not None:
        rows = features_reference(rows, mean, inv_std)
    if out is None:
        return rows
    out.copy_(rows)
    return out
