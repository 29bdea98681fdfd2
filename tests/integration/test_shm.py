"""The iceoryx2 transport end to end: real `hft-infer` processes, real iceoryx2 services.

Each test names its services after a fresh `service.name` (iceoryx2 services are host-wide, not
in the runtime dir), so parallel runs and earlier failures cannot meet. No wall-clock limits are
asserted: timeouts only bound a hang.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("iceoryx2")

from hft_infer.app.launcher import ServiceProcess, private_runtime_dir  # noqa: E402
from hft_infer.client import DecisionSubscriber, FeedPublisher  # noqa: E402
from hft_infer.replay.capture import read_capture  # noqa: E402
from hft_infer.transport.schema import Decision, Reason  # noqa: E402

CLI = [sys.executable, "-m", "hft_infer"]
WAIT_S = 120  # a bound on a hang on the loaded 2-core VM, never a performance limit
BOOK = np.tile(np.array([[99.9, 5.0, 100.1, 7.0]], np.float32), (10, 1))


def _name() -> str:
    return f"shm{uuid.uuid4().hex[:10]}"


def _overrides(name: str, *extra: str) -> list[str]:
    return [f"service.name={name}", "ingest.transport=iceoryx2", "egress.transport=iceoryx2",
            'model.checkpoint=""', 'model.preset="mlp_small"', *extra]


class Rig:
    """A serve process over iceoryx2 with the client library's publisher and subscriber."""

    def __init__(self, *extra: str, name: str | None = None) -> None:
        self.name = name or _name()
        self.runtime = private_runtime_dir("hft-shm-")
        self.overrides = _overrides(self.name, *extra)
        self.env = dict(os.environ, HFT_INFER_RUNTIME_DIR=self.runtime)
        self.pub = FeedPublisher.for_service(None, self.overrides)
        self.sub = DecisionSubscriber.for_service(None, self.overrides)
        self.procs: list[ServiceProcess] = []

    def start(self) -> ServiceProcess:
        k = len(self.procs)
        svc = ServiceProcess(config=None, overrides=self.overrides, run_dir=Path(self.runtime) / f"run{k}",
                             log_dir=Path(self.runtime), env=self.env)
        svc.log_path = Path(self.runtime) / f"service{k}.log"
        svc.start()
        self.procs.append(svc)
        self.sub.wait_for_service(WAIT_S)
        self.pub.wait_for_subscribers(1, WAIT_S)
        return svc

    def decisions_until(self, predicate) -> list:
        items: list = []
        deadline = time.monotonic() + WAIT_S
        while not predicate(items):
            assert time.monotonic() < deadline, f"timed out; service log:\n{self.log()}"
            item = self.sub.recv(0.5)
            if item is not None:
                items.append(item)
        return items

    def stop(self, svc: ServiceProcess) -> dict:
        svc.proc.send_signal(signal.SIGTERM)
        assert svc.wait_exit(WAIT_S) == 0, self.log()
        return json.loads((svc.run_dir / "service.json").read_text())

    def log(self) -> str:
        return "".join(Path(p.log_path).read_text()[-3000:] for p in self.procs if Path(p.log_path).exists())

    def close(self) -> None:
        for p in self.procs:
            p.close()
        self.pub.close()
        self.sub.close()


@pytest.fixture
def rig():
    made: list[Rig] = []

    def make(*extra: str) -> Rig:
        made.append(Rig(*extra))
        return made[-1]

    yield make
    for r in made:
        r.close()


def _decided(items) -> list[Decision]:
    return [d for d in items if isinstance(d, Decision) and d.status == 0]


def test_serve_over_shm_decides_and_rejects_garbage(rig):
    r = rig("egress.mode=per_instrument")
    svc = r.start()
    for i in range(4):
        assert r.pub.publish_quote(i, BOOK)
    r.decisions_until(lambda items: len(_decided(items)) >= 4)
    # garbage bytes straight onto the feed's service: rejected with a reason, the loop goes on
    assert r.pub._sock.send(b"\xc1 not msgpack")
    assert r.pub._sock.send(b"\x93\x01\x02")  # an array, but no message of ours
    for i in range(4):
        assert r.pub.publish_quote(i, BOOK)
    r.decisions_until(lambda items: len(_decided(items)) >= 4)
    summary = r.stop(svc)
    acc = summary["accounting"]
    assert acc["received"] == 10 and acc["rejected"] == 2 and acc["pending"] == 0
    assert acc["decided"] + acc["conflated"] + acc["shed"] == 8
    assert sum(summary["rejected_by_reason"].values()) == 2
    assert set(summary["rejected_by_reason"]) <= {r_.name for r_ in Reason}
    assert summary["endpoints"]["ingest"] == f"iceoryx2:hft-infer/{r.name}/md"


