"""Latency histograms: record cheaply on the hot path, fold in bulk elsewhere.

A leaf package (numpy, hdrhistogram and the wire types of `transport`):
`replay` and the control process use it too. `hlog` reads and writes HDR
interval logs and percentile files; `histograms` reads histograms back
(percentiles, curves) for the control process and reports.

Why not `HdrHistogram.record_value` per event: it costs ~1.2 us per value in
Python (measured on the 2-core dev VM), more than the model step across six
stages. The hot loop instead appends raw integer nanoseconds to a
preallocated numpy buffer per stage (`SampleBuffer.add`, ~0.1 us) and folds
the buffer into HdrHistograms during housekeeping, computing the HDR bucket
index of every sample at once with numpy (`counts_index`). The result is
bit-identical to `record_value` (tests/unit/test_metrics.py checks).

Interval histograms travel to the control process as sparse counts
(`IntervalCounts`: the non-zero bucket indices and their counts), which the
receiver adds into its own histograms; `HdrHistogram.encode()` (zlib over the
counts) would cost the hot loop about a millisecond per stage per interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from hdrh.histogram import HdrHistogram

from hft_infer.transport.stats import WireIntervalCounts

# Stages recorded by the service, in pipeline order (DESIGN.md, Latency stages).
SERVICE_STAGES = ("wire", "decode", "queue", "step", "publish", "service")
# Measured by the replay/bench collector: intended send time -> decision received.
TICK_TO_DECISION = "tick_to_decision"
PERCENTILES = (50.0, 90.0, 99.0, 99.9)

LOWEST_NS = 1
DEFAULT_HIGHEST_NS = 60_000_000_000  # 60 s: a stalled run still fits
DEFAULT_DIGITS = 3


def new_histogram(highest_ns: int = DEFAULT_HIGHEST_NS, digits: int = DEFAULT_DIGITS) -> HdrHistogram:
    return HdrHistogram(LOWEST_NS, highest_ns, digits)


def counts_of(hist: HdrHistogram) -> np.ndarray:
    """numpy view of the histogram's own counts (a ctypes array in its payload: an internal
    of hdrhistogram 0.10, pinned in pyproject.toml; tests/unit/test_metrics.py checks that
    our bulk recording stays bit-identical to `record_value`)."""
    return np.ctypeslib.as_array(hist.counts)


def counts_index(hist: HdrHistogram, values: np.ndarray) -> np.ndarray:
    """HDR counts-array index of every value (vectorised `_counts_index_for`).

    Values must be integers in [0, 2**53) (float64 `frexp` is exact there).
    """
    v = values.astype(np.int64, copy=False)
    # bit_length(v | sub_bucket_mask) via frexp: v = m * 2**e with 0.5 <= m < 1.
    _, pow2ceiling = np.frexp((v | hist.sub_bucket_mask).astype(np.float64))
    bucket = pow2ceiling.astype(np.int64) - hist.unit_magnitude - (hist.sub_bucket_half_count_magnitude + 1)
    sub_bucket = v >> (bucket + hist.unit_magnitude)
    return ((bucket + 1) << hist.sub_bucket_half_count_magnitude) + (sub_bucket - hist.sub_bucket_half_count)


@dataclass
class IntervalCounts:
    """Sparse form of one stage's interval histogram (what the control plane receives)."""

    index: np.ndarray  # int32 bucket indices with non-zero counts
    count: np.ndarray  # int64 counts
    min_ns: int
    max_ns: int
    total: int


def record_array(hist: HdrHistogram, values: np.ndarray) -> IntervalCounts | None:
    """Record every value of an int array into `hist`; returns the sparse counts added.

    Negative values (clock steps) and values past the histogram's range are
    clamped to its range rather than lost, so counts always add up.
    """
    if values.size == 0:
        return None
    v = np.clip(values, 0, hist.highest_trackable_value)
    binned = np.bincount(counts_index(hist, v), minlength=hist.counts_len)
    counts = counts_of(hist)
    counts += binned.astype(counts.dtype)
    nz = np.flatnonzero(binned)
    sparse = IntervalCounts(nz.astype(np.int32), binned[nz], int(v.min()), int(v.max()), int(v.size))
    hist.total_count += sparse.total
    hist.min_value = min(hist.min_value, sparse.min_ns)
    hist.max_value = max(hist.max_value, sparse.max_ns)
    return sparse


def add_sparse(hist: HdrHistogram, sparse: IntervalCounts) -> None:
    counts = counts_of(hist)
    np.add.at(counts, sparse.index, sparse.count.astype(counts.dtype))
    hist.total_count += sparse.total
    hist.min_value = min(hist.min_value, sparse.min_ns)
    hist.max_value = max(hist.max_value, sparse.max_ns)


def summarize(hist: HdrHistogram) -> dict:
    """count, p50/p90/p99/p99.9/max in microseconds (the bench/replay JSON schema)."""
    n = hist.get_total_count()
    if n == 0:
        return {"count": 0, "p50_us": None, "p90_us": None, "p99_us": None, "p999_us": None, "max_us": None}
    vals = hist.get_percentile_to_value_dict(list(PERCENTILES))
    return {
        "count": n,
        "p50_us": vals[50.0] / 1e3,
        "p90_us": vals[90.0] / 1e3,
        "p99_us": vals[99.0] / 1e3,
        "p999_us": vals[99.9] / 1e3,
        "max_us": hist.get_max_value() / 1e3,
    }


