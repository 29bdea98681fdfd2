"""HDR files and percentile math of the control plane, checked against hdrh itself.

Every .hlog is read back with `hdrh.log.HistogramLogReader` (the reader the
HdrHistogram tools share the format with), not with our own code.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogReader, HistogramLogWriter

from hft_infer.metrics import new_histogram, record_array
from hft_infer.metrics.histograms import (
    NINES_PERCENTILES,
    approx_sum_ns,
    count_at_or_below,
    index_values,
    nines_curve_us,
    percentile_values,
)
from hft_infer.metrics.hlog import (
    IntervalLogWriter,
    hgrm_text,
    merge_by_tag,
    read_hgrm,
    read_hlog,
    write_hgrm,
)


def _hist(values, highest_ns=60_000_000_000, digits=3) -> HdrHistogram:
    h = new_histogram(highest_ns, digits)
    record_array(h, np.asarray(values, dtype=np.int64))
    return h


def _lognormal(seed: int, n: int, median_ns: float, sigma: float = 0.6) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = rng.lognormal(np.log(median_ns), sigma, n)
    v[rng.random(n) < 0.002] *= 50  # a tail, so the high percentiles differ from the median
    return v.astype(np.int64)


# --- vectorised percentile math ---------------------------------------------------

@pytest.mark.parametrize("shape", [(60_000_000_000, 3), (1_000_000, 2), (3_600_000_000, 4)])
def test_index_values_equal_hdrh_for_every_bucket(shape):
    h = new_histogram(*shape)
    lowest, highest, median = index_values(h)
    assert len(lowest) == h.counts_len
    want_low = [h.get_value_from_index(i) for i in range(h.counts_len)]
    want_high = [h.get_highest_equivalent_value(v) for v in want_low]
    want_med = [h._hdr_median_equiv_value(v) for v in want_low]
    assert lowest.tolist() == want_low
    assert highest.tolist() == want_high
    assert median.tolist() == want_med


@pytest.mark.parametrize("n", [1, 7, 1000, 200_000])
def test_percentile_values_equal_hdrh(n):
    h = _hist(_lognormal(n, n, 40_000))
    pcts = [0.0, 1.0, 50.0, 90.0, 99.0, 99.9, 99.99, 99.999, 99.9999, 100.0]
    want = h.get_percentile_to_value_dict(pcts)
    got = percentile_values(h, pcts)
    assert got.tolist() == [float(want[p]) for p in pcts]
    # the dashboard's curve is the same numbers in µs, monotone
    curve = nines_curve_us(h)
    assert len(curve) == len(NINES_PERCENTILES)
    assert curve == sorted(curve)
    assert curve[-1] == pytest.approx(percentile_values(h, [NINES_PERCENTILES[-1]])[0] / 1e3, abs=1e-3)


def test_empty_histogram_has_no_percentiles():
    h = new_histogram()
    assert np.isnan(percentile_values(h, [50.0, 99.0])).all()
    assert nines_curve_us(h) is None
    assert count_at_or_below(h, [1000, 10**9]).tolist() == [0, 0]


def test_bucket_counts_and_sum_follow_the_histogram():
    values = _lognormal(3, 50_000, 25_000)
    h = _hist(values)
    limits = [1_000, 10_000, 20_000, 50_000, 100_000, 1_000_000, 1_000_000_000]
    got = count_at_or_below(h, limits)
    # A bucket counts below a limit only when all of it is below: never more
    # than the exact count, and short of it by at most one bucket's worth.
    exact = [int((values <= lim).sum()) for lim in limits]
    for g, e, lim in zip(got, exact, limits):
        assert g <= e
        in_edge_bucket = int(((values > lim * 0.998) & (values <= lim)).sum())
        assert e - g <= in_edge_bucket
    assert got[-1] == len(values)
    assert approx_sum_ns(h) == pytest.approx(float(values.sum()), rel=1e-3)  # 3 digits: 0.1 %
    assert approx_sum_ns(h) / h.get_total_count() == pytest.approx(h.get_mean_value(), rel=1e-9)


# --- .hlog -------------------------------------------------------------------

def _write_log(path, t0, intervals, comment="test"):
    w = IntervalLogWriter(str(path), comment=comment)
    for k, batch in enumerate(intervals):
        w.write_intervals([(tag, t0 + k * 1.0, 1.0, h) for tag, h in batch.items()])
    w.close()
    return w


def test_hlog_reads_back_with_hdrhs_reader(tmp_path):
    t0 = 1_700_000_000.25
    intervals = [{"wire": _hist(_lognormal(10 * k + 1, 2000, 30_000)),
                  "step": _hist(_lognormal(10 * k + 2, 2000, 90_000))} for k in range(5)]
    intervals[2]["queue"] = _hist(_lognormal(99, 10, 5_000))  # a stage that shows up once
    path = tmp_path / "service.hlog"
    _write_log(path, t0, intervals)

    reader = HistogramLogReader(str(path), new_histogram())
    got = []
    while (h := reader.get_next_interval_histogram()) is not None:
        got.append(h)
    reader.close()
    want = [(tag, k, h) for k, batch in enumerate(intervals) for tag, h in batch.items()]
    assert [h.get_tag() for h in got] == [tag for tag, _, _ in want]
    for h, (tag, k, src) in zip(got, want):
        assert h.get_total_count() == src.get_total_count()
        assert h.get_start_time_stamp() == pytest.approx((t0 + k) * 1000.0, abs=1.0)  # ms; %.3f s on disk
        assert h.get_end_time_stamp() - h.get_start_time_stamp() == pytest.approx(1000.0, abs=1.0)
        for p in (50.0, 90.0, 99.0, 99.9, 100.0):
            assert h.get_value_at_percentile(p) == src.get_value_at_percentile(p), (tag, k, p)
    assert reader.start_time_sec == pytest.approx(t0, abs=1e-3)

    merged = merge_by_tag(read_hlog(str(path)))
    assert sorted(merged) == ["queue", "step", "wire"]
    assert merged["wire"].get_total_count() == 5 * 2000
    all_wire = np.concatenate([_lognormal(10 * k + 1, 2000, 30_000) for k in range(5)])
    assert merged["wire"].get_value_at_percentile(99.0) == _hist(all_wire).get_value_at_percentile(99.0)


def test_hlog_header_is_java_format(tmp_path):
    path = tmp_path / "a.hlog"
    _write_log(path, 1_700_000_000.0, [{"wire": _hist([1000, 2000])}], comment="two\nlines")
    lines = path.read_text().splitlines()
    assert lines[:2] == ["#two", "#lines"]
    assert lines[2] == "#[Histogram log format version 1.3]"
    assert lines[3].startswith("#[StartTime: 1700000000.000 (seconds since epoch), 2023-11-14T22:13:20.000")
    assert lines[4] == "#[BaseTime: 1700000000.000 (seconds since epoch)]"
    assert lines[5] == '"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"'
    tag, start, length, max_ms, payload = lines[6].split(",")
    assert (tag, start, length, max_ms) == ("Tag=wire", "0.000", "1.000", "0.002")  # max in ms (ns / 1e6)
    assert payload.startswith("HISTF")


def test_hlog_reopen_continues_the_run_and_cuts_a_torn_line(tmp_path):
    t0 = 1_700_000_000.0
    path = tmp_path / "service.hlog"
    _write_log(path, t0, [{"wire": _hist([1000] * 10)}, {"wire": _hist([2000] * 10)}])
    with open(path, "a") as f:
        f.write("Tag=wire,2.000,1.000,0.003,HISTFAAAAC")  # killed mid-line, no newline
    # A restarted control process on the same file.
    w = IntervalLogWriter(str(path))
    assert w.base_time_s == t0
    w.write_intervals([("wire", t0 + 600.0, 1.0, _hist([3000] * 10))])
    w.close()
    text = path.read_text()
    assert "HISTFAAAAC\n" not in text and text.count("#[StartTime") == 1
    ivs = read_hlog(str(path))
    assert [round(iv.start_s - t0, 3) for iv in ivs] == [0.0, 1.0, 600.0]
    assert merge_by_tag(ivs)["wire"].get_total_count() == 30


def test_base_time_is_the_first_interval_and_earlier_ones_are_not_lost(tmp_path):
    """The service's first interval began before the control process heard of it;
    hdrh's reader would silently skip a negative start time."""
    path = tmp_path / "service.hlog"
    w = IntervalLogWriter(str(path))
    assert not path.exists()  # nothing heard yet, no file
    w.write_intervals([("wire", 1_700_000_010.0004, 1.0, _hist([1000])),
                       ("step", 1_700_000_009.5, 1.0, _hist([2000]))])
    w.write_intervals([("wire", 1_700_000_009.0, 1.0, _hist([3000]))])  # the clock stepped back
    w.close()
    assert w.base_time_s == 1_700_000_009.5 and w.clamped == 1
    ivs = read_hlog(str(path))
    assert [(iv.tag, round(iv.start_s - 1_700_000_009.5, 3)) for iv in ivs] == [
        ("wire", 0.5), ("step", 0.0), ("wire", 0.0)]


