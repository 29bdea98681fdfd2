#!/usr/bin/env python3
"""One model step as the hot loop sees it, through the engines the service runs (needs CUDA).

    python tools/bench_engines.py [--steps 3000] [--json out.json] [--quick] [--gaps 0,40]

Each engine is built by `hft_infer.runner.select.build_runtime` from a config,
exactly as `serve` builds it (pinned host feature ring, warm-up, capture or
kernel start). A step is: write the batch's slots/positions into the engine's
request buffer, `submit`, spin on `poll`, `collect` -- host-observed, timed
with perf_counter_ns, and in parts (submit, wait, collect: a table of their medians at the
end). Rows are random positive books already in the ring. Steps run back to back by default;
`--gaps 0,40` also times each row with 40 µs idle between steps (rows "ENGINE gap40"): a kernel
that answers before it has finished a request's work (the persistent LSTM's emitted pass) may
still be busy when the next request comes back to back, and the gap rows show what that costs
(lstm_a at batch 1: nothing over the copy graph, whose submit hid it, wave 43; ~3 µs over the
inline path, wave 44 -- BENCHMARKS.md).

Each engine is self-checked against the CPU engine first (runner/self_check.py),
as serve does; one that fails is built again with the check off so that its
speed is still measured, and its rows say WRONG RESULTS. Rows print as they are
measured (a timeout keeps what was done); `--models lstm_a/window,...` and
`--engines graph` pick a subset.

Also in the same run, for comparison: the floor (a trivial persistent kernel
behind the same request ring: request in, answer out) through each of the ring's
paths -- fenced, the DMA copy graph, "dma inline" (small steps read by the lead
from the pinned slot: the LSTM engines' path for one or two entries), and polling
pinned host memory in place --
and, for the persistent engines, the device time of each request (the kernel's
own stamps, detect -> done release).

Goals (issue "Engines at the floor"): lstm_a batch 1 persistent device <= 5 µs,
p50 <= 12 µs, p99 <= 20 µs; lstm_b batch 1 p99 <= 30 µs; lstm_a batch 64 p99
<= 100 µs; mlp_small batch 1 persistent p99 <= 15 µs. The table says met or
missed for each.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
from benchlib import table, write_json

from hft_infer.config import ConfigError, load_config
from hft_infer.runner.select import build_runtime

N_SLOTS = 64
MODELS = [("lstm_a", "window"), ("lstm_b", "window"), ("lstm_a", "stream"), ("mlp_small", "window")]
GOALS = {  # (model, mode, engine, batch): {metric: limit µs}
    ("lstm_a", "window", "persistent", 1): {"device_p50": 5.0, "p50": 12.0, "p99": 20.0},
    ("lstm_b", "window", "persistent", 1): {"p99": 30.0},
    ("lstm_a", "window", "persistent", 64): {"p99": 100.0},
    ("mlp_small", "window", "persistent", 1): {"p99": 15.0},
}


def pct(ns: np.ndarray) -> dict:
    us = ns / 1e3
    return {"p50": float(np.percentile(us, 50)), "p99": float(np.percentile(us, 99)),
            "p999": float(np.percentile(us, 99.9)), "max": float(us.max())}


def runtime(preset: str, mode: str, engine: str, precision: str, *, self_check: bool = True):
    cfg = load_config(None, ['model.checkpoint=""', f'model.preset="{preset}"', f'model.mode="{mode}"',
                             f'runner.engine="{engine}"', f'runner.precision="{precision}"',
                             f"universe.instruments={N_SLOTS}", 'runner.device="cuda"',
                             f"runner.self_check={'true' if self_check else 'false'}"])
    rt = build_runtime(cfg, N_SLOTS)
    rng = np.random.default_rng(1)
    store = rt.store
    store.array[:N_SLOTS] = (rng.random((N_SLOTS, store.depth, store.width)) * 10 + 95).astype(np.float32)
    for s in range(N_SLOTS):
        store.count[s] = store.depth
    return rt


def checked_runtime(preset: str, mode: str, engine: str, precision: str):
    """(runtime, verdict): the engine as serve builds it (self-checked); one that fails its
    self-check is built again without it, so that its speed is still measured, and says so."""
    try:
        return runtime(preset, mode, engine, precision), "self-check passed"
    except ConfigError as e:
        if "self-check failed" not in str(e):
            raise
        why = str(e).split("self-check failed: ", 1)[1].split(":")[0]
        return runtime(preset, mode, engine, precision, self_check=False), f"WRONG RESULTS (self-check: {why})"


def recheck(eng, rt, preset: str, mode: str, precision: str) -> str:
    """The stopped persistent engine, recompiled with its new launch options, against the CPU
    engine on the self-check stream (runner/self_check.py); returns the results column."""
    from hft_infer.runner.base import EngineFailure
    from hft_infer.runner.self_check import compare

    ref = runtime(preset, mode, "eager", precision)
    eng.kernel.precompile()
    eng._head = 0
    eng.kernel.start()
    try:
        compare(eng, rt.store, ref.engine, ref.store, n_slots=N_SLOTS, precision=precision)
        verdict = "self-check passed"
    except EngineFailure as e:
        verdict = f"WRONG RESULTS ({str(e).split(': ', 1)[1].split(':')[0]})"
    finally:
        ref.engine.close()
    eng.kernel.stop()
    return verdict


def time_steps(eng, batch: int, steps: int, depth: int, gap_us: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Host ns of each step (submit -> collect), and of its parts [steps, 3]: submit (the gather
    and the launch or ring write), the wait (spinning on poll), collect. gap_us > 0: spin that long
    after each collect before the next submit (untimed), so that a request finds the engine idle."""
    out = np.empty(steps, dtype=np.int64)
    parts = np.empty((steps, 3), dtype=np.int64)
    slots_all = np.arange(batch) % N_SLOTS
    pos = depth
    gap_ns = int(gap_us * 1000)
    clock = time.perf_counter_ns
    for i in range(steps + 50):
        slots, positions = eng.request()
        slots[:batch] = slots_all
        positions[:batch] = pos
        pos += 1
        t0 = clock()
        eng.submit(batch)
        ts = clock()
        while not eng.poll():
            pass
        tw = clock()
        eng.collect()
        t1 = clock()
        if i >= 50:  # warm-up steps left out
            out[i - 50] = t1 - t0
            parts[i - 50] = ts - t0, tw - ts, t1 - tw
        if gap_ns:
            while clock() - t1 < gap_ns:
                pass
    return out, parts


