"""Real ZeroMQ sockets over ipc and tcp loopback: framing, filtering, safety checks."""

from __future__ import annotations

import os
import socket as pysocket

import numpy as np
import pytest
import zmq

from hft_infer.transport.codec import IngressDecoder, encode, pack_book, topic_for
from hft_infer.transport.schema import Quote
from hft_infer.transport.sockets import (
    EndpointError,
    check_endpoint,
    ensure_bindable,
    is_local_endpoint,
    open_egress,
    open_ingest,
    open_publisher,
    open_subscriber,
    parse_endpoint,
)


def _quote(inst, seq):
    return encode(Quote(inst, seq, 0, 0, 1, pack_book(np.ones((1, 4), np.float32))))


def _recv_all(sock, timeout_ms=500):
    out = []
    while sock.poll(timeout_ms):
        out.append(sock.recv_multipart())
        timeout_ms = 100
    return out


def _endpoints(sock_dir):
    return [f"ipc://{sock_dir}/feed.sock", "tcp://127.0.0.1:0"]


@pytest.mark.parametrize("kind", ["ipc", "tcp"])
def test_pub_sub_topic_filtering(zctx, sock_dir, kind):
    endpoint = f"ipc://{sock_dir}/feed.sock" if kind == "ipc" else "tcp://127.0.0.1:0"
    pub, resolved = open_publisher(zctx, endpoint)
    sub, _ = open_ingest(zctx, resolved, topics=[topic_for(2), topic_for(5)])
    # slow-joiner: publish until the subscription has propagated
    for _ in range(200):
        pub.send_multipart([topic_for(2), _quote(2, 0)])
        if sub.poll(10):
            break
    _recv_all(sub, 200)
    for seq in range(1, 11):
        for inst in range(8):
            pub.send_multipart([topic_for(inst), _quote(inst, seq)])
    got = _recv_all(sub)
    dec = IngressDecoder().decode
    seen = [(dec(m[1]).instrument, dec(m[1]).seq) for m in got]
    assert sorted(seen) == sorted((i, s) for i in (2, 5) for s in range(1, 11))
    assert all(m[0] == topic_for(dec(m[1]).instrument) for m in got)


@pytest.mark.parametrize("opener", ["ingest", "subscriber"])
def test_a_universe_of_thousands_of_topics_reaches_the_publisher_whole(zctx, sock_dir, opener):
    """libzmq replays a SUB's subscriptions to a new connection and dropped those past the SUB's
    SNDHWM (1,000 by default): with 3,000 instrument topics the publisher saw 1,000 and the
    other instruments' events never arrived."""
    pub = zctx.socket(zmq.XPUB)  # sees every subscription message
    pub.bind(f"ipc://{sock_dir}/xpub.sock")
    topics = [topic_for(i) for i in range(3_000)]
    if opener == "ingest":
        sub, _ = open_ingest(zctx, f"ipc://{sock_dir}/xpub.sock", topics=topics)
    else:
        sub = open_subscriber(zctx, f"ipc://{sock_dir}/xpub.sock", topics=topics)
    seen = set()
    while pub.poll(1000):
        while pub.poll(0):
            msg = pub.recv()
            assert msg[:1] == b"\x01"
            seen.add(msg[1:])
    assert seen == set(topics)
    pub.send_multipart([topic_for(2_999), _quote(2_999, 1)])  # the last instrument's events arrive too
    assert [m[0] for m in _recv_all(sub, 2000)] == [topic_for(2_999)]


@pytest.mark.parametrize("kind", ["ipc", "tcp"])
def test_push_pull_round_trip(zctx, sock_dir, kind):
    endpoint = f"ipc://{sock_dir}/pull.sock" if kind == "ipc" else "tcp://127.0.0.1:0"
    pull, resolved = open_ingest(zctx, endpoint, socket_type="pull", bind_socket=True)
    push, _ = open_publisher(zctx, resolved, socket_type="push", bind_socket=False)
    frames = [_quote(1, s) for s in range(100)]
    for f in frames:
        push.send(f)
    got = [m[0] for m in _recv_all(pull)]
    assert got == frames


