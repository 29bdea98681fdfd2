"""Start-up failures of `serve` and `record` end at once with one line and exit code 2.

Real processes against real busy endpoints: a second `serve` on the same
config, a tcp port another socket listens on, an ipc path another process
serves, malformed endpoints, and a bind that only libzmq can refuse (an
interface that does not exist: it passes every pre-flight, so it exercises
the clean-up path). Before the fix each of them hung in Context.term(),
waiting for the socket whose bind had failed.

The timeouts below are safety nets against exactly that hang, never
assertions about how long a start takes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

CLI = [sys.executable, "-m", "hft_infer"]
TEST_MODEL = ["--set", 'model.checkpoint=""', "--set", 'model.preset="mlp_small"']
SAFETY_S = 120  # a loaded 2-core machine imports torch slowly; a hang is what this catches


def _env(runtime: str) -> dict:
    return dict(os.environ, HFT_INFER_RUNTIME_DIR=runtime)


def _serve(runtime: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "serve", "--no-control", *TEST_MODEL, *args], capture_output=True, text=True,
                          timeout=SAFETY_S, env=_env(runtime), cwd=cwd)


def _one_line_error(r: subprocess.CompletedProcess, command: str, fragment: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"hft-infer {command}: error: "), r.stderr
    assert fragment in errors[0], r.stderr


def _listening_tcp_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


@pytest.fixture
def first_service(sock_dir, tmp_path):
    """A running `hft-infer serve` with the default endpoints under sock_dir."""
    log = tmp_path / "first.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([*CLI, "serve", "--no-control", *TEST_MODEL, "--run-dir", str(tmp_path / "first")],
                                stdout=subprocess.DEVNULL, stderr=err, env=_env(sock_dir), cwd=tmp_path)
    try:
        end = time.monotonic() + SAFETY_S
        while "READY" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < end, log.read_text()
            time.sleep(0.1)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=SAFETY_S) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()


def test_second_serve_on_the_same_config(first_service, sock_dir, tmp_path):
    elsewhere = tmp_path / "second"
    elsewhere.mkdir()
    r = _serve(sock_dir, elsewhere)  # default run dir: runs/<name>-<time> under its cwd
    _one_line_error(r, "serve", f"egress.endpoint: cannot bind ipc://{sock_dir}/hft-infer-decisions.sock: "
                                "another process is serving this ipc path")
    assert list(elsewhere.iterdir()) == []  # no runs/ directory left by the failed attempt


@pytest.mark.parametrize("field, extra", [
    ("egress.endpoint", []),
    ("ingest.endpoint", ["--set", "ingest.bind=true", "--set", "ingest.socket_type=pull"]),
])
def test_serve_on_a_taken_tcp_port(sock_dir, tmp_path, field, extra):
    holder, port = _listening_tcp_port()
    try:
        r = _serve(sock_dir, tmp_path, "--set", f'{field}="tcp://127.0.0.1:{port}"', *extra,
                   "--run-dir", str(tmp_path / "run"))
    finally:
        holder.close()
    _one_line_error(r, "serve", f"{field}: cannot bind tcp://127.0.0.1:{port}: address already in use")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("field, endpoint, fragment", [
    ("egress.endpoint", "tcp://127.0.0.1", "no port"),
    ("ingest.endpoint", "tcp://[::1]", "no port"),
    ("ingest.endpoint", "tcp://127.0.0.1:0", "a connecting socket needs a host and a port"),
    ("metrics.control_endpoint", "tcp://127.0.0.1", "no port"),
    ("egress.endpoint", "tpc://127.0.0.1:5555", "unknown transport"),
])
def test_serve_with_a_malformed_endpoint(sock_dir, tmp_path, field, endpoint, fragment):
    r = _serve(sock_dir, tmp_path, "--set", f'{field}="{endpoint}"')
    _one_line_error(r, "serve", f"{field}: endpoint {endpoint!r}: {fragment}")
    assert not (tmp_path / "runs").exists()


def test_serve_whose_bind_fails_in_libzmq(sock_dir, tmp_path):
    """No pre-flight can see this one: the service's own bind fails, and the socket it had
    made must not keep the context open."""
    r = _serve(sock_dir, tmp_path, "--set", 'egress.endpoint="tcp://nosuchif0:5555"',
               "--set", "security.allow_remote=true", "--run-dir", str(tmp_path / "run"))
    _one_line_error(r, "serve", "cannot bind tcp://nosuchif0:5555: No such device")
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- record


def _record(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "record", "--duration", "30", *args], capture_output=True, text=True,
                          timeout=SAFETY_S, cwd=cwd)


def test_record_bind_on_a_busy_ipc_path(zctx, sock_dir, tmp_path):
    endpoint = f"ipc://{sock_dir}/feed.sock"
    holder = zctx.socket(zmq.PULL)
    holder.bind(endpoint)
    r = _record("--endpoint", endpoint, "--bind", "--socket-type", "pull", "--out", "x.cap", cwd=tmp_path)
    _one_line_error(r, "record", f"cannot bind {endpoint}: another process is serving this ipc path")
    assert not (tmp_path / "x.cap").exists()


def test_record_bind_on_a_taken_tcp_port(tmp_path):
    holder, port = _listening_tcp_port()
    try:
        r = _record("--endpoint", f"tcp://127.0.0.1:{port}", "--bind", "--out", "x.cap", cwd=tmp_path)
    finally:
        holder.close()
    _one_line_error(r, "record", "address already in use")
    assert not (tmp_path / "x.cap").exists()


@pytest.mark.parametrize("endpoint, bind, fragment", [
    ("tcp://127.0.0.1", False, "no port"),
    ("tcp://[::1]", True, "no port"),
    ("tcp://127.0.0.1:*", False, "a connecting socket needs"),
    ("ipc://", False, "nothing after ipc://"),
])
def test_record_with_a_malformed_endpoint(tmp_path, endpoint, bind, fragment):
    r = _record("--endpoint", endpoint, *(["--bind"] if bind else []), "--out", "x.cap", cwd=tmp_path)
    _one_line_error(r, "record", fragment)
    assert not (tmp_path / "x.cap").exists()


def test_record_whose_bind_fails_in_libzmq(tmp_path):
    r = _record("--endpoint", "tcp://nosuchif0:5555", "--bind", "--allow-remote", "--socket-type", "pull",
                "--out", "x.cap", cwd=tmp_path)
    _one_line_error(r, "record", "cannot bind tcp://nosuchif0:5555: No such device")
    assert not (tmp_path / "x.cap").exists()
