"""Shared by the tools that compile or inspect the service's kernels: tools/check_persistent_asm.py
and tools/check_launched_cuts.py (compiled for a CUDA target on a machine without a GPU, with
Triton's bundled ptxas), tools/sweep_lstm_geometry.py (the launches' grids)."""

from __future__ import annotations

import contextlib
import os
import sys

N_SLOTS = 64


def refuse_interpreter(tool: str) -> bool:
    """True (and a message on stderr) when TRITON_INTERPRET is on: the interpreter's kernels do
    not compile, so a compile check would check nothing."""
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return False
    print(f"{tool}: unset TRITON_INTERPRET (the interpreter's kernels do not compile)", file=sys.stderr)
    return True


def cpu_kernel_step(case: str, max_batch: int):
    """The engine's `KernelStep` of `case` (preset[/window|/stream][:fp32|tf32|bf16]) built on the
    CPU as the GPU engines build it (N_SLOTS instruments, a feature ring deep enough for the
    window). Unknown presets raise KeyError, bad modes or precisions ValueError."""
    from hft_infer.features import FeatureStore
    from hft_infer.models.checkpoint import load_model
    from hft_infer.runner.gpu import KernelStep

    name, _, precision = case.partition(":")
    preset, _, mode = name.partition("/")
    model, _ = load_model("", preset=preset, seed=0)
    store = FeatureStore(N_SLOTS, model.spec.levels, max(model.spec.window, 1) + 64)
    return KernelStep(model, mode=mode or "window", window_method="incremental", ring_h=store.tensor,
                      max_batch=max_batch, precision=precision or "fp32", threshold=0.1, hysteresis=0.05,
                      device="cpu")


def case_parser(doc: str, default_cases: str, cases_help: str):
    """The tools' argument parser: `doc` as its description, --cases (`cases_help`, default
    `default_cases`) and --arch; the caller adds its own options."""
    import argparse

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=default_cases, help=f"comma-separated {cases_help} (default: %(default)s)")
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10 (default: %(default)s, Hopper)")
    return ap


def ready_to_compile(tool: str) -> bool:
    """False (and why on stderr) under the Triton interpreter; else one torch thread (the cases are
    built on the CPU, one at a time) and True."""
    if refuse_interpreter(tool):
        return False
    import torch

    torch.set_num_threads(1)
    return True


def build_cases(tool: str, text: str, build) -> list[tuple[str, object]] | None:
    """[(case, build(case))] for the comma-separated cases of `text`, built before anything is
    compiled; None (and the case with its reason on stderr) when one cannot be built."""
    built = []
    for case in [c.strip() for c in text.split(",") if c.strip()]:
        try:
            built.append((case, build(case)))
        except (ValueError, KeyError) as exc:
            print(f"{tool}: case {case!r}: {exc}", file=sys.stderr)
            return None
    return built


class _Recorder:
    """Stands in for a jit function: `fn[grid](*args, **kwargs)` records the launch."""

    def __init__(self) -> None:
        self.launches: list[tuple] = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((grid, args, kwargs))


@contextlib.contextmanager
def recording(module, name: str):
    """Within the block, launches of the jit function `module.name` are recorded instead of run:
    yields the list of their (grid, args, kwargs), as the launcher made them."""
    recorder, real = _Recorder(), getattr(module, name)
    setattr(module, name, recorder)
    try:
        yield recorder.launches
    finally:
        setattr(module, name, real)
