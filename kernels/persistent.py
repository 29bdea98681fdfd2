"""(~460 lines: the ring's host API, its device half and the floor kernel are one protocol,
kept in one file so that the word layout is defined once.)

Host side shared by every persistent model kernel: the request ring in pinned memory,
the kernel's life cycle (start / stop / precompile / reset), the device-side polling and
synchronisation helpers, and the trivial floor kernel (flag in, flag out).

Request ring (`RequestRing`), all pinned host memory, R >= 2 slots (default 4):

    req  int64 [R, REQ_W]   slot k: HDR, E_SLOT, E_POS, -, slots[max_batch], positions[max_batch]
    out  float32 [R, max_batch, OUT_COLS]   result slot k (score, action, 3 logits)
    ctrl int64 [32]         ctrl[DONE] (kernel writes), ctrl[STOP] (host writes), 128 B apart

Request seq s (1, 2, 3, ...) uses slot k = (s - 1) % R. The hot loop fills
`slots[:n]` and `positions[:n]` of the slot in place (numpy views, zero copies),
then `submit(n, kind)` writes, in this order: E_SLOT = tag | slots[0], E_POS =
tag | positions[0] (tag = s mod 2^15 in bits 48..62, values in 48 bits, two's
complement), HDR = s mod 2^32 | n << 32 | kind << 48. x86 keeps stores in order
(data before flag), so a kernel that reads HDR == s sees every word written
before it. The express words let the kernel answer a batch of one without a
second PCIe round trip: it reads HDR, E_SLOT and E_POS in one poll and accepts
the request only when all three carry s, since each 8-byte word is written and
read whole, no ordering between the three reads is needed. Entries 1..n-1 are
read after HDR was seen (a dependent round trip, only for n > 1).

The kernel serves requests strictly in order, writes result slot k, then
releases ctrl[DONE] = s (atomic exchange, release, system scope). So done(s) is
ctrl[DONE] >= s, and up to R requests may be in flight. A RESET request zeroes
the model state of slots[:n] in order with the steps around it.

Device side (`_lead_wait_request`, `_broadcast`, `_wait_broadcast`, `_arrive`,
`_wait_count`): one lead program polls the ring with volatile loads (never
acquire operations: on sm_90 an acquire load is `LDG.STRONG` + `CCTL.IVALL`,
which would wipe the weights each program keeps in its L1), copies the request
into device memory and publishes it with a release store; the other programs
spin on that mailbox in L2. Phases meet at monotonic int64 counters (each
program adds 1 with release semantics; waiters spin with volatile loads until
the count reaches programs x (steps + 1)). Data other programs wrote is read
with volatile loads (L2, issued after the counter was seen: the spin loop's exit
depends on it and GPUs do not issue loads speculatively), so nothing stale can
come from L1.

Platform: data-before-flag relies on x86-64 store order (TSO); `persistent_supported()`
refuses any other host. Nothing may synchronise the whole device while a persistent
kernel spins (torch.cuda.synchronize() would wait forever): compile with
`precompile()` and allocate before `start()`.
"""

from __future__ import annotations

import platform
import time

import numpy as np
import torch
import triton
import triton.language as tl

from hft_infer.kernels.common import OUT_COLS, interpreting

KIND_STEP, KIND_RESET = 0, 1
"""Request kinds: a model step over slots[:n] at positions[:n]; zero the state of slots[:n]."""
KIND_STOP = 2  # device-internal: the lead saw the stop flag with no request pending

HDR, E_SLOT, E_POS = 0, 1, 2
SLOTS_AT = 4
CTRL_DONE, CTRL_STOP = 0, 16
TAG_BITS = 15  # bits 48..62 of the express words: the int64 stays non-negative
VAL_BITS = 48

# device sync block (int64): mailbox words, then counters on their own 128-byte lines
MB_REQ, MB_N, MB_KIND = 0, 1, 2
LINE = 16  # int64 per 128-byte line
CNT_DONE = 1  # line index of the completion counter; phase counters follow
SYNC_LINES = 16

