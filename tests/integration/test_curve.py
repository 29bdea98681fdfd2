"""CURVE over real tcp sockets on 127.0.0.1: keys from files, the ZAP authenticator, the policy.

The "endpoints" the policy judges are non-loopback addresses written into the
config (nothing binds them); the sockets that carry data bind 127.0.0.1 with
the keys the policy returned.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from hft_infer.config import ConfigError, load_config
from hft_infer.security import (
    check_key_permissions,
    check_security,
    curve_for_egress,
    curve_for_ingest,
    start_authenticator,
)
from hft_infer.transport.curve import (
    CurveKeyError,
    ZapAuthenticator,
    load_keypair,
    load_server_keys,
    read_key_file,
    write_keypair,
)
from hft_infer.transport.sockets import (
    CurveClient,
    CurveServer,
    EndpointError,
    open_egress,
    open_publisher,
    open_subscriber,
)

CLI = [sys.executable, "-c", "import sys; from hft_infer.app.cli import main; sys.exit(main(sys.argv[1:]))"]
SAFETY_MS = 20_000  # upper bound on waiting for an event that must come; not a latency assertion


@pytest.fixture
def keys(tmp_path):
    """server (this service), an authorized client, a stranger; authorized/ holds the client's public key."""
    secrets = tmp_path / "secrets"
    authorized = tmp_path / "authorized"
    write_keypair(secrets, "server")
    write_keypair(secrets, "client")
    write_keypair(secrets, "stranger")
    authorized.mkdir(mode=0o700)
    shutil.copy(secrets / "client.key", authorized / "client.key")
    return secrets, authorized


def make_cfg(keys, **sections):
    secrets, authorized = keys
    overrides = [f"security.curve_server_secret={str(secrets / 'server.key_secret')!r}",
                 f"security.curve_authorized_dir={str(authorized)!r}"]
    for key, value in sections.items():
        toml = ("true" if value else "false") if isinstance(value, bool) else repr(value)
        overrides.append(f"{key.replace('__', '.')}={toml}")
    return load_config(None, overrides)


def client_of(server: CurveServer, secret_path: Path) -> CurveClient:
    public, secret = load_keypair(secret_path)
    return CurveClient(public_key=public, secret_key=secret, server_public_key=server.public_key)


