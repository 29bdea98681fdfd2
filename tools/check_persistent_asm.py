"""Compile every persistent kernel the service can launch for a CUDA target and check its PTX
for loads that can read stale request data (no GPU needed: Triton's bundled ptxas).

    python tools/check_persistent_asm.py [--arch 90] [--sms 132] [--cases mlp_small,lstm_a/stream:bf16]
    python tools/check_persistent_asm.py --num-stages 3     # shows what the check catches
    python tools/check_persistent_asm.py --loops            # also the SASS loops that hold volatile loads
    python tools/check_persistent_asm.py --cases mlp_small --phases   # the MLP's diagnostic phases build

Why: a persistent kernel reads each request from memory that the copy engine and the other
programs rewrite while it runs, so every such load must be coherent (volatile, served by L2).
Triton's software pipeliner turned the volatile loads of the request payload and the model
state into `cp.async.ca` copies (cached in L1), and the persistent engines read a previous
request's rows whenever a ring slot came round again (issue 13; kernels/persistent.py,
NUM_STAGES). This compiles each kernel exactly as the engine launches it (KernelStep and the
engine's request ring, built on the CPU; `PersistentKernel._launch_spec`) and lists what
`asm_problems` finds. Exit 1 when any kernel has a problem; 2 on bad arguments.

--loops lists, per kernel, each loop of its SASS (nvdisasm, bundled with Triton) whose body holds
volatile loads, with the source line of its first instruction (an inlined helper's code may carry
its caller's line; an outer loop counts its inner loops' loads too): the next iteration's loads
issue after this one's uses, so a loop of k iterations costs k dependent L2 round trips at least
(wave 38: the LSTM's loops over K chunks, one trip per 32 columns of each operand, and the MLP
finish's loop over its 11 splits were the kernels' longest dependent chains).

--phases compiles the MLP cases' diagnostic build instead (`MlpPersistent(timing=True, phases=True)`,
the one tools/sweep_persistent_geometry.py times): the same check, and its `%globaltimer` reads (six:
mlp_persistent.PHASE_STAMPS) in the "timer" column, which is 0 for the engine's builds. The LSTMs'
phases builds are not rebuilt here (the sweep compiles them on the GPU host).

TRITON_INTERPRET must be unset (the interpreter's kernels do not compile).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
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


def phases_build(kernel):
    """The diagnostic phases build of an MLP kernel as the engine builds it (`build_kernel`)."""
    from hft_infer.kernels.mlp_persistent import MlpPersistent

    return MlpPersistent(kernel.w, kernel.ring, kernel.thresholds, kernel.held, num_warps=kernel.num_warps,
                         timing=True, phases=True)


def volatile_loops(cubin: bytes) -> list[tuple[str, int]]:
    """(source line, volatile loads in its body) of each SASS loop (a branch back to an earlier
    label) whose body holds volatile loads (`LDG...STRONG`), in code order."""
    import triton

    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([nvdisasm, "-c", "-g", f.name], capture_output=True, text=True, check=True).stdout
    src, labels, items = "?", {}, []  # items: (is a volatile load, branch target or None, source)
    for line in sass.splitlines():
        if m := re.match(r'\s*//## File "(.*)", line (\d+)', line):
            src = f"{os.path.basename(m.group(1))}:{m.group(2)}"
        elif m := re.match(r"^(\.L_x_\d+):", line):
            labels[m.group(1)] = len(items)
        elif m := re.search(r"/\*[0-9a-f]+\*/\s+(.*?);", line):
            ins = m.group(1)
            target = re.search(r"BRA\s+`?\(?(\.L_x_\d+)", ins)
            items.append(("LDG" in ins and "STRONG" in ins, target.group(1) if target else None, src))
    loops = []
    for k, (_, target, _) in enumerate(items):
        if target in labels and labels[target] <= k:
            body = items[labels[target]:k + 1]
            n = sum(vol for vol, _, _ in body)
            if n:
                loops.append((body[0][2], n))  # where its first instruction comes from
    return loops


def main(argv: list[str] | None = None) -> int:
    ap = case_parser(__doc__, DEFAULT_CASES, "cases: floor, or preset[/window|/stream][:fp32|tf32|bf16]")
    ap.add_argument("--sms", type=int, default=132, help="SMs the LSTM kernels may use (default: %(default)s, H200)")
    ap.add_argument("--num-stages", type=int, default=None,
                    help="compile with this many pipeline stages instead of the launch's own")
    ap.add_argument("--loops", action="store_true",
                    help="list the SASS loops that hold volatile loads (dependent L2 round trips)")
    ap.add_argument("--phases", action="store_true",
                    help="compile the MLP cases' diagnostic phases build instead of the engine's (MLP cases only)")
    args = ap.parse_args(argv)
    if args.phases and any(c.split(":")[0].split("/")[0] not in ("mlp_small",) for c in args.cases.split(",") if c):
        ap.error(f"--phases: MLP cases only (mlp_small[:precision]), got {args.cases!r}")
    if not ready_to_compile("check_persistent_asm"):
        return 2
    if args.sms < 1:
        ap.error("--sms must be >= 1")
    from hft_infer.kernels.persistent import asm_problems

    options = {} if args.num_stages is None else {"num_stages": args.num_stages}
    failed = 0
    print(f"{'kernel':24s} {'programs':>8s} {'volatile ld':>11s} {'timer':>5s} {'compile s':>9s}  problems")
    build = ((lambda case: phases_build(build_kernel(case, args.sms))) if args.phases
             else (lambda case: build_kernel(case, args.sms)))
    kernels = build_cases("check_persistent_asm", args.cases, build)
    if kernels is None:
        return 2
    for case, kernel in kernels:
        t0 = time.perf_counter()
        asm = kernel.compile_asm(args.arch, **options)
        ptx = asm["ptx"]
        problems = asm_problems(ptx)
        failed += bool(problems)
        print(f"{case:24s} {kernel.programs:8d} {ptx.count('ld.volatile.global'):11d} {ptx.count('%globaltimer'):5d} "
              f"{time.perf_counter() - t0:9.1f}  {'; '.join(problems) or 'none'}", flush=True)
        if args.loops:
            for at, n in volatile_loops(asm["cubin"]):
                print(f"    loop at {at}: {n} volatile loads in its body", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
