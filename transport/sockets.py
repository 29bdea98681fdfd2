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

# The ZAP domain of every CURVE server socket (transport.curve's authenticator answers it).
ZAP_DOMAIN = b"hft-infer"


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


# Transports libzmq knows (some only in builds with them enabled); anything else is a typo.
TRANSPORTS = ("tcp", "ipc", "inproc", "pgm", "epgm", "udp", "ws", "wss", "norm", "vmci", "tipc")
# sockaddr_un.sun_path is 108 bytes on Linux, the terminating NUL included: a longer
# ipc path fails in libzmq with ENAMETOOLONG only when the socket binds or connects.
IPC_PATH_MAX = 107


@dataclass(frozen=True)
class Endpoint:
    """A parsed endpoint. tcp: `host` (brackets removed), `port` (digits or "*"), `source`
    (the "source;destination" form's source, as written); ipc/inproc: `path`; other
    transports: `host` holds the rest, which only libzmq parses."""

    scheme: str
    host: str = ""
    port: str = ""
    path: str = ""
    source: str = ""


def _split_host_port(endpoint: str, text: str, *, what: str) -> tuple[str, str]:
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise EndpointError(f"endpoint {endpoint!r}: {what} has an unclosed '[' (tcp://[ADDR]:PORT)")
        host, tail = text[1:close], text[close + 1:]
        if not tail.startswith(":"):
            raise EndpointError(f"endpoint {endpoint!r}: no port (tcp://[ADDR]:PORT)")
        port = tail[1:]
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            raise EndpointError(f"endpoint {endpoint!r}: no port (tcp://HOST:PORT)")
        if ":" in host:
            raise EndpointError(f"endpoint {endpoint!r}: an IPv6 address needs brackets (tcp://[ADDR]:PORT)")
    if not host:
        raise EndpointError(f"endpoint {endpoint!r}: no host (tcp://HOST:PORT; * binds every interface)")
    if port != "*" and not (port.isdigit() and int(port) <= 65535):
        raise EndpointError(f"endpoint {endpoint!r}: port {port!r} is not a number 0..65535 (or * to bind)")
    return host, port


def parse_endpoint(endpoint: str, *, bind: bool | None = None) -> Endpoint:
    """Parse and check an endpoint's syntax, as far as we can tell before libzmq sees it.

    bind: True for a socket that binds, False for one that connects (which
    needs a real port and host, and may name a source), None when unknown.
    Raises EndpointError (one line) for what libzmq would refuse, so that
    nothing is created for an endpoint that cannot work.
    """
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        raise EndpointError(f"endpoint {endpoint!r} has no scheme (ipc://, tcp://)")
    if scheme not in TRANSPORTS:
        raise EndpointError(f"endpoint {endpoint!r}: unknown transport {scheme!r} "
                            "(ipc://PATH, tcp://HOST:PORT, inproc://NAME)")
    if not rest:
        raise EndpointError(f"endpoint {endpoint!r}: nothing after {scheme}://")
    if scheme == "ipc":
        size = len(rest.encode())
        if size > IPC_PATH_MAX:
            raise EndpointError(f"endpoint {endpoint!r}: the ipc path is {size} bytes, the kernel allows "
                                f"{IPC_PATH_MAX} (use a shorter directory)")
        return Endpoint(scheme, path=rest)
    if scheme == "inproc":
        return Endpoint(scheme, path=rest)
    if scheme != "tcp":
        return Endpoint(scheme, host=rest)
    source, _, dest = rest.rpartition(";")
    host, port = _split_host_port(endpoint, dest, what="the address")
    if source:
        if bind:
            raise EndpointError(f"endpoint {endpoint!r}: a source address (SOURCE;HOST:PORT) only works "
                                "for a connecting socket")
        if source.startswith("[") and "]" not in source:
            raise EndpointError(f"endpoint {endpoint!r}: the source has an unclosed '['")
    if bind is False and (port in ("0", "*") or host == "*"):
        raise EndpointError(f"endpoint {endpoint!r}: a connecting socket needs a host and a port "
                            "(0 and * only make sense for binding)")
    return Endpoint(scheme, host=host, port=port, source=source)


def is_local_endpoint(endpoint: str) -> bool:
    """True for ipc://, inproc:// and tcp:// to a loopback address or localhost.

    Everything else is remote: wildcards and unspecified addresses (*, 0.0.0.0,
    [::]), interface and host names (they may resolve anywhere), other
    transports (multicast, websockets, VMs), and the source;destination form
    judged by its destination. Raises EndpointError for a malformed endpoint.
    """
    ep = parse_endpoint(endpoint)
    if ep.scheme in ("ipc", "inproc"):
        return True
    if ep.scheme != "tcp":
        return False
    if ep.host == "localhost":
        return True
    try:
        return ipaddress.ip_address(ep.host).is_loopback
    except ValueError:
        return False  # interface names, "*", hostnames, zone ids


