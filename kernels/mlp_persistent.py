"""Persistent window MLP behind a `RequestRing`: stateless on the GPU; each request's whole
windows arrive in the ring's device payload (copied there by DMA, kernels/persistent.py).

Per request, with the phases of `mlp.py` (`_mlp_partial`, `_mlp_finish`: one definition,
shared with the launched kernel):

    lead (program 0): poll the device header; publish
    every program (nb, ks): for each batch tile, its layer-1 block over input chunks
        ks*CPS.. of the entries' windows (payload rows [b, W, F], oldest first, zero raw
        rows before an instrument's first: the host gathered them) -> partial sums;
        arrive at a counter
    lead: wait for the counter, sum the partials in a fixed order, layers 2..3, decision ->
        result slot (pinned) -> release done

No recurrent state: the model only keeps the decision policy's held positions (`held`),
so a RESET request only zeroes held[slots] and the scheduler may conflate an instrument's
triggers. Every program arrives at the counter for every request (resets too), and the
lead publishes request r+2 only after the count says all of them are done with r+1 and it
has read r+1's partials: one mailbox and one partial buffer serve all. Weights: plain
loads, resident in each program's L1 after the first request (see lstm_persistent.py); the
window rows and partials: volatile loads, never pipelined (kernels/persistent.py, NUM_STAGES);
the grid is (H1P / block_n) x ksplit programs (mlp_small: 4 x 11 = 44 SMs), all resident.

`MlpPersistent(phases=True)` (with timing; a diagnostic build, never the engine's) also stamps the
broadcast, the lead's own partials, the count's completion and the last program's sight of the
mailbox (PHASE_STAMPS): where a request's device time goes, by
`tools/sweep_persistent_geometry.py --models mlp_small`. With phases off the compiled kernel is the
same instructions as without the stamps (PHASES and NST are constexprs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hft_infer.kernels.common import OUT_COLS, dot_flags, interpreting
from hft_infer.kernels.mlp import BLOCK_B_MAX, BLOCK_B_MIN, MlpWeights, _mlp_finish, _mlp_partial
from hft_infer.kernels.persistent import (
    LINE_C as _LINE,
    NUM_STAGES,
    RESET_C as _RESET,
    STEP_C as _STEP,
    PersistentKernel,
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
def _mlp_persistent_kernel(
    hdr_ptr, hdr_h_ptr, stop_ptr, pay_i_ptr, pay_f_ptr, pay_h_i_ptr, pay_h_f_ptr, out_h_ptr, ctrl_ptr, time_ptr,
    sync_ptr,
    mean_ptr, istd_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, w3_ptr, b3_ptr, part_ptr, thr_ptr, held_ptr,
    F: tl.constexpr, W: tl.constexpr, H1P: tl.constexpr, H2P: tl.constexpr, HLP: tl.constexpr,
    NUM_HIDDEN: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, NCHUNK: tl.constexpr,
    KSPLIT: tl.constexpr, CPS: tl.constexpr, BLOCK_B: tl.constexpr, BK1: tl.constexpr,
    NREQ: tl.constexpr, PW: tl.constexpr, ROWS_AT: tl.constexpr, MAX_B: tl.constexpr, INL: tl.constexpr,
    RW: tl.constexpr, RB: tl.constexpr, IB: tl.constexpr, NT: tl.constexpr,
    PREC: tl.constexpr, BF16: tl.constexpr, UPCAST: tl.constexpr, OUT_C: tl.constexpr,
    TIMING: tl.constexpr, TSLOTS: tl.constexpr, NST: tl.constexpr, PHASES: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    lead = pid == 0
    cnt_ptr = sync_ptr + 2 * _LINE
    r = tl.load(sync_ptr, volatile=True) * 0  # int64 zero: requests served
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
                if pid == nprog - 1:
                    _stamp(time_ptr, (r % TSLOTS) * NST + 5, TIMING)
        slots_ptr, pos_ptr, rows_ptr = _payload(pay_i_ptr, pay_f_ptr, r, NREQ, PW, MAX_B, ROWS_AT)
        if kind == _STEP:
            for bt in range(0, tl.cdiv(n, BLOCK_B)):
                # dense windows (R = W): rows_ptr holds entry b's rows at b*W..b*W+W-1
                _mlp_partial(pid, bt, rows_ptr, rows_ptr, slots_ptr, pos_ptr, n, W, mean_ptr, istd_ptr,
                             w1_ptr, part_ptr, F, W, H1P, BN, BK, NCHUNK, CPS, BLOCK_B, False, True,
                             PREC, BF16, UPCAST, True)
        if (kind == _STEP) | (kind == _RESET):
            if PHASES:
                if lead:
                    _stamp(time_ptr, (r % TSLOTS) * NST + 3, TIMING)
            # every program arrives for every request, resets included: the lead publishes the
            # next request only once all of them have read this one's mailbox
            _arrive(cnt_ptr)
            if lead:
                _wait_count(cnt_ptr, nprog * (r + 1))
                if PHASES:
                    _stamp(time_ptr, (r % TSLOTS) * NST + 4, TIMING)
                if kind == _STEP:
                    o = out_h_ptr + (r % NREQ) * (MAX_B * OUT_C)
                    for bt in range(0, tl.cdiv(n, BLOCK_B)):
                        _mlp_finish(bt, slots_ptr, n, part_ptr, b1_ptr, w2_ptr, b2_ptr, w3_ptr, b3_ptr, thr_ptr,
                                    held_ptr, o, H1P, H2P, HLP, NUM_HIDDEN, KSPLIT, BLOCK_B, BK1, True,
                                    PREC, BF16, UPCAST, OUT_C)
                else:  # the only state: the held positions
                    hb = tl.arange(0, 16)
                    for b0 in range(0, n, 16):
                        bb = b0 + hb
                        hs = tl.load(slots_ptr + bb, mask=bb < n, other=0, volatile=True)
                        tl.store(held_ptr + hs, tl.zeros([16], dtype=tl.int32).to(held_ptr.dtype.element_ty),
                                 mask=bb < n)
                _stamp(time_ptr, (r % TSLOTS) * NST + 1, TIMING)
                _release_done(ctrl_ptr, r + 1)
        if (kind == _STEP) | (kind == _RESET):
            r += 1
        else:
            running = 0


PHASE_STAMPS = ("detect", "done", "broadcast", "lead's partials", "all arrived", "last program sees it")
"""The names of a request's device stamps in a `phases` build, in their order in `times`
(PersistentKernel.device_stamps_ns): the lead's -- the request seen, the answer released, the
request published, its own layer-1 partials done, every program's arrival seen (then the finish:
layers 2..3 and the decision, up to "done") -- then the last program's sight of the mailbox."""


