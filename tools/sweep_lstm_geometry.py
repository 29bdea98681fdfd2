#!/usr/bin/env python3
"""KERNEL-LEVEL sweep of the launched LSTM step's geometry on one GPU: which (block_h, block_m,
num_warps, one launch with grid barriers or one launch per phase) is fastest per batch size.
Not the service's path (tools/bench_engines.py is); this drives `launch_lstm` directly on device
inputs, as each graph engine bucket replays it.

    python3 tools/sweep_lstm_geometry.py [--models lstm_a,lstm_b,lstm_a_stream] [--batches 1,8,64]
        [--precisions fp32,tf32] [--block-h 4,8,16,32] [--block-m 0,16,32,64] [--warps 4,8]
        [--launch one,phased] [--k 20] [--reps 30] [--json PATH]

block_m 0 = the launcher's own choice. Device time per step: CUDA events around a graph of k
steps, median of the repetitions, / k. Every variant is checked against the default geometry
(block_h 4, the launcher's block_m, 4 warps, one launch) from the same state: the decisions'
logits and the new (h, c) must agree within 1e-4 (fp32) or 5e-3 (tf32/bf16) relative to their
scale, else the row says WRONG. Exits 2 without CUDA.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys

import torch
from benchlib import graph_device_us
from kernel_compile import recording

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "kernels"))

MODELS = {"lstm_a": ("lstm_a", True), "lstm_b": ("lstm_b", True), "lstm_a_stream": ("lstm_a", False)}
N_SLOTS = 65  # 64 instruments + the padding sink


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="lstm_a")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--precisions", default="fp32")
    ap.add_argument("--block-h", default="4,8,16,32")
    ap.add_argument("--block-m", default="0,16,32,64")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--launch", default="one,phased")
    ap.add_argument("--k", type=int, default=20, help="steps per timed graph")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--phased-programs", type=int, default=1024,
                    help="grid cap of the phased launch (no barrier, so no co-residency limit)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="run each variant once under TRITON_INTERPRET=1 on the CPU (no timing)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    a.models = [m for m in a.models.split(",") if m]
    a.batches, a.block_h, a.block_m, a.warps = ints(a.batches), ints(a.block_h), ints(a.block_m), ints(a.warps)
    a.precisions = [p for p in a.precisions.split(",") if p]
    a.launch = [x for x in a.launch.split(",") if x]
    bad = [m for m in a.models if m not in MODELS] + [x for x in a.launch if x not in ("one", "phased")]
    if bad:
        ap.error(f"unknown model or launch: {bad}")
    return a


class Case:
    """One model at one batch size: inputs on the device and a starting state with history."""

    def __init__(self, name: str, batch: int, dev: torch.device):
        from kernels_testlib import make_rows, preset_params

        preset, self.window_mode = MODELS[name]
        self.spec, self.params = preset_params(preset, seed=1234)
        gen = torch.Generator().manual_seed(batch)
        self.batch, self.dev = batch, dev
        self.states = self.spec.window if self.window_mode else 1
        shape = (N_SLOTS, self.params.layers, self.states, self.params.hidden) if self.window_mode else (
            N_SLOTS, self.params.layers, self.params.hidden)
        self.h0 = (torch.rand(shape, generator=gen) * 0.2 - 0.1).to(dev)
        self.c0 = (torch.rand(shape, generator=gen) * 0.2 - 0.1).to(dev)
        self.rows = make_rows(batch, (self.spec.features - 2) // 4, gen).to(dev)
        self.slots = torch.randperm(N_SLOTS - 1, generator=gen)[:batch].to(dev)
        self.positions = torch.randint(0, 10_000, (batch,), generator=gen).to(dev)
        self.thr = torch.tensor([0.1, 0.05], device=dev)
        self.held0 = torch.zeros(N_SLOTS, dtype=torch.int32, device=dev)


def run_variant(case: Case, precision: str, block_h: int, block_m: int, warps: int, launch: str, args,
                weights_cache: dict) -> dict:
    from hft_infer.kernels import lstm as lstm_module
    from hft_infer.kernels.lstm import alloc_lstm_workspace, launch_lstm, prepare_lstm_weights

    key = (precision, block_h)
    if key not in weights_cache:
        weights_cache[key] = prepare_lstm_weights(case.params, precision=precision, device=case.dev,
                                                  block_h=block_h)
    w = weights_cache[key]
    ws = alloc_lstm_workspace(w, 64, case.states, max_programs=args.phased_programs if launch == "phased" else None)
    h, c, held = case.h0.clone(), case.c0.clone(), case.held0.clone()
    out = torch.zeros(case.batch, 5, device=case.dev)

    def step():
        launch_lstm(w, ws, h, c, case.rows, case.slots, case.positions, case.thr, held, out, None,
                    window=case.window_mode, persistent=launch == "one", num_warps=warps,
                    block_m=block_m or None)

    step()  # compile, and the checked result: one step from (h0, c0)
    result = {"out": out[:, 2:].clone(), "h": h.clone(), "c": c.clone()}
    with recording(lstm_module, "_lstm_kernel") as launches:  # the launcher's grid and tile rows
        step()
    (grid_x, grid_y), _, consts = launches[0]
    cut = {"programs": grid_x * grid_y, "block_m_used": consts["BLOCK_M"]}
    if case.dev.type == "cpu":
        return {"device_us": float("nan"), "min_us": float("nan"), "result": result, **cut}
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    s.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(args.k):
            step()
    times = graph_device_us(g, args.k, args.reps)
    return {"device_us": statistics.median(times), "min_us": min(times), "result": result, **cut}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cpu_smoke:
        dev = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("no CUDA device: this sweep runs on a GPU host", file=sys.stderr)
        return 2
    else:
        dev = torch.device("cuda")
    rows_out = []
    for name, batch, precision in itertools.product(args.models, args.batches, args.precisions):
        case = Case(name, batch, dev)
        cache: dict = {}
        ref = run_variant(case, precision, 4, 0, 4, "phased" if dev.type == "cpu" else "one", args, cache)
        tol = 1e-4 if precision == "fp32" else 5e-3
        for bh, bm, nw, launch in itertools.product(args.block_h, args.block_m, args.warps, args.launch):
            if bh > case.params.hidden:
                continue
            try:
                r = run_variant(case, precision, bh, bm, nw, launch, args, cache)
            except Exception as e:  # a geometry the compiler refuses (registers, shared memory)
                print(f"{name} b{batch} {precision} bh{bh} bm{bm} w{nw} {launch}: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:120]}", flush=True)
                continue
            err = max(rel_err(r["result"][k], ref["result"][k]) for k in ("out", "h", "c"))
            row = {"model": name, "batch": batch, "precision": precision, "block_h": bh,
                   "block_m": r["block_m_used"], "warps": nw, "launch": launch, "programs": r["programs"],
                   "device_us": r["device_us"], "min_us": r["min_us"], "rel_err": err,
                   "ok": err <= tol, "vs_default": r["device_us"] / ref["device_us"]}
            rows_out.append(row)
            print(f"{name:14s} b{batch:<3d} {precision} bh{bh:<3d} bm{row['block_m']:<4d} w{nw} {launch:7s} "
                  f"progs {row['programs']:4d}  {row['device_us']:8.1f} us  x{row['vs_default']:.2f}  "
                  f"err {err:.1e}{'' if row['ok'] else '  WRONG'}", flush=True)
    print("\nbest per (model, batch, precision), correct variants only:")
    print(f"{'model':14s} {'batch':>5s} {'prec':5s} {'default us':>10s} {'best us':>8s} {'ratio':>6s}  geometry")
    for key, grp in itertools.groupby(sorted(rows_out, key=lambda r: (r["model"], r["batch"], r["precision"])),
                                      key=lambda r: (r["model"], r["batch"], r["precision"])):
        grp = [r for r in grp if r["ok"]]
        if not grp:
            continue
        best = min(grp, key=lambda r: r["device_us"])
        default = [r for r in grp if r["block_h"] == 4 and r["warps"] == 4 and r["launch"] == "one"]
        d = min((r["device_us"] for r in default), default=float("nan"))
        print(f"{key[0]:14s} {key[1]:5d} {key[2]:5s} {d:10.1f} {best['device_us']:8.1f} "
              f"{best['device_us'] / d:6.2f}  bh{best['block_h']} bm{best['block_m']} w{best['warps']} "
              f"{best['launch']} ({best['programs']} programs)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows_out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