def check_endpoint(endpoint: str, *, allow_remote: bool, secured: bool = False, bind: bool | None = None) -> None:
    """Raise EndpointError for a malformed endpoint, or a non-loopback one that is neither
    secured (CURVE) nor allowed (security.allow_remote)."""
    parse_endpoint(endpoint, bind=bind)
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


def ensure_tcp_port_free(endpoint: str) -> None:
    """Raise if a tcp address to bind is taken or not on this host.

    Tried with a plain socket and SO_REUSEADDR, as libzmq binds, so a port
    left in TIME_WAIT counts as free. Port 0 or * and interface or host
    names (other than localhost) are left to libzmq.
    """
    ep = parse_endpoint(endpoint, bind=True)
    if ep.scheme != "tcp" or ep.port in ("0", "*"):
        return
    host = {"*": "0.0.0.0", "localhost": "127.0.0.1"}.get(ep.host, ep.host)
    try:
        family = pysocket.AF_INET6 if ipaddress.ip_address(host).version == 6 else pysocket.AF_INET
    except ValueError:
        return
    probe = pysocket.socket(family, pysocket.SOCK_STREAM)
    try:
        probe.setsockopt(pysocket.SOL_SOCKET, pysocket.SO_REUSEADDR, 1)
        probe.bind((host, int(ep.port)))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise EndpointError(f"cannot bind {endpoint}: address already in use") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise EndpointError(f"cannot bind {endpoint}: no interface of this host has address {host}") from None
        raise EndpointError(f"cannot bind {endpoint}: {e.strerror}") from None
    finally:
        probe.close()


def ensure_bindable(endpoint: str) -> None:
    """Pre-flight for a socket that will bind `endpoint`: well formed, its ipc path not served
    by a live process (a stale file is removed) and its directory present, its tcp port free.

    Run before the slow parts of a start so that a busy endpoint fails in
    milliseconds; the bind itself still reports a race (EndpointError)."""
    parse_endpoint(endpoint, bind=True)
    ensure_ipc_path_free(endpoint)
    ensure_tcp_port_free(endpoint)


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
        sock.zap_domain = ZAP_DOMAIN
        sock.zap_enforce_domain = True
    else:
        sock.curve_serverkey = curve.server_public_key


# A SUB sends nothing but its subscriptions, and libzmq drops, silently, those past the SUB's
# SNDHWM (default 1,000) when it replays them to a new connection (xsub_t::send_subscription): a
# universe of more than ~1,000 instruments subscribed topic by topic lost the rest, and their events
# never arrived (found 2026-12-04 with 1,024 instruments). No limit on a SUB's send side.
SUB_SNDHWM = 0


def _open(ctx: zmq.Context, sock_type: int, endpoint: str, *, bind_socket: bool, options: list[tuple[int, int]],
          curve, subscribe: Iterable[bytes] = ()) -> tuple[zmq.Socket, str]:
    """Create, configure and bind/connect one socket; a socket whose set-up fails is closed
    here (linger 0), so a failed start leaves nothing that Context.term() would wait for."""
    sock = ctx.socket(sock_type)
    try:
        for opt, value in options:
            sock.setsockopt(opt, value)
        _apply_curve(sock, curve)
        for topic in subscribe:
            sock.setsockopt(zmq.SUBSCRIBE, topic)
        resolved = bind(sock, endpoint) if bind_socket else connect(sock, endpoint)
    except BaseException:
        sock.close(0)
        raise
    return sock, resolved


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
    subscribe = (topics if topics is not None else (b"",)) if socket_type == "sub" else ()
    return _open(ctx, zmq.SUB if socket_type == "sub" else zmq.PULL, endpoint, bind_socket=bind_socket,
                 options=[(zmq.RCVHWM, rcv_hwm), (zmq.MAXMSGSIZE, max_msg_size), (zmq.LINGER, 0)]
                 + ([(zmq.SNDHWM, SUB_SNDHWM)] if socket_type == "sub" else []), curve=curve, subscribe=subscribe)


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
    return _open(ctx, zmq.XPUB, endpoint, bind_socket=bind_socket, curve=curve,
                 options=[(zmq.SNDHWM, snd_hwm), (zmq.XPUB_NODROP, 1), (zmq.LINGER, linger_ms)])


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
    return _open(ctx, zmq.PUB if socket_type == "pub" else zmq.PUSH, endpoint, bind_socket=bind_socket,
                 options=[(zmq.SNDHWM, snd_hwm), (zmq.LINGER, 2000)], curve=curve)


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
    return _open(ctx, zmq.SUB, endpoint, bind_socket=False,
                 options=[(zmq.RCVHWM, rcv_hwm), (zmq.SNDHWM, SUB_SNDHWM), (zmq.LINGER, 0)], curve=curve,
                 subscribe=topics if topics is not None else (b"",))[0]
