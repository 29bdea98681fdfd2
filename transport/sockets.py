"""ZeroMQ socket factory: ingest (SUB or PULL), decisions (PUB), control (PUSH).

Safe defaults: endpoints are ipc:// or loopback tcp; a non-loopback endpoint is
refused unless the caller passes `allow_remote=True` (the config's
`security.allow_remote`) or CURVE keys. Binding an ipc path that a live
process is serving is an error (libzmq would silently take the path over), and
so is a tcp port in use.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket as pysocket
from collections.abc import Iterable
from dataclasses import dataclass

import zmq


class EndpointError(RuntimeError):
    """An endpoint that cannot or must not be used; the message is one line."""


@dataclass(frozen=True)
class CurveServer:
    """CURVE as a server (the side that binds, or a SUB/PULL that authenticates publishers)."""

    public_key: bytes
    secret_key: bytes


@dataclass(frozen=True)
class CurveClient:
    public_key: bytes
    secret_key: bytes
    server_public_key: bytes


def is_local_endpoint(endpoint: str) -> bool:
    """True for ipc://, inproc:// and tcp:// on a loopback address or localhost."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        raise EndpointError(f"endpoint {endpoint!r} has no scheme (ipc://, tcp://)")
    if scheme in ("ipc", "inproc"):
        return True
    if scheme != "tcp":
        return False  # pgm/epgm/udp/ws: multicast or network transports
    host = rest.rsplit(":", 1)[0]
    if ";" in host:  # "source;destination" form
        host = host.split(";", 1)[1]
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # interface names, "*", hostnames


def check_endpoint(endpoint: str, *, allow_remote: bool, secured: bool = False) -> None:
    if is_local_endpoint(endpoint) or allow_remote or secured:
        return
    raise EndpointError(
        f"refusing non-loopback endpoint {endpoint!r}: configure CURVE keys "
        "(security.curve_server_secret) or set security.allow_remote = true")


def _ipc_path(endpoint: str) -> str | None:
    return endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else None


def ensure_ipc_path_free(endpoint: str) -> None:
    """Raise if a live process serves this ipc path; remove a stale socket file."""
    path = _ipc_path(endpoint)
    if path is None or path.startswith("@"):  # abstract namespace: libzmq reports EADDRINUSE
        return
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise EndpointError(f"cannot bind {endpoint}: directory {parent} does not exist")
    if not os.path.exists(path):
        return
    probe = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # stale: nobody accepts on it
        return
    finally:
        probe.close()
    raise EndpointError(f"cannot bind {endpoint}: another process is serving this ipc path")


def bind(sock: zmq.Socket, endpoint: str) -> str:
    """Bind with clear errors; returns the resolved endpoint (tcp port 0 -> real port)."""
    ensure_ipc_path_free(endpoint)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as e:
        if e.errno == errno.EADDRINUSE:
            raise EndpointError(f"cannot bind {endpoint}: address already in use") from None
        raise EndpointError(f"cannot bind {endpoint}: {e.strerror}") from None
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def connect(sock: zmq.Socket, endpoint: str) -> str:
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as e:
        raise EndpointError(f"cannot connect to {endpoint}: {e.strerror}") from None
    return endpoint


def _apply_curve(sock: zmq.Socket, curve: CurveServer | CurveClient | None) -> None:
    if curve is None:
        return
    sock.curve_publickey = curve.public_key
    sock.curve_secretkey = curve.secret_key
    if isinstance(curve, CurveServer):
        sock.curve_server = True
        # Fail closed: with a ZAP domain and enforcement, handshakes are refused when no
        # ZAP authenticator runs (libzmq otherwise admits any client that knows our public key).
        sock.zap_domain = b"hft-infer"
        sock.zap_enforce_domain = True
    else:
        sock.curve_serverkey = curve.server_public_key


