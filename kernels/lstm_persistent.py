"""Persistent stacked-LSTM kernel (window mode, exact incremental; or stream mode) behind a
`RequestRing`: no launch per step; each request's slots, positions and new rows arrive in
the ring's device payload (copied there by DMA, kernels/persistent.py).

Per request, with the phases of `lstm.py` (`_lstm_layer`, `_lstm_copy_h`, `_lstm_head`: one
definition, shared with the launched kernel):

    lead (program (0, 0)): poll the device header; publish the request (release store of the
        mailbox)
    every program: layer k (layer 0 reads its entries' rows from the payload) -> arrive at
        counter k -> copy layer k-1's new h (own units) -> wait for counter k; k = 0..L-1
        (one barrier per layer, the copy overlaps it)
    lead: head + decision from the top layer's new h -> result slot (pinned) -> release done
    every program: copy the top layer's new h -> arrive at the completion counter; the lead
        waits for it before it polls for the next request (off the answer's path)

A RESET request zeroes h, c (every layer and window: this program's units of slots
b = ms, ms + MS, ...) and held; done is released once every program has zeroed its part.

Weights are read with plain loads: after the first request they sit in the SM's L1 for the
kernel's life (nothing else allocates in L1: state, scratch and request data are read with
volatile loads, and no acquire operation runs, since on sm_90 each one invalidates the whole
L1; the launch turns software pipelining off, which would make those volatile loads
L1-cached cp.async copies: kernels/persistent.py, NUM_STAGES). Triton gives no explicit
shared memory and the FMA products cannot take a whole [K, 4*BH] slice as a register operand
(each thread would hold K x its columns: 256+ registers for K = 128), so L1 is where
"resident" lives; per request only the new rows, the state and the exchanged h move through
L2.

State layout: the launched kernels' (h, c fp32 [n_slots, L, W, H] window mode, [n_slots, L, H]
stream mode), so the same references check both. Grid (NB, MS) <= max_programs, all resident
for the kernel's life: ceil(H / block_h) hidden blocks x MS row groups (lstm_a: 32 x 4 = 128
SMs by default; pass max_programs to leave SMs to other shards' kernels).

Two tilings (window mode, `wide`): a request of one window is cut for latency (block_h units by
16-row tiles, 128 programs for lstm_a), but that cut serves larger ones poorly -- each program
then runs its tiles one after another (lstm_a: 49 µs at batch 8, 306 at 64, where twice the units a
program and 32-row tiles take 31 and 148). So the kernel also holds the weights packed for twice
the units (`pack_wide`) and, for a request of WIDE_MIN_ENTRIES windows or more, places the same
programs anew (pid = ms * NB + j as j' = pid % NB', ms' = pid // NB') and runs its layers in that
tiling; the barriers, the state, the exchange and the head are the same in both. Both paths are
compiled into the one kernel (255 registers where one path took 128; measured in BENCHMARKS.md
wave 41). Stream mode keeps one tiling (not measured).

The emitted pass (window mode, `emit_entries`, EMIT_ENTRIES): a request's answer needs only the
windows it completes -- one row an entry -- yet the full pass computes all W open windows of each
entry, by 16-row tiles on every program, before the head. So a request of at most EMIT_ENTRIES
entries is answered first from those rows alone, on the NB programs of row group 0 (each hidden
block once): each layer's row as products reduced in registers, its new h exchanged through
`emit_h` as tagged words (tag << 32 | fp32 bits, the pass's number as the tag: a reader spins on
the words themselves until each carries this pass's tag -- no counter, no release fence, no second
load), the lead's head from the top layer's words, done released. Then every program runs the full
pass as before, which recomputes those rows with the others (its results for them are discarded:
the windows restart at zero) and writes the state; every program waits for the top layer's words
first, since the full pass rewrites the state the emitted pass reads. The answer no longer waits
for the full pass; the next request still does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hft_infer.kernels.common import OUT_COLS, _cell, _decide_store_held, _features, dot_flags, interpreting
from hft_infer.kernels.lstm import (
    PREFETCH_MAX_PERSISTENT,
    LstmWeights,
    _lstm_copy_h,
    _lstm_head,
    _lstm_layer,
    _split_gates,
    prefetch_plan,
)
from hft_infer.kernels.persistent import (
    CNT_DONE_C as _CNT_DONE,
    LINE_C as _LINE,
    NUM_STAGES,
    RESET_C as _RESET,
    STEP_C as _STEP,
    PersistentKernel,
    ProgramBudgetError,
    RequestRing,
    _arrive,
    _broadcast,
    _lead_take_request,
    _payload,
    _release_done,
    _stamp,
    _wait_broadcast,
    _wait_count,
)


@triton.jit
def _lstm_zero_slots(j, ms, n_ms, n, slots_ptr, h_ptr, c_ptr, held_ptr, lead,
                     H: tl.constexpr, W: tl.constexpr, L: tl.constexpr, BH: tl.constexpr):
    """RESET: this program's units of every layer and window of slots b = ms, ms + n_ms, ..."""
    RB: tl.constexpr = 64
    rr = tl.arange(0, RB)
    unit = j * BH + tl.arange(0, BH)
    umask = unit < H
    for e in range(ms, n, n_ms):
        slot = tl.load(slots_ptr + e, volatile=True)
        for r0 in range(0, L * W, RB):
            row = r0 + rr
            m2 = (row < L * W)[:, None] & umask[None, :]
            off = (slot * (L * W) + row)[:, None] * H + unit[None, :]
            tl.store(h_ptr + off, tl.zeros([RB, BH], dtype=tl.float32), mask=m2)
            tl.store(c_ptr + off, tl.zeros([RB, BH], dtype=tl.float32), mask=m2)
    if lead:
        hb = tl.arange(0, 16)
        for b0 in range(0, n, 16):
            bb = b0 + hb
            hs = tl.load(slots_ptr + bb, mask=bb < n, other=0, volatile=True)
            tl.store(held_ptr + hs, tl.zeros([16], dtype=tl.int32).to(held_ptr.dtype.element_ty), mask=bb < n)


