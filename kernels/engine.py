"""Persistent engine building block: the window-mode LSTM step served by a kernel that
never exits, driven through flags in pinned host memory (no launch per step).

Host side (one thread):

    eng = LstmWindowEngine(w, ws, h, c, thresholds, held, max_batch=64)
    eng.start()                      # launches the kernel on its own stream
    eng.rows[:n] = ...; eng.slots[:n] = ...; eng.positions[:n] = ...   # pinned staging
    eng.submit(n)                    # release: data first, then the request number
    out = eng.wait()                 # spins on the done flag; out[:n] pinned, [n, OUT_COLS]
    eng.stop()                       # stop flag; the kernel exits within one poll

Kernel side: program (0, 0) polls the request number (atomic add of 0,
acquire, system scope), copies the staged batch from pinned memory into a
device double buffer (volatile loads: the host rewrites the same addresses
between requests), and publishes the command in device memory; a grid barrier
releases every program; they run the phases of `lstm.py` (grid barrier between
layers); program (0, 0) writes the decisions straight into pinned `out` and
releases the done flag (atomic exchange, release, system scope). The device
staging is double-buffered by request parity: a program still copying the
last layer's h reads the previous buffer while program (0, 0) fills the next.

Requirements: all programs resident for the kernel's whole life (it holds
NB x split SMs until stopped: size `max_programs` of the workspace to leave
the rest of the GPU to other work); the engine's stream must not be the legacy
default stream, and nothing may synchronise the whole device while it runs
(torch.cuda.synchronize() would wait forever); compile and allocate before
start(). Host stores are ordered data-then-flag by x86's store order (an Arm
host needs a release store). Ordering of request n+1 after n is the host's
job: submit, wait, then submit again.
"""

from __future__ import annotations

import time

import torch
import triton
import triton.language as tl

from hft_infer.kernels.common import OUT_COLS, _grid_barrier, dot_flags, interpreting
from hft_infer.kernels.lstm import LstmWeights, LstmWorkspace, _lstm_copy_h, _lstm_head, _lstm_layer

CTRL_REQ, CTRL_DONE, CTRL_STOP, CTRL_N = 0, 1, 2, 3
"""Slots of the pinned int32 control block: request number (host), done number (kernel),
stop flag (host), batch size of the request (host)."""
_REQ = tl.constexpr(CTRL_REQ)
_DONE = tl.constexpr(CTRL_DONE)
_STOP = tl.constexpr(CTRL_STOP)
_N = tl.constexpr(CTRL_N)


