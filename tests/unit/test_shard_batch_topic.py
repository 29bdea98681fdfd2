"""EventBatch frames for shards (codec.shard_batch_topic): a shard reads batches under its own
8-byte topic as it reads the unsharded BATCH_TOPIC's, drops another shard's whole, and an
unsharded service takes every shard's; the pacer splits what is due into one batch per shard."""

from __future__ import annotations

import numpy as np
import pytest
import zmq
from ingest_rig import IngestRig
from test_ingest_batch import batch_frame

from hft_infer.replay.pacer import EncodedFeed, FeedColumns, Pacer
from hft_infer.replay.synthetic import SyntheticConfig, generate
from hft_infer.transport.codec import (
    BATCH_TOPIC,
    IngressDecoder,
    events_of_batch,
    feed_topics,
    shard_batch_topic,
    topic_for,
)
from hft_infer.transport.schema import EventBatch, Reason


def test_the_topic_is_the_batch_topic_then_index_and_count():
    assert shard_batch_topic(0, 1) == BATCH_TOPIC  # unsharded: the plain batch topic
    assert shard_batch_topic(1, 4) == BATCH_TOPIC + b"\x00\x01\x00\x04"
    assert len({shard_batch_topic(k, 4) for k in range(4)}) == 4
    assert all(shard_batch_topic(k, 4).startswith(BATCH_TOPIC) for k in range(4))  # BATCH_TOPIC subscribes to all
    for index, count in ((2, 2), (-1, 2), (0, 0), (0, 70000)):
        with pytest.raises(ValueError, match="need 0 <= index < count"):
            shard_batch_topic(index, count)
    assert feed_topics([3], shard_batch_topic(1, 2)) == [topic_for(3), topic_for(0xFFFFFFFF), shard_batch_topic(1, 2)]


def _events(instruments: list[int], n_each: int) -> list[tuple]:
    return [(i, s, s, 0) for s in range(n_each) for i in instruments]


def test_a_shard_reads_its_own_batches_and_drops_another_shards_whole():
    rig = IngestRig(instruments=8, topic_frame=True, batch_topic=shard_batch_topic(1, 2))
    try:
        ours = rig.classify(batch_frame(_events(list(range(8)), 4), topic=shard_batch_topic(1, 2)))
        assert ours.reason == Reason.NONE and ours.received == 32
        theirs = rig.classify(batch_frame(_events(list(range(8)), 4), topic=shard_batch_topic(0, 2)))
        assert theirs.reason == Reason.BAD_FRAMING and theirs.received == 1  # one frame, counted once
        plain = rig.classify([topic_for(3), b"\x00"])  # the next message reads as one: nothing left over
        assert plain.reason == Reason.DECODE_ERROR and plain.received == 1
        assert rig.identity_holds()
    finally:
        rig.close()


def test_an_unsharded_service_takes_every_shards_batches():
    rig = IngestRig(instruments=8, topic_frame=True)  # batch topic: BATCH_TOPIC
    try:
        for k in range(2):
            v = rig.classify(batch_frame(_events([k, k + 2, k + 4, k + 6], 4), topic=shard_batch_topic(k, 2)))
            assert v.reason == Reason.NONE and v.received == 16
        assert rig.classify([BATCH_TOPIC + b"\x00\x00", b"\x90"]).reason == Reason.BAD_FRAMING  # 6 bytes
        assert rig.identity_holds()
    finally:
        rig.close()


class _Sink:
    """A socket stand-in for the pacer's sends (the split is what is tested here; the sockets
    are in tests/integration/test_shards.py)."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def send(self, data, flags=0, copy=True, track=False):
        self.frames.append(bytes(data))


def test_the_pacer_sends_one_batch_per_shard_of_the_events_due_together(monkeypatch):
    events = generate(600, SyntheticConfig(instruments=6, seed=3, rate_hz=1e6))
    ids = np.arange(6)
    shard_of = (events["instrument"] % 3).astype(np.int64)  # position % 3 (ids are 0..5)
    feed = EncodedFeed([b""] * len(events), [b""] * len(events), [-1] * len(events), FeedColumns.of_events(events))
    sink = _Sink()
    pacer = Pacer(sink, feed, np.zeros(len(events), np.int64), feed_batch=64, shard_of=shard_of, shard_count=3,
                  spin=True)
    monkeypatch.setattr("hft_infer.replay.pacer.direct_send", lambda sock: sock.send)
    res = pacer.run(start_delay_ns=0)
    assert res.sent == len(events)
    decode = IngressDecoder().decode
    seen = []
    for topic, payload in zip(sink.frames[::2], sink.frames[1::2]):
        batch = decode(payload)
        assert isinstance(batch, EventBatch)
        k = [shard_batch_topic(s, 3) for s in range(3)].index(topic)
        inst = np.frombuffer(batch.instrument, "<u4")
        assert (inst % 3 == k).all()  # only its shard's instruments
        seen += list(zip(inst.tolist(), np.frombuffer(batch.seq, "<u8").tolist()))
    # every event exactly once, each shard's in feed order
    assert sorted(seen) == sorted(zip(events["instrument"].tolist(), events["seq"].tolist()))
    for k in range(3):
        mine = [e for e in seen if e[0] in ids[ids % 3 == k]]
        want = [(int(i), int(s)) for i, s in zip(events["instrument"], events["seq"]) if i % 3 == k]
        assert mine == want


def test_a_zmq_pacer_needs_every_events_shard():
    events = generate(10, SyntheticConfig(instruments=2, seed=1))
    feed = EncodedFeed([b""] * 10, [b""] * 10, [-1] * 10, FeedColumns.of_events(events))
    with zmq.Context() as ctx, ctx.socket(zmq.PUB) as sock, pytest.raises(ValueError, match="shard of every event"):
        Pacer(sock, feed, np.zeros(10, np.int64), feed_batch=8, shard_count=2)


def test_a_shards_columns_hold_its_events_exactly():
    events = generate(300, SyntheticConfig(instruments=5, seed=7))
    cols = FeedColumns.of_events(events)
    assert cols.kind, "the feed has trades: their columns are taken too"
    idx = np.flatnonzero(events["instrument"] % 2 == 1)
    mine = cols.take(idx)
    got = events_of_batch(mine.batch(0, len(idx), 123))
    want = [events_of_batch(cols.batch(i, i + 1, 123))[0] for i in idx.tolist()]
    assert got == want and mine.batchable.tolist() == cols.batchable[idx].tolist()