@triton.jit
def _emit_state(slots_ptr, pos_ptr, h_ptr, c_ptr, n, j, H: tl.constexpr, W: tl.constexpr, L: tl.constexpr,
                KP: tl.constexpr, BH: tl.constexpr, EB: tl.constexpr):
    """The old state of the windows entries 0..n-1 (n <= EB) complete in this request, every layer's
    at once (nobody writes it during the emitted pass): h [EB, KP] and this program's units of c
    [EB, BH], a tuple of L each; and the entries' slots [EB] (int64, 0 past n)."""
    b = tl.arange(0, EB)
    bmask = b < n
    k = tl.arange(0, KP)
    unit = j * BH + tl.arange(0, BH)
    slot = tl.load(slots_ptr + b, mask=bmask, other=0, volatile=True).to(tl.int64)
    t = tl.load(pos_ptr + b, mask=bmask, other=0, volatile=True).to(tl.int64)
    e = (((t + 1) % W) + W) % W  # the window this request completes (_tile_rows' `keep` is False there)
    hs = ()
    cs = ()
    for ph in tl.static_range(0, L):
        srow = slot * (L * W) + ph * W + e
        hs = hs + (tl.load(h_ptr + srow[:, None] * H + k[None, :], mask=bmask[:, None] & (k < H)[None, :],
                           other=0.0, volatile=True),)
        cs = cs + (tl.load(c_ptr + srow[:, None] * H + unit[None, :], mask=bmask[:, None] & (unit < H)[None, :],
                           other=0.0, volatile=True),)
    return hs, cs, slot


@triton.jit
def _ll_store(ptr, value, mask, tag):
    """fp32 `value` as tagged words (tag << 32 | its bits): each 8-byte word is written whole, so a
    reader that sees the tag sees the value -- no fence, no counter (NCCL's low-latency protocol)."""
    bits = value.to(tl.uint32, bitcast=True).to(tl.int64)
    tl.store(ptr, bits | (tag << 32), mask=mask)


@triton.jit
def _ll_wait(ptr, mask, tag):
    """Spin until every word under `mask` carries `tag` (volatile loads: L2), then their fp32 values;
    0 where masked."""
    w = tl.load(ptr, mask=mask, other=tag << 32, volatile=True)
    ok = tl.min(((w >> 32) == tag).to(tl.int32))
    while ok == 0:
        w = tl.load(ptr, mask=mask, other=tag << 32, volatile=True)
        ok = tl.min(((w >> 32) == tag).to(tl.int32))
    return (w & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)


@triton.jit
def _emit_wait(layer, n, emit_ptr, tag, H: tl.constexpr, KP: tl.constexpr, EB: tl.constexpr):
    """Layer `layer`'s new h of the emitted rows [EB, KP] (0 past entry n), once every program has
    written its units of entries 0..n-1."""
    b = tl.arange(0, EB)
    k = tl.arange(0, KP)
    off = ((layer * EB + b).to(tl.int64) * H)[:, None] + k[None, :]
    return _ll_wait(emit_ptr + off, (b < n)[:, None] & (k < H)[None, :], tag)