def test_oversized_message_never_reaches_the_reader(zctx, sock_dir):
    pull, ep = open_ingest(zctx, f"ipc://{sock_dir}/big.sock", socket_type="pull", bind_socket=True,
                           max_msg_size=1024)
    push, _ = open_publisher(zctx, ep, socket_type="push", bind_socket=False)
    push.send(b"x" * 5000)
    assert not pull.poll(300)


def test_egress_counts_a_full_subscriber_instead_of_blocking(zctx, sock_dir):
    pub, ep = open_egress(zctx, f"ipc://{sock_dir}/dec.sock", snd_hwm=10)
    sub = open_subscriber(zctx, ep)
    sub.setsockopt(zmq.RCVHWM, 10)
    pub.poll(1000)  # XPUB sees the subscription
    pub.recv()
    dropped = 0
    for i in range(5000):
        try:
            pub.send(b"%d" % i, zmq.NOBLOCK)
        except zmq.Again:
            dropped += 1
    assert dropped > 0  # the subscriber never reads: drops are visible, the loop never blocked


LOCAL_ENDPOINTS = ["ipc:///tmp/x.sock", "ipc://@abstract", "inproc://x", "tcp://127.0.0.1:5555", "tcp://127.1.2.3:1",
                   "tcp://localhost:5555", "tcp://[::1]:5555", "tcp://[0:0:0:0:0:0:0:1]:5555",
                   "tcp://10.0.0.5;127.0.0.1:5555"]  # a connect from any source to loopback stays on the host
# Every form that reaches (or may reach) another host: all of them need CURVE or allow_remote.
REMOTE_ENDPOINTS = [
    "tcp://*:5555", "tcp://0.0.0.0:5555", "tcp://[::]:5555", "tcp://10.0.0.5:5555", "tcp://192.168.1.7:5555",
    "tcp://[2001:db8::1]:5555", "tcp://[fe80::1%eth0]:5555", "tcp://[::ffff:10.0.0.5]:5555", "tcp://eth0:5555",
    "tcp://lo:5555", "tcp://feed.example.com:5555", "tcp://localhost.example.com:5555",
    "tcp://127.0.0.1;10.0.0.5:5555", "tcp://0x7f000001:5555", "tcp://2130706433:5555",
    "epgm://eth0;239.1.1.1:5555", "pgm://10.0.0.5;239.1.1.1:5555", "udp://10.0.0.5:5555",
    "ws://127.0.0.1:5555", "wss://feed.example.com:443/md", "norm://10.0.0.5:5555", "vmci://2:5555",
    "tipc://{1000,0,0}",
]
MALFORMED_ENDPOINTS = [
    ("127.0.0.1:5555", "no scheme"), ("tcp://127.0.0.1", "no port"), ("tcp://[::1]", "no port"),
    ("tcp://::1:5555", "needs brackets"), ("tcp://[::1:5555", "unclosed"), ("tcp://:5555", "no host"),
    ("tcp://127.0.0.1:http", "not a number"), ("tcp://127.0.0.1:65536", "not a number"),
    ("tcp://127.0.0.1:", "not a number"), ("tpc://127.0.0.1:5555", "unknown transport"), ("ipc://", "nothing after"),
    ("ipc:///" + "x" * 120, "the kernel allows 107"),
]


@pytest.mark.parametrize("endpoint", LOCAL_ENDPOINTS)
def test_local_endpoints(endpoint):
    assert is_local_endpoint(endpoint) is True


@pytest.mark.parametrize("endpoint", REMOTE_ENDPOINTS)
def test_remote_endpoint_forms(endpoint):
    assert is_local_endpoint(endpoint) is False
    with pytest.raises(EndpointError, match="refusing non-loopback endpoint"):
        check_endpoint(endpoint, allow_remote=False)


@pytest.mark.parametrize("endpoint, message", MALFORMED_ENDPOINTS)
def test_malformed_endpoints_are_one_line_errors(endpoint, message):
    with pytest.raises(EndpointError, match=message) as e:
        parse_endpoint(endpoint)
    assert "\n" not in str(e.value)
    with pytest.raises(EndpointError, match=message):
        is_local_endpoint(endpoint)