def wait_for(predicate, step) -> bool:
    """Run step() until predicate() holds; bounded by SAFETY_MS of socket polling."""
    for _ in range(SAFETY_MS // 10):
        if predicate():
            return True
        step()
    return predicate()


def drain(sock) -> list[bytes]:
    out = []
    while sock.poll(0):
        out.append(sock.recv())
    return out


def server_events(monitor) -> set[int]:
    seen = set()
    while monitor.poll(0):
        seen.add(recv_monitor_message(monitor)["event"])
    return seen


# --------------------------------------------------------------------------- key files


def test_generated_keys_have_safe_modes_and_zmq_auth_reads_them(tmp_path):
    public, secret = write_keypair(tmp_path / "k", "svc")
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(public.stat().st_mode) & 0o077 in (0o044, 0o004, 0o040, 0)  # umask may narrow it
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o700
    pub, sec = zmq.auth.load_certificate(str(secret))  # the standard reader agrees
    assert (pub, sec) == read_key_file(secret)
    assert zmq.auth.load_certificate(str(public)) == (pub, None)
    with pytest.raises(CurveKeyError, match="already exists"):
        write_keypair(tmp_path / "k", "svc")


def test_bad_key_files_give_one_line_errors(tmp_path, keys):
    secrets, _ = keys
    with pytest.raises(CurveKeyError, match="no such key file"):
        read_key_file(tmp_path / "missing.key")
    (tmp_path / "junk.key").write_text("hello\n")
    with pytest.raises(CurveKeyError, match="no public-key line"):
        read_key_file(tmp_path / "junk.key")
    with pytest.raises(CurveKeyError, match="holds no secret key"):
        load_server_keys(secrets / "server.key")  # the public file where the secret one belongs
    mixed = tmp_path / "mixed.key_secret"
    other_public = read_key_file(secrets / "client.key")[0].decode()
    text = (secrets / "server.key_secret").read_text()
    mixed.write_text(text.replace(read_key_file(secrets / "server.key")[0].decode(), other_public))
    with pytest.raises(CurveKeyError, match="does not match"):
        read_key_file(mixed)


# --------------------------------------------------------------------------- real CURVE traffic


def test_only_authorized_client_receives(zctx, keys):
    secrets, _ = keys
    cfg = make_cfg(keys, egress__endpoint="tcp://10.20.30.40:5556")
    server = curve_for_egress(cfg)
    assert isinstance(server, CurveServer)
    auth = start_authenticator(zctx, cfg)
    assert isinstance(auth, ZapAuthenticator)
    try:
        pub, endpoint = open_egress(zctx, "tcp://127.0.0.1:0", curve=server)
        monitor = pub.get_monitor_socket()
        good = open_subscriber(zctx, endpoint, curve=client_of(server, secrets / "client.key_secret"))
        stranger = open_subscriber(zctx, endpoint, curve=client_of(server, secrets / "stranger.key_secret"))
        plain = open_subscriber(zctx, endpoint)  # no CURVE at all
        got: list[bytes] = []
        seen: set[int] = set()

        def publish():
            pub.send(b"decision")
            got.extend(drain(good))
            seen.update(server_events(monitor))
            good.poll(10)

        # wait until the good client receives and the server has turned away both others
        assert wait_for(lambda: len(got) >= 5 and auth.stats.denied >= 1
                        and zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL in seen, publish), (len(got), auth.stats, seen)
        for _ in range(20):
            publish()
        assert zmq.EVENT_HANDSHAKE_FAILED_AUTH in seen  # the stranger: ZAP said 400
        assert drain(stranger) == [] and drain(plain) == []
        assert auth.stats.admitted >= 1 and "from 127.0.0.1" in auth.stats.last_denied
        stranger_key = read_key_file(secrets / "stranger.key")[0].decode()
        assert auth.stats.last_denied.startswith(stranger_key)
        pub.disable_monitor()
    finally:
        auth.stop()


def test_authorized_dir_is_reread_without_restart(zctx, keys):
    secrets, authorized = keys
    cfg = make_cfg(keys, egress__endpoint="tcp://10.20.30.40:5556")
    server = curve_for_egress(cfg)
    auth = start_authenticator(zctx, cfg)
    try:
        pub, endpoint = open_egress(zctx, "tcp://127.0.0.1:0", curve=server)
        first = open_subscriber(zctx, endpoint, curve=client_of(server, secrets / "stranger.key_secret"))
        assert wait_for(lambda: auth.stats.denied >= 1, lambda: (pub.send(b"x"), first.poll(10)))
        assert drain(first) == []
        shutil.copy(secrets / "stranger.key", authorized / "stranger.key")  # operator authorizes it
        # libzmq does not retry a handshake that ZAP refused: the client reconnects with a new socket
        second = open_subscriber(zctx, endpoint, curve=client_of(server, secrets / "stranger.key_secret"))
        got: list[bytes] = []
        assert wait_for(lambda: len(got) >= 1, lambda: (pub.send(b"x"), second.poll(10),
                                                        got.extend(drain(second))))
        assert auth.stats.keys == 2
    finally:
        auth.stop()


def test_a_malformed_authorized_key_is_skipped_and_the_user_id_is_the_key_file(zctx, keys):
    secrets, authorized = keys
    (authorized / "broken.key").write_text("not a certificate\n")  # must not lock the good client out
    cfg = make_cfg(keys, egress__endpoint="tcp://10.20.30.40:5556")
    server = curve_for_egress(cfg)
    auth = start_authenticator(zctx, cfg)
    try:
        assert auth.stats.keys == 1
        pub, endpoint = open_egress(zctx, "tcp://127.0.0.1:0", curve=server)
        good = open_subscriber(zctx, endpoint, curve=client_of(server, secrets / "client.key_secret"))
        frames = []
        # the XPUB receives the client's subscription; libzmq tags it with the User-Id ZAP gave
        assert wait_for(lambda: bool(frames), lambda: (pub.poll(10) and frames.append(pub.recv(copy=False)),
                                                       good.poll(0)))
        assert frames[0].get("User-Id") == "client.key"
    finally:
        auth.stop()


def test_a_second_authenticator_on_one_context_is_a_clear_error(zctx, keys):
    _, authorized = keys
    first = ZapAuthenticator(zctx, str(authorized)).start()
    try:
        with pytest.raises(CurveKeyError, match="one authenticator per context"):
            ZapAuthenticator(zctx, str(authorized)).start()
    finally:
        first.stop()
    # the endpoint is free again: libzmq releases an inproc name once its reaper thread has
    # closed the socket, asynchronously, so a start right after stop() may still find it taken
    deadline = time.monotonic() + 10.0
    while True:
        try:
            ZapAuthenticator(zctx, str(authorized)).start().stop()
            break
        except CurveKeyError:
            assert time.monotonic() < deadline, "the ZAP endpoint stayed bound after stop()"
            time.sleep(0.01)


def test_ingest_connects_to_a_curve_feed_as_its_client(zctx, keys, tmp_path):
    """The feed is the CURVE server (its own context and authenticator); this service's
    public key is in the feed's authorized directory."""
    secrets, _ = keys
    feed_keys = tmp_path / "feed"
    feed_public, feed_secret = write_keypair(feed_keys, "feed")
    feed_authorized = tmp_path / "feed-authorized"
    feed_authorized.mkdir()
    shutil.copy(secrets / "server.key", feed_authorized / "hft-infer.key")
    cfg = make_cfg(keys, ingest__endpoint="tcp://10.20.30.40:5555", security__curve_feed_public=str(feed_public))
    curve = curve_for_ingest(cfg)
    assert isinstance(curve, CurveClient) and curve.server_public_key == read_key_file(feed_public)[0]
    assert start_authenticator(zctx, cfg) is None  # no CURVE server socket on our side here

    feed_ctx = zmq.Context()
    feed_auth = ZapAuthenticator(feed_ctx, str(feed_authorized)).start()
    try:
        feed, endpoint = open_publisher(feed_ctx, "tcp://127.0.0.1:0", curve=load_server_keys(feed_secret))
        from hft_infer.transport.sockets import open_ingest

        sub, _ = open_ingest(zctx, endpoint, curve=curve)
        got: list[bytes] = []
        assert wait_for(lambda: len(got) >= 3, lambda: (feed.send(b"quote"), sub.poll(10), got.extend(drain(sub))))
        assert feed_auth.stats.admitted >= 1 and feed_auth.stats.denied == 0
    finally:
        feed_auth.stop()
        feed_ctx.destroy(linger=0)


def test_curve_server_without_authenticator_fails_closed(zctx, keys):
    """Without a ZAP handler libzmq would admit any CURVE client that knows the server key:
    our sockets set a ZAP domain with enforcement, so the handshake is refused instead."""
    secrets, _ = keys
    server = load_server_keys(secrets / "server.key_secret")
    pub, endpoint = open_egress(zctx, "tcp://127.0.0.1:0", curve=server)
    monitor = pub.get_monitor_socket()
    anyone = open_subscriber(zctx, endpoint, curve=client_of(server, secrets / "stranger.key_secret"))
    seen: set[int] = set()
    wait_for(lambda: bool(seen & {zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                                  zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL}),
             lambda: (seen.update(server_events(monitor)), pub.send(b"x"), anyone.poll(10)))
    assert zmq.EVENT_HANDSHAKE_SUCCEEDED not in seen
    pub.disable_monitor()


# --------------------------------------------------------------------------- policy


def test_non_loopback_without_keys_is_refused(zctx):
    cfg = load_config(None, ["egress.endpoint='tcp://0.0.0.0:5556'"])
    with pytest.raises(ConfigError, match=r"egress.endpoint tcp://0.0.0.0:5556 is not loopback"):
        check_security(cfg)
    assert curve_for_egress(cfg) is None
    with pytest.raises(EndpointError, match="refusing non-loopback endpoint"):
        open_egress(zctx, "tcp://0.0.0.0:5556", curve=None)  # refused before anything binds
    allowed = load_config(None, ["egress.endpoint='tcp://0.0.0.0:5556'", "security.allow_remote=true"])
    assert any("traffic in clear" in w for w in check_security(allowed))


def test_loopback_and_ipc_stay_plain_even_with_keys(keys):
    cfg = make_cfg(keys, egress__endpoint="tcp://127.0.0.1:5556")
    assert curve_for_egress(cfg) is None and curve_for_ingest(cfg) is None
    assert check_security(cfg) == []


def test_remote_feed_without_its_public_key_is_a_config_error(keys):
    cfg = make_cfg(keys, ingest__endpoint="tcp://10.1.2.3:5555")
    with pytest.raises(ConfigError, match="security.curve_feed_public"):
        curve_for_ingest(cfg)


def test_binding_remote_ingest_is_a_curve_server(keys):
    cfg = make_cfg(keys, ingest__endpoint="tcp://0.0.0.0:5555", ingest__bind=True)
    assert isinstance(curve_for_ingest(cfg), CurveServer)


def test_curve_without_authorized_dir_is_refused(zctx, keys):
    secrets, _ = keys
    cfg = load_config(None, ["egress.endpoint='tcp://10.0.0.1:5556'",
                             f"security.curve_server_secret={str(secrets / 'server.key_secret')!r}"])
    with pytest.raises(ConfigError, match="curve_authorized_dir is required"):
        start_authenticator(zctx, cfg)
    with pytest.raises(ConfigError, match="curve_authorized_dir is required"):
        check_security(cfg)


def test_dashboard_off_loopback_needs_allow_remote():
    with pytest.raises(ConfigError, match="control.host 0.0.0.0 is not loopback"):
        check_security(load_config(None, ["control.host='0.0.0.0'"]))
    warnings = check_security(load_config(None, ["control.host='0.0.0.0'", "security.allow_remote=true"]))
    assert any("dashboard" in w for w in warnings)


def test_key_permission_warnings(keys, tmp_path):
    secrets, authorized = keys
    cfg = make_cfg(keys)
    assert check_key_permissions(cfg) == []
    secret = secrets / "server.key_secret"
    secret.chmod(0o644)
    assert any("world-readable (mode 0644)" in w for w in check_key_permissions(cfg))
    secret.chmod(0o640)
    assert any("group-readable (mode 0640)" in w for w in check_key_permissions(cfg))
    secret.chmod(0o600)
    authorized.chmod(0o777)
    assert any("world-writable" in w and str(authorized) in w for w in check_key_permissions(cfg))
    authorized.chmod(0o700)
    shutil.copy(secret, authorized / "oops.key_secret")
    assert any("secret key in the authorized-keys directory" in w for w in check_key_permissions(cfg))


def test_keys_cli_generate_show_check(tmp_path):
    d = tmp_path / "keys"
    r = subprocess.run([*CLI, "keys", "generate", str(d), "--name", "svc"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE((d / "svc.key_secret").stat().st_mode) == 0o600
    public = read_key_file(d / "svc.key")[0].decode()
    assert f"public-key = {public}" in r.stdout
    r = subprocess.run([*CLI, "keys", "generate", str(d), "--name", "svc"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "already exists" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    os.chmod(d / "svc.key_secret", 0o644)
    r = subprocess.run([*CLI, "keys", "show", str(d / "svc.key_secret")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and public in r.stdout and "world-readable" in r.stderr
    auth = tmp_path / "auth"
    auth.mkdir(mode=0o700)
    config = tmp_path / "c.toml"
    config.write_text(f"[egress]\nendpoint = 'tcp://10.0.0.1:5556'\n[security]\n"
                      f"curve_server_secret = '{d / 'svc.key_secret'}'\ncurve_authorized_dir = '{auth}'\n")
    r = subprocess.run([*CLI, "keys", "check", "-c", str(config)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "egress tcp://10.0.0.1:5556: CURVE server" in r.stdout
    assert "every CURVE client is denied" in r.stdout and "world-readable" in r.stdout