@triton.jit
def _emit_layer(layer: tl.constexpr, j, n, x, h_old, c_old, rows_ptr, mean_ptr, istd_ptr, wx0_ptr, wx_ptr, wh_ptr,
                bias_ptr, emit_ptr, tag, F: tl.constexpr, H: tl.constexpr, F_PAD: tl.constexpr, KH: tl.constexpr,
                KP: tl.constexpr, BH: tl.constexpr, NB: tl.constexpr, EB: tl.constexpr):
    """Layer `layer` of this program's units for the completed windows of entries 0..n-1 only: one
    row each, as broadcast products reduced over K in registers (a tl.dot needs 16 rows); x is the
    layer below's new h [EB, KP] (`_emit_wait`; unused by layer 0, which reads the rows). New h to
    emit_ptr [L, EB, H] as tagged words, every one of the EB rows (rows past n too: so any word a
    reader waits for was written by this pass or the one before, whose tag differs). The state
    is not written: the full pass after the answer recomputes these rows with the others and
    restarts the windows there."""
    G4: tl.constexpr = 4 * BH
    g4 = tl.arange(0, G4)
    b = tl.arange(0, EB)
    bmask = b < n
    k = tl.arange(0, KP)
    kmask = k < H
    unit = j * BH + tl.arange(0, BH)
    if layer == 0:
        f = tl.arange(0, F_PAD)
        fmask = f < F
        rp = rows_ptr + b.to(tl.int64) * F
        xm = bmask[:, None] & fmask[None, :]
        raw = tl.load(rp[:, None] + f[None, :], mask=xm, other=0.0, volatile=True)
        bid0 = tl.load(rp, mask=bmask, other=0.0, volatile=True)
        ask0 = tl.load(rp + 2, mask=bmask, other=0.0, volatile=True)
        mean = tl.load(mean_ptr + f, mask=fmask, other=0.0)
        istd = tl.load(istd_ptr + f, mask=fmask, other=0.0)
        x0 = _features(raw, bid0[:, None], ask0[:, None], f[None, :], mean[None, :], istd[None, :], xm)
        wx = tl.load(wx0_ptr + (j * F_PAD + f[:, None]) * G4 + g4[None, :]).to(tl.float32)
        acc = tl.sum(x0[:, :, None] * wx[None, :, :], axis=1)
    else:
        wx = tl.load(wx_ptr + ((layer - 1) * NB + j) * KH * G4 + k[:, None] * G4 + g4[None, :],
                     mask=kmask[:, None], other=0.0).to(tl.float32)
        acc = tl.sum(x[:, :, None] * wx[None, :, :], axis=1)
    wh = tl.load(wh_ptr + (layer * NB + j) * KH * G4 + k[:, None] * G4 + g4[None, :], mask=kmask[:, None],
                 other=0.0).to(tl.float32)
    acc += tl.sum(h_old[:, :, None] * wh[None, :, :], axis=1)
    acc += tl.load(bias_ptr + (layer * NB + j) * G4 + g4)[None, :]
    gi, gf, gg, go = _split_gates(acc, EB, BH)
    h_new, _ = _cell(gi, gf, gg, go, c_old)
    _ll_store(emit_ptr + (((layer * EB + b).to(tl.int64)) * H)[:, None] + unit[None, :], h_new,
              (b < EB)[:, None] & (unit < H)[None, :], tag)


@triton.jit
def _emit_head(n, top, slot, prev, hw_ptr, hb_ptr, thr_ptr, held_ptr, out_ptr, KH: tl.constexpr, KP: tl.constexpr,
               EB: tl.constexpr, OUT_C: tl.constexpr):
    """The lead: head + decision of entries 0..n-1 from the top layer's new h `top` [EB, KP] (in
    registers from `_emit_wait`: the same arithmetic as `_lstm_head`, without its reloads); their
    slots and held[slots] (`prev`) were loaded before the wait."""
    b = tl.arange(0, EB)
    k = tl.arange(0, KP)
    kmask = k < KH
    l0 = tl.sum(top * tl.load(hw_ptr + k, mask=kmask, other=0.0)[None, :], axis=1)
    l1 = tl.sum(top * tl.load(hw_ptr + KH + k, mask=kmask, other=0.0)[None, :], axis=1)
    l2 = tl.sum(top * tl.load(hw_ptr + 2 * KH + k, mask=kmask, other=0.0)[None, :], axis=1)
    _decide_store_held(l0 + tl.load(hb_ptr), l1 + tl.load(hb_ptr + 1), l2 + tl.load(hb_ptr + 2),
                       b, b < n, slot, prev, thr_ptr, held_ptr, out_ptr, OUT_C)


