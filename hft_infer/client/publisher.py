"""FeedPublisher: quotes, trades, heartbeats and resets onto a service's feed socket.

The wire is README.md's *Wire schema*; this class only saves a Python caller the
framing, the sequence numbers and the timestamps. There is no batch message on
the feed: `publish_quotes` / `publish_trades` send many frames in one call,
with the socket's bound methods, plain int flags and one reused encode buffer.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Sequence
from typing import Literal

import msgspec
import numpy as np
import zmq

from hft_infer.client.endpoints import KeyPath, curve_keys, service_endpoints
from hft_infer.transport.codec import BATCH_TOPIC, SERVICE_TOPIC, event_batch, shard_batch_topic, topic_for
from hft_infer.transport.curve import ZapAuthenticator
from hft_infer.transport.schema import (
    ALL_INSTRUMENTS,
    BYTES_PER_LEVEL,
    MAX_INSTRUMENT_ID,
    NO_PRIORITY,
    Heartbeat,
    Quote,
    Reset,
    Trade,
)
from hft_infer.transport.shm import ShmPublisher
from hft_infer.transport.sockets import CurveServer, open_egress, open_publisher

_MORE_NOBLOCK = int(zmq.SNDMORE) | int(zmq.NOBLOCK)  # ints: an enum flag costs an enum object per send
_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


class FeedPublisher:
    """Publishes market data to hft-infer services (not thread-safe: one thread per publisher).

    endpoint: the service's `ingest.endpoint` (`FeedPublisher.for_service()` reads it from
    the config). bind: True (default) binds it and the services connect, as with
    `ingest.bind = false`; False connects to a service that binds. socket_type: "pub"
    (default; an XPUB, so that subscriptions are visible to `wait_for_subscribers`, with
    XPUB_NODROP so that a full pipe is reported instead of dropped silently) or "push"
    (to a service whose ingest is a binding PULL). topic_frame: each message is preceded by
    the 4-byte big-endian instrument topic; Heartbeat and "Reset all" go on `ff ff ff ff`.

    Sequence numbers: each instrument's events are numbered 0, 1, 2, ... by the publisher;
    `reset()` restarts them at 0 for the instruments it resets. A new publisher starts every
    instrument at 0, which a running service takes as a publisher restart (counted as
    `seq_resets`), not as out of order. `ts_send_ns` is `time.time_ns()` taken just before
    each frame is encoded and sent.

    Sends never block. A frame that cannot be queued (some subscriber's pipe holds `snd_hwm`
    messages: with XPUB_NODROP the send then fails for every subscriber; for PUSH: the pipe
    is full, or a bound PUSH has no peer) is not sent, is counted in `dropped`, and consumes
    no sequence number, so the service sees no gap for it. A PUB frame sent before any
    subscription has arrived reaches nobody and is not counted as dropped (ZeroMQ
    semantics): call `wait_for_subscribers` first.

    Security: ipc:// and loopback tcp are plain; any other endpoint is refused unless
    `allow_remote=True` or CURVE keys are given (key files from `hft-infer keys generate`).
    With `curve_server_public` (the service's `NAME.key`) this side is the CURVE client
    (the service is the server: it binds its ingest, or it lists our public key); with
    only `curve_secret` it is the CURVE server and admits the clients whose public keys are
    in `curve_authorized_dir` (a service connecting with `security.curve_feed_public`).

    Errors are one line: `EndpointError` (malformed, refused or busy endpoint),
    `CurveKeyError` (key files), `ValueError` (arguments out of the wire's range).
    """

    def __init__(self, endpoint: str, *, bind: bool = True, socket_type: Literal["pub", "push"] = "pub",
                 topic_frame: bool = True, snd_hwm: int = 100_000, linger_ms: int = 2000,
                 allow_remote: bool = False, curve_secret: KeyPath | None = None,
                 curve_server_public: KeyPath | None = None, curve_authorized_dir: KeyPath | None = None,
                 source: str = "hft_infer.client", ctx: zmq.Context | None = None,
                 transport: Literal["zmq", "iceoryx2"] = "zmq", shm_buffer: int = 4096,
                 max_frame_bytes: int = 4096) -> None:
        if socket_type not in ("pub", "push"):
            raise ValueError(f"socket_type must be 'pub' or 'push', not {socket_type!r}")
        if transport not in ("zmq", "iceoryx2"):
            raise ValueError(f"transport must be 'zmq' or 'iceoryx2', not {transport!r}")
        self.shm = transport == "iceoryx2"
        if self.shm:
            self._init_shm(endpoint, shm_buffer, max_frame_bytes, source)
            return
        curve = curve_keys(curve_secret, curve_server_public)
        if isinstance(curve, CurveServer) and curve_authorized_dir is None:
            raise ValueError("a CURVE server (curve_secret without curve_server_public) needs curve_authorized_dir: "
                             "without it no client is admitted")
        self._own_ctx = ctx is None
        self.ctx = ctx if ctx is not None else zmq.Context()
        self._auth: ZapAuthenticator | None = None
        try:
            if isinstance(curve, CurveServer):  # handshakes need the ZAP handler before anyone connects
                self._auth = ZapAuthenticator(self.ctx, str(curve_authorized_dir)).start()
            if socket_type == "pub":
                # open_egress is the factory's XPUB with XPUB_NODROP: what a feed needs as well
                self._sock, resolved = open_egress(self.ctx, endpoint, bind_socket=bind, snd_hwm=snd_hwm,
                                                   linger_ms=linger_ms, allow_remote=allow_remote, curve=curve)
                # every (un)subscription reaches us, also repeated ones: counts per subscriber
                self._sock.setsockopt(zmq.XPUB_VERBOSER, 1)
            else:
                self._sock, resolved = open_publisher(self.ctx, endpoint, socket_type="push", bind_socket=bind,
                                                      snd_hwm=snd_hwm, allow_remote=allow_remote, curve=curve)
                self._sock.setsockopt(zmq.LINGER, linger_ms)
        except BaseException:
            self._close_rest()
            raise
        self.endpoint = resolved
        """The endpoint as bound or connected (a tcp port 0 resolved to the real port)."""
        self.socket_type = socket_type
        self.topic_frame = topic_frame
        self.source = source
        self.sent = 0
        """Frames sent (events, heartbeats, resets)."""
        self.dropped = 0
        """Frames not sent because they could not be queued (see the class docstring)."""
        self._seq: dict[int, int] = {}
        self._topics: dict[int, bytes] = {}
        self._subs: dict[bytes, int] = {}
        self._encoder = msgspec.msgpack.Encoder()
        self._buf = bytearray(512)

    def _init_shm(self, service: str, buffer: int, max_frame_bytes: int, source: str) -> None:
        """Over iceoryx2 (transport/shm.py): `endpoint` is the service name (`ingest.shm_service`);
        a frame that the service's full buffer cannot take is discarded, counted in `dropped`
        and takes no sequence number, as a full ZeroMQ pipe. No topic frames."""
        self._own_ctx, self.ctx, self._auth = False, None, None
        self._sock = ShmPublisher(service, buffer=buffer, max_frame_bytes=max_frame_bytes, block=False,
                                  role="feed-publisher")
        self.endpoint = service
        self.socket_type = "pub"
        self.topic_frame = False
        self.source = source
        self.sent = 0
        self.dropped = 0
        self._seq = {}
        self._topics = {}
        self._subs = {}
        self._encoder = msgspec.msgpack.Encoder()
        self._buf = bytearray(512)
        self._send = self._send_shm

    @classmethod
    def for_service(cls, config: str | None = None, overrides: Sequence[str] = (), **kwargs) -> FeedPublisher:
        """A publisher for the service that `hft-infer serve -c CONFIG --set ...` runs: its feed
        endpoint, which side binds, PUB or PUSH, topic framing. `kwargs` go to the constructor."""
        ep = service_endpoints(config, overrides)
        opts = dict(bind=ep.feed_bind, socket_type=ep.feed_socket_type, topic_frame=ep.feed_topic_frame,
                    allow_remote=ep.allow_remote, transport=ep.feed_transport, shm_buffer=ep.feed_shm_buffer)
        return cls(ep.feed, **{**opts, **kwargs})

    # ------------------------------------------------------------------ events

    def publish_quote(self, instrument: int, levels, *, ts_exchange_ns: int = 0, priority: int | None = None) -> bool:
        """One Quote. levels: array-like of shape (n_levels, 4) — bid price, bid size, ask price,
        ask size per level, best first — or the packed little-endian float32 block itself
        (16 * n_levels bytes). Values are sent as float32; the service rejects NaN, infinities
        and negative values (answered with reason NON_FINITE). ts_exchange_ns is carried, not
        interpreted. priority: scheduling class (0 = most urgent), None = the service's config.
        True if sent, False if dropped (see the class docstring)."""
        instrument = _check_instrument(instrument)
        book, n_levels = _book_block(levels)
        pri = _priority(priority)
        seq = self._seq.get(instrument, 0)
        topic = self._topic(instrument)
        msg = Quote(instrument, seq, int(ts_exchange_ns), time.time_ns(), n_levels, book, pri)
        if self._send(topic, msg):
            self._seq[instrument] = seq + 1
            return True
        return False

    def publish_trade(self, instrument: int, price: float, size: float, side: int, *, ts_exchange_ns: int = 0,
                      priority: int | None = None) -> bool:
        """One Trade: price and size (float64 on the wire; the service rejects values that are not
        finite, negative or not below 2**127), side the aggressor (+1 buyer, -1 seller). As
        `publish_quote` otherwise."""
        instrument = _check_instrument(instrument)
        if side not in (1, -1):
            raise ValueError(f"side must be +1 (buyer) or -1 (seller), not {side!r}")
        pri = _priority(priority)
        seq = self._seq.get(instrument, 0)
        msg = Trade(instrument, seq, int(ts_exchange_ns), time.time_ns(), float(price), float(size), int(side), pri)
        if self._send(self._topic(instrument), msg):
            self._seq[instrument] = seq + 1
            return True
        return False

    def publish_quotes(self, instruments, books, *, ts_exchange_ns=None, priorities=None) -> int:
        """Many Quotes in one call, in order. instruments: n ids; books: float32-convertible array
        of shape (n, n_levels, 4) or (n, 4 * n_levels); ts_exchange_ns and priorities: None, one
        int for all, or n ints. Each frame gets its own `ts_send_ns`. Returns the number of
        leading events sent: if a frame is dropped, it and the events after it are not sent
        and consume no sequence numbers, so the call can be repeated with the rest."""
        inst = _instrument_list(instruments)
        n = len(inst)
        block = np.ascontiguousarray(books, dtype="<f4")
        if block.ndim == 3 and block.shape[2] == 4:
            n_levels = block.shape[1]
        elif block.ndim == 2 and block.shape[1] % 4 == 0:
            n_levels = block.shape[1] // 4
        else:
            raise ValueError(f"books must have shape (n, n_levels, 4) or (n, 4 * n_levels), not {block.shape}")
        if block.shape[0] != n or n_levels < 1:
            raise ValueError(f"{n} instruments but books of shape {block.shape}")
        row = n_levels * BYTES_PER_LEVEL
        mv = memoryview(block).cast("B")
        return self._send_each(inst, ts_exchange_ns, priorities, lambda k, i, seq, ts_ex, now, pri: Quote(
            i, seq, ts_ex, now, n_levels, mv[k * row:(k + 1) * row], pri))

    def publish_trades(self, instruments, prices, sizes, sides, *, ts_exchange_ns=None, priorities=None) -> int:
        """Many Trades in one call, in order: n ids, n prices, n sizes, n sides (+1/-1); the other
        arguments and the return value as for `publish_quotes`."""
        inst = _instrument_list(instruments)
        n = len(inst)
        px = np.asarray(prices, dtype=np.float64).tolist()
        sz = np.asarray(sizes, dtype=np.float64).tolist()
        side_arr = np.asarray(sides).ravel()
        if not len(px) == len(sz) == side_arr.size == n:
            raise ValueError(f"{n} instruments, {len(px)} prices, {len(sz)} sizes and {side_arr.size} sides")
        if not np.isin(side_arr, (1, -1)).all():
            raise ValueError("sides must be +1 (buyer) or -1 (seller)")
        sd = side_arr.astype(np.int64).tolist()  # ints on the wire: a float 1.0 would not decode as a side
        return self._send_each(inst, ts_exchange_ns, priorities, lambda k, i, seq, ts_ex, now, pri: Trade(
            i, seq, ts_ex, now, px[k], sz[k], sd[k], pri))

    def publish_quote_batch(self, instruments, books, *, ts_exchange_ns=None, priorities=None,
                            shard: tuple[int, int] | None = None) -> int:
        """Many Quotes as ONE EventBatch frame (README *Wire schema*): the same events as
        `publish_quotes` sends one frame each, at the cost of one frame; the service handles a
        batch as columns (~0.3 µs per event against ~2.5 µs per single-quote frame on the H200
        host). Arguments as for `publish_quotes`; every quote gets the batch's `ts_send_ns`.
        Returns n, or 0 if the frame was dropped (no sequence number is taken then). Keep a
        frame under the service's ingest.max_batch_frame_bytes (65536: ~330 quotes of 10 levels).
        `shard=(I, N)`: the batch goes to `serve --shard I/N` only, under that shard's batch topic
        (codec.shard_batch_topic); every instrument in it must be one that shard owns (position in
        the universe's ids % N == I), as it rejects any other. Without it, a batch reaches
        unsharded services (and no shard)."""
        topic = BATCH_TOPIC if shard is None else shard_batch_topic(*shard)
        inst = _instrument_list(instruments)
        n = len(inst)
        block = np.ascontiguousarray(books, dtype="<f4")
        if block.ndim not in (2, 3) or block.shape[0] != n or n < 1 or (block.ndim == 3 and block.shape[2] != 4):
            raise ValueError(f"{n} instruments but books of shape {block.shape}")
        ts_ex = _column(ts_exchange_ns, n, 0, "ts_exchange_ns")
        pris = [_priority(p) for p in _column(priorities, n, None, "priorities")]
        seqs = dict(self._seq)
        seq = []
        for i in inst:
            s = seqs.get(i, 0)
            seq.append(s)
            seqs[i] = s + 1
        batch = event_batch(inst, seq, ts_ex, [time.time_ns()] * n, block,
                            None if all(p == NO_PRIORITY for p in pris) else pris)
        if not self._send(topic, batch):
            return 0
        self._seq = seqs
        return n

    def _send_each(self, inst: list[int], ts_exchange_ns, priorities, message) -> int:
        """Send `message(k, instrument, seq, ts_exchange_ns, ts_send_ns, priority)` for each k in
        order; stop at the first frame that cannot be queued (it takes no sequence number).
        Returns how many went out."""
        n = len(inst)
        ts_ex = _column(ts_exchange_ns, n, 0, "ts_exchange_ns")
        pris = [_priority(p) for p in _column(priorities, n, None, "priorities")]
        seqs, now, send = self._seq, time.time_ns, self._send
        for k in range(n):
            i = inst[k]
            seq = seqs.get(i, 0)
            if not send(self._topic(i), message(k, i, seq, ts_ex[k], now(), pris[k])):
                return k
            seqs[i] = seq + 1
        return n

    # ------------------------------------------------------------------ control messages

    def heartbeat(self) -> bool:
        """A Heartbeat (liveness; not an event) on `ff ff ff ff`. Also reads the subscription
        messages that have queued up meanwhile. True if sent."""
        self._read_subscriptions(0)
        return self._send(SERVICE_TOPIC, Heartbeat(time.time_ns(), self.source))

    def reset(self, instrument: int | None = None) -> bool:
        """A Reset of one instrument (on its topic) or, with None, of every instrument (on
        `ff ff ff ff`): the service forgets their state and sequence tracking, and this
        publisher numbers their next events from 0 again. True if sent; if dropped, the
        publisher's sequences are kept too."""
        if instrument is None:
            sent = self._send(SERVICE_TOPIC, Reset(time.time_ns(), ALL_INSTRUMENTS))
            if sent:
                self._seq.clear()
            return sent
        instrument = _check_instrument(instrument)
        sent = self._send(self._topic(instrument), Reset(time.time_ns(), instrument))
        if sent:
            self._seq.pop(instrument, None)
        return sent

    def next_seq(self, instrument: int) -> int:
        """The sequence number the next event of `instrument` will carry."""
        return self._seq.get(instrument, 0)

    # ------------------------------------------------------------------ subscriptions

    def wait_for_subscribers(self, n: int = 1, timeout_s: float = 10.0, *, topic: int | None = None) -> int:
        """Block until at least `n` subscriptions cover `topic` (an instrument id; None: the
        service topic `ff ff ff ff`, to which every hft-infer service subscribes for
        heartbeats and resets, so `n` counts services). Returns the count; raises
        TimeoutError after `timeout_s` seconds. A service subscribes to all its instrument
        topics before it connects, and libzmq sends a new peer's subscriptions in topic
        order, `ff ff ff ff` last: once it is counted, the instrument topics are in.
        PUB only (a PUSH socket sees no subscriptions)."""
        if self.socket_type != "pub":
            raise RuntimeError("wait_for_subscribers needs socket_type='pub': a PUSH socket sees no subscriptions")
        want = SERVICE_TOPIC if topic is None else topic_for(topic)
        deadline = time.monotonic() + timeout_s
        while True:
            have = sum(c for prefix, c in self._subs.items() if want.startswith(prefix))
            if have >= n:
                return have
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{have} of {n} subscribers of topic {want.hex()} after {timeout_s:g} s on "
                                   f"{self.endpoint}: is the service running with this ingest.endpoint?")
            self._read_subscriptions(min(left, 0.1))

    def subscriptions(self) -> dict[bytes, int]:
        """Live subscriptions: topic prefix -> number of subscribers (b"" = everything). PUB only."""
        if self.socket_type == "pub":
            self._read_subscriptions(0)
        return dict(self._subs)

    def _read_subscriptions(self, timeout_s: float) -> None:
        if self.shm:  # iceoryx2: the service's subscriber count (every subscriber takes every frame)
            if timeout_s > 0:
                time.sleep(min(timeout_s, 0.01))
            n = self._sock.subscribers()
            self._subs = {b"": n} if n else {}
            return
        if self.socket_type != "pub":
            return
        sock = self._sock
        if timeout_s > 0 and not sock.poll(int(timeout_s * 1000) or 1):
            return
        subs = self._subs
        while sock.getsockopt(_EVENTS) & _POLLIN:
            msg = sock.recv(_NOBLOCK)  # b"\x01" + prefix subscribes, b"\x00" + prefix unsubscribes
            if not msg:
                continue
            prefix = msg[1:]
            if msg[0] == 1:
                subs[prefix] = subs.get(prefix, 0) + 1
            elif msg[0] == 0 and subs.get(prefix, 0) > 0:
                subs[prefix] -= 1
                if not subs[prefix]:
                    del subs[prefix]

    # ------------------------------------------------------------------ frames

    def _topic(self, instrument: int) -> bytes:
        t = self._topics.get(instrument)
        if t is None:
            t = self._topics[instrument] = topic_for(instrument)
        return t

    def _send(self, topic: bytes, msg) -> bool:
        buf = self._buf
        self._encoder.encode_into(msg, buf)  # the reused buffer; zmq copies it (cheaper than zero-copy here)
        sock = self._sock
        try:
            if self.topic_frame:
                sock.send(topic, _MORE_NOBLOCK)
            sock.send(buf, _NOBLOCK)  # a multipart message is queued whole once its first frame is
        except zmq.Again:
            self.dropped += 1
            return False
        self.sent += 1
        return True

    def _send_shm(self, topic: bytes, msg) -> bool:
        if self._sock.send(self._encoder.encode(msg)):  # the frame bytes, unchanged (no topic frame)
            self.sent += 1
            return True
        self.dropped += 1
        return False

    # ------------------------------------------------------------------ life cycle

    def close(self, linger_ms: int | None = None) -> None:
        """Close the socket (frames still queued get `linger_ms`, default the constructor's, to
        leave), stop the CURVE authenticator and, if this publisher made it, the context."""
        sock = getattr(self, "_sock", None)
        if sock is not None and not sock.closed:
            sock.close() if self.shm else sock.close(linger_ms)
        self._close_rest()

    def _close_rest(self) -> None:
        if self.shm:
            return
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._own_ctx and not self.ctx.closed:
            self.ctx.term()

    def __enter__(self) -> FeedPublisher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_instrument(instrument) -> int:
    instrument = operator.index(instrument)  # numpy ints become ints (msgspec encodes only those); floats fail
    if not 0 <= instrument <= MAX_INSTRUMENT_ID:
        raise ValueError(f"instrument {instrument!r} outside 0..{MAX_INSTRUMENT_ID} "
                         "(0xFFFFFFFE and 0xFFFFFFFF are the batch and service topics)")
    return instrument


def _instrument_list(instruments) -> list[int]:
    ids = np.asarray(instruments, dtype=np.int64).ravel()
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) > MAX_INSTRUMENT_ID):
        raise ValueError(f"instrument ids must lie in 0..{MAX_INSTRUMENT_ID}")
    return ids.tolist()


