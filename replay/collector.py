"""Decision collector: receive decisions, match them to sent events, account for every event.

During the run the collector only receives (frame bytes + receive time into
lists, no decoding), so that it can share a core with the pacer. `analyse`
then decodes everything at once and computes:

- per event, its outcome: decided / shed / rejected (from the decision's
  status), conflated (covered by a later decision's `n_conflated`), or lost;
  rejections the service could not answer (undecodable frames) come from its
  final Status;
- `tick_to_decision` for every decided event: decision receive time minus the
  event's *intended* send time (open loop: a backlog shows up as latency);
- the service's own counters from its last Status, for cross-checking.

`lost = sent - (decided + shed + conflated + rejected)`: an event the service
never received, or whose decision never reached us, is lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import zmq

from hft_infer.clock import EpochClock, perf_ns
from hft_infer.metrics import new_histogram, record_array, summarize
from hft_infer.metrics.hlog import header_text, interval_line
from hft_infer.transport.codec import EgressDecoder
from hft_infer.transport.schema import Outcome, Status

_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)  # ints: no enum per call


@dataclass
class CollectorResult:
    accounting: dict
    tick_to_decision: dict
    tick_histogram: object  # HdrHistogram (ns)
    service_status: Status | None
    duplicates: int
    unmatched: int  # decisions that name no sent event
    outcome: np.ndarray = field(repr=False)  # per sent event: Outcome value, or -1 = lost
    decisions: list = field(repr=False, default_factory=list)
    tick_recv_mono_ns: np.ndarray = field(repr=False, default=None)  # receive time of each measured decision
    tick_ns: np.ndarray = field(repr=False, default=None)  # its tick-to-decision

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


class Collector:
    def __init__(self, sock: zmq.Socket, *, topic_frame: bool = True) -> None:
        self.sock = sock
        self.topic_frame = topic_frame
        self.frames: list[bytes] = []
        self.recv_ns: list[int] = []
        self.final_status_seen = False
        self._decode = EgressDecoder().decode

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
            if self.topic_frame and first == b"\xff\xff\xff\xff" and self._is_final(payload):
                self.final_status_seen = True
        return n

    def _is_final(self, payload: bytes) -> bool:
        try:
            msg = self._decode(payload)
        except Exception:  # noqa: BLE001 - a garbled frame is not the final status
            return False
        return isinstance(msg, Status) and msg.final

    def is_status(self, payload: bytes) -> bool:
        try:
            return isinstance(self._decode(payload), Status)
        except Exception:  # noqa: BLE001
            return False

    def last_status(self) -> Status | None:
        for payload in reversed(self.frames):
            if self.is_status(payload):
                return self._decode(payload)
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

    def analyse(self, instruments: np.ndarray, seqs: np.ndarray, intended_mono_ns: np.ndarray,
                sent: int, *, measure_from: int = 0, baseline: Status | None = None) -> CollectorResult:
        """Match decisions to the first `sent` events (instrument, seq).

        `measure_from`: events before this index (warm-up) are accounted for
        but left out of `tick_to_decision`. `baseline`: the Status of an
        already-running service before the run; its counters are subtracted.
        """
        instruments = instruments[:sent].astype(np.int64)
        seqs = seqs[:sent].astype(np.int64)
        key = (instruments << 40) | seqs  # (instrument, seq) -> one sortable int
        order = np.argsort(key, kind="stable")
        sorted_keys = key[order]
        decisions, status = [], None
        d_inst, d_seq, d_status, d_nconf, d_t = [], [], [], [], []
        for payload, t in zip(self.frames, self.recv_ns):
            try:
                msg = self._decode(payload)
            except Exception:  # noqa: BLE001
                continue
            if isinstance(msg, Status):
                status = msg
                continue
            decisions.append(msg)
            d_inst.append(msg.instrument)
            d_seq.append(msg.seq)
            d_status.append(msg.status)
            d_nconf.append(msg.n_conflated)
            d_t.append(t)
        outcome = np.full(sent, -1, dtype=np.int64)
        d_key = (np.asarray(d_inst, dtype=np.int64) << 40) | np.asarray(d_seq, dtype=np.int64)
        pos = np.searchsorted(sorted_keys, d_key)
        pos_c = np.minimum(pos, max(sent - 1, 0))
        matched = (pos < sent) & (sorted_keys[pos_c] == d_key) if sent else np.zeros(len(d_key), bool)
        unmatched = int((~matched).sum())
        ev_idx = order[pos_c[matched]]
        st = np.asarray(d_status, dtype=np.int64)[matched]
        # a repeated answer for the same event is counted once (and reported)
        uniq, first = np.unique(ev_idx, return_index=True)
        duplicates = int(ev_idx.size - uniq.size)
        outcome[uniq] = st[first]
        nconf = np.asarray(d_nconf, dtype=np.int64)[matched][first]
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
        t_dec = np.asarray(d_t, dtype=np.int64)[matched][first]
        ev_dec = uniq[decided_mask]
        keep = ev_dec >= measure_from
        ticks = t_dec[decided_mask][keep] - intended_mono_ns[ev_dec[keep]]
        record_array(hist, ticks)
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
        return CollectorResult(accounting, summarize(hist), hist, status, duplicates, unmatched, outcome,
                               decisions, t_dec[decided_mask][keep], ticks)