@triton.jit
def _emit_pass(j, ms, n, r, lead, tag, rows_ptr, slots_ptr, pos_ptr, mean_ptr, istd_ptr, wx0_ptr, wx_ptr, wh_ptr,
               bias_ptr, h_ptr, c_ptr, emit_ptr, hw_ptr, hb_ptr, thr_ptr, held_ptr, out_ptr, ctrl_ptr, time_ptr,
               F: tl.constexpr, H: tl.constexpr, W: tl.constexpr, L: tl.constexpr, F_PAD: tl.constexpr,
               KH: tl.constexpr, KP: tl.constexpr, BH: tl.constexpr, NB: tl.constexpr, EB: tl.constexpr,
               OUT_C: tl.constexpr, TIMING: tl.constexpr, TSLOTS: tl.constexpr, NST: tl.constexpr,
               PHASES: tl.constexpr):
    """The completed windows' layers (a request of at most EB entries) on the NB programs of row
    group 0 (every hidden block once), each layer's new h exchanged as words tagged `tag` (this
    emitted pass's number: no barrier, a reader spins on the data itself); the lead answers from
    the top layer (head, result slot, done). Every program, emitting or not, returns only once the
    top layer is complete: its words were written after each emitting program had read all the old
    state it needs, and the full pass after this one rewrites that state."""
    if ms == 0:
        hs, cs, slot = _emit_state(slots_ptr, pos_ptr, h_ptr, c_ptr, n, j, H, W, L, KP, BH, EB)
        # the lead's held[slot] before the layers (the others load nothing): only the lead writes it
        prev = tl.load(held_ptr + slot, mask=(tl.arange(0, EB) < n) & lead, other=0)
        x = hs[0]  # layer 0 reads the request's rows instead
        for ph in tl.static_range(0, L):
            if ph > 0:
                x = _emit_wait(ph - 1, n, emit_ptr, tag, H, KP, EB)
                if PHASES:
                    if lead:
                        _stamp(time_ptr, (r % TSLOTS) * NST + 2 + 2 * ph, TIMING)  # barrier ph-1
            _emit_layer(ph, j, n, x, hs[ph], cs[ph], rows_ptr, mean_ptr, istd_ptr, wx0_ptr, wx_ptr,
                        wh_ptr, bias_ptr, emit_ptr, tag, F, H, F_PAD, KH, KP, BH, NB, EB)
            if PHASES:
                if lead:
                    _stamp(time_ptr, (r % TSLOTS) * NST + 3 + 2 * ph, TIMING)
        top = _emit_wait(L - 1, n, emit_ptr, tag, H, KP, EB)
        if lead:
            if PHASES:
                _stamp(time_ptr, (r % TSLOTS) * NST + 2 + 2 * L, TIMING)  # barrier L-1
            _emit_head(n, top, slot, prev, hw_ptr, hb_ptr, thr_ptr, held_ptr, out_ptr, KH, KP, EB, OUT_C)
            _stamp(time_ptr, (r % TSLOTS) * NST + 1, TIMING)
            _release_done(ctrl_ptr, r + 1)
    else:
        _emit_wait(L - 1, n, emit_ptr, tag, H, KP, EB)


@triton.jit
def _step_layers(j, ms, n_ms, n, r, stamp, target, rows_ptr, slots_ptr, pos_ptr, mean_ptr, istd_ptr,
                 wx0_ptr, wx_ptr, wh_ptr, bias_ptr, h_ptr, c_ptr, scratch_ptr, xp_ptr, sync_ptr, time_ptr,
                 F: tl.constexpr, H: tl.constexpr, W: tl.constexpr, L: tl.constexpr, F_PAD: tl.constexpr,
                 KH: tl.constexpr, BLOCK_K: tl.constexpr, BH: tl.constexpr, NB: tl.constexpr,
                 BLOCK_M: tl.constexpr, WINDOW: tl.constexpr, PREC: tl.constexpr, BF16: tl.constexpr,
                 UPCAST: tl.constexpr, BOTH: tl.constexpr, GROUP: tl.constexpr, TIMING: tl.constexpr,
                 TSLOTS: tl.constexpr, NST: tl.constexpr, PHASES: tl.constexpr):
    """A step's layers in one tiling (program (j, ms) of NB x n_ms, BH units by BLOCK_M rows, the
    weights packed for BH): each layer, then its barrier, with the copy of the layer below's new h
    overlapping the barrier; the top layer's copy is the caller's (after the head). `stamp`: the
    lead of a phases build stamps the layers (not where the emitted pass answered: it stamped)."""
    for ph in tl.static_range(0, L):
        _lstm_layer(ph, j, ms, n_ms, n, rows_ptr, 1, slots_ptr, pos_ptr, mean_ptr, istd_ptr,
                    wx0_ptr, wx_ptr, wh_ptr, bias_ptr, h_ptr, c_ptr, scratch_ptr, xp_ptr,
                    F, H, W, L, F_PAD, KH, BLOCK_K, BH, NB, BLOCK_M, WINDOW, False, True,
                    PREC, BF16, UPCAST, BOTH, GROUP)
        if PHASES:
            if stamp:
                _stamp(time_ptr, (r % TSLOTS) * NST + 3 + 2 * ph, TIMING)
        _arrive(sync_ptr + _LINE * (_CNT_DONE + 1 + ph))
        if ph > 0:
            # layer ph-1's old h is read by nobody any more (everyone passed barrier ph-1)
            _lstm_copy_h(ph - 1, j, ms, n_ms, n, slots_ptr, pos_ptr, h_ptr, scratch_ptr,
                         H, W, L, BH, BLOCK_M, WINDOW, True)
        _wait_count(sync_ptr + _LINE * (_CNT_DONE + 1 + ph), target)
        if PHASES:
            if stamp:
                _stamp(time_ptr, (r % TSLOTS) * NST + 4 + 2 * ph, TIMING)