def open_ingest(
    ctx: zmq.Context,
    endpoint: str,
    *,
    socket_type: str = "sub",
    bind_socket: bool = False,
    topics: Iterable[bytes] | None = None,
    rcv_hwm: int = 100_000,
    max_msg_size: int = 65536,
    allow_remote: bool = False,
    curve: CurveServer | CurveClient | None = None,
) -> tuple[zmq.Socket, str]:
    """Market-data socket. `topics=None` subscribes to everything (SUB only).

    MAXMSGSIZE makes libzmq drop (and disconnect) a peer that sends a larger
    message, so oversized frames never reach the decoder; frames between
    max_frame_bytes and MAXMSGSIZE are rejected (and counted) by the service.
    """
    check_endpoint(endpoint, allow_remote=allow_remote, secured=curve is not None)
    if socket_type not in ("sub", "pull"):
        raise EndpointError(f"ingest socket_type must be sub or pull, not {socket_type!r}")
    sock = ctx.socket(zmq.SUB if socket_type == "sub" else zmq.PULL)
    sock.setsockopt(zmq.RCVHWM, rcv_hwm)
    sock.setsockopt(zmq.MAXMSGSIZE, max_msg_size)
    sock.setsockopt(zmq.LINGER, 0)
    _apply_curve(sock, curve)
    if socket_type == "sub":
        for topic in (topics if topics is not None else (b"",)):
            sock.setsockopt(zmq.SUBSCRIBE, topic)
    resolved = bind(sock, endpoint) if bind_socket else connect(sock, endpoint)
    return sock, resolved


def open_egress(
    ctx: zmq.Context,
    endpoint: str,
    *,
    bind_socket: bool = True,
    snd_hwm: int = 100_000,
    linger_ms: int = 1000,
    allow_remote: bool = False,
    curve: CurveServer | CurveClient | None = None,
) -> tuple[zmq.Socket, str]:
    """Decision publisher: an XPUB with XPUB_NODROP.

    A plain PUB drops silently at a subscriber's HWM, so nobody could count
    the loss. With XPUB_NODROP a send(NOBLOCK) that meets a full subscriber
    pipe raises zmq.Again instead: the hot loop counts it as egress_dropped and
    moves on (never blocks). The price: a live subscriber that stops reading
    makes every subscriber miss the dropped message, so the HWM is large and
    the drop counter is on the dashboard. A subscriber that disconnects frees
    its pipe at once. The subscription messages an XPUB receives are read and
    discarded in housekeeping (`drain_subscriptions`).
    """
    check_endpoint(endpoint, allow_remote=allow_remote, secured=curve is not None)
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.SNDHWM, snd_hwm)
    sock.setsockopt(zmq.XPUB_NODROP, 1)
    sock.setsockopt(zmq.LINGER, linger_ms)
    _apply_curve(sock, curve)
    resolved = bind(sock, endpoint) if bind_socket else connect(sock, endpoint)
    return sock, resolved


def drain_subscriptions(sock: zmq.Socket, limit: int = 1024) -> int:
    """Read pending (un)subscription frames from an XPUB; returns how many."""
    n = 0
    while n < limit and sock.poll(0):
        sock.recv(zmq.NOBLOCK)
        n += 1
    return n


def open_publisher(
    ctx: zmq.Context,
    endpoint: str,
    *,
    socket_type: str = "pub",
    bind_socket: bool = True,
    snd_hwm: int = 0,
    allow_remote: bool = False,
    curve: CurveServer | CurveClient | None = None,
) -> tuple[zmq.Socket, str]:
    """A market-data publisher (replay, bench, tests): PUB or PUSH."""
    check_endpoint(endpoint, allow_remote=allow_remote, secured=curve is not None)
    sock = ctx.socket(zmq.PUB if socket_type == "pub" else zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, snd_hwm)
    sock.setsockopt(zmq.LINGER, 2000)
    _apply_curve(sock, curve)
    resolved = bind(sock, endpoint) if bind_socket else connect(sock, endpoint)
    return sock, resolved


def open_subscriber(
    ctx: zmq.Context,
    endpoint: str,
    *,
    topics: Iterable[bytes] | None = None,
    rcv_hwm: int = 0,
    allow_remote: bool = False,
    curve: CurveServer | CurveClient | None = None,
) -> zmq.Socket:
    """A decision subscriber (collector, tests, clients)."""
    check_endpoint(endpoint, allow_remote=allow_remote, secured=curve is not None)
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.RCVHWM, rcv_hwm)
    sock.setsockopt(zmq.LINGER, 0)
    _apply_curve(sock, curve)
    for topic in (topics if topics is not None else (b"",)):
        sock.setsockopt(zmq.SUBSCRIBE, topic)
    connect(sock, endpoint)
    return sock
