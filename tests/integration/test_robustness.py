"""Operations under faults, with real processes and sockets: shards, publisher restarts,
a subscriber that stops reading, and a fuzz of random and mutated frames."""

from __future__ import annotations

import random
import time

import zmq
from fuzzlib import mutate
from service_harness import TEST_MODEL, ServiceUnderTest, quote

from hft_infer.transport.codec import topic_for
from hft_infer.transport.schema import Decision, Outcome, Reason, Status


def _identity(st: Status) -> bool:
    return st.received == st.decided + st.shed + st.conflated + st.rejected + st.pending


def test_two_shards_split_one_feed_and_decide_each_instrument_once():
    # One publisher; two shard services subscribe to it through topic prefixes.
    shard0 = ServiceUnderTest(TEST_MODEL + ["universe.instruments=16"], name="s0", extra_args=["--shard", "0/2"])
    shard1 = ServiceUnderTest(TEST_MODEL + ["universe.instruments=16", f"ingest.endpoint=\"{shard0.endpoint('md')}\""],
                              name="s1", extra_args=["--shard", "1/2"])
    try:
        shard0.start(n_topics=9)  # its 8 instruments and the service topic
        shard1.start(n_topics=8, publisher=shard0.pub)  # the XPUB forwards the service topic once
        frames = [(topic_for(inst), quote(inst, seq)) for seq in range(20) for inst in range(16)]
        shard0.send(frames, gap_s=0.0005)
        final0, final1 = shard0.stop(), shard1.stop()
        d0 = [d for d in shard0.decisions() if d.status == Outcome.DECIDED]
        d1 = [d for d in shard1.decisions() if d.status == Outcome.DECIDED]
    finally:
        shard1.close()
        shard0.close()
    inst0, inst1 = {d.instrument for d in d0}, {d.instrument for d in d1}
    assert inst0 == set(range(0, 16, 2)) and inst1 == set(range(1, 16, 2))  # disjoint, complete
    assert final0.received == final1.received == 160  # each shard saw only its instruments
    for final, decided in ((final0, d0), (final1, d1)):
        assert _identity(final) and final.pending == 0 and final.rejected == 0
        answered = {(d.instrument, d.seq) for d in decided}
        assert len(answered) == len(decided)  # no event decided twice
        assert len(decided) + final.conflated + final.shed == 160


def test_publisher_restart_mid_stream_is_detected_and_service_recovers():
    with ServiceUnderTest() as svc:
        svc.start()
        svc.send_quotes([(i % 4, i // 4) for i in range(40)], gap_s=0.0005)
        # the publisher dies and a new one binds the same endpoint, restarting sequences at 0
        svc.pub.close(0)
        svc.pub = svc.ctx.socket(zmq.XPUB)
        svc.pub.bind(svc.endpoint("md"))
        subs = 0
        while subs < 65 and svc.pub.poll(5000):  # the service reconnects and resubscribes by itself
            if svc.pub.recv()[:1] == b"\x01":
                subs += 1
        assert subs == 65, "service did not resubscribe after the publisher restart"
        svc.send_quotes([(i % 4, i // 4) for i in range(40)], gap_s=0.0005)
        final = svc.stop()
        resets = svc.summary()["counters"]["seq_resets"]
    assert final.received == 80 and final.pending == 0 and _identity(final)
    assert resets == 4  # one per instrument: sequence went back to 0
    decided_after = [d for d in svc.decisions() if d.status == Outcome.DECIDED]
    assert decided_after, "no decisions"


def test_a_subscriber_that_stops_reading_costs_counted_drops_not_a_stall():
    # per_instrument: a frame per answer, so 4000 events overrun the 50-frame queues quickly
    with ServiceUnderTest(TEST_MODEL + ["egress.snd_hwm=50", "egress.mode=per_instrument"]) as svc:
        svc.start()
        stuck = svc.ctx.socket(zmq.SUB)  # subscribes, never reads
        stuck.setsockopt(zmq.RCVHWM, 50)
        stuck.setsockopt(zmq.SUBSCRIBE, b"")
        stuck.connect(svc.endpoint("decisions"))
        time.sleep(0.5)  # let it connect
        svc.send_quotes([(i % 64, i // 64) for i in range(4000)], gap_s=0.0)
        svc.stop()
        summary = svc.summary()
        stuck.close(0)
    assert summary["counters"]["egress_dropped"] > 0
    # the service kept processing: every event has an outcome in its own accounting
    acc = summary["accounting"]
    assert acc["received"] == 4000 and acc["pending"] == 0
    assert acc["received"] == acc["decided"] + acc["shed"] + acc["conflated"] + acc["rejected"]


def test_fuzzed_frames_are_all_rejected_with_a_reason_and_never_crash():
    """A few thousand random and mutated frames (tools/fuzz_service.py runs >= 100k)."""
    rng = random.Random(1234)
    good = [quote(i % 64, i // 64) for i in range(200)]
    frames = []
    for _ in range(3000):
        choice = rng.random()
        if choice < 0.3:
            payload = rng.randbytes(rng.randint(0, 300))
        else:
            payload = mutate(rng.choice(good), rng)
        frames.append((topic_for(rng.randrange(64)), payload))
    with ServiceUnderTest() as svc:
        svc.start()
        svc.send(frames)
        svc.send_quotes([(1, 10_000)])  # still alive and deciding afterwards
        final = svc.stop()
        code = svc.proc.returncode
    assert code == 0
    assert final.received == 3001 and _identity(final) and final.pending == 0
    # a mutation can leave a frame valid: those are decided, every other one rejected with a reason
    shed_reasons = (Reason.STALE, Reason.QUEUE_FULL)
    assert final.rejected == sum(final.rejected_by_reason[r] for r in Reason if r not in shed_reasons)
    assert final.rejected > 2500
    assert any(isinstance(d, Decision) and d.instrument == 1 and d.seq == 10_000 for d in svc.messages())