_HDR = tl.constexpr(HDR)
_E_SLOT = tl.constexpr(E_SLOT)
_E_POS = tl.constexpr(E_POS)
_SLOTS_AT = tl.constexpr(SLOTS_AT)
_CTRL_DONE = tl.constexpr(CTRL_DONE)
_CTRL_STOP = tl.constexpr(CTRL_STOP)
_MB_REQ = tl.constexpr(MB_REQ)
_MB_N = tl.constexpr(MB_N)
_MB_KIND = tl.constexpr(MB_KIND)
_KIND_STOP = tl.constexpr(KIND_STOP)
# the same words as constexprs for the model kernels' own loops (lstm_persistent, mlp_persistent)
STEP_C = tl.constexpr(KIND_STEP)
RESET_C = tl.constexpr(KIND_RESET)
LINE_C = tl.constexpr(LINE)
CNT_DONE_C = tl.constexpr(CNT_DONE)


def persistent_supported(device: torch.device | str | None = None) -> tuple[bool, str]:
    """(True, "") where a persistent kernel may serve requests; else (False, why)."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return False, (f"the request ring relies on x86-64 store order (data before flag); this host is "
                       f"{machine}: use the graph engine")
    if interpreting():
        return True, ""
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type != "cuda":
        return False, f"persistent kernels need a CUDA device, got {dev}"
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    return True, ""


def _req_words(max_batch: int) -> int:
    return triton.cdiv(SLOTS_AT + 2 * max_batch, LINE) * LINE  # whole 128-byte lines per slot


def _alloc(shape, dtype, pin: bool) -> torch.Tensor:
    t = torch.zeros(shape, dtype=dtype)
    return t.pin_memory() if pin else t


class RequestRing:
    """R request slots and R result slots in pinned host memory (see the module docstring).

    Host API (one thread; nothing allocates):
        k = ring.next_slot; slots, positions = ring.request_views(k)   # fill [:n] in place
        seq = ring.submit(n, KIND_STEP)
        ring.done(seq) / ring.poll() -> answered count
        ring.outputs(k)[:n]  (valid from done(seq) until slot k is submitted again)
    """

    def __init__(self, max_batch: int, *, n_requests: int = 4, pin: bool | None = None) -> None:
        if n_requests < 2 or n_requests >= 1 << TAG_BITS:
            raise ValueError(f"n_requests must be in 2..{(1 << TAG_BITS) - 1}, got {n_requests}")
        if max_batch < 1 or max_batch >= 1 << 16:
            raise ValueError(f"max_batch must be in 1..65535, got {max_batch}")
        if pin is None:
            pin = torch.cuda.is_available() and not interpreting()
        self.max_batch = max_batch
        self.n_requests = n_requests
        self.req_words = _req_words(max_batch)
        self.req = _alloc((n_requests, self.req_words), torch.int64, pin)
        self.out = _alloc((n_requests, max_batch, OUT_COLS), torch.float32, pin)
        self.ctrl = _alloc((2 * LINE,), torch.int64, pin)
        req_np = self.req.numpy()
        self._slots = [req_np[k, SLOTS_AT:SLOTS_AT + max_batch] for k in range(n_requests)]
        self._positions = [req_np[k, SLOTS_AT + max_batch:SLOTS_AT + 2 * max_batch] for k in range(n_requests)]
        self._out = [self.out.numpy()[k] for k in range(n_requests)]
        # memoryviews: one scalar store or load costs ~40 ns against ~80 ns through numpy
        self._req_mv = memoryview(req_np.reshape(-1)).cast("B").cast("q")
        self._ctrl_mv = memoryview(self.ctrl.numpy()).cast("B").cast("q")
        self.seq = 0  # requests submitted

    # ------------------------------------------------------------ hot path

    @property
    def next_slot(self) -> int:
        """Ring slot of the next submit."""
        return self.seq % self.n_requests

    def request_views(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """slots, positions (int64 [max_batch], pinned) of request slot k, to fill in place."""
        return self._slots[k], self._positions[k]

    def outputs(self, k: int) -> np.ndarray:
        """Result slot k, float32 [max_batch, OUT_COLS] (pinned, written by the kernel)."""
        return self._out[k]

    def submit(self, n: int, kind: int = KIND_STEP) -> int:
        """Hand slots[:n], positions[:n] of `next_slot` to the kernel; returns the request's seq."""
        seq = self.seq + 1
        if seq - self.answered > self.n_requests or not 0 < n <= self.max_batch:  # cold: a caller bug
            raise RuntimeError(f"submit of {n} entries with {self.in_flight} of {self.n_requests} "
                               f"requests in flight (max_batch {self.max_batch})")
        mv = self._req_mv
        base = ((seq - 1) % self.n_requests) * self.req_words
        tag = (seq & ((1 << TAG_BITS) - 1)) << VAL_BITS
        mask = (1 << VAL_BITS) - 1
        mv[base + E_SLOT] = tag | (mv[base + SLOTS_AT] & mask)
        mv[base + E_POS] = tag | (mv[base + SLOTS_AT + self.max_batch] & mask)
        mv[base + HDR] = (seq & 0xFFFFFFFF) | (n << 32) | (kind << 48)  # last: x86 keeps store order
        self.seq = seq
        return seq

    @property
    def answered(self) -> int:
        """Requests the kernel has answered (they complete in order)."""
        return self._ctrl_mv[CTRL_DONE]

    def poll(self) -> int:
        return self._ctrl_mv[CTRL_DONE]

    def done(self, seq: int) -> bool:
        return self._ctrl_mv[CTRL_DONE] >= seq

    @property
    def in_flight(self) -> int:
        return self.seq - self._ctrl_mv[CTRL_DONE]

    @property
    def can_submit(self) -> bool:
        return self.seq - self._ctrl_mv[CTRL_DONE] < self.n_requests

    def oldest_unanswered(self) -> int | None:
        """Seq of the oldest request not answered yet (the watchdog's), None when idle."""
        done = self._ctrl_mv[CTRL_DONE]
        return done + 1 if done < self.seq else None

    def wait(self, seq: int, timeout_s: float) -> None:
        """Spin until `seq` is answered (tests, tools; the service polls)."""
        deadline = time.perf_counter() + timeout_s
        while self._ctrl_mv[CTRL_DONE] < seq:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"request {seq} not answered within {timeout_s} s "
                                   f"(answered {self._ctrl_mv[CTRL_DONE]})")

    # ------------------------------------------------------------ life cycle (no kernel running)

    def raise_stop(self) -> None:
        self._ctrl_mv[CTRL_STOP] = 1

    def clear(self) -> None:
        """Zero headers, flags and counters: before each start() of a kernel."""
        self.req.zero_()
        self.ctrl.zero_()
        self.seq = 0


