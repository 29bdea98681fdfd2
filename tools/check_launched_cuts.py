#!/usr/bin/env python3
"""Compile every kernel launch of the graph engine's LSTM steps for a CUDA target, on any machine
(no GPU needed: Triton's bundled ptxas), and check that each fits an SM.

    python tools/check_launched_cuts.py [--arch 90] [--cases lstm_a,lstm_a:bf16,lstm_b/stream:tf32]
                                        [--max-batch 64] [--max-shared 232448]

Why: the graph engine cuts an LSTM step per batch size (kernels/lstm.py `phased_geometry`: hidden
units per program, rows per tile, warps), so each precision compiles several kernels, one per cut
and phase; a cut that the compiler rejects, or that asks for more shared memory than an SM has,
would only fail when a service first starts on a GPU. This builds each case's `KernelStep` on the
CPU exactly as the engine does, runs its own `launch` for batches 1..max_batch with the kernel
replaced by a recorder (`recorded_launches`: the launches' grids, arguments and constexprs as
`launch_lstm` makes them; HOST_IN set as for the engine's device-resident inputs), and compiles
each distinct launch. Exit 1 when any launch fails to compile or exceeds --max-shared bytes
(default: an sm_90 block's limit); 2 on bad arguments.

TRITON_INTERPRET must be unset (the interpreter's kernels do not compile).
"""

from __future__ import annotations

import sys
import time

import torch
from kernel_compile import build_cases, case_parser, cpu_kernel_step, ready_to_compile, recording

DEFAULT_CASES = "lstm_a,lstm_a:tf32,lstm_a:bf16,lstm_a/stream,lstm_b"


def build_step(case: str, max_batch: int):
    """The KernelStep of `case` (preset[/mode][:precision]) with its launched workspaces, on the CPU."""
    kstep = cpu_kernel_step(case, max_batch)
    if kstep.kind != "lstm":
        raise ValueError(f"{case} is not an LSTM (the MLP's step has one cut)")
    kstep.alloc_launched(max_batch)
    return kstep


def recorded_launches(kstep, b: int) -> list[tuple]:
    """(grid, args, kwargs) of each kernel launch of `kstep.launch` for a step of b entries, with
    inputs shaped and typed as the graph engine stages them (runner/staging.py: int64 slots and
    positions, float32 rows). The inputs are CPU tensors here, so `launch_lstm` marks them as host
    memory (HOST_IN): the engine's are on the device, so HOST_IN is set False as there."""
    from hft_infer.kernels import lstm as lstm_module
    from hft_infer.kernels.common import OUT_COLS

    slots = torch.zeros(b, dtype=torch.int64)
    rows = torch.zeros(b, kstep.staged_rows, kstep.features, dtype=torch.float32)
    out = torch.zeros(b, OUT_COLS, dtype=torch.float32)
    with recording(lstm_module, "_lstm_kernel") as launches:
        kstep.launch(slots, slots.clone(), rows, out)
    return [(grid, args, {**kwargs, "HOST_IN": False}) for grid, args, kwargs in launches]


def main(argv: list[str] | None = None) -> int:
    ap = case_parser(__doc__, DEFAULT_CASES, "preset[/window|/stream][:fp32|tf32|bf16]")
    ap.add_argument("--max-batch", type=int, default=64, help="largest batch (default: %(default)s)")
    ap.add_argument("--max-shared", type=int, default=232448,
                    help="shared memory bytes a block may use (default: %(default)s, sm_90)")
    args = ap.parse_args(argv)
    if not ready_to_compile("check_launched_cuts"):
        return 2
    if args.max_batch < 1:
        ap.error("--max-batch must be >= 1")
    from hft_infer.kernels.lstm import _lstm_kernel
    from hft_infer.kernels.persistent import compile_launch

    failed = 0
    print(f"{'case':20s} {'batches':>9s} {'block_h':>7s} {'block_m':>7s} {'warps':>5s} {'phase':>5s} "
          f"{'shared B':>8s} {'compile s':>9s}  problem")
    steps = build_cases("check_launched_cuts", args.cases, lambda case: build_step(case, args.max_batch))
    if steps is None:
        return 2
    for case, kstep in steps:
        cuts: dict[tuple, list[int]] = {}
        for b in range(1, args.max_batch + 1):
            _, _, kw = recorded_launches(kstep, b)[0]
            cuts.setdefault((kw["BH"], kw["BLOCK_M"], kw["num_warps"]), []).append(b)
        for (bh, bm, nw), batches in cuts.items():
            for _, launch_args, kwargs in recorded_launches(kstep, batches[0]):
                t0 = time.perf_counter()
                problem = ""
                try:
                    shared = compile_launch(_lstm_kernel, launch_args, kwargs, args.arch).metadata.shared
                    if shared > args.max_shared:
                        problem = f"shared memory {shared} B > {args.max_shared}"
                except Exception as exc:  # noqa: BLE001 - the compiler's refusal is the finding
                    shared, problem = -1, f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
                failed += bool(problem)
                print(f"{case:20s} {batches[0]:>4d}-{batches[-1]:<4d} {bh:7d} {bm:7d} {nw:5d} {kwargs['PH_BEGIN']:5d} "
                      f"{shared:8d} {time.perf_counter() - t0:9.1f}  {problem or 'none'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
