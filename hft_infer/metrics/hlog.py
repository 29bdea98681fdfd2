"""HDR interval logs (.hlog) and percentile distributions (.hgrm).

Written in the formats of HdrHistogram's Java `HistogramLogWriter` (log
format 1.3) and `outputPercentileDistribution`, so that the HdrHistogram
tools (HistogramLogProcessor, the online plotter, hdrh's reader) read them.

Why not hdrh 0.10.8's `HistogramLogWriter`: its `output_start_time` crashes
(`datetime.iso_format` does not exist and it treats milliseconds as seconds),
and its interval lines carry no tag. Why not its `output_percentile_distribution`:
it leaves the standard deviation unscaled and prints the total count as a
float. The header and lines are therefore written here; the tests read every
file back with `hdrh.log.HistogramLogReader`.

A log is opened in append mode: a control process restarted on the same run
directory keeps the first one's base time, so one file covers the run. Each
interval's lines go out in one `write` on an O_APPEND descriptor, so a
killed process leaves whole lines; a torn last line (power loss) is cut off
when the file is reopened.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from hdrh.histogram import HdrHistogram

from hft_infer.metrics import counts_of
from hft_infer.metrics.histograms import index_values

LOG_FORMAT_VERSION = "1.3"
LEGEND = '"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"'
# Interval_Max is written in ms for ns recordings, as the Java tools expect
# (their default maxValueUnitRatio is 1e6).
MAX_VALUE_UNIT_RATIO = 1e6
TAG_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # no ',' or spaces: the line format forbids them
_BASE_TIME_RE = re.compile(r"^#\[BaseTime: *([\d.]+) ")


class HlogError(ValueError):
    """A log or distribution file that cannot be read; the message is one line."""


def _iso(epoch_s: float) -> str:
    return _dt.datetime.fromtimestamp(epoch_s, _dt.timezone.utc).isoformat(timespec="milliseconds")


def header_text(start_time_s: float, comment: str = "") -> str:
    lines = []
    if comment:
        lines.extend(f"#{line}" for line in comment.splitlines())
    lines.append(f"#[Histogram log format version {LOG_FORMAT_VERSION}]")
    # hdrh's reader wants a space after the number in both lines.
    lines.append(f"#[StartTime: {start_time_s:.3f} (seconds since epoch), {_iso(start_time_s)}]")
    lines.append(f"#[BaseTime: {start_time_s:.3f} (seconds since epoch)]")
    lines.append(LEGEND)
    return "\n".join(lines) + "\n"


def interval_line(tag: str, start_rel_s: float, length_s: float, hist: HdrHistogram) -> str:
    payload = hist.encode()
    if isinstance(payload, bytes):
        payload = payload.decode("ascii")
    return (f"Tag={tag},{start_rel_s:.3f},{length_s:.3f},"
            f"{hist.get_max_value() / MAX_VALUE_UNIT_RATIO:.3f},{payload}\n")


class IntervalLogWriter:
    """One .hlog, interval histograms tagged by stage, relative to the log's base time.

    The base time is the start of the first interval written (not when this
    process started: the service's first interval usually began earlier, and
    hdrh's reader silently skips lines with a negative time). The file is
    created at the first interval, so a control process that never heard
    from a service leaves no empty log behind.
    """

    def __init__(self, path: str, comment: str = "") -> None:
        self.path = path
        self.comment = comment
        self.base_time_s = self._reopen_base_time(path)
        self._fd = -1
        self.lines_written = 0
        self.clamped = 0  # intervals that began before the base time (a clock step back)

    @staticmethod
    def _reopen_base_time(path: str) -> float | None:
        """Base time of an existing log (after cutting a torn last line); None if none/empty."""
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            return None
        if size == 0:
            return None
        with open(path, "rb+") as f:
            data = f.read()
            if not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)
        for line in data.decode("ascii", "replace").splitlines()[:64]:
            m = _BASE_TIME_RE.match(line)
            if m:
                return float(m.group(1))
        # Not a log we wrote: keep it, start a fresh one.
        os.replace(path, path + ".unreadable")
        return None

    def write_intervals(self, intervals: Iterable[tuple[str, float, float, HdrHistogram]]) -> int:
        """Append (tag, start epoch s, length s, histogram) lines in one write; returns bytes."""
        intervals = list(intervals)
        if not intervals:
            return 0
        header = ""
        if self.base_time_s is None:
            # Whole milliseconds, as written, so that relative times add up exactly.
            self.base_time_s = math.floor(min(iv[1] for iv in intervals) * 1000.0) / 1000.0
            header = header_text(self.base_time_s, self.comment)
        lines = []
        for tag, start_s, length_s, hist in intervals:
            rel = start_s - self.base_time_s
            if rel < 0:
                self.clamped += 1
                rel = 0.0
            lines.append(interval_line(tag, rel, length_s, hist))
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        data = (header + "".join(lines)).encode("ascii")
        os.write(self._fd, data)
        self.lines_written += len(lines)
        return len(data)

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1


@dataclass
class Interval:
    tag: str | None
    start_s: float  # epoch seconds
    end_s: float
    hist: HdrHistogram


def read_hlog(path: str) -> list[Interval]:
    """Every interval of a log, through hdrh's own reader (the compatibility check)."""
    from hdrh.log import HistogramLogReader

    if not os.path.isfile(path):
        raise FileNotFoundError(2, "No such file or directory", path)
    reader = HistogramLogReader(path, None)
    out = []
    try:
        while True:
            try:
                h = reader.get_next_interval_histogram()
            except Exception as e:  # noqa: BLE001 - base64/zlib/cookie errors of a damaged line
                raise HlogError(f"{path}: cannot decode interval {len(out) + 1}: {e}") from None
            if h is None:
                break
            out.append(Interval(h.get_tag(), h.get_start_time_stamp() / 1e3, h.get_end_time_stamp() / 1e3, h))
    finally:
        reader.close()
    return out


def merge_by_tag(intervals: Iterable[Interval]) -> dict[str, HdrHistogram]:
    """Sum of the intervals of each tag (untagged intervals under "")."""
    merged: dict[str, HdrHistogram] = {}
    for iv in intervals:
        tag = iv.tag or ""
        h = merged.get(tag)
        if h is None:
            h = merged[tag] = HdrHistogram(iv.hist.lowest_trackable_value, iv.hist.highest_trackable_value,
                                           iv.hist.significant_figures)
        h.add(iv.hist)
    return merged


# --- .hgrm ------------------------------------------------------------------

def hgrm_text(hist: HdrHistogram, unit_ratio: float = 1e3, ticks_per_half_distance: int = 5) -> str:
    """Java `outputPercentileDistribution` text; values divided by `unit_ratio` (ns -> µs)."""
    digits = hist.significant_figures
    row = f"%12.{digits}f %2.12f %10d %14.2f\n"
    last = f"%12.{digits}f %2.12f %10d\n"
    out = ["%12s %14s %10s %14s\n\n" % ("Value", "Percentile", "TotalCount", "1/(1-Percentile)")]
    if hist.get_total_count() > 0:
        for it in hist.get_percentile_iterator(ticks_per_half_distance):
            value = it.value_iterated_to / unit_ratio
            pct = it.percentile_level_iterated_to / 100.0
            if it.percentile_level_iterated_to != 100:
                out.append(row % (value, pct, it.total_count_to_this_value, 1.0 / (1.0 - pct)))
            else:
                out.append(last % (value, pct, it.total_count_to_this_value))
    n = hist.get_total_count()
    mean = std = 0.0
    if n:
        _, _, median = index_values(hist)
        c = counts_of(hist).astype(np.float64)
        mean = float(np.dot(c, median)) / n
        std = float(np.sqrt(np.dot(c, (median - mean) ** 2) / n))
    out.append(f"#[Mean    = %12.{digits}f, StdDeviation   = %12.{digits}f]\n" % (mean / unit_ratio, std / unit_ratio))
    out.append(f"#[Max     = %12.{digits}f, Total count    = %12d]\n" % (hist.get_max_value() / unit_ratio, n))
    out.append("#[Buckets = %12d, SubBuckets     = %12d]\n" % (hist.bucket_count, hist.sub_bucket_count))
    return "".join(out)


def write_hgrm(hist: HdrHistogram, path: str, unit_ratio: float = 1e3) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(hgrm_text(hist, unit_ratio))
    os.replace(tmp, path)  # never a half-written distribution


@dataclass
class Distribution:
    """Rows of an .hgrm: value (in the file's unit, µs for ours), percentile (0..100), count."""

    values: np.ndarray
    percentiles: np.ndarray
    counts: np.ndarray
    max_value: float | None
    total: int


_ROW_RE = re.compile(r"^\s*([0-9.eE+-]+)\s+([0-9.eE+-]+)\s+(\d+)(?:\s+\S+)?\s*$")
# "Total count" (Java) or "TotalCount" with a float (hdrh 0.10.8)
_MAX_RE = re.compile(r"^#\[Max\s*=\s*([0-9.eE+-]+),\s*Total ?count\s*=\s*([0-9.eE+-]+)\]", re.IGNORECASE)


def read_hgrm(path: str) -> Distribution:
    values, pcts, counts = [], [], []
    max_value, total = None, 0
    with open(path) as f:
        for line in f:
            m = _ROW_RE.match(line)
            if m:
                values.append(float(m.group(1)))
                pcts.append(float(m.group(2)) * 100.0)
                counts.append(int(m.group(3)))
                continue
            m = _MAX_RE.match(line)
            if m:
                max_value, total = float(m.group(1)), int(float(m.group(2)))
    if not values and total:
        raise HlogError(f"{path}: no percentile rows")
    return Distribution(np.array(values), np.array(pcts), np.array(counts, dtype=np.int64), max_value,
                        total or (counts[-1] if counts else 0))
