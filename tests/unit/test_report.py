"""`hft-infer report` on two runs: HTML that stands alone, a PNG, the right numbers."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

from hft_infer.app.cli import main as cli_main
from hft_infer.metrics import SERVICE_STAGES, TICK_TO_DECISION, new_histogram, record_array, summarize
from hft_infer.metrics.hlog import IntervalLogWriter, write_hgrm

MEDIANS_NS = {"wire": 30_000, "ingest": 2_000, "queue": 10_000, "step": 80_000, "publish": 4_000,
              "service": 100_000, "loop_gap": 3_000}


def _make_run(root: Path, name: str, slow: float, seed: int, *, bench_layout: bool = False) -> dict:
    """A run directory as serve/bench leave it: summary JSON, interval log, .hgrm files."""
    run = root / name
    files = run / "service" if bench_layout else run
    files.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    cumulative = {s: new_histogram() for s in SERVICE_STAGES}
    log = IntervalLogWriter(str(files / "service.hlog"))
    for k in range(4):
        batch = []
        for stage in SERVICE_STAGES:
            v = (rng.lognormal(np.log(MEDIANS_NS[stage] * slow), 0.5, 3000)).astype(np.int64)
            h = new_histogram()
            record_array(h, v)
            cumulative[stage].add(h)
            batch.append((stage, 1_700_000_000.0 + k, 1.0, h))
        log.write_intervals(batch)
    log.close()
    for stage, h in cumulative.items():
        write_hgrm(h, str(files / f"{stage}.hgrm"))
    ttd = new_histogram()
    record_array(ttd, (rng.lognormal(np.log(150_000 * slow), 0.4, 12000)).astype(np.int64))
    write_hgrm(ttd, str(run / f"{TICK_TO_DECISION}.hgrm"))
    summary = {
        "config": {"runner": {"engine": "eager"}},
        "engine": "eager", "model_version": f"model-{name}",
        "rate_offered": 20000.0, "rate_achieved": 19990.5, "duration_s": 4.0,
        "stages": {s: summarize(h) for s, h in cumulative.items()},
        TICK_TO_DECISION: summarize(ttd),
        "accounting": {"sent": 12000, "received": 12000, "decided": 11000 + seed, "shed": 500, "conflated": 500 - seed,
                       "rejected": 0, "lost": 0},
        "rejected_by_reason": {"STALE": 400, "QUEUE_FULL": 100},
    }
    (run / "summary.json").write_text(json.dumps(summary))
    return summary


def _fmt(us: float) -> str:
    from hft_infer.app.report import _fmt_us

    return _fmt_us(us)


def test_report_compares_two_runs(tmp_path, capsys):
    fast = _make_run(tmp_path, "fast", 1.0, 1)
    slow = _make_run(tmp_path, "slow", 2.0, 2, bench_layout=True)
    out = tmp_path / "report.html"
    rc = cli_main(["report", str(tmp_path / "fast"), str(tmp_path / "slow"), "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert "report.html and" in capsys.readouterr().out
    text = out.read_text()

    # self-contained: inline SVG, nothing to fetch
    assert text.count("<svg") == 1
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text)
    assert "<script" not in text and "<link" not in text and "@import" not in text
    # both runs, every stage, tick-to-decision; numbers from the summaries
    for label in ("fast", "slow", "model-fast", "model-slow"):
        assert f">{label}<" in text
    for stage in (*SERVICE_STAGES, TICK_TO_DECISION):
        assert f"<td>{stage}</td>" in text
    for summary in (fast, slow):
        for stage in ("step", "service"):
            row = summary["stages"][stage]
            for key in ("p50_us", "p99_us", "p999_us", "max_us"):
                assert f"<td>{_fmt(row[key])}</td>" in text, (stage, key)
        assert f"<td>{_fmt(summary[TICK_TO_DECISION]['p99_us'])}</td>" in text
    # slow has twice the latencies: its p99 ratio column says so
    ratios = [float(x) for x in re.findall(r"class='worse'>×([0-9.]+)<", text)]
    assert len(ratios) == len(SERVICE_STAGES) + 1 and all(1.6 < r < 2.5 for r in ratios)  # + tick_to_decision
    # accounting for both, with each run's own values
    assert "<td>decided</td><td>11,001</td><td>11,002</td>" in text
    assert "<td>STALE</td><td>400</td><td>400</td>" in text
    # the SVG holds one curve per run per stage plotted (7 panels x 2 runs)
    svg = text[text.index("<svg"):text.index("</svg>")]
    assert len(re.findall(r"<g id=\"line2d_", svg)) >= 14

    png = out.with_suffix(".png")
    import matplotlib.image

    img = matplotlib.image.imread(str(png))
    assert img.shape[0] > 400 and img.shape[1] > 800
    assert img[..., :3].std() > 0.05  # not a blank canvas


def test_report_on_hlog_and_hgrm_files(tmp_path):
    _make_run(tmp_path, "a", 1.0, 1)
    out = tmp_path / "files.html"
    rc = cli_main(["report", str(tmp_path / "a" / "service.hlog"), str(tmp_path / "a" / "step.hgrm"),
                   "--out", str(out), "--no-png", "--label", "log", "--label", "listing"])
    assert rc == 0
    text = out.read_text()
    assert ">log<" in text and ">listing<" in text
    assert not out.with_suffix(".png").exists()
    # the listing knows only its own stage
    step_row = re.search(r"<tr><td>step</td>(.*?)</tr>", text).group(1)
    wire_row = re.search(r"<tr><td>wire</td>(.*?)</tr>", text).group(1)
    assert step_row.count("<td>–</td>") == 0
    # count, p50, p99, p99.9, max of the listing, and its p99 ratio
    assert wire_row.count("<td>–</td>") == 6


@pytest.mark.parametrize("make,expect", [
    (lambda d: d / "missing", "No such file or directory"),
    (lambda d: (d / "empty").mkdir() or d / "empty", "no summary.json, service.json, .hlog or .hgrm"),
    (lambda d: (d / "x.txt").write_text("x") and d / "x.txt", "not a run directory, .hlog or .hgrm"),
    (lambda d: (d / "bad.hlog").write_text("#[BaseTime: 1.0 (s)]\nTag=a,0.0,1.0,0.1,HISTFAAAAnotbase64\n")
     and d / "bad.hlog", "cannot decode interval 1"),
])
def test_report_user_errors_are_one_line(tmp_path, capsys, make, expect):
    src = make(tmp_path)
    rc = cli_main(["report", str(src), "--out", str(tmp_path / "r.html")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("hft-infer report: error: ") and err.count("\n") == 1 and expect in err, err


def test_report_helpers_read_hgrm_percentiles():
    from hft_infer.app.report import curve_from_hgrm, table_from_curve

    h = new_histogram()
    rng = np.random.default_rng(0)
    record_array(h, rng.integers(1000, 2_000_000, 50_000))
    import tempfile

    buf = io.StringIO()
    from hft_infer.metrics.hlog import hgrm_text

    buf.write(hgrm_text(h))
    with tempfile.NamedTemporaryFile("w", suffix=".hgrm", delete=False) as f:
        f.write(buf.getvalue())
    row = table_from_curve(curve_from_hgrm(f.name))
    exact = summarize(h)
    assert row["count"] == exact["count"]
    # the listing's rows are coarser than the histogram: the next row up, within a few %
    for key in ("p50_us", "p90_us", "p99_us", "p999_us"):
        assert exact[key] * 0.999 <= row[key] <= exact[key] * 1.06, key
