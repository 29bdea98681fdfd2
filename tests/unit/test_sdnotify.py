"""The sd_notify protocol, read from a datagram socket the test owns (as systemd would)."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import uuid

import pytest

from hft_infer.sdnotify import Notifier, watchdog_interval_s

# A stand-in for the service: notifies READY after "warm-up", pings the watchdog
# from its loop at the interval systemd asks for, and STOPPING on SIGTERM.
SERVICE = textwrap.dedent("""
    import signal, sys, time
    from hft_infer.sdnotify import Notifier, watchdog_interval_s
    n = Notifier.from_env()
    interval = watchdog_interval_s()
    assert n.enabled and interval is not None
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))  # handlers only flip state
    n.ready(status="warm-up done\\nbuckets 1..64")
    while not stop:
        n.watchdog()
        time.sleep(interval)
    n.stopping(status="draining")
    n.close()
    sys.exit(0 if n.failed == 0 else 3)
""")


def _listener(address):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    # like systemd: ask the kernel for the sender's credentials (NotifyAccess=main checks the pid)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    sock.settimeout(60)  # a safety net against a hang, not a timing assertion
    return sock


def _recv(sock) -> tuple[list[str], int]:
    data, anc, _flags, _addr = sock.recvmsg(4096, socket.CMSG_SPACE(struct.calcsize("3i")))
    pid = -1
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid, _uid, _gid = struct.unpack("3i", payload[:12])
    return data.decode().split("\n"), pid


def _run_service(notify_socket: str, listener) -> list[tuple[list[str], int]]:
    env = dict(os.environ, NOTIFY_SOCKET=notify_socket, WATCHDOG_USEC="100000")
    proc = subprocess.Popen([sys.executable, "-c", SERVICE], env=env)
    got = []
    try:
        while sum("WATCHDOG=1" in m for m, _ in got) < 3:
            got.append(_recv(listener))
        proc.send_signal(signal.SIGTERM)
        while not any("STOPPING=1" in m for m, _ in got):
            got.append(_recv(listener))
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert {pid for _, pid in got} == {proc.pid}
    return got


def test_ready_watchdog_stopping_from_a_real_process(sock_dir):
    path = os.path.join(sock_dir, "notify.sock")
    listener = _listener(path)
    try:
        got = _run_service(path, listener)
    finally:
        listener.close()
    first, _ = got[0]
    assert first == ["READY=1", "STATUS=warm-up done buckets 1..64"]  # newline flattened: one assignment
    assert all(m == ["WATCHDOG=1"] for m, _ in got[1:-1])
    assert got[-1][0] == ["STOPPING=1", "STATUS=draining"]


def test_abstract_namespace_socket():
    name = f"hft-infer-test-{uuid.uuid4().hex}"
    listener = _listener("\0" + name)
    try:
        got = _run_service("@" + name, listener)
    finally:
        listener.close()
    assert got[0][0][0] == "READY=1" and got[-1][0][0] == "STOPPING=1"


def test_without_notify_socket_everything_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    n = Notifier.from_env()
    assert not n.enabled
    assert n.ready() is False and n.watchdog() is False and n.stopping() is False
    assert n.sent == n.dropped == n.failed == 0


def test_unsupported_address_is_disabled_not_an_error():
    n = Notifier("vsock:2:1234")
    assert not n.enabled and n.unsupported and n.ready() is False


def test_vanished_receiver_is_counted_not_raised(sock_dir):
    path = os.path.join(sock_dir, "gone.sock")
    listener = _listener(path)
    n = Notifier(path)
    assert n.watchdog() is True
    listener.close()
    os.unlink(path)
    assert n.watchdog() is False and n.failed == 1 and n.last_error
    n.close()


FLOOD = textwrap.dedent("""
    import sys
    from hft_infer.sdnotify import Notifier
    n = Notifier(sys.argv[1])
    for _ in range(2000):
        n.watchdog()
    print(n.sent, n.dropped, n.failed)
""")


def test_full_receiver_queue_drops_instead_of_blocking(sock_dir):
    """Nobody reads: a blocking sender would hang here after the queue fills
    (net.unix.max_dgram_qlen datagrams); the subprocess timeout is only a safety net."""
    path = os.path.join(sock_dir, "full.sock")
    listener = _listener(path)
    try:
        r = subprocess.run([sys.executable, "-c", FLOOD, path], capture_output=True, text=True, timeout=120)
    finally:
        listener.close()
    assert r.returncode == 0, r.stderr
    sent, dropped, failed = map(int, r.stdout.split())
    assert sent > 0 and dropped > 0 and failed == 0 and sent + dropped == 2000


@pytest.mark.parametrize("env,expected", [
    ({}, None),
    ({"WATCHDOG_USEC": "10000000"}, 5.0),
    ({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": str(os.getpid())}, 5.0),
    ({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "1"}, None),  # meant for another process
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "soon"}, None),
])
def test_watchdog_interval(env, expected):
    assert watchdog_interval_s(env) == expected


def test_from_env_can_hide_the_socket_from_children(monkeypatch, sock_dir):
    monkeypatch.setenv("NOTIFY_SOCKET", os.path.join(sock_dir, "x.sock"))
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    n = Notifier.from_env(unset_environment=True)
    assert n.enabled and "NOTIFY_SOCKET" not in os.environ and "WATCHDOG_USEC" not in os.environ
    n.close()


def test_real_serve_extends_its_start_timeout_before_warm_up(sock_dir, tmp_path):
    """`hft-infer serve` under a notify socket: EXTEND_TIMEOUT_USEC = service.start_timeout_s
    before READY=1 (warm-up and graph capture may compile for minutes), STOPPING=1 on SIGTERM."""
    path = os.path.join(sock_dir, "notify.sock")
    listener = _listener(path)
    env = dict(os.environ, NOTIFY_SOCKET=path, HFT_INFER_RUNTIME_DIR=sock_dir)
    proc = subprocess.Popen([sys.executable, "-m", "hft_infer", "serve", "--no-control", "--run-dir",
                             str(tmp_path / "run"), "--set", "service.start_timeout_s=123",
                             "--set", 'model.checkpoint=""', "--set", 'model.preset="mlp_small"'],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    got = []
    try:
        while not any("READY=1" in m for m, _ in got):
            got.append(_recv(listener))
        proc.send_signal(signal.SIGTERM)
        while not any("STOPPING=1" in m for m, _ in got):
            got.append(_recv(listener))
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
    finally:
        listener.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    messages = [m for m, _ in got]
    extend = [i for i, m in enumerate(messages) if m == ["EXTEND_TIMEOUT_USEC=123000000"]]
    ready = next(i for i, m in enumerate(messages) if "READY=1" in m)
    assert extend and extend[0] < ready, messages
    assert {pid for _, pid in got} == {proc.pid}  # the control process and children never notify
