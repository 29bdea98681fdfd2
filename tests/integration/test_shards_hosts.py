"""Shards on two "hosts" behind one CURVE feed: the shipped per-host configs
(tools/systemd/shards/shard0.toml, shard1.toml) run as real `hft-infer serve --shard I/2`
processes; each host is a tcp port on 127.0.0.1 (security.curve_loopback = true, so that
loopback tcp takes CURVE as a remote address would). A real publisher (the replay pacer on
an XPUB with CURVE and its own authenticator) feeds both; every event is accounted for in
exactly one shard, and a subscriber without keys receives nothing."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from hft_infer.replay.collector import Collector, analyse, decode_frames
from hft_infer.replay.pacer import Pacer, constant_rate, encode_feed
from hft_infer.replay.synthetic import SyntheticConfig, generate
from hft_infer.transport.curve import ZapAuthenticator, load_keypair, load_server_keys, read_key_file, write_keypair
from hft_infer.transport.sockets import CurveClient, open_egress, open_subscriber

ROOT = Path(__file__).resolve().parents[2]
SHARDS = ROOT / "tools" / "systemd" / "shards"
SAFETY_S = 120  # bound on waiting for what must come (start-up, the final Status); not a latency assertion
N_INST, N_EVENTS, RATE = 8, 2000, 4000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def keys(tmp_path):
    d = tmp_path / "keys"
    for name in ("feed", "shard0", "shard1", "collector", "stranger"):
        write_keypair(d, name)
    feed_auth, shard_auth = tmp_path / "feed-authorized", tmp_path / "authorized"
    feed_auth.mkdir(mode=0o700)
    shard_auth.mkdir(mode=0o700)
    for name in ("shard0", "shard1"):  # the feed admits the shards
        shutil.copy(d / f"{name}.key", feed_auth / f"{name}.key")
    shutil.copy(d / "collector.key", shard_auth / "collector.key")  # the shards admit the collector
    return d, feed_auth, shard_auth


def serve(i: int, keys, feed_ep: str, egress_port: int, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    d, _, shard_auth = keys
    sets = {"ingest.endpoint": f'"{feed_ep}"', "egress.endpoint": f'"tcp://127.0.0.1:{egress_port}"',
            "security.curve_loopback": "true", "security.curve_server_secret": f'"{d}/shard{i}.key_secret"',
            "security.curve_feed_public": f'"{d}/feed.key"', "security.curve_authorized_dir": f'"{shard_auth}"',
            "universe.instruments": str(N_INST), "runner.device": '"cpu"', "cpu.cores": '"none"',
            "ingest.poll_mode": '"event"', "control.enabled": "false"}
    log = tmp_path / f"shard{i}.log"
    cmd = [sys.executable, "-m", "hft_infer", "serve", "-c", str(SHARDS / f"shard{i}.toml"), "--shard", f"{i}/2",
           "--no-control", "--run-dir", str(tmp_path / f"shard{i}")]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    env = {"HFT_INFER_RUNTIME_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=env), log


def test_two_hosts_behind_a_curve_feed_account_for_every_event(keys, tmp_path):
    d, feed_auth, _ = keys
    ctx = zmq.Context()
    auth = ZapAuthenticator(ctx, str(feed_auth)).start()
    procs = []
    try:
        feed, feed_ep = open_egress(ctx, "tcp://127.0.0.1:0", curve=load_server_keys(d / "feed.key_secret"),
                                    snd_hwm=0)
        ports = [free_port(), free_port()]
        procs = [serve(i, keys, feed_ep, ports[i], tmp_path) for i in range(2)]
        pub, sec = load_keypair(d / "collector.key_secret")
        collectors = [Collector(open_subscriber(ctx, f"tcp://127.0.0.1:{p}", curve=CurveClient(
            public_key=pub, secret_key=sec, server_public_key=read_key_file(d / f"shard{i}.key")[0])))
            for i, p in enumerate(ports)]
        plain = Collector(open_subscriber(ctx, f"tcp://127.0.0.1:{ports[0]}"))  # no keys: must get nothing
        stranger_pub, stranger_sec = load_keypair(d / "stranger.key_secret")
        stranger = Collector(open_subscriber(ctx, f"tcp://127.0.0.1:{ports[1]}", curve=CurveClient(
            public_key=stranger_pub, secret_key=stranger_sec, server_public_key=read_key_file(d / "shard1.key")[0])))

        # ready: every instrument's topic and the service topic subscribed (an XPUB passes each topic
        # once) and a Status from each shard
        topics, deadline = set(), time.monotonic() + SAFETY_S
        while len(topics) < N_INST + 1 or not all(c.last_status() for c in collectors):
            for p, log in procs:
                assert p.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, [log.read_text()[-2000:] for _, log in procs]
            while feed.poll(10):
                msg = feed.recv()
                if msg[:1] == b"\x01":
                    topics.add(msg[1:])
            for c in collectors + [plain, stranger]:
                c.poll()

        events = generate(N_EVENTS, SyntheticConfig(instruments=N_INST, seed=5, rate_hz=RATE))
        res = Pacer(feed, encode_feed(events), constant_rate(N_EVENTS, RATE), spin=False,
                    idle_hook=lambda: [c.poll() for c in collectors]).run()
        assert res.sent == N_EVENTS
        time.sleep(0.5)
        for p, _ in procs:
            p.terminate()
        deadline = time.monotonic() + SAFETY_S
        while not all(c.final_status_seen for c in collectors) and time.monotonic() < deadline:
            for c in collectors + [plain, stranger]:
                c.poll()
            time.sleep(0.005)
        codes = [p.wait(timeout=SAFETY_S) for p, _ in procs]
        assert codes == [0, 0], [log.read_text()[-3000:] for _, log in procs]
        for c in collectors + [plain, stranger]:
            c.poll()

        totals = {"decided": 0, "shed": 0, "conflated": 0, "rejected": 0}
        for i, c in enumerate(collectors):
            assert c.final_status_seen, f"shard {i}: no final Status"
            mine = np.flatnonzero(events["instrument"] % 2 == i)  # instrument position % 2 (ids are 0..7)
            answers = decode_frames(c.frames, c.recv_ns)
            r = analyse(answers, events["instrument"][mine], events["seq"][mine], np.zeros(mine.size, np.int64),
                        mine.size)
            acc = r.accounting
            assert acc["lost"] == 0 and r.unmatched == 0 and r.duplicates == 0, (i, acc, r.unmatched)
            assert acc["received"] == mine.size  # the shard read its share of the feed, and only that
            for k in totals:
                totals[k] += acc[k]
        assert sum(totals.values()) == N_EVENTS and totals["decided"] > 0, totals
        assert plain.frames == [] and stranger.frames == []  # CURVE was on at the shards' egress
        assert auth.stats.admitted >= 2 and auth.stats.denied == 0  # both shards passed the feed's ZAP
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        auth.stop()
        ctx.destroy(linger=0)
