"""Shared-memory publish-subscribe over iceoryx2 (the optional `shm` extra), for co-located peers.

The payload is the ZeroMQ frame's bytes, unchanged: one msgpack message (README.md, *Wire
schema*) in an iceoryx2 `[u8]` slice, so the one codec (and its DecisionBatch) serves both
transports; there is no topic frame (a service is one stream; a subscriber that wants some
instruments filters after decoding). tools/bench_shm.py measured the alternative, a
fixed-layout record read in place, and README.md, *Shared-memory transport*, says why the
frame won.

One iceoryx2 publish-subscribe service per stream, named from the config
(`ingest.shm_service`, `egress.shm_service`). Both sides create it or open it with the same
settings (`open_or_create`), so either may start first:

- `enable_safe_overflow(False)`: a full subscriber buffer is never overwritten silently;
- the publisher's backpressure strategy decides what happens then: `block=False`
  (`DiscardData`: the service's decision publisher, FeedPublisher) -> `send` returns False
  and the frame is counted in `dropped`; `block=True` (`RetryUntilDelivered`: the replay
  pacer) -> `send` waits until the reader has room, so a slow reader shows as latency;
- `buffer`: the subscriber's buffer in samples, also the service's maximum (both sides read it
  from the same config key; a service that exists with a smaller one cannot be opened).

Sending copies the frame into a loaned sample (one memmove); receiving copies the sample into
`bytes` (one ctypes.string_at) and releases it at once, so no Python object ever points into
shared memory that the publisher may reuse. Each wrapper owns one iceoryx2 node; creating it
first removes the resources of dead nodes (a process killed with -9), so a restart works.

Import cost: iceoryx2 is imported on first use, and `ShmUnavailable` (an EndpointError)
names the extra when it is missing.
"""

from __future__ import annotations

import ctypes
import os
import re
import time

from hft_infer.transport.sockets import EndpointError

EXTRA = "pip install 'hft-infer[shm]'"
# iceoryx2 ServiceName: a path of file-name-safe parts (checked here without importing iceoryx2)
SERVICE_NAME = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
MAX_PUBLISHERS = 8  # per service: feeds (pacer, FeedPublisher) or the service's egress
MAX_SUBSCRIBERS = 8  # per service: the service's ingest, or decision readers (collector, clients)
MAX_NODES = 32
OPEN_RETRY_S = 2.0  # open_or_create races with a peer creating the same service: retried this long


PREFIX = "iceoryx2:"  # an address "iceoryx2:SERVICE" names an iceoryx2 service where tools take endpoints


def service_of(address: str) -> str | None:
    """The iceoryx2 service an address names ("iceoryx2:SERVICE"), None for a ZeroMQ endpoint."""
    return address[len(PREFIX):] if address.startswith(PREFIX) else None


class ShmUnavailable(EndpointError):
    """The iceoryx2 transport was chosen but the package is not installed."""


def _iox():
    try:
        import iceoryx2
    except ImportError:
        raise ShmUnavailable(f"transport 'iceoryx2' needs the iceoryx2 package: {EXTRA}") from None
    return iceoryx2


def available() -> bool:
    try:
        _iox()
    except ShmUnavailable:
        return False
    return True


def check_service_name(name: str) -> None:
    if len(name) > 255 or not SERVICE_NAME.match(name):
        raise EndpointError(f"iceoryx2 service name {name!r}: parts of letters, digits, '_', '.', '-' "
                            "separated by '/' (at most 255 characters)")


