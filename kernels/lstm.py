"""(~470 lines: the phase helpers here are shared by the launched and the persistent
kernels; splitting them from the packing would only add an import cycle's worth of glue.)

Stacked-LSTM step kernel shared by window mode (`lstm_window`) and stream mode
(`lstm_stream`): parameters, weight packing, workspace, the kernel.

Math: torch.nn.LSTM (gate order i, f, g, o; gates = W_ih x + b_ih + W_hh h + b_hh;
c' = f*c + i*g; h' = o*tanh(c')), stacked layers, Linear(H, 3) head on the top
layer's h, then score and action as in `common`. Layer 1's input is the new
raw row, transformed and normalised in registers.

Rows: r = b*W + w for batch entry b and open window w (window mode), r = b
(stream mode, W = 1), in tiles of BLOCK_M rows; each row is one recurrent
state. Layer 1's input projection is computed once per batch entry (window
mode: shared by its W states) and gathered per row.

Partition: grid (NB, MS). Program (j, ms), NB = ceil(H / BH), owns hidden
units j*BH..j*BH+BH-1 of every layer for row tiles ms, ms+MS, ...: it computes
their four gate columns ([BLOCK_M, K] x [K, 4*BH] products, tl.dot) and
updates their c and h. MS > 1 only when the batch has more tiles (spreads
large batches over more SMs). c is only ever touched by its owner, so it is
updated in place. h of a layer is read in full by every program (the
recurrence and the next layer's input), so the new h goes to a scratch buffer
first; after a grid-wide barrier (nobody reads the old h any more) each
program copies its own units into the state. Phases:

    phase k < L : copy layer k-1's new h into the state (k > 0); compute layer k
    phase L     : copy layer L-1's new h; every program computes the head + decision of its share of the entries

`persistent=True` runs all phases in one launch with a grid barrier between
phases (L barriers); `persistent=False` launches each phase separately (L+1
launches; no co-residency requirement, and what the CPU interpreter runs
with more than one program).

Packed weights (`prepare_lstm_weights`; column u*4 + g of a program's block is
gate g of its unit u, so one product yields all four gates, split in registers):
    wx0   [NB, F_PAD, 4*BH]         layer-1 W_ih^T
    wx    [L-1, NB, KH, 4*BH]       W_ih^T of layers 2..L (KH = H padded to BLOCK_K)
    wh    [L, NB, KH, 4*BH]         W_hh^T
    bias  [L, NB, 4*BH] fp32        b_ih + b_hh
    head_w [3, KH] fp32, head_b [3] fp32, mean/inv_std [F] fp32
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import triton
import triton.language as tl

from hft_infer.kernels.common import (
    OUT_COLS,
    _cell,
    _decide_store,
    _features,
    _grid_barrier,
    _ld_l2,
    _mm,
    dot_flags,
    interpreting,
    weight_dtype,
)

# --------------------------------------------------------------------------- kernel

# Elements of a layer's product operands that a program loads before their products (`_lstm_layer`,
# at 4 warps: 4096 = 32 registers a thread), where a loop over K chunks paid a dependent L2 trip
# per 32 columns of each operand. The persistent kernel (one request at a time, latency first):
# lstm_a at batch 1 (16-row tiles, K = 128) loads both operands and c at once, one trip a layer;
# lstm_b (32-row tiles, K = 256) four chunks at a time, four trips a layer (was 16). The launched
# kernel: half that, so that the 128-row tiles of large batches keep the loop (at 8 warps, 4096
# elements are one chunk) and a quote at a time (16-row tiles) takes 2 trips a layer (was 8).
PREFETCH_MAX_PERSISTENT = 4096
PREFETCH_MAX_LAUNCHED = 2048


def prefetch_plan(w: "LstmWeights", block_m: int, budget: int) -> dict:
    """`_lstm_layer`'s BOTH and GROUP for tiles of block_m rows within `budget` elements: both
    operands at once where they fit, else the most chunks of one operand that fit and divide its
    chunks (a power of two; 1: the loop, a trip per chunk)."""
    nch = w.kh // w.block_k
    both = 2 * block_m * w.kh <= budget
    group = 1
    while group * 2 <= nch and nch % (group * 2) == 0 and group * 2 * block_m * w.block_k <= budget:
        group *= 2
    return dict(BOTH=both, GROUP=group)


@triton.jit
def _tile_rows(tile, slots_ptr, pos_ptr, n_rows, m, L: tl.constexpr, W: tl.constexpr, WINDOW: tl.constexpr,
               BLOCK_M: tl.constexpr, VOL: tl.constexpr):
    """Rows r = b*W + w of a tile (b: batch entry, w: open-window index; W = 1 in stream
    mode) -> (r, b, state row of layer 0, valid, keep). keep is False at the window
    emitted this step (it restarts at zero). VOL: volatile loads of data another program
    wrote during this launch (the persistent kernels)."""
    r = tile * BLOCK_M + m
    rmask = r < n_rows * W
    b = r // W
    w = r - b * W
    slot = tl.load(slots_ptr + b, mask=rmask, other=0, volatile=VOL).to(tl.int64)
    srow0 = slot * (L * W) + w
    if WINDOW:
        t = tl.load(pos_ptr + b, mask=rmask, other=0, volatile=VOL).to(tl.int64)
        e = (((t + 1) % W) + W) % W
        keep = rmask & (w != e)
    else:
        keep = rmask
    return r, b, srow0, rmask, keep


@triton.jit
def _row_offsets(b, bmask, slots_ptr, pos_ptr, F: tl.constexpr, RH, ROWS_RING: tl.constexpr, VOL: tl.constexpr):
    """Element offset of batch entry b's new raw row: b*F in a staged [n, F] batch, or
    (slot*RH + position mod RH)*F in a host feature ring [n_slots, RH, F] (ROWS_RING)."""
    if ROWS_RING:
        slot = tl.load(slots_ptr + b, mask=bmask, other=0, volatile=VOL).to(tl.int64)
        p = tl.load(pos_ptr + b, mask=bmask, other=0, volatile=VOL).to(tl.int64)
        return (slot * RH + ((p % RH) + RH) % RH) * F
    else:
        return b.to(tl.int64) * F


@triton.jit
def _split_gates(acc, BLOCK_M: tl.constexpr, BH: tl.constexpr):
    # columns u*4 + g: reshape to [M, BH, 2, 2] (g = 2*a + b), split b, then a
    s0, s1 = tl.split(tl.reshape(acc, [BLOCK_M, BH, 2, 2]))
    gi, gg = tl.split(s0)
    gf, go = tl.split(s1)
    return gi, gf, gg, go


@triton.jit
def _k_chunks(row_ptr, rmask, kk, H: tl.constexpr, BLOCK_K: tl.constexpr, c0, NC: tl.constexpr, CG: tl.constexpr,
              VOL: tl.constexpr):
    """Chunks c0 .. c0+NC-1 of rows row_ptr (columns (c0+i)*BLOCK_K.., those < H), [rows, BLOCK_K]
    each (a tuple), every load issued before any chunk is used. CG: data another program wrote in
    this launch (`_ld_l2`); else a plain load, volatile when VOL.

    Callers that feed the chunks to tl.dot put a tl.debug_barrier() before this: each chunk is
    staged into shared memory right after its load, and where that memory was last read by an
    earlier product the compiler puts a barrier before the first staging store, which no later
    load moves above -- the other chunks' loads would wait one L2 trip behind the first."""
    chunks = ()
    for i in tl.static_range(NC):
        kidx = (c0 + i) * BLOCK_K + kk
        m = rmask[:, None] & (kidx < H)[None, :]
        if CG:
            v = _ld_l2(row_ptr[:, None] + kidx[None, :], m, VOL)
        else:
            v = tl.load(row_ptr[:, None] + kidx[None, :], mask=m, other=0.0, volatile=VOL)
        chunks = chunks + (v,)
    return chunks


