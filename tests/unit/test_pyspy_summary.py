"""tools/pyspy_summary.py: the feed window of a py-spy speedscope profile (first to last sample whose
stack holds a marker), in the thread with the most samples there; inclusive shares by function, self
shares by line, of that window only; a profile without a marker says so, and a file that is not one
is an error."""

from __future__ import annotations

import json

import pyspy_summary

FRAMES = [
    {"name": "main", "file": "/x/svc.py", "line": 1},  # 0
    {"name": "Ingest._handle", "file": "/x/ingest.py", "line": 10},  # 1: the default marker
    {"name": "Stepper.submit", "file": "/x/stepper.py", "line": 20},  # 2
    {"name": "spin", "file": "/x/svc.py", "line": 5},  # 3
]


def write_profile(path, threads: dict[str, list[list[int]]]) -> None:
    profiles = [{"type": "sampled", "name": name, "unit": "seconds", "startValue": 0, "endValue": 1,
                 "samples": samples, "weights": [0.001] * len(samples)} for name, samples in threads.items()]
    path.write_text(json.dumps({"shared": {"frames": FRAMES}, "profiles": profiles}))


def rows(text: str, table: str) -> dict[str, float]:
    """The rows of one table (`inclusive` or `self`) as name -> %."""
    out, inside = {}, False
    for line in text.splitlines():
        if line.startswith("## "):
            inside = line.startswith(f"## {table}")
        elif inside and line.startswith("| ") and not line.startswith(("| function", "| ---")):
            name, pct = line.strip("| ").rsplit(" | ", 1)
            out[name] = float(pct)
    return out


def test_the_feed_window_of_the_busiest_thread_only(tmp_path, capsys):
    idle = [[0, 3]] * 50  # start-up and idle spinning: outside the window
    work = [[0, 1], [0, 2], [0, 2], [0, 1]]  # ingest, two steps, ingest
    path = tmp_path / "shard0.json"
    write_profile(path, {"MainThread": idle + work + idle, "helper": [[0, 3]] * 200})
    assert pyspy_summary.main([str(path), "--top", "10"]) == 0
    out = capsys.readouterr().out
    assert "MainThread: feed window samples 50..54 of 104, 4 samples" in out
    assert rows(out, "inclusive") == {"main": 100.0, "Ingest._handle": 50.0, "Stepper.submit": 50.0}
    assert rows(out, "self") == {"Ingest._handle (ingest.py:10)": 50.0, "Stepper.submit (stepper.py:20)": 50.0}


def test_other_markers_no_window_and_not_a_profile(tmp_path, capsys):
    path = tmp_path / "p.json"
    write_profile(path, {"MainThread": [[0, 3], [0, 2], [0, 3]]})
    assert pyspy_summary.main([str(path), "--marker", "Stepper.submit"]) == 0
    assert rows(capsys.readouterr().out, "inclusive") == {"main": 100.0, "Stepper.submit": 100.0}
    assert pyspy_summary.main([str(path)]) == 0
    assert "no sample holds a marker" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert pyspy_summary.main([str(bad)]) == 1
    assert "bad.json" in capsys.readouterr().err
