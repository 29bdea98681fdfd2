"""Latency histograms: record cheaply on the hot path, fold in bulk elsewhere.

A leaf package (numpy, hdrhistogram and the wire types of `transport`):
`replay` and the control process use it too. `hlog` reads and writes HDR
interval logs and percentile files; `histograms` reads histograms back
(percentiles, curves) for the control process and reports.

Why not `HdrHistogram.record_value` per event: it costs ~1.2 us per value in
Python (measured on the 2-core dev VM), more than the model step across six
stages. The hot loop instead writes raw integer nanoseconds into a
preallocated numpy buffer per stage (one sample per batch or burst where it
can: `SampleBuffer.add_many`) and folds them into HdrHistograms in bounded
chunks (`StageHistograms.fold_some`), computing the HDR bucket index of every
sample at once with numpy (`counts_index`) and touching only the range of
buckets that was hit (a `bincount` over [min index, max index], never over
the whole counts array: a full-width fold cost 1.5-5.7 ms per stage on the
H200 host). The result is bit-identical to `record_value`
(tests/unit/test_metrics.py checks).

Interval histograms travel to the control process as sparse counts
(`IntervalCounts`: the non-zero bucket indices and their counts), which the
receiver adds into its own histograms; `HdrHistogram.encode()` (zlib over the
counts) would cost the hot loop about a millisecond per stage per interval.
"""

from __future__ import annotations

import array
import math
from dataclasses import dataclass

import numpy as np
from hdrh.histogram import HdrHistogram

from hft_infer.transport.stats import WireIntervalCounts

# Stages recorded by the service, in pipeline order (DESIGN.md, Latency stages):
#   wire      publisher send -> receive, per decided event
#   ingest    receive -> queued, per event, averaged over each burst (one sample per burst)
#   queue     receive -> batch submitted, per decided event
#   step      submit -> outputs collected, per batch (includes time the loop spent elsewhere)
#   publish   collect -> answers sent, per batch
#   service   receive -> decision sent, per decided event
#   loop_gap  the longest gap between two loop iterations within each 100 us of loop time
SERVICE_STAGES = ("wire", "ingest", "queue", "step", "publish", "service", "loop_gap")
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
    With e = bit_length(v | sub_bucket_mask) and m = sub_bucket_half_count_magnitude,
    hdrhistogram's bucket is e - unit_magnitude - (m + 1) and its sub-bucket
    v >> (e - (m + 1)); the index ((bucket + 1) << m) + sub_bucket - half_count is
    rearranged below as (e << m) + sub_bucket - constant: eight numpy calls, each
    ~1 µs on a small chunk, which is what an idle fold of a few samples costs.
    """
    v = values.astype(np.int64, copy=False)
    m = hist.sub_bucket_half_count_magnitude
    # bit_length(v | sub_bucket_mask) via frexp: v = f * 2**e with 0.5 <= f < 1.
    e = np.frexp((v | hist.sub_bucket_mask).astype(np.float64))[1].astype(np.int64)
    sub_bucket = v >> (e - (m + 1))
    e <<= m
    e += sub_bucket
    e -= ((hist.unit_magnitude + m) << m) + hist.sub_bucket_half_count
    return e


@dataclass
class IntervalCounts:
    """Sparse form of one stage's interval histogram (what the control plane receives)."""

    index: np.ndarray  # int32 bucket indices with non-zero counts
    count: np.ndarray  # int64 counts
    min_ns: int
    max_ns: int
    total: int


def _bin(hist: HdrHistogram, values: np.ndarray) -> tuple[int, np.ndarray, int, int]:
    """(first index, counts over [first, last] hit bucket, min, max) of clamped values."""
    vmin, vmax = int(values.min()), int(values.max())
    top = hist.highest_trackable_value
    if vmin < 0 or vmax > top:  # rare: np.clip alone costs ~12 µs, more than the rest of a small fold
        values = np.clip(values, 0, top)
        vmin, vmax = min(max(vmin, 0), top), min(max(vmax, 0), top)
    idx = counts_index(hist, values)
    lo = hist._counts_index_for(vmin)  # the index grows with the value: the lowest is vmin's
    return lo, np.bincount(idx - lo), vmin, vmax


