"""hft_infer.client against a real `hft-infer serve` subprocess (tests/service_harness.py).

The service is started exactly as a user starts it; these tests talk to it only
through `FeedPublisher` and `DecisionSubscriber` (plus its exit code and
service.json). Checked: quotes and trades are decided and read back typed in
both egress modes; a Reset through the client clears the state (against an
instrument that was not reset); an asyncio consumer on the default loop and
on uvloop; instrument filters (per_instrument, and what batch mode does to
them); CURVE end to end over tcp on 127.0.0.1; `for_service` with a PUSH feed
into a PULL ingest; a stop (final Status) and restarts (SIGKILL, then a clean
stop) as the subscriber sees them.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import uvloop
from service_harness import TEST_MODEL, ServiceUnderTest

from hft_infer.app.launcher import ServiceProcess
from hft_infer.client import (
    Decision,
    DecisionSubscriber,
    EgressModeError,
    FeedPublisher,
    Outcome,
    ServiceStatus,
)
from hft_infer.transport.codec import SERVICE_TOPIC
from hft_infer.transport.curve import write_keypair

SAFETY_S = 120.0  # bound on waiting for a subprocess on a shared 2-core box; not a measurement
# Deadlines count from ts_send_ns, which the client stamps: on a loaded 2-core box the default
# 5 ms would shed some events, and these tests are about decisions, not shedding.
RELAXED = ["scheduler.max_age_us=30000000"]
LEVELS = 10


def book(k: int, levels: int = LEVELS) -> np.ndarray:
    """A plausible book, different for each k (deterministic)."""
    rng = np.random.default_rng(k)
    mid = 100.0 + rng.random()
    depth = 0.01 * np.arange(1, levels + 1)
    return np.column_stack([mid - depth, rng.integers(1, 100, levels), mid + depth, rng.integers(1, 100, levels)])


class Service:
    """One `hft-infer serve` with its own runtime dir; clients are the tests' business."""

    def __init__(self, *overrides: str, name: str = "t") -> None:
        self.sut = ServiceUnderTest(TEST_MODEL + RELAXED + list(overrides), name=name)
        self.overrides = TEST_MODEL + RELAXED + list(overrides)
        self.runs = 1

    def start(self) -> Service:
        self.sut.service.start()
        return self

    def endpoint(self, which: str) -> str:
        return self.sut.endpoint(which)

    @property
    def proc(self):
        return self.sut.proc

    def another_run(self) -> ServiceProcess:
        """A second `serve` on the same runtime dir and name: the same endpoints (a restart)."""
        self.runs += 1
        log_dir = Path(self.sut.runtime) / f"log{self.runs}"
        log_dir.mkdir()
        return ServiceProcess(config=None, overrides=[f"service.name={self.sut.name}"] + self.overrides,
                              run_dir=Path(self.sut.runtime) / f"run{self.runs}", log_dir=log_dir,
                              env=self.sut.service.env)

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc) -> None:
        self.sut.close()


def connect(svc: Service, **sub_kw) -> tuple[FeedPublisher, DecisionSubscriber]:
    """A subscriber, then the feed publisher the service connects to; both live when this returns."""
    sub = DecisionSubscriber(svc.endpoint("decisions"), **sub_kw)
    pub = FeedPublisher(svc.endpoint("md"))
    pub.wait_for_subscribers(1, SAFETY_S)
    sub.wait_for_service(SAFETY_S)
    return pub, sub


def read_until(sub: DecisionSubscriber, done, svc: Service | None = None) -> list:
    """Items until done(items) holds (bounded by SAFETY_S)."""
    items: list = []
    deadline = time.monotonic() + SAFETY_S
    while not done(items):
        assert time.monotonic() < deadline, f"timed out; service log:\n{svc.sut.log_tail() if svc else ''}"
        item = sub.recv(timeout_s=0.2)
        if item is not None:
            items.append(item)
    return items


def accounted(n: int):
    """Every one of n events answered: a decision, or conflated into a later one."""
    return lambda items: sum(1 + d.n_conflated for d in items if isinstance(d, Decision)) >= n


