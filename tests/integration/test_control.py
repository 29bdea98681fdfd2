"""The control process as a real subprocess, fed real Snapshots over a real ipc PUSH.

The sender uses the hot loop's socket options (ZMQ_IMMEDIATE, small HWM,
NOBLOCK sends; `feeder.open_push`). Checked: /metrics (parsed with
prometheus_client's parser) agrees with what was sent; SIGTERM leaves .hgrm
files and an .hlog that hdrh reads back; the sender never blocks while the
control process is dead, and a restarted control process picks the stream
and the run up again; garbage on the socket is counted, not fatal; the HTTP
side is read-only and local.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgspec
import numpy as np
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families
from snapshot_feeder import SyntheticService, open_push

from hft_infer.control.process import start_control_process, stop_control_process, wait_for_url
from hft_infer.metrics import SERVICE_STAGES, add_sparse, from_wire, new_histogram
from hft_infer.metrics.hlog import merge_by_tag, read_hgrm, read_hlog
from hft_infer.transport.stats import encode_snapshot

DEADLINE_S = 30.0  # waiting for a subprocess on a shared 2-core box; not a measurement
INTERVAL_NS = 1_000_000_000


class Control:
    """One control process on a private ipc endpoint and run dir."""

    def __init__(self, sock_dir: str, run_dir: Path, *extra: str) -> None:
        self.endpoint = f"ipc://{sock_dir}/control.sock"
        self.run_dir = run_dir
        self.extra = extra
        self.proc = None
        self.url = ""

    def start(self) -> "Control":
        self.proc = start_control_process(None, [], str(self.run_dir), endpoint=self.endpoint, port=0,
                                          extra=self.extra)
        self.url = wait_for_url(str(self.run_dir), self.proc, DEADLINE_S)
        return self

    def get(self, path: str, **headers) -> tuple[int, dict, bytes]:
        req = urllib.request.Request(self.url.rstrip("/") + path, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=DEADLINE_S) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def frame(self) -> dict:
        return json.loads(self.get("/api/frame")[2])

    def wait_snapshots(self, ok: int, bad: int = 0) -> dict:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            st = self.frame()["status"]["control"]
            if st["snapshots_ok"] >= ok and st["snapshots_bad"] >= bad:
                return self.frame()
            time.sleep(0.05)
        raise AssertionError(f"control process saw {st}, waiting for ok={ok} bad={bad}")

    def stop(self) -> int:
        return stop_control_process(self.proc, DEADLINE_S)

    def log(self) -> str:
        return (self.run_dir / "control.log").read_text()


@pytest.fixture
def control(sock_dir, tmp_path):
    c = Control(sock_dir, tmp_path / "run").start()
    yield c
    if c.proc.poll() is None:
        c.proc.kill()
        c.proc.wait()


def _send(sock, payload: bytes) -> None:
    """Deliver one message: with IMMEDIATE a NOBLOCK send fails until the pipe is up."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            sock.send(payload, zmq.NOBLOCK)
            return
        except zmq.Again:
            if time.monotonic() > deadline:
                raise AssertionError("the control process never accepted the connection") from None
            time.sleep(0.01)


class Sent:
    """What the test sent, folded the way the control process should fold it."""

    def __init__(self) -> None:
        self.hists = {s: new_histogram() for s in SERVICE_STAGES}
        self.per_stage_intervals = {s: 0 for s in SERVICE_STAGES}
        self.last = None

    def add(self, snap) -> None:
        for stage, wire in snap.stages.items():
            add_sparse(self.hists[stage], from_wire(wire))
            self.per_stage_intervals[stage] += 1
        self.last = snap


def _stream(sock, svc: SyntheticService, n: int, sent: Sent, t0_ns: int) -> None:
    for k in range(n):
        snap = svc.step(t0_ns + (k + 1) * INTERVAL_NS, INTERVAL_NS)
        sent.add(snap)
        _send(sock, encode_snapshot(snap))


