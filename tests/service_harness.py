"""A real `hft-infer serve` subprocess with a real publisher and decision subscriber.

Used by the integration and e2e tests: the service runs exactly as a user
starts it (CLI, config, sockets), on a private runtime dir.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import zmq

from hft_infer.app.launcher import ServiceProcess, open_feed_publisher, private_runtime_dir, subscribe_decisions, tail
from hft_infer.transport.codec import EgressDecoder, decisions_of_batch, encode, pack_book, topic_for
from hft_infer.transport.schema import Decision, DecisionBatch, Quote, Status

# Until the trained default model ships, tests pin a small seeded preset so
# they do not depend on it; the e2e test of the default config uses it as is.
TEST_MODEL = ["model.checkpoint=\"\"", "model.preset=\"mlp_small\""]
# a CPU step of several milliseconds (an LSTM window recomputed per trigger): time for frames to
# arrive while it runs (runner.cpu_worker's tests)
SLOW_MODEL = ['model.checkpoint=""', 'model.preset="lstm_a"', 'model.window_method="recompute"']


def quote(instrument: int, seq: int, *, levels: int = 10, ts_send_ns: int = 0, priority: int = -1,
          seed: int | None = None) -> bytes:
    rng = np.random.default_rng(seq if seed is None else seed)
    lv = np.empty((levels, 4), np.float32)
    mid = 100.0 + rng.random()
    lv[:, 0] = mid - 0.01 * (np.arange(levels) + 1)
    lv[:, 2] = mid + 0.01 * (np.arange(levels) + 1)
    lv[:, 1] = rng.integers(1, 100, levels)
    lv[:, 3] = rng.integers(1, 100, levels)
    return encode(Quote(instrument, seq, seq, ts_send_ns, levels, pack_book(lv), priority))


class ServiceUnderTest:
    """A real `hft-infer serve` (hft_infer.app.launcher) plus a publisher and a collector, for tests."""

    def __init__(self, overrides: list[str] | None = None, *, extra_args: list[str] | None = None,
                 name: str = "t", control: bool = False) -> None:
        self.runtime = private_runtime_dir("hft-it-")
        self.run_dir = Path(self.runtime) / "run"
        self.name = name
        overrides = [f"service.name={name}"] + (overrides if overrides is not None else TEST_MODEL)
        self.service = ServiceProcess(config=None, overrides=overrides, run_dir=self.run_dir,
                                      log_dir=Path(self.runtime),
                                      env=dict(os.environ, HFT_INFER_RUNTIME_DIR=self.runtime),
                                      extra_args=extra_args, control=control)
        self.ctx = zmq.Context()
        self.decoded = EgressDecoder().decode

    @property
    def proc(self):
        return self.service.proc

    def endpoint(self, which: str) -> str:
        return f"ipc://{self.runtime}/{self.name}-{which}.sock"

    def start(self, n_topics: int = 65, timeout_s: float = 120.0, *, publisher: zmq.Socket | None = None,
              feed: bool = True) -> "ServiceUnderTest":
        """Start the service; `publisher`: an XPUB of another harness to share (shards);
        `feed=False`: no publisher of ours (another process binds the feed, e.g. replay),
        ready once the first Status arrives."""
        self.service.start()
        self.collector = subscribe_decisions(self.ctx, self.endpoint("decisions"))
        self.sub = self.collector.sock
        if not feed:
            self.wait_for(lambda m: any(isinstance(x, Status) for x in m), timeout_s)
            self.collector.frames.clear()
            self.collector.recv_ns.clear()
            return self
        self.pub = publisher if publisher is not None else open_feed_publisher(self.ctx, self.endpoint("md"))
        self.service.wait_ready(self.pub, self.collector, n_topics, timeout_s)
        return self

    def send(self, frames, gap_s: float = 0.0) -> None:
        """frames: (topic, payload) pairs, or lists of raw frames (multipart as given)."""
        for f in frames:
            if isinstance(f, tuple):
                self.pub.send(f[0], zmq.SNDMORE)
                self.pub.send(f[1])
            else:
                self.pub.send_multipart(f)
            if gap_s:
                time.sleep(gap_s)
            self.collector.poll()

    def send_quotes(self, pairs, gap_s: float = 0.0, **kw) -> None:
        self.send([(topic_for(i), quote(i, s, **kw)) for i, s in pairs], gap_s)

    def messages(self) -> list:
        """Every message received, DecisionBatch frames expanded into their Decisions."""
        if not self.ctx.closed:  # after close(): what was received until then
            self.collector.poll()
        out = []
        for p in self.collector.frames:
            m = self.decoded(p)
            out.extend(decisions_of_batch(m) if isinstance(m, DecisionBatch) else [m])
        return out

    def decisions(self) -> list[Decision]:
        return [m for m in self.messages() if isinstance(m, Decision)]

    def wait_for(self, predicate, timeout_s: float = 20.0) -> list:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.sub.poll(50):
                self.collector.poll()
            msgs = self.messages()
            if predicate(msgs):
                return msgs
        raise AssertionError(f"timed out; service log:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 60.0) -> Status | None:
        """SIGTERM, wait for the final Status and the exit; returns the final Status."""
        self.service.terminate_and_wait(self.collector, timeout_s)
        finals = [m for m in self.messages() if isinstance(m, Status) and m.final]
        return finals[-1] if finals else None

    def summary(self) -> dict:
        return json.loads((self.run_dir / "service.json").read_text())

    def log_tail(self, n: int = 30) -> str:
        return tail(self.service.log_path, n)

    def close(self) -> None:
        self.service.close()
        if hasattr(self, "collector"):
            self.collector.poll()
        self.ctx.destroy(linger=0)
        shutil.rmtree(self.runtime, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def in_process_services(tmp_path, monkeypatch, *base: str):
    """A factory of `Service` objects built in the test's own process on real sockets in a
    private runtime dir (`base` overrides, then each call's), warmed up; yields the factory and
    closes every service made. For tests of the loop's parts driven by hand (a fixture:
    `yield from in_process_services(tmp_path, monkeypatch, ...)`)."""
    from hft_infer.config import load_config
    from hft_infer.service import Service

    monkeypatch.setenv("HFT_INFER_RUNTIME_DIR", str(tmp_path))
    made = []

    def make(*overrides: str) -> Service:
        cfg = load_config(None, ['model.checkpoint=""', 'model.preset="mlp_small"', "control.enabled=false",
                                 'runner.engine="eager"', f'service.name="inproc{len(made)}"', *base, *overrides])
        svc = Service(cfg)
        svc.open_sockets(zmq.Context.instance())
        svc.warm_up()
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.close()


def read_timeline(path: Path) -> list[dict]:
    """A bench run's snapshots.jsonl (StatsReceiver.write_timeline), checked as it must be: times
    increasing, every cumulative counter non-decreasing, the last line the service's final one."""
    lines = [json.loads(ln) for ln in Path(path).read_text().splitlines()]
    assert lines, f"{path}: no snapshot"
    assert [ln["t_s"] for ln in lines] == sorted(ln["t_s"] for ln in lines) and lines[0]["t_s"] == 0
    for prev, cur in zip(lines, lines[1:]):
        assert all(cur["counters"][k] >= v for k, v in prev["counters"].items()), (prev, cur)
    assert lines[-1]["final"] and not any(ln["final"] for ln in lines[:-1])
    return lines
