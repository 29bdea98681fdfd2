"""tools/bench_shards.sh and its summary: the efficiency, the states a run can end in, and
the exit status (fake run files for the summary; the script itself only where it starts nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import bench_shards_summary as summary

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "bench_shards.sh"


def fake_run(path: Path, *, decided: int, sent: int, elapsed_s: float = 1.0, lost: int = 0, floor: bool = True,
             shards: int = 1) -> str:
    acc = {"sent": sent, "received": sent, "decided": decided, "shed": sent - decided - lost, "conflated": 0,
           "rejected": 0, "lost": lost, "unowned": 0}
    agg = {"accounting": acc, "decided_per_s": decided / elapsed_s, "unmatched_decisions": 0, "duplicates": 0,
           "tick_to_decision": {"count": decided, "p50_us": 100.0, "p99_us": 300.0}, "stages": {}}
    per = [{"engine": "graph", "stages": {"service": {"p99_us": 50.0 + k}}, "service_cores_seen": [k + 2]}
           for k in range(shards)]
    out = {"aggregate": agg, "per_shard": per, "rate_achieved": sent / elapsed_s}
    if floor:
        out["floor"] = {"aggregate": {"tick_to_decision": {"p50_us": 40.0, "p99_us": 90.0}}}
    path.write_text(json.dumps(out))
    return str(path)


def write_tsv(outdir: Path, lines: list[tuple]) -> None:
    (outdir / "runs.tsv").write_text("".join("\t".join(map(str, ln)) + "\n" for ln in lines))


def test_efficiency_is_n_shards_goodput_over_n_times_one(tmp_path, capsys):
    one = fake_run(tmp_path / "a1.json", decided=30_000, sent=40_000)
    four = fake_run(tmp_path / "a4.json", decided=96_000, sent=160_000, shards=4)
    write_tsv(tmp_path, [("lstm_a", 1, 40000, "ok", one, "5s"), ("lstm_a", 4, 160000, "ok", four, "9s"),
                         ("lstm_a", 8, 320000, "skipped-budget", "-", "3s left")])
    assert summary.main([str(tmp_path), "--budget", "70", "--elapsed", "66"]) == 0
    got = json.loads((tmp_path / "summary.json").read_text())
    assert abs(got["efficiency"]["lstm_a 1->4"] - 0.8) < 1e-9
    assert got["efficiency"]["lstm_a 1 shard saturated"] is True  # 30k of 40k decided
    text = capsys.readouterr().out
    assert "lstm_a 1->4: 80 %" in text and "skipped-budget (3s left)" in text
    assert "| lstm_a | 4 | 160,000 | 96,000 |" in text and "2,3,4,5" in text  # the shards' hot cores
    assert (tmp_path / "summary.md").read_text().strip() == text.strip()


def test_a_lost_event_or_a_failed_run_exits_1_and_says_so(tmp_path, capsys):
    lossy = fake_run(tmp_path / "d1.json", decided=900, sent=1000, lost=5, floor=False)
    write_tsv(tmp_path, [("default", 1, 1000, "ok", lossy, "4s"), ("default", 4, 4000, "timeout", "-", "30s")])
    assert summary.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "default N=1: lost" in err and "default N=4: timeout" in err


def test_nothing_that_ran_is_a_failure(tmp_path, capsys):
    write_tsv(tmp_path, [("lstm_a", 1, 30000, "skipped-budget", "-", "2s left")])
    assert summary.main([str(tmp_path)]) == 1
    assert "no run succeeded" in capsys.readouterr().err


def test_the_script_refuses_bad_usage_and_skips_what_the_budget_cannot_hold(tmp_path):
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "usage" in r.stderr
    # a budget smaller than one run: every run is skipped, nothing starts, and that is exit 1
    env = dict(os.environ, BUDGET_S="3", MIN_RUN_S="5", SHARDS="1 2", CHECK_CORES="0", PY=sys.executable)
    r = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=120)
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("skipped: ") == 4 and "no run succeeded" in r.stderr
    rows = (tmp_path / "out" / "runs.tsv").read_text().splitlines()
    assert [ln.split("\t")[:2] for ln in rows] == [["lstm_a", "1"], ["default", "1"], ["lstm_a", "2"],
                                                   ["default", "2"]]


def _cut_off_run(outdir: Path, shards: int, decided: list[int], *, pacer: bool = True) -> str:
    """A run directory as `bench --shards` leaves it when killed after its feed: each shard's
    service.json and the pacer's log, no report (its --json path does not exist)."""
    run = outdir / "runs" / f"lstm_a-n{shards}"
    for i, d in enumerate(decided):
        svc = run / f"shard{i}" / "service"
        svc.mkdir(parents=True)
        (svc / "service.json").write_text(json.dumps({"accounting": {"decided": d, "shed": 1000 - d}}))
    if pacer:
        (run / "pacer.log").write_text("14:56:30 pacer: 1037 subscriptions\n"
                                       "14:56:34 pacer: sent 2520000 in 2.520 s (1,000,000/s)\n")
    return str(run.with_suffix(".json"))


def test_a_run_cut_off_after_its_feed_reports_decided_from_its_shards_and_still_fails(tmp_path, capsys):
    path = _cut_off_run(tmp_path, 2, [600, 660])
    write_tsv(tmp_path, [("lstm_a", 2, 1008000, "timeout", path, "52s")])
    assert summary.main([str(tmp_path)]) == 1
    row = json.loads((tmp_path / "summary.json").read_text())["runs"][0]
    assert row["decided"] == 1260 and row["decided_per_s"] == 1260 / 2.52 and row["sent"] == 2520000
    assert row["state"] == "timeout" and "cut off after the feed" in row["note"]
    assert "| 500 |" in capsys.readouterr().out  # 1,260 decided over 2.52 s


def test_a_cut_off_run_missing_a_shard_or_the_pacer_line_reports_nothing(tmp_path):
    one_shard = _cut_off_run(tmp_path / "a", 2, [600])  # shard1 never wrote its summary
    no_pacer = _cut_off_run(tmp_path / "b", 2, [600, 660], pacer=False)
    for outdir, path in ((tmp_path / "a", one_shard), (tmp_path / "b", no_pacer)):
        write_tsv(outdir, [("lstm_a", 2, 1008000, "timeout", path, "52s")])
        assert summary.main([str(outdir)]) == 1
        row = json.loads((outdir / "summary.json").read_text())["runs"][0]
        assert "decided_per_s" not in row and row["state"] == "timeout"
