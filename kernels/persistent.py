"""(~580 lines: the ring's host API, its device half and the floor kernel are one protocol,
kept in one file so that the layout is defined once.)

Host side shared by every persistent model kernel: the request ring, the kernel's life
cycle (start / stop / precompile / reset), the device-side polling and synchronisation
helpers, and the trivial floor kernel (request in, answer out).

Why the requests travel by DMA (measured on the H200 host, docs/notes/kernels.md): a
kernel's reads of pinned host memory are served about one PCIe transaction at a time,
~1 µs each, and the first persistent kernels, which read their rows from the host feature
ring in place, both paid that per row and gave wrong results on some requests. So under
the engine's transport ("dma"; `RequestRing` names the other two) no kernel reads a
request from host memory: the host fills a request slot's pinned payload, writes its
header word, and one CUDA graph of two copy nodes moves the payload to the slot's device
buffer and *then* the header word to the device header (the second copy starts after the
first has completed, so a kernel that sees the header sees the payload). The kernel polls
the device header in L2 and reads the payload from device memory. Its answers go the other
way as plain stores into pinned memory (posted PCIe writes), then the done counter.

Request ring (`RequestRing`), R >= 2 slots (default 4):

    payload   pinned host [R, PB] bytes and device [R, PB], same layout per slot k:
              int64 slots[max_batch] | int64 positions[max_batch] | float32 rows[max_batch, G, F]
              (G rows per entry: 1 for the LSTMs' new row, W for window readers; PB rounded
              up to 128 bytes)
    header    int64, slot k at word k * LINE (own 128-byte line): s mod 2^32 | n << 32 | kind << 48,
              pinned host copy (written first) and the device copy the kernel polls
    out       float32 pinned [R, max_batch, OUT_COLS]   result slot k (score, action, 3 logits)
    ctrl      int64 pinned [2 * LINE]   ctrl[DONE]: requests answered (the kernel writes)
    stop      int64 [LINE], the stop flag: pinned host copy and the device copy the lead reads
              every 64th poll of the header (raise_stop() copies it over); a pending request is
              served first

Request seq s (1, 2, 3, ...) uses slot k = (s - 1) % R. The hot loop fills slots[:n],
positions[:n] and rows[:n] of the slot in place (numpy views), then `submit(n, kind)`
writes the header and replays the slot's copy graph for n's bucket (the payload copied
is the ids of every entry and the rows of bucket(n) entries). The kernel serves requests
strictly in order, writes result slot k, then releases ctrl[DONE] = s (atomic exchange,
release, system scope). A RESET request zeroes the model state of slots[:n] in order with
the steps around it.

Small steps inline (`RequestRing.enable_inline`, the LSTM kernels' default: at most 2 entries and
INLINE_MAX_BYTES of rows): submit writes only the pinned header, flagged INLINE_BIT, and launches
nothing; the lead, which polls the pinned header beside the device one (one PCIe read a poll, by
thread 0 alone: `_lead_take_request`), reads the slot's slots, positions and rows from pinned
memory in place (three loads in flight at once, one element a thread, issued after the header was
seen, which x86 wrote after them -- after it in time: no acquire orders the other warps' loads after
thread 0's sight of it; wave 47 traced the divergence to the poll loop instead, docs/notes/kernels.md)
and stores them into the device slot before it publishes the request, so every other program reads
device memory as before. What it
saves: the copy graph's launch on the host (~3.8 µs) and its two copies; what it costs: the PCIe
reads on the lead (~1 µs each, docs/notes/kernels.md).

At most R - 1 requests are in flight: the kernel's programs may still read request s's
payload (slots, positions) for a moment after s is answered, until the lead has seen
every program finish s, which it waits for before it serves s + 1. With R - 1 in flight
the host rewrites slot k (request s + R) only once s + 1 is answered, so never under a
reader.

Device side (`_lead_take_request`, `_broadcast`, `_wait_broadcast`, `_arrive`,
`_wait_count`): one lead program polls the device header (and, inline, the pinned one) with
volatile loads (never acquire operations: on sm_90 an acquire load is `LDG.STRONG` + `CCTL.IVALL`, which would
wipe the weights each program keeps in its L1) and publishes the request with a release
store; the other programs spin on that mailbox in L2. Phases meet at monotonic int64
counters (each program adds 1 with release semantics; waiters spin with volatile loads
until the count reaches programs x (steps + 1)). Data other programs or the copy engine
wrote is read with volatile loads (L2, issued after the flag was seen: the spin loop's exit
depends on it and GPUs do not issue loads speculatively), so nothing stale can come from L1 --
provided no loop is software-pipelined: the pipeliner turns volatile loads into L1-cached
cp.async copies (`NUM_STAGES` below; `asm_problems` checks a kernel's PTX for it).

Platform: the host writes its pinned header copy and reads ctrl[DONE] and the result slots
with plain loads and stores; x86-64 (TSO) keeps them in program order. `persistent_supported()`
refuses any other host. Nothing may synchronise the whole device while a persistent kernel
spins (torch.cuda.synchronize() would wait forever): compile with `precompile()` (it also
captures the copy graphs) and allocate before `start()`.
"""

