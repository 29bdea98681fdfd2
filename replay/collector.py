"""Decisions received -> every event accounted for, and tick-to-decision measured.

The frames come from a collector process (`replay.collector_proc`, which only
receives and timestamps during the run) or from the in-process `Collector`
below (tests, tools). `decode_frames` turns them into columns, one row per
answer, whichever way the service published: one `Decision` per event
(`egress.mode = "per_instrument"`, the instrument's topic) or one columnar
`DecisionBatch` per step (`egress.mode = "batch"`); `Status` frames are kept
with their receive times. `analyse` then computes:

- per event, its outcome: decided / shed / rejected (from the answer's
  status), conflated (covered by a later answer's `n_conflated`), or lost;
  rejections the service could not answer (undecodable frames) come from its
  last Status;
- `tick_to_decision` for every decided event from `measure_from` on (earlier
  events are warm-up: accounted for, not measured): the receive time of the
  frame that carried its answer minus the event's *intended* send time, both
  CLOCK_MONOTONIC (open loop: a backlog shows up as latency);
- `send_to_service_recv`: the service's receive time minus the publisher's
  send time of each measured event (both CLOCK_REALTIME, each read when it
  happened, so no stale offset enters), i.e. the feed hop as the service saw it;
- the service's own counters from its last Status, for cross-checking.

`lost = sent - (decided + shed + conflated + rejected)`: an event the service
never received, or whose answer never reached us, is lost.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import msgspec
import numpy as np
import zmq

from hft_infer.clock import EpochClock, perf_ns
from hft_infer.metrics import new_histogram, record_array, summarize
from hft_infer.metrics.hlog import header_text, interval_line
from hft_infer.transport.codec import EgressDecoder, decision_batch_columns, message_tag
from hft_infer.transport.schema import (
    DECISION_BATCH_COLUMNS,
    TAG_DECISION,
    TAG_DECISION_BATCH,
    TAG_STATUS,
    Decision,
    DecisionBatch,
    Outcome,
    Status,
)

_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)  # ints: no enum per call
COLUMNS = ("instrument", "seq", "status", "reason", "action", "score", "n_conflated", "ts_send_ns", "ts_recv_ns",
           "ts_decision_ns", "recv_mono_ns")
_DTYPES = {"score": np.float64}


@dataclass
class Answers:
    """Every answer received, as columns (int64 but `score`); `recv_mono_ns` is the
    collector's receive time of the frame that carried it."""

    cols: dict[str, np.ndarray]
    statuses: list[tuple[int, Status]]  # (receive time, Status), in receive order
    model_version: str = ""
    decision_frames: int = 0
    batch_frames: int = 0
    undecodable_frames: int = 0

    def __len__(self) -> int:
        return int(self.cols["seq"].size)

    def decisions(self, rows: np.ndarray | None = None) -> list[Decision]:
        """Rows as Decision messages (for --verify and tests; a cold path)."""
        c = self.cols
        idx = range(len(self)) if rows is None else rows.tolist()
        return [Decision(int(c["instrument"][i]), int(c["seq"][i]), int(c["status"][i]), int(c["reason"][i]),
                         int(c["action"][i]), float(c["score"][i]), int(c["n_conflated"][i]),
                         int(c["ts_send_ns"][i]), int(c["ts_recv_ns"][i]), int(c["ts_decision_ns"][i]),
                         self.model_version) for i in idx]


_decision_list = msgspec.msgpack.Decoder(list[Decision])
_batch_list = msgspec.msgpack.Decoder(list[DecisionBatch])
_egress_decode = EgressDecoder().decode


def _columns_of_decisions(decisions: list[Decision], recv_ns: np.ndarray) -> dict[str, np.ndarray]:
    cols = {name: np.fromiter((getattr(d, name) for d in decisions), dtype=_DTYPES.get(name, np.int64),
                              count=len(decisions)) for name in COLUMNS[:-1]}
    cols["recv_mono_ns"] = recv_ns
    return cols