def _metrics(control: Control) -> dict:
    status, headers, body = control.get("/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def test_metrics_agree_with_the_snapshots(control, zctx):
    push = open_push(zctx, control.endpoint)
    svc, sent = SyntheticService(rate=5000, seed=3), Sent()
    _stream(push, svc, 6, sent, time.time_ns())
    control.wait_snapshots(6)
    fams = _metrics(control)

    assert all(name.startswith(("hft_infer_", "hft_infer_control_")) for name in fams), sorted(fams)
    last = sent.last
    for name, value in last.counters.items():
        if name.endswith("_us"):  # a time: exposed in seconds (hot_runqueue_wait_us)
            name, value = f"{name[:-3]}_seconds", pytest.approx(value * 1e-6)
        fam = fams[f"hft_infer_{name}"]
        assert fam.type == "counter"
        assert fam.samples[0].name == f"hft_infer_{name}_total" and fam.samples[0].value == value
    by_reason = {s.labels["reason"]: (s.labels["outcome"], s.value)
                 for s in fams["hft_infer_shed_or_rejected"].samples}
    shed = {"STALE", "QUEUE_FULL", "ENGINE_FAILURE", "LATE"}  # schema.Reason: answered as shed, not rejected
    assert by_reason == {k: ("shed" if k in shed else "rejected", float(v))
                         for k, v in last.rejected_by_reason.items()}
    assert fams["hft_infer_queue_depth"].samples[0].value == last.gauges["queue_depth"]
    assert fams["hft_infer_admit_depth"].samples[0].value == last.gauges["admit_depth"] > 0
    assert fams["hft_infer_batch_wait_seconds"].type == "gauge"  # µs on the wire, seconds here
    info = fams["hft_infer_service_info"].samples[0].labels  # exposed as a gauge of 1
    assert info["engine"] == "eager" and info["pid"] == str(os.getpid())
    assert info["precision"] == last.precision == "fp32"  # the feeder's, passed through
    ok = {s.labels["result"]: s.value for s in fams["hft_infer_control_snapshots"].samples}
    assert ok == {"ok": 6.0, "bad": 0.0}
    assert fams["hft_infer_control_process_resident_memory_bytes"].samples[0].value > 0

    # Latency: one histogram family, no summary (quantiles of a summary cannot be aggregated).
    hist = fams["hft_infer_stage_latency_seconds"]
    assert hist.type == "histogram"
    assert not any(f.type == "summary" for f in fams.values())
    for stage in SERVICE_STAGES:
        want = sent.hists[stage]
        samples = {(s.name, s.labels.get("le")): s.value for s in hist.samples if s.labels["stage"] == stage}
        n = want.get_total_count()
        assert samples[("hft_infer_stage_latency_seconds_count", None)] == n
        buckets = sorted((float(le), v) for (name, le), v in samples.items() if name.endswith("_bucket"))
        assert buckets[-1] == (float("inf"), n) and len(buckets) == 44  # 1 µs .. 10 s and +Inf
        assert buckets[0][0] == 1e-6 and buckets[-2][0] == 10.0
        # Each `le` count against hdrh's own iteration of what was sent: a sample counts when its
        # HDR bucket lies at or below the bound (the feeder's values have at most 3 digits of sense).
        recorded = [(it.value_iterated_to, it.count_at_value_iterated_to) for it in want.get_recorded_iterator()]
        for le, count in buckets[:-1]:
            assert count == sum(c for v, c in recorded if v <= round(le * 1e9)), (stage, le)
        mean = samples[("hft_infer_stage_latency_seconds_sum", None)] / n
        assert mean == pytest.approx(want.get_mean_value() / 1e9, rel=1e-6)


def test_sigterm_leaves_hgrm_and_an_hlog_hdrh_reads(control, zctx):
    push = open_push(zctx, control.endpoint)
    svc, sent = SyntheticService(rate=3000, seed=4), Sent()
    _stream(push, svc, 5, sent, 1_700_000_000 * 10**9)
    control.wait_snapshots(5)
    assert (control.run_dir / "dashboard.url").read_text().strip() == control.url
    assert control.stop() == 0, control.log()
    assert not (control.run_dir / "dashboard.url").exists()

    intervals = read_hlog(str(control.run_dir / "service.hlog"))
    merged = merge_by_tag(intervals)
    assert sorted(merged) == sorted(SERVICE_STAGES)
    for stage in SERVICE_STAGES:
        want = sent.hists[stage]
        assert sum(1 for iv in intervals if iv.tag == stage) == sent.per_stage_intervals[stage] == 5
        assert merged[stage].get_total_count() == want.get_total_count()
        for p in (50.0, 99.0, 99.9):
            assert merged[stage].get_value_at_percentile(p) == want.get_value_at_percentile(p)
        hgrm = read_hgrm(str(control.run_dir / f"{stage}.hgrm"))
        assert hgrm.total == want.get_total_count()
        assert hgrm.max_value == pytest.approx(want.get_max_value() / 1e3, abs=1e-3)
    # the interval start times are the snapshots' own (end - length), relative to the log's base
    first = min(iv.start_s for iv in intervals)
    assert first == pytest.approx(1_700_000_000.0, abs=1e-3)


def test_sender_never_waits_and_a_restarted_control_process_continues(sock_dir, tmp_path, zctx):
    ctl = Control(sock_dir, tmp_path / "run").start()
    push = open_push(zctx, ctl.endpoint)
    svc, sent = SyntheticService(rate=2000, seed=5), Sent()
    t0 = time.time_ns()
    _stream(push, svc, 3, sent, t0)
    ctl.wait_snapshots(3)

    ctl.proc.send_signal(signal.SIGKILL)  # no clean-up at all: stale ipc file, no .hgrm
    ctl.proc.wait()
    # The hot loop's side while nobody listens: every send returns at once, sent or refused.
    dropped = 0
    for k in range(200):
        snap = svc.step(t0 + (10 + k) * INTERVAL_NS, INTERVAL_NS)
        try:
            push.send(encode_snapshot(snap), zmq.NOBLOCK)
        except zmq.Again:
            dropped += 1
    assert dropped >= 190  # IMMEDIATE: no pipe, no queue (a few may leave before the peer is seen gone)

    ctl2 = Control(sock_dir, tmp_path / "run").start()  # same endpoint, same run dir
    try:
        svc2, sent2 = SyntheticService(rate=2000, seed=6), Sent()
        _stream(push, svc2, 3, sent2, t0 + 1000 * INTERVAL_NS)  # the same PUSH reconnects by itself
        frame = ctl2.wait_snapshots(3)["frame"]
        # counters come from the sender; the cumulative histograms carry on from the log
        assert frame["counters"]["received"] == sent2.last.counters["received"]
        for stage in SERVICE_STAGES:
            before = sent.hists[stage].get_total_count()
            after = sent2.hists[stage].get_total_count()
            assert frame["stages"][stage]["cumulative"]["count"] >= before + after
        assert ctl2.stop() == 0, ctl2.log()
    finally:
        if ctl2.proc.poll() is None:
            ctl2.proc.kill()
    text = (tmp_path / "run" / "service.hlog").read_text()
    assert text.count("#[BaseTime") == 1  # one log for the run
    merged = merge_by_tag(read_hlog(str(tmp_path / "run" / "service.hlog")))
    for stage in SERVICE_STAGES:
        logged = merged[stage].get_total_count()
        assert logged >= sent.hists[stage].get_total_count() + sent2.hists[stage].get_total_count()


def test_garbage_is_counted_and_the_process_carries_on(control, zctx):
    push = open_push(zctx, control.endpoint)
    svc, sent = SyntheticService(rate=1000, seed=7), Sent()
    good = svc.step(time.time_ns(), INTERVAL_NS)
    wire = good.stages["step"]
    bad_index = msgspec.structs.replace(good, stages={"step": type(wire)(
        np.array([10**7], "<i4").tobytes(), np.array([1], "<i8").tobytes(), 5, 5, 1)})
    bad_total = msgspec.structs.replace(good, stages={"step": type(wire)(wire.index, wire.count, wire.min_ns,
                                                                          wire.max_ns, wire.total + 1)})
    bad_stage = msgspec.structs.replace(good, stages={"a,b": wire})
    for payload in (b"\x00garbage", encode_snapshot(bad_index), encode_snapshot(bad_total),
                    encode_snapshot(bad_stage)):
        _send(push, payload)
    _send(push, encode_snapshot(good))
    sent.add(good)
    frame = control.wait_snapshots(1, bad=4)
    assert frame["status"]["control"]["snapshots_bad"] == 4
    # nothing of the bad ones leaked into the histograms
    assert frame["frame"]["stages"]["step"]["cumulative"]["count"] == sent.hists["step"].get_total_count()
    push2 = zctx.socket(zmq.PUSH)
    push2.connect(control.endpoint)
    push2.send_multipart([b"two", b"frames"])
    control.wait_snapshots(1, bad=5)
    assert control.proc.poll() is None
    assert "bad snapshot #1 dropped" in control.log()
    push2.close(0)


def test_http_side_is_local_and_read_only(control):
    assert control.url.startswith("http://127.0.0.1:")
    status, headers, body = control.get("/")
    assert status == 200 and b"/static/dashboard.js" in body
    csp = headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "script-src 'self'" in csp
    assert control.get("/static/dashboard.js")[0] == 200
    for path in ("/static/../process.py", "/static/%2e%2e%2fprocess.py", "/static/nope.js", "/admin"):
        assert control.get(path)[0] == 404, path
    # DNS rebinding: a page of evil.example resolved to 127.0.0.1 is refused
    assert control.get("/metrics", Host="evil.example:80")[0] == 421
    assert control.get("/metrics", Host="localhost")[0] == 200
    req = urllib.request.Request(control.url, data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=DEADLINE_S)
    assert e.value.code == 405


async def test_websocket_refuses_other_origins_and_greets_its_own(control):
    import aiohttp

    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as e:
            await http.ws_connect(control.url + "ws", headers={"Origin": "http://evil.example"})
        assert e.value.status == 403
        origin = control.url.rstrip("/")
        async with http.ws_connect(control.url + "ws", headers={"Origin": origin}) as ws:
            hello = await ws.receive_json(timeout=DEADLINE_S)
            status = await ws.receive_json(timeout=DEADLINE_S)
    assert hello["type"] == "hello" and hello["history"] == [] and hello["frame"] is None
    assert hello["nines_ticks"][3] == [2.0, "99%"]
    assert status["type"] == "status" and status["live"] is False and status["age_s"] is None


def _dashboard_cli(*args: str, env_dir: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HFT_INFER_RUNTIME_DIR=env_dir)
    return subprocess.run([sys.executable, "-m", "hft_infer", "dashboard", *args], capture_output=True,
                          text=True, timeout=DEADLINE_S, env=env)


def test_user_errors_are_one_line(control, sock_dir, tmp_path):
    r = _dashboard_cli("--host", "0.0.0.0", "--port", "0", "--run-dir", str(tmp_path / "x"), env_dir=sock_dir)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "not loopback" in r.stderr and "security.allow_remote" in r.stderr
    # a second control process on a served endpoint
    r = _dashboard_cli("--connect", control.endpoint, "--port", "0", "--run-dir", str(tmp_path / "y"),
                       env_dir=sock_dir)
    assert r.returncode == 2 and "another process is serving this ipc path" in r.stderr, r.stderr
    assert r.stderr.startswith("hft-infer dashboard: error: ")
    # a busy port
    port = control.url.rsplit(":", 1)[1].strip("/")
    r = _dashboard_cli("--connect", f"ipc://{sock_dir}/other.sock", "--port", port,
                       "--run-dir", str(tmp_path / "z"), env_dir=sock_dir)
    assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr
