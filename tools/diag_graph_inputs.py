"""Where the graph engine's step time goes (run on a CUDA machine; prints µs per step).

    python tools/diag_graph_inputs.py [--presets lstm_a,mlp_small] [--batches 1,8,64]

History (H200 host): at 916d9c4 the engine's kernels read slots, positions and rows from
pinned host memory through UVA and lstm_a's step took ~14.6 ms at batch 1. This tool then
measured (765d37d, 2026-12-02) that such reads are served about one PCIe transaction at a
time: reading in place 14,933 µs (batch 1) / 48,959 µs (batch 8) per lstm_a step; a gather
kernel reading each row once 39 µs (lstm_a, one row per entry) and 163 / 858 µs (mlp_small,
32-row windows, batch 1 / 8). Since then the host gathers the rows into the step's pinned
staging buffer and the graph copies it to the device in one copy node (runner/staging.py).

Per preset and batch size this times, in one run:
- `engine.step(n)`: the service's graph engine (host gather, replay, poll, outputs);
- the host gather alone (`StepStaging.gather`, the loop thread's cost per submit);
- upload + model kernel launched eagerly (adds the launch overhead a graph saves);
- for window LSTMs, the kernel alone on device inputs with and without the grid barrier
  (persistent=False: L+1 launches).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from hft_infer.config import load_config
from hft_infer.kernels.common import OUT_COLS
from hft_infer.runner.select import build_runtime


def _per_step(label: str, fn, *args, n: int = 200, cuda: bool = True, **kwargs) -> None:
    for _ in range(5):
        fn(*args, **kwargs)
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn(*args, **kwargs)
    if cuda:
        torch.cuda.synchronize()
    print(f"  {label:62s} {1e6 * (time.perf_counter() - t0) / n:10.1f} µs/step", flush=True)


def _upload_and_launch(ks, st, b: int, out: torch.Tensor) -> None:
    ks.launch(*st.upload(0, b), out[:b])


def _engine(preset: str, max_batch: int):
    cfg = load_config(None, ['model.checkpoint=""', f'model.preset="{preset}"', 'runner.engine="graph"',
                             f"runner.buckets={sorted({1, 2, 4, 8, max_batch})}", f"scheduler.max_batch={max_batch}",
                             f"universe.instruments={max(8, max_batch)}", 'runner.device="cuda"',
                             "runner.self_check=false"])
    return build_runtime(cfg, max(8, max_batch)).engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="lstm_a,mlp_small")
    ap.add_argument("--batches", default="1,8,64")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("diag_graph_inputs: needs a CUDA device (it times the GPU graph engine)")
    batches = [int(b) for b in args.batches.split(",")]
    for preset in args.presets.split(","):
        eng = _engine(preset, max(batches))
        ks, st = eng.kstep, eng.staging
        print(f"{preset}: engine {eng.name}, ring_h {tuple(ks.ring_h.shape)}, {ks.staged_rows} staged rows per entry",
              flush=True)
        out = torch.zeros(max(batches), OUT_COLS, device="cuda")
        for b in batches:
            _per_step(f"batch {b}: engine.step (the service's graph engine)", eng.step, b)
            _per_step(f"batch {b}: host gather alone (StepStaging.gather)", st.gather, 0, b, cuda=False)
            _per_step(f"batch {b}: upload + model kernel, eager launches", _upload_and_launch, ks, st, b, out)
            if ks.kind == "lstm" and ks.mode == "window":
                from hft_infer.kernels.lstm_window import lstm_window_step

                sl, po, rows = st.upload(0, b)
                for persistent in (True, False):
                    _per_step(f"batch {b}: window kernel on device inputs, persistent={persistent} (eager)",
                              lstm_window_step, ks.w, ks.ws, ks.h, ks.c, rows.view(b, -1), sl, po, ks.thresholds,
                              ks.held, out[:b], persistent=persistent)
        eng.close()


if __name__ == "__main__":
    main()