from __future__ import annotations

import platform
import re
import time
from collections.abc import Callable

import numpy as np
import torch
import triton
import triton.language as tl

from hft_infer.kernels.common import OUT_COLS, interpreting
from hft_infer.kernels.launch import graph_launcher

KIND_STEP, KIND_RESET = 0, 1
"""Request kinds: a model step over slots[:n] at positions[:n]; zero the state of slots[:n]."""
KIND_STOP = 2  # device-internal: the lead saw the stop flag with no request pending
INLINE_SHIFT = 62
INLINE_BIT = 1 << INLINE_SHIFT
"""Set in a pinned header word: the request's payload is read by the lead from the pinned slot in
place (`RequestRing.inline_entries`); no copy graph ran for it and the device header is not written."""
INLINE_MAX_BYTES = 512
"""The most row bytes an inline request may carry (lstm_a: 168 an entry): the lead reads them over
PCIe, where each transaction costs ~1 µs (docs/notes/kernels.md), so only a few lines."""

CTRL_DONE = 0
LINE = 16  # int64 per 128-byte line

# device sync block (int64): the mailbox word ((r+1) mod 2^32 | n << 32 | kind << 48: `_broadcast`),
# then counters on their own 128-byte lines
MB_REQ = 0
CNT_DONE = 1  # line index of the completion counter; phase counters follow
SYNC_LINES = 16

_CTRL_DONE = tl.constexpr(CTRL_DONE)
_MB_REQ = tl.constexpr(MB_REQ)
_KIND_STOP = tl.constexpr(KIND_STOP)
_INLINE_SHIFT = tl.constexpr(INLINE_SHIFT)
# the same words as constexprs for the model kernels' own loops (lstm_persistent, mlp_persistent)
STEP_C = tl.constexpr(KIND_STEP)
RESET_C = tl.constexpr(KIND_RESET)
LINE_C = tl.constexpr(LINE)
CNT_DONE_C = tl.constexpr(CNT_DONE)


class ProgramBudgetError(ValueError):
    """A persistent kernel needs more programs than it may hold (its `max_programs`): all of them
    must be resident at once for its grid barriers, so it cannot run in fewer."""


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


def _zeros(shape, dtype, device: torch.device, pin: bool) -> torch.Tensor:
    t = torch.zeros(shape, dtype=dtype, device=device)
    return t.pin_memory() if pin else t


def _buckets(max_batch: int) -> list[int]:
    """Payload sizes the copy graphs are captured for: powers of two up to max_batch."""
    b, out = 1, []
    while b < max_batch:
        out.append(b)
        b *= 2
    return out + [max_batch]


