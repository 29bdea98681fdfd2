"""Where the graph engine's lstm_a step time goes (run on a CUDA machine; prints µs per step).

    python tools/diag_graph_inputs.py

Measured on the H200 host at 916d9c4: the graph engine's lstm_a step took ~14.6 ms at batch 1
(wave 1, with device-staged inputs: 37.8 µs). This times the engine's own replay and the
launched window kernel with its inputs where the engine keeps them (pinned host slots,
positions and feature ring: HOST_IN, every load volatile) against the same kernel with
device slots/positions, with a device copy of the ring (HOST_IN off), and without the grid
barrier (persistent=False). Eager launches add ~10 µs each; the ratios are what to read.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from hft_infer.config import load_config
from hft_infer.kernels.common import OUT_COLS
from hft_infer.kernels.lstm_window import lstm_window_step
from hft_infer.runner.select import build_runtime


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    if not torch.cuda.is_available():
        sys.exit("diag_graph_inputs: needs a CUDA device (it times the GPU graph engine)")
    cfg = load_config(None, ['model.checkpoint=""', 'model.preset="lstm_a"', 'runner.engine="graph"',
                             "runner.buckets=[1, 2, 4, 8]", "scheduler.max_batch=8", "universe.instruments=8",
                             'runner.device="cuda"', "runner.self_check=false"])
    eng = build_runtime(cfg, 8).engine
    ks = eng.kstep
    print("engine", eng.name, "ring_h", tuple(ks.ring_h.shape), "pinned", ks.ring_h.is_pinned(), flush=True)

    def per_step(label: str, fn, n: int = 50) -> None:
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        print(f"{label:55s} {1e6 * (time.perf_counter() - t0) / n:10.1f} µs/step", flush=True)

    sl_h = torch.zeros(1, dtype=torch.int64).pin_memory()
    po_h = torch.zeros(1, dtype=torch.int64).pin_memory()
    out_h = torch.zeros(1, OUT_COLS, dtype=torch.float32).pin_memory()
    sl_d, po_d, out_d, ring_d = sl_h.cuda(), po_h.cuda(), out_h.cuda(), ks.ring_h.cuda()

    def step(slots, positions, out, ring_h, **kw):
        return lambda: lstm_window_step(ks.w, ks.ws, ks.h, ks.c, None, slots, positions, ks.thresholds, ks.held,
                                        out, ring_h=ring_h, **kw)

    per_step("engine.step(1): graph replay + poll", lambda: eng.step(1))
    per_step("kernel, host slots/positions/out + host ring", step(sl_h, po_h, out_h, ks.ring_h))
    per_step("kernel, device slots/positions/out + host ring", step(sl_d, po_d, out_d, ks.ring_h))
    per_step("kernel, all on the device (HOST_IN off)", step(sl_d, po_d, out_d, ring_d))
    per_step("kernel, host inputs, persistent=False", step(sl_h, po_h, out_h, ks.ring_h, persistent=False))
    per_step("kernel, device inputs, persistent=False", step(sl_d, po_d, out_d, ring_d, persistent=False))
    eng.close()


if __name__ == "__main__":
    main()
