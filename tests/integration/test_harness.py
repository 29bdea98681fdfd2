"""The load generator measured against a null service whose behaviour is known (real processes and sockets).

Bounds are generous: the dev machine has two cores shared with other work,
so what is checked is the harness's logic (a decision is timestamped when it
arrives, every event is answered and accounted for), never its speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import zmq

from hft_infer.app.drive import HarnessOptions, Load, Target, drive
from hft_infer.app.launcher import (
    ServiceProcess,
    open_feed_publisher,
    private_runtime_dir,
    subscribe_decisions,
)
from hft_infer.config import load_config
from hft_infer.replay.pacer import encode_feed
from hft_infer.replay.synthetic import SyntheticConfig, generate
from hft_infer.transport.codec import SERVICE_TOPIC, EgressDecoder, decisions_of_batch, encode, topic_for
from hft_infer.transport.schema import Decision, DecisionBatch, Heartbeat, Status

ROOT = Path(__file__).resolve().parents[2]


def cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "hft_infer", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_a_decision_that_arrives_during_a_send_burst_is_timestamped_when_it_arrives(tmp_path):
    """Group A (20 events at t=0) is answered by the null service D after it received them,
    while the pacer is still sending group B (an as-fast-as-possible burst). A collector that
    shared the pacer's thread would read A's answers only after the burst (measured: 366 ms
    after their send, for a 363 ms burst, docs/notes/replay.md); one of its own reads them
    within a bound of D, long before the burst ends. The bound is generous: on two shared
    cores the pacer, the null service and four I/O threads are all busy during the burst."""
    delay_ms, bound_ms, n_a, n_b = 50, 150, 20, 300_000
    overrides = ["service.name=hb", "universe.instruments=8"]
    cfg = load_config(None, overrides)
    events = generate(n_a + n_b, SyntheticConfig(instruments=8, seed=3))
    offsets = np.zeros(n_a + n_b, dtype=np.int64)
    offsets[n_a:] = 5_000_000  # B starts 5 ms after A, all at once
    load = Load(events, encode_feed(events), offsets, description="A, then a burst B")
    target = Target(cfg, None, overrides, start_service=True, null=True, null_delay_us=delay_ms * 1000)
    out, _, res = drive(load, target, tmp_path / "run", quiet=True, label="test", harness=HarnessOptions("auto"))
    assert out["accounting"]["lost"] == 0 and out["accounting"]["decided"] == n_a + n_b
    in_a = res.tick_event < n_a
    assert in_a.sum() == n_a
    recv_a = res.tick_recv_mono_ns[in_a]
    after_send_ms = (recv_a - res.actual_mono_ns[res.tick_event[in_a]]) / 1e6  # answer received - actual send
    burst_end = res.actual_mono_ns[-1]
    # the answers came back while the burst was still being sent: the case that matters
    assert (burst_end - recv_a.max()) / 1e6 > 100, "burst too short to overlap the answers: raise n_b"
    assert after_send_ms.min() >= delay_ms  # never before the null service's delay has passed
    assert after_send_ms.max() <= delay_ms + bound_ms, after_send_ms.max()


def test_bench_null_service_with_a_known_delay_reads_that_delay(tmp_path):
    out_json = tmp_path / "out.json"
    r = cli("bench", "--null-service", "--null-delay-us", "20000", "--rate", "1000", "--duration", "1",
            "--warmup", "0.2", "--set", "service.name=hd", "--quiet", "--run-dir", str(tmp_path / "run"),
            "--json", str(out_json), env=dict(os.environ, HFT_INFER_RUNTIME_DIR=str(tmp_path)))
    assert r.returncode == 0, r.stderr + r.stdout
    out = json.loads(out_json.read_text())
    tick = out["tick_to_decision"]
    assert tick["count"] == 1000 and out["warmup_events"] == 200
    assert 20_000 <= tick["p50_us"] <= tick["p99_us"] <= 20_000 + 30_000
    assert out["accounting"] == {"sent": 1200, "received": 1200, "decided": 1200, "shed": 0, "conflated": 0,
                                 "rejected": 0, "lost": 0}
    assert out["latency_scope"] == "tick_to_decision over 1,000 decided events after 200 warm-up events"
    assert out["service"] == "null" and out["null_service"] == {"egress": "batch", "delay_us": 20000.0}
    assert out["engine"] == "null" and out["answer_frames"]["batch"] > 0 and out["answer_frames"]["decision"] == 0
    h = out["harness"]
    assert h["pacer_choice"] == "auto" and h["collectors"] == 1
    pinned = len(os.sched_getaffinity(0)) >= 4
    assert h["pacer"] == ("spin" if pinned else "sleep") and h["collector"] == ("spin" if pinned else "block")
    assert f"{out_json}" in r.stdout  # the JSON path is printed at the end
    assert "latency figures exclude them" in r.stdout and "after 200 warm-up events" in r.stdout
    run = tmp_path / "run"
    for name in ("summary.json", "tick_to_decision.hgrm", "pacer_lateness.hgrm", "pacer.log", "collector.log",
                 "service.log", "service/service.json"):
        assert (run / name).is_file(), name


def _null_service(tmp: str, egress: str):
    env = dict(os.environ, HFT_INFER_RUNTIME_DIR=tmp)
    svc = ServiceProcess(config=None, overrides=["service.name=n", "universe.instruments=4"], run_dir=Path(tmp) / "run",
                         log_dir=Path(tmp), env=env, null=True, extra_args=["--egress", egress])
    return svc


def _quote(inst: int, seq: int) -> bytes:
    from service_harness import quote

    return quote(inst, seq, levels=2, ts_send_ns=1_700_000_000_000_000_000 + seq)


import pytest  # noqa: E402


@pytest.mark.parametrize("egress", ["batch", "per_instrument"])
def test_null_service_answers_every_event_once_and_accounts_on_sigterm(egress):
    tmp = private_runtime_dir("hft-nt-")
    svc = _null_service(tmp, egress)
    ctx = zmq.Context()
    try:
        pub = open_feed_publisher(ctx, f"ipc://{tmp}/n-md.sock")
        col = subscribe_decisions(ctx, f"ipc://{tmp}/n-decisions.sock")
        svc.start()
        svc.wait_ready(pub, col, n_topics=4, timeout_s=60)
        sent = [(i % 4, i // 4) for i in range(400)]
        for inst, seq in sent:
            pub.send_multipart([topic_for(inst), _quote(inst, seq)])
        pub.send_multipart([topic_for(1), b"\xc1 not msgpack"])  # rejected, no answer
        pub.send_multipart([topic_for(2)])  # a lone topic frame: bad framing
        pub.send_multipart([SERVICE_TOPIC, encode(Heartbeat(1, "t"))])  # not an event
        col.wait_quiet(0.5, 20)
        assert svc.proc.poll() is None
        assert svc.terminate_and_wait(col, 30)
        assert svc.proc.returncode == 0
    finally:
        svc.close()
        ctx.destroy(linger=0)
    dec = EgressDecoder().decode
    msgs = [dec(f) for f in col.frames]
    answers = []
    for m in msgs:
        if isinstance(m, DecisionBatch):
            assert egress == "batch"
            answers += decisions_of_batch(m)
        elif isinstance(m, Decision):
            assert egress == "per_instrument"
            answers.append(m)
    assert sorted((d.instrument, d.seq) for d in answers) == sorted(sent)  # each once
    assert all(d.status == 0 and d.ts_send_ns == 1_700_000_000_000_000_000 + d.seq and d.ts_recv_ns > 0
               for d in answers)
    final = [m for m in msgs if isinstance(m, Status)][-1]
    assert final.final and final.pending == 0 and final.engine == "null"
    assert (final.received, final.decided, final.rejected) == (402, 400, 2)
    assert final.received == final.decided + final.shed + final.conflated + final.rejected
    assert final.rejected_by_reason[1] == 1 and final.rejected_by_reason[8] == 1  # DECODE_ERROR, BAD_FRAMING


def test_replay_pacer_choice_and_collectors_are_used_and_reported(tmp_path):
    env = dict(os.environ, HFT_INFER_RUNTIME_DIR=str(tmp_path))
    r = cli("replay", "synthetic", "--events", "3000", "--rate", "5000", "--null-service", "--pacer", "sleep",
            "--null-egress", "per_instrument", "--collectors", "2", "--set", "service.name=hr", "--quiet",
            "--run-dir", str(tmp_path / "run"), "--json", str(tmp_path / "out.json"), env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    out = json.loads((tmp_path / "out.json").read_text())
    h = out["harness"]
    assert (h["pacer"], h["pacer_choice"], h["collectors"]) == ("sleep", "sleep", 2)
    assert out["accounting"]["lost"] == 0 and out["accounting"]["decided"] == 3000
    assert out["answer_frames"]["decision"] == 3000 and out["duplicates"] == 0  # Status counted once
    assert "pacer sleep" in r.stdout and "(--pacer sleep)" in r.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["harness"] == h and summary["warmup_events"] == 0
    assert (tmp_path / "run" / "collector0.log").is_file() and (tmp_path / "run" / "collector1.log").is_file()


LOBSTER = ROOT / "tests" / "fixtures" / "lobster"


def test_lost_events_exit_1_with_the_reason(tmp_path):
    """Instrument 9999 is outside the service's universe: it never subscribes to its topic,
    so those events are sent and never received."""
    env = dict(os.environ, HFT_INFER_RUNTIME_DIR=str(tmp_path))
    r = cli("replay", str(next(LOBSTER.glob("AAPL*message*"))), str(next(LOBSTER.glob("MSFT*message*"))),
            "--instrument-ids", "3,9999", "--rate", "5000", "--null-service", "--set", "service.name=hl",
            "--quiet", "--run-dir", str(tmp_path / "run"), env=env)
    assert r.returncode == 1, r.stderr + r.stdout
    assert "replay: exit 1:" in r.stderr and "events lost" in r.stderr and "Traceback" not in r.stderr


def test_replay_quiet_still_counts_skipped_lobster_lines(tmp_path):
    for f in LOBSTER.glob("AAPL*"):
        (tmp_path / f.name).write_text(f.read_text())
    msg = next(tmp_path.glob("AAPL*message*"))
    lines = msg.read_text().splitlines()
    lines[2] = "not,a,lobster,line"
    msg.write_text("\n".join(lines) + "\n")
    env = dict(os.environ, HFT_INFER_RUNTIME_DIR=str(tmp_path))
    r = cli("replay", str(msg), "--rate", "5000", "--null-service", "--set", "service.name=hq", "--quiet",
            "--run-dir", str(tmp_path / "run"), env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "1 malformed lines skipped" in r.stderr
    assert "skipped " + str(msg) not in r.stderr  # the list itself is what --quiet leaves out


def test_bench_with_floor_reports_the_floor_beside_the_service(tmp_path):
    from service_harness import TEST_MODEL

    env = dict(os.environ, HFT_INFER_RUNTIME_DIR=str(tmp_path))
    r = cli("bench", "--with-floor", "--rate", "2000", "--duration", "1", "--warmup", "0.2", "--quiet",
            "--set", "service.name=hf", *sum((["--set", o] for o in TEST_MODEL), []),
            "--run-dir", str(tmp_path / "run"), "--json", str(tmp_path / "out.json"), env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    out = json.loads((tmp_path / "out.json").read_text())
    floor = out["floor"]
    assert floor["service"] == "null" and out["service"] == "child" and out["engine"] == "eager"
    assert out["precision"] == "fp32" and floor["precision"] is None  # the null service reports none
    assert "engine=eager (fp32), model=" in r.stdout
    assert "READY engine=eager precision=fp32 (" in (tmp_path / "run" / "service.log").read_text()  # serve's line
    assert floor["accounting"]["lost"] == 0 and floor["accounting"]["decided"] == 2400
    assert floor["tick_to_decision"]["count"] == 2000 and floor["harness"] == out["harness"]
    assert out["vs_floor"]["p99_us"] == out["tick_to_decision"]["p99_us"] / floor["tick_to_decision"]["p99_us"]
    assert set(out["stages"]) >= {"wire", "step", "service"}
    assert "floor: the null service under the same load" in r.stdout and "service / floor" in r.stdout
    assert json.loads((tmp_path / "run" / "floor" / "summary.json").read_text())["service"] == "null"



def test_bench_says_why_events_were_shed(tmp_path):
    """A stateful model (conflation off) with a 1 µs deadline: every event is past it when read and
    shed LATE at ingest, unapplied; bench's JSON (`by_reason`, from the final Status) and its
    printed line say so, and the reasons add up to the accounting's shed."""
    from service_harness import TEST_MODEL

    env = dict(os.environ, HFT_INFER_RUNTIME_DIR=str(tmp_path))
    r = cli("bench", "--rate", "2000", "--duration", "0.5", "--warmup", "0.1", "--quiet", "--set", "service.name=hr",
            *sum((["--set", o] for o in TEST_MODEL), []), "--set", 'scheduler.conflate="off"',
            "--set", "scheduler.max_age_us=1", "--set", "metrics.stats_interval_ms=100", "--run-dir",
            str(tmp_path / "run"), "--json", str(tmp_path / "out.json"), env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    out = json.loads((tmp_path / "out.json").read_text())
    acc = out["accounting"]
    assert acc["lost"] == 0 and acc["shed"] == acc["sent"] == 1200 and acc["decided"] == 0
    assert out["by_reason"] == {"LATE": 1200}
    assert "shed and rejected by reason (the service): LATE 1,200 (shed)" in r.stdout
    # the run's timeline (snapshots.jsonl): ~0.6 s of feed in 100 ms snapshots, ending in the final one
    from service_harness import read_timeline

    timeline = read_timeline(tmp_path / "run" / "snapshots.jsonl")
    assert len(timeline) >= 4
    assert timeline[-1]["counters"]["shed"] == 1200 and timeline[-1]["by_reason"] == {"LATE": 1200}
    assert timeline[0]["interval_ms"] <= 150 and "admit_margin_us" in timeline[-1]["gauges"]


def _status(pending: int) -> list[bytes]:
    return [SERVICE_TOPIC, encode(Status(0, 10, 10 - pending, 0, 0, 0, pending, 0, 0, [0] * 12))]


def _replies_within(child, seconds: float) -> list[str]:
    """Every reply `child` sends within `seconds` (the collector's stdout, read without blocking)."""
    import select
    import time

    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if select.select([child], [], [], left)[0]:
            child.read_available()
    return list(child.lines)


def test_the_collector_waits_for_a_settled_status_when_asked_and_not_otherwise(tmp_path):
    """`quiet Q T settled` (replay against a service it did not start): a service whose step outlasts
    Q holds events without sending a frame; only a Status after the command with pending = 0 ends
    the wait. A plain `quiet` ends after Q whatever the Status said. The stand-in service is a PUB
    socket in the test; the collector is the real process the harness starts."""
    import time

    from hft_infer.replay.child import Child, wait_replies

    ctx = zmq.Context()
    endpoint = f"ipc://{tmp_path}/d.sock"
    pub = ctx.socket(zmq.PUB)
    pub.bind(endpoint)
    col = Child("collector", "hft_infer.replay.collector_proc",
                ["--endpoint", endpoint, "--out", str(tmp_path / "c.npz")], tmp_path / "collector.log")
    try:
        deadline = time.monotonic() + 30
        while "ready" not in _replies_within(col, 0.05):  # a Status until the subscription has arrived
            assert time.monotonic() < deadline, "the collector never became ready"
            pub.send_multipart(_status(3))
        col.lines.clear()
        col.send("quiet", 0.2, 10, "settled")
        # three quiet periods: the newest Status came before the command (and said 3 pending)
        assert _replies_within(col, 0.6) == []
        pub.send_multipart(_status(1))  # after the command, but still pending
        assert _replies_within(col, 0.6) == []
        pub.send_multipart(_status(0))
        t0 = time.monotonic()
        assert wait_replies({col: "quiet"}, 5.0)[col] == "quiet"
        assert time.monotonic() - t0 >= 0.15  # and quiet for Q after that Status
        pub.send_multipart(_status(2))
        col.send("quiet", 0.2, 10)  # plain: pending is not looked at
        assert wait_replies({col: "quiet"}, 5.0)[col] == "quiet"
    finally:
        col.proc.kill()
        col.proc.wait()
        pub.close(0)
        ctx.term()


def test_a_pacer_short_of_subscriptions_says_how_many_came_when_the_driver_gives_up(tmp_path):
    """The driver waits for `subscribed` (every topic the service subscribes to); when that times
    out, the error quotes the pacer's log, which counts what did arrive: 2 of 5 here, the one SUB
    subscribing to two topics (a service that subscribed to only part of its universe, or none)."""
    from hft_infer.replay.child import Child, ChildError, wait_replies
    from hft_infer.replay.pacer import save_feed

    events = generate(10, SyntheticConfig(instruments=2, seed=1))
    feed = tmp_path / "feed.npz"
    save_feed(str(feed), encode_feed(events), np.arange(10, dtype=np.int64) * 1000)
    endpoint = f"ipc://{tmp_path}/md.sock"
    pacer = Child("pacer", "hft_infer.replay.pacer_proc",
                  ["--feed", str(feed), "--endpoint", endpoint, "--out", str(tmp_path / "p.npz"), "--topics", "5"],
                  tmp_path / "pacer.log")
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        assert wait_replies({pacer: "bound"}, 30.0)
        sub.connect(endpoint)
        for topic in (topic_for(0), topic_for(1)):
            sub.setsockopt(zmq.SUBSCRIBE, topic)
        with pytest.raises(ChildError) as err:
            wait_replies({pacer: "subscribed"}, 3.0)
        msg = str(err.value)
        assert "sent no 'subscribed' reply within 3 s" in msg and str(tmp_path / "pacer.log") in msg
        assert "pacer: 2 of 5 subscriptions so far" in msg, msg
    finally:
        pacer.close()
        sub.close(0)
        ctx.term()