@triton.jit
def _lstm_engine_kernel(
    ctrl_ptr, rows_h_ptr, slots_h_ptr, pos_h_ptr, out_h_ptr,
    rows_ptr, slots_ptr, pos_ptr, max_batch, ring_ptr, R,
    mean_ptr, istd_ptr, wx0_ptr, wx_ptr, wh_ptr, bias_ptr, hw_ptr, hb_ptr,
    h_ptr, c_ptr, scratch_ptr, xp_ptr, sync_ptr, thr_ptr, held_ptr,
    F: tl.constexpr, H: tl.constexpr, W: tl.constexpr, L: tl.constexpr, F_PAD: tl.constexpr,
    KH: tl.constexpr, BLOCK_K: tl.constexpr, BH: tl.constexpr, NB: tl.constexpr, BLOCK_M: tl.constexpr,
    WRITE_RING: tl.constexpr, PREC: tl.constexpr, BF16: tl.constexpr, UPCAST: tl.constexpr,
    HB: tl.constexpr, OUT_C: tl.constexpr,
):
    j = tl.program_id(0)
    ms = tl.program_id(1)
    n_ms = tl.num_programs(1)
    lead = (j == 0) & (ms == 0)
    ff = tl.arange(0, F_PAD)
    hb = tl.arange(0, HB)
    seq = tl.load(ctrl_ptr + _DONE, volatile=True)  # the host zeroes the flags before start()
    running = seq * 0 + 1
    while running == 1:
        if lead:
            cur = tl.atomic_add(ctrl_ptr + _REQ, 0, sem="acquire", scope="sys")
            stop = tl.atomic_add(ctrl_ptr + _STOP, 0, sem="acquire", scope="sys")
            while (cur == seq) & (stop == 0):
                cur = tl.atomic_add(ctrl_ptr + _REQ, 0, sem="acquire", scope="sys")
                stop = tl.atomic_add(ctrl_ptr + _STOP, 0, sem="acquire", scope="sys")
            req = tl.where(cur != seq, cur, -1)  # -1: stop (a pending request is served first)
            nreq = tl.load(ctrl_ptr + _N, volatile=True)
            par0 = (req & 1) * max_batch
            for b0 in range(0, nreq, HB):  # staged batch: pinned host memory -> device (double buffer)
                b = b0 + hb
                bm = b < nreq
                m2 = bm[:, None] & (ff < F)[None, :]
                v = tl.load(rows_h_ptr + b[:, None] * F + ff[None, :], mask=m2, volatile=True)
                tl.store(rows_ptr + (par0 + b)[:, None] * F + ff[None, :], v, mask=m2)
                tl.store(slots_ptr + par0 + b, tl.load(slots_h_ptr + b, mask=bm, volatile=True), mask=bm)
                tl.store(pos_ptr + par0 + b, tl.load(pos_h_ptr + b, mask=bm, volatile=True), mask=bm)
            tl.store(sync_ptr + 2, req)
            tl.store(sync_ptr + 3, nreq)
        _grid_barrier(sync_ptr, NB * n_ms)
        cmd = tl.load(sync_ptr + 2, volatile=True)
        n = tl.load(sync_ptr + 3, volatile=True)
        if cmd >= 0:
            par = (cmd & 1) * max_batch
            rows_b = rows_ptr + par * F
            slots_b = slots_ptr + par
            pos_b = pos_ptr + par
            if WRITE_RING:
                if lead:
                    for b0 in range(0, n, HB):
                        b = b0 + hb
                        bm = b < n
                        slot = tl.load(slots_b + b, mask=bm, other=0).to(tl.int64)
                        p = tl.load(pos_b + b, mask=bm, other=0).to(tl.int64)
                        m2 = bm[:, None] & (ff < F)[None, :]
                        v = tl.load(rows_b + b[:, None] * F + ff[None, :], mask=m2)
                        tl.store(ring_ptr + (slot * R + ((p % R) + R) % R)[:, None] * F + ff[None, :], v, mask=m2)
            for ph in tl.static_range(0, L + 1):
                if ph > 0:
                    _lstm_copy_h(ph - 1, j, ms, n_ms, n, slots_b, pos_b, h_ptr, scratch_ptr,
                                 H, W, L, BH, BLOCK_M, True)
                if ph < L:
                    _lstm_layer(ph, j, ms, n_ms, n, rows_b, slots_b, pos_b, mean_ptr, istd_ptr,
                                wx0_ptr, wx_ptr, wh_ptr, bias_ptr, h_ptr, c_ptr, scratch_ptr, xp_ptr,
                                F, H, W, L, F_PAD, KH, BLOCK_K, BH, NB, BLOCK_M, True, PREC, BF16, UPCAST)
                    _grid_barrier(sync_ptr, NB * n_ms)
                else:
                    if lead:
                        _lstm_head(n, slots_b, pos_b, scratch_ptr, hw_ptr, hb_ptr, thr_ptr, held_ptr, out_h_ptr,
                                   H, W, L, KH, BLOCK_K, True, HB, OUT_C)
            if lead:
                tl.debug_barrier()  # every thread's decision stores are issued before the release
                tl.atomic_xchg(ctrl_ptr + _DONE, cmd, sem="release", scope="sys")
        running = (cmd >= 0).to(tl.int32)
        seq = tl.where(cmd >= 0, cmd, seq)


