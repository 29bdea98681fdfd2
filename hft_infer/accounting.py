"""Event outcome counters: the one place where every event's end is counted.

Every event read from the feed ends as exactly one of decided, shed,
conflated (counted by the scheduler, which does the conflating) or rejected,
and until then it holds a live request id in the scheduler. So at any time

    received = decided + shed + conflated + rejected + live requests

where the last term comes from the scheduler's free list, not from these
counters: `identity_holds()` is a real check, run by the tests and reported
in the final Status.

Counters that can be driven by feed values (sequence gaps) saturate at
2**63 - 1 instead of overflowing the wire's integer types.
"""

from __future__ import annotations

from hft_infer.transport.schema import SHED_REASONS, Reason, Status

N_REASONS = len(Reason)
SATURATE = (1 << 63) - 1
SHED_REASON_NAMES = frozenset(r.name for r in SHED_REASONS)  # reasons by name: shed, the others rejected


def reasons_by_name(counts: list[int]) -> dict[str, int]:
    """A Status's `rejected_by_reason` (counts indexed by Reason) as name -> count, for the reasons
    that occurred; an index this version does not know (a newer service) as REASON_<index>."""
    return {(Reason(i).name if i in Reason._value2member_map_ else f"REASON_{i}"): n
            for i, n in enumerate(counts) if n}


def reasons_line(by_reason: dict[str, int] | None, who: str = "the service") -> str:
    """One line of `bench` output: why events were shed or rejected, from the final Status, most
    frequent first (past capacity it says which door they went out by: LATE or QUEUE_FULL at
    ingest, STALE when picked)."""
    if by_reason is None:
        return f"shed and rejected by reason: - ({who}: no final Status)"
    if not by_reason:
        return f"shed and rejected by reason ({who}): none"
    parts = [f"{name} {n:,} ({'shed' if name in SHED_REASON_NAMES else 'rejected'})"
             for name, n in sorted(by_reason.items(), key=lambda kv: -kv[1])]
    return f"shed and rejected by reason ({who}): " + ", ".join(parts)


class Accounting:
    __slots__ = ("received", "decided", "shed", "rejected", "by_reason", "seq_gaps", "seq_missing", "seq_resets",
                 "heartbeats", "resets", "batches", "ingest_disconnects", "overlapped", "egress_dropped",
                 "control_dropped", "coalesced_reads", "chained_steps")

    def __init__(self) -> None:
        self.received = 0
        self.decided = 0
        self.shed = 0
        self.rejected = 0
        self.by_reason = [0] * N_REASONS  # rejections and shed reasons
        self.seq_gaps = 0
        self.seq_missing = 0
        self.seq_resets = 0
        self.heartbeats = 0
        self.resets = 0
        self.batches = 0
        self.ingest_disconnects = 0
        self.overlapped = 0
        self.egress_dropped = 0
        self.control_dropped = 0
        self.coalesced_reads = 0
        self.chained_steps = 0

    # ------------------------------------------------------------ outcomes (cold paths)

    def reject(self, reason: int) -> None:
        self.rejected += 1
        self.by_reason[reason] += 1

    def shed_some(self, reason: int, n: int = 1) -> None:
        self.shed += n
        self.by_reason[reason] += n

    def gap(self, missing: int) -> None:
        self.seq_gaps += 1
        self.seq_missing = min(SATURATE, self.seq_missing + missing)

    # ------------------------------------------------------------ views

    def identity_holds(self, conflated: int, live: int) -> bool:
        return self.received == self.decided + self.shed + conflated + self.rejected + live

    def counters(self, conflated: int) -> dict[str, int]:
        """Cumulative counters for the control snapshot (transport.stats.COUNTERS) and summaries."""
        return {
            "received": self.received, "decided": self.decided, "shed": self.shed, "conflated": conflated,
            "rejected": self.rejected, "egress_dropped": self.egress_dropped,
            "control_dropped": self.control_dropped, "seq_gaps": self.seq_gaps, "seq_missing": self.seq_missing,
            "seq_resets": self.seq_resets, "heartbeats": self.heartbeats, "resets": self.resets,
            "batches": self.batches, "ingest_disconnects": self.ingest_disconnects, "overlapped": self.overlapped,
            "coalesced_reads": self.coalesced_reads, "chained_steps": self.chained_steps,
        }

    def reasons(self) -> dict[str, int]:
        """Reason name -> count, for the reasons that occurred."""
        return reasons_by_name(self.by_reason)

    def status(self, ts_ns: int, *, conflated: int, pending: int, final: bool, engine: str,
               model_version: str, error: str = "", precision: str = "") -> Status:
        return Status(ts_ns, self.received, self.decided, self.shed, conflated, self.rejected, pending,
                      self.egress_dropped, self.seq_gaps, list(self.by_reason), final, engine, model_version,
                      self.seq_missing, self.resets, self.ingest_disconnects, error, precision)