class _Port:
    """One node and the publish-subscribe service it opened (or created)."""

    def __init__(self, service: str, role: str, *, buffer: int) -> None:
        check_service_name(service)
        iox = _iox()
        if not os.environ.get("IOX2_LOG_LEVEL"):
            iox.set_log_level(iox.LogLevel.Error)  # else a "no config file" notice per process
        self.iox = iox
        self.service_name = service
        self.node = iox.NodeBuilder.new().name(iox.NodeName.new(role)).create(iox.ServiceType.Ipc)
        # stale resources of nodes that died without cleaning up (kill -9): theirs to remove now
        self.cleanup = str(self.node.try_cleanup_dead_nodes())
        deadline = time.monotonic() + OPEN_RETRY_S
        while True:
            try:
                self.service = (self.node.service_builder(iox.ServiceName.new(service))
                                .publish_subscribe(iox.Slice[ctypes.c_uint8])
                                .enable_safe_overflow(False)
                                .subscriber_max_buffer_size(buffer)
                                .max_publishers(MAX_PUBLISHERS)
                                .max_subscribers(MAX_SUBSCRIBERS)
                                .max_nodes(MAX_NODES)
                                .open_or_create())
                break
            except Exception as e:  # noqa: BLE001 - PublishSubscribeOpenOrCreateError and kin
                if time.monotonic() >= deadline:
                    raise EndpointError(f"iceoryx2 service {service!r}: cannot open or create it ({e}); one that "
                                        "exists must have the same settings (safe overflow off, subscriber "
                                        f"buffer >= {buffer}, {MAX_PUBLISHERS} publishers, {MAX_SUBSCRIBERS} "
                                        "subscribers)") from None
                time.sleep(0.01)

    @property
    def address(self) -> str:
        return PREFIX + self.service_name

    def subscribers(self) -> int:
        return self.service.dynamic_config.number_of_subscribers


class ShmPublisher(_Port):
    """send(bytes) -> delivered (bool); never holds a loaned sample.

    block=False: a frame that some subscriber had no room for is counted in `dropped` and
    `send` returns False (the others got it, as iceoryx2 delivers per subscriber); block=True:
    `send` waits until every subscriber has room. A frame sent with no subscriber reaches
    nobody and is not dropped (as a ZeroMQ PUB)."""

    def __init__(self, service: str, *, max_frame_bytes: int = 4096, buffer: int = 4096, block: bool = False,
                 role: str = "publisher") -> None:
        super().__init__(service, role, buffer=buffer)
        iox = self.iox
        strategy = iox.BackpressureStrategy.RetryUntilDelivered if block else iox.BackpressureStrategy.DiscardData
        self.pub = (self.service.publisher_builder()
                    .initial_max_slice_len(max_frame_bytes)
                    .allocation_strategy(iox.AllocationStrategy.PowerOfTwo)  # a larger frame grows the segment
                    .backpressure_strategy(strategy)
                    .create())
        self._loan = self.pub.loan_slice_uninit
        self._subs = 0  # subscribers last seen: a send that reaches fewer was dropped by someone
        self.sent = 0
        self.dropped = 0
        self.closed = False

    def send(self, data) -> bool:
        n = len(data)
        sample = self._loan(n)
        ctypes.memmove(sample.payload_ptr, bytes(data) if type(data) is not bytes else data, n)
        delivered = sample.assume_init().send()
        if delivered < self._subs:
            self._subs = self.subscribers()  # cold: one left, or a full buffer
            if delivered < self._subs:
                self.dropped += 1
                return False
        else:
            self._subs = delivered
        self.sent += 1
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pub.delete()
            self.pub = self._loan = None


class ShmSubscriber(_Port):
    """recv() -> the next frame as bytes, or None when there is none (never blocks)."""

    def __init__(self, service: str, *, buffer: int = 4096, role: str = "subscriber") -> None:
        super().__init__(service, role, buffer=buffer)
        self.sub = self.service.subscriber_builder().buffer_size(buffer).create()
        self._receive = self.sub.receive
        self.has_samples = self.sub.has_samples
        self.closed = False

    def recv(self) -> bytes | None:
        sample = self._receive()
        if sample is None:
            return None
        data = ctypes.string_at(sample.payload_ptr, sample.header.number_of_elements)
        sample.delete()  # back to the publisher now: the bytes are ours
        return data

    def recv_many(self, limit: int) -> list[bytes]:
        out = []
        recv = self.recv
        while len(out) < limit:
            data = recv()
            if data is None:
                break
            out.append(data)
        return out

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sub.delete()
            self.sub = self._receive = self.has_samples = None