@triton.jit
def _lstm_persistent_kernel(
    hdr_ptr, hdr_h_ptr, stop_ptr, pay_i_ptr, pay_f_ptr, pay_h_i_ptr, pay_h_f_ptr, out_h_ptr, ctrl_ptr, time_ptr,
    sync_ptr,
    mean_ptr, istd_ptr, wx0_ptr, wx_ptr, wh_ptr, bias_ptr, wx0w_ptr, wxw_ptr, whw_ptr, biasw_ptr, hw_ptr, hb_ptr,
    h_ptr, c_ptr, scratch_ptr, xp_ptr, thr_ptr, held_ptr, emit_ptr,
    F: tl.constexpr, H: tl.constexpr, W: tl.constexpr, L: tl.constexpr, F_PAD: tl.constexpr,
    KH: tl.constexpr, BLOCK_K: tl.constexpr, BH: tl.constexpr, NB: tl.constexpr, BLOCK_M: tl.constexpr,
    WINDOW: tl.constexpr, NREQ: tl.constexpr, PW: tl.constexpr, ROWS_AT: tl.constexpr, MAX_B: tl.constexpr,
    INL: tl.constexpr, RW: tl.constexpr, RB: tl.constexpr, IB: tl.constexpr, NT: tl.constexpr,
    PREC: tl.constexpr, BF16: tl.constexpr, UPCAST: tl.constexpr, HB: tl.constexpr, OUT_C: tl.constexpr,
    TIMING: tl.constexpr, TSLOTS: tl.constexpr, BOTH: tl.constexpr, GROUP: tl.constexpr,
    NST: tl.constexpr, PHASES: tl.constexpr,
    WIDE_ROWS: tl.constexpr, BH_W: tl.constexpr, NB_W: tl.constexpr, BLOCK_M_W: tl.constexpr,
    BOTH_W: tl.constexpr, GROUP_W: tl.constexpr, EB: tl.constexpr, KP: tl.constexpr,
):
    j = tl.program_id(0)
    ms = tl.program_id(1)
    n_ms = tl.num_programs(1)
    nprog = NB * n_ms
    lead = (j == 0) & (ms == 0)
    # the wide tiling's place of this program (WIDE_ROWS > 0): the same programs, NB_W hidden blocks
    pid = ms * NB + j
    j_w = pid % NB_W
    ms_w = pid // NB_W
    n_ms_w = nprog // NB_W
    r = tl.load(sync_ptr + _LINE * _CNT_DONE, volatile=True) * 0  # int64 zero: requests served
    nstep = r  # steps served (the phase counters count steps only)
    nemit = r  # steps answered from the emitted pass (their exchange's tags count those only)
    running = 1
    while running == 1:
        if lead:
            kind, n = _lead_take_request(hdr_ptr, hdr_h_ptr, stop_ptr, pay_i_ptr, pay_f_ptr, pay_h_i_ptr,
                                         pay_h_f_ptr, r, NREQ, PW, MAX_B, ROWS_AT, INL, RW, RB, IB, NT)
            if (kind == _STEP) | (kind == _RESET):
                _stamp(time_ptr, (r % TSLOTS) * NST, TIMING)
            _broadcast(sync_ptr, r, kind, n)
            if PHASES:
                _stamp(time_ptr, (r % TSLOTS) * NST + 2, TIMING)
        else:
            kind, n = _wait_broadcast(sync_ptr, r)
            if PHASES:
                if (j == NB - 1) & (ms == n_ms - 1):
                    _stamp(time_ptr, (r % TSLOTS) * NST + 3 + 2 * L, TIMING)
        slots_ptr, pos_ptr, rows_ptr = _payload(pay_i_ptr, pay_f_ptr, r, NREQ, PW, MAX_B, ROWS_AT)
        if kind == _STEP:
            target = nprog * (nstep + 1)
            emitted = n < 0  # False: a request of at most EB entries is answered from the emitted pass
            if EB > 0:
                emitted = n <= EB
                if emitted:
                    o = out_h_ptr + (r % NREQ) * (MAX_B * OUT_C)
                    _emit_pass(j, ms, n, r, lead, nemit % 0x7FFFFFFF + 1, rows_ptr, slots_ptr, pos_ptr, mean_ptr,
                               istd_ptr, wx0_ptr, wx_ptr, wh_ptr, bias_ptr, h_ptr, c_ptr, emit_ptr, hw_ptr, hb_ptr,
                               thr_ptr, held_ptr, o, ctrl_ptr, time_ptr, F, H, W, L, F_PAD, KH, KP, BH, NB, EB,
                               OUT_C, TIMING, TSLOTS, NST, PHASES)
                    nemit += 1
            stamp = lead & (emitted == 0)  # the phase stamps are the emitted pass's where it ran
            wide = False
            if WIDE_ROWS > 0:  # a request of WIDE_ROWS rows or more: the wide tiling (n is broadcast: all agree)
                wide = n * W >= WIDE_ROWS
            if wide:
                _step_layers(j_w, ms_w, n_ms_w, n, r, stamp, target, rows_ptr, slots_ptr, pos_ptr, mean_ptr, istd_ptr,
                             wx0w_ptr, wxw_ptr, whw_ptr, biasw_ptr, h_ptr, c_ptr, scratch_ptr, xp_ptr, sync_ptr,
                             time_ptr, F, H, W, L, F_PAD, KH, BLOCK_K, BH_W, NB_W, BLOCK_M_W, WINDOW, PREC, BF16,
                             UPCAST, BOTH_W, GROUP_W, TIMING, TSLOTS, NST, PHASES)
            else:
                _step_layers(j, ms, n_ms, n, r, stamp, target, rows_ptr, slots_ptr, pos_ptr, mean_ptr, istd_ptr,
                             wx0_ptr, wx_ptr, wh_ptr, bias_ptr, h_ptr, c_ptr, scratch_ptr, xp_ptr, sync_ptr,
                             time_ptr, F, H, W, L, F_PAD, KH, BLOCK_K, BH, NB, BLOCK_M, WINDOW, PREC, BF16,
                             UPCAST, BOTH, GROUP, TIMING, TSLOTS, NST, PHASES)
            if stamp:  # the lead, unless the emitted pass answered
                o = out_h_ptr + (r % NREQ) * (MAX_B * OUT_C)
                _lstm_head(0, 1, n, slots_ptr, pos_ptr, scratch_ptr, hw_ptr, hb_ptr, thr_ptr, held_ptr, o,
                           H, W, L, KH, BLOCK_K, WINDOW, HB, OUT_C, True)
                _stamp(time_ptr, (r % TSLOTS) * NST + 1, TIMING)
                _release_done(ctrl_ptr, r + 1)
            if wide:
                _lstm_copy_h(L - 1, j_w, ms_w, n_ms_w, n, slots_ptr, pos_ptr, h_ptr, scratch_ptr,
                             H, W, L, BH_W, BLOCK_M_W, WINDOW, True)
            else:
                _lstm_copy_h(L - 1, j, ms, n_ms, n, slots_ptr, pos_ptr, h_ptr, scratch_ptr,
                             H, W, L, BH, BLOCK_M, WINDOW, True)
            nstep += 1
        if kind == _RESET:
            _lstm_zero_slots(j, ms, n_ms, n, slots_ptr, h_ptr, c_ptr, held_ptr, lead, H, W, L, BH)
        if (kind == _STEP) | (kind == _RESET):
            _arrive(sync_ptr + _LINE * _CNT_DONE)
            if lead:
                # every program is done with request r+1 before the next one touches the state
                _wait_count(sync_ptr + _LINE * _CNT_DONE, nprog * (r + 1))
                if kind == _RESET:
                    _stamp(time_ptr, (r % TSLOTS) * NST + 1, TIMING)
                    _release_done(ctrl_ptr, r + 1)
            r += 1
        else:
            running = 0


