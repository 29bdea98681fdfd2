#!/usr/bin/env python3
"""Fuzz a running service with random and mutated frames (issue 9: >= 100k frames).

    python tools/fuzz_service.py [--frames 100000] [--seed 1] [--json fuzz.json] [--set K=V]...

`--set` runs the storm against another configuration of the service (the model, the runner,
the ingest; e.g. `--set 'model.checkpoint=""' --set 'model.preset="lstm_a"' --set
runner.cpu_worker=true`); the universe stays the default's 64 instruments, which the corpus
is written for.

Starts `hft-infer serve` (default config, private runtime dir), publishes a
mix of random byte strings, mutated valid quotes/trades (bytes flipped, cut,
inserted), valid frames with bad topics or framing, values at the edges of
the wire's ranges (finite float64 prices above float32's maximum, ts_send_ns
of 2**64-1 and -2**63, seq jumps to 2**64-1, negative and huge priorities,
wrong field types with a readable instrument and seq), messages that are not
events on the feed (Decision, Status, Heartbeat, Reset) and valid events;
EventBatch frames (many events in one frame: valid ones of quotes and trades,
mutated ones, and ones whose columns do not match `n` or `n_levels`, on the
batch topic and on a wrong one); then stops the service and checks:

- it never crashed (exit 0) and sent its final Status;
- every frame is accounted: `received` equals the frames sent minus the
  heartbeats and resets (which are not events; a lone 4-byte frame followed by
  a single-frame message counts one or two, README Framing), an EventBatch counting its `n`
  events when it stands for n quotes and trades (codec.events_of_batch) and one
  event (rejected) when it does not, and `received = decided +
  shed + conflated + rejected + pending` with pending 0;
- every rejected frame whose instrument and seq can be read is answered:
  at least as many REJECTED answers as frames that the codec's own checks
  (transport/codec.validate_*, run here) reject and that name a readable
  instrument and seq, and no answer names an event that was never sent;
- it still decides valid events after the storm.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import zmq
from benchlib import write_json
from fuzzlib import mutate

from hft_infer.app.launcher import ServiceProcess, open_feed_publisher, private_runtime_dir, subscribe_decisions
from hft_infer.transport.codec import (
    BATCH_TOPIC,
    SERVICE_TOPIC,
    EgressDecoder,
    IngressDecoder,
    decisions_of_batch,
    encode,
    event_batch,
    events_of_batch,
    pack_book,
    reset_topic_ok,
    topic_for,
    validate_quote,
    validate_trade,
)
from hft_infer.transport.schema import (
    Decision,
    DecisionBatch,
    EventBatch,
    Heartbeat,
    Outcome,
    Quote,
    Reason,
    Reset,
    Status,
    Trade,
)

FINAL_SEQ = 10_000_000
EDGE_INTS = [0, 1, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1, -1, -(2**31), -(2**63)]
EDGE_FLOATS = [1e39, 1e300, 3.4e38, 2.0**127, -0.0, float("nan"), float("inf"), -1.0, 5e-324]


def edge_frame(rng: random.Random, inst: int, seq: int, lv: np.ndarray) -> list[bytes]:
    """A message with values at the edges of the wire's ranges."""
    topic = topic_for(inst)
    k = rng.randrange(7)
    if k == 0:
        return [topic, encode(Trade(inst, seq, 0, 0, rng.choice(EDGE_FLOATS), rng.choice(EDGE_FLOATS + [1.0]),
                                    rng.choice([1, -1, 0, 2])))]
    if k == 1:
        return [topic, encode(Quote(inst, seq, rng.choice(EDGE_INTS), rng.choice(EDGE_INTS), 10, pack_book(lv)))]
    if k == 2:  # a sequence jump
        return [topic, encode(Quote(inst, rng.choice([2**64 - 1, 2**63, seq + 10**9, 0]), 0, 0, 10, pack_book(lv)))]
    if k == 3:
        return [topic, encode(Quote(inst, seq, 0, 0, 10, pack_book(lv), rng.choice([-2, 4, 99, 2**40, -(2**63)])))]
    if k == 4:  # wrong field types, instrument and seq readable
        return [topic, msgpack.packb([rng.choice([1, 2]), inst, seq, 0, 0, rng.choice(["x", True, None, 1.5]),
                                      b"\x00" * 16, True], use_bin_type=True)]
    if k == 5:  # not an event on the feed
        return [topic, rng.choice([encode(Decision(inst, seq, 0, 0, 0, 0.0, 0, 0, 0, 0, "")),
                                   encode(Status(1, 2, 3, 4, 5, 6, 7, 8, 9, [0]))])]
    return [SERVICE_TOPIC, rng.choice([encode(Heartbeat(1, "fuzz")), encode(Reset(1, rng.choice([inst, 2**32 - 1])))])]