def stop(svc: Service, sub: DecisionSubscriber) -> ServiceStatus:
    """SIGTERM; the subscriber reads until the final Status; the service exits 0."""
    svc.proc.send_signal(signal.SIGTERM)
    items = read_until(sub, lambda it: any(isinstance(x, ServiceStatus) and x.stopped for x in it), svc)
    assert svc.proc.wait(SAFETY_S) == 0, svc.sut.log_tail()
    return items[-1]


@pytest.mark.parametrize("mode", ["batch", "per_instrument"])
def test_published_events_are_decided_and_read_back_typed(mode):
    with Service(f"egress.mode={mode}").start() as svc:
        pub, sub = connect(svc)
        lenient = DecisionSubscriber(svc.endpoint("decisions"), instruments=[2], on_batch="filter")
        strict = DecisionSubscriber(svc.endpoint("decisions"), instruments=[2])
        lenient.wait_for_service(SAFETY_S)
        strict.wait_for_service(SAFETY_S)
        sent = []
        t0 = time.time_ns()
        for k in range(40):
            assert pub.publish_quote(k % 5, book(k), ts_exchange_ns=1_000 + k)
            sent.append((k % 5, k // 5))
        assert pub.publish_trade(2, 100.25, 3.0, -1)
        sent.append((2, 8))
        assert pub.publish_quotes([5, 6, 7, 5], np.stack([book(100 + k) for k in range(4)])) == 4
        sent += [(5, 0), (6, 0), (7, 0), (5, 1)]
        assert pub.publish_trades([6, 7], [99.5, 101.0], [1.0, 2.0], [1, -1]) == 2
        sent += [(6, 1), (7, 1)]
        assert pub.heartbeat()
        t1 = time.time_ns()
        items = read_until(sub, accounted(len(sent)), svc)
        final = stop(svc, sub)
        kept = read_until(lenient, lambda it: any(isinstance(x, ServiceStatus) and x.stopped for x in it), svc)
        with pytest.raises(EgressModeError) if mode == "batch" else contextlib.nullcontext():
            read_until(strict, lambda it: any(isinstance(x, ServiceStatus) and x.stopped for x in it), svc)
        summary = svc.sut.summary()
    decisions = [d for d in items if isinstance(d, Decision)]
    assert all(type(d) is Decision and d.status == Outcome.DECIDED for d in decisions)
    assert sum(1 + d.n_conflated for d in decisions) == len(sent)  # nothing lost, nothing twice
    assert {(d.instrument, d.seq) for d in decisions} <= set(sent)
    for inst in {i for i, _ in sent}:  # the freshest event of each instrument is the one decided last
        mine = [d.seq for d in decisions if d.instrument == inst]
        assert mine == sorted(mine) and mine[-1] == max(s for i, s in sent if i == inst)
    assert all(-1.0 <= d.score <= 1.0 and d.action in (-1, 0, 1) for d in decisions)
    assert all(t0 <= d.ts_send_ns <= t1 for d in decisions)  # the client's stamp, echoed
    assert {d.model_version for d in decisions} == {final.status.model_version}
    assert (sub.stats.batches > 0) == (mode == "batch") and sub.stats.malformed == 0
    assert final.stopped and not final.restarted and final.error == ""
    st = final.status
    assert st.received == len(sent) and st.decided == len(decisions) and st.pending == 0
    assert summary["counters"]["heartbeats"] == 1
    assert [d for d in kept if isinstance(d, Decision)] == [d for d in decisions if d.instrument == 2]


def _lockstep(pub: FeedPublisher, sub: DecisionSubscriber, inst: int, ks, svc) -> list[float]:
    """Publish one quote at a time and wait for its decision, so that nothing is conflated."""
    scores = []
    for k in ks:
        assert pub.publish_quote(inst, book(k))
        (d,) = [x for x in read_until(sub, lambda it: any(isinstance(x, Decision) for x in it), svc)
                if isinstance(x, Decision)]
        assert (d.instrument, d.n_conflated, d.status) == (inst, 0, Outcome.DECIDED)
        scores.append(d.score)
    return scores


def test_a_reset_through_the_client_starts_the_instrument_afresh():
    with Service().start() as svc:
        pub, sub = connect(svc)
        ks = range(6)
        first = {i: _lockstep(pub, sub, i, ks, svc) for i in (3, 4)}
        assert pub.next_seq(3) == pub.next_seq(4) == 6
        assert pub.reset(3) and pub.next_seq(3) == 0 and pub.next_seq(4) == 6
        again = {i: _lockstep(pub, sub, i, ks, svc) for i in (3, 4)}
        assert pub.reset() and pub.next_seq(4) == 0
        assert _lockstep(pub, sub, 4, ks, svc) == first[4]  # a reset of every instrument
        final = stop(svc, sub).status
    assert again[3] == first[3]  # same books from a clean state: the same scores
    assert again[4] != first[4]  # not reset: its window still held the first six books
    assert final.resets == 2 and final.rejected == 0 and final.seq_gaps == 0


def test_an_asyncio_consumer_on_the_default_loop_and_on_uvloop():
    with Service().start() as svc:
        sub = DecisionSubscriber(svc.endpoint("decisions"))
        pub = FeedPublisher(svc.endpoint("md"))
        pub.wait_for_subscribers(1, SAFETY_S)

        async def consume(base: int) -> tuple[list[Decision], int]:
            await sub.await_service(SAFETY_S)
            ticks = 0

            async def ticker():  # the loop must stay free while the consumer waits
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.001)

            async def feed():
                await asyncio.sleep(0.05)
                pub.publish_quotes(np.arange(8), np.stack([book(base + k) for k in range(8)]))

            tasks = [asyncio.create_task(ticker()), asyncio.create_task(feed())]
            got: list[Decision] = []
            async for item in sub.aiter(timeout_s=SAFETY_S):
                if isinstance(item, Decision):
                    got.append(item)
                    if sum(1 + d.n_conflated for d in got) == 8:
                        break
            for t in tasks:
                t.cancel()
            return got, ticks

        for run, base in ((asyncio.run, 0), (uvloop.run, 100)):
            got, ticks = run(consume(base))
            assert sorted(d.instrument for d in got) == list(range(8)) and ticks > 0
            assert all(d.status == Outcome.DECIDED for d in got)
        stop(svc, sub)


def test_an_instrument_filter_receives_exactly_its_instruments(monkeypatch, tmp_path):
    with Service("egress.mode=per_instrument").start() as svc:
        pub, everything = connect(svc)
        mine = DecisionSubscriber(svc.endpoint("decisions"), instruments=[1, 3])
        mine.wait_for_service(SAFETY_S)
        n = 0
        for k in range(60):
            pub.publish_quote(k % 6, book(k))
            n += 1
        all_items = read_until(everything, accounted(n), svc)
        stop(svc, everything)
        filtered = read_until(mine, lambda it: any(isinstance(x, ServiceStatus) and x.stopped for x in it), svc)
    want = [d for d in all_items if isinstance(d, Decision) and d.instrument in (1, 3)]
    assert want and [d for d in filtered if isinstance(d, Decision)] == want
    assert {d.instrument for d in all_items if isinstance(d, Decision)} == set(range(6))
    assert mine.stats.batches == 0 and mine.stats.stops == 1
    monkeypatch.setenv("HFT_INFER_RUNTIME_DIR", str(tmp_path))  # resolving the config's endpoints makes it
    with pytest.raises(EgressModeError, match="egress.mode"):
        DecisionSubscriber.for_service(None, ["egress.mode=batch"], instruments=[1])


def _ready_endpoints(svc: Service) -> tuple[str, str]:
    """The resolved ingest and decision endpoints from serve's READY line (tcp port 0 binds)."""
    deadline = time.monotonic() + SAFETY_S
    while True:
        m = re.search(r"READY .* ingest=(\S+) decisions=(\S+)", svc.sut.service.log_path.read_text())
        if m:
            return m.group(1), m.group(2)
        assert svc.proc.poll() is None and time.monotonic() < deadline, svc.sut.log_tail()
        time.sleep(0.05)


def test_curve_end_to_end_over_tcp(tmp_path):
    """The service binds its feed and decision sockets on tcp with CURVE (the interface name
    `lo` is not a loopback address to the policy, so CURVE is applied; it binds 127.0.0.1);
    the client connects to both as an authorized CURVE client."""
    keys, authorized = tmp_path / "keys", tmp_path / "authorized"
    write_keypair(keys, "service")
    write_keypair(keys, "client")
    authorized.mkdir(mode=0o700)
    shutil.copy(keys / "client.key", authorized / "client.key")
    overrides = ["ingest.endpoint='tcp://lo:0'", "ingest.bind=true", "egress.endpoint='tcp://lo:0'",
                 f"security.curve_server_secret='{keys / 'service.key_secret'}'",
                 f"security.curve_authorized_dir='{authorized}'"]
    curve = dict(curve_secret=keys / "client.key_secret", curve_server_public=keys / "service.key")
    with Service(*overrides).start() as svc:
        feed, decisions = _ready_endpoints(svc)
        assert feed.startswith("tcp://127.0.0.1:") and decisions.startswith("tcp://127.0.0.1:")
        sub = DecisionSubscriber(decisions, **curve)
        pub = FeedPublisher(feed, bind=False, **curve)
        assert pub.wait_for_subscribers(1, SAFETY_S) == 1  # subscriptions travel after the handshake
        sub.wait_for_service(SAFETY_S)
        assert pub.publish_quotes([0, 1, 2], np.stack([book(k) for k in range(3)])) == 3
        items = read_until(sub, accounted(3), svc)
        final = stop(svc, sub)
    assert {d.instrument for d in items if isinstance(d, Decision)} == {0, 1, 2}
    assert final.status.received == 3


def test_for_service_follows_the_config_push_into_a_pull_ingest(monkeypatch):
    overrides = ["ingest.socket_type=pull", "ingest.bind=true"]
    with Service(*overrides, name="svc-push").start() as svc:
        monkeypatch.setenv("HFT_INFER_RUNTIME_DIR", svc.sut.runtime)
        cfg = ["service.name=svc-push", *overrides]
        sub = DecisionSubscriber.for_service(None, cfg)
        sub.wait_for_service(SAFETY_S)  # the service is up: its PULL is bound
        pub = FeedPublisher.for_service(None, cfg)
        assert pub.socket_type == "push" and pub.endpoint == svc.endpoint("md")
        assert pub.publish_quotes([9, 10], np.stack([book(1), book(2)])) == 2
        items = read_until(sub, accounted(2), svc)
        stop(svc, sub)
    assert sorted(d.instrument for d in items if isinstance(d, Decision)) == [9, 10]


def test_a_killed_and_a_stopped_service_are_seen_as_restarts():
    with Service().start() as svc:
        pub, sub = connect(svc)
        assert pub.publish_quotes(np.arange(4), np.stack([book(k) for k in range(4)])) == 4
        read_until(sub, lambda it: any(isinstance(x, ServiceStatus) and x.status.received == 4 for x in it), svc)
        svc.proc.kill()  # no final Status
        svc.proc.wait()
        deadline = time.monotonic() + SAFETY_S
        while pub.subscriptions().get(SERVICE_TOPIC):  # its subscriptions left with it
            assert time.monotonic() < deadline, pub.subscriptions()
            time.sleep(0.01)

        second = svc.another_run()
        second.start()
        try:
            pub.wait_for_subscribers(1, SAFETY_S)
            items = read_until(sub, lambda it: any(isinstance(x, ServiceStatus) for x in it), svc)
            restart = [x for x in items if isinstance(x, ServiceStatus)][0]
            assert restart.restarted and restart.why.startswith("counters went back (received, decided")
            assert pub.publish_quotes(np.arange(4), np.stack([book(k) for k in range(4)])) == 4  # seq 1 here
            read_until(sub, accounted(4), svc)
            second.proc.send_signal(signal.SIGTERM)
            items = read_until(sub, lambda it: any(isinstance(x, ServiceStatus) and x.stopped for x in it), svc)
            assert second.proc.wait(SAFETY_S) == 0
            assert items[-1].status.received == 4 and not items[-1].restarted

            third = svc.another_run()
            third.start()
            try:
                items = read_until(sub, lambda it: any(isinstance(x, ServiceStatus) for x in it), svc)
                st = [x for x in items if isinstance(x, ServiceStatus)][0]
                assert st.restarted and st.why == "the previous Status was final"
            finally:
                third.close()
        finally:
            second.close()
    assert sub.stats.restarts == 2 and sub.stats.stops == 1 and sub.stats.malformed == 0
