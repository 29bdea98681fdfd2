#!/usr/bin/env python3
"""The start-up self-check's stream through the service's engine, many times over, under
variants of LstmPersistent's options: where lstm_a's intermittent divergence on the persistent
engine comes from (issue 13, BENCHMARKS.md wave 46; CUDA for the persistent engine).

    python3 tools/diag_self_check_repeat.py [--preset lstm_a] [--slots 8] [--programs 33]
        [--repeat 100] [--variants default,inline0,emit0,plain] [--engine persistent]

Wave 46 saw test_gpu_engines.py's shard test fail 2 of 9 runs: its 4-shard engine (at most
SMs / 4 programs, 8 instruments) failed the self-check, 32 of 300 scores off. This builds that
engine as `serve` does (self-check off; --programs sets runner.persistent_programs, 0 = every
SM), drives the check stream (runner/self_check.py: the rows, slots and batches the self-check
uses) through the CPU engine once and through it --repeat times, the kernel restarted on zeroed
state before each run (`engine.reset()`, as after the warm-up), and counts the runs whose scores
differ. Variants (LstmPersistent's keyword defaults, set before the engine is built):
tools/diag_kernel_repeat.py's VARIANTS (default, inline0, emit0, plain, narrow).

A failing run prints its mismatches by instrument -- the first row of each and how many -- and
the path of the request each diverging instrument was last in before its first bad row (batch
size; inline, emitted, wide), since a state the kernel wrote wrong shows only in the instrument's
later answers. A run whose kernel stops answering (wave 47 saw one: wrong scores, then the next
request never answered) prints the device's sync block as the kernel left it -- the lead's last
broadcast and every counter as programs x rounds + the programs that arrived in the round in
progress -- and ends its variant: a spinning kernel cannot be stopped, so each variant runs in a
process of its own (--isolate, the default with the persistent engine; --variant-timeout bounds
it). --engine eager runs the same on the CPU (this tool's logic: no variant applies).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections import defaultdict

import numpy as np
from diag_kernel_repeat import VARIANTS, lstm_variant
from diag_persistent import TOL, _runtime

from hft_infer.kernels.persistent import CNT_DONE, KIND_STOP, LINE, MB_REQ
from hft_infer.runner.base import EngineFailure
from hft_infer.runner.self_check import check_stream, drive

STUCK_EXIT = 3  # a variant's process after a kernel that stopped answering (it cannot be stopped)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="lstm_a", help="a preset (or preset/mode)")
    ap.add_argument("--slots", type=int, default=8, help="instruments (the shard test's: 8)")
    ap.add_argument("--programs", type=int, default=33,
                    help="runner.persistent_programs (the shard test's: an H100's 132 SMs / 4); 0: every SM")
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--variants", default="default,inline0,emit0,plain")
    ap.add_argument("--engine", default="persistent", choices=("persistent", "eager"))
    ap.add_argument("--show", type=int, default=3, help="failing runs reported in full, per variant")
    ap.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                    help="each variant in a process of its own (default: on with the persistent engine)")
    ap.add_argument("--variant-timeout", type=float, default=240.0,
                    help="seconds a variant's process may take (--isolate)")
    a = ap.parse_args(argv)
    a.variants = [v for v in a.variants.split(",") if v]
    bad = [v for v in a.variants if v not in VARIANTS]
    if bad or a.slots < 1 or a.repeat < 1 or a.programs < 0:
        ap.error(f"variants are {', '.join(VARIANTS)} (got {bad}); --slots and --repeat >= 1, --programs >= 0")
    return a


def request_paths(kernel, batches: list[int]) -> list[str]:
    """Each request's path through a persistent LSTM kernel, by its batch size: "inline" (the lead
    read it from pinned memory), "emitted" (answered before the full pass), "wide" (the full pass's
    second tiling); "-" where none applies (or no such kernel: the eager engine)."""
    if not hasattr(kernel, "emit_entries"):  # no persistent LSTM kernel
        return ["-"] * len(batches)
    out = []
    for b in batches:
        tags = [t for t, on in (("inline", b <= kernel.ring.inline_entries), ("emitted", b <= kernel.emit_entries),
                                ("wide", kernel.wide_rows > 0 and b * kernel.states >= kernel.wide_rows)) if on]
        out.append("+".join(tags) or "-")
    return out


def mismatch_report(got: np.ndarray, want: np.ndarray, slots: np.ndarray, batches: list[int],
                    paths: list[str], tol: float = TOL) -> list[str]:
    """Lines describing where `got` differs from `want` (empty when it agrees): per diverging
    instrument its first bad row and count, the request that row is in and the one the instrument
    was last in before it (batch size and path)."""
    diff = np.abs(got.astype(np.float64) - want)
    bad = np.flatnonzero(~(diff <= tol))
    if not len(bad):
        return []
    starts = np.cumsum([0] + batches[:-1])
    req_of = np.searchsorted(starts, np.arange(len(got)), side="right") - 1
    first_by_slot: dict[int, int] = {}
    count = defaultdict(int)
    for r in bad:
        s = int(slots[r])
        first_by_slot.setdefault(s, int(r))
        count[s] += 1
    lines = [f"{len(bad)} of {len(got)} scores differ (> {tol:g}), largest {np.nanmax(diff):.3g}, "
             f"in {len(first_by_slot)} instrument(s)"]
    for s, r in sorted(first_by_slot.items(), key=lambda kv: kv[1]):
        q = int(req_of[r])
        earlier = np.flatnonzero(slots[:r] == s)
        before = (f"last before it in request {int(req_of[earlier[-1]])} (batch {batches[req_of[earlier[-1]]]}, "
                  f"{paths[req_of[earlier[-1]]]})" if len(earlier) else "its first row")
        lines.append(f"  instrument {s}: {count[s]} bad from row {r} (request {q}, batch {batches[q]}, "
                     f"{paths[q]}, {diff[r]:.3g} off); {before}")
    return lines


def stuck_report(kernel) -> list[str]:
    """Lines describing the sync block of a persistent kernel that stopped answering, read while it
    spins (a copy on a stream of its own: the kernel's never ends): the lead's last broadcast
    (request, entries, kind) and each counter as whole rounds of every program plus the programs
    that arrived in the round in progress (a barrier some program never reached)."""
    import torch

    sync = kernel.sync
    if sync.is_cuda:
        host = torch.empty(sync.shape, dtype=sync.dtype, pin_memory=True)
        side = torch.cuda.Stream(device=sync.device)
        with torch.cuda.stream(side):
            host.copy_(sync, non_blocking=True)
        side.synchronize()
    else:
        host = sync.clone()
    words = host.tolist()
    nprog = kernel.programs
    layers = getattr(getattr(kernel, "w", None), "layers", 0)  # an LSTM's layer barriers (none elsewhere)
    mb = words[MB_REQ]
    kind = (mb >> 48) & 0xFF
    lines = [f"sync block ({nprog} programs): last broadcast request {mb & 0xFFFFFFFF}, {(mb >> 32) & 0xFFFF} "
             f"entries, kind {'stop' if kind == KIND_STOP else kind}"]
    names = ["done"] + [f"layer {ph}" for ph in range(layers)]
    for i, name in enumerate(names):
        v = words[(CNT_DONE + i) * LINE]
        lines.append(f"{name} counter {v} = {v // nprog} rounds + {v % nprog} of {nprog} programs")
    return lines


def run_variant(a, variant: str, ref_scores: np.ndarray, data, slots, batches) -> int:
    """--repeat runs of the stream through the engine built under `variant`; the failing runs' count."""
    extra = [f"runner.persistent_programs={a.programs}"] if a.engine == "persistent" else []
    with lstm_variant(variant):
        rt = _runtime(a.preset, a.engine, extra, n_slots=a.slots)
    eng, store = rt.engine, rt.store
    paths = request_paths(getattr(eng, "kernel", None), batches)
    failed = 0
    try:
        for i in range(a.repeat):
            eng.reset()
            try:
                got, _ = drive(eng, store, data, slots, batches)
            except EngineFailure as e:
                k = eng.kernel
                report = stuck_report(k) + [f"host: {k.ring.seq} submitted, {k.ring.in_flight} in flight"]
                print(f"  {variant} run {i + 1}: {e}\n    " + "\n    ".join(report), flush=True)
                print(f"{variant:8s} stuck in run {i + 1} of {a.repeat} ({failed} failed before it)", flush=True)
                os._exit(STUCK_EXIT)  # not close(): stop() would wait for a kernel that never ends
            lines = mismatch_report(got, ref_scores, slots, batches, paths)
            if lines:
                failed += 1
                if failed <= a.show:
                    print(f"  {variant} run {i + 1}: " + "\n    ".join(lines), flush=True)
    finally:
        eng.close()
    k = getattr(eng, "kernel", None)
    limits = (f", inline <= {k.ring.inline_entries}, emitted <= {k.emit_entries}, {k.programs} programs"
              if hasattr(k, "emit_entries") else "")  # what the variant built (its options took)
    print(f"{variant:8s} failed {failed} of {a.repeat} runs ({eng.name}: {eng.reason}{limits})", flush=True)
    return failed


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.engine == "persistent":
        import torch

        if not torch.cuda.is_available():
            print("diag_self_check_repeat: --engine persistent needs CUDA (--engine eager runs on the CPU)",
                  file=sys.stderr)
            return 2
    variants = a.variants if a.engine == "persistent" else ["default"]
    isolate = a.engine == "persistent" if a.isolate is None else a.isolate
    if isolate:
        for v in variants:  # one process a variant: a kernel that stops answering takes its process with it
            cmd = [sys.executable, __file__, "--no-isolate", "--engine", a.engine, "--variants", v, "--preset",
                   a.preset, "--slots", str(a.slots), "--programs", str(a.programs), "--repeat", str(a.repeat),
                   "--show", str(a.show)]
            try:
                rc = subprocess.run(cmd, timeout=a.variant_timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
            if rc not in (0, STUCK_EXIT):
                print(f"{v:8s} ended without its count (exit {rc}; --variant-timeout {a.variant_timeout:g} s)",
                      flush=True)
        return 0
    ref = _runtime(a.preset, "eager", n_slots=a.slots)
    data, slots, batches = check_stream(ref.store.width, a.slots, min(64, a.slots))
    ref.engine.reset()
    want, _ = drive(ref.engine, ref.store, data, slots, batches)
    ref.engine.close()
    print(f"{a.preset}: the self-check stream ({len(data)} rows, {len(batches)} requests, {a.slots} instruments), "
          f"{a.repeat} runs a variant"
          + (f", programs {a.programs or 'every SM'}" if a.engine == "persistent" else ""), flush=True)
    for v in variants:
        run_variant(a, v, want, data, slots, batches)
    return 0


if __name__ == "__main__":
    sys.exit(main())