# the floor's rows: (label, transport, inline, row bytes an entry) -- "fenced" (the header written once
# the payload copy completed), "dma" (the engine's: the copy graph moves the payload, then the header),
# "dma inline" (the engine's for small steps: the lead reads them from the pinned slot, no copy graph),
# again with lstm_a's 168-byte row where the others carry 4 (what the row's PCIe reads cost the lead),
# "pinned" (polls and reads pinned host memory in place: the floor the issue quotes)
FLOORS = (("fenced", "fenced", False, 4), ("dma", "dma", False, 4), ("dma inline", "dma", True, 4),
          ("dma inline 168 B", "dma", True, 168), ("pinned", "pinned", False, 4))


def floor(steps: int, transport: str, inline: bool = False, row_bytes: int = 4) -> dict:
    """The trivial persistent kernel behind the request ring over `transport` (kernels/persistent.py),
    steps of one entry inline or not, each entry carrying `row_bytes` of rows (FLOORS)."""
    from hft_infer.kernels.persistent import FloorKernel, RequestRing

    ring = RequestRing(64, width=row_bytes // 4, n_requests=4, device="cuda", transport=transport)
    k = FloorKernel(ring, "cuda", timing=True, **({"inline_entries": 1} if inline else {}))
    k.precompile()
    k.start()
    out = np.empty(steps, dtype=np.int64)
    for i in range(steps + 50):
        slots, positions = ring.request_views(ring.next_slot)
        slots[0], positions[0] = 1, i
        t0 = time.perf_counter_ns()
        seq = ring.submit(1)
        while not ring.done(seq):
            pass
        if i >= 50:
            out[i - 50] = time.perf_counter_ns() - t0
    k.stop()
    dev = k.device_times_ns(51, steps + 50) / 1e3
    return pct(out) | {"device_p50": float(np.percentile(dev, 50))}


def _verdict(r: dict) -> str:
    goal = GOALS.get((r["model"], r["mode"], r["engine"].split()[0], r["batch"]))  # "persistent w8" too
    if not goal:
        return ""
    return ", ".join(f"{k}<={v:g}: {'met' if r.get(k, 1e9) <= v else 'MISSED'}" for k, v in goal.items())


def _row(r: dict) -> list:
    return [r["model"], r["mode"], r["engine"], r["batch"], r.get("device_p50"), r["p50"], r["p99"], r["p999"],
            r["max"], _verdict(r), r.get("correct", "")]


PARTS = ("submit", "wait", "collect")  # a step's parts (time_steps)
HEADERS = ["model", "mode", "engine", "batch", "device p50 µs", "p50 µs", "p99 µs", "p99.9 µs", "max µs", "goal",
           "results"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--models", default=",".join(f"{p}/{m}" for p, m in MODELS),
                    help="preset/mode list (default: every one)")
    ap.add_argument("--engines", default="graph,persistent")
    ap.add_argument("--quick", action="store_true", help="500 steps per row")
    ap.add_argument("--persistent-warps", default="", metavar="W,...",
                    help="also measure the persistent kernels at these num_warps (each self-checked again "
                         "against the CPU engine; rows 'persistent wN'); the engine's own launch is 4")
    ap.add_argument("--gaps", default="0", metavar="US,...",
                    help="idle time between steps, µs (default 0: back to back); each gap > 0 gives rows "
                         "'ENGINE gapUS' -- the latency of a request that finds the engine idle")
    ap.add_argument("--json", metavar="PATH")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_engines: needs a CUDA device", file=sys.stderr)
        return 2
    steps = 500 if a.quick else a.steps
    batches = [int(b) for b in a.batches.split(",")]
    gaps = [float(g) for g in a.gaps.split(",")]
    models = [tuple(m.split("/")) for m in a.models.split(",")]
    rows = []
    for label, transport, inline, row_bytes in FLOORS:
        try:
            rows.append({"model": f"floor (trivial persistent kernel, {label})", "mode": "-", "engine": "persistent",
                         "batch": 1} | floor(steps, transport, inline, row_bytes))
        except TypeError as e:  # a baseline tree's FloorKernel without the inline path (gpu_session's A/B)
            print(f"floor {label}: not in this package ({e})", flush=True)
    print(table(HEADERS, [_row(r) for r in rows]), flush=True)  # each row as it is measured: a timeout keeps them
    warps = [int(w) for w in a.persistent_warps.split(",") if w.strip()]
    variants = []
    for engine in a.engines.split(","):
        variants.append((engine, None))
        if engine == "persistent":
            variants += [(engine, w) for w in warps]
    for preset, mode in models:
        for engine, num_warps in variants:
            rt, verdict = checked_runtime(preset, mode, engine, a.precision)
            eng = rt.engine
            label = engine if num_warps is None else f"{engine} w{num_warps}"
            try:
                if engine == "persistent":  # restart with the kernel's device stamps on (and num_warps)
                    eng.kernel.stop()
                    eng.kernel.timing = True
                    if num_warps is not None:
                        eng.kernel.num_warps = num_warps
                        verdict = recheck(eng, rt, preset, mode, a.precision)
                    eng.kernel.precompile()
                    eng._head = 0
                    eng.kernel.start()
                for b, gap in ((b, g) for b in batches for g in gaps):
                    first_seq = eng.ring.seq + 51 if engine == "persistent" else 0
                    ns, parts = time_steps(eng, b, steps, rt.store.depth, gap)
                    r = {"model": preset, "mode": mode, "engine": label + (f" gap{gap:g}" if gap else ""),
                         "batch": b, "gap_us": gap, "reason": eng.reason, "conflating": rt.conflate,
                         "correct": verdict} | pct(ns)
                    r["parts_p50"] = dict(zip(PARTS, (float(v) for v in np.percentile(parts, 50, axis=0) / 1e3)))
                    if engine == "persistent":
                        last_seq = eng.ring.seq  # stop() takes one more seq, unstamped
                        eng.kernel.stop()
                        dev = eng.kernel.device_times_ns(first_seq, last_seq) / 1e3
                        r["device_p50"] = float(np.percentile(dev, 50))
                        r["device_p99"] = float(np.percentile(dev, 99))
                        eng._head = 0
                        eng.kernel.start()
                    rows.append(r)
                    print(table(HEADERS, [_row(r)]).splitlines()[-1], flush=True)
            finally:
                eng.close()
            del rt, eng
            torch.cuda.synchronize()
    print()
    print(table(HEADERS, [_row(r) for r in rows], title=f"engines, {steps} steps per row, {a.precision}"))
    print()
    print(table(["model", "mode", "engine", "batch", *(f"{p} p50 µs" for p in PARTS)],
                [[r["model"], r["mode"], r["engine"], r["batch"], *r["parts_p50"].values()]
                 for r in rows if "parts_p50" in r], title="where the host's step goes (medians of each part)"))
    if a.json:
        write_json(a.json, {"steps": steps, "gpu": torch.cuda.get_device_name(0), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