def _columns_of_batch(batch: DecisionBatch, recv_ns: int) -> dict[str, np.ndarray]:
    bc = decision_batch_columns(batch)
    cols = {name: bc[name].astype(_DTYPES.get(name, np.int64)) for name in COLUMNS[:9]}
    cols["ts_decision_ns"] = np.full(batch.n, batch.ts_decision_ns, dtype=np.int64)
    cols["recv_mono_ns"] = np.full(batch.n, recv_ns, dtype=np.int64)
    return cols


def _columns_of_batches(batches: list[DecisionBatch], recv_ns: np.ndarray) -> dict[str, np.ndarray]:
    """Many batches at once: a per-batch numpy call per column would cost ~15 us a frame."""
    counts = np.fromiter((b.n for b in batches), dtype=np.int64, count=len(batches))
    total = int(counts.sum())
    cols = {}
    for name, dt in DECISION_BATCH_COLUMNS:
        sizes = np.fromiter((len(getattr(b, name)) for b in batches), dtype=np.int64, count=len(batches))
        if not np.array_equal(sizes, counts * np.dtype(dt).itemsize):  # then frame by frame (the caller)
            raise ValueError(f"DecisionBatch column {name}: not n values in some batch")
        data = b"".join(getattr(b, name) for b in batches)
        cols[name] = np.frombuffer(data, dtype=dt, count=total).astype(_DTYPES.get(name, np.int64))
    cols["ts_decision_ns"] = np.repeat(np.fromiter((b.ts_decision_ns for b in batches), np.int64, len(batches)),
                                       counts)
    cols["recv_mono_ns"] = np.repeat(recv_ns, counts)
    return cols


def decode_frames(frames: list[bytes], recv_ns) -> Answers:
    """Decode decision-socket payloads (Decision | DecisionBatch | Status, any mix).

    Frames are sorted by their tag byte (msgspec writes these arrays with a
    one-byte fixarray header, so byte 1 is the tag); whatever does not look
    like one of the three goes through the generic decoder (a foreign
    publisher's longer array header), and what that cannot read is counted
    as undecodable."""
    recv_ns = np.asarray(recv_ns, dtype=np.int64)
    tags = np.fromiter((f[1] if len(f) > 1 else -1 for f in frames), dtype=np.int64, count=len(frames))
    parts: list[dict[str, np.ndarray]] = []
    statuses: list[tuple[int, Status]] = []
    counts = {"decision": 0, "batch": 0, "undecodable": 0}
    model_version = ""

    def one(i: int) -> None:  # the cold path: any frame, decoded on its own
        nonlocal model_version
        try:
            msg = _egress_decode(frames[i])
            if isinstance(msg, DecisionBatch):
                parts.append(_columns_of_batch(msg, int(recv_ns[i])))
                counts["batch"] += 1
                model_version = msg.model_version
            elif isinstance(msg, Decision):
                parts.append(_columns_of_decisions([msg], recv_ns[i:i + 1]))
                counts["decision"] += 1
                model_version = msg.model_version
            else:
                statuses.append((int(recv_ns[i]), msg))
        except (msgspec.DecodeError, ValueError):
            counts["undecodable"] += 1

    single = np.flatnonzero(tags == TAG_DECISION)
    if single.size:
        chosen = [frames[i] for i in single.tolist()]
        try:  # one msgpack array of every frame: one decoder call instead of one per frame
            decisions = _decision_list.decode(b"\xdd" + struct.pack(">I", len(chosen)) + b"".join(chosen))
        except msgspec.DecodeError:
            for i in single.tolist():
                one(i)
        else:
            parts.append(_columns_of_decisions(decisions, recv_ns[single]))
            counts["decision"] += len(decisions)
            model_version = decisions[-1].model_version
    batched = np.flatnonzero(tags == TAG_DECISION_BATCH)
    if batched.size:
        chosen = [frames[i] for i in batched.tolist()]
        try:  # as above; then each column is one join and one frombuffer over every batch
            batches = _batch_list.decode(b"\xdd" + struct.pack(">I", len(chosen)) + b"".join(chosen))
            parts.append(_columns_of_batches(batches, recv_ns[batched]))
        except (msgspec.DecodeError, ValueError):
            for i in batched.tolist():
                one(i)
        else:
            counts["batch"] += len(batches)
            model_version = batches[-1].model_version
    for i in np.flatnonzero(~np.isin(tags, (TAG_DECISION, TAG_DECISION_BATCH))).tolist():
        one(i)  # Status frames (rare) and anything unrecognised
    statuses.sort(key=lambda x: x[0])
    if parts:
        merged = {name: np.concatenate([p[name] for p in parts]) for name in COLUMNS}
        order = np.argsort(merged["recv_mono_ns"], kind="stable")  # receive order across frame kinds
        merged = {name: col[order] for name, col in merged.items()}
    else:
        merged = {name: np.zeros(0, dtype=_DTYPES.get(name, np.int64)) for name in COLUMNS}
    return Answers(merged, statuses, model_version, counts["decision"], counts["batch"], counts["undecodable"])


