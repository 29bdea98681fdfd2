"""Stacked-LSTM step for large batches: one program owns whole recurrent states (rows), all layers.

The kernel of `lstm.py` splits the hidden units over programs, so a row's new h of layer k
is written by ceil(H / BH) programs and the next layer must wait for all of them (a grid
barrier, or a launch per phase); every program also reads each of its rows' full h once per
unit block. Rows are independent recurrent states (window mode: batch entry x open window;
stream mode: the entry), so a program that owns every unit of its rows needs no other
program at all: layer k+1 reads layer k's new h of the same rows, which this program wrote.
One launch, any grid, no barrier, no co-residency requirement.

Program t owns rows r = t*BLOCK_M .. (r = b*W + w as in `lstm.py`). Per layer it walks the
hidden units in blocks of BH (the weights packed by `prepare_lstm_weights(block_h=BH)`, the
same layout: column u*4 + g of block j is gate g of unit j*BH + u): gates of the block
([BLOCK_M, K] x [K, 4*BH] products over K chunks), the cell, c in place, the new h to the
scratch [L, n*W, H]. The layer's old h is read for every unit block, so the new h reaches the
state only after the block loop (a CTA barrier: the scratch is this program's own rows, read
back through its SM's L1). Layer 1's input projection is computed per row from the entry's
raw row (window mode: W times per entry; a [BLOCK_M, F_PAD] x [F_PAD, 4*BH] product, ~17 % more
FLOPs than sharing it, and no second pass). The head and the decision run for the rows that
emit (window mode: w == (t+1) mod W of their entry; stream mode: every row).

Cost per step (lstm_a window, batch 64: 3,200 rows, H 128, F_PAD 64): 1.47 GFLOP; every
program streams the packed weights once (896 KB fp32) from L2. Faster than the split kernel
only when there are enough rows to fill the GPU with BLOCK_M-row programs: `runner/gpu.py`
picks per batch size (kernels/lstm.py `phased_geometry`, measured with
tools/sweep_lstm_geometry.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hft_infer.kernels.common import OUT_COLS, _cell, _decide_store, _features, _mm, dot_flags, interpreting
from hft_infer.kernels.lstm import LstmWeights, LstmWorkspace, _split_gates

__all__ = ["launch_lstm_rows"]


@triton.jit
def _rows_layer(layer: tl.constexpr, r, rmask, keep, srow0, x, wx0_ptr, wx_ptr, wh_ptr, bias_ptr, h_ptr, c_ptr,
                scratch_ptr, n_r, H: tl.constexpr, W: tl.constexpr, F_PAD: tl.constexpr, KH: tl.constexpr,
                BLOCK_K: tl.constexpr, BH: tl.constexpr, NB: tl.constexpr, BLOCK_M: tl.constexpr,
                PREC: tl.constexpr, BF16: tl.constexpr, UPCAST: tl.constexpr):
    """Layer `layer` of this program's rows: every unit block's gates and cell; c in place; the
    new h to scratch[layer]; then (after a CTA barrier) into the state, 0 where not keep."""
    G4: tl.constexpr = 4 * BH
    g4 = tl.arange(0, G4)
    kk = tl.arange(0, BLOCK_K)
    srow = srow0 + layer * W
    prow = ((layer - 1) * n_r + r).to(tl.int64)
    xrow = (layer * n_r + r).to(tl.int64)
    f = tl.arange(0, F_PAD)
    for j in range(0, NB):
        acc = tl.zeros([BLOCK_M, G4], dtype=tl.float32)
        if layer == 0:
            acc = _mm(x, tl.load(wx0_ptr + (j * F_PAD + f[:, None]) * G4 + g4[None, :]), acc, PREC, BF16, UPCAST)
        else:
            for k0 in range(0, KH, BLOCK_K):
                kidx = k0 + kk
                a = tl.load(scratch_ptr + prow[:, None] * H + kidx[None, :], mask=rmask[:, None] & (kidx < H)[None, :],
                            other=0.0)
                wt = tl.load(wx_ptr + (((layer - 1) * NB + j) * KH + kidx[:, None]) * G4 + g4[None, :])
                acc = _mm(a, wt, acc, PREC, BF16, UPCAST)
        for k0 in range(0, KH, BLOCK_K):
            kidx = k0 + kk
            a = tl.load(h_ptr + srow[:, None] * H + kidx[None, :], mask=rmask[:, None] & (kidx < H)[None, :], other=0.0)
            wt = tl.load(wh_ptr + ((layer * NB + j) * KH + kidx[:, None]) * G4 + g4[None, :])
            acc = _mm(a, wt, acc, PREC, BF16, UPCAST)
        acc += tl.load(bias_ptr + (layer * NB + j) * G4 + g4)[None, :]
        gi, gf, gg, go = _split_gates(acc, BLOCK_M, BH)
        unit = j * BH + tl.arange(0, BH)
        smask = rmask[:, None] & (unit < H)[None, :]
        cp = c_ptr + srow[:, None] * H + unit[None, :]
        h_new, c_new = _cell(gi, gf, gg, go, tl.load(cp, mask=smask, other=0.0))
        tl.store(cp, tl.where(keep[:, None], c_new, 0.0), mask=smask)
        tl.store(scratch_ptr + xrow[:, None] * H + unit[None, :], h_new, mask=smask)
    tl.debug_barrier()  # every unit block read the old h and stored its new h (read back below)
    for k0 in range(0, KH, BLOCK_K):
        kidx = k0 + kk
        m2 = rmask[:, None] & (kidx < H)[None, :]
        hv = tl.load(scratch_ptr + xrow[:, None] * H + kidx[None, :], mask=m2, other=0.0)
        tl.store(h_ptr + srow[:, None] * H + kidx[None, :], tl.where(keep[:, None], hv, 0.0), mask=m2)


@triton.jit(do_not_specialize=["n_rows"])  # one compile for every batch size
def _lstm_rows_kernel(
    rows_ptr, slots_ptr, pos_ptr, n_rows, mean_ptr, istd_ptr, wx0_ptr, wx_ptr, wh_ptr, bias_ptr, hw_ptr, hb_ptr,
    h_ptr, c_ptr, scratch_ptr, thr_ptr, held_ptr, out_ptr,
    F: tl.constexpr, H: tl.constexpr, W: tl.constexpr, L: tl.constexpr, F_PAD: tl.constexpr, KH: tl.constexpr,
    BLOCK_K: tl.constexpr, BH: tl.constexpr, NB: tl.constexpr, BLOCK_M: tl.constexpr, WINDOW: tl.constexpr,
    PREC: tl.constexpr, BF16: tl.constexpr, UPCAST: tl.constexpr, OUT_C: tl.constexpr,
):
    n_r = n_rows * W
    r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = r < n_r
    b = r // W
    w = r - b * W
    slot = tl.load(slots_ptr + b, mask=rmask, other=0).to(tl.int64)
    srow0 = slot * (L * W) + w
    if WINDOW:
        t = tl.load(pos_ptr + b, mask=rmask, other=0).to(tl.int64)
        e = (((t + 1) % W) + W) % W
        keep = rmask & (w != e)
        emit = rmask & (w == e)
    else:
        keep = rmask
        emit = rmask
    # layer 1's input: the entry's new raw row, transformed and normalised (per row)
    f = tl.arange(0, F_PAD)
    fmask = f < F
    rp = rows_ptr + b.to(tl.int64) * F
    valid = rmask[:, None] & fmask[None, :]
    raw = tl.load(rp[:, None] + f[None, :], mask=valid, other=0.0)
    bid0 = tl.load(rp, mask=rmask, other=0.0)
    ask0 = tl.load(rp + 2, mask=rmask, other=0.0)
    x = _features(raw, bid0[:, None], ask0[:, None], f[None, :], tl.load(mean_ptr + f, mask=fmask, other=0.0)[None, :],
                  tl.load(istd_ptr + f, mask=fmask, other=0.0)[None, :], valid)
    for layer in tl.static_range(L):
        _rows_layer(layer, r, rmask, keep, srow0, x, wx0_ptr, wx_ptr, wh_ptr, bias_ptr, h_ptr, c_ptr, scratch_ptr,
                    n_r, H, W, F_PAD, KH, BLOCK_K, BH, NB, BLOCK_M, PREC, BF16, UPCAST)
    # head + decision of the emitting rows, from the top layer's new h (scratch, this program's rows)
    kk = tl.arange(0, BLOCK_K)
    trow = ((L - 1) * n_r + r).to(tl.int64)
    l0 = tl.zeros([BLOCK_M], dtype=tl.float32)
    l1 = tl.zeros([BLOCK_M], dtype=tl.float32)
    l2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, KH, BLOCK_K):
        kidx = k0 + kk
        hv = tl.load(scratch_ptr + trow[:, None] * H + kidx[None, :], mask=emit[:, None] & (kidx < H)[None, :],
                     other=0.0)
        l0 += tl.sum(hv * tl.load(hw_ptr + kidx)[None, :], axis=1)
        l1 += tl.sum(hv * tl.load(hw_ptr + KH + kidx)[None, :], axis=1)
        l2 += tl.sum(hv * tl.load(hw_ptr + 2 * KH + kidx)[None, :], axis=1)
    _decide_store(l0 + tl.load(hb_ptr), l1 + tl.load(hb_ptr + 1), l2 + tl.load(hb_ptr + 2), b, emit, slot, thr_ptr,
                  held_ptr, out_ptr, OUT_C)


def launch_lstm_rows(w: LstmWeights, ws: LstmWorkspace, h: torch.Tensor, c: torch.Tensor, rows: torch.Tensor,
                     slots: torch.Tensor, positions: torch.Tensor, thresholds: torch.Tensor, held: torch.Tensor,
                     out: torch.Tensor, *, window: bool, block_m: int = 32, num_warps: int = 4) -> None:
    """One step, window or stream mode, with the contract of `lstm_window_step` /
    `lstm_stream_step` (rows float32 [n, F] staged on the device; h, c updated in place; out
    [n, OUT_COLS]; no ring write, no host-memory inputs). `w` packed with the unit block this
    kernel walks (any block_h; 16-32 suit it). No allocation, no host sync: capturable."""
    n = slots.shape[0]
    states = h.shape[2] if window else 1
    if n > ws.max_batch or states != ws.states or rows.shape != (n, w.features) or h.shape[-1] != w.hidden:
        raise ValueError(f"batch {n} (max {ws.max_batch}), states {states} (workspace {ws.states}), rows "
                         f"{tuple(rows.shape)} or state {tuple(h.shape)} do not fit the model")
    prec, bf16 = dot_flags(w.precision)
    _lstm_rows_kernel[(triton.cdiv(n * states, block_m),)](
        rows, slots, positions, n, w.mean, w.inv_std, w.wx0, w.wx, w.wh, w.bias, w.head_w, w.head_b,
        h, c, ws.scratch, thresholds, held, out,
        F=w.features, H=w.hidden, W=states, L=w.layers, F_PAD=w.f_pad, KH=w.kh, BLOCK_K=w.block_k, BH=w.block_h,
        NB=w.n_blocks, BLOCK_M=block_m, WINDOW=window, PREC=prec, BF16=bf16, UPCAST=bf16 and interpreting(),
        OUT_C=OUT_COLS, num_warps=num_warps)