class RequestRing:
    """R request slots, their copy graphs and R result slots (see the module docstring).

    Host API (one thread; nothing allocates):
        k = ring.next_slot
        slots, positions = ring.request_views(k); rows = ring.rows(k)   # fill [:n] in place
        seq = ring.submit(n, KIND_STEP)
        ring.done(seq) / ring.poll() -> answered count
        ring.outputs(k)[:n]  (valid from done(seq) until slot k is submitted again)

    On a CUDA device `prepare()` captures the copy graphs (before any kernel spins; the
    kernels' precompile calls it). Off CUDA (the interpreter's tests) submit copies the
    payload and then the header synchronously: the same layout, the same order.
    """

    def __init__(self, max_batch: int, *, rows_per_entry: int = 1, width: int = 1, n_requests: int = 4,
                 device: torch.device | str = "cpu", transport: str = "dma") -> None:
        """transport:
        "dma" (the engine's): payload, then header, both by the slot's copy graph; the lead
            polls the device header in L2.
        "fenced": the payload by the copy graph; the host waits for that copy's event, then
            writes the header into pinned memory, which the lead polls (one PCIe read per
            poll): the header cannot be seen before the payload. Built to test whether it
            was (tools/diag_ring_order.py: it was not); ~10 µs slower than "dma".
        "pinned": the kernel polls and reads the pinned host copies in place (UVA; the
            payload is written before the header, in x86 store order): the floor benchmark's."""
        if transport not in ("fenced", "dma", "pinned"):
            raise ValueError(f"transport must be 'fenced', 'dma' or 'pinned', got {transport!r}")
        if n_requests < 2 or n_requests >= 1 << 15:
            raise ValueError(f"n_requests must be in 2..32767, got {n_requests}")
        if max_batch < 1 or max_batch >= 1 << 16:
            raise ValueError(f"max_batch must be in 1..65535, got {max_batch}")
        self.device = dev = torch.device(device)
        self.max_batch = max_batch
        self.rows_per_entry, self.width = rows_per_entry, width
        self.n_requests = n_requests
        self.max_in_flight = n_requests - 1  # see the module docstring
        self._ids_bytes = 16 * max_batch
        self._row_bytes = 4 * rows_per_entry * width  # one entry's rows
        self.payload_bytes = triton.cdiv(self._ids_bytes + max_batch * self._row_bytes, 128) * 128
        pin = dev.type == "cuda"
        cpu = torch.device("cpu")
        self.transport = transport
        self.host = _zeros((n_requests, self.payload_bytes), torch.uint8, cpu, pin)
        self.hdr_h = _zeros((n_requests * LINE,), torch.int64, cpu, pin)
        self.dev = (self.host if transport == "pinned" else
                    torch.zeros((n_requests, self.payload_bytes), dtype=torch.uint8, device=dev))
        self.hdr_d = (torch.zeros(n_requests * LINE, dtype=torch.int64, device=dev) if transport == "dma"
                      else self.hdr_h)
        self.out = _zeros((n_requests, max_batch, OUT_COLS), torch.float32, cpu, pin)
        self.ctrl = _zeros((2 * LINE,), torch.int64, cpu, pin)
        self.stop_h = _zeros((LINE,), torch.int64, cpu, pin)
        self.stop_d = torch.zeros(LINE, dtype=torch.int64, device=dev) if transport == "dma" else self.stop_h
        mb, rb = max_batch, self._row_bytes
        self._slots = [self.host[k, :8 * mb].view(torch.int64).numpy() for k in range(n_requests)]
        self._positions = [self.host[k, 8 * mb:16 * mb].view(torch.int64).numpy() for k in range(n_requests)]
        self._rows = [self.host[k, 16 * mb:16 * mb + mb * rb].view(torch.float32).view(mb, rows_per_entry, width)
                      .numpy() for k in range(n_requests)]
        self._out = [self.out.numpy()[k] for k in range(n_requests)]
        # memoryviews: one scalar store or load costs ~40 ns against ~80 ns through numpy
        self._hdr_mv = memoryview(self.hdr_h.numpy()).cast("B").cast("q")
        self._ctrl_mv = memoryview(self.ctrl.numpy()).cast("B").cast("q")
        buckets = _buckets(max_batch)
        self._bucket_of = [0] + [next(i for i, b in enumerate(buckets) if b >= n) for n in range(1, mb + 1)]
        self._copy_bytes = [self._ids_bytes + b * rb for b in buckets]
        self._graphs: list[list] | None = None  # [slot][bucket index], captured by prepare()
        # graph_launcher of each, on prepare()'s current stream
        self._launchers: list[list[Callable[[], None]]] | None = None
        self._copied = None  # fenced: one event per slot, recorded after its payload copy
        self.inline_entries = 0  # steps of at most this many entries go inline (`enable_inline`)
        self.seq = 0  # requests submitted

    def enable_inline(self, entries: int) -> int:
        """Let steps of at most `entries` entries skip the copy graph (transport "dma"): submit writes
        only the pinned header, flagged INLINE_BIT, and the kernel's lead -- which must poll the
        pinned header too (`_lead_take_request` with INL > 0) -- reads the payload from the pinned
        slot in place and copies it to the device slot before it publishes the request. Returns the
        entries granted: a power of two, capped by max_batch and INLINE_MAX_BYTES of rows; 0 where
        the transport is not "dma" ("pinned" reads every request in place already; "fenced" is the
        diagnostic path that writes the header only once the copy has completed)."""
        if entries < 0:
            raise ValueError(f"inline entries must be >= 0, got {entries}")
        per_entry = self._row_bytes
        fit = min(entries, self.max_batch, INLINE_MAX_BYTES // per_entry if per_entry else entries)
        self.inline_entries = 0 if self.transport != "dma" or fit < 1 else 1 << (fit.bit_length() - 1)
        return self.inline_entries

    # ------------------------------------------------------------ device views (the kernels' arguments)

    @property
    def payload_words(self) -> int:
        """int64 words per slot in the device payload (slots at word 0, positions at max_batch)."""
        return self.payload_bytes // 8

    @property
    def rows_offset(self) -> int:
        """float32 index of rows[0] inside a slot's payload."""
        return self._ids_bytes // 4

    def device_ints(self) -> torch.Tensor:
        return self.dev.view(torch.int64)

    def device_floats(self) -> torch.Tensor:
        return self.dev.view(torch.float32)

    # ------------------------------------------------------------ hot path

    @property
    def next_slot(self) -> int:
        """Ring slot of the next submit."""
        return self.seq % self.n_requests

    def request_views(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """slots, positions (int64 [max_batch], pinned) of request slot k, to fill in place."""
        return self._slots[k], self._positions[k]

    def rows(self, k: int) -> np.ndarray:
        """rows float32 [max_batch, G, F] (pinned) of request slot k, to fill in place."""
        return self._rows[k]

    def outputs(self, k: int) -> np.ndarray:
        """Result slot k, float32 [max_batch, OUT_COLS] (pinned, written by the kernel)."""
        return self._out[k]

    def submit(self, n: int, kind: int = KIND_STEP) -> int:
        """Hand slot `next_slot`'s slots[:n], positions[:n], rows[:n] to the kernel; returns its seq."""
        seq = self.seq + 1
        if seq - self._ctrl_mv[CTRL_DONE] > self.max_in_flight or not 0 < n <= self.max_batch:  # cold: a bug
            raise RuntimeError(f"submit of {n} entries with {self.in_flight} requests in flight "
                               f"(at most {self.max_in_flight}; max_batch {self.max_batch})")
        k = (seq - 1) % self.n_requests
        hdr = (seq & 0xFFFFFFFF) | (n << 32) | (kind << 48)
        if n <= self.inline_entries and kind == KIND_STEP:
            self._hdr_mv[k * LINE] = hdr | INLINE_BIT  # last: x86 keeps store order (the payload is before)
        elif self.transport == "pinned":
            self._hdr_mv[k * LINE] = hdr  # last: x86 keeps store order
        elif self._graphs is not None:
            if self.transport == "dma":
                self._hdr_mv[k * LINE] = hdr
                self._launchers[k][self._bucket_of[n]]()
            else:  # fenced: the header only once the payload copy has completed
                self._launchers[k][self._bucket_of[n]]()
                ev = self._copied[k]
                ev.record()
                while not ev.query():
                    pass
                self._hdr_mv[k * LINE] = hdr
        else:
            if self.device.type == "cuda":
                raise RuntimeError("RequestRing.prepare() was not called (the kernel's precompile does it)")
            nb = self._copy_bytes[self._bucket_of[n]]  # CPU (interpreter tests): the copy, then the header
            self.dev[k, :nb] = self.host[k, :nb]
            self._hdr_mv[k * LINE] = hdr
            if self.hdr_d is not self.hdr_h:
                self.hdr_d[k * LINE] = hdr
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
        return self.seq - self._ctrl_mv[CTRL_DONE] < self.max_in_flight

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

    def prepare(self) -> None:
        """Capture each slot's copy graphs (CUDA; once). Nothing may spin on the device yet."""
        if self._graphs is not None or self.device.type != "cuda" or self.transport == "pinned":
            return
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        graphs = []
        for k in range(self.n_requests):
            row = []
            for nb in self._copy_bytes:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=stream):
                    self.dev[k, :nb].copy_(self.host[k, :nb], non_blocking=True)
                    if self.transport == "dma":
                        self.hdr_d[k * LINE:k * LINE + 1].copy_(self.hdr_h[k * LINE:k * LINE + 1],
                                                                non_blocking=True)
                row.append(g)
            graphs.append(row)
        stream.synchronize()
        if self.transport == "fenced":
            self._copied = [torch.cuda.Event() for _ in range(self.n_requests)]
        self._graphs = graphs
        # launched on the stream current now, as replay() would at submit (the engine never changes it)
        current = torch.cuda.current_stream(self.device)
        self._launchers = [[graph_launcher(g, current) for g in row] for row in graphs]

    def raise_stop(self) -> None:
        """The stop flag, to the device copy the kernel polls: it serves what was submitted
        and exits. A copy, not a kernel: it needs no free SM beside a persistent kernel."""
        self.stop_h[0] = 1
        if self.stop_d is not self.stop_h:
            self.stop_d.copy_(self.stop_h, non_blocking=True)

    def clear(self) -> None:
        """Zero headers, answers, the stop flag and counters: before each start() of a kernel."""
        for t in {id(t): t for t in (self.hdr_h, self.hdr_d, self.ctrl, self.stop_h, self.stop_d)}.values():
            t.zero_()
        self.seq = 0


# --------------------------------------------------------------------------- device helpers


@triton.jit
def _payload(pay_i_ptr, pay_f_ptr, r, NREQ: tl.constexpr, PW: tl.constexpr, MAX_B: tl.constexpr,
             ROWS_AT: tl.constexpr):
    """Device pointers of request r+1's slots, positions and rows (slot (r % NREQ) of the payload)."""
    k = r % NREQ
    slots = pay_i_ptr + k * PW
    return slots, slots + MAX_B, pay_f_ptr + k * (2 * PW) + ROWS_AT


@triton.jit
def _lead_take_request(hdr_ptr, hdr_h_ptr, stop_ptr, pay_i_ptr, pay_f_ptr, pay_h_i_ptr, pay_h_f_ptr, r,
                       NREQ: tl.constexpr, PW: tl.constexpr, MAX_B: tl.constexpr, ROWS_AT: tl.constexpr,
                       INL: tl.constexpr, RW: tl.constexpr, RB: tl.constexpr, IB: tl.constexpr,
                       NT: tl.constexpr):
    """Lead program: wait for request r+1 (r requests served so far) in the device header, also
    polling the pinned header where the ring sends small steps inline (INL > 0: steps of at most
    INL entries, RW floats of rows an entry; RB and IB: powers of two >= INL * RW and INL and >=
    NT, `ring_consts`); an inline request's slots, positions and rows are read from the pinned slot
    in place and stored into the device slot, where every program reads a request (the
    broadcast's release publishes them). Returns (kind, n), kind KIND_STOP once the stop flag is up
    and request r+1 has not arrived (a pending request is served first). With INL == 0 the
    constexpr branches fold away: the device header and the stop flag alone.

    Host memory is read once, not once a warp: a load every thread runs (a scalar's) is one request
    per warp, and each is its own PCIe read, which this GPU serves about one at a time (wave 4). So
    the pinned header is read by thread 0 alone (a tensor of NT = the program's threads, masked to
    its first element) and summed into the scalar every thread needs, and the payload's tensors
    (IB >= INL entries, RB row floats) hold one element a thread: entries 0..n-1's slots and
    positions fall in warp 0, their n * RW row floats in the first warps, one 128-byte read each
    (lstm_a's two rows: 84 floats, three warps). The device header stays a scalar load (L2: cheap
    for every warp)."""
    # (the statements keep the order of the two loops this one replaced, the inline path's reads under
    # constexpr branches, so that both builds compiled to the same instructions as before)
    p = hdr_ptr + (r % NREQ) * LINE_C
    if INL > 0:
        ph = hdr_h_ptr + (r % NREQ) * LINE_C
    want = (r + 1) & 0xFFFFFFFF
    if INL > 0:
        lane = tl.arange(0, NT)
        ph_one = ph + lane * 0  # thread 0's load only (mask): one PCIe read a poll, not one a warp
    hdr = tl.load(p, volatile=True)
    if INL > 0:
        hh = tl.sum(tl.load(ph_one, mask=lane == 0, other=0, volatile=True))  # a PCIe read: ~1 µs a poll
    stop = tl.load(stop_ptr, volatile=True)
    if INL > 0:
        inl = ((hh & 0xFFFFFFFF) == want) & (((hh >> _INLINE_SHIFT) & 1) == 1)
    else:
        inl = (stop * 0) != 0  # no inline path: false (folded away)
    i = stop * 0
    while ((hdr & 0xFFFFFFFF) != want) & (inl == 0) & (stop == 0):  # scalars only: a loop must not carry tensors
        hdr = tl.load(p, volatile=True)
        if INL > 0:
            hh = tl.sum(tl.load(ph_one, mask=lane == 0, other=0, volatile=True))
            inl = ((hh & 0xFFFFFFFF) == want) & (((hh >> _INLINE_SHIFT) & 1) == 1)
        i += 1
        if (i & 63) == 0:  # the stop flag every 64th poll: one read per poll where they cross PCIe
            stop = tl.load(stop_ptr, volatile=True)
    if INL > 0:
        hdr = tl.where(inl, hh, hdr)
    got = (hdr & 0xFFFFFFFF) == want
    kind = tl.where(got, (hdr >> 48) & 0xFF, _KIND_STOP)
    n = ((hdr >> 32) & 0xFFFF).to(tl.int32)
    if INL > 0:
        if inl:
            k = r % NREQ
            b = tl.arange(0, IB)  # entry b in thread b: warp 0's loads
            bm = b < n
            q = tl.arange(0, RB)
            qm = q < n * RW
            # the three reads in flight at once; issued after the header was seen (x86 wrote them before it) --
            # in time only: no acquire between thread 0's sight of it and the other warps' loads
            sl = tl.load(pay_h_i_ptr + k * PW + b, mask=bm, volatile=True)
            ps = tl.load(pay_h_i_ptr + k * PW + MAX_B + b, mask=bm, volatile=True)
            rows = tl.load(pay_h_f_ptr + k * (2 * PW) + ROWS_AT + q, mask=qm, volatile=True)
            tl.store(pay_i_ptr + k * PW + b, sl, mask=bm)
            tl.store(pay_i_ptr + k * PW + MAX_B + b, ps, mask=bm)
            tl.store(pay_f_ptr + k * (2 * PW) + ROWS_AT + q, rows, mask=qm)
            tl.debug_barrier()  # the lead's own threads read the device slot after this
    # uniform: without inline reads each warp leaves its poll on its own sight of the header word, which
    # stays until this request is answered (the stop flag is raised with nothing in flight, so no warp
    # leaves on it while another sees a header); the inline build's poll loop is checked on its own and
    # breaks the rule until docs/pending/0001-issue-13-lead-poll.patch lands
    return kind, n


@triton.jit
def _broadcast(sync_ptr, r, kind, n):
    """Lead: publish request r+1 (kind, n) to every program as one word, the header's layout
    ((r+1) mod 2^32 | n << 32 | kind << 48): whoever sees it has kind and n from the load that saw
    it (no second trip), and everything the lead saw or wrote before."""
    word = ((r + 1) & 0xFFFFFFFF) | (n.to(tl.int64) << 32) | (kind.to(tl.int64) << 48)
    tl.debug_barrier()  # every thread's stores are issued before the release below
    tl.atomic_xchg(sync_ptr + _MB_REQ, word, sem="release", scope="gpu")


@triton.jit
def _wait_broadcast(sync_ptr, r):
    """Other programs: wait for the lead's request r+1; (kind, n)."""
    want = (r + 1) & 0xFFFFFFFF
    cur = tl.load(sync_ptr + _MB_REQ, volatile=True)
    while (cur & 0xFFFFFFFF) != want:
        cur = tl.load(sync_ptr + _MB_REQ, volatile=True)
    # uniform: each warp leaves on its own sight of the word, which stays until the lead publishes request
    # r+2 -- only after every program has answered r+1
    return (cur >> 48) & 0xFF, ((cur >> 32) & 0xFFFF).to(tl.int32)


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


NUM_STAGES = 1
"""Software pipelining off in every persistent kernel. Triton's pipeliner turns a loop's loads
that feed a tl.dot into cp.async copies, and it does so for volatile loads too: a cp.async has
no volatile form, and Triton 3.6/3.8 emit `cp.async.ca` (cached in L1) for the 4-byte gathers
of the request payload. L1 is not coherent, so when a ring slot came round again the programs
read the previous request's rows from their L1: the persistent engines' wrong results of
waves 2-4 (issue 13), found by compiling the kernels for sm_90 and reading their PTX. Launched
kernels never saw it (a launch starts with a clean L1). `asm_problems` checks every persistent
kernel's PTX for it (tests/unit/test_persistent_asm.py, on a CPU)."""


def asm_problems(ptx: str) -> list[str]:
    """Why a persistent kernel's PTX may read stale request data (empty when none is found):
    any cp.async (it ignores `volatile`; .ca caches in L1), any non-coherent ld.global.nc."""
    problems = []
    n_async = len(re.findall(r"\bcp\.async\.c[ag]\b", ptx))
    if n_async:
        problems.append(f"{n_async} cp.async copies (software pipelining: volatile loads lose their semantics)")
    n_nc = len(re.findall(r"\bld\.global\.nc\b", ptx))
    if n_nc:
        problems.append(f"{n_nc} ld.global.nc loads (the read-only path caches in L1)")
    if "ld.volatile.global" not in ptx:
        problems.append("no volatile global load (the request path polls and reads with them)")
    return problems


def _signature_type(value) -> str:
    """Triton signature type of a launch argument (tensors by dtype, Python ints as i64)."""
    if isinstance(value, torch.Tensor):
        return "*" + {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "i64",
                      torch.int32: "i32", torch.int8: "i8", torch.uint8: "u8"}[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton signature type for {type(value).__name__}")


def compile_launch(fn, args: tuple, kwargs: dict, arch: int = 90, **options):
    """Compile the launch `fn[grid](*args, **kwargs)` for CUDA sm_`arch` without a GPU (Triton's
    bundled ptxas): the compiled kernel (`.asm["ptx"]`, `.metadata.shared`, ...). kwargs are the
    constexprs and launch options; `options` (num_warps, num_stages) replace the launch's own."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kwargs = dict(kwargs)
    options = {**{k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}, **options}
    if interpreting():
        raise RuntimeError("compiling for a GPU needs TRITON_INTERPRET unset "
                           "(the interpreter's kernels do not compile)")
    names = fn.arg_names
    if len(args) + len(kwargs) != len(names):
        raise ValueError(f"{fn.__name__} takes {len(names)} arguments, the launch gives {len(args) + len(kwargs)}")
    signature = {name: _signature_type(v) for name, v in zip(names, args)}
    signature.update({name: "constexpr" for name in kwargs})
    constexprs = {(names.index(k),): v for k, v in kwargs.items()}
    return triton.compile(ASTSource(fn, signature, constexprs=constexprs), target=GPUTarget("cuda", arch, 32),
                          options=options)


class PersistentKernel:
    """Life cycle of one persistent kernel behind a RequestRing: subclasses provide
    `_launch_spec()` (the one launch that serves until the stop flag), `_zero_state()` and
    `programs`. A kernel may be built on any device (its PTX for a CUDA target can then be
    read: `compile_asm`); starting one needs `persistent_supported`."""

    num_warps = 1  # the launch's; a model kernel sets its own (ring_consts' NT follows it)

    def __init__(self, ring: RequestRing, device: torch.device | str, *, timing: bool = False,
                 stamps: int = 2) -> None:
        self.ring = ring
        self.device = torch.device(device)
        self.sync = torch.zeros(SYNC_LINES * LINE, dtype=torch.int64, device=self.device)
        self.stream = torch.cuda.Stream(device=self.device) if self.device.type == "cuda" else None
        self.timing = bool(timing) and not interpreting()
        # device stamps per request: [detect, done, then a kernel's phase stamps if it records
        # them] of request s at row (s - 1) % time_slots
        self.time_slots = 16384
        self.stamps = stamps
        self.times = torch.zeros(stamps * self.time_slots, dtype=torch.int64, device=self.device)
        self.running = False
        self._done_event = None

    @property
    def programs(self) -> int:
        raise NotImplementedError

    def _launch_spec(self) -> tuple:
        """(jit function, grid, positional arguments, keyword arguments: constexprs and launch
        options) of the one launch."""
        raise NotImplementedError

    def _launch(self) -> None:
        fn, grid, args, kwargs = self._launch_spec()
        fn[grid](*args, **kwargs)

    def compile_asm(self, arch: int = 90, **options) -> dict:
        """Compile the launch for CUDA sm_`arch` without a GPU (Triton's bundled ptxas) and
        return its stages (`["ptx"]`, `["ttgir"]`, ...): the code the device would run.
        options (num_warps, num_stages) replace the launch's own (tests of the check)."""
        fn, _, args, kwargs = self._launch_spec()
        return compile_launch(fn, args, kwargs, arch, **options).asm

    def _zero_state(self) -> None:
        raise NotImplementedError

    def _require_supported(self) -> None:
        ok, why = persistent_supported(self.device)
        if not ok:
            raise RuntimeError(f"persistent kernel refused: {why}")

    def start(self) -> None:
        """Launch the kernel on its own stream (returns at once on a GPU). Under the
        interpreter the launch runs to its end: post the requests and raise the stop flag first."""
        if self.running:
            raise RuntimeError("kernel already running")
        self._require_supported()
        if not interpreting():
            self.ring.prepare()
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
        """Compile and load the kernel and capture the ring's copy graphs before start(): a
        launch with the stop flag raised exits at once. Nothing may wait on the device while
        a persistent kernel spins."""
        if self.running:
            raise RuntimeError("precompile while running")
        self._require_supported()
        self.ring.prepare()
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
        t = self.device_stamps_ns(first_seq, last_seq)
        return t[:, 1] - t[:, 0]

    def device_stamps_ns(self, first_seq: int, last_seq: int) -> np.ndarray:
        """Every device stamp of requests first..last, [requests, stamps] (%globaltimer, ns):
        detect, done, then the kernel's phase stamps where it records them (stopped, timing=True)."""
        if self.running or not self.timing:
            raise RuntimeError("device stamps need timing=True and a stopped kernel")
        t = self.times.view(self.time_slots, self.stamps).cpu().numpy()
        return t[(np.arange(first_seq, last_seq + 1) - 1) % self.time_slots]

    def ring_args(self) -> tuple:
        """The ring's tensors every model kernel takes first: device and pinned header, stop flag,
        device payload (as int64 and float32), pinned payload (the same two views: inline requests),
        result slots, answered counter."""
        ring = self.ring
        return (ring.hdr_d, ring.hdr_h, ring.stop_d, ring.device_ints(), ring.device_floats(),
                ring.host.view(torch.int64), ring.host.view(torch.float32), ring.out, ring.ctrl)

    def ring_consts(self) -> dict:
        ring = self.ring
        rw = ring.rows_per_entry * ring.width
        nt = 32 * self.num_warps  # the program's threads: the inline path's tensors put one element in each
        return dict(NREQ=ring.n_requests, PW=ring.payload_words, ROWS_AT=ring.rows_offset, MAX_B=ring.max_batch,
                    INL=ring.inline_entries, RW=rw, RB=triton.next_power_of_2(max(nt, ring.inline_entries * rw)),
                    IB=triton.next_power_of_2(max(nt, ring.inline_entries)), NT=nt)


# --------------------------------------------------------------------------- the floor


@triton.jit
def _floor_kernel(hdr_ptr, hdr_h_ptr, stop_ptr, pay_i_ptr, pay_f_ptr, pay_h_i_ptr, pay_h_f_ptr, out_ptr, ctrl_ptr,
                  time_ptr, NREQ: tl.constexpr, PW: tl.constexpr, ROWS_AT: tl.constexpr, MAX_B: tl.constexpr,
                  INL: tl.constexpr, RW: tl.constexpr, RB: tl.constexpr, IB: tl.constexpr, NT: tl.constexpr,
                  OUT_C: tl.constexpr,
                  TIMING: tl.constexpr, TSLOTS: tl.constexpr):
    """Request in, answer out, through the same polling and payload as the model kernels:
    answers each request with out[k, 0, 0:3] = seq, slots[0], positions[0] (as floats)."""
    r = tl.load(ctrl_ptr + _CTRL_DONE, volatile=True) * 0  # int64 zero (the host cleared the ring)
    running = 1
    while running == 1:
        kind, n = _lead_take_request(hdr_ptr, hdr_h_ptr, stop_ptr, pay_i_ptr, pay_f_ptr, pay_h_i_ptr, pay_h_f_ptr,
                                     r, NREQ, PW, MAX_B, ROWS_AT, INL, RW, RB, IB, NT)
        if kind != _KIND_STOP:
            _stamp(time_ptr, (r % TSLOTS) * 2, TIMING)
            slots, positions, rows = _payload(pay_i_ptr, pay_f_ptr, r, NREQ, PW, MAX_B, ROWS_AT)
            o = out_ptr + (r % NREQ) * (MAX_B * OUT_C)
            tl.store(o, (r + 1).to(tl.float32))
            tl.store(o + 1, tl.load(slots, volatile=True).to(tl.float32))
            tl.store(o + 2, tl.load(positions, volatile=True).to(tl.float32))
            _stamp(time_ptr, (r % TSLOTS) * 2 + 1, TIMING)
            _release_done(ctrl_ptr, r + 1)
            r += 1
        else:
            running = 0


class FloorKernel(PersistentKernel):
    """The floor of the request path: one program, no model (see `_floor_kernel`)."""

    def __init__(self, ring: RequestRing, device: torch.device | str, *, timing: bool = False,
                 inline_entries: int = 0) -> None:
        """inline_entries: steps of at most this many entries go inline (`RequestRing.enable_inline`):
        the floor of that path."""
        super().__init__(ring, device, timing=timing)
        ring.enable_inline(inline_entries)

    @property
    def programs(self) -> int:
        return 1

    def _launch_spec(self) -> tuple:
        return (_floor_kernel, (1,), (*self.ring_args(), self.times),
                dict(**self.ring_consts(), OUT_C=OUT_COLS, TIMING=self.timing, TSLOTS=self.time_slots,
                     num_warps=self.num_warps, num_stages=NUM_STAGES))

    def _zero_state(self) -> None:
        pass
