"""The control process's state, in process: bounded memory, restarts, liveness.

Fed the same encoded Snapshots the service sends; the process-level tests
(sockets, HTTP, files) are in test_control.py.
"""

from __future__ import annotations

import msgspec
import numpy as np
from snapshot_feeder import SyntheticService

from hft_infer.control.aggregator import MAX_STAGES, Aggregator
from hft_infer.control.dashboard import Broadcaster, _Mailbox
from hft_infer.metrics import SERVICE_STAGES, add_sparse, from_wire, new_histogram
from hft_infer.transport.stats import encode_snapshot

S = 1_000_000_000


def _stream(svc: SyntheticService, n: int, t0_ns: int = 1_700_000_000 * S, interval_ns: int = S):
    for k in range(n):
        yield svc.step(t0_ns + (k + 1) * interval_ns, interval_ns)


def test_history_and_stages_stay_bounded():
    agg = Aggregator(history_points=20)
    svc = SyntheticService(rate=200, seed=1)
    for k, snap in enumerate(_stream(svc, 100)):
        assert agg.ingest(encode_snapshot(snap), now_s=k) is not None
    assert len(agg.history) == 20 and len(agg.hello()["history"]) == 20
    assert agg.snapshots_ok == 100 and sorted(agg.stages) == sorted(SERVICE_STAGES)
    # 20 points, newest last, one per snapshot
    ts = [p["t"] for p in agg.history]
    assert ts == [1_700_000_081.0 + k for k in range(20)]

    too_many = msgspec.structs.replace(snap, stages={f"s{i}": snap.stages["step"] for i in range(MAX_STAGES + 1)})
    assert agg.ingest(encode_snapshot(too_many), now_s=0) is None
    assert agg.snapshots_bad == 1 and "more than" in agg.last_bad_reason
    assert len(agg.stages) == len(SERVICE_STAGES)


def test_frame_holds_this_interval_and_the_cumulative():
    agg = Aggregator()
    svc = SyntheticService(rate=3000, seed=2)
    cum = {s: new_histogram() for s in SERVICE_STAGES}
    prev = None
    for snap in _stream(svc, 4):
        prev_received = prev.counters["received"] if prev else 0
        prev = snap
        agg.ingest(encode_snapshot(snap), now_s=0)
        for s, w in snap.stages.items():
            add_sparse(cum[s], from_wire(w))
    frame = msgspec.json.decode(msgspec.json.encode(agg.last_frame))  # what the page gets
    for stage in SERVICE_STAGES:
        st = frame["stages"][stage]
        assert st["interval"]["count"] == snap.stages[stage].total
        assert st["cumulative"]["count"] == cum[stage].get_total_count()
        assert st["cumulative"]["p99"] == cum[stage].get_value_at_percentile(99.0) / 1e3
        assert len(st["curve_cumulative"]) == len(frame_x := agg.hello()["nines_x"]) and frame_x[0] == 0.0
        assert st["curve_interval"] == sorted(st["curve_interval"])
        assert frame["point"]["stages"][stage] == [st["interval"][k] for k in ("p50", "p99", "p99_9")]
    # 1 s intervals: the rate is the counter's step
    assert frame["rates"]["events_per_s"] == snap.counters["received"] - prev_received > 0


def test_service_restart_and_silence():
    agg = Aggregator()
    svc = SyntheticService(rate=1000, seed=3)
    snaps = list(_stream(svc, 3))
    for k, snap in enumerate(snaps):
        agg.ingest(encode_snapshot(snap), now_s=100.0 + k)
    assert agg.rates["events_per_s"] > 0 and agg.service_restarts == 0
    assert agg.status(now_s=102.5)["live"] is True
    # silence: three intervals (at least 3 s) without a snapshot
    st = agg.status(now_s=106.0)
    assert st["live"] is False and st["age_s"] == 4.0

    # a new service process: new pid, counters from zero; no negative rate
    fresh = SyntheticService(rate=1000, seed=4)
    snap = next(_stream(fresh, 1, t0_ns=1_700_000_100 * S))
    snap = msgspec.structs.replace(snap, pid=snap.pid + 1)
    agg.ingest(encode_snapshot(snap), now_s=107.0)
    assert agg.service_restarts == 1 and agg.rates["events_per_s"] is None
    assert agg.counters["received"] == snap.counters["received"]
    final = msgspec.structs.replace(snap, final=True, ts_ns=snap.ts_ns + S, pid=snap.pid)
    agg.ingest(encode_snapshot(final), now_s=108.0)
    st = agg.status(now_s=108.1)
    assert st["live"] is False and st["final"] is True


def test_new_histogram_shape_starts_over_and_preload_needs_the_same_shape():
    svc = SyntheticService(rate=500, seed=5)
    first = list(_stream(svc, 2))
    logged = {s: new_histogram() for s in SERVICE_STAGES}
    for snap in first:
        for s, w in snap.stages.items():
            add_sparse(logged[s], from_wire(w))

    agg = Aggregator()
    agg.preload(logged)  # an earlier control process's log of this run
    later = next(_stream(svc, 1, t0_ns=1_700_000_050 * S))
    agg.ingest(encode_snapshot(later), now_s=0)
    assert sorted(agg.preloaded) == sorted(SERVICE_STAGES)
    step = agg.stages["step"].cumulative
    assert step.get_total_count() == logged["step"].get_total_count() + later.stages["step"].total

    # the service restarts with 2-digit histograms: bucket indices change meaning
    small = SyntheticService(rate=500, seed=6, highest_ns=10_000_000_000, digits=2)
    snap = next(_stream(small, 1, t0_ns=1_700_000_060 * S))
    assert agg.ingest(encode_snapshot(snap), now_s=0) is not None
    assert agg.stages["step"].cumulative.get_total_count() == snap.stages["step"].total
    assert agg.stages["step"].cumulative.significant_figures == 2

    agg2 = Aggregator()
    agg2.preload(logged)  # 3-digit log, 2-digit service: not added
    agg2.ingest(encode_snapshot(snap), now_s=0)
    assert agg2.preloaded == []


def test_a_slow_page_gets_the_latest_frame_not_a_queue():
    b = Broadcaster()
    box = _Mailbox()
    b.boxes.add(box)
    for k in range(100):
        b.publish_frame({"type": "frame", "k": k})
        b.publish_status({"type": "status", "k": k})
    assert msgspec.json.decode(box.frame)["k"] == 99 and msgspec.json.decode(box.status)["k"] == 99
    assert b.frames_skipped == 99 and box.event.is_set()


def test_counts_survive_an_odd_snapshot():
    """Snapshots with a stage missing or empty: no division by zero, stage shows as idle."""
    agg = Aggregator()
    svc = SyntheticService(rate=100, seed=7)
    snap = next(_stream(svc, 1))
    idle = msgspec.structs.replace(snap, stages={k: v for k, v in snap.stages.items() if k != "queue"})
    agg.ingest(encode_snapshot(idle), now_s=0)
    f = agg.last_frame
    assert f["stages"]["queue"]["interval"] is None and f["stages"]["queue"]["cumulative"] is None
    assert "queue" not in f["point"]["stages"]
    assert np.isfinite(f["stages"]["step"]["interval"]["p99"])