def test_unreadable_existing_log_is_kept_aside(tmp_path):
    path = tmp_path / "service.hlog"
    path.write_text("not a log\n")
    w = IntervalLogWriter(str(path))
    w.write_intervals([("wire", 1_700_000_000.0, 1.0, _hist([1000]))])
    w.close()
    assert (tmp_path / "service.hlog.unreadable").read_text() == "not a log\n"
    assert path.read_text().startswith("#[Histogram log format version")


def test_hdrh_writer_start_time_line_is_broken():
    """Why hlog.py writes its own header: hdrh 0.10.8's start-time line crashes,
    on milliseconds read as seconds (ValueError) or, for a small time, on
    `datetime.iso_format`, which does not exist (AttributeError). If this
    starts failing, the package was fixed and the note in hlog.py can go."""
    w = HistogramLogWriter(io.StringIO())
    with pytest.raises(ValueError):
        w.output_start_time(1_700_000_000_000)
    with pytest.raises(AttributeError):
        w.output_start_time(1_000)


# --- .hgrm -------------------------------------------------------------------

def test_hgrm_rows_and_footer_match_the_histogram(tmp_path):
    values = _lognormal(7, 100_000, 50_000)
    h = _hist(values)
    path = tmp_path / "step.hgrm"
    write_hgrm(h, str(path))
    d = read_hgrm(str(path))
    assert d.total == 100_000 and d.counts[-1] == 100_000
    assert d.max_value == pytest.approx(h.get_max_value() / 1e3, abs=1e-3)
    assert (np.diff(d.percentiles) >= 0).all() and (np.diff(d.values) >= 0).all()
    assert d.percentiles[-1] == 100.0
    for p in (50.0, 90.0, 99.0, 99.9):
        i = np.searchsorted(d.percentiles, p)  # first listed percentile >= p
        assert d.values[i] * 1e3 >= h.get_value_at_percentile(p) - 1
    text = path.read_text()
    mean_line = next(line for line in text.splitlines() if line.startswith("#[Mean"))
    mean_us, std_us = (float(x.split("=")[1]) for x in mean_line.strip("#[]").split(","))
    assert mean_us == pytest.approx(values.mean() / 1e3, rel=2e-3)
    assert std_us == pytest.approx(values.std() / 1e3, rel=2e-2)  # in µs, unlike hdrh's own writer
    assert "Total count    =       100000]" in text


def test_read_hgrm_accepts_hdrhs_own_listing():
    """serve writes .hgrm with hdrh's output_percentile_distribution (TotalCount as a float)."""
    h = _hist(_lognormal(5, 5000, 10_000))
    buf = io.BytesIO()
    h.output_percentile_distribution(buf, 1000.0)
    import tempfile

    with tempfile.NamedTemporaryFile("wb", suffix=".hgrm", delete=False) as f:
        f.write(buf.getvalue())
    d = read_hgrm(f.name)
    assert d.total == 5000 and d.percentiles[-1] == 100.0
    ours = hgrm_text(h).splitlines()
    assert len([x for x in ours if x and x[0] == " " and x.strip()[0].isdigit()]) == len(d.values)
