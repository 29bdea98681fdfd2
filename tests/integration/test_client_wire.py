"""hft_infer.client against real ZeroMQ peers that send or expect hand-made frames.

What a live service cannot be made to do on demand is done here with a plain
socket speaking the README's wire: garbage and wrongly framed messages, a
Status sequence whose counters go back, DecisionBatch frames for a filtering
subscriber, silence (for the timeouts). The other side of each test is a real
socket from the project's socket factory or pyzmq; the client is never faked.
"""

from __future__ import annotations

import asyncio
import shutil
import time

import msgpack
import numpy as np
import pytest
import uvloop
import zmq

from hft_infer.client import (
    Decision,
    DecisionSubscriber,
    EgressModeError,
    EndpointError,
    FeedPublisher,
    ServiceStatus,
)
from hft_infer.transport.codec import BATCH_TOPIC, SERVICE_TOPIC, IngressDecoder, encode, topic_for
from hft_infer.transport.curve import CurveKeyError, load_keypair, write_keypair
from hft_infer.transport.schema import DecisionBatch, Heartbeat, Quote, Reset, Status, Trade
from hft_infer.transport.sockets import CurveClient, open_ingest

SAFETY_S = 20.0  # bound on waiting for something that must happen; not a latency assertion


def status(received: int, *, final: bool = False, dropped: int = 0, model: str = "m@1") -> bytes:
    return encode(Status(time.time_ns(), received, received, 0, 0, 0, 0, dropped, 0, [0] * 14, final, "eager",
                         model))


def decision(inst: int, seq: int) -> bytes:
    return encode(Decision(inst, seq, 0, 0, 1, 0.25, 0, 1, 2, 3, "m@1"))


def batch(rows: list[tuple[int, int]]) -> bytes:
    n = len(rows)
    inst = np.array([r[0] for r in rows], "<u4").tobytes()
    seq = np.array([r[1] for r in rows], "<u8").tobytes()
    z1, z4, z8 = bytes(n), bytes(4 * n), bytes(8 * n)
    return encode(DecisionBatch(7, "m@1", n, inst, seq, z1, z1, np.ones(n, "i1").tobytes(),
                                np.full(n, 0.5, "<f4").tobytes(), z4, z8, z8))


class FakeEgress:
    """The service's side of the decision socket: a real bound XPUB sending given frames."""

    def __init__(self, ctx: zmq.Context, sock_dir: str) -> None:
        self.sock = ctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscriber's subscriptions, repeated ones too
        self.sock.setsockopt(zmq.SNDHWM, 0)  # a PUB drops silently at its HWM (1000): no test may lose a frame
        self.endpoint = f"ipc://{sock_dir}/decisions.sock"
        self.sock.bind(self.endpoint)

    def wait_subscribed(self, n: int = 1) -> None:
        """Until n subscription messages arrived (so that nothing we send is lost to the filter)."""
        got = 0
        deadline = time.monotonic() + SAFETY_S
        while got < n:
            assert time.monotonic() < deadline, f"{got} of {n} subscriptions"
            if self.sock.poll(50):
                got += self.sock.recv()[:1] == b"\x01"

    def send(self, *frames: bytes) -> None:
        self.sock.send_multipart(list(frames))


@pytest.fixture
def egress(zctx, sock_dir):
    return FakeEgress(zctx, sock_dir)


def collect(sub: DecisionSubscriber, n: int) -> list:
    out = []
    deadline = time.monotonic() + SAFETY_S
    while len(out) < n and time.monotonic() < deadline:
        item = sub.recv(timeout_s=0.1)
        if item is not None:
            out.append(item)
    return out


def test_malformed_messages_are_counted_and_skipped(egress, zctx):
    with DecisionSubscriber(egress.endpoint, ctx=zctx) as sub:
        egress.wait_subscribed()
        egress.send(topic_for(1), decision(1, 0))
        egress.send(b"\x00\x00\x00\x01")  # a topic frame alone
        egress.send(topic_for(1), b"\x93garbage")  # not msgpack of ours
        egress.send(topic_for(1), encode(Quote(1, 0, 0, 0, 1, b"\0" * 16)))  # a feed message
        egress.send(b"\x01\x02", decision(1, 1))  # a 2-byte topic
        egress.send(topic_for(1), decision(1, 2), b"extra")  # three frames
        egress.send(topic_for(1), decision(1, 3))
        got = collect(sub, 2)
        assert [(d.instrument, d.seq) for d in got] == [(1, 0), (1, 3)]
        assert sub.stats.malformed == 5 and sub.stats.decisions == 2
        assert sub.stats.last_malformed == "1 more frame than expected"
        assert sub.poll() == []