class SampleBuffer:
    """Preallocated raw samples (int64 ns) of one stage between folds."""

    __slots__ = ("values", "n", "capacity")

    def __init__(self, capacity: int) -> None:
        self.values = np.zeros(capacity, dtype=np.int64)
        self.n = 0
        self.capacity = capacity

    def add(self, value_ns: int) -> None:
        n = self.n
        if n < self.capacity:
            self.values[n] = value_ns
            self.n = n + 1

    def add_many(self, values_ns: np.ndarray) -> None:
        n = self.n
        k = min(values_ns.size, self.capacity - n)
        if k > 0:
            self.values[n:n + k] = values_ns[:k]
            self.n = n + k

    @property
    def full(self) -> bool:
        return self.n >= self.capacity

    def take(self) -> np.ndarray:
        """The samples so far (a view, valid until the next add) and reset."""
        n, self.n = self.n, 0
        return self.values[:n]


class StageHistograms:
    """Raw buffers, interval counts and cumulative HDR histograms for a fixed list of stages.

    `fold()` moves raw samples into both the cumulative histogram and the
    current interval's counts (cheap, vectorised: the hot loop calls it when
    idle or when a buffer fills); `take_interval()` returns the interval as
    sparse counts for shipping and starts a new one.
    """

    def __init__(self, stages=SERVICE_STAGES, capacity: int = 65536,
                 highest_ns: int = DEFAULT_HIGHEST_NS, digits: int = DEFAULT_DIGITS) -> None:
        self.stages = tuple(stages)
        self.buffers = {s: SampleBuffer(capacity) for s in self.stages}
        self.cumulative = {s: new_histogram(highest_ns, digits) for s in self.stages}
        n = self.cumulative[self.stages[0]].counts_len
        self._interval = {s: np.zeros(n, dtype=np.int64) for s in self.stages}
        self._interval_minmax = {s: [0, 0, 0] for s in self.stages}  # min, max, total

    def any_full(self) -> bool:
        return any(b.full for b in self.buffers.values())

    def fold(self) -> None:
        for stage, buf in self.buffers.items():
            if buf.n == 0:
                continue
            sparse = record_array(self.cumulative[stage], buf.take())
            self._interval[stage][sparse.index] += sparse.count
            mm = self._interval_minmax[stage]
            mm[0] = sparse.min_ns if mm[2] == 0 else min(mm[0], sparse.min_ns)
            mm[1] = max(mm[1], sparse.max_ns)
            mm[2] += sparse.total

    def take_interval(self) -> dict[str, IntervalCounts]:
        """Fold, then return this interval's sparse counts per stage (stages with samples) and reset."""
        self.fold()
        out = {}
        for stage, counts in self._interval.items():
            mm = self._interval_minmax[stage]
            if mm[2] == 0:
                continue
            nz = np.flatnonzero(counts)
            out[stage] = IntervalCounts(nz.astype(np.int32), counts[nz].copy(), mm[0], mm[1], mm[2])
            counts[nz] = 0
            mm[0] = mm[1] = mm[2] = 0
        return out

    def summary(self) -> dict[str, dict]:
        self.fold()
        return {s: summarize(h) for s, h in self.cumulative.items()}


# --- wire form of interval counts (hot loop -> control process) -------------

def to_wire(sparse: IntervalCounts) -> WireIntervalCounts:
    return WireIntervalCounts(sparse.index.astype("<i4").tobytes(), sparse.count.astype("<i8").tobytes(),
                              sparse.min_ns, sparse.max_ns, sparse.total)


def from_wire(w: WireIntervalCounts) -> IntervalCounts:
    return IntervalCounts(np.frombuffer(w.index, "<i4"), np.frombuffer(w.count, "<i8"),
                          w.min_ns, w.max_ns, w.total)


TABLE_COLUMNS = (("count", "count"), ("p50", "p50_us"), ("p90", "p90_us"), ("p99", "p99_us"),
                 ("p99.9", "p999_us"), ("max", "max_us"))


def format_table(rows: dict[str, dict], title: str = "", *, unit: str = "µs") -> str:
    """The one percentile table of serve, bench and replay: plain text, one row per entry
    of `rows` (a `summarize` dict: count, then p50/p90/p99/p99.9/max in `unit`).

    Every column is as wide as its widest cell, so numbers are never cut or
    wrapped, whatever the terminal or pipe. Cells: ints with thousands
    separators, floats with one decimal, None/NaN as "-", strings as given
    (e.g. ratios such as "2.31x")."""

    def cell(v) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        if isinstance(v, bool) or isinstance(v, str):
            return str(v)
        if isinstance(v, int):
            return f"{v:,}"
        return f"{v:,.1f}"

    header = ["stage"] + [h if k == "count" else f"{h} {unit}" for h, k in TABLE_COLUMNS]
    body = [[name] + [cell(r.get(k)) for _, k in TABLE_COLUMNS] for name, r in rows.items()]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = [title] if title else []
    for row in [header, *body]:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