def record_array(hist: HdrHistogram, values: np.ndarray) -> IntervalCounts | None:
    """Record every value of an int array into `hist`; returns the sparse counts added.

    Negative values (clock steps) and values past the histogram's range are
    clamped to its range rather than lost, so counts always add up. Cost is
    O(values + range of buckets hit), not O(counts_len).
    """
    if values.size == 0:
        return None
    lo, binned, vmin, vmax = _bin(hist, values)
    counts = counts_of(hist)
    counts[lo:lo + binned.size] += binned.astype(counts.dtype)
    nz = np.flatnonzero(binned)
    sparse = IntervalCounts((nz + lo).astype(np.int32), binned[nz], vmin, vmax, int(values.size))
    hist.total_count += sparse.total
    hist.min_value = min(hist.min_value, vmin)
    hist.max_value = max(hist.max_value, vmax)
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
    """Raw samples (integer ns) of one stage between folds.

    An `array.array('q')`: the hot loop extends it with the samples of a whole
    batch (`values.extend([...])`, tens of ns per sample and no numpy call per
    batch, which costs microseconds for a handful of values), and the fold
    reads a chunk through `numpy.frombuffer` without converting each value
    (a list of 4096 ints took ~150 µs to become an array; measured on the dev
    VM). Every sample is a difference of int64 clock values, so it fits.
    `capacity` is the pressure mark, not a hard bound: past half of it the loop
    folds a chunk per iteration even when busy. Nothing is dropped. A large
    step's samples go in as numpy blocks to subtract at the next read
    (`add_differences`), counted in `n` meanwhile.
    """

    __slots__ = ("values", "capacity", "_deferred", "_n_deferred")

    def __init__(self, capacity: int) -> None:
        self.values = array.array("q")
        self.capacity = capacity
        self._deferred: list[tuple] = []  # (minuend, subtrahend, unless_zero): add_differences
        self._n_deferred = 0  # samples they hold (at most: unless_zero may leave some out)

    @property
    def n(self) -> int:
        return len(self.values) + self._n_deferred

    def add(self, value_ns: int) -> None:
        self.values.append(value_ns)

    def add_many(self, values_ns) -> None:
        if isinstance(values_ns, np.ndarray):
            self.values.frombytes(values_ns.astype(np.int64, copy=False).tobytes())
        else:
            self.values.extend(values_ns)

    def add_differences(self, minuend, subtrahend: np.ndarray, unless_zero: bool = False) -> None:
        """Samples `minuend - subtrahend` (a Python int or an int64 array, less an int64 array), worked
        out at the next read (`take`, `take_last`, `samples`), not now: a large step's queue, wire
        and service samples go in as one block each, and the subtractions run together in the
        fold, off the step (each numpy call in the loop's step costs ~1-2 µs on the dev VM, several
        times its cost in a run of them; the fold's share of a step of 64: 49-91 ns a decision on
        the H100 hosts, BENCHMARKS.md wave 40).
        `unless_zero`: no sample where `subtrahend` is 0 (an event without a send time has no
        wire sample). The caller must not write the arrays afterwards."""
        self._deferred.append((minuend, subtrahend, unless_zero))
        self._n_deferred += len(subtrahend)

    def _settle(self) -> None:
        """Work out the deferred samples: blocks of one kind (int minuends, or arrays; one
        `unless_zero`), as a stage's are, in a few numpy calls over all of them at once; else
        block by block."""
        deferred = self._deferred
        first = deferred[0]
        kind, unless_zero = type(first[0]) is int, first[2]
        if len(deferred) > 1 and all((type(a) is int) is kind and uz is unless_zero for a, _, uz in deferred):
            subtrahend = np.concatenate([b for _, b, _ in deferred])
            if kind:
                minuend = np.repeat(np.array([a for a, _, _ in deferred], np.int64), [len(b) for _, b, _ in deferred])
            else:
                minuend = np.concatenate([a for a, _, _ in deferred])
            blocks = ((minuend, subtrahend, unless_zero),)
        else:
            blocks = deferred
        values = self.values
        for minuend, subtrahend, unless_zero in blocks:
            d = minuend - subtrahend
            if unless_zero and not subtrahend.all():
                d = d[subtrahend != 0]
            values.frombytes(memoryview(d).cast("B"))  # no copy to bytes first (frombytes takes byte items only)
        deferred.clear()
        self._n_deferred = 0

    def samples(self) -> array.array:
        """Every sample so far (the deferred ones worked out), not taken."""
        if self._deferred:
            self._settle()
        return self.values

    @property
    def full(self) -> bool:
        return self.n >= self.capacity

    def take(self) -> np.ndarray:
        """All samples so far as int64, and reset."""
        out = np.frombuffer(self.samples(), dtype=np.int64).copy()
        del self.values[:]
        return out

    def take_last(self, k: int) -> np.ndarray:
        """Remove the newest min(k, n) samples and return them as int64 (a histogram does not
        care about their order)."""
        v = self.samples()
        if k >= len(v):
            return self.take()
        out = np.frombuffer(v, dtype=np.int64)[-k:].copy()
        del v[-k:]
        return out


def _fill(item: tuple[str, SampleBuffer]) -> int:
    return item[1].n


