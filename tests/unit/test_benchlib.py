"""tools/benchlib.py: tables that never cut or misalign a value, JSON that says where it was measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from benchlib import percentile_table, table, write_json

ROOT = Path(__file__).resolve().parents[2]


def test_wide_values_are_never_cut_and_columns_stay_aligned():
    huge = 123_456_789_012.5
    text = table(["stage", "p99 µs"], [["a-very-long-stage-name-indeed", huge], ["x", 1.0], ["y", None]])
    lines = text.splitlines()
    assert "a-very-long-stage-name-indeed" in text and "123456789012.5" in text  # nothing truncated
    header, rule, *rows = lines
    assert len({len(line) for line in (header, rule, *rows)}) == 1  # right-aligned numbers: same right edge
    assert rows[2].endswith("-")  # None reads as "-"
    assert rows[1].startswith("x" + " " * len("a-very-long-stage-name-indeed"))  # the text column fits its widest


def test_text_left_numbers_right():
    text = table(["name", "n"], [["ab", 5], ["abcdef", 12345]])
    header, _, r1, r2 = text.splitlines()
    assert r1.startswith("ab ") and r1.endswith("    5") and r2.endswith("12345")


def test_rows_must_match_the_headers():
    with pytest.raises(ValueError, match="2 cells for 3 headers"):
        table(["a", "b", "c"], [[1, 2]])


def test_percentile_table_from_summary_dicts():
    stages = {"service": {"count": 10, "p50_us": 12.25, "p90_us": 20.0, "p99_us": 99.0, "p999_us": 1e6,
                          "max_us": 2e9},
              "empty": {"count": 0, "p50_us": None, "p90_us": None, "p99_us": None, "p999_us": None,
                        "max_us": None}}
    text = percentile_table(stages, title="latency")
    lines = text.splitlines()
    assert lines[0] == "latency" and lines[1].split()[:3] == ["stage", "count", "p50"]
    assert "2000000000.0" in text and "1000000.0" in text
    assert lines[-1].split() == ["empty", "0", "-", "-", "-", "-", "-"]


def test_write_json_records_where_and_how(tmp_path):
    out = tmp_path / "r.json"
    write_json(out, {"rate": np.float64(1.5), "ticks": np.arange(3)}, argv=["tools/x.py", "--rate", "5"])
    doc = json.loads(out.read_text())
    assert doc["result"] == {"rate": 1.5, "ticks": [0, 1, 2]}
    meta = doc["meta"]
    assert meta["command"].endswith("tools/x.py --rate 5") and meta["argv"] == ["tools/x.py", "--rate", "5"]
    assert meta["date"][:4].isdigit() and "T" in meta["date"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    if head.returncode == 0:
        assert meta["git"]["commit"] == head.stdout.strip() and isinstance(meta["git"]["dirty"], bool)
    assert meta["versions"]["numpy"] == np.__version__
    assert meta["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    import torch

    assert meta["versions"]["torch"] == torch.__version__
    assert meta["machine"]["cpus_usable"] >= 1 and meta["machine"]["host"]


@pytest.mark.parametrize("tool", ["bench_capture.py", "bench_wire.py", "bench_poll_modes.py", "soak.py",
                                  "naive_loop.py"])
def test_each_tool_using_benchlib_starts(tool):
    r = subprocess.run([sys.executable, str(ROOT / "tools" / tool), "--help"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr
