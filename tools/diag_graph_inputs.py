"""Where the graph engine's step time goes (run on a CUDA machine; prints µs per step).

    python tools/diag_graph_inputs.py [--presets lstm_a,mlp_small] [--batches 1,8]

Measured on the H200 host at 916d9c4: the graph engine's lstm_a step took ~14.6 ms at batch 1
(wave 1, with device-staged inputs: 37.8 µs). At that commit the model kernel read slots,
positions and rows from pinned host memory itself (HOST_IN: every load volatile, a PCIe read
per tile, layer and phase). The engine now stages them first with one gather node. This
times, per preset and batch size, in one run:

- the service's graph engine (staged inputs): `engine.step(n)`, replay + poll + outputs;
- the same engine reading host memory in place (`stage_inputs=False`: the 916d9c4 layout);
- the gather node alone, eagerly launched;
- the LSTM window kernel eagerly launched on device inputs, with and without the grid
  barrier (persistent=False: L+1 launches).

Eager launches add ~5-10 µs each; the engine rows are what the service pays.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from hft_infer.config import load_config
from hft_infer.kernels.common import OUT_COLS
from hft_infer.runner.gpu import GraphEngine, KernelStep
from hft_infer.runner.select import build_runtime


def _per_step(label: str, fn, *args, n: int = 200, **kwargs) -> None:
    for _ in range(5):
        fn(*args, **kwargs)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn(*args, **kwargs)
    torch.cuda.synchronize()
    print(f"  {label:62s} {1e6 * (time.perf_counter() - t0) / n:10.1f} µs/step", flush=True)


def _runtime(preset: str, max_batch: int):
    cfg = load_config(None, ['model.checkpoint=""', f'model.preset="{preset}"', 'runner.engine="graph"',
                             f"runner.buckets={sorted({1, 2, 4, 8, max_batch})}", f"scheduler.max_batch={max_batch}",
                             f"universe.instruments={max(8, max_batch)}", 'runner.device="cuda"',
                             "runner.self_check=false"])
    return cfg, build_runtime(cfg, max(8, max_batch))


def _in_place_engine(cfg, rt) -> GraphEngine:
    """A second graph engine on the same model and host ring, reading host memory in place."""
    r = cfg.runner
    ks = KernelStep(rt.model, mode=cfg.model.mode, window_method=cfg.model.window_method, ring_h=rt.store.tensor,
                    max_batch=r.max_bucket, precision=r.precision, threshold=cfg.decision.threshold,
                    hysteresis=cfg.decision.hysteresis, device="cuda")
    eng = GraphEngine(ks, list(r.buckets), sink_slot=rt.store.sink_slot, reason="diag", stage_inputs=False)
    eng.warm_up()
    return eng


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="lstm_a,mlp_small")
    ap.add_argument("--batches", default="1,8")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("diag_graph_inputs: needs a CUDA device (it times the GPU graph engine)")
    batches = [int(b) for b in args.batches.split(",")]
    for preset in args.presets.split(","):
        cfg, rt = _runtime(preset, max(batches))
        eng = rt.engine
        ks = eng.kstep
        print(f"{preset}: engine {eng.name}, ring_h {tuple(ks.ring_h.shape)} pinned {ks.ring_h.is_pinned()}",
              flush=True)
        in_place = _in_place_engine(cfg, rt)
        for b in batches:
            _per_step(f"batch {b}: graph engine, staged inputs (the service's)", eng.step, b, n=100)
            _per_step(f"batch {b}: graph engine, host memory read in place", in_place.step, b,
                      n=5 if preset.startswith("lstm") else 50)
            from hft_infer.kernels.gather import gather_window

            sl = torch.arange(b, dtype=torch.int64).pin_memory()
            po = torch.zeros(b, dtype=torch.int64).pin_memory()
            _per_step(f"batch {b}: gather node alone (eager launch)", gather_window, ks.ring_h, sl, po,
                      ks.staged[:b], ks.dslots[:b], ks.dpos[:b])
            if ks.kind == "lstm" and ks.mode == "window":
                from hft_infer.kernels.lstm_window import lstm_window_step

                rows = ks.staged[:b].view(b, -1)
                out = torch.zeros(b, OUT_COLS, device="cuda")
                for persistent in (True, False):
                    _per_step(f"batch {b}: window kernel on device inputs, persistent={persistent} (eager)",
                              lstm_window_step, ks.w, ks.ws, ks.h, ks.c, rows, ks.dslots[:b], ks.dpos[:b],
                              ks.thresholds, ks.held, out, persistent=persistent)
        eng.close()
        in_place.close()


if __name__ == "__main__":
    main()