def test_connect_and_bind_rules():
    assert parse_endpoint("tcp://127.0.0.1:0", bind=True).port == "0"
    assert parse_endpoint("tcp://*:*", bind=True).host == "*"
    for ep in ("tcp://127.0.0.1:0", "tcp://127.0.0.1:*", "tcp://*:5555"):
        with pytest.raises(EndpointError, match="connecting socket needs"):
            parse_endpoint(ep, bind=False)
    with pytest.raises(EndpointError, match="only works for a connecting socket"):
        parse_endpoint("tcp://127.0.0.1;127.0.0.2:5555", bind=True)
    assert parse_endpoint("tcp://127.0.0.1;127.0.0.2:5555", bind=False).source == "127.0.0.1"


def test_malformed_endpoint_is_refused_before_a_socket_exists(zctx):
    with pytest.raises(EndpointError, match="no port"):
        open_egress(zctx, "tcp://127.0.0.1")
    with pytest.raises(EndpointError, match="no port"):
        open_ingest(zctx, "tcp://[::1]")
    assert not zctx._sockets  # nothing was created, so nothing is left for term() to wait for


def test_ensure_bindable_sees_a_busy_tcp_port_and_ipc_path(zctx, sock_dir):
    first, ep = open_egress(zctx, "tcp://127.0.0.1:0")
    with pytest.raises(EndpointError, match="already in use"):
        ensure_bindable(ep)
    port = ep.rsplit(":", 1)[1]
    with pytest.raises(EndpointError, match="already in use"):
        ensure_bindable(f"tcp://*:{port}")  # every interface includes the loopback one that is taken
    first.close(0)
    probe = pysocket.socket()
    probe.bind(("127.0.0.1", 0))
    free_port = probe.getsockname()[1]
    probe.close()  # never listened: free at once
    ensure_bindable(f"tcp://127.0.0.1:{free_port}")
    ipc, ipc_ep = open_egress(zctx, f"ipc://{sock_dir}/busy.sock")
    with pytest.raises(EndpointError, match="another process is serving"):
        ensure_bindable(ipc_ep)
    ipc.close(0)
    with pytest.raises(EndpointError, match="no interface of this host"):
        ensure_bindable("tcp://192.0.2.1:5555")  # TEST-NET-1: never a local address
    with pytest.raises(EndpointError, match="does not exist"):
        ensure_bindable(f"ipc://{sock_dir}/missing/x.sock")


def test_remote_endpoints_are_refused_unless_allowed(zctx):
    with pytest.raises(EndpointError, match="allow_remote"):
        open_egress(zctx, "tcp://0.0.0.0:0")
    check_endpoint("tcp://0.0.0.0:0", allow_remote=True)
    with pytest.raises(EndpointError, match="no scheme"):
        check_endpoint("127.0.0.1:5555", allow_remote=False)


def test_busy_ipc_path_is_a_clear_error(zctx, sock_dir):
    ep = f"ipc://{sock_dir}/busy.sock"
    first, _ = open_egress(zctx, ep)
    with pytest.raises(EndpointError, match="another process is serving"):
        open_egress(zctx, ep)
    first.close(0)


def test_stale_ipc_file_is_reclaimed(zctx, sock_dir):
    path = os.path.join(sock_dir, "stale.sock")
    s = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM)
    s.bind(path)
    s.close()  # file left behind, nobody listening
    sock, _ = open_egress(zctx, f"ipc://{path}")
    sock.close(0)


def test_busy_tcp_port_is_a_clear_error(zctx):
    first, ep = open_egress(zctx, "tcp://127.0.0.1:0")
    with pytest.raises(EndpointError, match="already in use"):
        open_egress(zctx, ep)
    first.close(0)


def test_missing_ipc_directory_is_a_clear_error(zctx, sock_dir):
    with pytest.raises(EndpointError, match="does not exist"):
        open_egress(zctx, f"ipc://{sock_dir}/nope/x.sock")
