"""The control process's view of the service: what the snapshots add up to.

Owned by the control process (one instance); fed one encoded `Snapshot` at
a time; read by the dashboard (JSON frames), the Prometheus collector and the
HDR log writer. Everything it keeps is bounded: one interval and one
cumulative histogram per stage (at most `MAX_STAGES` stages), and history
rings of fixed length.

A snapshot that does not decode or does not fit the histograms is counted as
bad and dropped whole: the control process must not be crashed, nor its
histograms corrupted, by a garbled or foreign message on its socket.
"""

from __future__ import annotations

import collections
import math
import re
import sys
from dataclasses import dataclass, field

import msgspec
from hdrh.histogram import HdrHistogram

from hft_infer.metrics import (
    SERVICE_STAGES,
    IntervalCounts,
    add_sparse,
    counts_of,
    from_wire,
    new_histogram,
)
from hft_infer.metrics.histograms import (
    NINES_TICKS,
    NINES_X,
    index_values,
    nines_curve_us,
    percentile_values,
)
from hft_infer.transport.stats import COUNTERS, GAUGES, Snapshot, decode_snapshot

MAX_STAGES = 16  # stages beyond this (a buggy or hostile sender) are refused
MAX_HIGHEST_NS = 86_400 * 10**9  # histogram range beyond a day is refused (memory, see _validate)
STAGE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")  # becomes an .hlog tag and a Prometheus label
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")  # counter/gauge names become Prometheus names
# Percentiles shown in the table and kept over time.
TABLE_PERCENTILES = (50.0, 90.0, 99.0, 99.9, 99.99)
HISTORY_PERCENTILES = (50.0, 99.0, 99.9)


class BadSnapshot(ValueError):
    pass


def _stats_us(hist: HdrHistogram, percentiles=TABLE_PERCENTILES) -> dict | None:
    n = int(hist.total_count)
    if n == 0:
        return None
    v = percentile_values(hist, percentiles)
    out = {"count": n}
    for p, x in zip(percentiles, v):
        out[_pkey(p)] = round(float(x) / 1e3, 3)
    out["max"] = round(hist.get_max_value() / 1e3, 3)
    return out


def _pkey(p: float) -> str:
    return "p" + (f"{p:g}".replace(".", "_"))  # 99.9 -> p99_9


@dataclass
class StageState:
    interval: HdrHistogram
    cumulative: HdrHistogram
    interval_start_s: float = 0.0
    interval_length_s: float = 0.0
    fresh: bool = False  # the last snapshot carried samples for this stage


@dataclass
class ServiceInfo:
    service: str = ""
    pid: int = 0
    engine: str = ""
    engine_reason: str = ""
    model_version: str = ""
    placement: dict = field(default_factory=dict)
    final: bool = False
    precision: str = ""


