"""DecisionSubscriber: a service's decisions and Status, typed, blocking or asyncio.

What it yields, in wire order: `Decision` (the wire struct itself: one per answer,
whether the service sent Decision frames or DecisionBatch frames, which are
unpacked here) and `ServiceStatus` (a Status with what this subscriber concluded
from it: a restart, a stop, frames the service could not send).

Per-instrument sequence gaps in the answers mean nothing (conflation skips
events by design), so loss is judged from what the wire does say: the Status
counters (`egress_dropped`: frames the service could not send; counters that go
back: a new run of the service) and the final Status (`final = true`: the
service stopped; `error` says why when it failed).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec
import zmq

from hft_infer.client.endpoints import KeyPath, curve_keys, service_endpoints
from hft_infer.transport.codec import BATCH_TOPIC, SERVICE_TOPIC, EgressDecoder, decisions_of_batch, topic_for
from hft_infer.transport.schema import Decision, DecisionBatch, Status
from hft_infer.transport.shm import ShmSubscriber
from hft_infer.transport.sockets import CurveServer, open_subscriber

log = logging.getLogger("hft_infer.client")

SHM_TICK_S = 50e-6  # blocking reads over iceoryx2 look this often (no FD to sleep on)
_EVENTS, _POLLIN, _RCVMORE, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.RCVMORE), int(zmq.NOBLOCK)
# Counters of one run only go up; one that goes back means a new run (a restarted service).
_MONOTONIC = ("received", "decided", "shed", "conflated", "rejected", "egress_dropped", "seq_gaps", "resets",
              "ingest_disconnects")


class EgressModeError(RuntimeError):
    """An instrument filter met a service in `egress.mode = "batch"` (its answers carry no
    per-instrument topic, so a filtering subscriber would never see them)."""


@dataclass(frozen=True, slots=True)
class ServiceStatus:
    """A Status from the service, and what it tells about the stream."""

    status: Status
    """The wire message: the service's counters (README, *Status*)."""
    restarted: bool
    """A new run of the service since the previous Status this subscriber saw: a counter went
    back, the previous Status was final, or the engine or model version changed. Decisions of
    the old run that were still in flight may be lost; per-instrument state starts afresh.
    The Status carries no run id, so a run that was killed (no final Status) and whose
    successor had already counted more events than it by the time its first Status reached
    this subscriber goes unnoticed."""
    why: str
    """Why `restarted` is set ("" when it is not)."""
    egress_dropped_since_last: int | None
    """Frames (decisions or Status) the service could not send since the previous Status of
    the same run (a subscriber's pipe was full: with XPUB_NODROP every subscriber misses
    them); after a restart, the new run's count so far; None for the first Status seen,
    since the count may predate this subscriber."""

    @property
    def stopped(self) -> bool:
        """The service's last Status before it exits (`final`): nothing more comes from this run."""
        return self.status.final

    @property
    def error(self) -> str:
        """What failed, in the final Status of a service that stopped on an error ("" otherwise)."""
        return self.status.error


@dataclass
class SubscriberStats:
    """What this subscriber has received (all counts since it was opened)."""

    frames: int = 0  # messages read from the socket (a topic frame and its payload count once)
    decisions: int = 0  # Decisions delivered (batch rows included)
    batches: int = 0  # DecisionBatch frames unpacked
    statuses: int = 0
    malformed: int = 0  # messages skipped: wrong frame count or topic size, not an egress message
    last_malformed: str = ""
    restarts: int = 0
    stops: int = 0  # final Status messages seen
    egress_dropped: int = 0  # sum of ServiceStatus.egress_dropped_since_last


Item = Decision | ServiceStatus


