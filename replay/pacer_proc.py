"""The pacer process: bind the feed, wait for the service's subscriptions, send on schedule.

    python -m hft_infer.replay.pacer_proc --feed FEED.npz --endpoint EP --out RESULT.npz
        [--topics N] [--settle-ms MS] [--core C] [--io-cores 1,2] [--spin] [--no-topic-frame]
        [--reset-first]

Replies on stdout (replay.child): `bound` once the feed's XPUB is bound,
`subscribed K` once K >= N subscriptions have arrived (and, with --settle-ms,
none for that long: every subscriber connected gets every frame), then after
`go START_MONO_NS` it paces the feed (replay.pacer) from that
CLOCK_MONOTONIC time (with --reset-first, a Reset of every instrument goes
out just before the first event, so a running service decides the replay as
if it had just started), sends `progress I N` about once a second, writes the
intended and actual send times to --out and replies `done SENT`. It keeps the
socket open until `exit` (or the end of stdin), so that frames still queued
in libzmq are delivered.

`--endpoint iceoryx2:SERVICE` publishes on that iceoryx2 service instead (transport/shm.py): no
topic frames, its publisher waits for room in a full subscriber buffer (never drops, as the
XPUB's SNDHWM 0), and `subscribed` counts the service's subscribers. With --shard-map,
`--shard-endpoints iceoryx2:S0,iceoryx2:S1,...` (one per shard, in shard order) publishes each
shard's frames on its own service (iceoryx2 has no topics to split one feed by), and `subscribed`
counts the services that have a subscriber; --endpoint is then not opened.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import zmq

from hft_infer.clock import perf_ns
from hft_infer.replay.child import Commands, log, parse_cores, pin_self, reply, set_timer_slack, zmq_context
from hft_infer.replay.pacer import BATCH_OVERHEAD_BYTES, EVENT_BATCH_BYTES_PER_EVENT, Pacer, load_feed
from hft_infer.transport.codec import SERVICE_TOPIC, encode
from hft_infer.transport.schema import ALL_INSTRUMENTS, BYTES_PER_LEVEL, Reset
from hft_infer.transport.shm import ShmPublisher, service_of
from hft_infer.transport.sockets import EndpointError, bind

SUBSCRIPTION_LOG_NS = 1_000_000_000  # while waiting for subscriptions: the count in the log at most this often


def _shards_of_events(path: str, feed) -> tuple[np.ndarray, int]:
    """The shard of each of the feed's events, from --shard-map's instrument -> shard table."""
    with np.load(path) as z:
        ids, shard, count = z["ids"].astype(np.int64), z["shard"].astype(np.int64), int(z["count"])
    order = np.argsort(ids)
    ids, shard = ids[order], shard[order]
    inst = np.frombuffer(feed.columns.instrument, dtype="<u4").astype(np.int64)
    pos = np.minimum(np.searchsorted(ids, inst), len(ids) - 1)
    if not (ids[pos] == inst).all():
        raise ValueError("--shard-map: the feed has instruments that no shard owns")
    return shard[pos], count


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pacer_proc")
    ap.add_argument("--feed", required=True)
    ap.add_argument("--endpoint", required=True, help="a ZeroMQ endpoint to bind, or iceoryx2:SERVICE")
    ap.add_argument("--shm-buffer", type=int, default=4096, help="iceoryx2: the service's subscriber buffer")
    ap.add_argument("--out", required=True)
    ap.add_argument("--topics", type=int, default=1, help="subscriptions to wait for")
    ap.add_argument("--settle-ms", type=float, default=0.0)
    ap.add_argument("--core", type=int, default=None)
    ap.add_argument("--io-cores", default="")
    ap.add_argument("--spin", action="store_true")
    ap.add_argument("--no-topic-frame", action="store_true")
    ap.add_argument("--reset-first", action="store_true", help="send a Reset of every instrument first")
    ap.add_argument("--feed-batch", type=int, default=1,
                    help="send up to N events that are due together as one EventBatch frame (default 1: none)")
    ap.add_argument("--feed-batch-us", type=float, default=100.0,
                    help="with --feed-batch: at most one frame per this many µs (default 100)")
    ap.add_argument("--shard-map", metavar="NPZ",
                    help="with --feed-batch: arrays `ids` and `shard` (each instrument's shard) and `count`: one "
                         "EventBatch per shard under its batch topic (the shard bench)")
    ap.add_argument("--shard-endpoints", default="", metavar="EP,EP,...",
                    help="with --shard-map: one iceoryx2:SERVICE per shard, in shard order: each shard's frames "
                         "on its own service (--endpoint is not opened)")
    a = ap.parse_args(argv)
    shard_services = [service_of(ep) for ep in a.shard_endpoints.split(",")] if a.shard_endpoints else []
    if shard_services and (None in shard_services or not a.shard_map or a.feed_batch < 2):
        ap.error("--shard-endpoints: iceoryx2:SERVICE endpoints only, with --shard-map and --feed-batch > 1")
    slack = set_timer_slack()
    ctx = zmq_context(parse_cores(a.io_cores))
    placed = pin_self(a.core)
    feed, offsets = load_feed(a.feed)
    if a.feed_batch > 1 and feed.columns is None:
        log(f"pacer: --feed-batch {a.feed_batch} ignored: the feed has no columns (captured frames go as captured)")
        a.feed_batch = 1
    log(f"pacer: {'spin' if a.spin else 'sleep'}, {placed}, io cores {a.io_cores or '-'}, "
        f"timer slack {'1 ns' if slack else 'default'}, feed batch {a.feed_batch}")
    service = service_of(a.endpoint)
    shard_pubs: list[ShmPublisher] | None = None
    try:
        largest = max(map(len, feed.payloads), default=64)
        if a.feed_batch > 1 and feed.columns is not None:
            largest = max(largest, BATCH_OVERHEAD_BYTES + a.feed_batch * (
                EVENT_BATCH_BYTES_PER_EVENT + feed.columns.levels * BYTES_PER_LEVEL))
        if shard_services:
            # RetryUntilDelivered, as below; `pub` stands for them where one publisher is asked about
            shard_pubs = [ShmPublisher(name, buffer=a.shm_buffer, max_frame_bytes=largest, block=True,
                                       role=f"pacer-s{k}") for k, name in enumerate(shard_services)]
            pub = shard_pubs[0]
            a.no_topic_frame = True
        elif service is not None:
            # RetryUntilDelivered: never drop, as SNDHWM 0 below (a slow service shows up as latency)
            pub = ShmPublisher(service, buffer=a.shm_buffer, max_frame_bytes=largest,
                               block=True, role="pacer")
            a.no_topic_frame = True
        else:
            pub = ctx.socket(zmq.XPUB)
            pub.setsockopt(zmq.SNDHWM, 0)  # never drop: a slow service shows up as latency
            pub.setsockopt(zmq.LINGER, 2000)
            bind(pub, a.endpoint)
    except EndpointError as e:
        reply("error", str(e))
        return 2
    reply("bound")

    def progress(i: int, n: int) -> None:
        reply("progress", i, n)

    # built and prepared (its work in proportion to the feed: Pacer.prepare) before `subscribed`
    # is reported, so that nothing of it falls between `go` and the first send
    shard_of, shard_count = _shards_of_events(a.shard_map, feed) if a.shard_map and a.feed_batch > 1 else (None, 1)
    if shard_pubs is not None and len(shard_pubs) != shard_count:
        reply("error", f"--shard-endpoints names {len(shard_pubs)} services for {shard_count} shards")
        return 2
    pacer = Pacer(pub, feed, offsets, topic_frame=not a.no_topic_frame, spin=a.spin, progress_hook=progress,
                  feed_batch=a.feed_batch, feed_batch_us=a.feed_batch_us, shard_of=shard_of, shard_count=shard_count,
                  shard_socks=shard_pubs)
    pacer.prepare()
    commands = Commands()
    subscribed, last_sub = 0, perf_ns()
    logged_subs, next_log = -1, perf_ns() + SUBSCRIPTION_LOG_NS  # -1: "0 so far" is worth a line too
    settle_ns = int(a.settle_ms * 1e6)
    go = None
    reported = False
    while go is None:
        if shard_pubs is not None:  # iceoryx2 per shard: each service with a subscriber is one
            time.sleep(0.02)
            now_subscribed = sum(p.subscribers() > 0 for p in shard_pubs)
            if now_subscribed > subscribed:
                subscribed, last_sub = now_subscribed, perf_ns()
        elif service is not None:  # iceoryx2: the service's subscriber is the one "subscription"
            time.sleep(0.02)
            if pub.subscribers() > subscribed:
                subscribed = pub.subscribers()
                last_sub = perf_ns()
        elif pub.poll(20):
            while pub.poll(0):
                if pub.recv()[:1] == b"\x01":
                    subscribed += 1
                    last_sub = perf_ns()
        if not reported and subscribed != logged_subs and perf_ns() >= next_log:
            # how far the subscriptions got, in the log a driver's timeout error quotes
            log(f"pacer: {subscribed} of {a.topics} subscriptions so far")
            logged_subs, next_log = subscribed, perf_ns() + SUBSCRIPTION_LOG_NS
        if not reported and subscribed >= a.topics and perf_ns() - last_sub >= settle_ns:
            reply("subscribed", subscribed)
            log(f"pacer: {subscribed} subscriptions")
            reported = True
        for line in commands.poll(0):
            if line.startswith("go"):
                go = int(line.split()[1])
            elif line == "exit":
                return 0
        if commands.eof:
            return 0

    if a.reset_first:
        for p in shard_pubs or [pub]:
            _send_reset(p, topic_frame=not a.no_topic_frame)
    res = pacer.run(start_mono_ns=go)
    np.savez(a.out, intended=res.intended_mono_ns, actual=res.actual_mono_ns, sent=np.int64(res.sent),
             elapsed_s=np.float64(res.elapsed_s))
    reply("done", res.sent)
    log(f"pacer: sent {res.sent} in {res.elapsed_s:.3f} s ({res.rate_achieved:,.0f}/s)")
    while not commands.eof:
        if "exit" in commands.poll(1.0):
            break
    for p in shard_pubs or [pub]:
        p.close()  # zmq LINGER: what libzmq still holds goes out first
    ctx.term()
    return 0


def _send_reset(pub, *, topic_frame: bool) -> None:
    """One Reset of every instrument, on the service topic; ordered before the feed's first frame
    because both leave through this one socket."""
    payload = encode(Reset(ts_send_ns=time.time_ns(), instrument=ALL_INSTRUMENTS))
    if isinstance(pub, ShmPublisher):
        pub.send(payload)
        return
    if topic_frame:
        pub.send(SERVICE_TOPIC, zmq.SNDMORE)
    pub.send(payload)


if __name__ == "__main__":
    sys.exit(main())
