"""Where the persistent engines' wrong results come from (issue 13; run on a CUDA machine).

Found at 08b885d: Triton's pipeliner had turned the kernels' volatile loads into L1-cached
cp.async copies (kernels/persistent.py, NUM_STAGES; tools/check_persistent_asm.py checks the
PTX without a GPU). Since then every variant below agrees with the CPU engine (0 of 300:
docs/bench/h200-08b885d/diag_persistent.log); kept as a regression check.

    python tools/diag_persistent.py [--presets lstm_a,mlp_small] [--engine persistent]

On the H200 host (docs/bench/h200-db6427a/) the persistent engines' results diverge from the
CPU engine on the self-check stream (lstm_a: 57 of 300 scores, the first in the 2nd
request, a batch of 64; mlp_small: 40 of 300), while the graph engine, whose kernels read
the same rows staged on the device, agrees. This drives the service's engine (built as
`serve` builds it, self-check off) over the self-check stream (runner/self_check.py) in
variants that separate the suspects, each against the CPU engine on the same rows:

  served        as the self-check runs it: write a batch's rows into the host ring, submit,
                wait, next batch
  prewritten    every row of the stream written into the host ring first, then the kernel
                restarted (engine.reset), then the same requests: if this one agrees and
                `served` does not, the kernel reads rows the host wrote while it ran
                stale (host-to-GPU visibility of ring rows: caching or ordering)
  batch1        the stream in batches of one (the express-word path, no entry reads):
                if this agrees and `served` does not, the bug is in the multi-entry path
  batch64       the stream in batches of 64 (as many entries as the ring takes)

Per variant: mismatching scores, the first one (row, request, batch size, engine score
against the CPU's) and the largest difference. `--engine graph` runs the same variants on
the graph engine (a control: all agree), `--engine eager` runs them on the CPU (the logic
of this tool, on a machine without CUDA).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from hft_infer.config import load_config
from hft_infer.runner.select import build_runtime
from hft_infer.runner.self_check import check_stream, drive

TOL = 1e-4  # fp32: the self-check's tolerance
N_SLOTS = 64


def _runtime(preset: str, engine: str, extra: list[str] = (), n_slots: int = N_SLOTS):
    """The service's runtime for `preset` (or `preset/mode`) on `engine`, self-check off, n_slots
    instruments; extra: more config overrides (tools/diag_ring_order.py's variants)."""
    device = "cpu" if engine == "eager" else "cuda"
    preset, _, mode = preset.partition("/")
    extra = [*extra, f'model.mode="{mode}"'] if mode else list(extra)
    cfg = load_config(None, ['model.checkpoint=""', f'model.preset="{preset}"', f'runner.engine="{engine}"',
                             f'runner.device="{device}"', "runner.self_check=false",
                             f"universe.instruments={n_slots}", "scheduler.max_batch=64",
                             "runner.buckets=[1, 2, 4, 8, 16, 32, 64]", *extra])
    return build_runtime(cfg, n_slots)


def _prewritten(engine, store, data: np.ndarray, slots: np.ndarray, batches: list[int]):
    """Every row into the ring first, the kernel restarted on them, then the requests."""
    store.reset()
    positions = np.zeros(len(data), dtype=np.int64)
    for k, (row, slot) in enumerate(zip(data, slots)):
        pos = store.count[slot]
        store.array[slot, pos % store.depth] = row
        store.count[slot] = pos + 1
        positions[k] = pos
    engine.reset()  # a persistent kernel is stopped and started again: it starts after the rows exist
    scores, i = [], 0
    for b in batches:
        e_slots, e_positions = engine.request()
        e_slots[:b] = slots[i:i + b]
        e_positions[:b] = positions[i:i + b]
        sc, _ = engine.step(b)
        scores.append(np.array(sc, dtype=np.float32))
        i += b
    return np.concatenate(scores)


def _batches_of(size: int, slots: np.ndarray, rows: int) -> tuple[np.ndarray, list[int]]:
    """The stream's rows, in order, re-cut into batches of at most `size` distinct slots."""
    batches, i = [], 0
    while i < rows:
        seen, b = set(), 0
        while i + b < rows and b < size and int(slots[i + b]) not in seen:
            seen.add(int(slots[i + b]))
            b += 1
        batches.append(b)
        i += b
    return np.arange(rows), batches


def _report(name: str, got: np.ndarray, want: np.ndarray, batches: list[int]) -> None:
    diff = np.abs(got.astype(np.float64) - want)
    bad = np.flatnonzero(~(diff <= TOL))
    starts = np.cumsum([0] + batches)
    line = f"  {name:11s} {len(bad):4d} of {len(got)} scores differ (> {TOL:g}), largest {np.nanmax(diff):.3g}"
    if len(bad):
        r = int(bad[0])
        req = int(np.searchsorted(starts, r, side="right")) - 1
        line += (f"; first at row {r} (request {req}, batch of {batches[req]}, entry {r - starts[req]}): "
                 f"{got[r]:.6f} against {want[r]:.6f}")
    print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="lstm_a,mlp_small")
    ap.add_argument("--engine", default="persistent", choices=["persistent", "graph", "eager"])
    args = ap.parse_args()
    if args.engine != "eager":
        import torch

        if not torch.cuda.is_available():
            sys.exit(f"diag_persistent: --engine {args.engine} needs a CUDA device (--engine eager runs on the CPU)")
    for preset in args.presets.split(","):
        rt, ref = _runtime(preset, args.engine), _runtime(preset, "eager")
        eng, store = rt.engine, rt.store
        print(f"{preset}: engine {eng.name} ({eng.reason}), {N_SLOTS} slots, ring depth {store.depth}", flush=True)
        data, slots, batches = check_stream(store.width, N_SLOTS, 64)
        ref.engine.reset()
        want, _ = drive(ref.engine, ref.store, data, slots, batches)
        eng.reset()
        got, _ = drive(eng, store, data, slots, batches)
        _report("served", got, want, batches)
        eng.reset()
        _report("prewritten", _prewritten(eng, store, data, slots, batches), want, batches)
        for size in (1, 64):
            order, cut = _batches_of(size, slots, len(data))
            d, s = data[order], slots[order]
            ref.engine.reset()
            want_b, _ = drive(ref.engine, ref.store, d, s, cut)
            eng.reset()
            got_b, _ = drive(eng, store, d, s, cut)
            _report(f"batch{size}", got_b, want_b, cut)
        for e in (eng, ref.engine):
            e.close()


if __name__ == "__main__":
    main()