def batch_frame(rng: random.Random, seq0: int) -> list[bytes]:
    """An EventBatch message: valid (quotes, or quotes and trades; instruments known and not,
    sequences from a fresh range, now and then a NaN, a bad side or an unknown kind), mutated, or
    with columns that do not fit `n` / `n_levels`; mostly on the batch topic."""
    n = rng.choice([1, 2, 5, 17, 64, 200])
    npr = np.random.default_rng(rng.randrange(2**32))
    inst = npr.integers(0, 66, n)  # 64 and 65: unknown instruments
    seq = seq0 + np.arange(n)
    books = np.abs(npr.normal(100, 1, (n, 10, 4))).astype(np.float32)
    if rng.random() < 0.2:
        books[rng.randrange(n), rng.randrange(10), rng.randrange(4)] = rng.choice([np.nan, np.inf, -1.0])
    kw = {}
    if rng.random() < 0.4:  # with trades
        kind = npr.integers(0, 2, n)  # Kind.QUOTE 0, Kind.TRADE 1
        if rng.random() < 0.1:
            kind[rng.randrange(n)] = rng.choice([2, 3, 255])  # not our schema: the whole frame is one DECODE_ERROR
        side = npr.choice([1, -1], n)
        if rng.random() < 0.1:
            side[rng.randrange(n)] = rng.choice([0, 2, -128])
        kw = dict(kind=kind, price=npr.uniform(99, 101, n), size=npr.uniform(1, 10, n), side=side)
    batch = event_batch(inst, seq, seq, np.zeros(n, np.int64), books, **kw)
    r = rng.random()
    if r < 0.55:
        payload = encode(batch)
    elif r < 0.8:
        payload = mutate(encode(batch), rng, max_ops=4, max_span=8)
    else:  # columns that do not fit n or n_levels
        fields = {f: getattr(batch, f) for f in batch.__struct_fields__}
        k = rng.randrange(4)
        if k == 0:
            fields["n"] = rng.choice([0, n + 1, 2**31, 2**62])
        elif k == 1:
            fields["n_levels"] = rng.choice([0, 9, 11, 1000])
        elif k == 2:
            fields["seq"] = fields["seq"][:-8]
        else:
            fields["book"] = fields["book"][: len(fields["book"]) // 2]
        payload = encode(EventBatch(**fields))
    # a wrong topic: an instrument's (one the service subscribes to: others never reach it)
    topic = BATCH_TOPIC if rng.random() < 0.9 else topic_for(rng.randrange(64))
    return [topic, payload]


def batch_events(payload: bytes, dec) -> tuple[int, list[tuple[int, int]]]:
    """(events the service counts for an EventBatch payload, its (instrument, seq) pairs) or
    (-1, []) when the payload is not an EventBatch: n events when it stands for n Quotes and
    Trades (codec.events_of_batch: columns that fit n and n_levels, kinds 0 or 1), else one event
    (the frame, one DECODE_ERROR: README, Wire schema)."""
    try:
        m = dec(payload)
    except Exception:  # noqa: BLE001 - not decodable: not an EventBatch
        return -1, []
    if type(m) is not EventBatch:
        return -1, []
    if events_of_batch(m) is None:
        return 1, []
    insts = np.frombuffer(m.instrument, dtype="<u4").tolist()
    seqs = np.frombuffer(m.seq, dtype="<u8").tolist()
    return m.n, list(zip(insts, seqs))


def corpus(rng: random.Random, n: int) -> list[list[bytes]]:
    lv = np.abs(np.random.default_rng(0).normal(100, 1, (10, 4))).astype(np.float32)
    seeds = [encode(Quote(i % 64, i, i, 0, 10, pack_book(lv))) for i in range(64)]
    seeds += [encode(Trade(i % 64, i, i, 0, 100.5, 3.0, 1)) for i in range(16)]
    frames = []
    for k in range(n):
        r = rng.random()
        inst = rng.randrange(64)
        topic = topic_for(inst)
        if r < 0.20:
            frames.append([topic, rng.randbytes(rng.randint(0, 400))])
        elif r < 0.25:  # framing: a lone topic-prefixed frame, or three frames
            frames.append([topic + rng.randbytes(rng.randint(0, 50))] if rng.random() < 0.5
                          else [topic, rng.choice(seeds), b"x"])
        elif r < 0.45:
            frames.append(edge_frame(rng, inst, 1000 + k, lv))
        elif r < 0.55:
            frames.append(batch_frame(rng, 10**12 + 1000 * k))
        else:
            frames.append([topic, mutate(rng.choice(seeds), rng, max_ops=8, max_span=16)])
    return frames


def _any_ext(code: int, data: bytes) -> tuple[int, bytes]:
    """Any ext type, negative codes too: msgpack's own ExtType refuses codes below 0, which the
    msgpack spec allows and msgspec (the service's decoder) reads."""
    return code, data


def expectations(frames: list[list[bytes]]) -> dict:
    """What the codec's own definitions say of the corpus (no copy of the service's ingest):
    events the service must count, and readable events the codec rejects, which it must answer.

    Framing (README, Framing): every message is one event, whatever its frames, except a lone
    4-byte frame followed by a single-frame message, which reads as one [topic, payload] message
    when both are queued when the first is read ("mergeable": it depends on timing, so the count
    of events is a range, `mergeable` wide)."""
    dec = IngressDecoder().decode
    not_events = readable_invalid = mergeable = 0
    batch_extra = 0  # events beyond one per frame, carried by EventBatch frames
    readable = set()
    skip = False
    for i, f in enumerate(frames):
        if skip:
            skip = False
            continue
        if len(f) == 1 and len(f[0]) == 4 and i + 1 < len(frames) and len(frames[i + 1]) == 1:
            mergeable += 1
            skip = True  # the next lone frame may be read as this one's payload (either way, not an event)
            continue
        if len(f) != 2 or len(f[0]) != 4:
            continue
        try:
            # arrays as tuples (use_list=False): an array used as a map key is hashable then, as the
            # service's untyped msgspec peek reads it -- a mutated quote whose book became a map with
            # such a key still names its instrument and seq to both (seed 4502: instrument 2, seq 18)
            peek = msgpack.unpackb(f[1], raw=True, strict_map_key=False, ext_hook=_any_ext, use_list=False)
        except Exception:  # noqa: BLE001 - not msgpack
            peek = None
        if isinstance(peek, tuple):
            peek = list(peek)
        if isinstance(peek, list) and peek and peek[0] == 5:  # an EventBatch's tag
            events, pairs = batch_events(f[1], dec)
            if events >= 0:
                batch_extra += events - 1
                readable.update(pairs)
            continue
        if isinstance(peek, list) and peek and peek[0] in (3, 4) and not isinstance(peek[0], bool):
            try:
                m = dec(f[1])
            except Exception:  # noqa: BLE001
                continue
            # a Reset where it does not belong is a rejected message (TOPIC_MISMATCH): an event
            not_events += isinstance(m, Heartbeat) or (isinstance(m, Reset) and reset_topic_ok(f[0], m.instrument))
            continue
        if not (isinstance(peek, list) and len(peek) >= 3 and peek[0] in (1, 2)):
            continue
        inst, seq = peek[1], peek[2]
        if isinstance(inst, bool) or isinstance(seq, bool) or not isinstance(inst, int) or not isinstance(seq, int):
            continue
        if not (0 <= inst <= 0xFFFFFFFD and 0 <= seq < 2**64):
            continue
        readable.add((inst, seq))
        try:
            m = dec(f[1])
        except Exception:  # noqa: BLE001 - undecodable but readable: must be answered
            readable_invalid += 1
            continue
        reason = validate_quote(m, 64) if isinstance(m, Quote) else validate_trade(m)
        readable_invalid += bool(reason)
    return {"not_events": not_events, "readable_invalid": readable_invalid, "readable": readable,
            "mergeable": mergeable, "batch_extra": batch_extra}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rate", type=float, default=20_000, help="frames/s offered")
    ap.add_argument("--json")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override one config value of the service (repeatable; not universe.*)")
    a = ap.parse_args()
    if any(o.split("=", 1)[0].strip().startswith("universe.") for o in a.set):
        ap.error("--set universe.*: the corpus is written for the default universe of 64 instruments")
    rng = random.Random(a.seed)
    frames = corpus(rng, a.frames)
    runtime = private_runtime_dir("hft-fuzz-")
    ctx = zmq.Context()
    svc = ServiceProcess(config=None, overrides=["service.name=fuzz", *a.set], run_dir=Path(runtime) / "run",
                         log_dir=Path(runtime), env=dict(os.environ, HFT_INFER_RUNTIME_DIR=runtime))
    try:
        pub = open_feed_publisher(ctx, f"ipc://{runtime}/fuzz-md.sock")
        svc.start()
        col = subscribe_decisions(ctx, f"ipc://{runtime}/fuzz-decisions.sock")
        svc.wait_ready(pub, col, n_topics=66)  # 64 instruments, the service topic and the batch topic
        t0 = time.perf_counter()
        gap = 1.0 / a.rate
        for i, f in enumerate(frames):
            pub.send_multipart(f)
            if i % 64 == 0:
                col.poll()
                lag = t0 + i * gap - time.perf_counter()
                if lag > 0:
                    time.sleep(lag)
        # valid events after the storm: still deciding? Once it has worked through the storm (its
        # answers quiet: EventBatch frames make the storm heavier than the service's rate on a small
        # machine, and quotes that wait behind it are shed STALE), a Reset first (the storm may have
        # left instrument 1 at any seq, even 2**64-1, and a lower one would be OUT_OF_ORDER)
        col.wait_quiet(0.5, 60)
        pub.send_multipart([SERVICE_TOPIC, encode(Reset(1, 1))])
        for s in range(5):
            pub.send_multipart([topic_for(1), encode(Quote(1, FINAL_SEQ + s, 0, 0, 1,
                                                           pack_book(np.ones((1, 4), np.float32))))])
        elapsed = time.perf_counter() - t0
        col.wait_quiet(0.5, 10)
        got_final = svc.terminate_and_wait(col)
        code = svc.proc.returncode
        log_tail = svc.log_path.read_text(errors="replace")[-2000:]
    finally:
        svc.close()
        ctx.destroy(linger=0)
    dec = EgressDecoder().decode
    msgs = []
    for p in col.frames:
        m = dec(p)
        msgs.extend(decisions_of_batch(m) if isinstance(m, DecisionBatch) else [m])
    final = next((m for m in reversed(msgs) if isinstance(m, Status) and m.final), None)
    alive = any(isinstance(m, Decision) and m.instrument == 1 and FINAL_SEQ <= m.seq < FINAL_SEQ + 5
                and m.status == Outcome.DECIDED for m in msgs)
    shutil.rmtree(runtime, ignore_errors=True)
    exp = expectations(frames)
    answered = [(m.instrument, m.seq) for m in msgs if isinstance(m, Decision) and m.status == Outcome.REJECTED]
    phantom = [a for a in answered if a not in exp["readable"]]
    # an EventBatch frame carries batch_extra more events; a mergeable pair is two frames and one or
    # two events (README, Framing)
    events_sent = len(frames) + 5 - exp["not_events"] + exp["batch_extra"]
    events_least = events_sent - exp["mergeable"]
    result = {
        "config_overrides": a.set,
        "frames_sent": len(frames) + 5, "events_sent": events_sent, "events_sent_least": events_least,
        "mergeable_pairs": exp["mergeable"], "seconds": elapsed, "exit_code": code,
        "final_status": got_final, "rejected_answered": len(answered),
        "readable_invalid_expected_at_least": exp["readable_invalid"], "phantom_answers": len(phantom),
        "phantom_examples": [list(x) for x in phantom[:5]],
        "received": final.received if final else None, "rejected": final.rejected if final else None,
        "decided": final.decided if final else None, "pending": final.pending if final else None,
        "rejected_by_reason": {r.name: final.rejected_by_reason[r] for r in Reason
                               if final and final.rejected_by_reason[r]},
        "identity_holds": bool(final and final.received == final.decided + final.shed + final.conflated
                               + final.rejected + final.pending),
        "still_deciding_after": alive,
        "heartbeats_and_resets": exp["not_events"],
        "ingest_disconnects": final.ingest_disconnects if final else None,
        "resets": final.resets if final else None,
    }
    print(json.dumps(result, indent=2))
    if a.json:
        write_json(a.json, result)  # with provenance: command, machine, commit, versions
    ok = (code == 0 and final is not None and final.pending == 0 and result["identity_holds"] and alive
          and events_least <= final.received <= events_sent and len(answered) >= exp["readable_invalid"]
          and not phantom)
    if not ok:
        print(log_tail, file=sys.stderr)
    print(f"fuzz: {'PASS' if ok else 'FAIL'}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