# The wide tiling (kernel-level, tools/sweep_persistent_geometry.py, BENCHMARKS.md wave 41, H100):
# lstm_a's device time per request at batch 1 / 2 / 4 / 8 / 64 was 12.3 / 19.0 / 30.8 / 49.4 / 306 µs
# in the batch-1 tiling (block_h 4, 16-row tiles) against 14.3 / 16.1 / 18.5 / 31.2 / 148 with twice the
# hidden units a program and 32-row tiles: a request of two windows or more takes the latter.
WIDE_BLOCK_H_FACTOR = 2
WIDE_BLOCK_M = 32
WIDE_MIN_ENTRIES = 2
# The emitted pass (window mode): a request of at most EMIT_ENTRIES entries is answered from the
# windows it completes alone -- one row an entry a layer on one row group's programs -- before the
# full pass over every open window (docs/notes/kernels.md, "The emitted pass"). A power of two; 0: off.
EMIT_ENTRIES = 2
# its products hold [EMIT_ENTRIES, K, 4 * block_h] in registers: up to this K (hidden size, padded)
EMIT_MAX_K = 256
# Steps of at most INLINE_ENTRIES entries go inline: the host writes the pinned header only, and the
# lead reads the request from the pinned slot in place -- no copy graph to launch (~3.8 µs of the
# host's submit) nor two copies to wait for (docs/notes/kernels.md, "Small requests inline").
INLINE_ENTRIES = 2