# --------------------------------------------------------------------------- device helpers


@triton.jit
def _unpack48(v):
    """Low 48 bits of an express word, sign-extended (positions of padding entries may be negative)."""
    return (v << 16) >> 16


@triton.jit
def _lead_wait_request(req_ptr, ctrl_ptr, r, REQ_W: tl.constexpr, NREQ: tl.constexpr):
    """Lead program: wait for request r+1 (r requests served so far). Returns
    (kind, n, slot0, pos0, request base pointer); kind KIND_STOP once the stop flag is up
    and request r+1 has not arrived (a pending request is served first)."""
    seq = r + 1
    base = req_ptr + (r % NREQ) * REQ_W
    tag = seq & ((1 << 15) - 1)
    want = seq & 0xFFFFFFFF
    w3 = tl.arange(0, 4)
    zero = r * 0
    hdr, es, ep = zero, zero, zero  # scalars: a while loop must not carry tensors (Triton 3.6/3.8)
    got = 0
    while got == 0:
        # HDR, E_SLOT, E_POS in one 32-byte read; each word is whole, so no order is needed
        words = tl.load(base + w3, mask=w3 < 3, other=0, volatile=True)
        stop = tl.load(ctrl_ptr + _CTRL_STOP, volatile=True)
        hdr = tl.sum(tl.where(w3 == 0, words, 0), axis=0)
        es = tl.sum(tl.where(w3 == 1, words, 0), axis=0)
        ep = tl.sum(tl.where(w3 == 2, words, 0), axis=0)
        ok = ((hdr & 0xFFFFFFFF) == want) & ((es >> 48) == tag) & ((ep >> 48) == tag)
        got = tl.where(ok, 1, tl.where(stop != 0, 2, 0))
    kind = tl.where(got == 1, (hdr >> 48) & 0xFF, _KIND_STOP)
    n = ((hdr >> 32) & 0xFFFF).to(tl.int32)
    slot0 = _unpack48(es)
    pos0 = _unpack48(ep)
    return kind, n, slot0, pos0, base


