"""Prometheus `/metrics` from the aggregator's state, rendered at scrape time.

A custom collector on a private registry (no module-level registry: the
control process owns its state), so a scrape always reflects the last
snapshot and nothing is copied between snapshots. Names follow Prometheus's
conventions, as `promtool check metrics` enforces them (a test runs it on a
live scrape): every name starts with `hft_infer_`, counters end in `_total`,
values are in base units named last (`_seconds`, `_bytes`), and no name
carries its type. Service counters keep the service's own values (they
restart from 0 when the service restarts, which Prometheus's rate() handles
as a counter reset); latency is the control process's cumulative HDR
histograms since the run's log began.

Stage latency is ONE histogram family, `hft_infer_stage_latency_seconds{stage}`,
and no summary: quantiles of a summary cannot be aggregated across stages,
shards or time ranges, while `histogram_quantile(q, sum by (le, stage)
(rate(..._bucket[1m])))` can. Exact percentiles (HDR, 0.1 %) stay on the
dashboard, in `.hlog`/`.hgrm` files and in `service.json`.
"""

from __future__ import annotations

import time

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.process_collector import ProcessCollector

from hft_infer.accounting import SHED_REASON_NAMES
from hft_infer.control.aggregator import Aggregator
from hft_infer.metrics.histograms import approx_sum_ns, count_at_or_below

# Histogram bucket bounds (`le`, exported in seconds), six per decade (1, 1.5, 2, 3, 5, 7) from
# 1 µs to 10 s. Log-spaced because the stages span six decades: decode and publish take a few
# µs, a CPU model step tens to hundreds of µs, a stalled loop or a GC pause milliseconds to
# seconds; equal relative width keeps histogram_quantile's linear interpolation within a
# bucket (at most 1.67x wide) equally good at each. With 1-2-5 (2.5x wide) a 30 µs p99 could
# only be placed between 20 and 50 µs; ten per decade would cost ~70 series per stage.
# 10 s: the loop watchdog's order of magnitude; slower samples still count in +Inf.
BUCKET_BOUNDS_NS = tuple(int(m * 10 ** e) for e in range(3, 10) for m in (1, 1.5, 2, 3, 5, 7)) + (10 ** 10,)

COUNTER_HELP = {
    "received": "Events read from the feed (valid or not; heartbeats excluded)",
    "decided": "Events that produced a decision",
    "shed": "Events shed instead of decided (stale, queue full, engine failure)",
    "conflated": "Events whose trigger a newer event of the same instrument replaced",
    "rejected": "Events rejected as invalid",
    "egress_dropped": "Decisions or status messages not sent because a subscriber pipe was full",
    "control_dropped": "Snapshots the service could not send to this control process",
    "seq_gaps": "Gaps (jumps forward) in per-instrument sequence numbers",
    "seq_missing": "Events missing in sequence-number gaps",
    "seq_resets": "Per-instrument sequences that restarted at 0 (publisher restarts)",
    "heartbeats": "Heartbeats read from the feed",
    "resets": "Reset messages applied",
    "batches": "Model steps",
    "ingest_disconnects": "Feed connections lost (and re-established) by the ingest socket",
    "overlapped": "Frames ingested while a model step was in flight",
    "coalesced_reads": "Ingest bursts put off while a full batch was queued, to read the feed in one go "
                       "(ingest.coalesce_us), or past capacity (ingest.read_gap_us)",
    "chained_steps": "Model steps submitted after the first of a loop iteration, while the engine took more and "
                     "slots were still queued (runner.chain_steps)",
    "hot_preemptions": "Times the kernel switched the hot (busy-polling) thread out while it could run: another "
                       "task on its core (placement, isolcpus)",
    "hot_runqueue_wait_us": "Time the hot thread waited on its core's run queue while another task ran",
    "stalls": "Loop iterations longer than metrics.stall_us (250 us by default); stall_<phase> says where their "
              "time went",
    "stall_ingest_us": "Time the loop's stalled iterations spent reading the feed",
    "stall_complete_us": "Time the loop's stalled iterations spent collecting and answering a step",
    "stall_submit_us": "Time the loop's stalled iterations spent forming and launching a step (a CPU step runs here)",
    "stall_other_us": "Time the loop's stalled iterations spent flushing answers, in housekeeping and folding",
    "stall_yield_us": "Time the loop's stalled iterations spent yielding to asyncio (timers, signals)",
}
GAUGE_HELP = {
    "queue_depth": "Requests waiting in the scheduler",
    "batch_wait_us": "Current batching wait of the window/adaptive policies",
    "last_batch_size": "Requests in the last model step",
    "rss_bytes": "Resident memory of the service process",
    "admit_depth": "Events one instrument may queue (stateful models: set by deadline admission, at most "
                   "max_pending_per_instrument)",
    "admit_margin_us": "Learned margin of deadline admission's expected wait (stateful models: grows when a step "
                       "picks stale events, fades to nothing while none do)",
    "feed_late_us": "How long the feed has arrived older than the deadline, every event shed at ingest and nothing "
                    "stepped (0: on time); the delay is upstream of the service",
}


class ServiceCollector:
    def __init__(self, agg: Aggregator) -> None:
        self.agg = agg

    def describe(self):  # the set of names depends on what the service sends
        return []

    def collect(self):
        agg = self.agg
        for name, value in agg.counters.items():
            metric, scale = metric_name(name)  # hot_runqueue_wait_us: hft_infer_hot_runqueue_wait_seconds_total
            yield CounterMetricFamily(metric, COUNTER_HELP.get(name, f"Service counter {name}"), value=value * scale)
        reasons = CounterMetricFamily("hft_infer_shed_or_rejected",
                                      "Shed and rejected events by reason (outcome: shed or rejected)",
                                      labels=["outcome", "reason"])
        for reason, value in sorted(agg.by_reason.items()):  # labelled with its outcome
            reasons.add_metric(["shed" if reason in SHED_REASON_NAMES else "rejected", reason], value)
        yield reasons
        for name, value in agg.gauges.items():
            metric, scale = metric_name(name)
            yield GaugeMetricFamily(metric, GAUGE_HELP.get(name, f"Service gauge {name}"), value=value * scale)

        info = agg.info
        yield InfoMetricFamily("hft_infer_service", "The service sending snapshots",
                               value={"service": info.service, "pid": str(info.pid), "engine": info.engine,
                                      "engine_reason": info.engine_reason[:200],
                                      "model_version": info.model_version, "precision": info.precision})
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

        hist = HistogramMetricFamily("hft_infer_stage_latency_seconds",
                                     "Latency per stage since the run began (HDR histogram folded into buckets; "
                                     "sum from bucket midpoints, within 0.1 %)", labels=["stage"])
        for stage, st in agg.stages.items():
            h = st.cumulative
            n = int(h.total_count)
            le = count_at_or_below(h, BUCKET_BOUNDS_NS)
            buckets = [(_fmt_le(b), int(c)) for b, c in zip(BUCKET_BOUNDS_NS, le)] + [("+Inf", n)]
            hist.add_metric([stage], buckets, approx_sum_ns(h) / 1e9)
        yield hist


def metric_name(name: str) -> tuple[str, float]:
    """Prometheus name and scale of a service counter or gauge: base units (seconds), unit last
    (a counter's `_total` is added by its family)."""
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