@dataclass
class CollectorResult:
    accounting: dict
    tick_to_decision: dict
    tick_histogram: object  # HdrHistogram (ns)
    send_to_service_recv: dict  # summary (µs) of the service's receive time - publisher's send time
    service_status: Status | None
    duplicates: int
    unmatched: int  # answers that name no sent event
    measured_from: int  # events before this index were warm-up (not in tick_to_decision)
    outcome: np.ndarray = field(repr=False)  # per sent event: Outcome value, or -1 = lost
    answers: Answers = field(repr=False, default=None)
    tick_recv_mono_ns: np.ndarray = field(repr=False, default=None)  # receive time of each measured decision
    tick_ns: np.ndarray = field(repr=False, default=None)  # its tick-to-decision
    tick_event: np.ndarray = field(repr=False, default=None)  # the event (index into the table) of each
    # per event, from the pacer (set by the driver): intended and actual send time
    intended_mono_ns: np.ndarray = field(repr=False, default=None)
    actual_mono_ns: np.ndarray = field(repr=False, default=None)

    @property
    def decisions(self) -> list[Decision]:
        return self.answers.decisions() if self.answers is not None else []

    def write_hlog(self, path: str, interval_s: float = 1.0) -> None:
        """tick_to_decision as an HdrHistogram interval log (one interval per `interval_s`
        of decision receive time), readable by HdrHistogram's log reader."""
        if self.tick_ns is None or self.tick_ns.size == 0:
            return
        start_mono = int(self.tick_recv_mono_ns.min())
        start_epoch_s = EpochClock().epoch(start_mono) / 1e9
        bucket = ((self.tick_recv_mono_ns - start_mono) // int(interval_s * 1e9)).astype(np.int64)
        with open(path, "w") as f:
            f.write(header_text(start_epoch_s, "hft-infer tick_to_decision (collector)"))
            for b in np.unique(bucket):
                h = new_histogram()
                record_array(h, self.tick_ns[bucket == b])
                f.write(interval_line("tick_to_decision", float(b) * interval_s, interval_s, h))


def analyse(answers: Answers, instruments: np.ndarray, seqs: np.ndarray, intended_mono_ns: np.ndarray, sent: int,
            *, measure_from: int = 0, baseline: Status | None = None,
            status: Status | None = None) -> CollectorResult:
    """Match answers to the first `sent` events (instrument, seq).

    `measure_from`: events before this index (warm-up) are accounted for but
    left out of the latency figures. `baseline`: the Status of an
    already-running service before the run; its counters are subtracted.
    `status`: the Status to account with (default: the last one received).
    """
    instruments = instruments[:sent].astype(np.int64)
    seqs = seqs[:sent].astype(np.int64)
    key = (instruments << 40) | seqs  # (instrument, seq) -> one sortable int
    order = np.argsort(key, kind="stable")
    sorted_keys = key[order]
    c = answers.cols
    if status is None and answers.statuses:
        status = answers.statuses[-1][1]
    outcome = np.full(sent, -1, dtype=np.int64)
    d_key = (c["instrument"] << 40) | c["seq"]
    pos = np.searchsorted(sorted_keys, d_key)
    pos_c = np.minimum(pos, max(sent - 1, 0))
    matched = (pos < sent) & (sorted_keys[pos_c] == d_key) if sent else np.zeros(d_key.size, bool)
    unmatched = int((~matched).sum())
    ev_idx = order[pos_c[matched]]
    rows = np.flatnonzero(matched)
    st = c["status"][rows]
    # a repeated answer for the same event is counted once (and reported)
    uniq, first = np.unique(ev_idx, return_index=True)
    duplicates = int(ev_idx.size - uniq.size)
    outcome[uniq] = st[first]
    nconf = c["n_conflated"][rows][first]
    decided_mask = st[first] == Outcome.DECIDED
    n_decided = int(decided_mask.sum())
    n_shed = int((st[first] == Outcome.SHED).sum())
    n_rej_answered = int((st[first] == Outcome.REJECTED).sum())
    n_conflated = int(nconf[st[first] != Outcome.REJECTED].sum())
    svc_rejected = n_rej_answered
    if status is not None:
        svc_rejected = status.rejected - (baseline.rejected if baseline is not None else 0)
    n_rejected = max(n_rej_answered, svc_rejected)
    lost = sent - (n_decided + n_shed + n_conflated + n_rejected)

    hist = new_histogram()
    dec_rows = rows[first][decided_mask]
    ev_dec = uniq[decided_mask]
    keep = ev_dec >= measure_from
    t_dec = c["recv_mono_ns"][dec_rows][keep]
    ticks = t_dec - intended_mono_ns[ev_dec[keep]]
    record_array(hist, ticks)
    wire = new_histogram()
    send, recv = c["ts_send_ns"][dec_rows][keep], c["ts_recv_ns"][dec_rows][keep]
    known = (send > 0) & (recv > 0)
    record_array(wire, recv[known] - send[known])
    received = None
    if status is not None:
        received = status.received - (baseline.received if baseline is not None else 0)
    accounting = {
        "sent": sent,
        "received": received,
        "decided": n_decided,
        "shed": n_shed,
        "conflated": n_conflated,
        "rejected": n_rejected,
        "lost": lost,
    }
    return CollectorResult(accounting, summarize(hist), hist, summarize(wire), status, duplicates, unmatched,
                           measure_from, outcome, answers, t_dec, ticks, ev_dec[keep])


def shed_by_instrument(outcome: np.ndarray, instruments: np.ndarray, top: int = 5) -> dict:
    """Which instruments lost events to shedding (an `analyse` result's `outcome` over the sent
    events' `instruments`): how many instruments shed any, and the `top` that shed most, each with
    its shed and its events (most shed first, then the lower id).

    Past a stateful model's step rate the shed is not spread over the feed: an instrument whose
    events come faster than the service steps loses its excess (BENCHMARKS.md wave 26: one shard's
    busiest instrument shed ~its excess over ~2,035 steps/s), so an operator's question is which
    instruments, not how many events."""
    shed = instruments[outcome == Outcome.SHED]
    ids, events = np.unique(instruments, return_counts=True)
    shed_ids, shed_n = np.unique(shed, return_counts=True)
    order = np.lexsort((shed_ids, -shed_n))[:top]
    events_of = events[np.searchsorted(ids, shed_ids[order])]
    return {"shed": int(shed.size), "instruments": int(ids.size), "instruments_shed": int(shed_ids.size),
            "top": [{"id": int(i), "shed": int(n), "events": int(e)}
                    for i, n, e in zip(shed_ids[order], shed_n[order], events_of)]}


def merge_shed_by_instrument(parts: list[dict], top: int = 5) -> dict:
    """`shed_by_instrument` of disjoint sets of instruments (shards) as one: totals summed, the
    `top` of their tops (each part's top holds its own most-shed instruments, so theirs are there)."""
    tops = sorted((t for p in parts for t in p["top"]), key=lambda t: (-t["shed"], t["id"]))
    return {k: sum(p[k] for p in parts) for k in ("shed", "instruments", "instruments_shed")} | {"top": tops[:top]}


def shed_by_instrument_line(s: dict | None) -> str | None:
    """One line of `bench` output from `shed_by_instrument` (None: nothing was shed)."""
    if not s or not s["shed"]:
        return None
    most = ", ".join(f"{t['id']} {t['shed']:,} of {t['events']:,}" for t in s["top"])
    share = sum(t["shed"] for t in s["top"]) / s["shed"]
    return (f"shed by instrument: {s['instruments_shed']:,} of {s['instruments']:,} instruments lost events to "
            f"shedding; most (instrument, shed of its events): {most} -- {share:.1%} of the shed")


class Collector:
    """An in-process decision subscriber (tests, tools, readiness checks): `poll` receives
    what is waiting into `frames` / `recv_ns`; `result` decodes and analyses them."""

    def __init__(self, sock: zmq.Socket, *, topic_frame: bool = True) -> None:
        self.sock = sock
        self.topic_frame = topic_frame
        self.frames: list[bytes] = []
        self.recv_ns: list[int] = []
        self.final_status_seen = False

    def poll(self, max_messages: int = 1000) -> int:
        """Receive what is waiting (never blocks); returns the number of messages."""
        sock = self.sock
        recv = sock.recv
        getsockopt = sock.getsockopt
        n = 0
        frames, times = self.frames, self.recv_ns
        while n < max_messages and getsockopt(_EVENTS) & _POLLIN:
            first = recv(_NOBLOCK)
            t = perf_ns()
            payload = recv(_NOBLOCK) if self.topic_frame else first
            frames.append(payload)
            times.append(t)
            n += 1
            if message_tag(payload) == TAG_STATUS and self._is_final(payload):
                self.final_status_seen = True
        return n

    @staticmethod
    def _is_final(payload: bytes) -> bool:
        try:
            msg = _egress_decode(payload)
        except Exception:  # noqa: BLE001 - a garbled frame is not the final status
            return False
        return isinstance(msg, Status) and msg.final

    @staticmethod
    def is_status(payload: bytes) -> bool:
        try:
            return isinstance(_egress_decode(payload), Status)
        except Exception:  # noqa: BLE001
            return False

    def last_status(self) -> Status | None:
        for payload in reversed(self.frames):
            if self.is_status(payload):
                return _egress_decode(payload)
        return None

    def wait_final(self, timeout_s: float) -> bool:
        """Receive until the service's final Status arrives (or the timeout)."""
        deadline = perf_ns() + int(timeout_s * 1e9)
        while not self.final_status_seen and perf_ns() < deadline:
            if self.sock.poll(50):
                self.poll()
        return self.final_status_seen

    def wait_quiet(self, quiet_s: float, timeout_s: float) -> None:
        """Receive until nothing arrived for `quiet_s` (in-flight decisions), at most `timeout_s`."""
        deadline = perf_ns() + int(timeout_s * 1e9)
        last = perf_ns()
        while perf_ns() < deadline and perf_ns() - last < quiet_s * 1e9:
            if self.sock.poll(20) and self.poll():
                last = perf_ns()

    def result(self, instruments: np.ndarray, seqs: np.ndarray, intended_mono_ns: np.ndarray, sent: int,
               **kw) -> CollectorResult:
        return analyse(decode_frames(self.frames, self.recv_ns), instruments, seqs, intended_mono_ns, sent, **kw)