def test_restarts_and_stops_are_read_from_status(egress, zctx):
    with DecisionSubscriber(egress.endpoint, ctx=zctx) as sub:
        egress.wait_subscribed()
        for payload in (status(10, dropped=2), status(20, dropped=5), status(3),  # counters went back
                        status(8, final=True),  # a stop
                        status(0),  # after a final Status: a new run
                        status(4, model="m@2")):  # another model: a new run as well
            egress.send(SERVICE_TOPIC, payload)
        got = collect(sub, 6)
    assert all(isinstance(s, ServiceStatus) for s in got)
    assert [s.restarted for s in got] == [False, False, True, False, True, True]
    assert [s.stopped for s in got] == [False, False, False, True, False, False]
    assert "counters went back (received, decided, egress_dropped)" in got[2].why
    assert got[4].why == "the previous Status was final" and "m@1 -> eager m@2" in got[5].why
    assert [s.egress_dropped_since_last for s in got] == [None, 3, 0, 0, 0, 0]
    assert sub.stats.restarts == 3 and sub.stats.stops == 1 and sub.last_status is got[-1]


def test_batches_are_unpacked_and_a_filter_meets_them_clearly(egress, zctx):
    rows = [(1, 10), (2, 20), (1, 11), (5, 50)]
    with DecisionSubscriber(egress.endpoint, ctx=zctx) as every, \
            DecisionSubscriber(egress.endpoint, instruments=[1], ctx=zctx) as strict, \
            DecisionSubscriber(egress.endpoint, instruments=[1, 5], on_batch="filter", ctx=zctx) as lenient:
        egress.wait_subscribed(1 + 3 + 4)  # b""; 1, batch, service; 1, 5, batch, service
        egress.send(BATCH_TOPIC, batch(rows))
        egress.send(topic_for(1), decision(1, 12))
        got = collect(every, 5)
        assert [(d.instrument, d.seq, d.score, d.ts_decision_ns) for d in got[:4]] == \
            [(i, s, 0.5, 7) for i, s in rows]
        assert all(type(d) is Decision for d in got) and every.stats.batches == 1
        assert [(d.instrument, d.seq) for d in collect(lenient, 4)] == [(1, 10), (1, 11), (5, 50), (1, 12)]
        with pytest.raises(EgressModeError, match=r'egress.mode = "batch".*per_instrument'):
            deadline = time.monotonic() + SAFETY_S
            while time.monotonic() < deadline:
                strict.recv(timeout_s=0.1)
        assert [(d.instrument, d.seq) for d in collect(strict, 1)] == [(1, 12)]  # it carries on after


def test_timeouts_and_asyncio_on_both_loops(egress, zctx):
    with DecisionSubscriber(egress.endpoint, ctx=zctx) as sub:
        egress.wait_subscribed()
        assert sub.recv(timeout_s=0.05) is None and sub.poll() == []
        assert list(sub.iter(timeout_s=0.05)) == []
        with pytest.raises(TimeoutError, match="no Status from"):
            sub.wait_for_service(timeout_s=0.05)

        async def consume(base: int) -> tuple[list, int, ServiceStatus]:
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.001)

            async def later():
                await asyncio.sleep(0.05)  # the consumer is parked on the socket's fd by then
                egress.send(SERVICE_TOPIC, status(base))
                for k in range(5):
                    egress.send(topic_for(3), decision(3, base + k))

            tick = asyncio.create_task(ticker())
            send = asyncio.create_task(later())
            first = await sub.await_service(timeout_s=SAFETY_S)
            got = []
            async for item in sub.aiter(timeout_s=SAFETY_S):
                got.append(item)
                if len(got) == 5:
                    break
            assert await sub.arecv(timeout_s=0.05) is None
            await send
            tick.cancel()
            return got, ticks, first

        for run, base in ((asyncio.run, 100), (uvloop.run, 200)):
            got, ticks, first = run(consume(base))
            assert [d.seq for d in got] == [base + k for k in range(5)]
            assert first.status.received == base and ticks > 0  # other tasks ran while it waited


def _sub_of(zctx, endpoint, curve=None):
    sock, _ = open_ingest(zctx, endpoint, curve=curve)  # the service's own ingest socket
    return sock


def _recv_frames(sock, n: int) -> list[list[bytes]]:
    out = []
    deadline = time.monotonic() + SAFETY_S
    while len(out) < n and time.monotonic() < deadline:
        if sock.poll(50):
            out.append(sock.recv_multipart())
    return out