@triton.jit
def _copy_entries(base, n, slot0, pos0, dslots_ptr, dpos_ptr, MAX_B: tl.constexpr, HB: tl.constexpr):
    """Lead: the request's slots/positions -> device arrays (entry 0 from the express words;
    entries 1..n-1 read after HDR was seen, one more PCIe round trip, only when n > 1)."""
    hb = tl.arange(0, HB)
    for b0 in range(0, n, HB):
        b = b0 + hb
        bm = (b < n) & (b > 0)
        s = tl.load(base + _SLOTS_AT + b, mask=bm, other=0, volatile=True)
        p = tl.load(base + _SLOTS_AT + MAX_B + b, mask=bm, other=0, volatile=True)
        s = tl.where(b == 0, slot0, s)
        p = tl.where(b == 0, pos0, p)
        tl.store(dslots_ptr + b, s, mask=b < n)
        tl.store(dpos_ptr + b, p, mask=b < n)


@triton.jit
def _broadcast(sync_ptr, r, kind, n):
    """Lead: publish request r+1 (kind, n) to every program; the device copies the lead
    wrote before are visible to whoever sees MB_REQ == r+1."""
    tl.store(sync_ptr + _MB_N, n.to(tl.int64))
    tl.store(sync_ptr + _MB_KIND, kind.to(tl.int64))
    tl.debug_barrier()  # every thread's stores are issued before the release below
    tl.atomic_xchg(sync_ptr + _MB_REQ, r + 1, sem="release", scope="gpu")


@triton.jit
def _wait_broadcast(sync_ptr, r):
    """Other programs: wait for the lead's request r+1; (kind, n)."""
    cur = tl.load(sync_ptr + _MB_REQ, volatile=True)
    while cur != r + 1:
        cur = tl.load(sync_ptr + _MB_REQ, volatile=True)
    kind = tl.load(sync_ptr + _MB_KIND, volatile=True)
    n = tl.load(sync_ptr + _MB_N, volatile=True).to(tl.int32)
    return kind, n


@triton.jit
def _arrive(cnt_ptr):
    """This program's stores so far are visible to whoever sees the count include it."""
    tl.debug_barrier()  # all threads' stores issued before the release
    tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _wait_count(cnt_ptr, target):
    cur = tl.load(cnt_ptr, volatile=True)
    while cur < target:
        cur = tl.load(cnt_ptr, volatile=True)


@triton.jit
def _release_done(ctrl_ptr, seq):
    """Answer request seq: the result slot's stores first (bar.sync + release fence), then the flag."""
    tl.debug_barrier()
    tl.atomic_xchg(ctrl_ptr + _CTRL_DONE, seq, sem="release", scope="sys")


@triton.jit
def _stamp(time_ptr, i, TIMING: tl.constexpr):
    """Device clock (ns, %globaltimer) into time_ptr[i] when TIMING (compiled kernels only)."""
    if TIMING:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [i.to(tl.int32)],
                                      dtype=tl.int64, is_pure=False, pack=1)
        tl.store(time_ptr + i, t)


# --------------------------------------------------------------------------- kernel life cycle


