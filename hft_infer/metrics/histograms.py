"""Percentile queries over HdrHistograms, vectorised for the control process.

The `hdrhistogram` package answers percentile queries with a Python loop over
the counts array (27,648 entries at 1 ns .. 60 s, 3 digits): ~2 ms per query
list on the 2-core dev VM, and the dashboard asks 41 curve points of a dozen
histograms every second. Here the per-index values are computed once per
histogram shape with numpy and queries become a cumsum plus a searchsorted.
Results equal hdrh's own (`get_percentile_to_value_dict`,
`get_highest_equivalent_value`); tests/unit/test_hlog.py checks every index.
"""

from __future__ import annotations

import functools

import numpy as np
from hdrh.histogram import HdrHistogram

from hft_infer.metrics import counts_of

# The x axis of HDR percentile plots: x = -log10(1 - p), so 90% sits at 1,
# 99% at 2, 99.9% at 3 ("nines"). 0 .. 5 in eighths: up to 99.999%.
NINES_X = np.arange(0.0, 5.0 + 1e-9, 0.125)
NINES_PERCENTILES = 100.0 * (1.0 - 10.0 ** -NINES_X)
NINES_TICKS = ((0.0, "0%"), (0.30103, "50%"), (1.0, "90%"), (2.0, "99%"), (3.0, "99.9%"),
               (4.0, "99.99%"), (5.0, "99.999%"))


@functools.lru_cache(maxsize=8)
def _index_values(counts_len: int, sub_bucket_half_count_magnitude: int,
                  unit_magnitude: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lowest, highest, median) equivalent value of every counts index (hdrh's formulas)."""
    idx = np.arange(counts_len, dtype=np.int64)
    half = 1 << sub_bucket_half_count_magnitude
    bucket = (idx >> sub_bucket_half_count_magnitude) - 1
    sub = (idx & (half - 1)) + half
    first = bucket < 0  # the first half-bucket pair is addressed as bucket 0
    sub = np.where(first, sub - half, sub)
    bucket = np.where(first, 0, bucket)
    lowest = sub << (bucket + unit_magnitude)
    size = np.left_shift(np.int64(1), bucket + unit_magnitude)
    out = (lowest, lowest + size - 1, lowest + (size >> 1))
    for a in out:  # shared by every histogram of this shape: never written
        a.setflags(write=False)
    return out


def index_values(hist: HdrHistogram) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _index_values(hist.counts_len, hist.sub_bucket_half_count_magnitude, hist.unit_magnitude)


def percentile_values(hist: HdrHistogram, percentiles) -> np.ndarray:
    """Value (ns, float64) at each percentile; NaN for an empty histogram.

    Same convention as hdrh: the target count is round(p * total / 100), at
    least 1; the answer is the highest value equivalent to the bucket that
    reaches it (the lowest for p = 0).
    """
    pct = np.minimum(np.asarray(percentiles, dtype=np.float64), 100.0)
    total = int(hist.total_count)
    if total <= 0:
        return np.full(pct.shape, np.nan)
    cum = np.cumsum(counts_of(hist), dtype=np.int64)
    target = np.maximum((pct * total / 100.0 + 0.5).astype(np.int64), 1)
    # A histogram whose counts sum below total_count (should not happen) answers
    # from its last bucket rather than out of range.
    i = np.minimum(np.searchsorted(cum, target, side="left"), len(cum) - 1)
    lowest, highest, _ = index_values(hist)
    return np.where(pct > 0, highest[i], lowest[i]).astype(np.float64)


def nines_curve_us(hist: HdrHistogram) -> list[float] | None:
    """The percentile distribution at NINES_PERCENTILES in µs, or None when empty.

    Percentiles past the resolution of the sample (p > 1 - 1/count) are
    reported as the histogram's maximum, which is what they are.
    """
    if hist.total_count <= 0:
        return None
    v = percentile_values(hist, NINES_PERCENTILES)
    return [round(float(x) / 1e3, 3) for x in v]


def count_at_or_below(hist: HdrHistogram, limits_ns) -> np.ndarray:
    """Samples whose bucket lies entirely at or below each limit (cumulative `le` counts)."""
    _, highest, _ = index_values(hist)
    cum = np.cumsum(counts_of(hist), dtype=np.int64)
    # number of buckets whose highest equivalent value <= limit
    k = np.searchsorted(highest, np.asarray(limits_ns, dtype=np.int64), side="right")
    return np.where(k > 0, cum[np.maximum(k - 1, 0)], 0)


def approx_sum_ns(hist: HdrHistogram) -> float:
    """Sum of samples from bucket midpoints (what hdrh's mean uses): within the
    histogram's precision (0.1 % at 3 digits). The wire carries no exact sum."""
    _, _, median = index_values(hist)
    c = counts_of(hist)
    nz = np.flatnonzero(c)  # a few hundred of the 27,648 buckets; float64: no int64 overflow
    return float(np.dot(c[nz].astype(np.float64), median[nz].astype(np.float64)))
