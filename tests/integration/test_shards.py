"""bench --shards: N real `serve --shard I/N` (or null service) processes behind one feed, every
event accounted for in exactly one shard (real processes and sockets; nothing spins: event polling,
the pacer sleeps and the collectors block on the 2-core dev machine)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import numpy as np
import pytest
from service_harness import read_timeline

from hft_infer.accounting import SHED_REASON_NAMES
from hft_infer.replay.synthetic import SyntheticConfig, generate

EVENT_POLL = ["--set", 'ingest.poll_mode="event"']


def bench(*args, tmp_path, timeout=300):
    out = tmp_path / "out.json"
    r = subprocess.run([sys.executable, "-m", "hft_infer", "bench", *args, *EVENT_POLL, "--quiet",
                        "--run-dir", str(tmp_path / "run"), "--json", str(out)],
                       capture_output=True, text=True, timeout=timeout)
    return r, (json.loads(out.read_text()) if out.exists() else None)


def expected_per_shard(n_events: int, n_inst: int, rate: float, shards: int, shard_of: np.ndarray) -> list[int]:
    """Events of each shard in bench's feed (seed 1; ids are 0..n-1): shard_of[instrument]."""
    ev = generate(n_events, SyntheticConfig(instruments=n_inst, seed=1, rate_hz=rate))
    return [int(np.count_nonzero(shard_of[ev["instrument"]] == k)) for k in range(shards)]


def check_split(out: dict, shards: int, n_events: int, n_inst: int, rate: float,
                shard_of: np.ndarray | None = None) -> None:
    """shard_of: each instrument's shard (default: position % shards)."""
    shard_of = np.arange(n_inst) % shards if shard_of is None else shard_of
    per = out["per_shard"]
    assert [p["shard"] for p in per] == [f"{k}/{shards}" for k in range(shards)]
    assert [p["accounting"]["sent"] for p in per] == expected_per_shard(n_events, n_inst, rate, shards, shard_of)
    for p in per:
        acc = p["accounting"]
        # every event of the shard ends in one outcome, in this shard; no answer from another shard
        assert acc["lost"] == 0 and p["unmatched_decisions"] == 0 and p["duplicates"] == 0, p
        assert acc["decided"] + acc["shed"] + acc["conflated"] + acc["rejected"] == acc["sent"] == acc["received"]
        assert p["service_exit_code"] == 0
        # the shard's own count of why (its final Status) adds up to what the collector saw
        assert sum(n for name, n in p["by_reason"].items() if name in SHED_REASON_NAMES) == acc["shed"], p["by_reason"]
        assert sum(n for name, n in p["by_reason"].items() if name not in SHED_REASON_NAMES) == acc["rejected"]
        s = p["shed_by_instrument"]  # which of the shard's instruments shed, as many as it shed
        assert s["shed"] == acc["shed"] and s["instruments"] == p["instruments"], s
        assert sum(t["shed"] for t in s["top"]) <= s["shed"] and (s["instruments_shed"] > 0) == (acc["shed"] > 0)
    agg = out["aggregate"]["accounting"]
    assert agg["sent"] == n_events and agg["lost"] == 0 and agg["unowned"] == 0
    for k in ("decided", "shed", "conflated", "rejected"):
        assert agg[k] == sum(p["accounting"][k] for p in per)
    for name, n in out["aggregate"]["by_reason"].items():
        assert n == sum(p["by_reason"].get(name, 0) for p in per)
    assert out["aggregate"]["tick_to_decision"]["count"] == sum(p["tick_to_decision"]["count"] for p in per)
    # each shard's busiest instrument, from the feed bench generated (seed 1)
    inst = generate(n_events, SyntheticConfig(instruments=n_inst, seed=1, rate_hz=rate))["instrument"]
    for k, p in enumerate(per):
        ids, counts = np.unique(inst[shard_of[inst] == k], return_counts=True)
        b = p["busiest_instrument"]
        assert b["events"] == counts.max() and b["id"] in ids[counts == counts.max()]
    assert out["aggregate"]["busiest_instrument"]["events"] == max(p["busiest_instrument"]["events"] for p in per)
    s = out["aggregate"]["shed_by_instrument"]
    assert s["shed"] == agg["shed"] and s["instruments_shed"] == sum(p["shed_by_instrument"]["instruments_shed"]
                                                                    for p in per)


