"""tools/shard_accounting.py: one row per shard of a bench run directory, in shard order, with the
service.json figures it names; a directory without service.json is an error."""

from __future__ import annotations

import json
from pathlib import Path

import shard_accounting


def write_service(path: Path, *, received: int, decided: int, late: int, coalesced: int) -> None:
    path.mkdir(parents=True)
    summary = {
        "accounting": {"received": received, "decided": decided, "shed": received - decided},
        "counters": {"batches": 7, "coalesced_reads": coalesced, "stalls": 3, "stall_ingest_us": 2500},
        "stages": {"ingest": {"p50_us": 5.5, "count": 4}, "step": {"p50_us": 900.0}, "loop_gap": {"p50_us": 12.0}},
        "rejected_by_reason": {"LATE": late, "STALE": received - decided - late},
    }
    (path / "service.json").write_text(json.dumps(summary))


def test_rows_in_shard_order_with_each_shards_own_figures(tmp_path, capsys):
    run = tmp_path / "lstm_a-n12"
    for shard in (10, 2, 0):  # shard10 sorts before shard2 as text
        write_service(run / f"shard{shard}" / "service", received=100 + shard, decided=90, late=shard,
                      coalesced=shard * 3)
    assert shard_accounting.main(["--header", "commit: abc", f"c2500={run}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "commit: abc" and lines[1].startswith("# per-shard accounting")
    assert [ln.split()[1] for ln in lines[2:]] == ["0", "2", "10"]
    assert lines[4].split() == ["c2500", "10", "110", "90", "20", "10", "0", "10", "7", "30", "3", "2.5", "5.5",
                                "900.0", "12.0", "27.5"]


def test_a_single_service_run_and_a_directory_without_one(tmp_path, capsys):
    write_service(tmp_path / "one" / "service", received=5, decided=5, late=0, coalesced=0)
    assert shard_accounting.main([f"one={tmp_path / 'one'}"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:4] == ["one", "-", "5", "5"]
    assert shard_accounting.main([f"none={tmp_path}"]) == 1
    assert "no shard*/service/service.json" in capsys.readouterr().err


def test_the_timeline_is_each_intervals_growth_and_the_gauges_at_its_end(tmp_path, capsys):
    run = tmp_path / "run"
    write_service(run / "shard0" / "service", received=30, decided=20, late=5, coalesced=0)
    snaps = [{"t_s": 0.0, "interval_ms": 100.0, "final": False,
              "counters": {"received": 10, "decided": 8, "batches": 2, "coalesced_reads": 0, "stall_ingest_us": 1500},
              "by_reason": {}, "gauges": {"admit_margin_us": 0.0, "admit_depth": 4.0, "queue_depth": 1.0}},
             {"t_s": 0.1, "interval_ms": 100.0, "final": True,
              "counters": {"received": 30, "decided": 20, "batches": 5, "coalesced_reads": 1, "stall_ingest_us": 4000},
              "by_reason": {"LATE": 5, "STALE": 2},
              "gauges": {"admit_margin_us": 250.04, "admit_depth": 1.0, "queue_depth": 0.0}}]
    (run / "shard0" / "snapshots.jsonl").write_text("".join(json.dumps(s) + "\n" for s in snaps))
    assert shard_accounting.main(["--timeline", f"x={run}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("# per-shard timeline")
    assert lines[1].split() == ["x", "0", "0.0", "100.0", "10", "8", "0", "0", "2", "0", "1.5", "0.0", "4.0", "1.0"]
    assert lines[2].split() == ["x", "0", "0.1", "100.0", "20", "12", "5", "2", "3", "1", "2.5", "250.0", "1.0",
                                "0.0"]
    (run / "shard0" / "snapshots.jsonl").unlink()  # a run cut off before its shards stopped
    assert shard_accounting.main(["--timeline", "--header", "commit: abc", f"x={run}"]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == ["commit: abc"] and "no snapshots.jsonl (a run cut off" in err  # the log's provenance
