"""Framing through the real ingest (tests/ingest_rig.py): every message is one event whatever its
frames, and a malformed one never takes the message after it down with it."""

from __future__ import annotations

import numpy as np
import pytest
from ingest_rig import IngestRig

from hft_infer.transport.codec import encode, pack_book, topic_for
from hft_infer.transport.schema import Quote, Reason

BOOK = pack_book(np.ones((10, 4), np.float32))


def _good(seq: int) -> list[bytes]:
    return [topic_for(3), encode(Quote(3, seq, 0, 0, 10, BOOK))]


@pytest.mark.parametrize("bad, name", [
    ([topic_for(3)], "a lone 4-byte frame"),
    ([topic_for(3) + b"xyz"], "a lone frame of another size"),
    ([topic_for(3), encode(Quote(3, 99, 0, 0, 10, BOOK)), b"extra"], "a third frame"),
    ([topic_for(3), encode(Quote(3, 99, 0, 0, 10, BOOK)), b"1234"], "a third frame of 4 bytes"),
])
def test_a_malformed_message_is_one_rejection_and_the_next_message_is_decided(bad, name):
    rig = IngestRig(instruments=8, topic_frame=True)
    try:
        # queued together, so that the ingest reads them in one burst (the hard case: the next
        # message is already there when the malformed one is read)
        for parts in (_good(0), bad, _good(1)):
            rig.push.send_multipart(parts)
        read = 0
        while read < 2 + len(bad) + 2:
            got = rig.ingest.drain(64)
            if not got:
                break
            read += got
        assert rig.acct.received == 3, name
        assert rig.acct.rejected == rig.acct.by_reason[Reason.BAD_FRAMING] == 1, name
        assert rig.sched.live_requests() == 1 and rig.sched.conflated == 1, name  # both quotes accepted
        assert rig.ingest.last_seq[3] == 1
    finally:
        rig.close()


def _drain_all(rig: IngestRig) -> None:
    while rig.ingest.drain(64):
        pass


def test_a_lone_4_byte_frame_then_a_single_frame_message_is_one_event_when_queued_two_when_apart():
    """README, Framing: the one ambiguity. The topic frame is read without its more flag, so a lone
    4-byte frame with a single-frame message already queued behind it reads as one [topic, payload]
    message; read apart (nothing queued behind it yet), each is its own BAD_FRAMING."""
    lone, single = [topic_for(3)], [b"not a topic, one frame"]
    queued = IngestRig(instruments=8, topic_frame=True)
    apart = IngestRig(instruments=8, topic_frame=True)
    try:
        for parts in (lone, single, _good(0)):
            queued.push.send_multipart(parts)
        _drain_all(queued)
        assert queued.acct.received == 2  # the pair (one rejection) and the quote
        assert queued.acct.rejected == 1 and queued.acct.by_reason[Reason.BAD_FRAMING] == 0
        assert queued.sched.live_requests() == 1
        for parts in (lone, single, _good(0)):
            apart.push.send_multipart(parts)
            _drain_all(apart)
        assert apart.acct.received == 3
        assert apart.acct.rejected == apart.acct.by_reason[Reason.BAD_FRAMING] == 2
        assert apart.sched.live_requests() == 1
    finally:
        queued.close()
        apart.close()