def _priority(priority: int | None) -> int:
    if priority is None:
        return NO_PRIORITY
    priority = operator.index(priority)
    if priority < NO_PRIORITY:
        raise ValueError(f"priority must be >= 0 (or None for the service's config), not {priority}")
    return priority


def _book_block(levels) -> tuple[bytes | memoryview, int]:
    if isinstance(levels, (bytes, bytearray, memoryview)):
        size = memoryview(levels).nbytes
        if size == 0 or size % BYTES_PER_LEVEL:
            raise ValueError(f"a packed book is 16 bytes per level, got {size} bytes")
        return levels, size // BYTES_PER_LEVEL
    arr = np.ascontiguousarray(levels, dtype="<f4")
    if arr.ndim != 2 or arr.shape[1] != 4 or arr.shape[0] < 1:
        raise ValueError(f"levels must have shape (n_levels, 4): bid px, bid size, ask px, ask size; got {arr.shape}")
    return arr.tobytes(), arr.shape[0]


def _column(value, n: int, default, name: str) -> list:
    if value is None:
        return [default] * n
    if isinstance(value, (int, np.integer)):
        return [int(value)] * n
    out = np.asarray(value).tolist()
    if len(out) != n:
        raise ValueError(f"{name}: {len(out)} values for {n} events")
    return out