class PersistentKernel:
    """Life cycle of one persistent kernel behind a RequestRing: subclasses provide `_launch()`
    (one launch that serves until the stop flag), `_zero_state()` and `programs`."""

    def __init__(self, ring: RequestRing, device: torch.device | str, *, timing: bool = False) -> None:
        self.ring = ring
        self.device = torch.device(device)
        ok, why = persistent_supported(self.device)
        if not ok:
            raise RuntimeError(f"persistent kernel refused: {why}")
        self.sync = torch.zeros(SYNC_LINES * LINE, dtype=torch.int64, device=self.device)
        self.stream = torch.cuda.Stream(device=self.device) if self.device.type == "cuda" else None
        self.timing = bool(timing) and not interpreting()
        # device stamps per request: [detect, done] of request s at (s - 1) % TIME_SLOTS
        self.time_slots = 16384
        self.times = torch.zeros(2 * self.time_slots, dtype=torch.int64, device=self.device)
        self.running = False
        self._done_event = None

    @property
    def programs(self) -> int:
        raise NotImplementedError

    def _launch(self) -> None:
        raise NotImplementedError

    def _zero_state(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        """Launch the kernel on its own stream (returns at once on a GPU). Under the
        interpreter the launch runs to its end: post the requests and the stop flag first."""
        if self.running:
            raise RuntimeError("kernel already running")
        if not interpreting():
            self.ring.clear()
        self.running = True
        if self.stream is None:
            self.sync.zero_()
            self._launch()
            self.running = False
            return
        # weights, state and workspace were written on the caller's stream: order the launch after them
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            self.sync.zero_()
            self._launch()
            self._done_event = torch.cuda.Event()
            self._done_event.record(self.stream)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Raise the stop flag; the kernel serves what was submitted, then exits within one poll."""
        if not self.running:
            return
        self.ring.raise_stop()
        deadline = time.perf_counter() + timeout_s
        while not self._done_event.query():
            if time.perf_counter() > deadline:
                raise TimeoutError("persistent kernel did not stop")
            time.sleep(1e-4)
        self.running = False

    def precompile(self) -> None:
        """Compile and load the kernel before start(): a launch with the stop flag raised
        exits at once. Nothing may wait on the device while a persistent kernel spins."""
        if self.running:
            raise RuntimeError("precompile while running")
        self.ring.clear()
        self.ring.raise_stop()
        if self.stream is None:
            self.sync.zero_()
            self._launch()
        else:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                self.sync.zero_()
                self._launch()
            self.stream.synchronize()
        self.ring.clear()

    def reset_state(self) -> None:
        """Zero every slot's model state (only while stopped)."""
        if self.running:
            raise RuntimeError("reset_state of a running persistent kernel (submit a KIND_RESET instead)")
        self._zero_state()
        if self.stream is not None:
            torch.cuda.current_stream(self.device).synchronize()

    def device_times_ns(self, first_seq: int, last_seq: int) -> np.ndarray:
        """Device time (detect -> done release) of requests first..last (stopped, timing=True)."""
        if self.running or not self.timing:
            raise RuntimeError("device times need timing=True and a stopped kernel")
        t = self.times.view(self.time_slots, 2).cpu().numpy()
        idx = (np.arange(first_seq, last_seq + 1) - 1) % self.time_slots
        return t[idx, 1] - t[idx, 0]


# --------------------------------------------------------------------------- the floor


@triton.jit
def _floor_kernel(req_ptr, ctrl_ptr, out_ptr, time_ptr, REQ_W: tl.constexpr, NREQ: tl.constexpr,
                  MAX_B: tl.constexpr, OUT_C: tl.constexpr, TIMING: tl.constexpr, TSLOTS: tl.constexpr):
    """Flag in, flag out, through the same polling code as the model kernels: answers each
    request with out[k, 0, 0:3] = seq, slot0, pos0 (as floats)."""
    r = tl.load(ctrl_ptr + _CTRL_DONE, volatile=True) * 0  # int64 zero (the host cleared the ring)
    running = 1
    while running == 1:
        kind, n, slot0, pos0, base = _lead_wait_request(req_ptr, ctrl_ptr, r, REQ_W, NREQ)
        if kind != _KIND_STOP:
            _stamp(time_ptr, (r % TSLOTS) * 2, TIMING)
            o = out_ptr + (r % NREQ) * (MAX_B * OUT_C)
            tl.store(o, (r + 1).to(tl.float32))
            tl.store(o + 1, slot0.to(tl.float32))
            tl.store(o + 2, pos0.to(tl.float32))
            _stamp(time_ptr, (r % TSLOTS) * 2 + 1, TIMING)
            _release_done(ctrl_ptr, r + 1)
            r += 1
        else:
            running = 0


class FloorKernel(PersistentKernel):
    """The floor of the request path: one program, no model (see `_floor_kernel`)."""

    def __init__(self, ring: RequestRing, device: torch.device | str, *, timing: bool = False) -> None:
        super().__init__(ring, device, timing=timing)

    @property
    def programs(self) -> int:
        return 1

    def _launch(self) -> None:
        ring = self.ring
        _floor_kernel[(1,)](ring.req, ring.ctrl, ring.out, self.times, REQ_W=ring.req_words,
                            NREQ=ring.n_requests, MAX_B=ring.max_batch, OUT_C=OUT_COLS, TIMING=self.timing,
                            TSLOTS=self.time_slots, num_warps=1)

    def _zero_state(self) -> None:
        pass