def test_publisher_frames_sequences_and_resets(zctx, sock_dir):
    with FeedPublisher(f"ipc://{sock_dir}/md.sock", ctx=zctx) as pub:
        sub = _sub_of(zctx, pub.endpoint)
        assert pub.wait_for_subscribers(1, SAFETY_S) == 1
        assert pub.subscriptions() == {b"": 1}
        book = np.arange(8, dtype=np.float32).reshape(2, 4)
        t0 = time.time_ns()
        assert pub.publish_quote(7, book, ts_exchange_ns=5, priority=0)
        assert pub.publish_quote(np.int64(7), book.tobytes())
        assert pub.publish_trade(7, 101.5, 3, -1)
        assert pub.publish_quotes([4, 7], np.stack([book, book])) == 2
        assert pub.publish_trades([4], [9.5], [1.0], np.array([1.0]), priorities=3) == 1  # float sides too
        assert pub.next_seq(7) == 4 and pub.next_seq(4) == 2
        assert pub.reset(7) and pub.next_seq(7) == 0 and pub.next_seq(4) == 2
        assert pub.publish_quote(7, book)
        assert pub.heartbeat() and pub.reset()
        assert pub.next_seq(4) == 0
        frames = _recv_frames(sub, 10)
        t1 = time.time_ns()
    decode = IngressDecoder().decode
    msgs = [(f[0], decode(f[1])) for f in frames]
    assert all(len(f) == 2 for f in frames)
    assert [(type(m).__name__, t) for t, m in msgs] == [
        ("Quote", topic_for(7)), ("Quote", topic_for(7)), ("Trade", topic_for(7)), ("Quote", topic_for(4)),
        ("Quote", topic_for(7)), ("Trade", topic_for(4)), ("Reset", topic_for(7)), ("Quote", topic_for(7)),
        ("Heartbeat", SERVICE_TOPIC), ("Reset", SERVICE_TOPIC)]
    events = [m for _, m in msgs if isinstance(m, (Quote, Trade))]
    assert [(m.instrument, m.seq) for m in events] == [(7, 0), (7, 1), (7, 2), (4, 0), (7, 3), (4, 1), (7, 0)]
    assert all(t0 <= m.ts_send_ns <= t1 for m in events)  # stamped by the publisher when sent
    q = msgs[0][1]
    assert (q.n_levels, q.priority, q.ts_exchange_ns, bytes(q.book)) == (2, 0, 5, book.tobytes())
    assert msgs[1][1].priority == -1 and (msgs[5][1].priority, msgs[5][1].side) == (3, 1)
    assert (msgs[2][1].price, msgs[2][1].size, msgs[2][1].side) == (101.5, 3.0, -1)
    assert isinstance(msgs[8][1], Heartbeat) and msgs[8][1].source == "hft_infer.client"
    assert isinstance(msgs[9][1], Reset) and msgs[9][1].instrument == 0xFFFFFFFF
    # README: a client with only msgpack reads the same frame
    assert msgpack.unpackb(frames[0][1])[:3] == [1, 7, 0]


def test_subscriptions_follow_subscribers_and_push_needs_a_peer(zctx, sock_dir):
    with FeedPublisher(f"ipc://{sock_dir}/md.sock", ctx=zctx) as pub:
        subs = [open_ingest(zctx, pub.endpoint, topics=[topic_for(3), SERVICE_TOPIC])[0] for _ in range(2)]
        assert pub.wait_for_subscribers(2, SAFETY_S) == 2
        assert pub.wait_for_subscribers(2, SAFETY_S, topic=3) == 2
        with pytest.raises(TimeoutError, match="0 of 1 subscribers of topic 00000004"):
            pub.wait_for_subscribers(1, 0.05, topic=4)
        subs[0].close(0)
        deadline = time.monotonic() + SAFETY_S
        while pub.subscriptions().get(SERVICE_TOPIC) != 1:  # the unsubscription of a peer that left
            assert time.monotonic() < deadline, pub.subscriptions()
            time.sleep(0.01)
    with FeedPublisher(f"ipc://{sock_dir}/push.sock", socket_type="push", ctx=zctx) as push:
        assert not push.publish_quote(1, np.ones((1, 4)))  # bound PUSH, nobody connected: not queued
        assert push.dropped == 1 and push.next_seq(1) == 0
        with pytest.raises(RuntimeError, match="PUSH"):
            push.wait_for_subscribers(1, 0.01)


