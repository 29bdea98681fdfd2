#!/usr/bin/env python3
"""Fuzz a running service with random and mutated frames (issue 9: >= 100k frames).

    python tools/fuzz_service.py [--frames 100000] [--seed 1] [--json fuzz.json]

Starts `hft-infer serve` (default config, private runtime dir), publishes a
mix of random byte strings, mutated valid quotes/trades (bytes flipped, cut,
inserted), valid frames with bad topics or framing, and valid events; then
stops the service and checks: it never crashed (exit 0), every frame it read
is accounted (`received = decided + shed + conflated + rejected`, pending 0),
every rejection has a reason, and it still decided valid events at the end.
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

import numpy as np
import zmq
from fuzzlib import mutate

from hft_infer.app.launcher import ServiceProcess, open_feed_publisher, private_runtime_dir, subscribe_decisions
from hft_infer.transport.codec import EgressDecoder, encode, pack_book, topic_for
from hft_infer.transport.schema import Decision, Quote, Reason, Status, Trade


def corpus(rng: random.Random, n: int) -> list[list[bytes]]:
    lv = np.abs(np.random.default_rng(0).normal(100, 1, (10, 4))).astype(np.float32)
    seeds = [encode(Quote(i % 64, i, i, 0, 10, pack_book(lv))) for i in range(64)]
    seeds += [encode(Trade(i % 64, i, i, 0, 100.5, 3.0, 1)) for i in range(16)]
    frames = []
    for _ in range(n):
        r = rng.random()
        topic = topic_for(rng.randrange(64))
        if r < 0.25:
            frames.append([topic, os.urandom(rng.randint(0, 400))])
            continue
        if r < 0.30:  # framing: a lone topic-prefixed frame, or three frames
            frames.append([topic + os.urandom(rng.randint(0, 50))] if rng.random() < 0.5
                          else [topic, rng.choice(seeds), b"x"])
            continue
        frames.append([topic, mutate(rng.choice(seeds), rng, max_ops=8, max_span=16)])
    return frames


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rate", type=float, default=20_000, help="frames/s offered")
    ap.add_argument("--json")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    frames = corpus(rng, a.frames)
    runtime = private_runtime_dir("hft-fuzz-")
    ctx = zmq.Context()
    svc = ServiceProcess(config=None, overrides=["service.name=fuzz"], run_dir=Path(runtime) / "run",
                         log_dir=Path(runtime), env=dict(os.environ, HFT_INFER_RUNTIME_DIR=runtime))
    try:
        pub = open_feed_publisher(ctx, f"ipc://{runtime}/fuzz-md.sock")
        svc.start()
        col = subscribe_decisions(ctx, f"ipc://{runtime}/fuzz-decisions.sock")
        svc.wait_ready(pub, col, n_topics=64)
        t0 = time.perf_counter()
        gap = 1.0 / a.rate
        for i, f in enumerate(frames):
            pub.send_multipart(f)
            if i % 64 == 0:
                col.poll()
                lag = t0 + i * gap - time.perf_counter()
                if lag > 0:
                    time.sleep(lag)
        for s in range(5):  # valid events after the storm: still deciding?
            pub.send_multipart([topic_for(1), encode(Quote(1, 10_000_000 + s, 0, 0, 1,
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
    msgs = [dec(p) for p in col.frames]
    final = next((m for m in reversed(msgs) if isinstance(m, Status) and m.final), None)
    alive = any(isinstance(m, Decision) and m.instrument == 1 and m.seq >= 10_000_000 and m.status == 0 for m in msgs)
    shutil.rmtree(runtime, ignore_errors=True)
    result = {
        "frames_sent": len(frames) + 5, "seconds": elapsed, "exit_code": code, "final_status": got_final,
        "received": final.received if final else None, "rejected": final.rejected if final else None,
        "decided": final.decided if final else None, "pending": final.pending if final else None,
        "rejected_by_reason": {r.name: final.rejected_by_reason[r] for r in Reason
                               if final and final.rejected_by_reason[r]},
        "identity_holds": bool(final and final.received == final.decided + final.shed + final.conflated
                               + final.rejected + final.pending),
        "still_deciding_after": alive,
    }
    print(json.dumps(result, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    ok = code == 0 and final is not None and final.pending == 0 and result["identity_holds"] and alive
    if not ok:
        print(log_tail, file=sys.stderr)
    print(f"fuzz: {'PASS' if ok else 'FAIL'}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