NUM_WARPS = 4
"""The engine's warps a program, with batch tiles of BLOCK_B_MIN rows (wave 46, H100, mlp_small device
µs at batch 1 / 8 / 64 -- 4 warps, 16-row tiles: 8.3 / 9.4 / 35.0; 8 warps, 16: 9.1 / 10.3 / 38.4;
8 warps, 32: 11.6 / 13.5 / 35.1; 4 warps, 32 (the build before): 14.2 / 16.3 / 39.7). A small request
pays for a whole tile's products: 16 rows halve them at batch 1, and a large one loops over more
tiles for about the same time."""


class MlpPersistent(PersistentKernel):
    """The window MLP served by a persistent kernel (host API: `RequestRing`, as LstmPersistent).

    Each entry's window goes in the request's rows[b] ([W, F], oldest first, zero rows before
    the instrument's first). thresholds float32 [2], held int8/int32 [n_slots] on the device.
    block_b: the rows of a batch tile (a power of two, BLOCK_B_MIN..BLOCK_B_MAX; default
    BLOCK_B_MIN: see NUM_WARPS) -- a larger request loops over tiles."""

    def __init__(self, w: MlpWeights, ring: RequestRing, thresholds: torch.Tensor, held: torch.Tensor, *,
                 num_warps: int = NUM_WARPS, block_b: int | None = None, timing: bool = False,
                 phases: bool = False) -> None:
        dev = w.w1.device
        # phases (with timing): the lead also stamps the broadcast, its own partials and the count's
        # completion, and the last program the broadcast's arrival (PHASE_STAMPS); a diagnostic build
        # (tools/sweep_persistent_geometry.py), never the engine's
        super().__init__(ring, dev, timing=timing, stamps=len(PHASE_STAMPS) if phases else 2)
        self.phases = phases and self.timing
        if ring.rows_per_entry != w.window or ring.width != w.features:
            raise ValueError(f"the ring carries {ring.rows_per_entry} rows of {ring.width} per entry; the MLP "
                             f"reads windows of {w.window} rows of {w.features}")
        if interpreting() and w.programs_per_tile > 1:
            raise ValueError("the interpreter runs programs one after another: block_n >= hidden, ksplit=1 there")
        self.w = w
        self.thresholds, self.held = thresholds, held
        self.num_warps = num_warps
        max_batch = ring.max_batch
        if block_b is not None and (block_b < BLOCK_B_MIN or block_b > BLOCK_B_MAX or block_b & (block_b - 1)):
            raise ValueError(f"block_b {block_b}: a power of two from {BLOCK_B_MIN} to {BLOCK_B_MAX}")
        self.block_b = block_b or BLOCK_B_MIN
        self.part = torch.zeros(w.ksplit * max_batch * w.h1p, dtype=torch.float32, device=dev)

    @property
    def programs(self) -> int:
        return self.w.programs_per_tile

    def _launch_spec(self) -> tuple:
        w = self.w
        prec, bf16 = dot_flags(w.precision)
        return (_mlp_persistent_kernel, (w.programs_per_tile,),
                (*self.ring_args(), self.times, self.sync,
                 w.mean, w.inv_std, w.w1, w.b1, w.w2, w.b2, w.w3, w.b3, self.part, self.thresholds, self.held),
                dict(F=w.features, W=w.window, H1P=w.h1p, H2P=w.h2p, HLP=w.hlp, NUM_HIDDEN=w.num_hidden,
                     BN=w.bn, BK=w.bk, NCHUNK=w.nchunk, KSPLIT=w.ksplit, CPS=w.cps, BLOCK_B=self.block_b,
                     BK1=min(32, w.h1p), **self.ring_consts(),
                     PREC=prec, BF16=bf16, UPCAST=bf16 and interpreting(), OUT_C=OUT_COLS,
                     TIMING=self.timing, TSLOTS=self.time_slots, NST=self.stamps, PHASES=self.phases,
                     num_warps=self.num_warps,
                     num_stages=NUM_STAGES))

    def _zero_state(self) -> None:
        self.held.zero_()
