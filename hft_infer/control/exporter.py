"""Prometheus `/metrics` from the aggregator's state, rendered at scrape time.

A custom collector on a private registry (no module-level registry: the
control process owns its state), so a scrape always reflects the last
snapshot and nothing is copied between snapshots. Names start with
`hft_infer_` and carry their unit: `_total` counts events, `_seconds`,
`_bytes`. Service counters keep the service's own values (they restart
from 0 when the service restarts, which Prometheus's rate() handles as a
counter reset); latency histograms are the control process's cumulative
HDR histograms since the run's log began.
"""

from __future__ import annotations

import time

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector

from hft_infer.control.aggregator import Aggregator
from hft_infer.metrics.histograms import (
    approx_sum_ns,
    count_at_or_below,
    percentile_values,
)

SUMMARY_QUANTILES = (0.5, 0.9, 0.99, 0.999, 0.9999)
# Histogram bucket bounds: 1-2-5 from 1 µs to 1 s (`le` in seconds).
BUCKET_BOUNDS_NS = tuple(int(m * 10 ** e) for e in range(3, 9) for m in (1, 2, 5)) + (1_000_000_000,)

_COUNTER_HELP = {
    "received": "Events read from the feed (valid or not; heartbeats excluded)",
    "decided": "Events that produced a decision",
    "shed": "Events shed before their step (stale or queue full)",
    "conflated": "Events whose trigger a newer event of the same instrument replaced",
    "rejected": "Events rejected as invalid",
    "egress_dropped": "Decisions or status messages not sent because a subscriber pipe was full",
    "control_dropped": "Snapshots the service could not send to this control process",
    "seq_gaps": "Events missing according to per-instrument sequence numbers",
    "heartbeats": "Heartbeats read from the feed",
    "batches": "Model steps",
}
_GAUGE_HELP = {
    "queue_depth": "Requests waiting in the scheduler",
    "batch_wait_us": "Current batching wait of the window/adaptive policies",
    "last_batch_size": "Requests in the last model step",
    "rss_bytes": "Resident memory of the service process",
}


class ServiceCollector:
    def __init__(self, agg: Aggregator) -> None:
        self.agg = agg

    def describe(self):  # the set of names depends on what the service sends
        return []

    def collect(self):
        agg = self.agg
        for name, value in agg.counters.items():
            yield CounterMetricFamily(f"hft_infer_{name}", _COUNTER_HELP.get(name, f"Service counter {name}"),
                                      value=value)
        reasons = CounterMetricFamily("hft_infer_rejected_by_reason",
                                      "Rejected and shed events by reason (STALE, QUEUE_FULL are shed)",
                                      labels=["reason"])
        for reason, value in sorted(agg.by_reason.items()):
            reasons.add_metric([reason], value)
        yield reasons
        for name, value in agg.gauges.items():
            metric, scale = _gauge_name(name)
            yield GaugeMetricFamily(metric, _GAUGE_HELP.get(name, f"Service gauge {name}"), value=value * scale)

        info = agg.info
        yield InfoMetricFamily("hft_infer_service", "The service sending snapshots",
                               value={"service": info.service, "pid": str(info.pid), "engine": info.engine,
                                      "engine_reason": info.engine_reason[:200],
                                      "model_version": info.model_version})
        age = GaugeMetricFamily("hft_infer_snapshot_age_seconds",
                                "Seconds since the last snapshot arrived (NaN before the first)")
        age.add_metric([], float("nan") if agg.last_receipt_s is None else time.time() - agg.last_receipt_s)
        yield age
        snaps = CounterMetricFamily("hft_infer_control_snapshots", "Snapshots received by the control process",
                                    labels=["result"])
        snaps.add_metric(["ok"], agg.snapshots_ok)
        snaps.add_metric(["bad"], agg.snapshots_bad)
        yield snaps
        yield CounterMetricFamily("hft_infer_service_restarts", "Service restarts seen (new pid or counters reset)",
                                  value=agg.service_restarts)

        summary = Metric("hft_infer_stage_latency_seconds",
                         "Latency per stage since the run began (quantiles from HDR histograms; "
                         "sum from bucket midpoints)", "summary")
        hist = HistogramMetricFamily("hft_infer_stage_latency_histogram_seconds",
                                     "Latency per stage since the run began (HDR histogram folded into buckets)",
                                     labels=["stage"])
        for stage, st in agg.stages.items():
            h = st.cumulative
            n = int(h.total_count)
            total_s = approx_sum_ns(h) / 1e9
            if n:
                qs = percentile_values(h, [q * 100 for q in SUMMARY_QUANTILES])
                for q, v in zip(SUMMARY_QUANTILES, qs):
                    summary.add_sample("hft_infer_stage_latency_seconds", {"stage": stage, "quantile": repr(q)},
                                       float(v) / 1e9)
            summary.add_sample("hft_infer_stage_latency_seconds_count", {"stage": stage}, n)
            summary.add_sample("hft_infer_stage_latency_seconds_sum", {"stage": stage}, total_s)
            le = count_at_or_below(h, BUCKET_BOUNDS_NS)
            buckets = [(_fmt_le(b), int(c)) for b, c in zip(BUCKET_BOUNDS_NS, le)] + [("+Inf", n)]
            hist.add_metric([stage], buckets, total_s)
        yield summary
        yield hist


def _gauge_name(name: str) -> tuple[str, float]:
    """Prometheus name and scale of a service gauge: base units (seconds), unit last."""
    if name.endswith("_us"):
        return f"hft_infer_{name[:-3]}_seconds", 1e-6
    if name.endswith("_ns"):
        return f"hft_infer_{name[:-3]}_seconds", 1e-9
    return f"hft_infer_{name}", 1.0


def _fmt_le(bound_ns: int) -> str:
    return repr(bound_ns / 1e9)


def build_registry(agg: Aggregator) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServiceCollector(agg))
    # The control process's own CPU and memory, to watch that it stays bounded.
    ProcessCollector(namespace="hft_infer_control", registry=registry)
    return registry