class DecisionSubscriber:
    """Reads a service's decision socket (not thread-safe: one thread or one event loop).

    endpoint: the service's `egress.endpoint` (`DecisionSubscriber.for_service()` reads it
    from the config). instruments: None subscribes to everything; a list of ids subscribes
    to those instruments' topics only, which works with `egress.mode = "per_instrument"`
    alone: a `DecisionBatch` (topic `ff ff ff fe`) holds every instrument's answers and no
    topic filter can split it. The subscriber therefore also subscribes to the batch topic
    when it filters, to notice: with `on_batch="raise"` (default) a batch raises
    `EgressModeError` from the call that reads it; with `on_batch="filter"` its rows of
    other instruments are dropped here (the frames still cross the socket). Status (topic
    `ff ff ff ff`) is always subscribed.

    Items come out in wire order from `recv(timeout_s)`, `poll()` (what is waiting, never
    blocks), `for item in sub.iter(timeout_s)` / `for item in sub` and, in asyncio (also under
    uvloop), `await sub.arecv(timeout_s)` / `async for item in sub.aiter(timeout_s)`. A
    malformed message is counted in `stats` (logged at the 1st, 10th, 100th, ...) and
    skipped, never raised. Decisions sent before the subscription reached the service are
    not seen (ZeroMQ): `wait_for_service()` returns once the first Status has arrived.

    rcv_hwm: messages queued here before libzmq stops taking more (0 = unlimited, the
    default: the service's XPUB_NODROP turns a full pipe into drops for every subscriber).
    CURVE: `curve_secret` (this client's `NAME.key_secret`, listed in the service's
    `security.curve_authorized_dir`) and `curve_server_public` (the service's `NAME.key`).
    Errors are one line: `EndpointError`, `CurveKeyError`, `ValueError`.
    """

    def __init__(self, endpoint: str, *, instruments: Iterable[int] | None = None, topic_frame: bool = True,
                 on_batch: Literal["raise", "filter"] = "raise", rcv_hwm: int = 0, allow_remote: bool = False,
                 curve_secret: KeyPath | None = None, curve_server_public: KeyPath | None = None,
                 ctx: zmq.Context | None = None, transport: Literal["zmq", "iceoryx2"] = "zmq",
                 shm_buffer: int = 4096) -> None:
        if on_batch not in ("raise", "filter"):
            raise ValueError(f"on_batch must be 'raise' or 'filter', not {on_batch!r}")
        if transport not in ("zmq", "iceoryx2"):
            raise ValueError(f"transport must be 'zmq' or 'iceoryx2', not {transport!r}")
        self.shm = transport == "iceoryx2"
        if self.shm:
            topic_frame = False  # a service's iceoryx2 stream has no topic frames: filtered after decoding
        wanted = None if instruments is None else frozenset(int(i) for i in instruments)
        if wanted is not None and not topic_frame and not self.shm:
            raise ValueError("an instrument filter needs topic frames (egress.topic_frame = true)")
        curve = curve_keys(curve_secret, curve_server_public)
        if isinstance(curve, CurveServer):
            raise ValueError("a subscriber is a CURVE client: give curve_server_public (the service's NAME.key)")
        topics = None if wanted is None else [topic_for(i) for i in sorted(wanted)] + [BATCH_TOPIC, SERVICE_TOPIC]
        self._own_ctx = ctx is None and not self.shm
        self.ctx = ctx if ctx is not None or self.shm else zmq.Context()
        try:
            if self.shm:  # endpoint: the egress.shm_service name (transport/shm.py)
                self._sock = ShmSubscriber(endpoint, buffer=shm_buffer, role="decision-subscriber")
                self._read = self._read_shm
            else:
                self._sock = open_subscriber(self.ctx, endpoint, topics=topics, rcv_hwm=rcv_hwm,
                                             allow_remote=allow_remote, curve=curve)
        except BaseException:
            if self._own_ctx:
                self.ctx.term()
            raise
        self.endpoint = endpoint
        self.instruments = wanted
        self.topic_frame = topic_frame
        self.on_batch = on_batch
        self.stats = SubscriberStats()
        self.last_status: ServiceStatus | None = None
        """The latest ServiceStatus received (also the one `wait_for_service` returned)."""
        self._items: collections.deque[Item] = collections.deque()
        self._decode = EgressDecoder().decode

    @classmethod
    def for_service(cls, config: str | None = None, overrides: Sequence[str] = (), **kwargs) -> DecisionSubscriber:
        """A subscriber of the service that `hft-infer serve -c CONFIG --set ...` runs; an
        instrument filter against a config in batch mode fails here already (EgressModeError,
        unless on_batch="filter"). `kwargs` go to the constructor."""
        ep = service_endpoints(config, overrides)
        if kwargs.get("instruments") is not None and ep.egress_mode == "batch" and \
                kwargs.get("on_batch", "raise") == "raise":
            raise EgressModeError(_batch_message(ep.decisions))
        opts = dict(topic_frame=ep.decisions_topic_frame, allow_remote=ep.allow_remote,
                    transport=ep.decisions_transport, shm_buffer=ep.decisions_shm_buffer)
        return cls(ep.decisions, **{**opts, **kwargs})

    # ------------------------------------------------------------------ blocking

    def poll(self, max_items: int = 10_000) -> list[Item]:
        """Every item waiting (at most `max_items`), without blocking; [] if none."""
        self._read(max_items)
        items = self._items
        return [items.popleft() for _ in range(min(max_items, len(items)))]

    def recv(self, timeout_s: float | None = None) -> Item | None:
        """The next item; waits at most `timeout_s` seconds (None: forever), then None."""
        if self._items or self._read(1024):
            return self._items.popleft()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left_ms = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            if self._wait_input(left_ms) and self._read(1024):
                return self._items.popleft()
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def iter(self, timeout_s: float | None = None) -> Iterator[Item]:
        """Items as they come; ends when none arrived for `timeout_s` seconds (None: never)."""
        while (item := self.recv(timeout_s)) is not None:
            yield item

    def __iter__(self) -> Iterator[Item]:
        return self.iter()

    def wait_for_service(self, timeout_s: float = 10.0) -> ServiceStatus:
        """Block until a Status arrives (the service sends one every `egress.status_interval_ms`):
        from then on this subscription is live. Returns it without queueing it; decisions that
        came first stay queued. TimeoutError after `timeout_s` seconds."""
        deadline = time.monotonic() + timeout_s
        while (status := self._take_status()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(self._no_status(timeout_s))
            self._wait_input(max(1, int(left * 1000)))
        return status

    def _take_status(self) -> ServiceStatus | None:
        self._read(1024)
        for k, item in enumerate(self._items):
            if isinstance(item, ServiceStatus):
                del self._items[k]
                return item
        return None

    def _no_status(self, timeout_s: float) -> str:
        return (f"no Status from {self.endpoint} within {timeout_s:g} s: "
                "is the service running with this egress.endpoint?")

    # ------------------------------------------------------------------ asyncio

    async def await_service(self, timeout_s: float = 10.0) -> ServiceStatus:
        """`wait_for_service` for asyncio: the event loop runs other tasks meanwhile."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (status := self._take_status()) is None:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(self._no_status(timeout_s))
            await self._readable(loop, left)
        return status

    async def arecv(self, timeout_s: float | None = None) -> Item | None:
        """`recv` for asyncio: waits on the socket's file descriptor (loop.add_reader), so it
        runs under any asyncio loop that supports readers (the default one, uvloop)."""
        if self._items or self._read(1024):
            return self._items.popleft()
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return None
            await self._readable(loop, left)
            if self._read(1024):
                return self._items.popleft()

    async def aiter(self, timeout_s: float | None = None) -> AsyncIterator[Item]:
        """`iter` for asyncio: `async for item in sub.aiter(timeout_s)`."""
        while (item := await self.arecv(timeout_s)) is not None:
            yield item

    def __aiter__(self) -> AsyncIterator[Item]:
        return self.aiter()

    def _wait_input(self, timeout_ms: int | None) -> bool:
        """Until input may be waiting or `timeout_ms` passed (None: forever)."""
        if not self.shm:
            return bool(self._sock.poll(timeout_ms))
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        has = self._sock.has_samples
        while not has():  # iceoryx2 has no FD to block on: look every SHM_TICK_S
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(SHM_TICK_S)
        return True

    async def _readable(self, loop: asyncio.AbstractEventLoop, timeout_s: float | None) -> None:
        if self.shm:
            deadline = None if timeout_s is None else loop.time() + timeout_s
            while not self._sock.has_samples() and (deadline is None or loop.time() < deadline):
                await asyncio.sleep(SHM_TICK_S)
            return
        # ZMQ_FD is edge-triggered: it signals that the socket's state may have changed, and
        # reading ZMQ_EVENTS is what re-arms it. The reader callback therefore reads EVENTS
        # itself (so the loop does not call it again and again while we are not scheduled),
        # and EVENTS is checked once after registering, for what arrived before.
        sock = self._sock
        fd = sock.getsockopt(zmq.FD)
        ready = loop.create_future()

        def on_fd() -> None:
            if not ready.done() and sock.getsockopt(_EVENTS) & _POLLIN:
                ready.set_result(None)

        loop.add_reader(fd, on_fd)
        try:
            on_fd()
            if not ready.done():
                try:
                    await asyncio.wait_for(ready, timeout_s)
                except TimeoutError:
                    pass
        finally:
            loop.remove_reader(fd)

    # ------------------------------------------------------------------ frames

    def _read(self, limit: int) -> int:
        """Read up to `limit` messages that are waiting; returns the number of items queued."""
        sock = self._sock
        recv, getsockopt = sock.recv, sock.getsockopt
        before = len(self._items)
        n = 0
        while n < limit and getsockopt(_EVENTS) & _POLLIN:
            n += 1
            self.stats.frames += 1
            first = recv(_NOBLOCK)
            more = getsockopt(_RCVMORE)
            if self.topic_frame:
                if not more:
                    self._malformed(f"one frame ({len(first)} bytes) where a topic frame and a message belong")
                    continue
                payload = recv(_NOBLOCK)
                more = getsockopt(_RCVMORE)
            else:
                payload = first
            if more:
                parts = 0
                while getsockopt(_RCVMORE):
                    recv(_NOBLOCK)
                    parts += 1
                self._malformed(f"{parts} more frame{'s' if parts > 1 else ''} than expected")
                continue
            if self.topic_frame and len(first) != 4:
                self._malformed(f"topic frame of {len(first)} bytes (4 expected)")
                continue
            try:
                msg = self._decode(payload)
            except msgspec.DecodeError as e:  # ValidationError is a subclass
                self._malformed(f"not a Decision, DecisionBatch or Status: {e}")
                continue
            self._accept(msg)
        return len(self._items) - before

    def _read_shm(self, limit: int) -> int:
        """`_read` over iceoryx2: one sample is one whole message; an instrument filter applies here."""
        before = len(self._items)
        recv, decode = self._sock.recv, self._decode
        wanted = self.instruments
        for _ in range(limit):
            payload = recv()
            if payload is None:
                break
            self.stats.frames += 1
            try:
                msg = decode(payload)
            except msgspec.DecodeError as e:
                self._malformed(f"not a Decision, DecisionBatch or Status: {e}")
                continue
            if wanted is not None and type(msg) is Decision and msg.instrument not in wanted:
                continue
            self._accept(msg)
        return len(self._items) - before

    def _accept(self, msg) -> None:
        if type(msg) is Decision:
            self._items.append(msg)
            self.stats.decisions += 1
        elif type(msg) is DecisionBatch:
            self.stats.batches += 1
            rows = decisions_of_batch(msg)
            if self.instruments is not None:
                if self.on_batch == "raise":
                    raise EgressModeError(_batch_message(self.endpoint))
                rows = [d for d in rows if d.instrument in self.instruments]
            self._items.extend(rows)
            self.stats.decisions += len(rows)
        else:
            self._items.append(self._service_status(msg))

    def _service_status(self, st: Status) -> ServiceStatus:
        prev = self.last_status.status if self.last_status is not None else None
        why = ""
        if prev is not None:
            if prev.final:
                why = "the previous Status was final"
            elif (prev.engine, prev.model_version) != (st.engine, st.model_version):
                why = f"engine/model changed ({prev.engine} {prev.model_version} -> {st.engine} {st.model_version})"
            else:
                back = [f for f in _MONOTONIC if getattr(st, f) < getattr(prev, f)]
                if back:
                    why = f"counters went back ({', '.join(back)})"
        if prev is None:
            dropped = None
        elif why:
            dropped = st.egress_dropped  # everything the new run could not send so far
        else:
            dropped = st.egress_dropped - prev.egress_dropped
        s = self.stats
        s.statuses += 1
        s.restarts += bool(why)
        s.stops += st.final
        s.egress_dropped += dropped or 0
        if why:
            log.warning("%s: the service restarted (%s)", self.endpoint, why)
        if st.final:
            log.info("%s: the service stopped%s", self.endpoint, f" on an error: {st.error}" if st.error else "")
        self.last_status = ServiceStatus(st, bool(why), why, dropped)
        return self.last_status

    def _malformed(self, what: str) -> None:
        s = self.stats
        s.malformed += 1
        s.last_malformed = what[:200]
        n = s.malformed
        if n == 10 ** (len(str(n)) - 1):  # the 1st, 10th, 100th, ...: a stream of garbage logs a few lines
            log.warning("%s: malformed message #%d skipped: %s", self.endpoint, n, s.last_malformed)

    # ------------------------------------------------------------------ life cycle

    def close(self) -> None:
        """Close the socket (and the context, if this subscriber made it)."""
        if not self._sock.closed:
            self._sock.close() if self.shm else self._sock.close(0)
        if self._own_ctx and not self.ctx.closed:
            self.ctx.term()

    def __enter__(self) -> DecisionSubscriber:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _batch_message(endpoint: str) -> str:
    return (f"{endpoint} sends DecisionBatch frames (egress.mode = \"batch\"): an instrument filter only works "
            "with egress.mode = \"per_instrument\"; subscribe to every instrument, pass on_batch=\"filter\", "
            "or run the service with --set egress.mode=per_instrument")