def pack_wide(params, w: LstmWeights) -> LstmWeights | None:
    """The weights of `params` packed for the persistent kernel's wide tiling (WIDE_BLOCK_H_FACTOR x
    w's hidden units a program), or None where one program of `w` already holds every unit."""
    from hft_infer.kernels.lstm import prepare_lstm_weights

    if w.n_blocks == 1:
        return None
    return prepare_lstm_weights(params, precision=w.precision, device=w.wh.device,
                                block_h=WIDE_BLOCK_H_FACTOR * w.block_h, block_k=w.block_k)


def phase_stamps(layers: int) -> list[str]:
    """The names of a request's device stamps in a `phases` build, in their order in `times`
    (PersistentKernel.device_stamps_ns): the lead's, then the last program's."""
    names = ["detect", "done", "broadcast"]
    for k in range(layers):
        names += [f"layer {k}", f"barrier {k}"]
    return names + ["last program sees it"]


class LstmPersistent(PersistentKernel):
    """Window-mode (window=W) or stream-mode (window=None) LSTM served by a persistent kernel.

        ring = RequestRing(max_batch, rows_per_entry=1, width=F, n_requests=4, device=dev)
        eng = LstmPersistent(w, ring, n_slots, thresholds, held, window=50)
        eng.precompile(); eng.start()
        ... ring.request_views(k), ring.rows(k)[:, 0] / ring.submit(n) / ring.done(seq) / ring.outputs(k) ...
        eng.stop()

    Each entry's new raw row goes in the request's rows[b, 0]; n_slots counts the padding sink
    (the last slot). thresholds float32 [2] and held int32 [n_slots] on the device; h, c
    (allocated here, zero) are the model state. `wide` (window mode): the same model's weights
    packed for the second tiling (`pack_wide`), which requests of `wide_min_entries` windows or
    more take; `wide_reason` says whether it is in use and why not."""

    def __init__(self, w: LstmWeights, ring: RequestRing, n_slots: int, thresholds: torch.Tensor,
                 held: torch.Tensor, *, window: int | None, max_programs: int | None = None,
                 block_m: int | None = None, num_warps: int = 4, timing: bool = False,
                 phases: bool = False, wide: LstmWeights | None = None, wide_block_m: int = WIDE_BLOCK_M,
                 wide_min_entries: int = WIDE_MIN_ENTRIES, emit_entries: int = EMIT_ENTRIES,
                 inline_entries: int = INLINE_ENTRIES) -> None:
        dev = w.wh.device
        # phases (with timing): the lead program also stamps the broadcast, each layer's end and
        # each layer barrier's, and the last program the broadcast's arrival (`phase_stamps`); a
        # diagnostic build (tools/sweep_persistent_geometry.py), never the service's
        super().__init__(ring, dev, timing=timing, stamps=len(phase_stamps(w.layers)) if phases else 2)
        self.phases = phases and self.timing
        if ring.rows_per_entry != 1 or ring.width != w.features:
            raise ValueError(f"the ring carries {ring.rows_per_entry} rows of {ring.width} per entry; "
                             f"the LSTM takes 1 row of {w.features}")
        if 2 + w.layers > 15:
            raise ValueError("at most 13 layers (one sync line per phase)")
        self.w = w
        self.thresholds, self.held = thresholds, held
        self.window_mode = window is not None
        self.states = window if window is not None else 1
        self.num_warps = num_warps
        max_batch = ring.max_batch
        rows = max_batch * self.states
        if max_programs is None:
            max_programs = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 1
        if interpreting():
            if w.n_blocks > 1:
                raise ValueError("the interpreter runs programs one after another: block_h >= hidden there")
            max_programs = 1
        if w.n_blocks > max_programs:
            raise ProgramBudgetError(f"{w.n_blocks} hidden blocks need {w.n_blocks} programs, max_programs is "
                                     f"{max_programs}")
        split_max = max(1, max_programs // w.n_blocks)
        if block_m is None:
            # latency first: a batch of one (W rows) spread over the row groups
            block_m = min(64, max(16, triton.next_power_of_2(triton.cdiv(self.states, split_max))))
        self.block_m = block_m
        self.split = max(1, min(split_max, triton.cdiv(rows, block_m)))
        shape = (n_slots, w.layers, self.states, w.hidden) if self.window_mode else (n_slots, w.layers, w.hidden)
        f32 = dict(dtype=torch.float32, device=dev)
        self.h = torch.zeros(shape, **f32)
        self.c = torch.zeros(shape, **f32)
        self.scratch = torch.zeros(w.layers * rows * w.hidden, **f32)
        # the wide tiling (window mode): requests of wide_min_entries windows or more take `wide`'s
        # hidden blocks (the same programs, placed anew) and wide_block_m-row tiles
        self.wide, self.wide_reason = self._wide_tiling(wide, wide_block_m)
        self.wide_block_m = wide_block_m
        self.wide_rows = wide_min_entries * self.states if self.wide is not None else 0
        # each program's private x-projection rows: max_batch x 4 units of its widest tiling
        widest = max(w.block_h, self.wide.block_h if self.wide is not None else 0)
        self.xp = torch.zeros(self.programs * max_batch * 4 * widest, **f32)
        # the emitted pass (window mode): requests of at most emit_entries entries are answered from
        # the windows they complete before the full pass; its new h per layer and entry [L, EB, H] as
        # tagged words (tag << 32 | fp32 bits: `_ll_store`), zeroed at each start (tags restart at 1)
        self.emit_entries, self.emit_reason = self._emit_pass(emit_entries)
        self.emit_h = torch.zeros(w.layers * max(1, self.emit_entries) * w.hidden, dtype=torch.int64, device=dev)
        # steps of at most inline_entries entries skip the ring's copy graph: the lead reads them from the
        # pinned slot (RequestRing.enable_inline; granted where the transport and row bytes allow)
        self.inline_entries = ring.enable_inline(inline_entries)

    def _wide_tiling(self, wide: LstmWeights | None, block_m: int) -> tuple[LstmWeights | None, str]:
        """`wide` if this kernel can take it as its second tiling, else None; and why not."""
        w = self.w
        if wide is None:
            return None, "none given"
        if not self.window_mode:
            return None, "stream mode (not measured)"
        if self.programs % wide.n_blocks:
            return None, f"{self.programs} programs do not split into {wide.n_blocks} hidden blocks"
        same = ("layers", "hidden", "features", "f_pad", "kh", "block_k", "precision")
        differ = [k for k in same if getattr(wide, k) != getattr(w, k)]
        if differ:
            raise ValueError(f"the wide weights are not packed from the same model as w: {differ} differ")
        if block_m < 16 or block_m & (block_m - 1):
            raise ValueError(f"wide_block_m must be a power of two >= 16, got {block_m}")
        return wide, "in use"

    def _emit_pass(self, entries: int) -> tuple[int, str]:
        """The emitted pass's entry limit for this kernel (0: off), and why."""
        if entries < 0 or entries & (entries - 1):
            raise ValueError(f"emit_entries must be 0 or a power of two, got {entries}")
        if entries == 0:
            return 0, "off (emit_entries 0)"
        if not self.window_mode:
            return 0, "stream mode (one row an entry: nothing to put first)"
        if triton.next_power_of_2(self.w.kh) > EMIT_MAX_K:
            return 0, f"hidden {self.w.hidden}: its products would not fit in registers (K <= {EMIT_MAX_K})"
        # a power of two (its products' entry axis is a tl.arange): at most the ring's batch rounded down to one
        return min(entries, 1 << (self.ring.max_batch.bit_length() - 1)), "in use"

    @property
    def programs(self) -> int:
        return self.w.n_blocks * self.split

    def _launch_spec(self) -> tuple:
        w = self.w
        ww = self.wide if self.wide is not None else w  # no wide tiling: its arguments unused (WIDE_ROWS 0)
        budget = PREFETCH_MAX_PERSISTENT * self.num_warps // 4
        wide_plan = prefetch_plan(ww, self.wide_block_m, budget)
        prec, bf16 = dot_flags(w.precision)
        return (_lstm_persistent_kernel, (w.n_blocks, self.split),
                (*self.ring_args(), self.times, self.sync,
                 w.mean, w.inv_std, w.wx0, w.wx, w.wh, w.bias, ww.wx0, ww.wx, ww.wh, ww.bias, w.head_w, w.head_b,
                 self.h, self.c, self.scratch, self.xp, self.thresholds, self.held, self.emit_h),
                dict(F=w.features, H=w.hidden, W=self.states, L=w.layers, F_PAD=w.f_pad, KH=w.kh,
                     BLOCK_K=w.block_k, BH=w.block_h, NB=w.n_blocks, BLOCK_M=self.block_m,
                     WINDOW=self.window_mode, **self.ring_consts(),
                     PREC=prec, BF16=bf16, UPCAST=bf16 and interpreting(), HB=16, OUT_C=OUT_COLS,
                     TIMING=self.timing, TSLOTS=self.time_slots, NST=self.stamps, PHASES=self.phases,
                     **prefetch_plan(w, self.block_m, budget),
                     WIDE_ROWS=self.wide_rows, BH_W=ww.block_h, NB_W=ww.n_blocks, BLOCK_M_W=self.wide_block_m,
                     BOTH_W=wide_plan["BOTH"], GROUP_W=wide_plan["GROUP"],
                     EB=self.emit_entries, KP=triton.next_power_of_2(w.kh),
                     num_warps=self.num_warps, num_stages=NUM_STAGES))

    def start(self) -> None:
        # the emitted pass's tags count from 1 in each launch: no word of an earlier one may match
        # (zeroed on the caller's stream, which the launch waits for)
        self.emit_h.zero_()
        super().start()

    def _zero_state(self) -> None:
        self.h.zero_()
        self.c.zero_()
        self.held.zero_()
