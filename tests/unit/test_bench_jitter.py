"""tools/bench_jitter.py: the interruption census a pacer's lateness is judged against, run for real
(a short spin on this machine's last allowed core) and checked for what it must report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_jitter_census_reports_rates_quantiles_and_the_slots_hit(tmp_path):
    core = sorted(os.sched_getaffinity(0))[-1]
    out = tmp_path / "j.json"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_jitter.py"), "--cores", str(core),
                           "--seconds", "0.2", "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "10 µs slots hit by >= 5 µs (%)" in proc.stdout
    doc = json.loads(out.read_text())
    rows = doc.get("result", doc)["rows"]
    assert [r["core"] for r in rows] == [core]
    r = rows[0]
    assert 0.15 <= r["seconds"] <= 5
    assert r["per_s"] >= 0 and 0 <= r["slots_hit_pct"] <= 100
    assert r["p50_us"] <= r["p99_us"] <= r["max_us"]


def test_a_core_outside_the_affinity_is_refused():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_jitter.py"), "--cores", "100000"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not in this process's affinity" in proc.stderr
