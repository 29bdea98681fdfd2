"""The service's real ingest (hft_infer.ingest.Ingest) on a real socket, for unit and property tests.

Frames go through an inproc PUSH/PULL pair into `Ingest.drain`, which writes
into a real FeatureStore, Scheduler, Accounting and answer buffer: what the
service runs, minus the model step. `classify(parts)` says what became of one
message: Reason.NONE when it was accepted (queued, conflated or shed as stale),
else the reason it was rejected, with the answer the service would send.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import zmq

from hft_infer.accounting import Accounting
from hft_infer.clock import EpochClock
from hft_infer.config import SchedulerConfig
from hft_infer.egress import Answers
from hft_infer.features import FeatureStore
from hft_infer.ingest import Ingest
from hft_infer.scheduler import Scheduler
from hft_infer.transport.codec import BATCH_TOPIC
from hft_infer.transport.schema import Reason

_ids = itertools.count()


@dataclass
class Verdict:
    reason: Reason  # NONE: accepted
    answers: list[tuple]  # (inst, seq, status, reason, ...) answered for this message
    received: int  # events counted (0 for heartbeats and resets)


class IngestRig:
    def __init__(self, *, instruments: int = 16, levels: int = 10, max_levels: int = 10, conflate: bool = True,
                 topic_frame: bool = False, max_frame_bytes: int = 4096, max_age_us: int = 10**9,
                 depth: int = 64, max_pending: int = 64, capacity: int = 4096, on_reset=None,
                 rows_read: int = 0, admission: str = "deadline", first_id: int = 0,
                 batch_topic: bytes = BATCH_TOPIC, max_batch: int | None = None) -> None:
        """`first_id`: the universe's instrument ids are first_id, first_id + 1, ... (slot + first_id:
        0, the default, makes ids and slots equal, which hides a slot answered as an id)."""
        self.ctx = zmq.Context.instance()
        ep = f"inproc://ingest-rig-{next(_ids)}"
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.bind(ep)
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.connect(ep)
        self.store = FeatureStore(instruments, levels, depth)
        cfg = SchedulerConfig(classes=4, default_class=0, max_age_us=max_age_us, capacity=capacity,
                              max_pending_per_instrument=max_pending, admission=admission,
                              **({} if max_batch is None else {"max_batch": max_batch}))
        table = [[0] * instruments, [0] * instruments]
        self.sched = Scheduler(cfg, instruments, sequential=not conflate, conflate=conflate,
                               class_by_slot_kind=table)
        self.acct = Accounting()
        self.answers = Answers()
        self.resets: list[list[int]] = []
        self.ingest = Ingest(
            self.pull, instrument_ids=list(range(first_id, first_id + instruments)), store=self.store,
            sched=self.sched, acct=self.acct,
            answers=self.answers, clock=EpochClock(), topic_frame=topic_frame, max_frame_bytes=max_frame_bytes,
            max_levels=max_levels, model_levels=levels, max_age_us=max_age_us, class_by_slot_kind=table,
            honour_message_priority=True, classes=4, publish_shed=True, publish_rejected=True,
            on_reset=on_reset or self.resets.append, rows_read=rows_read, batch_topic=batch_topic)

    def send(self, parts: list[bytes]) -> int:
        """Send one message (its frames) and drain it; returns the frames the ingest read."""
        self.push.send_multipart(parts)
        read = 0
        for _ in range(10_000):  # inproc delivery is immediate; a bound, not a timing assumption
            read += self.ingest.drain(256)
            if read >= len(parts) or (read and not self.pull.poll(0)):
                break
        return read

    def classify(self, parts: list[bytes]) -> Verdict:
        before = list(self.acct.by_reason)
        received_before = self.acct.received
        n_answers = len(self.answers)
        self.send(parts)
        diff = [a - b for a, b in zip(self.acct.by_reason, before)]
        shed = (Reason.STALE, Reason.QUEUE_FULL, Reason.LATE)
        rejected = [Reason(i) for i, d in enumerate(diff) if d and Reason(i) not in shed]
        assert len(rejected) <= 1, rejected
        answers = list(zip(*(col[n_answers:] for col in self.answers.columns())))
        return Verdict(rejected[0] if rejected else Reason.NONE, answers, self.acct.received - received_before)

    def identity_holds(self) -> bool:
        return self.acct.identity_holds(self.sched.conflated, self.sched.live_requests())

    def close(self) -> None:
        self.push.close(0)
        self.pull.close(0)
