"""What the hot loop ships to the control process, once per stats interval.

Transport: the control process binds a PULL socket at
`metrics.control_endpoint`; the hot loop connects a PUSH with ZMQ_IMMEDIATE
and a small HWM and sends with NOBLOCK, so a slow, dead or restarting control
process costs the hot loop one failed send (counted as
`control_dropped`), never a wait. A restarted control process rebinds the same
endpoint and the PUSH reconnects by itself.

One `Snapshot` per interval. Latency stages travel as sparse HDR counts
(`WireIntervalCounts`, made by `hft_infer.metrics.to_wire`); the receiver adds them into its own
interval and cumulative histograms (`metrics.add_sparse`). Counters are
cumulative since the service started, so a dropped snapshot loses no counts.
"""

from __future__ import annotations

import msgspec

# Cumulative counters in every snapshot (names are also the Prometheus names'
# stems: hft_infer_<name>_total).
COUNTERS = (
    "received",  # events read from the feed (valid or not; heartbeats excluded)
    "decided",
    "shed",
    "conflated",
    "rejected",
    "egress_dropped",  # decisions/status not sent: subscriber pipe full
    "control_dropped",  # snapshots not sent to the control process
    "seq_gaps",  # gaps in per-instrument sequence numbers (jumps forward)
    "seq_missing",  # events missing in those gaps (saturates at 2**63-1)
    "seq_resets",  # sequences that restarted at 0
    "heartbeats",
    "resets",  # Reset messages applied
    "batches",
    "ingest_disconnects",  # feed connections lost by the ingest socket (then re-established)
    "overlapped",  # frames ingested while a model step was in flight
    "coalesced_reads",  # bursts the loop put off (ingest.coalesce_us, read_gap_us) to read in one go
    "chained_steps",  # steps submitted after the first of a loop iteration (runner.chain_steps)
    "hot_preemptions",  # the hot thread switched out while runnable (hft_infer/hot_thread_stats.py)
    "hot_runqueue_wait_us",  # ... and how long it waited to run again
    # the loop's iterations past 250 µs and the time each phase took in them (hft_infer/loop_stalls.py)
    "stalls", "stall_ingest_us", "stall_complete_us", "stall_submit_us", "stall_other_us", "stall_yield_us",
)

# Point-in-time gauges.
GAUGES = (
    "queue_depth",  # pending requests
    "batch_wait_us",  # current batching wait (window/adaptive policies)
    "last_batch_size",
    "rss_bytes",
    "admit_depth",  # events one instrument may queue (stateful models: deadline admission's depth)
    "admit_margin_us",  # deadline admission's learned margin on the expected wait (scheduler.py)
    "feed_late_us",  # how long the feed has arrived too old to decide (hft_infer/late_feed.py); 0: on time
)


class WireIntervalCounts(msgspec.Struct, array_like=True, frozen=True):
    """One stage's interval histogram as sparse HDR counts (hft_infer.metrics.to_wire)."""

    index: bytes  # int32 little-endian bucket indices with non-zero counts
    count: bytes  # int64 little-endian counts
    min_ns: int
    max_ns: int
    total: int


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    service: str  # service.name
    pid: int
    ts_ns: int  # end of the interval, ns since the epoch
    interval_ns: int  # length of the interval this snapshot covers
    engine: str  # eager | graph | persistent
    engine_reason: str  # why this engine (auto selection)
    model_version: str
    counters: dict[str, int]  # COUNTERS, cumulative
    rejected_by_reason: dict[str, int]  # Reason name -> cumulative count (shed reasons too)
    gauges: dict[str, float]  # GAUGES
    stages: dict[str, WireIntervalCounts]  # stage -> this interval's sparse counts (absent = no samples)
    histogram_highest_ns: int
    histogram_digits: int
    placement: dict[str, str] = {}  # CPU/NUMA placement decisions and refusals (issue 9)
    final: bool = False  # last snapshot before exit
    precision: str = ""  # the engine's product precision (fp32 | tf32 | bf16; Status.precision)


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Snapshot)


def encode_snapshot(s: Snapshot) -> bytes:
    return _encoder.encode(s)


def decode_snapshot(b: bytes) -> Snapshot:
    return _decoder.decode(b)
