"""The whole window MLP in one launch: ring read, row transform, every layer, decision.

Model (the CPU `mlp` kind): input = the W raw rows p-W+1..p of the slot, oldest
first (zero raw rows before position 0), transformed and normalised, flattened
to W*F; Linear+ReLU per hidden layer (one or two hidden layers, any widths);
Linear to 3 logits; score and action as in `common`.

Grid: (NBLK * KSPLIT, batch tiles of BLOCK_B). The first layer, [B, W*F] x
[W*F, H1], holds nearly all the weights (mlp_small: 172k of 181k), so it is
split over programs: program (nb, ks) owns hidden columns nb*BN..nb*BN+BN-1
and input chunks ks*CPS..ks*CPS+CPS-1 (BK inputs each; the flattened input
runs across row boundaries, so no per-row padding is read). Each program reads
its weight block once, builds its input chunk for the whole batch tile straight
from the ring (the newest row from the staged batch), and stores a partial sum.
The last program to finish (an atomic counter, no spinning: any grid size is
safe) sums the partials in a fixed order (deterministic), finishes layer 1,
runs the remaining layers and the decision, and resets the counter.

Weight layouts (`prepare_mlp_weights`):
    w1  [NBLK, NCHUNK*BK, BN]  w1[nb, k, n] = W1[nb*BN + n, k]  (wdtype, zero padded)
    b1  [H1P] fp32;  w2 [H1P, H2P] = W2^T (wdtype);  b2 [H2P] fp32
    w3  [3, HLP] fp32 (head, nn layout, padded);  b3 [3] fp32
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hft_infer.kernels.common import (
    OUT_COLS,
    _decide_store,
    _features,
    _ld_l2,
    _mm,
    decide_reference,
    dot_flags,
    features_reference,
    interpreting,
    weight_dtype,
)
from hft_infer.kernels.ring import ring_gather_reference, ring_scatter_reference


@triton.jit
def _mlp_partial(pid, bt, ring_ptr, rows_ptr, slots_ptr, pos_ptr, n_rows, R, mean_ptr, istd_ptr, w1_ptr, part_ptr,
                 F: tl.constexpr, W: tl.constexpr, H1P: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 NCHUNK: tl.constexpr, CPS: tl.constexpr, BLOCK_B: tl.constexpr, NEW_ROWS: tl.constexpr,
                 VOL: tl.constexpr, PREC: tl.constexpr, BF16: tl.constexpr, UPCAST: tl.constexpr,
                 DENSE: tl.constexpr):
    """Layer 1, program pid = (nb, ks), batch tile bt: the partial sum over input chunks
    ks*CPS.. of hidden columns nb*BN.. -> part[ks, b, nb*BN:...]. Window rows come from the
    ring (VOL: volatile loads, e.g. the host feature ring under a persistent kernel), or
    (DENSE) from gathered windows [n, W, F], entry b's oldest row first (R == W; rows before
    the instrument's first are already zero there; slots index only the policy's state)."""
    NBLK: tl.constexpr = H1P // BN
    KIN: tl.constexpr = W * F
    nb = pid % NBLK
    ks = pid // NBLK
    b = bt * BLOCK_B + tl.arange(0, BLOCK_B)
    bmask = b < n_rows
    slot = tl.load(slots_ptr + b, mask=bmask, other=0, volatile=VOL)
    pos = tl.load(pos_ptr + b, mask=bmask, other=0, volatile=VOL)
    # Per-row int32 bases keep the [BLOCK_B, BK] index tiles 32-bit (registers):
    # ring row of window row wi = (pr + R - (W-1) + wi) mod R, with pr = pos mod R
    # (floored) and R >= W; rows before position 0 have wi < lead.
    if DENSE:  # window row wi of entry b is row b*W + wi: pr = W-1, nothing before position 0
        slot_base = b.to(tl.int32) * W
        pr = tl.zeros_like(slot_base) + (W - 1)
        lead = tl.zeros_like(slot_base)
    else:
        pr = (((pos % R) + R) % R).to(tl.int32)
        lead = tl.minimum(tl.maximum((W - 1) - pos, 0), W).to(tl.int32)
        slot_base = slot.to(tl.int32) * R
    kk = tl.arange(0, BK)
    nn = tl.arange(0, BN)
    acc = tl.zeros([BLOCK_B, BN], dtype=tl.float32)
    for ci in range(CPS):
        c = ks * CPS + ci
        k = c * BK + kk  # flattened input index: row wi = k // F, feature f = k % F
        kvalid = k < KIN
        wi = k // F
        f = k - wi * F
        live = bmask[:, None] & kvalid[None, :]
        ring_ok = live & (wi[None, :] >= lead[:, None])
        if NEW_ROWS:
            ring_ok = ring_ok & (wi < W - 1)[None, :]
        roff = (slot_base[:, None] + (pr[:, None] + (R - (W - 1)) + wi[None, :]) % R) * F
        raw = tl.load(ring_ptr + roff + f[None, :], mask=ring_ok, other=0.0, volatile=VOL)
        bid0 = tl.load(ring_ptr + roff, mask=ring_ok, other=0.0, volatile=VOL)
        ask0 = tl.load(ring_ptr + roff + 2, mask=ring_ok, other=0.0, volatile=VOL)
        if NEW_ROWS:
            # The newest row comes from the staged batch: another program may be
            # writing it into the ring right now.
            new_ok = live & (wi == W - 1)[None, :] & (pos >= 0)[:, None]
            noff = b[:, None] * F + tl.zeros([1, BK], dtype=tl.int32)
            raw = tl.where(new_ok, tl.load(rows_ptr + noff + f[None, :], mask=new_ok, other=0.0), raw)
            bid0 = tl.where(new_ok, tl.load(rows_ptr + noff, mask=new_ok, other=0.0), bid0)
            ask0 = tl.where(new_ok, tl.load(rows_ptr + noff + 2, mask=new_ok, other=0.0), ask0)
        mean = tl.load(mean_ptr + f, mask=kvalid, other=0.0)
        istd = tl.load(istd_ptr + f, mask=kvalid, other=0.0)
        x = _features(raw, bid0, ask0, f[None, :], mean[None, :], istd[None, :], live)
        wk = k < NCHUNK * BK  # the last split may own fewer than CPS chunks
        wt = tl.load(w1_ptr + (nb * (NCHUNK * BK) + k[:, None]) * BN + nn[None, :],
                     mask=wk[:, None], other=0.0)
        acc = _mm(x, wt, acc, PREC, BF16, UPCAST)
    tl.store(part_ptr + (ks * n_rows + b[:, None]) * H1P + nb * BN + nn[None, :], acc, mask=bmask[:, None])


@triton.jit
def _mlp_finish(bt, slots_ptr, n_rows, part_ptr, b1_ptr, w2_ptr, b2_ptr, w3_ptr, b3_ptr, thr_ptr, held_ptr,
                out_ptr, H1P: tl.constexpr, H2P: tl.constexpr, HLP: tl.constexpr, NUM_HIDDEN: tl.constexpr,
                KSPLIT: tl.constexpr, BLOCK_B: tl.constexpr, BK1: tl.constexpr, VOL: tl.constexpr,
                PREC: tl.constexpr, BF16: tl.constexpr, UPCAST: tl.constexpr, OUT_C: tl.constexpr):
    """Batch tile bt, once every partial is stored: sum them in a fixed order (deterministic),
    finish layer 1, the other layers, the decision."""
    b = bt * BLOCK_B + tl.arange(0, BLOCK_B)
    bmask = b < n_rows
    slot = tl.load(slots_ptr + b, mask=bmask, other=0, volatile=VOL)
    k1 = tl.arange(0, BK1)
    l0 = tl.zeros([BLOCK_B], dtype=tl.float32)
    l1 = tl.zeros([BLOCK_B], dtype=tl.float32)
    l2 = tl.zeros([BLOCK_B], dtype=tl.float32)
    j2 = tl.arange(0, H2P)
    acc2 = tl.zeros([BLOCK_B, H2P], dtype=tl.float32)
    for k0 in range(0, H1P, BK1):
        cols = k0 + k1
        hsum = tl.zeros([BLOCK_B, BK1], dtype=tl.float32)
        for s in range(KSPLIT):  # fixed order: the result does not depend on who finished last
            hsum += _ld_l2(part_ptr + (s * n_rows + b[:, None]) * H1P + cols[None, :], bmask[:, None], VOL)
        h = tl.maximum(hsum + tl.load(b1_ptr + cols)[None, :], 0.0)
        if NUM_HIDDEN == 2:
            w2t = tl.load(w2_ptr + cols[:, None] * H2P + j2[None, :])
            acc2 = _mm(h, w2t, acc2, PREC, BF16, UPCAST)
        else:
            l0 += tl.sum(h * tl.load(w3_ptr + cols)[None, :], axis=1)
            l1 += tl.sum(h * tl.load(w3_ptr + HLP + cols)[None, :], axis=1)
            l2 += tl.sum(h * tl.load(w3_ptr + 2 * HLP + cols)[None, :], axis=1)
    if NUM_HIDDEN == 2:
        h2 = tl.maximum(acc2 + tl.load(b2_ptr + j2)[None, :], 0.0)
        l0 = tl.sum(h2 * tl.load(w3_ptr + j2)[None, :], axis=1)
        l1 = tl.sum(h2 * tl.load(w3_ptr + HLP + j2)[None, :], axis=1)
        l2 = tl.sum(h2 * tl.load(w3_ptr + 2 * HLP + j2)[None, :], axis=1)
    l0 += tl.load(b3_ptr)
    l1 += tl.load(b3_ptr + 1)
    l2 += tl.load(b3_ptr + 2)
    _decide_store(l0, l1, l2, b, bmask, slot, thr_ptr, held_ptr, out_ptr, OUT_C)


@triton.jit(do_not_specialize=["n_rows", "R"])  # one compile for every batch size
def _mlp_kernel(
    ring_ptr, rows_ptr, slots_ptr, pos_ptr, n_rows, R,
    mean_ptr, istd_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, w3_ptr, b3_ptr,
    part_ptr, count_ptr, thr_ptr, held_ptr, out_ptr,
    F: tl.constexpr, W: tl.constexpr, H1P: tl.constexpr, H2P: tl.constexpr, HLP: tl.constexpr,
    NUM_HIDDEN: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, NCHUNK: tl.constexpr,
    KSPLIT: tl.constexpr, CPS: tl.constexpr, BLOCK_B: tl.constexpr, BK1: tl.constexpr,
    NEW_ROWS: tl.constexpr, HOST_IN: tl.constexpr, PREC: tl.constexpr, BF16: tl.constexpr,
    UPCAST: tl.constexpr, OUT_C: tl.constexpr, DENSE: tl.constexpr,
):
    NBLK: tl.constexpr = H1P // BN
    pid = tl.program_id(0)
    bt = tl.program_id(1)
    _mlp_partial(pid, bt, ring_ptr, rows_ptr, slots_ptr, pos_ptr, n_rows, R, mean_ptr, istd_ptr, w1_ptr, part_ptr,
                 F, W, H1P, BN, BK, NCHUNK, CPS, BLOCK_B, NEW_ROWS, HOST_IN, PREC, BF16, UPCAST, DENSE)
    if NEW_ROWS:
        if pid == 0:  # fused ring scatter (one program per batch tile writes)
            b = bt * BLOCK_B + tl.arange(0, BLOCK_B)
            bmask = b < n_rows
            slot = tl.load(slots_ptr + b, mask=bmask, other=0)
            pos = tl.load(pos_ptr + b, mask=bmask, other=0)
            base = slot.to(tl.int32) * R + (((pos % R) + R) % R).to(tl.int32)
            ff = tl.arange(0, BK)
            for f0 in range(0, F, BK):
                fi = f0 + ff
                m2 = bmask[:, None] & (fi < F)[None, :]
                v = tl.load(rows_ptr + b[:, None] * F + fi[None, :], mask=m2)
                tl.store(ring_ptr + base[:, None] * F + fi[None, :], v, mask=m2)
    tl.debug_barrier()  # all threads' partial stores are issued before the arrival below
    done = tl.atomic_add(count_ptr + bt, 1, sem="acq_rel")
    if done == NBLK * KSPLIT - 1:
        # last program of this batch tile (an atomic counter, no spinning: any grid size is safe)
        _mlp_finish(bt, slots_ptr, n_rows, part_ptr, b1_ptr, w2_ptr, b2_ptr, w3_ptr, b3_ptr, thr_ptr, held_ptr,
                    out_ptr, H1P, H2P, HLP, NUM_HIDDEN, KSPLIT, BLOCK_B, BK1, False, PREC, BF16, UPCAST, OUT_C)
        tl.atomic_xchg(count_ptr + bt, 0)  # ready for the next launch (kernel boundary orders it)


# --------------------------------------------------------------------------- weights


@dataclass(frozen=True)
class MlpParams:
    """Plain torch parameters in nn.Linear layout: weights[i] [out, in], biases[i] [out];
    the last pair is the head (3 outputs). mean, inv_std: [F]."""
    weights: tuple[torch.Tensor, ...]
    biases: tuple[torch.Tensor, ...]
    mean: torch.Tensor
    inv_std: torch.Tensor
    window: int

    @property
    def features(self) -> int:
        return self.mean.shape[0]

    def to(self, dtype: torch.dtype, device: torch.device | str | None = None) -> "MlpParams":
        cv = lambda t: t.detach().to(device=device if device is not None else t.device, dtype=dtype)  # noqa: E731
        return MlpParams(tuple(map(cv, self.weights)), tuple(map(cv, self.biases)), cv(self.mean),
                         cv(self.inv_std), self.window)


@dataclass(frozen=True)
class MlpWeights:
    """Packed device tensors for `mlp_step` (from `prepare_mlp_weights`)."""
    w1: torch.Tensor
    b1: torch.Tensor
    w2: torch.Tensor
    b2: torch.Tensor
    w3: torch.Tensor
    b3: torch.Tensor
    mean: torch.Tensor
    inv_std: torch.Tensor
    window: int
    features: int
    num_hidden: int
    h1p: int
    h2p: int
    hlp: int
    bn: int
    bk: int
    nchunk: int
    ksplit: int
    cps: int
    precision: str

    @property
    def programs_per_tile(self) -> int:
        return (self.h1p // self.bn) * self.ksplit


def _p2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def prepare_mlp_weights(params: MlpParams, *, precision: str = "fp32", device: torch.device | str = "cuda",
                        block_n: int = 32, block_k: int = 64, ksplit: int | None = None) -> MlpWeights:
    """Pack MlpParams for the kernel (start-up: allocates). block_n / block_k / ksplit set the
    first layer's split: (H1P / block_n) * ksplit programs per batch tile."""
    _, bf16 = dot_flags(precision)
    wdt = weight_dtype(precision)
    ws, bs = params.weights, params.biases
    num_hidden = len(ws) - 1
    if num_hidden not in (1, 2):
        raise ValueError(f"the fused MLP supports 1 or 2 hidden layers, got {num_hidden}")
    if ws[-1].shape[0] != 3:
        raise ValueError(f"the head must have 3 outputs, got {ws[-1].shape[0]}")
    f, window = params.features, params.window
    kin = window * f
    h1 = ws[0].shape[0]
    if ws[0].shape[1] != kin:
        raise ValueError(f"first layer takes {ws[0].shape[1]} inputs, the window gives {window}x{f}={kin}")
    if block_n < 16 or block_k < 16 or block_n & (block_n - 1) or block_k & (block_k - 1):
        raise ValueError("block_n and block_k must be powers of two >= 16 (tl.dot tiles)")
    h1p = max(_p2(h1), block_n)
    nblk = h1p // block_n
    nchunk = triton.cdiv(kin, block_k)
    if ksplit is None:  # aim at ~48 programs: enough SMs pulling W1 without tiny blocks
        ksplit = max(1, min(nchunk, 48 // nblk))
    ksplit = max(1, min(ksplit, nchunk))
    cps = triton.cdiv(nchunk, ksplit)
    ksplit = triton.cdiv(nchunk, cps)  # no program without a chunk

    f64 = torch.float64
    w1 = torch.zeros(nblk, nchunk * block_k, block_n, dtype=f64)
    w1t = torch.zeros(nchunk * block_k, h1p, dtype=f64)
    w1t[:kin, :h1] = ws[0].detach().to(f64).t().cpu()
    w1.copy_(w1t.view(nchunk * block_k, nblk, block_n).permute(1, 0, 2))
    b1 = torch.zeros(h1p, dtype=f64)
    b1[:h1] = bs[0].detach().to(f64).cpu()
    if num_hidden == 2:
        h2 = ws[1].shape[0]
        h2p = _p2(h2)
        w2 = torch.zeros(h1p, h2p, dtype=f64)
        w2[:h1, :h2] = ws[1].detach().to(f64).t().cpu()
        b2 = torch.zeros(h2p, dtype=f64)
        b2[:h2] = bs[1].detach().to(f64).cpu()
        hl, hlp = h2, h2p
    else:
        h2p = 16
        w2 = torch.zeros(1, dtype=f64)
        b2 = torch.zeros(1, dtype=f64)
        hl, hlp = h1, h1p
    w3 = torch.zeros(3, hlp, dtype=f64)
    w3[:, :hl] = ws[-1].detach().to(f64).cpu()
    dev = torch.device(device)
    f32 = lambda t: t.to(device=dev, dtype=torch.float32).contiguous()  # noqa: E731
    return MlpWeights(
        w1=w1.to(device=dev, dtype=wdt).contiguous(), b1=f32(b1),
        w2=w2.to(device=dev, dtype=wdt).contiguous(), b2=f32(b2), w3=f32(w3), b3=f32(bs[-1].detach()),
        mean=f32(params.mean.detach()), inv_std=f32(params.inv_std.detach()),
        window=window, features=f, num_hidden=num_hidden, h1p=h1p, h2p=h2p, hlp=hlp,
        bn=block_n, bk=block_k, nchunk=nchunk, ksplit=ksplit, cps=cps, precision=precision)


@dataclass(frozen=True)
class MlpWorkspace:
    """Per-model scratch, allocated once: layer-1 partial sums and the per-tile counters
    (zero between launches). Launches sharing a workspace must be stream-ordered."""
    part: torch.Tensor
    count: torch.Tensor
    max_batch: int


BLOCK_B_MAX = 32  # [BLOCK_B, BK] input tiles: 64 rows spill registers and overflow shared memory
BLOCK_B_MIN = 16  # tl.dot's smallest M


def alloc_mlp_workspace(w: MlpWeights, max_batch: int) -> MlpWorkspace:
    device = w.w1.device
    tiles = triton.cdiv(max_batch, BLOCK_B_MAX)
    return MlpWorkspace(part=torch.zeros(w.ksplit * max_batch * w.h1p, dtype=torch.float32, device=device),
                        count=torch.zeros(tiles, dtype=torch.int32, device=device), max_batch=max_batch)


# --------------------------------------------------------------------------- launcher


def mlp_step(w: MlpWeights, ws: MlpWorkspace, ring: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
             thresholds: torch.Tensor, held: torch.Tensor, out: torch.Tensor,
             rows: torch.Tensor | None = None, *, dense: bool = False, num_warps: int = 4) -> None:
    """One MLP step for a batch; writes out [n, OUT_COLS] and held[slots] in place.

    ring float32 [n_slots, R >= W, F]; slots, positions [n] (int32/int64; distinct slots
    except the padding sink); thresholds float32 [2] (threshold, hysteresis) and held int8 or int32
    [n_slots] on the device. With `rows` (float32 [n, F], the step's new rows at
    `positions`) the kernel also writes them into the ring; without, the ring must already
    hold them: the ring may be the pinned host feature ring itself (UVA), with slots, positions
    and out pinned too (volatile loads; the graph engine uses `dense` instead, below).
    dense: `ring` holds the batch's gathered windows [n, W, F] instead (entry b's oldest row first,
    zero rows before the instrument's first): the graph engine stages them on the device
    (runner/staging.py) so that the step reads no host memory; slots then index only held.
    No allocation, no host sync: safe to capture in a CUDA graph."""
    n = slots.shape[0]
    if (n > ws.max_batch or ring.shape[1] < w.window or ring.shape[2] != w.features
            or ring.numel() >= 2**31  # int32 offsets into the ring
            or (dense and (ring.shape[0] < n or ring.shape[1] != w.window or rows is not None))):
        raise ValueError(f"batch {n} (max {ws.max_batch}) or ring {tuple(ring.shape)} does not fit the model "
                         f"(W={w.window}, F={w.features})")
    prec, bf16 = dot_flags(w.precision)
    block_b = min(BLOCK_B_MAX, max(BLOCK_B_MIN, triton.next_power_of_2(n)))
    grid = (w.programs_per_tile, triton.cdiv(n, block_b))
    new_rows = rows is not None
    # a ring (or slots/positions) in pinned host memory, read through UVA: volatile loads
    host_in = any(t.device.type == "cpu" for t in (ring, slots, positions)) and not interpreting()
    _mlp_kernel[grid](
        ring, rows if new_rows else ring, slots, positions, n, ring.shape[1],
        w.mean, w.inv_std, w.w1, w.b1, w.w2, w.b2, w.w3, w.b3,
        ws.part, ws.count, thresholds, held, out,
        F=w.features, W=w.window, H1P=w.h1p, H2P=w.h2p, HLP=w.hlp, NUM_HIDDEN=w.num_hidden,
        BN=w.bn, BK=w.bk, NCHUNK=w.nchunk, KSPLIT=w.ksplit, CPS=w.cps, BLOCK_B=block_b,
        BK1=min(32, w.h1p), NEW_ROWS=new_rows, HOST_IN=host_in, PREC=prec, BF16=bf16, UPCAST=bf16 and interpreting(),
        OUT_C=OUT_COLS, DENSE=dense, num_warps=num_warps)


# --------------------------------------------------------------------------- reference


def mlp_logits_reference(params: MlpParams, windows: torch.Tensor) -> torch.Tensor:
    """Raw windows [n, W, F] -> logits [n, 3], in the params' dtype."""
    x = features_reference(windows.to(params.mean.dtype), params.mean, params.inv_std)
    h = x.reshape(x.shape[0], -1)
    for wt, bias in zip(params.weights[:-1], params.biases[:-1]):
        h = torch.relu(h @ wt.t() + bias)
    return h @ params.weights[-1].t() + params.biases[-1]


def mlp_step_reference(params: MlpParams, ring: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
                       thresholds: torch.Tensor, held: torch.Tensor, out: torch.Tensor,
                       rows: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as `mlp_step`, in plain torch (computes in the params' dtype)."""
    if rows is not None:
        ring_scatter_reference(ring, rows, slots, positions)
    windows = ring_gather_reference(ring, slots, positions, params.window)
    logits = mlp_logits_reference(params, windows)
    return decide_reference(logits, thresholds, held, slots, out)