def test_two_served_shards_with_the_floor_account_for_every_event_in_exactly_one(tmp_path):
    rate, dur, warm, n_inst = 1500, 1.0, 0.5, 6
    r, out = bench("--shards", "2", "--with-floor", "--rate", str(rate), "--duration", str(dur), "--warmup",
                   str(warm), "--instruments", str(n_inst), "--set", "metrics.stats_interval_ms=200", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    n = int(rate * warm) + int(rate * dur)
    check_split(out, 2, n, n_inst, rate)
    check_split(out["floor"], 2, n, n_inst, rate)
    assert out["service"] == "child" and out["floor"]["service"] == "null"
    for p in out["per_shard"]:
        assert p["engine"] == "eager" and p["stages"]["service"]["count"] > 0  # its own control endpoint
        assert p["steps_per_s"] > 0  # from its snapshots inside the measured second
        assert isinstance(p["beyond_step_rate"], int) and 0 <= p["beyond_step_rate"] <= p["accounting"]["sent"]
        assert (tmp_path / "run" / f"shard{p['shard'][0]}" / "service.log").exists()
    assert out["aggregate"]["stages"]["service"]["count"] == sum(p["stages"]["service"]["count"]
                                                                 for p in out["per_shard"])
    assert set(out["vs_floor"]) == {"p50_us", "p99_us", "p999_us"}
    text = r.stdout
    assert "hft-infer bench --shards 2" in text and "floor: the null service in 2 shard(s)" in text
    assert out["aggregate"]["beyond_step_rate"] == sum(p["beyond_step_rate"] for p in out["per_shard"])
    assert out["floor"]["aggregate"]["beyond_step_rate"] is None  # the null service steps nothing
    assert "\nall " in text and "service / floor" in text and "busiest/s" in text and "beyond steps" in text


def test_balanced_shards_split_the_feed_by_its_counts_and_account_for_every_event(tmp_path):
    """--balance-shards: each shard serves the instruments that universe.shard_weights (the feed's own
    counts) give it, in the service and its floor alike; the busiest shard is nearer the mean than by
    position, and the report says how even the split was."""
    rate, dur, n_inst = 2000, 1.0, 9
    r, out = bench("--shards", "3", "--balance-shards", "--with-floor", "--rate", str(rate), "--duration",
                   str(dur), "--warmup", "0", "--instruments", str(n_inst), "--set", "universe.instruments=9",
                   tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    n = int(rate * dur)
    counts = np.bincount(generate(n, SyntheticConfig(instruments=n_inst, seed=1, rate_hz=rate))["instrument"],
                         minlength=n_inst)
    # the same plan from the same counts, independently: heaviest first onto the lightest shard
    loads, sizes, shard_of = [0, 0, 0], [0, 0, 0], np.zeros(n_inst, dtype=np.int64)
    for i in sorted(range(n_inst), key=lambda i: (-counts[i], i)):
        k = min(range(3), key=lambda k: (loads[k], sizes[k], k))
        shard_of[i], loads[k], sizes[k] = k, loads[k] + counts[i], sizes[k] + 1
    check_split(out, 3, n, n_inst, rate, shard_of)
    check_split(out["floor"], 3, n, n_inst, rate, shard_of)
    by_position = [counts[k::3].sum() for k in range(3)]
    assert out["split"]["by"] == "universe.shard_weights"
    assert out["split"]["busiest_over_mean"] == pytest.approx(max(loads) / (n / 3))
    assert max(loads) < max(by_position), (loads, by_position)  # this feed is skewed enough to show it
    assert "feed split (by universe.shard_weights): busiest shard" in r.stdout


def test_three_null_shards_with_a_collector_each(tmp_path):
    rate, dur, n_inst = 2000, 1.0, 7
    r, out = bench("--shards", "3", "--null-service", "--shard-collectors", "3", "--rate", str(rate),
                   "--duration", str(dur), "--warmup", "0", "--instruments", str(n_inst), tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    check_split(out, 3, int(rate * dur), n_inst, rate)
    assert out["harness"]["collectors"] == 3 and out["harness"]["shards_per_collector"] == [1, 1, 1]
    assert [p["instruments"] for p in out["per_shard"]] == [3, 2, 2]


def test_two_shards_fed_event_batches_each_get_their_own_and_account_for_every_event(tmp_path):
    """--feed-batch with --shards: the events due together go as one EventBatch per shard, under
    that shard's batch topic (codec.shard_batch_topic); each shard reads only its own instruments'
    batches, so nothing is rejected as another shard's, and every event ends in exactly one shard
    (the served shards and the null-service floor alike)."""
    rate, dur, warm, n_inst = 20000, 1.0, 0.3, 6
    r, out = bench("--shards", "2", "--with-floor", "--feed-batch", "32", "--rate", str(rate), "--duration",
                   str(dur), "--warmup", str(warm), "--instruments", str(n_inst), tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    n = int(rate * warm) + int(rate * dur)
    for res in (out, out["floor"]):
        check_split(res, 2, n, n_inst, rate)
        assert res["harness"]["feed_batch"] == 32
        assert all(p["accounting"]["rejected"] == 0 for p in res["per_shard"])  # no other shard's events
    assert "EventBatch frame, one frame per shard" in r.stdout
    # the pacer did batch: at 20k events/s, 100 µs apart at most, most frames held several events
    pacer_log = (tmp_path / "run" / "pacer.log").read_text()
    assert "feed batch 32" in pacer_log


def test_two_shards_over_iceoryx2_each_get_their_own_services_and_account_for_every_event(tmp_path):
    """--shards over iceoryx2 (no topics): each shard's feed and decisions are services of its own,
    named from its service.name (<name>-s<I>); the pacer publishes each shard's EventBatch frames --
    and an event due alone -- on its shard's service only, so nothing is rejected as another
    shard's, and every event ends in exactly one shard (served and null-service floor alike)."""
    pytest.importorskip("iceoryx2")
    rate, dur, warm, n_inst = 5000, 1.0, 0.2, 8
    name = f"shards{uuid.uuid4().hex[:10]}"  # iceoryx2 services are host-wide: a fresh name per run
    r, out = bench("--shards", "2", "--with-floor", "--transport", "iceoryx2", "--feed-batch", "16", "--rate",
                   str(rate), "--duration", str(dur), "--warmup", str(warm), "--instruments", str(n_inst),
                   "--set", f"service.name={name}", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    n = int(rate * warm) + int(rate * dur)
    for res in (out, out["floor"]):
        check_split(res, 2, n, n_inst, rate)
        assert all(p["accounting"]["rejected"] == 0 for p in res["per_shard"])  # no other shard's events
    assert [p["name"] for p in out["per_shard"]] == [f"{name}-s0", f"{name}-s1"]
    pacer_log = (tmp_path / "run" / "pacer.log").read_text()
    assert "2 subscriptions" in pacer_log  # one subscriber on each shard's feed service
    for k, p in enumerate(out["per_shard"]):  # each shard's timeline ends in its final counts
        last = read_timeline(tmp_path / "run" / f"shard{k}" / "snapshots.jsonl")[-1]
        assert last["counters"]["received"] == p["accounting"]["received"]
        assert last["counters"]["decided"] == p["accounting"]["decided"]


def test_shards_over_iceoryx2_need_batched_frames_and_per_shard_service_names(tmp_path):
    pytest.importorskip("iceoryx2")
    r, _ = bench("--shards", "2", "--transport", "iceoryx2", "--feed-batch", "1", "--rate", "1000", "--duration",
                 "0.2", "--instruments", "4", "--null-service", "--set", f"service.name=s{uuid.uuid4().hex[:8]}",
                 tmp_path=tmp_path)
    assert r.returncode != 0 and "needs --feed-batch > 1" in r.stderr, r.stderr[-2000:]
    r, _ = bench("--shards", "2", "--transport", "iceoryx2", "--feed-batch", "16", "--rate", "1000", "--duration",
                 "0.2", "--instruments", "4", "--null-service", "--set", 'ingest.shm_service="one/feed"',
                 tmp_path=tmp_path)
    assert r.returncode != 0 and "ingest.shm_service = 'one/feed' would be the same service" in r.stderr, \
        r.stderr[-2000:]
