#!/usr/bin/env python3
"""Repeat a persistent-kernel GPU test case under variants of LstmPersistent's options: which
path an intermittent mismatch comes from (issue 13; CUDA only).

    python3 tools/diag_kernel_repeat.py [--case lstm_a-window-fp32] [--steps 480] [--rounds 3]
        [--variants default,inline0,emit0] [--parallel]

Each run is tests/kernels/test_kernel_persistent.py's GPU child (the code the test runs, not a
copy): one kernel life, `--steps` requests of the test's batch cycle (1, 8, 64, 5, 64, 1, 63, 8;
every 13th a reset), each answer checked against float64 as it arrives; a run stops at its first
mismatch. A variant sets LstmPersistent's keyword defaults in the child before the model is built:

    default   the engine's build (inline steps of <= 2 entries, the emitted pass for <= 2)
    inline0   inline_entries=0: every request through the ring's copy graph
    emit0     emit_entries=0: no emitted pass (every answer from the full pass)
    plain     both off
    narrow    wide_min_entries=2**20: the wide tiling compiled in but never taken (every full pass in
              the batch-1 tiling)

--parallel runs a round's variants at once (as the test runs its cases: the GPU time-slices the
contexts); otherwise one after another. Prints a line per run and a count per variant; exit 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager

VARIANTS = {
    "default": {},
    "inline0": {"inline_entries": 0},
    "emit0": {"emit_entries": 0},
    "plain": {"inline_entries": 0, "emit_entries": 0},
    "narrow": {"wide_min_entries": 1 << 20},
}
HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests", "kernels")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="lstm_a-window-fp32", help="a GPU case of test_kernel_persistent.py")
    ap.add_argument("--steps", type=int, default=480)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="default,inline0,emit0")
    ap.add_argument("--parallel", action="store_true")
    ap.add_argument("--timeout", type=float, default=240.0,
                    help="seconds a run may take, from its round's start under --parallel (a fresh machine "
                         "compiles each variant first: ~30 s; a 240-step run took ~9 s alone, and four at once "
                         "took over 90)")
    ap.add_argument("--child", nargs=3, metavar=("CASE", "STEPS", "VARIANT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.variants = [v for v in a.variants.split(",") if v]
    bad = [v for v in a.variants if v not in VARIANTS]
    if bad or a.steps < 1 or a.rounds < 1:
        ap.error(f"variants are {', '.join(VARIANTS)} (got {bad}); --steps and --rounds >= 1")
    return a


@contextmanager
def lstm_variant(variant: str):
    """LstmPersistent's keyword defaults set for `variant` inside the block (every kernel built there,
    the engine's included -- it passes neither option), restored after it."""
    from hft_infer.kernels.lstm_persistent import LstmPersistent

    defaults = LstmPersistent.__init__.__kwdefaults__
    saved = dict(defaults)
    defaults.update(VARIANTS[variant])
    try:
        yield
    finally:
        defaults.clear()
        defaults.update(saved)


def child(case: str, steps: int, variant: str) -> None:
    """The test's GPU child with LstmPersistent's keyword defaults set for `variant`."""
    sys.path.insert(0, TESTS)
    import test_kernel_persistent as t

    with lstm_variant(variant):
        t._gpu_child(case, steps)


def _spawn(a, variant: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", a.case, str(a.steps), variant],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=TESTS)


def _finish(p: subprocess.Popen, variant: str, rnd: int, t0: float, timeout: float) -> bool:
    try:
        out, _ = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        tail = " | ".join(ln.strip() for ln in (out or "").strip().splitlines()[-3:])
        print(f"round {rnd} {variant:8s} TIMEOUT after {timeout:.0f}s (hung kernel, or --timeout too short): "
              f"{tail or '(no output)'}", flush=True)
        return False
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    ok = p.returncode == 0
    last = lines[-1] if lines else "(no output)"
    if ok:
        try:
            last = "served {served}, worst rel err {worst_rel_err:.2g}".format(**json.loads(last))
        except (ValueError, KeyError):
            pass
    print(f"round {rnd} {variant:8s} {'ok  ' if ok else 'FAIL'} {time.monotonic() - t0:5.1f}s  {last}", flush=True)
    return ok


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.child:
        child(a.child[0], int(a.child[1]), a.child[2])
        return 0
    import torch

    if not torch.cuda.is_available():
        print("diag_kernel_repeat: needs a CUDA device", file=sys.stderr)
        return 2
    fails = {v: 0 for v in a.variants}
    for rnd in range(1, a.rounds + 1):
        if a.parallel:
            t0 = time.monotonic()
            procs = {v: _spawn(a, v) for v in a.variants}
            for v, p in procs.items():
                fails[v] += not _finish(p, v, rnd, t0, a.timeout)
        else:
            for v in a.variants:
                t0 = time.monotonic()
                fails[v] += not _finish(_spawn(a, v), v, rnd, t0, a.timeout)
    print(f"{a.case}, {a.steps} steps a run, {a.rounds} rounds{' (variants at once)' if a.parallel else ''}: "
          + ", ".join(f"{v} failed {n} of {a.rounds}" for v, n in fails.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
