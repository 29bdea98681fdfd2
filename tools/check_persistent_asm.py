"""Compile every persistent kernel the service can launch for a CUDA target and check its PTX
for loads that can read stale request data (no GPU needed: Triton's bundled ptxas).

    python tools/check_persistent_asm.py [--arch 90] [--sms 132] [--cases mlp_small,lstm_a/stream:bf16]
    python tools/check_persistent_asm.py --num-stages 3     # shows what the check catches

Why: a persistent kernel reads each request from memory that the copy engine and the other
programs rewrite while it runs, so every such load must be coherent (volatile, served by L2).
Triton's software pipeliner turned the volatile loads of the request payload and the model
state into `cp.async.ca` copies (cached in L1), and the persistent engines read a previous
request's rows whenever a ring slot came round again (issue 13; kernels/persistent.py,
NUM_STAGES). This compiles each kernel exactly as the engine launches it (KernelStep and the
engine's request ring, built on the CPU; `PersistentKernel._launch_spec`) and lists what
`asm_problems` finds. Exit 1 when any kernel has a problem; 2 on bad arguments.

TRITON_INTERPRET must be unset (the interpreter's kernels do not compile).
"""

from __future__ import annotations

import sys
import time

from kernel_compile import build_cases, case_parser, cpu_kernel_step, ready_to_compile

DEFAULT_CASES = "floor,mlp_small,mlp_small:bf16,lstm_a,lstm_a/stream,lstm_b,lstm_a:bf16"
MAX_BATCH = 64
MAX_INFLIGHT = 2


def build_kernel(case: str, sms: int):
    """The persistent kernel `case` (preset[/mode][:precision], or "floor") as the engine builds it."""
    from hft_infer.kernels.persistent import FloorKernel, RequestRing

    if case == "floor":
        return FloorKernel(RequestRing(MAX_BATCH, width=4, n_requests=MAX_INFLIGHT + 1), "cpu")
    from hft_infer.runner.gpu import PersistentEngine

    kstep = cpu_kernel_step(case, MAX_BATCH)
    ring = PersistentEngine.request_ring(kstep, max_batch=MAX_BATCH, max_inflight=MAX_INFLIGHT)
    return kstep.persistent(ring, max_programs=sms)


def main(argv: list[str] | None = None) -> int:
    ap = case_parser(__doc__, DEFAULT_CASES, "cases: floor, or preset[/window|/stream][:fp32|tf32|bf16]")
    ap.add_argument("--sms", type=int, default=132, help="SMs the LSTM kernels may use (default: %(default)s, H200)")
    ap.add_argument("--num-stages", type=int, default=None,
                    help="compile with this many pipeline stages instead of the launch's own")
    args = ap.parse_args(argv)
    if not ready_to_compile("check_persistent_asm"):
        return 2
    if args.sms < 1:
        ap.error("--sms must be >= 1")
    from hft_infer.kernels.persistent import asm_problems

    options = {} if args.num_stages is None else {"num_stages": args.num_stages}
    failed = 0
    print(f"{'kernel':24s} {'programs':>8s} {'volatile ld':>11s} {'compile s':>9s}  problems")
    kernels = build_cases("check_persistent_asm", args.cases, lambda case: build_kernel(case, args.sms))
    if kernels is None:
        return 2
    for case, kernel in kernels:
        t0 = time.perf_counter()
        ptx = kernel.compile_asm(args.arch, **options)["ptx"]
        problems = asm_problems(ptx)
        failed += bool(problems)
        print(f"{case:24s} {kernel.programs:8d} {ptx.count('ld.volatile.global'):11d} "
              f"{time.perf_counter() - t0:9.1f}  {'; '.join(problems) or 'none'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