def test_restart_after_kill_9(rig):
    r = rig()
    first = r.start()
    assert r.pub.publish_quote(1, BOOK)
    r.decisions_until(lambda items: len(_decided(items)) >= 1)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(WAIT_S)
    # the dead node's ports are still in the services: the next start removes them and serves
    second = r.start()
    r.pub.reset()  # the new service starts its sequences afresh
    for i in range(3):
        assert r.pub.publish_quote(i, BOOK)
    r.decisions_until(lambda items: len(_decided(items)) >= 3)
    acc = r.stop(second)["accounting"]
    assert acc["received"] == 3 and acc["pending"] == 0
    assert "dead-node cleanup" in r.log()


def test_slow_decision_reader_loss_is_counted(rig):
    """A decision subscriber that never reads fills its 4-frame buffer: the service's publisher
    discards what does not fit for it and counts it (egress_dropped), never waits; a reader that
    keeps up still gets every frame."""
    r = rig("egress.mode=per_instrument", "egress.status_interval_ms=100000")
    slow = DecisionSubscriber.for_service(None, r.overrides, shm_buffer=4)
    try:
        svc = r.start()
        n = 64
        got: list = []
        for i in range(n):
            assert r.pub.publish_quote(i, BOOK)
            got += r.sub.poll()
            time.sleep(0.002)
        got = r.decisions_until(lambda items: len(_decided(got + items)) >= n) + got
        summary = r.stop(svc)
        assert summary["counters"]["egress_dropped"] > 0
        assert len(slow.poll()) <= 4  # what fitted its buffer
        assert len(_decided(got)) == n  # the reader that keeps up lost nothing
    finally:
        slow.close()


def test_slow_service_feed_loss_is_counted():
    """FeedPublisher over iceoryx2 into a subscriber buffer that nobody drains: what does not
    fit is not sent, is counted in `dropped` and takes no sequence number."""
    from hft_infer.transport.shm import ShmSubscriber

    name = _name()
    reader = ShmSubscriber(f"hft-infer/{name}/md", buffer=8)
    pub = FeedPublisher(f"hft-infer/{name}/md", transport="iceoryx2", shm_buffer=8)
    try:
        sent = sum(pub.publish_quote(0, BOOK) for _ in range(20))
        assert sent == 8 and pub.dropped == 12 and pub.next_seq(0) == 8
        frames = reader.recv_many(100)
        assert len(frames) == 8
    finally:
        pub.close()
        reader.close()


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("null", [True, False], ids=["null-service", "service"])
def test_bench_over_shm(tmp_path, null):
    name = _name()
    args = [*CLI, "bench", "--transport", "iceoryx2", "--rate", "1000", "--duration", "1", "--warmup", "0.2",
            "--instruments", "8", "--quiet", "--json", str(tmp_path / "b.json"), "--run-dir", str(tmp_path / "run"),
            *sum((["--set", o] for o in _overrides(name)[3:]), []), "--set", f"service.name={name}",
            *(["--null-service"] if null else [])]
    res = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    acc = _json(tmp_path / "b.json")["accounting"]
    assert acc["lost"] == 0 and acc["received"] == acc["sent"] == 1200


def test_replay_verify_over_shm(tmp_path):
    name = _name()
    res = subprocess.run([*CLI, "replay", "synthetic", "--transport", "iceoryx2", "--start-service", "--verify",
                          "--events", "1500", "--rate", "2000", "--instruments", "8", "--quiet",
                          "--run-dir", str(tmp_path / "run"),
                          *sum((["--set", o] for o in _overrides(name)[3:]), []), "--set", f"service.name={name}"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    assert " 0 mismatches" in res.stdout + res.stderr


def test_record_over_shm(tmp_path):
    name = _name()
    out = tmp_path / "feed.cap"
    sets = ["--set", f"service.name={name}"]
    rec = subprocess.Popen([*CLI, "record", "--transport", "iceoryx2", "--out", str(out), "--count", "30", *sets],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pub = FeedPublisher.for_service(None, [f"service.name={name}", "ingest.transport=iceoryx2"])
    try:
        pub.wait_for_subscribers(1, WAIT_S)
        for k in range(30):
            assert pub.publish_quote(k % 3, BOOK)
        stdout, stderr = rec.communicate(timeout=WAIT_S)
    finally:
        pub.close()
        if rec.poll() is None:
            rec.kill()
    assert rec.returncode == 0, stderr
    assert "recorded 30 messages" in stdout
    cap = read_capture(str(out))
    assert len(cap) == 30 and cap.n_frames == 30 and cap.clean  # one frame per message: no topic frames


def test_missing_extra_is_a_clear_error(tmp_path):
    """Without iceoryx2 importable, check-config and serve exit 2 naming the extra (no hang)."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "iceoryx2.py").write_text("raise ImportError('not installed (test)')\n")
    env = dict(os.environ, PYTHONPATH=f"{shadow}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               HFT_INFER_RUNTIME_DIR=private_runtime_dir("hft-shm-"))
    for cmd in (["check-config", "--set", "ingest.transport=iceoryx2"],
                ["serve", "--no-control", "--set", "egress.transport=iceoryx2"]):
        res = subprocess.run([*CLI, *cmd], capture_output=True, text=True, env=env, timeout=WAIT_S)
        assert res.returncode == 2, res.stderr
        assert "pip install 'hft-infer[shm]'" in res.stderr
