"""Persistent window MLP behind a `RequestRing`: stateless on the GPU, the whole window read
straight from the pinned host feature ring.

Per request, with the phases of `mlp.py` (`_mlp_partial`, `_mlp_finish`: one definition,
shared with the launched kernel):

    lead (program 0): poll the ring; copy slots/positions into device memory; publish
    every program (nb, ks): for each batch tile, its layer-1 block over input chunks
        ks*CPS.. of rows p-W+1..p read from ring_h[slot, . mod depth] (volatile loads over
        PCIe; rows before position 0 are zero raw rows) -> partial sums; arrive at a counter
    lead: wait for the counter, sum the partials in a fixed order, layers 2..3, decision ->
        result slot (pinned) -> release done

No device ring and no recurrent state: the model only keeps the decision policy's held
positions (`held`), so a RESET request only zeroes held[slots] and the scheduler may
conflate an instrument's triggers. Every program arrives at the counter for every request
(resets too), and the lead publishes request r+2 only after the count says all of them are
done with r+1 and it has read r+1's partials: one mailbox and one partial buffer serve all. Weights: plain loads,
resident in each program's L1 after the first request (see lstm_persistent.py); the
grid is (H1P / block_n) x ksplit programs (mlp_small: 4 x 11 = 44 SMs), all resident.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hft_infer.kernels.common import OUT_COLS, dot_flags, interpreting
from hft_infer.kernels.mlp import BLOCK_B_MAX, MlpWeights, _mlp_finish, _mlp_partial
from hft_infer.kernels.persistent import (
    LINE_C as _LINE,
    RESET_C as _RESET,
    STEP_C as _STEP,
    PersistentKernel,
    RequestRing,
    _arrive,
    _broadcast,
    _copy_entries,
    _lead_wait_request,
    _release_done,
    _stamp,
    _wait_broadcast,
    _wait_count,
)


@triton.jit(do_not_specialize=["R"])
def _mlp_persistent_kernel(
    req_ptr, ctrl_ptr, out_h_ptr, time_ptr, ring_h_ptr, R, dslots_ptr, dpos_ptr, sync_ptr,
    mean_ptr, istd_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, w3_ptr, b3_ptr, part_ptr, thr_ptr, held_ptr,
    F: tl.constexpr, W: tl.constexpr, H1P: tl.constexpr, H2P: tl.constexpr, HLP: tl.constexpr,
    NUM_HIDDEN: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, NCHUNK: tl.constexpr,
    KSPLIT: tl.constexpr, CPS: tl.constexpr, BLOCK_B: tl.constexpr, BK1: tl.constexpr,
    REQ_W: tl.constexpr, NREQ: tl.constexpr, MAX_B: tl.constexpr,
    PREC: tl.constexpr, BF16: tl.constexpr, UPCAST: tl.constexpr, OUT_C: tl.constexpr,
    TIMING: tl.constexpr, TSLOTS: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    lead = pid == 0
    cnt_ptr = sync_ptr + 2 * _LINE
    r = tl.load(sync_ptr, volatile=True) * 0  # int64 zero: requests served
    running = 1
    while running == 1:
        if lead:
            kind, n, slot0, pos0, base = _lead_wait_request(req_ptr, ctrl_ptr, r, REQ_W, NREQ)
            if (kind == _STEP) | (kind == _RESET):
                _stamp(time_ptr, (r % TSLOTS) * 2, TIMING)
                _copy_entries(base, n, slot0, pos0, dslots_ptr, dpos_ptr, MAX_B, 16)
            _broadcast(sync_ptr, r, kind, n)
        else:
            kind, n = _wait_broadcast(sync_ptr, r)
        if kind == _STEP:
            for bt in range(0, tl.cdiv(n, BLOCK_B)):
                _mlp_partial(pid, bt, ring_h_ptr, ring_h_ptr, dslots_ptr, dpos_ptr, n, R, mean_ptr, istd_ptr,
                             w1_ptr, part_ptr, F, W, H1P, BN, BK, NCHUNK, CPS, BLOCK_B, False, True,
                             PREC, BF16, UPCAST, False)
        if (kind == _STEP) | (kind == _RESET):
            # every program arrives for every request, resets included: the lead publishes the
            # next request only once all of them have read this one's mailbox
            _arrive(cnt_ptr)
            if lead:
                _wait_count(cnt_ptr, nprog * (r + 1))
                if kind == _STEP:
                    o = out_h_ptr + (r % NREQ) * (MAX_B * OUT_C)
                    for bt in range(0, tl.cdiv(n, BLOCK_B)):
                        _mlp_finish(bt, dslots_ptr, n, part_ptr, b1_ptr, w2_ptr, b2_ptr, w3_ptr, b3_ptr, thr_ptr,
                                    held_ptr, o, H1P, H2P, HLP, NUM_HIDDEN, KSPLIT, BLOCK_B, BK1, True,
                                    PREC, BF16, UPCAST, OUT_C)
                else:  # the only state: the held positions
                    hb = tl.arange(0, 16)
                    for b0 in range(0, n, 16):
                        bb = b0 + hb
                        hs = tl.load(dslots_ptr + bb, mask=bb < n, other=0, volatile=True)
                        tl.store(held_ptr + hs, tl.zeros([16], dtype=tl.int32).to(held_ptr.dtype.element_ty),
                                 mask=bb < n)
                _stamp(time_ptr, (r % TSLOTS) * 2 + 1, TIMING)
                _release_done(ctrl_ptr, r + 1)
        if (kind == _STEP) | (kind == _RESET):
            r += 1
        else:
            running = 0


class MlpPersistent(PersistentKernel):
    """The window MLP served by a persistent kernel (host API: `RequestRing`, as LstmPersistent).

    ring_h: the host feature ring float32 [n_slots + 1, depth >= W, F] (pinned on a GPU),
    read in place; thresholds float32 [2], held int8/int32 [n_slots + 1] on the device."""

    def __init__(self, w: MlpWeights, ring: RequestRing, ring_h: torch.Tensor, thresholds: torch.Tensor,
                 held: torch.Tensor, *, num_warps: int = 4, timing: bool = False) -> None:
        dev = w.w1.device
        super().__init__(ring, dev, timing=timing)
        if (ring_h.dim() != 3 or ring_h.shape[1] < w.window or ring_h.shape[2] != w.features
                or ring_h.numel() >= 2**31):  # int32 offsets into the ring
            raise ValueError(f"ring_h {tuple(ring_h.shape)} does not fit the model (W={w.window}, F={w.features})")
        if interpreting() and w.programs_per_tile > 1:
            raise ValueError("the interpreter runs programs one after another: block_n >= hidden, ksplit=1 there")
        self.w = w
        self.ring_h, self.thresholds, self.held = ring_h, thresholds, held
        self.num_warps = num_warps
        max_batch = ring.max_batch
        self.block_b = min(BLOCK_B_MAX, max(16, triton.next_power_of_2(max_batch)))
        self.part = torch.zeros(w.ksplit * max_batch * w.h1p, dtype=torch.float32, device=dev)
        self.dslots = torch.zeros(max_batch, dtype=torch.int64, device=dev)
        self.dpos = torch.zeros(max_batch, dtype=torch.int64, device=dev)

    @property
    def programs(self) -> int:
        return self.w.programs_per_tile

    def _launch(self) -> None:
        w, ring = self.w, self.ring
        prec, bf16 = dot_flags(w.precision)
        _mlp_persistent_kernel[(w.programs_per_tile,)](
            ring.req, ring.ctrl, ring.out, self.times, self.ring_h, self.ring_h.shape[1],
            self.dslots, self.dpos, self.sync,
            w.mean, w.inv_std, w.w1, w.b1, w.w2, w.b2, w.w3, w.b3, self.part, self.thresholds, self.held,
            F=w.features, W=w.window, H1P=w.h1p, H2P=w.h2p, HLP=w.hlp, NUM_HIDDEN=w.num_hidden,
            BN=w.bn, BK=w.bk, NCHUNK=w.nchunk, KSPLIT=w.ksplit, CPS=w.cps, BLOCK_B=self.block_b,
            BK1=min(32, w.h1p), REQ_W=ring.req_words, NREQ=ring.n_requests, MAX_B=ring.max_batch,
            PREC=prec, BF16=bf16, UPCAST=bf16 and interpreting(), OUT_C=OUT_COLS,
            TIMING=self.timing, TSLOTS=self.time_slots, num_warps=self.num_warps)

    def _zero_state(self) -> None:
        self.held.zero_()
