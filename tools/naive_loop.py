#!/usr/bin/env python3
"""The naive implementation, for scale, and the side-by-side comparison with hft-infer.

    python tools/naive_loop.py compare [--rates 250,500,1000,2000] [--hft-rates 10000,20000,50000,100000]
                                       [--duration 5] [--json out.json]
    python tools/naive_loop.py serve --md ENDPOINT --decisions ENDPOINT   (the naive service alone)

The naive service is what a first attempt looks like: asyncio + zmq.asyncio,
JSON messages, per-instrument windows as Python lists, and one eager torch
call per message on the same model as hft-infer's default (the shipped
mlp_small checkpoint, `forward_window`). Both services are driven by the
same open-loop pacer and measured the same way: tick_to_decision from each
event's intended send time, so a backlog shows up as latency.

A rate counts as *sustained* when nothing is lost and the p99 tick-to-decision
stays under --sustain-p99-ms (default 20 ms): past that, the queue grows for
as long as the load lasts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import zmq
from benchlib import cell, table, write_json

from hft_infer.app.cli import build_parser
from hft_infer.clock import perf_ns
from hft_infer.metrics import new_histogram, record_array, summarize

# ----------------------------------------------------------------------------- the naive service

async def naive_serve(md: str, decisions: str, checkpoint: str) -> None:
    import torch
    import zmq.asyncio

    from hft_infer.models.checkpoint import load_model

    torch.set_num_threads(1)
    model, version = load_model(checkpoint)
    window = model.spec.window
    width = model.spec.features
    levels = model.spec.levels
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.connect(md)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.bind(decisions)
    windows: dict[int, list[list[float]]] = {}
    print("naive: ready", flush=True)
    while True:
        topic, payload = await sub.recv_multipart()
        msg = json.loads(payload)
        if msg.get("stop"):
            break
        inst = msg["instrument"]
        row = msg["book"][: 4 * levels] + [0.0] * (4 * levels - len(msg["book"][: 4 * levels])) + [0.0, 0.0]
        rows = windows.setdefault(inst, [])
        rows.append(row)
        if len(rows) > window:
            rows.pop(0)
        padded = [[0.0] * width] * (window - len(rows)) + rows
        with torch.no_grad():
            score = float(model.forward_window(torch.tensor([padded], dtype=torch.float32))[0])
        action = 1 if score > 0.2 else (-1 if score < -0.2 else 0)
        await pub.send_multipart([topic, json.dumps({"instrument": inst, "seq": msg["seq"], "action": action,
                                                     "score": score, "model": version}).encode()])
    await asyncio.sleep(0.5)
    ctx.destroy(linger=500)


# ----------------------------------------------------------------------------- the comparison

def _json_feed(events):
    from hft_infer.replay.pacer import EncodedFeed
    from hft_infer.transport.codec import topic_for

    topics, payloads = [], []
    for i in range(events.shape[0]):
        e = events[i]
        topics.append(topic_for(int(e["instrument"])))
        payloads.append(bytearray(json.dumps({"instrument": int(e["instrument"]), "seq": int(e["seq"]),
                                              "book": e["book"].reshape(-1).tolist()}).encode()))
    return EncodedFeed(topics, payloads, [-1] * len(payloads))


def run_naive(rate: float, duration: float, seed: int, checkpoint: str, sustain_p99_ms: float,
              spin: bool = True) -> dict:
    from hft_infer.app.launcher import private_runtime_dir
    from hft_infer.replay.pacer import Pacer, constant_rate
    from hft_infer.replay.synthetic import SyntheticConfig, generate
    from hft_infer.transport.sockets import bind

    n = int(rate * duration)
    events = generate(n, SyntheticConfig(instruments=64, levels=10, seed=seed, rate_hz=rate))
    feed = _json_feed(events)
    runtime = private_runtime_dir("hft-naive-")
    md, dec = f"ipc://{runtime}/md.sock", f"ipc://{runtime}/dec.sock"
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    bind(pub, md)
    proc = subprocess.Popen([sys.executable, __file__, "serve", "--md", md, "--decisions", dec,
                             "--checkpoint", checkpoint], stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()  # "naive: ready"
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(dec)
        pub.poll(30_000)
        pub.recv()  # its subscription arrived
        time.sleep(0.3)  # and our SUB's to its PUB
        got_t, got_p = [], []

        def idle():
            while sub.poll(0):
                parts = sub.recv_multipart(zmq.NOBLOCK)
                got_t.append(perf_ns())
                got_p.append(parts[1])

        pace = Pacer(pub, feed, constant_rate(n, rate), idle_hook=idle, spin=spin).run()
        deadline = time.monotonic() + 30
        last = time.monotonic()
        while time.monotonic() < deadline and len(got_p) < n and time.monotonic() - last < 3:
            if sub.poll(100):
                idle()
                last = time.monotonic()
        pub.send_multipart([b"\0\0\0\0", json.dumps({"stop": True}).encode()])
    finally:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        ctx.destroy(linger=0)
        shutil.rmtree(runtime, ignore_errors=True)
    seq_index = {(int(events[i]["instrument"]), int(events[i]["seq"])): i for i in range(n)}
    ticks = []
    for t, p in zip(got_t, got_p):
        d = json.loads(p)
        i = seq_index.get((d["instrument"], d["seq"]))
        if i is not None:
            ticks.append(t - pace.intended_mono_ns[i])
    h = new_histogram()
    record_array(h, np.asarray(ticks, dtype=np.int64))
    s = summarize(h)
    lost = n - len(ticks)
    return {"impl": "naive", "rate": rate, "rate_achieved": pace.rate_achieved, "tick_to_decision": s,
            "lost": lost, "sustained": lost == 0 and s["p99_us"] is not None and s["p99_us"] < sustain_p99_ms * 1e3}


def run_hft(rate: float, duration: float, seed: int, sustain_p99_ms: float, extra: list[str],
            pacer: str = "spin") -> dict:
    from hft_infer.app.bench import run

    args = build_parser().parse_args(["bench", "--rate", str(rate), "--duration", str(duration), "--warmup", "1",
                                      "--seed", str(seed), "--quiet", "--pacer", pacer, *extra])
    out, _ = run(args)
    s = out["tick_to_decision"]
    lost = out["accounting"]["lost"]
    return {"impl": "hft-infer", "rate": rate, "rate_achieved": out["rate_achieved"], "tick_to_decision": s,
            "lost": lost, "accounting": out["accounting"], "stages": out["stages"],
            "sustained": lost == 0 and s["p99_us"] is not None and s["p99_us"] < sustain_p99_ms * 1e3}


def compare(a: argparse.Namespace) -> int:
    rows = []
    for rate in [float(x) for x in a.rates.split(",")]:
        rows.append(run_naive(rate, a.duration, a.seed, a.checkpoint, a.sustain_p99_ms, spin=a.pacer == "spin"))
        print(_fmt(rows[-1]), file=sys.stderr, flush=True)
    for rate in [float(x) for x in a.hft_rates.split(",")]:
        rows.append(run_hft(rate, a.duration, a.seed, a.sustain_p99_ms, a.hft_args, a.pacer))
        print(_fmt(rows[-1]), file=sys.stderr, flush=True)
    naive_ok = [r for r in rows if r["impl"] == "naive" and r["sustained"]]
    hft_ok = [r for r in rows if r["impl"] == "hft-infer" and r["sustained"]]
    summary = {"rows": rows}
    if naive_ok:
        best = max(naive_ok, key=lambda r: r["rate"])
        same = next((r for r in rows if r["impl"] == "hft-infer" and r["rate"] == best["rate"]), None)
        if same is None:
            same = run_hft(best["rate"], a.duration, a.seed, a.sustain_p99_ms, a.hft_args, a.pacer)
            rows.append(same)
        ratio = best["tick_to_decision"]["p99_us"] / same["tick_to_decision"]["p99_us"]
        top = max((r["rate"] for r in hft_ok), default=0.0)
        summary |= {"naive_max_sustained_rate": best["rate"], "p99_ratio_at_that_rate": ratio,
                    "hft_max_sustained_rate_tried": top, "rate_ratio": top / best["rate"]}
        print(_table(rows))
        print(f"\nnaive sustains {best['rate']:g}/s; at that rate hft-infer's p99 tick-to-decision is "
              f"{ratio:.1f}x lower; hft-infer sustained up to {top:g}/s tried = {top / best['rate']:.0f}x the rate")
    else:
        print(_table(rows))
        print("\nthe naive loop sustained none of the rates tried")
    if a.json:
        write_json(a.json, summary)
    return 0


def _table(rows: list[dict]) -> str:
    return "\n" + table(["impl", "offered/s", "achieved/s", "p50 µs", "p99 µs", "p99.9 µs", "max µs", "lost",
                         "sustained"],
                        [[r["impl"], r["rate"], r["rate_achieved"], *(r["tick_to_decision"][k] for k in
                          ("p50_us", "p99_us", "p999_us", "max_us")), r["lost"], r["sustained"]] for r in rows],
                        digits=0)


def _fmt(r: dict) -> str:
    """One progress line on stderr while the comparison runs."""
    s = r["tick_to_decision"]
    return (f"{r['impl']} @ {r['rate']:g}/s: achieved {r['rate_achieved']:.0f}/s, tick-to-decision p50 "
            f"{cell(s['p50_us'], 0)} / p99 {cell(s['p99_us'], 0)} µs, lost {r['lost']}, "
            f"{'sustained' if r['sustained'] else 'not sustained'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--md", required=True)
    s.add_argument("--decisions", required=True)
    s.add_argument("--checkpoint", default="builtin:default")
    c = sub.add_parser("compare")
    c.add_argument("--rates", default="250,500,1000,2000", help="naive loop rates (events/s)")
    c.add_argument("--hft-rates", default="10000,20000,50000,100000", help="hft-infer rates (events/s)")
    c.add_argument("--duration", type=float, default=5.0)
    c.add_argument("--seed", type=int, default=1)
    c.add_argument("--checkpoint", default="builtin:default")
    c.add_argument("--sustain-p99-ms", type=float, default=20.0)
    c.add_argument("--json")
    c.add_argument("--pacer", choices=("spin", "sleep"), default="sleep",
                   help="sleep (default): on a 2-core machine a spinning pacer takes a whole core that the "
                        "service's and publishers' I/O threads need")
    c.add_argument("hft_args", nargs=argparse.REMAINDER, help="extra hft-infer bench args after --")
    a = ap.parse_args()
    if a.cmd == "serve":
        asyncio.run(naive_serve(a.md, a.decisions, a.checkpoint))  # plain asyncio: the naive baseline
        return 0
    a.hft_args = [x for x in a.hft_args if x != "--"]
    return compare(a)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
