#!/usr/bin/env python3
"""KERNEL-LEVEL sweep of the persistent LSTM kernel's geometry, with phase stamps: where a
small request's device time goes, and whether another tiling or grid serves it faster (issue
"Engines at the floor": lstm_a batch-1 device <= 5 µs). Not the service's path
(tools/bench_engines.py is); this drives the kernel behind its request ring as
tools/bench_kernels.py does (its Setup and Driver), rows already in the pinned host ring.

    python3 tools/sweep_persistent_geometry.py [--models lstm_a] [--batches 1,8]
        [--geometries 4/0/4/0,8/0/4/0,4/64/4/0] [--emit 0,2] [--steps 1000] [--cpu CORE] [--json PATH]

GEOMETRY = block_h/block_m/num_warps/max_programs[/wide_block_m], 0 for the kernel's own choice
(block_h 4, block_m by its batch-1 rule, 4 warps, every SM); a fifth field adds the wide tiling the
engine builds (`pack_wide`: twice the hidden units a program) with tiles of that many rows, which
requests of WIDE_MIN_ENTRIES windows or more take (0 or absent: the one tiling); --emit crosses each
with the emitted pass's entry limits (`LstmPersistent(emit_entries=...)`, 0: off). Per variant: the
weights packed for its block_h, the kernel built with phase stamps (`LstmPersistent(phases=True)`, a
diagnostic build; the kernels compile first, in parallel child processes), FILL_STEPS steps of every
slot, the error against float64 at each batch, then --steps requests of each batch one at a time.
Rows: host submit -> done seen p50 / p99, device p50 (detect -> done, %globaltimer), and the median
of each phase on the lead program's clock -- broadcast (detect -> the request published to the other
programs), layer k (-> the lead's share of layer k computed), barrier k (-> every program arrived at
layer k's barrier), head (-> done released) -- and "last sees" (detect -> the last program read the
broadcast). A last row runs the first geometry without the phase stamps: what they cost. Exits 2
without CUDA.

mlp_small (the persistent MLP, `MlpPersistent(phases=True)`): GEOMETRY = block_n/block_k/ksplit/num_warps
[/block_b] (0: the packing's own -- block_n 32, block_k 64, ksplit for ~48 programs -- the engine's warps,
mlp_persistent.NUM_WARPS, and its batch tile; a fifth field sets the batch tile's rows, a power of two from
16 to 32; --emit does not apply), phases: broadcast, partials (-> the lead's own layer-1 partials done), arrivals
(-> every program's arrival seen), finish (-> done: the partials summed, layers 2..3, the decision) and
"last sees". Sweep it on its own (`--models mlp_small --geometries 0/0/0/0`): a table's phase columns
are the union of its rows'.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from types import SimpleNamespace

import numpy as np

MODELS = ("lstm_a", "lstm_b", "lstm_a_stream", "mlp_small")
MLP_BLOCK_B = (16, 32)  # MlpPersistent's batch tiles: powers of two, BLOCK_B_MIN..BLOCK_B_MAX (checked there)
FILL_STEPS = 4  # steps of every slot before the timed ones: a geometry's speed does not depend on full windows


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="lstm_a")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--geometries", default="0/0/0/0,0/0/0/0/32,8/0/4/0,4/32/4/0,8/64/4/0",
                    help="block_h/block_m/num_warps/max_programs[/wide_block_m], comma-separated (0: the "
                         "kernel's choice; no fifth field: one tiling)")
    ap.add_argument("--emit", default="",
                    help="emitted-pass entry limits to cross with every geometry, comma-separated (0: off; "
                         "default: the kernel's own, EMIT_ENTRIES)")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "tf32", "bf16"))
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--cpu", type=int, default=None, help="pin this process to a core")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    a.models = [m for m in a.models.split(",") if m]
    a.batches = [int(b) for b in a.batches.split(",") if b]
    try:
        a.geometries = [(*g, 0) if len(g) == 4 else g
                        for g in (tuple(int(x) for x in g.split("/")) for g in a.geometries.split(",") if g)]
    except ValueError:
        ap.error(f"--geometries: integers block_h/block_m/num_warps/max_programs[/wide_block_m], got {a.geometries!r}")
    bad = [m for m in a.models if m not in MODELS] + [g for g in a.geometries if len(g) != 5 or min(g) < 0]
    if bad:
        ap.error(f"unknown model (of {', '.join(MODELS)}) or malformed geometry: {bad}")
    try:
        emits = [int(e) for e in a.emit.split(",") if e.strip()]
    except ValueError:
        ap.error(f"--emit: integers, got {a.emit!r}")
    if any(e < 0 or e & (e - 1) for e in emits):
        ap.error(f"--emit: 0 or powers of two, got {a.emit!r}")
    if any(is_mlp(m) for m in a.models) and (emits or (any(g[4] for g in a.geometries)
                                                       and not all(is_mlp(m) for m in a.models))):
        ap.error("--emit applies to the LSTMs only, and a geometry's fifth field means the wide tiling for an "
                 "LSTM but the batch tile for the MLP: sweep the MLP on its own")
    if is_mlp(a.models[0]) and any(g[4] and g[4] not in MLP_BLOCK_B for g in a.geometries):
        ap.error(f"an MLP geometry's fifth field (block_b) is 0 or one of {MLP_BLOCK_B}: {a.geometries}")
    if emits:  # a sixth field: the emitted pass's entry limit
        a.geometries = [(*g, e) for g in a.geometries for e in emits]
    return a


def is_mlp(name: str) -> bool:
    return name.startswith("mlp")


def geometry_label(geo: tuple[int, ...], name: str = "lstm_a") -> str:
    if is_mlp(name):
        label = " ".join(f"{n}={v or 'auto'}" for n, v in zip(("bn", "bk", "ksplit", "warps"), geo))
        return label + (f" bb={geo[4]}" if len(geo) > 4 and geo[4] else "")
    names = ("bh", "bm", "warps", "progs")
    label = " ".join(f"{n}={v or 'auto'}" for n, v in zip(names, geo))
    label += f" + wide bm={geo[4]}" if len(geo) > 4 and geo[4] else ""
    return label + (f" emit<={geo[5]}" if len(geo) > 5 else "")


def phase_medians(stamps: np.ndarray, layers: int) -> dict[str, float]:
    """Median µs of each phase from `device_stamps_ns` rows of a phases build (phase_stamps' order:
    detect, done, broadcast, layer k / barrier k ..., last program sees it)."""
    t = stamps.astype(np.int64)
    out = {"broadcast": t[:, 2] - t[:, 0]}
    prev = t[:, 2]
    for k in range(layers):
        out[f"layer {k}"] = t[:, 3 + 2 * k] - prev
        out[f"barrier {k}"] = t[:, 4 + 2 * k] - t[:, 3 + 2 * k]
        prev = t[:, 4 + 2 * k]
    out["head"] = t[:, 1] - prev
    out["last sees"] = t[:, 3 + 2 * layers] - t[:, 0]
    return {k: float(np.median(v)) / 1e3 for k, v in out.items()}


def mlp_phase_medians(stamps: np.ndarray) -> dict[str, float]:
    """Median µs of each phase from the rows of an MLP phases build (mlp_persistent.PHASE_STAMPS:
    detect, done, broadcast, lead's partials, all arrived, last program sees it)."""
    t = stamps.astype(np.int64)
    out = {"broadcast": t[:, 2] - t[:, 0], "partials": t[:, 3] - t[:, 2], "arrivals": t[:, 4] - t[:, 3],
           "finish": t[:, 1] - t[:, 4], "last sees": t[:, 5] - t[:, 0]}
    return {k: float(np.median(v)) / 1e3 for k, v in out.items()}


def _setup(name: str, geo: tuple, phases: bool, precision: str, dev):
    """bench_kernels' Setup for `name`, its weights packed for the geometry's block_h and its
    `persistent` building the kernel in that geometry (with phase stamps if `phases`)."""
    from bench_kernels import N_INST, Setup

    from hft_infer.kernels.lstm import prepare_lstm_weights
    from hft_infer.kernels.lstm_persistent import LstmPersistent, pack_wide

    st = Setup(name, precision, dev)
    if st.family == "mlp":
        return _setup_mlp(st, geo, phases, precision, dev)
    block_h, block_m, warps, programs, wide_block_m = geo[:5]
    emit = dict(emit_entries=geo[5]) if len(geo) > 5 else {}
    if block_h and block_h != st.w.block_h:
        st.w = prepare_lstm_weights(st.params, precision=precision, device=dev, block_h=block_h)

    wide = dict(wide=pack_wide(st.params, st.w), wide_block_m=wide_block_m) if wide_block_m else {}

    def persistent(ring, max_programs=None, timing=True):
        return LstmPersistent(st.w, ring, N_INST + 1, st.thr, st.held, window=st.window,
                              max_programs=programs or None, block_m=block_m or None, num_warps=warps or 4,
                              timing=True, phases=phases, **wide, **emit)

    st.persistent = persistent
    return st


def _setup_mlp(st, geo: tuple, phases: bool, precision: str, dev):
    """`_setup` for the MLP: its weights packed for block_n / block_k / ksplit where given, the
    kernel with num_warps (and phase stamps if `phases`)."""
    from hft_infer.kernels.mlp import prepare_mlp_weights
    from hft_infer.kernels.mlp_persistent import NUM_WARPS, MlpPersistent

    block_n, block_k, ksplit, warps, block_b = geo[:5]
    if block_n or block_k or ksplit:
        st.w = prepare_mlp_weights(st.params, precision=precision, device=dev, block_n=block_n or 32,
                                   block_k=block_k or 64, ksplit=ksplit or None)

    def persistent(ring, max_programs=None, timing=True):
        return MlpPersistent(st.w, ring, st.thr, st.held, num_warps=warps or NUM_WARPS, block_b=block_b or None,
                             timing=True, phases=phases)

    st.persistent = persistent
    return st


def _compile_job(name: str, geo: tuple, phases: bool, precision: str) -> str:
    """Child process: compile one variant's kernel (fills Triton's disk cache for the parent)."""
    import time

    import torch

    t0 = time.time()
    st = _setup(name, geo, phases, precision, torch.device("cuda"))
    st.persistent(st.ring()).precompile()
    return f"{name} {geometry_label(geo, name)}{' phases' if phases else ''}: {time.time() - t0:.1f}s"


def precompile(variants: list[tuple], precision: str) -> None:
    """Every variant's kernel compiled at once in child processes, which fill Triton's disk cache for
    the runs here (3-6 s each on an H100 host)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=min(8, len(variants), os.cpu_count() or 1),
                             mp_context=mp.get_context("spawn")) as ex:
        futs = [ex.submit(_compile_job, *v, precision) for v in variants]
        for fu in as_completed(futs, timeout=300):
            try:
                print(f"  compiled {fu.result()}", flush=True)
            except Exception as e:  # noqa: BLE001 - the variant's own run reports it
                print(f"  a compile job failed: {e!r}", flush=True)


def run_variant(name: str, geo: tuple, phases: bool, args, dev) -> list[dict]:
    """One geometry: its kernel started, windows filled, each batch timed; a row per batch."""
    import torch
    from bench_kernels import Driver, pct

    st = _setup(name, geo, phases, args.precision, dev)
    d = Driver(st, SimpleNamespace(max_programs=None))
    try:
        errs, lat = d.timed_run(args.batches, args.steps, FILL_STEPS)
    finally:
        torch.cuda.synchronize()  # the kernel has exited (or never started)
    rows = []
    for b in args.batches:
        s0, ns = lat[b]
        stamps = d.kernel.device_stamps_ns(s0, s0 + args.steps - 1)
        k = d.kernel
        row = {"model": name, "batch": b, "geometry": geometry_label(geo, name), "phases": phases,
               "programs": k.programs, "block_m": getattr(k, "block_m", "-"), "wide": getattr(k, "wide_reason", "-"),
               "emit": getattr(k, "emit_reason", "-"),
               "host_us": pct(ns),
               "device_us": float(np.median(stamps[:, 1] - stamps[:, 0])) / 1e3, "err_vs_f64": errs[b]}
        if phases:
            row["phase_us"] = mlp_phase_medians(stamps) if is_mlp(name) else phase_medians(stamps, st.w.layers)
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    phase_names = list(dict.fromkeys(k for r in rows for k in r.get("phase_us", {})))  # the union, in order
    head = ("| model | b | geometry | stamps | programs | block_m | device p50 | host p50 | host p99 | err vs f64 | "
            + " | ".join(phase_names) + " |")
    lines = [head, "|" + " --- |" * 4 + " ---: |" * (6 + len(phase_names))]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | - | {r['geometry']} | FAILED: {r['error']} |")
            continue
        ph = r.get("phase_us", {})
        lines.append(f"| {r['model']} | {r['batch']} | {r['geometry']} | {'phases' if r['phases'] else 'detect, done'}"
                     f" | {r['programs']} | {r['block_m']} | {r['device_us']:.2f} | {r['host_us']['p50']:.1f} | "
                     f"{r['host_us']['p99']:.1f} | {r['err_vs_f64']:.1e} | "
                     + " | ".join(f"{ph[k]:.2f}" if k in ph else "-" for k in phase_names) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("sweep_persistent_geometry: needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    print(f"== sweep_persistent_geometry (KERNEL-LEVEL): {torch.cuda.get_device_name()}, {vars(args)}", flush=True)
    variants = [(name, geo, True) for name in args.models for geo in args.geometries]
    variants += [(name, args.geometries[0], False) for name in args.models]
    precompile(variants, args.precision)
    if args.cpu is not None:  # after the compiles; one core: torch's float64 references on one thread, not a pool on it
        os.sched_setaffinity(0, {args.cpu})
        torch.set_num_threads(1)
    rows: list[dict] = []
    for name, geo, phases in variants:
        try:
            got = run_variant(name, geo, phases, args, dev)
        except Exception as e:  # noqa: BLE001 - a geometry the kernel refuses: say so, go on
            got = [{"model": name, "geometry": geometry_label(geo, name), "error": repr(e)[:300]}]
        rows += got
        print("\n".join(table(got).splitlines()[2:]), flush=True)
    print("\n== summary (µs; phases: medians on the lead program's clock, see the docstring)")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items()}, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