class LstmWindowEngine:
    """Host side of the persistent window-LSTM engine (see the module docstring)."""

    def __init__(self, w: LstmWeights, ws: LstmWorkspace, h: torch.Tensor, c: torch.Tensor,
                 thresholds: torch.Tensor, held: torch.Tensor, *, max_batch: int,
                 ring: torch.Tensor | None = None, num_warps: int = 4) -> None:
        dev = w.wh.device
        window = h.shape[2]
        if max_batch > ws.max_batch or ws.states != window:
            raise ValueError(f"workspace for batch {ws.max_batch} x {ws.states} states, engine wants "
                             f"{max_batch} x {window}")
        pin = dev.type == "cuda"
        mk = lambda *shape, dtype: (torch.zeros(*shape, dtype=dtype).pin_memory() if pin  # noqa: E731
                                    else torch.zeros(*shape, dtype=dtype))
        self.ctrl = mk(4, dtype=torch.int32)
        self.rows = mk(max_batch, w.features, dtype=torch.float32)
        self.slots = mk(max_batch, dtype=torch.int32)
        self.positions = mk(max_batch, dtype=torch.int32)
        self.out = mk(max_batch, OUT_COLS, dtype=torch.float32)
        self._ctrl_np = self.ctrl.numpy()
        self._dev_rows = torch.zeros(2 * max_batch, w.features, dtype=torch.float32, device=dev)
        self._dev_slots = torch.zeros(2 * max_batch, dtype=torch.int32, device=dev)
        self._dev_pos = torch.zeros(2 * max_batch, dtype=torch.int32, device=dev)
        self.w, self.ws, self.h, self.c = w, ws, h, c
        self.thresholds, self.held, self.ring = thresholds, held, ring
        self.max_batch, self.window, self.num_warps = max_batch, window, num_warps
        self.seq = 0
        self._n = 0
        self.stream = torch.cuda.Stream(device=dev) if pin else None
        # tiles sized for the largest batch: the grid is fixed for the kernel's life
        self.block_m = min(64, max(16, triton.next_power_of_2(triton.cdiv(max_batch * window, ws.max_split))))
        self.split = min(ws.max_split, triton.cdiv(max_batch * window, self.block_m))
        if interpreting():
            if w.n_blocks > 1:
                raise ValueError("under the interpreter the engine runs one program: block_h >= hidden")
            self.split = 1

    @property
    def programs(self) -> int:
        return self.w.n_blocks * self.split

    def start(self) -> None:
        """Launch the kernel (returns at once on a GPU; the interpreter runs it to the end,
        so there the requests and the stop flag must be set before)."""
        w = self.w
        prec, bf16 = dot_flags(w.precision)
        ring = self.ring
        args = (self.ctrl, self.rows, self.slots, self.positions, self.out,
                self._dev_rows, self._dev_slots, self._dev_pos, self.max_batch,
                ring if ring is not None else self._dev_rows, ring.shape[1] if ring is not None else 1,
                w.mean, w.inv_std, w.wx0, w.wx, w.wh, w.bias, w.head_w, w.head_b,
                self.h, self.c, self.ws.scratch, self.ws.xp, self.ws.sync, self.thresholds, self.held)
        kw = dict(F=w.features, H=w.hidden, W=self.window, L=w.layers, F_PAD=w.f_pad, KH=w.kh,
                  BLOCK_K=w.block_k, BH=w.block_h, NB=w.n_blocks, BLOCK_M=self.block_m, WRITE_RING=ring is not None,
                  PREC=prec, BF16=bf16, UPCAST=bf16 and interpreting(), HB=16, OUT_C=OUT_COLS,
                  num_warps=self.num_warps)
        grid = (w.n_blocks, self.split)
        if self.stream is None:
            _lstm_engine_kernel[grid](*args, **kw)
        else:
            with torch.cuda.stream(self.stream):
                _lstm_engine_kernel[grid](*args, **kw)

    def precompile(self) -> None:
        """Compile and load the kernel without serving: a run started with the stop flag
        raised exits at once. Call before the real `start()`, since nothing may wait on
        the GPU (a compile, a synchronize) while the engine kernel spins."""
        self.reset_flags()
        self._ctrl_np[CTRL_STOP] = 1
        self.start()
        self.stop()
        if self.stream is not None:
            torch.cuda.synchronize()
        self.reset_flags()

    def submit(self, n: int) -> None:
        """Hand the staged rows[:n], slots[:n], positions[:n] to the kernel."""
        if not 0 < n <= self.max_batch:  # cold: the device staging holds max_batch rows
            raise ValueError(f"batch of {n} outside 1..{self.max_batch}")
        self._ctrl_np[CTRL_N] = n
        self.seq += 1
        self._ctrl_np[CTRL_REQ] = self.seq  # after the data: x86 keeps stores in order
        self._n = n

    def done(self) -> bool:
        """Has the kernel answered the last request?"""
        return self._ctrl_np[CTRL_DONE] == self.seq

    def wait(self, timeout_s: float | None = None) -> torch.Tensor:
        """Spin until the kernel has answered the last request; out[:n] (pinned, reused)."""
        ctrl = self._ctrl_np
        seq = self.seq
        if timeout_s is None:
            while ctrl[CTRL_DONE] != seq:
                pass
        else:
            deadline = time.perf_counter() + timeout_s
            while ctrl[CTRL_DONE] != seq:
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"engine did not answer request {seq} within {timeout_s} s")
        return self.out[: self._n]

    def stop(self, timeout_s: float = 5.0) -> None:
        """Raise the stop flag and wait for the kernel to exit."""
        self._ctrl_np[CTRL_STOP] = 1
        if self.stream is not None:
            ev = torch.cuda.Event()
            ev.record(self.stream)
            deadline = time.perf_counter() + timeout_s
            while not ev.query():
                if time.perf_counter() > deadline:
                    raise TimeoutError("engine kernel did not stop")
                time.sleep(1e-4)

    def reset_flags(self) -> None:
        """Zero the flags (only while no engine kernel runs)."""
        self._ctrl_np[:] = 0
        self.seq = 0