def test_errors_are_one_line(zctx, sock_dir, tmp_path):
    cases = [
        (lambda: FeedPublisher("md.sock", ctx=zctx), EndpointError, "has no scheme"),
        (lambda: FeedPublisher("tcp://10.1.2.3:5555", bind=False, ctx=zctx), EndpointError,
         "refusing non-loopback endpoint"),
        (lambda: DecisionSubscriber("tcp://0.0.0.0:5556", ctx=zctx), EndpointError, "refusing non-loopback"),
        (lambda: DecisionSubscriber("ipc:///x", instruments=[1], topic_frame=False, ctx=zctx), ValueError,
         "needs topic frames"),
        (lambda: FeedPublisher(f"ipc://{sock_dir}/md.sock", curve_secret=tmp_path / "none.key_secret",
                               ctx=zctx), CurveKeyError, "no such key file"),
        (lambda: FeedPublisher(f"ipc://{sock_dir}/md.sock", curve_server_public=tmp_path / "x.key", ctx=zctx),
         ValueError, "needs curve_secret"),
    ]
    for make, exc, text in cases:
        with pytest.raises(exc, match=text) as e:
            make()
        assert "\n" not in str(e.value), str(e.value)
    with FeedPublisher(f"ipc://{sock_dir}/md.sock", ctx=zctx) as pub:
        with pytest.raises(EndpointError, match="another process is serving this ipc path"):
            FeedPublisher(pub.endpoint, ctx=zctx)
        for bad, text in ((lambda: pub.publish_quote(1, np.ones((2, 3))), "shape"),
                          (lambda: pub.publish_quote(1, b"\0" * 15), "16 bytes per level"),
                          (lambda: pub.publish_quote(0xFFFFFFFF, np.ones((1, 4))), "outside"),
                          (lambda: pub.publish_trade(1, 1.0, 1.0, 0), "side"),
                          (lambda: pub.publish_trade(1, 1.0, 1.0, 1, priority=-2), "priority"),
                          (lambda: pub.publish_quotes([1, 2], np.ones((3, 1, 4))), "2 instruments"),
                          (lambda: pub.publish_trades([1], [1.0], [1.0], [2]), "sides")):
            with pytest.raises(ValueError, match=text):
                bad()
    with FeedPublisher("tcp://127.0.0.1:0", ctx=zctx) as pub:
        with pytest.raises(EndpointError, match="address already in use"):
            FeedPublisher(pub.endpoint, ctx=zctx)


def test_a_curve_server_publisher_admits_only_authorized_keys(zctx, tmp_path):
    """The publisher's server role (a service that connects with security.curve_feed_public)."""
    keys, authorized = tmp_path / "keys", tmp_path / "authorized"
    write_keypair(keys, "feed")
    write_keypair(keys, "service")
    authorized.mkdir()
    shutil.copy(keys / "service.key", authorized / "service.key")
    with pytest.raises(ValueError, match="needs curve_authorized_dir"):
        FeedPublisher("tcp://127.0.0.1:0", curve_secret=keys / "feed.key_secret")
    with FeedPublisher("tcp://127.0.0.1:0", curve_secret=keys / "feed.key_secret",
                       curve_authorized_dir=authorized) as pub:
        public, secret = load_keypair(keys / "service.key_secret")
        feed_public = load_keypair(keys / "feed.key_secret")[0]
        sub = _sub_of(zctx, pub.endpoint, CurveClient(public, secret, feed_public))
        assert pub.wait_for_subscribers(1, SAFETY_S) == 1  # subscriptions only travel after the handshake
        assert pub.publish_quote(2, np.ones((1, 4)))
        (frames,) = _recv_frames(sub, 1)
        assert frames[0] == topic_for(2) and isinstance(IngressDecoder().decode(frames[1]), Quote)


def test_a_flood_of_malformed_frames_does_not_park_the_asyncio_reader(egress, zctx):
    """One read takes at most 1024 messages; if all were malformed, more are still queued while
    the edge-triggered fd has been re-armed by that read: the reader must look before it waits."""
    with DecisionSubscriber(egress.endpoint, ctx=zctx) as sub:
        egress.wait_subscribed()
        for _ in range(1500):
            egress.send(topic_for(1), b"\xc1")  # never valid msgpack
        egress.send(topic_for(1), decision(1, 7))
        deadline = time.monotonic() + SAFETY_S
        while sub._sock.poll(0) == 0:  # the frames have reached our socket (internal: for the sync only)
            assert time.monotonic() < deadline

        async def first():
            return await asyncio.wait_for(sub.arecv(), SAFETY_S)

        d = asyncio.run(first())
        assert (d.instrument, d.seq) == (1, 7) and sub.stats.malformed == 1500