@triton.jit
def _mm_k_chunks(chunks, w_ptr, kk, g4, acc, G4: tl.constexpr, BLOCK_K: tl.constexpr, c0, NC: tl.constexpr,
                 PREC: tl.constexpr, BF16: tl.constexpr, UPCAST: tl.constexpr):
    """acc += chunks c0.. (`_k_chunks`) @ their rows of the weight slice at w_ptr ([K, G4])."""
    for i in tl.static_range(NC):
        wt = tl.load(w_ptr + ((c0 + i) * BLOCK_K + kk)[:, None] * G4 + g4[None, :])
        acc = _mm(chunks[i], wt, acc, PREC, BF16, UPCAST)
    return acc


@triton.jit
def _mm_rows(row_ptr, rmask, kk, g4, w_ptr, acc, H: tl.constexpr, KH: tl.constexpr, BLOCK_K: tl.constexpr,
             G4: tl.constexpr, CG: tl.constexpr, VOL: tl.constexpr, GROUP: tl.constexpr, PREC: tl.constexpr,
             BF16: tl.constexpr, UPCAST: tl.constexpr):
    """acc += rows row_ptr [.., KH] @ w_ptr [KH, G4], the K chunks loaded GROUP at a time before
    their products (one dependent L2 trip per group; GROUP divides KH / BLOCK_K: `prefetch_plan`),
    or (GROUP 1) each before its product. The groups are a loop, not unrolled: unrolled, lstm_b's
    16 products a layer took 255 registers and spilled. GROUP 1 keeps the loop as it was before
    the groups (the graph engine's 128-row tiles, measured that way): written as a group loop of
    one chunk it compiles to other spills (ptxas, lstm_a batch 64: 400 / 48 B against 396 / 80),
    not yet measured on a GPU."""
    if GROUP > 1:
        for c0 in range(0, KH // BLOCK_K, GROUP):
            tl.debug_barrier()  # see _k_chunks
            acc = _mm_k_chunks(_k_chunks(row_ptr, rmask, kk, H, BLOCK_K, c0, GROUP, CG, VOL), w_ptr, kk, g4, acc,
                               G4, BLOCK_K, c0, GROUP, PREC, BF16, UPCAST)
    else:
        for k0 in range(0, KH, BLOCK_K):
            kidx = k0 + kk
            m = rmask[:, None] & (kidx < H)[None, :]
            if CG:
                a = _ld_l2(row_ptr[:, None] + kidx[None, :], m, VOL)
            else:
                a = tl.load(row_ptr[:, None] + kidx[None, :], mask=m, other=0.0, volatile=VOL)
            wt = tl.load(w_ptr + kidx[:, None] * G4 + g4[None, :])
            acc = _mm(a, wt, acc, PREC, BF16, UPCAST)
    return acc


@triton.jit
def _c_tile(c_ptr, srow, unit, rmask, umask, H: tl.constexpr, VOL: tl.constexpr):
    """A tile's cell state: its pointers, mask and values (volatile when VOL)."""
    smask = rmask[:, None] & umask[None, :]
    cp = c_ptr + srow[:, None] * H + unit[None, :]
    return cp, smask, tl.load(cp, mask=smask, other=0.0, volatile=VOL)


@triton.jit
def _lstm_layer(layer: tl.constexpr, j, ms, n_ms, n_rows, rows_ptr, RH, slots_ptr, pos_ptr, mean_ptr, istd_ptr,
                wx0_ptr, wx_ptr, wh_ptr, bias_ptr, h_ptr, c_ptr, scratch_ptr, xp_ptr,
                F: tl.constexpr, H: tl.constexpr, W: tl.constexpr, L: tl.constexpr, F_PAD: tl.constexpr,
                KH: tl.constexpr, BLOCK_K: tl.constexpr, BH: tl.constexpr, NB: tl.constexpr,
                BLOCK_M: tl.constexpr, WINDOW: tl.constexpr, ROWS_RING: tl.constexpr, VOL: tl.constexpr,
                PREC: tl.constexpr, BF16: tl.constexpr, UPCAST: tl.constexpr, BOTH: tl.constexpr,
                GROUP: tl.constexpr):
    """Layer `layer` of this program's units for its row tiles: gates, cell, c in place, new h
    to scratch [L, n*W, H]. Weights are read with plain loads (they stay in this SM's L1 in a
    persistent kernel); state, scratch and rows with volatile loads when VOL.

    BOTH, GROUP (`prefetch_plan`): the products' K chunks are loaded before their products (each
    tl.dot stages its operands through shared memory behind a CTA barrier, and no load moves
    across one, so a load inside a chunk loop waits for the previous chunk's product: KH /
    BLOCK_K dependent L2 round trips per operand): both operands and c at once (BOTH, layers > 0:
    layer 0's input is the projection above), else each operand GROUP chunks at a time
    (`_mm_rows`), c in flight with h's first group; GROUP 1: the loop, and c loaded after it
    (`_c_tile`: live across the loop it cost the spilling 128-row tiles ~9 %)."""
    G4: tl.constexpr = 4 * BH
    XB: tl.constexpr = 16
    m = tl.arange(0, BLOCK_M)
    g4 = tl.arange(0, G4)
    kk = tl.arange(0, BLOCK_K)
    unit = j * BH + tl.arange(0, BH)
    umask = unit < H
    n_r = n_rows * W
    # this program's private x-projection rows: [n_rows, G4] at xp_base
    xp_base = xp_ptr + ((ms * NB + j) * n_rows).to(tl.int64) * G4
    if layer == 0:
        f = tl.arange(0, F_PAD)
        fmask = f < F
        mean = tl.load(mean_ptr + f, mask=fmask, other=0.0)
        istd = tl.load(istd_ptr + f, mask=fmask, other=0.0)
        wx = tl.load(wx0_ptr + (j * F_PAD + f[:, None]) * G4 + g4[None, :])
        xb = tl.arange(0, XB)
    for tile in range(ms, tl.cdiv(n_r, BLOCK_M), n_ms):
        r, b, srow0, rmask, keep = _tile_rows(tile, slots_ptr, pos_ptr, n_rows, m, L, W, WINDOW, BLOCK_M, VOL)
        srow = srow0 + layer * W
        if layer == 0:
            # Layer 1's input projection, once per batch entry (window mode: its W open
            # windows share it), for this tile's entries only: a tile of BLOCK_M rows spans
            # at most BLOCK_M / W + 2 entries (one XB pass in window mode), where projecting
            # every entry of the batch in every program cost a serial pass per 16 entries.
            b_hi = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // W, n_rows - 1)
            for b0 in range((tile * BLOCK_M) // W, b_hi + 1, XB):
                bx = b0 + xb
                bmask = bx <= b_hi
                rp = rows_ptr + _row_offsets(bx, bmask, slots_ptr, pos_ptr, F, RH, ROWS_RING, VOL)
                raw = tl.load(rp[:, None] + f[None, :], mask=bmask[:, None] & fmask[None, :], other=0.0,
                              volatile=VOL)
                bid0 = tl.load(rp, mask=bmask, other=0.0, volatile=VOL)
                ask0 = tl.load(rp + 2, mask=bmask, other=0.0, volatile=VOL)
                x = _features(raw, bid0[:, None], ask0[:, None], f[None, :], mean[None, :], istd[None, :],
                              bmask[:, None] & fmask[None, :])
                xp = _mm(x, wx, tl.zeros([XB, G4], dtype=tl.float32), PREC, BF16, UPCAST)
                tl.store(xp_base + bx[:, None] * G4 + g4[None, :], xp, mask=bmask[:, None])
            tl.debug_barrier()  # the gather below reads what other threads of this program stored
            acc = tl.load(xp_base + b[:, None] * G4 + g4[None, :], mask=rmask[:, None], other=0.0)
        h_rows = h_ptr + srow * H
        wh_at = wh_ptr + (layer * NB + j) * KH * G4
        # Input of layers > 0: the layer below's new h of the same rows, written by every program (.cg: L2).
        x_rows = scratch_ptr + ((layer - 1) * n_r + r).to(tl.int64) * H
        wx_at = wx_ptr + ((layer - 1) * NB + j) * KH * G4
        NCH: tl.constexpr = KH // BLOCK_K
        if (layer > 0) & BOTH:  # both operands' loads and c's in flight at once
            tl.debug_barrier()  # see _k_chunks
            xs = _k_chunks(x_rows, rmask, kk, H, BLOCK_K, 0, NCH, True, VOL)
            hs = _k_chunks(h_rows, rmask, kk, H, BLOCK_K, 0, NCH, False, VOL)
            cp, smask, c_old = _c_tile(c_ptr, srow, unit, rmask, umask, H, VOL)
            acc = _mm_k_chunks(xs, wx_at, kk, g4, tl.zeros([BLOCK_M, G4], dtype=tl.float32), G4, BLOCK_K, 0, NCH,
                               PREC, BF16, UPCAST)
            acc = _mm_k_chunks(hs, wh_at, kk, g4, acc, G4, BLOCK_K, 0, NCH, PREC, BF16, UPCAST)
        else:
            if layer > 0:
                acc = _mm_rows(x_rows, rmask, kk, g4, wx_at, tl.zeros([BLOCK_M, G4], dtype=tl.float32), H, KH,
                               BLOCK_K, G4, True, VOL, GROUP, PREC, BF16, UPCAST)
            if GROUP > 1:  # c in flight with h's first group
                cp, smask, c_old = _c_tile(c_ptr, srow, unit, rmask, umask, H, VOL)
            acc = _mm_rows(h_rows, rmask, kk, g4, wh_at, acc, H, KH, BLOCK_K, G4, False, VOL, GROUP,
                           PREC, BF16, UPCAST)
            if GROUP == 1:
                # c's pointers and load after the loop: the large-batch tiles (128 rows, 8 warps) spill
                # already, and with c's tile live across it lstm_a's graph step at batch 64 took ~9 %
                # longer (wave 38b)
                cp, smask, c_old = _c_tile(c_ptr, srow, unit, rmask, umask, H, VOL)
        acc += tl.load(bias_ptr + (layer * NB + j) * G4 + g4)[None, :]
        gi, gf, gg, go = _split_gates(acc, BLOCK_M, BH)
        h_new, c_new = _cell(gi, gf, gg, go, c_old)
        # Window mode: the emitted index restarts as the window beginning at t+1.
        tl.store(cp, tl.where(keep[:, None], c_new, 0.0), mask=smask)
        xrow = (layer * n_r + r).to(tl.int64)
        tl.store(scratch_ptr + xrow[:, None] * H + unit[None, :], h_new, mask=smask)


@triton.jit
def _lstm_copy_h(layer: tl.constexpr, j, ms, n_ms, n_rows, slots_ptr, pos_ptr, h_ptr, scratch_ptr,
                 H: tl.constexpr, W: tl.constexpr, L: tl.constexpr, BH: tl.constexpr,
                 BLOCK_M: tl.constexpr, WINDOW: tl.constexpr, VOL: tl.constexpr):
    """This program's units of layer `layer`'s new h: scratch -> state (0 at the emitted window).
    Only once nobody reads the layer's old h any more (after the phase's barrier)."""
    m = tl.arange(0, BLOCK_M)
    unit = j * BH + tl.arange(0, BH)
    umask = unit < H
    n_r = n_rows * W
    for tile in range(ms, tl.cdiv(n_r, BLOCK_M), n_ms):
        r, b, srow0, rmask, keep = _tile_rows(tile, slots_ptr, pos_ptr, n_rows, m, L, W, WINDOW, BLOCK_M, VOL)
        smask = rmask[:, None] & umask[None, :]
        xrow = (layer * n_r + r).to(tl.int64)
        hv = _ld_l2(scratch_ptr + xrow[:, None] * H + unit[None, :], smask, VOL)
        tl.store(h_ptr + (srow0 + layer * W)[:, None] * H + unit[None, :], tl.where(keep[:, None], hv, 0.0),
                 mask=smask)


@triton.jit
def _lstm_head(part, n_parts, n_rows, slots_ptr, pos_ptr, scratch_ptr, hw_ptr, hb_ptr, thr_ptr, held_ptr,
               out_ptr, H: tl.constexpr, W: tl.constexpr, L: tl.constexpr, KH: tl.constexpr,
               BLOCK_K: tl.constexpr, WINDOW: tl.constexpr, HB: tl.constexpr, OUT_C: tl.constexpr,
               VOL: tl.constexpr):
    """Head + decision from the top layer's new h (scratch) of batch entries part*HB.. in passes of
    HB, every n_parts*HB: the launched kernel spreads the entries over its programs (one pass each
    up to NB*MS*HB entries, where one program took a serial pass per HB), the persistent kernel's
    lead runs them all (part 0 of 1). A slot is in a step once, so held[slot] has one writer."""
    kk = tl.arange(0, BLOCK_K)
    for b0 in range(part * HB, n_rows, n_parts * HB):
        b = b0 + tl.arange(0, HB)
        bmask = b < n_rows
        if WINDOW:
            t = tl.load(pos_ptr + b, mask=bmask, other=0, volatile=VOL).to(tl.int64)
            e = (((t + 1) % W) + W) % W
            hrow = ((L - 1) * n_rows + b).to(tl.int64) * W + e
        else:
            hrow = ((L - 1) * n_rows + b).to(tl.int64)
        slot = tl.load(slots_ptr + b, mask=bmask, other=0, volatile=VOL).to(tl.int64)
        # every chunk's load in flight at once ([HB, KH]: 16-32 registers), then the sums in chunk order
        hs = _k_chunks(scratch_ptr + hrow * H, bmask, kk, H, BLOCK_K, 0, KH // BLOCK_K, True, VOL)
        l0 = tl.zeros([HB], dtype=tl.float32)
        l1 = tl.zeros([HB], dtype=tl.float32)
        l2 = tl.zeros([HB], dtype=tl.float32)
        for ci in tl.static_range(KH // BLOCK_K):
            kidx = ci * BLOCK_K + kk
            l0 += tl.sum(hs[ci] * tl.load(hw_ptr + kidx)[None, :], axis=1)
            l1 += tl.sum(hs[ci] * tl.load(hw_ptr + KH + kidx)[None, :], axis=1)
            l2 += tl.sum(hs[ci] * tl.load(hw_ptr + 2 * KH + kidx)[None, :], axis=1)
        _decide_store(l0 + tl.load(hb_ptr), l1 + tl.load(hb_ptr + 1), l2 + tl.load(hb_ptr + 2),
                      b, bmask, slot, thr_ptr, held_ptr, out_ptr, OUT_C)


@triton.jit
def _ring_scatter_rows(n_rows, rows_ptr, RH, slots_ptr, pos_ptr, ring_ptr, R, F: tl.constexpr,
                       F_PAD: tl.constexpr, HB: tl.constexpr, ROWS_RING: tl.constexpr, VOL: tl.constexpr):
    """Fused scatter of the step's new rows into a device ring [n_slots, R, F] (one program)."""
    ff = tl.arange(0, F_PAD)
    for b0 in range(0, n_rows, HB):
        b = b0 + tl.arange(0, HB)
        bmask = b < n_rows
        slot = tl.load(slots_ptr + b, mask=bmask, other=0, volatile=VOL).to(tl.int64)
        p = tl.load(pos_ptr + b, mask=bmask, other=0, volatile=VOL).to(tl.int64)
        m2 = bmask[:, None] & (ff < F)[None, :]
        src = rows_ptr + _row_offsets(b, bmask, slots_ptr, pos_ptr, F, RH, ROWS_RING, VOL)
        v = tl.load(src[:, None] + ff[None, :], mask=m2, volatile=VOL)
        tl.store(ring_ptr + (slot * R + ((p % R) + R) % R)[:, None] * F + ff[None, :], v, mask=m2)


@triton.jit(do_not_specialize=["n_rows", "R", "RH"])  # one compile for every batch size
def _lstm_kernel(
    rows_ptr, RH, slots_ptr, pos_ptr, n_rows, ring_ptr, R,
    mean_ptr, istd_ptr, wx0_ptr, wx_ptr, wh_ptr, bias_ptr, hw_ptr, hb_ptr,
    h_ptr, c_ptr, scratch_ptr, xp_ptr, sync_ptr, thr_ptr, held_ptr, out_ptr,
    F: tl.constexpr, H: tl.constexpr, W: tl.constexpr, L: tl.constexpr, F_PAD: tl.constexpr,
    KH: tl.constexpr, BLOCK_K: tl.constexpr, BH: tl.constexpr, NB: tl.constexpr, BLOCK_M: tl.constexpr,
    WINDOW: tl.constexpr, PH_BEGIN: tl.constexpr, PH_END: tl.constexpr, WRITE_RING: tl.constexpr,
    ROWS_RING: tl.constexpr, HOST_IN: tl.constexpr, PREC: tl.constexpr, BF16: tl.constexpr,
    UPCAST: tl.constexpr, HB: tl.constexpr, OUT_C: tl.constexpr, BOTH: tl.constexpr, GROUP: tl.constexpr,
):
    # grid (NB, MS): program (j, ms) owns hidden units j*BH.. of every layer, for row
    # tiles ms, ms + MS, ... (MS > 1 spreads large batches over more SMs)
    j = tl.program_id(0)
    ms = tl.program_id(1)
    n_ms = tl.num_programs(1)
    if WRITE_RING and PH_BEGIN == 0:
        if (j == NB - 1) & (ms == n_ms - 1):  # fused ring scatter; nothing in this kernel reads the ring
            _ring_scatter_rows(n_rows, rows_ptr, RH, slots_ptr, pos_ptr, ring_ptr, R, F, F_PAD, HB, ROWS_RING,
                               HOST_IN)
    for ph in tl.static_range(PH_BEGIN, PH_END):
        if ph > 0:
            _lstm_copy_h(ph - 1, j, ms, n_ms, n_rows, slots_ptr, pos_ptr, h_ptr, scratch_ptr,
                         H, W, L, BH, BLOCK_M, WINDOW, HOST_IN)
        if ph < L:
            _lstm_layer(ph, j, ms, n_ms, n_rows, rows_ptr, RH, slots_ptr, pos_ptr, mean_ptr, istd_ptr,
                        wx0_ptr, wx_ptr, wh_ptr, bias_ptr, h_ptr, c_ptr, scratch_ptr, xp_ptr,
                        F, H, W, L, F_PAD, KH, BLOCK_K, BH, NB, BLOCK_M, WINDOW, ROWS_RING, HOST_IN,
                        PREC, BF16, UPCAST, BOTH, GROUP)
        else:
            _lstm_head(ms * NB + j, NB * n_ms, n_rows, slots_ptr, pos_ptr, scratch_ptr, hw_ptr, hb_ptr, thr_ptr,
                       held_ptr, out_ptr, H, W, L, KH, BLOCK_K, WINDOW, HB, OUT_C, HOST_IN)
        if ph + 1 < PH_END:
            _grid_barrier(sync_ptr, NB * n_ms)


# --------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class LstmParams:
    """Plain torch parameters: per layer nn.LSTM's weight_ih [4H, in], weight_hh [4H, H],
    bias_ih, bias_hh [4H]; the head nn.Linear(H, 3); normalisation mean, inv_std [F]."""
    weight_ih: tuple[torch.Tensor, ...]
    weight_hh: tuple[torch.Tensor, ...]
    bias_ih: tuple[torch.Tensor, ...]
    bias_hh: tuple[torch.Tensor, ...]
    head_weight: torch.Tensor
    head_bias: torch.Tensor
    mean: torch.Tensor
    inv_std: torch.Tensor

    @classmethod
    def from_state_dict(cls, lstm_state: Mapping[str, torch.Tensor], head_weight: torch.Tensor,
                        head_bias: torch.Tensor, mean: torch.Tensor, inv_std: torch.Tensor) -> "LstmParams":
        """From nn.LSTM.state_dict() keys weight_ih_l{k}, weight_hh_l{k}, bias_ih_l{k}, bias_hh_l{k}."""
        layers = sum(1 for k in lstm_state if k.startswith("weight_ih_l"))
        get = lambda name: tuple(lstm_state[f"{name}_l{k}"].detach() for k in range(layers))  # noqa: E731
        return cls(get("weight_ih"), get("weight_hh"), get("bias_ih"), get("bias_hh"),
                   head_weight.detach(), head_bias.detach(), mean.detach(), inv_std.detach())

    @property
    def layers(self) -> int:
        return len(self.weight_ih)

    @property
    def hidden(self) -> int:
        return self.weight_hh[0].shape[1]

    @property
    def features(self) -> int:
        return self.weight_ih[0].shape[1]

    def to(self, dtype: torch.dtype, device: torch.device | str | None = None) -> "LstmParams":
        cv = lambda t: t.detach().to(device=device if device is not None else t.device, dtype=dtype)  # noqa: E731
        return LstmParams(tuple(map(cv, self.weight_ih)), tuple(map(cv, self.weight_hh)),
                          tuple(map(cv, self.bias_ih)), tuple(map(cv, self.bias_hh)),
                          cv(self.head_weight), cv(self.head_bias), cv(self.mean), cv(self.inv_std))


@dataclass(frozen=True)
class LstmWeights:
    """Packed device tensors for the LSTM kernels (from `prepare_lstm_weights`)."""
    wx0: torch.Tensor
    wx: torch.Tensor
    wh: torch.Tensor
    bias: torch.Tensor
    head_w: torch.Tensor
    head_b: torch.Tensor
    mean: torch.Tensor
    inv_std: torch.Tensor
    layers: int
    hidden: int
    features: int
    f_pad: int
    kh: int
    block_k: int
    block_h: int
    n_blocks: int
    precision: str


def _pack_gate_cols(w: torch.Tensor, hidden: int, bh: int, nb: int, k_pad: int) -> torch.Tensor:
    """w [4H, K] (nn layout) -> [NB, k_pad, 4*BH] with [j, k, u*4 + g] = w[g*H + j*BH + u, k]."""
    k = w.shape[1]
    out = torch.zeros(nb, k_pad, bh, 4, dtype=torch.float64)
    g4 = w.detach().to(torch.float64).cpu().view(4, hidden, k)  # [g, unit, k]
    padded = torch.zeros(4, nb * bh, k, dtype=torch.float64)
    padded[:, :hidden] = g4
    out[:, :k] = padded.view(4, nb, bh, k).permute(1, 3, 2, 0)  # [j, k, u, g]
    return out.view(nb, k_pad, 4 * bh)


def prepare_lstm_weights(params: LstmParams, *, precision: str = "fp32", device: torch.device | str = "cuda",
                         block_h: int = 4, block_k: int | None = None) -> LstmWeights:
    """Pack LstmParams for the kernels (start-up: allocates). block_h hidden units per program
    (>= 4: the gate product needs 4*block_h >= 16 columns); programs = ceil(H / block_h)."""
    _, bf16 = dot_flags(precision)
    wdt = weight_dtype(precision)
    if block_h < 4 or block_h & (block_h - 1):
        raise ValueError(f"block_h must be a power of two >= 4, got {block_h}")
    nl, hid, f = params.layers, params.hidden, params.features
    if params.head_weight.shape != (3, hid):
        raise ValueError(f"head must be Linear({hid}, 3), got weight {tuple(params.head_weight.shape)}")
    nb = triton.cdiv(hid, block_h)
    f_pad = max(16, triton.next_power_of_2(f))
    if block_k is None:  # 32: [64, 32] fp32 operand tiles keep the kernel under 255 registers without spills
        block_k = min(32, max(16, triton.next_power_of_2(hid)))
    kh = triton.cdiv(hid, block_k) * block_k
    dev = torch.device(device)
    wx0 = _pack_gate_cols(params.weight_ih[0], hid, block_h, nb, f_pad)
    if nl > 1:
        wx = torch.stack([_pack_gate_cols(params.weight_ih[k], hid, block_h, nb, kh) for k in range(1, nl)])
    else:
        wx = torch.zeros(1, dtype=torch.float64)
    wh = torch.stack([_pack_gate_cols(params.weight_hh[k], hid, block_h, nb, kh) for k in range(nl)])
    bias = torch.stack([
        _pack_gate_cols((params.bias_ih[k].detach().double() + params.bias_hh[k].detach().double())[:, None],
                        hid, block_h, nb, 1)[:, 0] for k in range(nl)])
    head_w = torch.zeros(3, kh, dtype=torch.float64)
    head_w[:, :hid] = params.head_weight.detach().double().cpu()
    wc = lambda t: t.to(device=dev, dtype=wdt).contiguous()  # noqa: E731
    f32 = lambda t: t.detach().to(device=dev, dtype=torch.float32).contiguous()  # noqa: E731
    return LstmWeights(wx0=wc(wx0), wx=wc(wx), wh=wc(wh), bias=f32(bias), head_w=f32(head_w),
                       head_b=f32(params.head_bias), mean=f32(params.mean), inv_std=f32(params.inv_std),
                       layers=nl, hidden=hid, features=f, f_pad=f_pad, kh=kh, block_k=block_k, block_h=block_h,
                       n_blocks=nb, precision=precision)


@dataclass(frozen=True)
class LaunchGeometry:
    """How one launched step is cut: hidden units per program (the weights are packed for it),
    rows per tile and warps per program."""
    block_h: int
    block_m: int
    num_warps: int


PHASED_MAX_PROGRAMS = 1024
"""Grid cap of a launch per phase: no grid barrier, so no co-residency limit; large batches
spread over more programs than the GPU has SMs."""


def phased_geometry(rows: int, precision: str, hidden: int) -> LaunchGeometry:
    """The geometry of a launch per phase for `rows` recurrent states (batch x open windows in
    window mode, the batch in stream mode), from `tools/sweep_lstm_geometry.py` on the H200
    (lstm_a, device time per step; BENCHMARKS.md wave 15): a few states want many programs over
    few hidden units each (lstm_a batch 1, 50 states: 4 units x 16-row tiles, 128 programs, 11.7
    us); many states want wider products that read each state row fewer times (batch 8, 400
    states: 16 units x 32 rows, 19.0 us against 24.4 with 4 units; batch 64, 3,200 states: 16 x
    128 rows, 67 us against 126 in fp32, 47.5 against 67 in tf32)."""
    cap = max(4, triton.next_power_of_2(hidden))
    if rows <= 128:
        return LaunchGeometry(min(4, cap), 16, 4)
    if rows <= 1024:
        return LaunchGeometry(min(16, cap), 32, 4)
    return LaunchGeometry(min(16, cap), 128, 8 if precision == "fp32" else 4)


@dataclass(frozen=True)
class LstmWorkspace:
    """Scratch for one model's steps, allocated once: the new h of every layer
    (fp32 [L * max_batch * states * H]), each program's layer-1 input projections
    (fp32 [max_split * NB * max_batch * 4*BH]) and the grid barrier's [count,
    generation] (int32, zero). Steps sharing a workspace must be stream-ordered
    (one stream, or one graph replay after another)."""
    scratch: torch.Tensor
    xp: torch.Tensor
    sync: torch.Tensor
    max_batch: int
    states: int
    max_split: int


def alloc_lstm_workspace(w: LstmWeights, max_batch: int, states: int, *,
                         max_programs: int | None = None) -> LstmWorkspace:
    """states: W for window mode, 1 for stream mode. max_programs caps the grid (NB x split):
    a persistent launch needs all its programs resident at once, so by default the
    device's multiprocessor count (leave SMs free if other persistent kernels run)."""
    dev = w.wh.device
    if max_programs is None:
        max_programs = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 8
    max_split = max(1, max_programs // w.n_blocks)
    return LstmWorkspace(
        scratch=torch.zeros(w.layers * max_batch * states * w.hidden, dtype=torch.float32, device=dev),
        xp=torch.zeros(max_split * w.n_blocks * max_batch * 4 * w.block_h, dtype=torch.float32, device=dev),
        sync=torch.zeros(2, dtype=torch.int32, device=dev), max_batch=max_batch, states=states,
        max_split=max_split)


def launch_lstm(w: LstmWeights, ws: LstmWorkspace, h: torch.Tensor, c: torch.Tensor, rows: torch.Tensor | None,
                slots: torch.Tensor, positions: torch.Tensor, thresholds: torch.Tensor, held: torch.Tensor,
                out: torch.Tensor, ring: torch.Tensor | None, *, window: bool, persistent: bool,
                num_warps: int, block_m: int | None = None, ring_h: torch.Tensor | None = None) -> None:
    """rows float32 [n, F] staged, or ring_h float32 [n_slots, RH, F] (rows=None): each entry's
    new row read at ring_h[slot, position mod RH], e.g. the pinned host feature ring through
    its UVA mapping. slots, positions and out may be pinned host tensors too (loads from host
    memory are volatile; slow on the H200 host, where the graph engine stages its inputs on the
    device instead: runner/staging.py)."""
    n = slots.shape[0]
    states = h.shape[2] if window else 1
    src = ring_h if ring_h is not None else rows
    if src is None:
        raise ValueError("pass the staged rows or ring_h")
    if (n > ws.max_batch or states != ws.states or src.shape[-1] != w.features or h.shape[-1] != w.hidden
            or (ring_h is None and rows.shape[0] != n)):
        raise ValueError(f"batch {n} (max {ws.max_batch}), states {states} (workspace {ws.states}), rows "
                         f"{tuple(src.shape)} or state {tuple(h.shape)} do not fit the model")
    prec, bf16 = dot_flags(w.precision)
    if block_m is None:
        # Smallest tiles that still give every allowed program a tile: a batch of one
        # window spreads over 4 x NB programs instead of NB (latency), large batches
        # use 64-row tiles (fewer passes over the weights).
        block_m = min(64, max(16, triton.next_power_of_2(triton.cdiv(n * states, ws.max_split))))
    split = min(ws.max_split, triton.cdiv(n * states, block_m))
    if persistent and interpreting():
        if w.n_blocks > 1:
            raise ValueError("the interpreter runs programs one after another: a persistent launch with a "
                             "grid barrier needs block_h >= hidden there (one program)")
        split = 1
    write_ring = ring is not None
    rows_ring = ring_h is not None
    # inputs read from pinned host memory through UVA: volatile loads (never a stale cached copy)
    host_in = any(t.device.type == "cpu" for t in (src, slots, positions)) and not interpreting()
    phases = [(0, w.layers + 1)] if persistent else [(p, p + 1) for p in range(w.layers + 1)]
    for begin, end in phases:
        _lstm_kernel[(w.n_blocks, split)](
            src, src.shape[1] if rows_ring else 1, slots, positions, n,
            ring if write_ring else src, ring.shape[1] if write_ring else 1,
            w.mean, w.inv_std, w.wx0, w.wx, w.wh, w.bias, w.head_w, w.head_b,
            h, c, ws.scratch, ws.xp, ws.sync, thresholds, held, out,
            F=w.features, H=w.hidden, W=states, L=w.layers, F_PAD=w.f_pad, KH=w.kh, BLOCK_K=w.block_k,
            BH=w.block_h, NB=w.n_blocks, BLOCK_M=block_m, WINDOW=window, PH_BEGIN=begin, PH_END=end,
            WRITE_RING=write_ring, ROWS_RING=rows_ring, HOST_IN=host_in, PREC=prec, BF16=bf16,
            UPCAST=bf16 and interpreting(),
            HB=16, OUT_C=OUT_COLS, **prefetch_plan(w, block_m, PREFETCH_MAX_LAUNCHED * num_warps // 4),
            num_warps=num_warps)  # HB: head rows per pass
