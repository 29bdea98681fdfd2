"""Record a live feed into a capture file (`hft-infer record`).

One thread: poll the socket, read everything that is queued without blocking,
stamp each message with `time.time_ns()` right after its last frame arrives,
and hand it to the CaptureWriter, which writes a block every
`flush_records` records or `flush_ms` milliseconds. Nothing is decoded: the
frames are stored byte for byte, so a replay republishes exactly what was on
the wire, valid or not.

The subscriber never drops on its own: RCVHWM is 0 (unbounded) and
MAXMSGSIZE is off, so a slow disk shows up as memory growth, not as silent
loss (a PUB publisher can still drop at its own SNDHWM; the capture cannot
see that). Non-loopback endpoints are refused unless `allow_remote`.

Stops on `duration_s`, `max_events`, SIGINT/SIGTERM (the handlers only set a
flag; the loop notices within `_POLL_CAP_MS`), or a caller's `stop` event;
in every case the pending records are flushed and the trailer is written.
A feed that stays silent for `silence_s` is reported once (`on_silence`):
a SUB connected to the wrong endpoint records nothing and sees no error.

A start that fails (an endpoint in use, malformed, a failed bind) raises at
once: the context the recorder made is destroyed with linger 0, so the
socket of a failed bind cannot keep Context.term() waiting forever.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import zmq

from hft_infer.transport.shm import ShmSubscriber, service_of
from hft_infer.transport.sockets import open_ingest

from .capture import FLUSH_MS, FLUSH_RECORDS, CaptureWriter

# Longest poll, so that a signal flag or a stop event is seen promptly.
_POLL_CAP_MS = 50
SHM_TICK_S = 100e-6  # iceoryx2, nothing waiting: sleep this long before looking again
# Messages read per wake-up before the loop checks its deadlines again.
_BURST = 4096


@dataclass(frozen=True)
class RecordResult:
    path: Path
    endpoint: str
    records: int  # messages (events, heartbeats, anything) written, including earlier ones when appending
    recorded: int  # messages received by this call
    frames: int
    frame_bytes: int
    blocks: int
    file_bytes: int
    duration_s: float  # from the socket being ready to the stop
    stopped_by: str  # "duration" | "count" | "signal" | "stop"
    first_recv_ns: int
    last_recv_ns: int


def record(endpoint: str, out_path: str | Path, *, duration_s: float | None = None,
           max_events: int | None = None, topics: Iterable[bytes] | None = None, socket_type: str = "sub",
           bind: bool = False, allow_remote: bool = False, topic_frame: bool = True,
           flush_records: int = FLUSH_RECORDS, flush_ms: float = FLUSH_MS, fsync: bool = False,
           overwrite: bool = False, append: bool = False, ctx: zmq.Context | None = None,
           stop: threading.Event | None = None, on_ready: Callable[[str], None] | None = None,
           handle_signals: bool = True, on_silence: Callable[[float], None] | None = None,
           silence_s: float = 5.0, shm_buffer: int = 4096) -> RecordResult:
    """Subscribe to `endpoint` (SUB to everything by default, or PULL) and record every message.

    topics: SUB prefix filters (e.g. `topic_for(7)`); None records everything.
    on_ready(resolved_endpoint) is called once the socket is connected (or
    bound) and the file is created. handle_signals installs SIGINT/SIGTERM
    handlers while recording (main thread only). on_silence(seconds) is called
    once if no message has arrived `silence_s` after the socket was ready.
    `endpoint` = "iceoryx2:SERVICE" subscribes to that iceoryx2 service instead (a subscriber
    buffer of `shm_buffer` frames; no topic frames: the capture says so).
    """
    if duration_s is not None and duration_s <= 0:
        raise ValueError("duration_s must be positive")
    if max_events is not None and max_events <= 0:
        raise ValueError("max_events must be positive")
    own_ctx = ctx is None
    ctx = ctx or zmq.Context()
    stopped: list[str] = []
    old_handlers: dict[int, object] = {}

    def on_signal(signum, frame) -> None:
        stopped.append("signal")  # only flips state; the loop flushes and closes

    service = service_of(endpoint)
    try:
        if service is not None:  # iceoryx2 (transport/shm.py): one sample per message, no topic frames
            sock = ShmSubscriber(service, buffer=shm_buffer, role="recorder")
            resolved, topic_frame = sock.address, False
        else:
            sock, resolved = open_ingest(ctx, endpoint, socket_type=socket_type, bind_socket=bind, topics=topics,
                                         rcv_hwm=0, max_msg_size=-1, allow_remote=allow_remote)
        try:
            writer = CaptureWriter(out_path, endpoint=resolved, topic_frame=topic_frame,
                                   meta={"socket_type": socket_type, "bind": bind,
                                         "topics": [t.hex() for t in topics] if topics is not None else None},
                                   flush_records=flush_records, flush_ms=flush_ms, fsync=fsync,
                                   overwrite=overwrite, append=append)
        except BaseException:
            _close(sock)
            raise
        if handle_signals and threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                old_handlers[s] = signal.signal(s, on_signal)
        before = writer.records
        try:
            if on_ready is not None:
                on_ready(resolved)
            t0 = time.monotonic_ns()
            silence = (int(silence_s * 1e9), on_silence) if on_silence is not None else None
            stopped_by = _loop(sock, writer, t0, duration_s, max_events, stopped, stop, silence)
            t1 = time.monotonic_ns()
        finally:
            try:
                writer.close()
            finally:
                _close(sock)
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
        if own_ctx:
            # linger 0 and every socket closed, even one open_ingest made but failed to bind
            ctx.destroy(linger=0)
    path = Path(out_path)
    return RecordResult(path, resolved, writer.records, writer.records - before, writer.frames,
                        writer.frame_bytes, writer.blocks, path.stat().st_size, (t1 - t0) / 1e9, stopped_by,
                        writer.first_ns, writer.last_ns)


def _backend_method(sock: zmq.Socket, name: str):
    """The compiled pyzmq backend's method, bound to `sock` (falls back to the public one).

    zmq.Socket.recv_multipart is Python around the backend's recv and
    getsockopt; called directly and positionally with plain ints they cost
    less (~85,000 vs ~230,000 two-frame messages/s drained on the loaded
    2-core dev VM, tools/bench_capture.py has the recorder's end-to-end rate).
    What remains expensive is the RCVMORE query itself: pyzmq 27's get()
    builds a SocketOption enum from the option number on every call (~1 us
    on Python 3.11). It stays: without it a feed with an unexpected number
    of frames would be paired up wrongly.
    """
    for klass in type(sock).__mro__[1:]:
        if klass.__module__.startswith("zmq.backend") and name in vars(klass):
            return getattr(klass, name).__get__(sock)
    return getattr(sock, name)


def _loop(sock, writer: CaptureWriter, t0: int, duration_s: float | None, max_events: int | None,
          stopped: list[str], stop: threading.Event | None,
          silence: tuple[int, Callable[[float], None]] | None = None) -> str:
    deadline = t0 + int(duration_s * 1e9) if duration_s is not None else None
    silence_at = t0 + silence[0] if silence is not None else None
    limit = max_events if max_events is not None else -1
    n = 0
    read = _shm_reader(sock, writer) if isinstance(sock, ShmSubscriber) else _zmq_reader(sock, writer)
    monotonic_ns = time.monotonic_ns
    while True:
        if stopped:
            return stopped[0]
        if stop is not None and stop.is_set():
            return "stop"
        mono = monotonic_ns()
        if deadline is not None and mono >= deadline:
            return "duration"
        if silence_at is not None and mono >= silence_at:
            silence_at = None  # once: a quiet feed is worth one line, not one per poll
            if n == 0:
                silence[1]((mono - t0) / 1e9)
        writer.flush_if_due(mono)
        timeout_ms = _POLL_CAP_MS
        if deadline is not None:
            timeout_ms = min(timeout_ms, (deadline - mono) / 1e6)
        due = writer.flush_due_ns
        if due is not None:
            timeout_ms = min(timeout_ms, max(due - mono, 0) / 1e6)
        n = read(max(timeout_ms, 0.0), n, limit)
        if n == limit:
            return "count"


def _zmq_reader(sock: zmq.Socket, writer: CaptureWriter):
    """read(timeout_ms, n, limit) -> n: wait up to timeout_ms for a message, then record a burst."""
    # Bound once, flags as plain ints (zmq's IntFlag arithmetic and enum
    # conversions cost microseconds): this loop runs per message.
    poll, add, now_ns = sock.poll, writer.add, time.time_ns
    recv, get = _backend_method(sock, "recv"), _backend_method(sock, "get")
    noblock, rcvmore, again = int(zmq.NOBLOCK), int(zmq.RCVMORE), zmq.Again

    def read(timeout_ms: float, n: int, limit: int) -> int:
        if not poll(timeout_ms):
            return n
        for _ in range(_BURST):
            try:
                first = recv(noblock, True, False)
            except again:
                break
            if get(rcvmore):  # the rest of a multipart message is already here (delivery is atomic)
                frames = [first, recv(noblock, True, False)]
                while get(rcvmore):
                    frames.append(recv(noblock, True, False))
            else:
                frames = (first,)
            add(now_ns(), frames)  # stamped once the whole message is in
            n += 1
            if n == limit:
                break
        return n

    return read


def _shm_reader(sock: ShmSubscriber, writer: CaptureWriter):
    """As `_zmq_reader` over iceoryx2: one sample is one whole message; with no FD to poll, an
    empty subscriber sleeps SHM_TICK_S (at most timeout_ms)."""
    recv, add, now_ns = sock.recv, writer.add, time.time_ns

    def read(timeout_ms: float, n: int, limit: int) -> int:
        got = 0
        while got < _BURST:
            payload = recv()
            if payload is None:
                break
            got += 1
            add(now_ns(), (payload,))
            n += 1
            if n == limit:
                break
        if not got:
            time.sleep(min(SHM_TICK_S, timeout_ms / 1000))
        return n

    return read


def _close(sock) -> None:
    sock.close() if isinstance(sock, ShmSubscriber) else sock.close(0)


__all__ = ["RecordResult", "record"]
