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
tools/diag_kernel_repeat.py's default / inline0 / emit0 / plain.

A failing run prints its mismatches by instrument -- the first row of each and how many -- and
the path of the request each diverging instrument was last in before its first bad row (batch
size; inline, emitted, wide), since a state the kernel wrote wrong shows only in the instrument's
later answers. --engine eager runs the same on the CPU (this tool's logic: no variant applies).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import numpy as np
from diag_kernel_repeat import VARIANTS, lstm_variant
from diag_persistent import TOL, _runtime

from hft_infer.runner.self_check import check_stream, drive


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
            got, _ = drive(eng, store, data, slots, batches)
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
    ref = _runtime(a.preset, "eager", n_slots=a.slots)
    data, slots, batches = check_stream(ref.store.width, a.slots, min(64, a.slots))
    ref.engine.reset()
    want, _ = drive(ref.engine, ref.store, data, slots, batches)
    ref.engine.close()
    print(f"{a.preset}: the self-check stream ({len(data)} rows, {len(batches)} requests, {a.slots} instruments), "
          f"{a.repeat} runs a variant"
          + (f", programs {a.programs or 'every SM'}" if a.engine == "persistent" else ""), flush=True)
    for v in a.variants if a.engine == "persistent" else ["default"]:
        run_variant(a, v, want, data, slots, batches)
    return 0


if __name__ == "__main__":
    sys.exit(main())