class StageHistograms:
    """Raw buffers, interval counts and cumulative HDR histograms for a fixed list of stages.

    `fold_some(max_samples)` moves at most that many raw samples into the
    cumulative histograms and the current interval's counts: the hot loop
    calls it once per iteration while a buffer is more than half full, so no
    fold ever costs more than a chunk (FOLD_CHUNK samples, ~60 us on the dev
    VM). When idle it calls `fold_one(IDLE_FOLD_MIN)`: one stage, and only
    once that stage has IDLE_FOLD_MIN samples. A fold's cost is mostly fixed
    (~15-40 us per stage on the dev VM for 1 sample or 1,000): folding every
    stage whenever the loop went idle put ~260 us in front of the next event
    at low rates (the H200 host's loop_gap p50 of ~100 us at 10k events/s in
    wave 6). `take_interval()` folds what is left, then returns the interval as
    sparse counts for shipping and starts a new one; its cost is bounded by
    the range of buckets the interval touched.
    """

    FOLD_CHUNK = 4096
    IDLE_FOLD_MIN = 1024  # fold a stage when idle once it holds this many samples (or at the interval's end)

    def __init__(self, stages=SERVICE_STAGES, capacity: int = 65536,
                 highest_ns: int = DEFAULT_HIGHEST_NS, digits: int = DEFAULT_DIGITS) -> None:
        self.stages = tuple(stages)
        self.buffers = {s: SampleBuffer(capacity) for s in self.stages}
        self.cumulative = {s: new_histogram(highest_ns, digits) for s in self.stages}
        n = self.cumulative[self.stages[0]].counts_len
        self._interval = {s: np.zeros(n, dtype=np.int64) for s in self.stages}
        # per stage: [min ns, max ns, total, lowest index touched, highest index touched + 1]
        self._interval_meta = {s: [0, 0, 0, n, 0] for s in self.stages}
        self._half = max(1, capacity // 2)

    def pressure(self) -> bool:
        """True when some buffer is more than half full: fold a chunk now, even if busy."""
        return any(b.n >= self._half for b in self.buffers.values())

    def pending(self) -> int:
        return sum(b.n for b in self.buffers.values())

    def fold_some(self, max_samples: int = FOLD_CHUNK) -> int:
        """Fold up to `max_samples` raw samples (fullest stage first); returns how many."""
        done = 0
        for stage, buf in sorted(self.buffers.items(), key=lambda kv: -kv[1].n):
            if done >= max_samples or buf.n == 0:
                continue
            chunk = buf.take_last(max_samples - done)
            if chunk.size:  # deferred samples may all have been left out (add_differences' unless_zero)
                self._fold_chunk(stage, chunk)
            done += chunk.size
        return done

    def fold_one(self, min_samples: int = 1, max_samples: int = FOLD_CHUNK) -> int:
        """Fold the fullest stage's newest samples (at most `max_samples`) if it holds at least
        `min_samples`; returns how many. The idle loop's fold: one stage at a time, so that input
        arriving meanwhile waits for one bounded fold, not for every stage's."""
        stage, buf = max(self.buffers.items(), key=_fill)
        if buf.n < max(1, min_samples):
            return 0
        chunk = buf.take_last(max_samples)
        if chunk.size:  # as fold_some
            self._fold_chunk(stage, chunk)
        return chunk.size

    def fold(self) -> None:
        """Fold everything (cold paths: interval shipping, summaries, exit)."""
        while self.fold_some(1 << 30):
            pass

    def _fold_chunk(self, stage: str, values: np.ndarray) -> None:
        hist = self.cumulative[stage]
        lo, binned, vmin, vmax = _bin(hist, values)
        hi = lo + binned.size
        counts = counts_of(hist)
        counts[lo:hi] += binned.astype(counts.dtype)
        hist.total_count += int(values.size)
        hist.min_value = min(hist.min_value, vmin)
        hist.max_value = max(hist.max_value, vmax)
        self._interval[stage][lo:hi] += binned
        meta = self._interval_meta[stage]
        meta[0] = vmin if meta[2] == 0 else min(meta[0], vmin)
        meta[1] = max(meta[1], vmax)
        meta[2] += int(values.size)
        meta[3] = min(meta[3], lo)
        meta[4] = max(meta[4], hi)

    def take_interval(self) -> dict[str, IntervalCounts]:
        """Fold, then return this interval's sparse counts per stage (stages with samples) and reset."""
        self.fold()
        out = {}
        for stage, counts in self._interval.items():
            meta = self._interval_meta[stage]
            if meta[2] == 0:
                continue
            lo, hi = meta[3], meta[4]
            window = counts[lo:hi]
            nz = np.flatnonzero(window)
            out[stage] = IntervalCounts((nz + lo).astype(np.int32), window[nz].copy(), meta[0], meta[1], meta[2])
            window[:] = 0
            meta[:] = [0, 0, 0, counts.size, 0]
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
