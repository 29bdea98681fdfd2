"""`hft-infer record` as a real subprocess on a real ipc feed, then the capture replayed.

Slow joiner: a PUB drops whatever it sends before a subscription reaches it.
The test feeds publish from an XPUB (a PUB that also hands the publisher each
subscription message), so they start sending only once the recorder's
subscription has arrived, and every frame sent must be in the capture.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq

from hft_infer.replay.capture import capture_info, read_capture, to_events
from hft_infer.replay.events import KIND_QUOTE, KIND_TRADE, empty_events, encode_frames
from hft_infer.replay.recorder import record
from hft_infer.transport.codec import SERVICE_TOPIC, encode, topic_for
from hft_infer.transport.schema import Heartbeat
from hft_infer.transport.sockets import open_publisher, open_subscriber

# `python -m hft_infer` is the `hft-infer` command (hft_infer/__main__.py).
CLI = [sys.executable, "-m", "hft_infer"]
CLI_MAIN = CLI
WAIT_S = 30  # generous upper bound for a subprocess on a loaded 2-core machine; never hit when things work


def _session(n: int = 300, levels: int = 5) -> list[tuple[bytes, bytes]]:
    """A synthetic session: quotes and trades of 4 instruments with heartbeats between them."""
    rng = np.random.default_rng(11)
    ev = empty_events(n, levels)
    ev["ts_exchange_ns"] = 1_700_000_000_000_000_000 + np.cumsum(rng.integers(1, 50_000, n))
    ev["instrument"] = rng.integers(0, 4, n)
    for inst in range(4):
        mask = ev["instrument"] == inst
        ev["seq"][mask] = np.arange(mask.sum())
    trade = rng.random(n) < 0.3
    ev["kind"] = np.where(trade, KIND_TRADE, KIND_QUOTE)
    ev["n_levels"] = np.where(trade, 0, rng.integers(1, levels + 1, n))
    for i in np.flatnonzero(~trade):
        k = ev["n_levels"][i]
        ev["book"][i, :k] = (100 + rng.random((k, 4)) * 10).astype(np.float32)
    ev["price"] = np.where(trade, 100 + rng.random(n), 0.0)
    ev["size"] = np.where(trade, rng.integers(1, 100, n), 0)
    ev["side"] = np.where(trade, rng.choice([-1, 1], n), 0)
    frames = encode_frames(ev, ts_send_ns=ev["ts_exchange_ns"] + 7)
    out = []
    for i, f in enumerate(frames):
        if i % 50 == 0:
            out.append((SERVICE_TOPIC, encode(Heartbeat(i, "test-feed"))))
        out.append(f)
    return out


def _xpub(ctx, endpoint):
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # report every subscription, even one to a topic already subscribed
    sock.setsockopt(zmq.LINGER, 2000)
    sock.bind(endpoint)
    return sock


def _wait_subscribed(xpub, topic: bytes = b"") -> None:
    """Until the subscription to `topic` arrives (skipping a previous recorder's unsubscribe)."""
    while True:
        assert xpub.poll(WAIT_S * 1000), "the recorder never subscribed"
        if xpub.recv() == b"\x01" + topic:
            return


def _start(args, **kw):
    return subprocess.Popen([*CLI, "record", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _wait_records(path, n: int) -> None:
    """Poll the capture while it is being written (the reader must cope with a torn tail)."""
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end:
        if os.path.exists(path) and os.path.getsize(path) > 0 and capture_info(path)["records"] >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"{path} never reached {n} records")


def test_record_then_replay_reproduces_the_frames_exactly(zctx, sock_dir, tmp_path):
    feed = f"ipc://{sock_dir}/feed.sock"
    out = tmp_path / "session.cap"
    session = _session()
    pub = _xpub(zctx, feed)
    t_start = time.time_ns()
    proc = _start(["--endpoint", feed, "--out", str(out), "--duration", "3"])
    try:
        _wait_subscribed(pub)
        for topic, payload in session:
            pub.send(topic, zmq.SNDMORE)
            pub.send(payload)
        stdout, stderr = proc.communicate(timeout=WAIT_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert f"recorded {len(session)} messages ({2 * len(session)} frames" in stdout
    assert "stopped by duration" in stdout and f"{len(session)} messages in" in stdout
    assert f"recording {feed} -> {out}" in stderr

    cap = read_capture(out)
    assert cap.clean and cap.problems == []
    assert cap.messages() == session  # every frame, byte for byte, in order
    assert cap.header.endpoint == feed and cap.header.topic_frame
    ts = cap.recv_ts_ns
    assert (np.diff(ts) >= 0).all() and t_start <= ts[0] and ts[-1] <= time.time_ns()
    info = capture_info(out)
    assert info["records"] == len(session) and info["clean"]
    assert to_events(cap).shape[0] == len(session) - 6  # heartbeats are not events

    # Replay: publish the capture's frames on a fresh feed; a subscriber sees the same frames.
    replay_ep = f"ipc://{sock_dir}/replay.sock"
    rpub = _xpub(zctx, replay_ep)
    sub = open_subscriber(zctx, replay_ep)
    _wait_subscribed(rpub)
    for msg in cap.messages():
        rpub.send_multipart(msg)
    got = []
    while len(got) < len(session) and sub.poll(WAIT_S * 1000):
        got.append(tuple(sub.recv_multipart()))
    assert got == session


def test_record_stops_at_count(zctx, sock_dir, tmp_path):
    feed = f"ipc://{sock_dir}/feed.sock"
    out = tmp_path / "c.cap"
    pub = _xpub(zctx, feed)
    proc = _start(["--endpoint", feed, "--out", str(out), "--count", "40"])
    try:
        _wait_subscribed(pub)
        for i in range(100):
            pub.send_multipart([topic_for(1), b"m%d" % i])
        stdout, stderr = proc.communicate(timeout=WAIT_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "stopped by count" in stdout
    assert read_capture(out).messages() == [(topic_for(1), b"m%d" % i) for i in range(40)]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_flushes_and_closes_cleanly(zctx, sock_dir, tmp_path, sig):
    feed = f"ipc://{sock_dir}/feed.sock"
    out = tmp_path / "s.cap"
    pub = _xpub(zctx, feed)
    proc = _start(["--endpoint", feed, "--out", str(out), "--flush-ms", "20"])
    try:
        _wait_subscribed(pub)
        for i in range(25):
            pub.send_multipart([topic_for(2), b"s%d" % i])
        _wait_records(out, 25)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=WAIT_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "stopped by signal" in stdout and "closed cleanly" in stdout
    cap = read_capture(out)
    assert cap.clean and len(cap) == 25


def test_a_killed_recorder_loses_only_its_unflushed_records(zctx, sock_dir, tmp_path):
    feed = f"ipc://{sock_dir}/feed.sock"
    out = tmp_path / "k.cap"
    pub = _xpub(zctx, feed)
    # Blocks of 10 and no timed flush within the test: 25 messages = 2 blocks on disk + 5 pending.
    proc = _start(["--endpoint", feed, "--out", str(out), "--flush-records", "10", "--flush-ms", "600000"])
    sent = [(topic_for(3), b"k%d" % i) for i in range(25)]
    try:
        _wait_subscribed(pub)
        for m in sent:
            pub.send_multipart(m)
        _wait_records(out, 20)
    finally:
        proc.kill()  # SIGKILL: no flush, no trailer
        proc.wait(timeout=WAIT_S)
    cap = read_capture(out)
    assert not cap.clean and cap.problems == [] and cap.messages() == sent[:20]
    info = capture_info(out)
    assert info["records"] == 20 and not info["clean"]
    # --append resumes the crashed file
    proc = _start(["--endpoint", feed, "--out", str(out), "--append", "--count", "3"])
    try:
        _wait_subscribed(pub)
        for m in sent[:3]:
            pub.send_multipart(m)
        stdout, stderr = proc.communicate(timeout=WAIT_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    cap = read_capture(out)
    assert cap.clean and cap.messages() == sent[:20] + sent[:3]


def test_record_api_with_a_bound_pull_socket_and_a_stop_event(zctx, sock_dir, tmp_path):
    ep = f"ipc://{sock_dir}/pull.sock"
    out = tmp_path / "p.cap"
    ready = threading.Event()
    stop = threading.Event()
    result = {}

    def run():
        result["r"] = record(ep, out, socket_type="pull", bind=True, stop=stop, ctx=zctx,
                             on_ready=lambda _: ready.set(), flush_ms=10)

    t = threading.Thread(target=run)
    t.start()
    assert ready.wait(WAIT_S)
    push, _ = open_publisher(zctx, ep, socket_type="push", bind_socket=False)
    msgs = [b"single frame %d" % i for i in range(30)]  # PUSH: no topic frame, nothing dropped
    for m in msgs:
        push.send(m)
    _wait_records(out, 30)
    stop.set()
    t.join(WAIT_S)
    r = result["r"]
    assert (r.records, r.recorded, r.frames, r.stopped_by) == (30, 30, 30, "stop")
    assert r.frame_bytes == sum(map(len, msgs)) and r.file_bytes == os.path.getsize(out)
    assert read_capture(out).messages() == [(m,) for m in msgs]


def test_topic_filter_records_only_the_chosen_instruments(zctx, sock_dir, tmp_path):
    feed = f"ipc://{sock_dir}/feed.sock"
    out = tmp_path / "f.cap"
    pub = _xpub(zctx, feed)
    proc = _start(["--endpoint", feed, "--out", str(out), "--instrument", "5", "--count", "10"])
    try:
        _wait_subscribed(pub, topic_for(5))
        for i in range(40):
            pub.send_multipart([topic_for(i % 4 + 4), b"f%d" % i])
        stdout, stderr = proc.communicate(timeout=WAIT_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert [m[0] for m in read_capture(out).messages()] == [topic_for(5)] * 10


@pytest.mark.parametrize("args, message", [
    (["--endpoint", "tcp://10.1.2.3:5555"],
     "refusing non-loopback endpoint 'tcp://10.1.2.3:5555': pass --allow-remote"),
    (["--endpoint", "ipc:///tmp/x.sock", "--duration", "0"], "--duration must be positive"),
    (["--endpoint", "ipc:///tmp/x.sock", "--count", "-1"], "--count must be positive"),
    (["--endpoint", "127.0.0.1:5555"], "has no scheme"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, args, message):
    r = subprocess.run([*CLI_MAIN, "record", *args, "--out", str(tmp_path / "x.cap")], capture_output=True,
                       text=True, timeout=WAIT_S)
    assert r.returncode == 2 and message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.cap").exists()


def test_an_existing_file_is_not_overwritten_without_force(tmp_path):
    out = tmp_path / "x.cap"
    out.write_bytes(b"precious")
    r = subprocess.run([*CLI_MAIN, "record", "--endpoint", "ipc:///tmp/x.sock", "--out", str(out)],
                       capture_output=True, text=True, timeout=WAIT_S)
    assert r.returncode == 2 and "exists: pass --force" in r.stderr and out.read_bytes() == b"precious"


def test_replay_without_a_source_is_a_usage_error():
    r = subprocess.run([*CLI_MAIN, "replay"], capture_output=True, text=True, timeout=WAIT_S)
    assert r.returncode == 2 and "SOURCE" in r.stderr and "Traceback" not in r.stderr


def test_a_silent_feed_is_reported_once(zctx, sock_dir, tmp_path):
    """A SUB connected to an endpoint nobody publishes on records nothing and libzmq says nothing."""
    quiet = []
    r = record(f"ipc://{sock_dir}/nobody.sock", tmp_path / "q.cap", duration_s=1.0, ctx=zctx,
               on_silence=quiet.append, silence_s=0.2)
    assert r.recorded == 0 and r.stopped_by == "duration"
    assert len(quiet) == 1 and quiet[0] >= 0.2


def test_record_cli_warns_about_a_silent_feed_and_names_the_services_feed(sock_dir, tmp_path):
    env = dict(os.environ, HFT_INFER_RUNTIME_DIR=sock_dir)
    r = subprocess.run([*CLI_MAIN, "record", "--endpoint", f"ipc://{sock_dir}/elsewhere.sock", "--out",
                        str(tmp_path / "w.cap"), "--duration", "1.5", "--warn-silent-after", "0.5"],
                       capture_output=True, text=True, timeout=WAIT_S, env=env)
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if "warning:" in line]
    assert len(warnings) == 1, r.stderr
    assert f"no message from ipc://{sock_dir}/elsewhere.sock" in warnings[0]
    assert f"the config's service reads ipc://{sock_dir}/hft-infer-md.sock" in warnings[0]
    assert "recorded 0 messages" in r.stdout


def test_record_defaults_to_the_configs_feed(zctx, sock_dir, tmp_path):
    """Without --endpoint, record subscribes where the config's service reads its feed."""
    feed = f"ipc://{sock_dir}/rec-md.sock"
    pub = _xpub(zctx, feed)
    env = dict(os.environ, HFT_INFER_RUNTIME_DIR=sock_dir)
    proc = subprocess.Popen([*CLI, "record", "--set", "service.name=rec", "--out", str(tmp_path / "d.cap"),
                             "--count", "5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        _wait_subscribed(pub)
        for i in range(5):
            pub.send_multipart([topic_for(1), b"d%d" % i])
        stdout, stderr = proc.communicate(timeout=WAIT_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert f"recording {feed} ->" in stderr and "recorded 5 messages" in stdout