class Aggregator:
    def __init__(self, history_points: int = 600, stages=SERVICE_STAGES) -> None:
        self.history_points = history_points
        self.history: collections.deque[dict] = collections.deque(maxlen=history_points)
        self.stages: dict[str, StageState] = {}
        self._hist_shape: tuple[int, int] | None = None
        self._initial_stages = tuple(stages)
        self.info = ServiceInfo()
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.gauges: dict[str, float] = dict.fromkeys(GAUGES, 0.0)
        self.by_reason: dict[str, int] = {}
        self.rates: dict[str, float | None] = {"events_per_s": None, "decisions_per_s": None}
        self.snapshots_ok = 0
        self.snapshots_bad = 0
        self.last_bad_reason = ""
        self.service_restarts = 0
        self.last_snapshot_ts_s: float | None = None  # the snapshot's own end-of-interval time
        self.last_receipt_s: float | None = None  # when we got it (control process clock)
        self.last_interval_s = 1.0
        self._prev: tuple[int, int, int, int] | None = None  # pid, ts_ns, received, decided
        self.last_frame: dict | None = None
        self._shape_template: tuple[tuple[int, int], HdrHistogram] | None = None
        self._preload: dict[str, HdrHistogram] | None = None
        self.preloaded: list[str] = []

    def preload(self, cumulative: dict[str, HdrHistogram]) -> None:
        """Cumulative histograms an earlier control process logged for this run; added
        to ours at the first snapshot, if the service's histograms have the same layout."""
        self._preload = {k: h for k, h in list(cumulative.items())[:MAX_STAGES] if STAGE_RE.match(k)}

    # --- ingest ---------------------------------------------------------------

    def ingest(self, raw: bytes, now_s: float) -> Snapshot | None:
        """Fold one encoded snapshot in; returns it, or None (counted) when it is bad."""
        try:
            snap = decode_snapshot(raw)
            folded = self._validate(snap)
        except (msgspec.DecodeError, msgspec.ValidationError, BadSnapshot, ValueError) as e:
            self.snapshots_bad += 1
            self.last_bad_reason = str(e).splitlines()[0][:200]
            return None
        self._apply(snap, folded, now_s)
        self.snapshots_ok += 1
        return snap

    def _validate(self, snap: Snapshot) -> dict[str, IntervalCounts]:
        # A day at 5 digits is ~32 MB of counts per histogram: the most a sender may ask us to allocate.
        if not (1 <= snap.histogram_digits <= 5) or not (2 <= snap.histogram_highest_ns <= MAX_HIGHEST_NS):
            raise BadSnapshot(f"histogram shape {snap.histogram_highest_ns}/{snap.histogram_digits}")
        if snap.interval_ns <= 0:
            raise BadSnapshot(f"interval_ns {snap.interval_ns}")
        shape = (snap.histogram_highest_ns, snap.histogram_digits)
        template = self._template(shape)
        counts_len = template.counts_len
        top_ns = int(index_values(template)[1][-1])  # the largest value the histogram holds
        folded = {}
        known = set(self.stages)
        for stage, wire in snap.stages.items():
            if not STAGE_RE.match(stage):
                raise BadSnapshot(f"stage name {stage[:40]!r}")
            known.add(stage)
            if len(known) > MAX_STAGES:
                raise BadSnapshot(f"more than {MAX_STAGES} stages")
            ic = from_wire(wire)  # ValueError on a byte length that is not whole items
            if ic.index.shape != ic.count.shape:
                raise BadSnapshot(f"{stage}: {ic.index.size} indices, {ic.count.size} counts")
            if ic.index.size and (int(ic.index.min()) < 0 or int(ic.index.max()) >= counts_len):
                raise BadSnapshot(f"{stage}: bucket index out of range")
            if ic.count.size and int(ic.count.min()) < 0:
                raise BadSnapshot(f"{stage}: negative count")
            if int(ic.count.sum()) != ic.total or not (0 <= ic.min_ns <= ic.max_ns <= top_ns):
                raise BadSnapshot(f"{stage}: totals do not add up")
            folded[stage] = ic
        for name in (*snap.counters, *snap.gauges):
            if not NAME_RE.match(name):
                raise BadSnapshot(f"metric name {name[:40]!r}")
        return folded

    def _template(self, shape: tuple[int, int]) -> HdrHistogram:
        """An empty histogram of this shape (for its counts_len), kept for the next snapshot."""
        if self._shape_template is None or self._shape_template[0] != shape:
            self._shape_template = (shape, new_histogram(*shape))
        return self._shape_template[1]

    def _stage(self, name: str) -> StageState:
        st = self.stages.get(name)
        if st is None:
            shape = self._hist_shape
            st = self.stages[name] = StageState(new_histogram(*shape), new_histogram(*shape))
        return st

    def _apply(self, snap: Snapshot, folded: dict[str, IntervalCounts], now_s: float) -> None:
        shape = (snap.histogram_highest_ns, snap.histogram_digits)
        if shape != self._hist_shape:
            # A service restarted with other histogram settings: bucket indices
            # mean something else now, so start the histograms again.
            self._hist_shape = shape
            self.stages = {}
            for s in self._initial_stages:
                self._stage(s)
            preload, self._preload = self._preload, None
            for tag, h in (preload or {}).items():
                st = self._stage(tag)
                if (h.counts_len, h.unit_magnitude, h.sub_bucket_count) == (
                        st.cumulative.counts_len, st.cumulative.unit_magnitude, st.cumulative.sub_bucket_count):
                    st.cumulative.add(h)
                    self.preloaded.append(tag)
        restarted = self._prev is not None and (
            snap.pid != self._prev[0] or snap.counters.get("received", 0) < self._prev[2])
        if restarted:
            self.service_restarts += 1
        self.info = ServiceInfo(snap.service, snap.pid, snap.engine, snap.engine_reason, snap.model_version,
                                dict(snap.placement), snap.final, snap.precision)
        end_s = snap.ts_ns / 1e9
        length_s = snap.interval_ns / 1e9
        for st in self.stages.values():
            st.fresh = False
        for name, ic in folded.items():
            st = self._stage(name)
            counts_of(st.interval)[:] = 0  # hdrh's reset() loops in Python over every bucket
            st.interval.total_count = 0
            st.interval.min_value = sys.maxsize  # what hdrh's reset() sets
            st.interval.max_value = 0
            if ic.total:
                add_sparse(st.interval, ic)
                add_sparse(st.cumulative, ic)
            st.interval_start_s = end_s - length_s
            st.interval_length_s = length_s
            st.fresh = ic.total > 0
        self.counters = {k: int(v) for k, v in snap.counters.items()}
        self.gauges = {k: float(v) for k, v in snap.gauges.items()}
        self.by_reason = {str(k): int(v) for k, v in snap.rejected_by_reason.items()}
        received, decided = self.counters.get("received", 0), self.counters.get("decided", 0)
        if self._prev is not None and not restarted and snap.ts_ns > self._prev[1]:
            dt = (snap.ts_ns - self._prev[1]) / 1e9
            self.rates = {"events_per_s": (received - self._prev[2]) / dt,
                          "decisions_per_s": (decided - self._prev[3]) / dt}
        else:
            self.rates = {"events_per_s": None, "decisions_per_s": None}
        self._prev = (snap.pid, snap.ts_ns, received, decided)
        self.last_snapshot_ts_s = end_s
        self.last_receipt_s = now_s
        self.last_interval_s = length_s
        self.last_frame = self._build_frame(end_s)
        self.history.append(self.last_frame["point"])

    # --- views ----------------------------------------------------------------

    def fresh_intervals(self):
        """(stage, start epoch s, length s, histogram) of the last snapshot's stages with samples."""
        return [(name, st.interval_start_s, st.interval_length_s, st.interval)
                for name, st in self.stages.items() if st.fresh]

    def _build_frame(self, ts_s: float) -> dict:
        stages = {}
        point_stages = {}
        for name, st in self.stages.items():
            interval = _stats_us(st.interval) if st.fresh else None
            cumulative = _stats_us(st.cumulative)
            stages[name] = {
                "interval": interval,
                "cumulative": cumulative,
                "curve_interval": nines_curve_us(st.interval) if st.fresh else None,
                "curve_cumulative": nines_curve_us(st.cumulative),
            }
            if interval is not None:
                point_stages[name] = [interval[_pkey(p)] for p in HISTORY_PERCENTILES]
        point = {
            "t": round(ts_s, 3),
            "events_per_s": _round(self.rates["events_per_s"]),
            "decisions_per_s": _round(self.rates["decisions_per_s"]),
            "queue_depth": self.gauges.get("queue_depth"),
            "stages": point_stages,
        }
        return {
            "type": "frame",
            "ts": round(ts_s, 3),
            "interval_s": self.last_interval_s,
            "service": msgspec.to_builtins(self.info),
            "counters": self.counters,
            "gauges": self.gauges,
            "by_reason": self.by_reason,
            "rates": {k: _round(v) for k, v in self.rates.items()},
            "stages": stages,
            "point": point,
            "control": self.control_counts(),
        }

    def control_counts(self) -> dict:
        return {"snapshots_ok": self.snapshots_ok, "snapshots_bad": self.snapshots_bad,
                "service_restarts": self.service_restarts, "last_bad_reason": self.last_bad_reason}

    def hello(self) -> dict:
        """What a newly connected page needs: the layout constants, the history and the last frame."""
        return {
            "type": "hello",
            "nines_x": [float(x) for x in NINES_X],
            "nines_ticks": NINES_TICKS,
            "history_points": self.history_points,
            "history_percentiles": HISTORY_PERCENTILES,
            "table_percentiles": TABLE_PERCENTILES,
            "history": list(self.history),
            "frame": self.last_frame,
        }

    def status(self, now_s: float) -> dict:
        """Liveness of the feed, sent between frames so the page can say 'no data'."""
        age = None if self.last_receipt_s is None else round(now_s - self.last_receipt_s, 1)
        # Three missed intervals (at least 3 s) before calling the service silent.
        stale = age is None or age > max(3.0, 3 * self.last_interval_s)
        return {"type": "status", "age_s": age, "live": not stale and not self.info.final,
                "final": self.info.final, "control": self.control_counts()}


def _round(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return round(x, 1)

