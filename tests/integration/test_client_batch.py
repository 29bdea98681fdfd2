"""FeedPublisher.publish_quote_batch on a real socket: one EventBatch frame per call, sequence numbers
continued across calls (and with single quotes), the books exactly as given."""

from __future__ import annotations

import numpy as np
import zmq

from hft_infer.client import FeedPublisher
from hft_infer.transport.codec import (
    BATCH_TOPIC,
    SERVICE_TOPIC,
    IngressDecoder,
    events_of_batch,
    shard_batch_topic,
    topic_for,
)
from hft_infer.transport.schema import EventBatch, Quote


def test_a_quote_batch_is_one_frame_of_the_quotes_with_their_sequence_numbers(tmp_path):
    endpoint = f"ipc://{tmp_path}/feed.sock"
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        with FeedPublisher(endpoint) as pub:
            sub.connect(endpoint)
            assert pub.wait_for_subscribers(1, timeout_s=10) >= 1
            books = np.arange(3 * 2 * 4, dtype=np.float32).reshape(3, 2, 4)
            assert pub.publish_quote(4, [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]) is True
            assert pub.publish_quote_batch([4, 9, 4], books, priorities=[None, 1, None]) == 3
            assert pub.publish_quote_batch([9], books[:1]) == 1
            frames = [sub.recv_multipart() for _ in range(3)]
        decode = IngressDecoder().decode
        topic, payload = frames[0]
        assert topic == topic_for(4) and type(decode(payload)) is Quote
        got = []
        for topic, payload in frames[1:]:
            batch = decode(payload)
            assert topic == BATCH_TOPIC and type(batch) is EventBatch
            got += events_of_batch(batch)
        assert [(q.instrument, q.seq, q.priority) for q in got] == [(4, 1, -1), (9, 0, 1), (4, 2, -1), (9, 1, -1)]
        np.testing.assert_array_equal(np.frombuffer(got[2].book, "<f4"), books[2].ravel())
        assert all(q.ts_send_ns > 0 for q in got)
    finally:
        sub.close(0)
        ctx.term()


def test_a_shards_batch_reaches_that_shards_subscription_only(tmp_path):
    """publish_quote_batch(shard=(I, N)): under shard I's batch topic, which a SUB subscribed as
    `serve --shard I/N` subscribes receives and another shard's does not."""
    endpoint = f"ipc://{tmp_path}/feed.sock"
    ctx = zmq.Context()
    subs = []
    try:
        with FeedPublisher(endpoint) as pub:
            for k in range(2):
                sub = ctx.socket(zmq.SUB)
                sub.setsockopt(zmq.SUBSCRIBE, shard_batch_topic(k, 2))
                sub.setsockopt(zmq.SUBSCRIBE, SERVICE_TOPIC)  # as a service does (wait_for_subscribers counts it)
                sub.connect(endpoint)
                subs.append(sub)
            assert pub.wait_for_subscribers(2, timeout_s=10) >= 2
            books = np.ones((2, 2, 4), dtype=np.float32)
            assert pub.publish_quote_batch([1, 3], books, shard=(1, 2)) == 2
            assert subs[1].poll(5000)
            topic, payload = subs[1].recv_multipart()
            assert topic == shard_batch_topic(1, 2)
            quotes = events_of_batch(IngressDecoder().decode(payload))
            assert [(q.instrument, q.seq) for q in quotes] == [(1, 0), (3, 0)]
            assert not subs[0].poll(200)  # shard 0 never sees it
    finally:
        for sub in subs:
            sub.close(0)
        ctx.term()
