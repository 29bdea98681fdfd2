"""Fused MLP step against the torch reference (fp32) and a float64 reference."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import pytest
import torch
from kernels_testlib import TOL, check_out, make_mlp, make_rows, make_schedule, require_device

from hft_infer.kernels.common import OUT_COLS
from hft_infer.kernels.mlp import alloc_mlp_workspace, mlp_step, mlp_step_reference, prepare_mlp_weights
from hft_infer.kernels.ring import ring_gather_reference, ring_scatter, ring_scatter_reference


@dataclass(frozen=True)
class Case:
    device: str
    levels: int
    window: int
    hidden: tuple[int, ...]
    precision: str
    batches: tuple[int, ...]  # real entries per step (instruments interleave at random)
    n_inst: int
    ring_len: int
    block_n: int = 32
    block_k: int = 64
    ksplit: int | None = None
    new_rows: bool = True  # rows staged with the step (fused scatter) or already in the ring
    gathered: bool = False  # (rows in the ring) the windows gathered first, read dense: the graph engine's way
    pad: int = 1  # padding-sink entries appended to every batch
    held_dtype: torch.dtype = torch.int32  # the CPU decision policy keeps int8


def _cases():
    cpu = [
        # split 2 x 3 programs, K chunks across row boundaries (W*F = 50 = 3x16 + 2)
        Case("cpu", 2, 5, (24, 10), "fp32", (1, 3, 4, 2), 4, 7, block_n=16, block_k=16, ksplit=3),
        Case("cpu", 2, 5, (20, 12), "bf16", (3, 2), 4, 7, block_n=16, block_k=16, ksplit=2),
        Case("cpu", 3, 3, (20,), "fp32", (2, 3), 3, 4, block_n=16, block_k=32),
        Case("cpu", 2, 4, (24, 10), "fp32", (3,), 3, 4, block_n=16, block_k=16, new_rows=False,
             held_dtype=torch.int8),
        Case("cpu", 2, 4, (24, 10), "fp32", (3, 1), 3, 5, block_n=16, block_k=16, new_rows=False, gathered=True),
    ]
    gpu = [Case("cuda", 10, 32, (128, 64), p, (1, 8, 64, 8, 1), 70, 40) for p in ("fp32", "tf32", "bf16")]
    gpu += [
        # irregular widths, two batch tiles (70 > 64), odd window
        Case("cuda", 3, 7, (100, 37), "fp32", (70, 5, 70), 80, 9, ksplit=5),
        Case("cuda", 3, 7, (45,), "bf16", (33, 2), 40, 7, block_n=16),
        Case("cuda", 10, 32, (128, 64), "fp32", (8, 64), 70, 32, new_rows=False, held_dtype=torch.int8),
        Case("cuda", 10, 32, (128, 64), "fp32", (1, 8, 64), 70, 40, new_rows=False, gathered=True),
    ]
    src = lambda c: "rows" if c.new_rows else ("gathered" if c.gathered else "ring")  # noqa: E731
    out = [pytest.param(c, id=f"cpu-{c.precision}-{c.hidden}-W{c.window}-{src(c)}") for c in cpu]
    out += [pytest.param(c, marks=pytest.mark.gpu, id=f"cuda-{c.precision}-{c.hidden}-W{c.window}-{src(c)}")
            for c in gpu]
    return out


@pytest.mark.parametrize("case", _cases())
def test_mlp_step_matches_references(case: Case):
    dev = require_device(case.device)
    gen = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))
    params = make_mlp(case.levels, case.window, case.hidden, gen)
    p64 = params.to(torch.float64)
    f = 4 * case.levels + 2
    n_slots = case.n_inst + 1
    sink = n_slots - 1
    max_batch = max(case.batches) + case.pad
    w = prepare_mlp_weights(params, precision=case.precision, device=dev, block_n=case.block_n,
                            block_k=case.block_k, ksplit=case.ksplit)
    ws = alloc_mlp_workspace(w, max_batch)
    # the ring starts with a random history: early positions must not read it
    ring0 = make_rows(n_slots * case.ring_len, case.levels, gen).view(n_slots, case.ring_len, f)
    ring_k, ring_32, ring_64 = ring0.to(dev), ring0.clone(), ring0.double()
    held_k = torch.zeros(n_slots, dtype=case.held_dtype, device=dev)
    held_32 = torch.zeros(n_slots, dtype=case.held_dtype)
    held_64 = torch.zeros(n_slots, dtype=case.held_dtype)
    thr = (0.125, 0.0625)  # exact in fp32: the kernel compares in fp32, the checks in float64
    thresholds = torch.tensor(thr, dtype=torch.float32, device=dev)
    # start some instruments deep in their stream (full windows, ring wrap-around)
    start = {s: (0 if s % 2 else 3 * case.window + s) for s in range(case.n_inst)}
    sched = make_schedule(case.n_inst, sink, list(case.batches), seed=len(case.batches), pad=case.pad, start=start)
    for slots_l, pos_l in sched.steps:
        n = len(slots_l)
        n_real = n - case.pad
        rows = make_rows(n, case.levels, gen)
        slots = torch.tensor(slots_l, dtype=torch.int32)
        positions = torch.tensor(pos_l, dtype=torch.int64)
        out = torch.full((n, OUT_COLS), float("nan"), device=dev)  # poison
        ws.part.fill_(float("nan"))  # stale partial sums must never be read
        idx = slots.long()
        prev_k, prev_32, prev_64 = held_k[idx].cpu(), held_32[idx].clone(), held_64[idx].clone()
        if case.new_rows:
            mlp_step(w, ws, ring_k, slots.to(dev), positions.to(dev), thresholds, held_k, out, rows=rows.to(dev))
        else:
            ring_scatter(ring_k, rows.to(dev), slots.to(dev), positions.to(dev))
            for r in (ring_32, ring_64):
                ring_scatter_reference(r, rows, slots, positions)
            if case.gathered:  # the windows as runner/staging.py stages them (its test checks that)
                windows = ring_gather_reference(ring_k, slots.to(dev), positions.to(dev), case.window)
                mlp_step(w, ws, windows.contiguous(), slots.to(dev), positions.to(dev), thresholds, held_k, out,
                         dense=True)
            else:
                mlp_step(w, ws, ring_k, slots.to(dev), positions.to(dev), thresholds, held_k, out)
        ref_rows = rows if case.new_rows else None
        out32 = mlp_step_reference(params, ring_32, slots, positions, torch.tensor(thr), held_32,
                                   torch.empty(n, OUT_COLS), rows=ref_rows)
        out64 = mlp_step_reference(p64, ring_64, slots, positions, torch.tensor(thr, dtype=torch.float64), held_64,
                                   torch.empty(n, OUT_COLS, dtype=torch.float64), rows=ref_rows)
        tol = TOL[case.precision]
        # the fp32 reference agrees with float64 (same grid-price data)
        check_out(out32, out64, TOL["fp32"], n_real, prev_held=prev_32, ref_prev_held=prev_64, thr=thr,
                  what="fp32 reference vs float64")
        check_out(out, out64, tol, n_real, prev_held=prev_k, ref_prev_held=prev_64, thr=thr,
                  what=f"{case.precision} kernel vs float64")
        check_out(out, out32, tol, n_real, prev_held=prev_k, ref_prev_held=prev_32, thr=thr,
                  what=f"{case.precision} kernel vs fp32 reference")
        assert torch.equal(ring_k.cpu(), ring_32), "fused scatter wrote a different ring"
        assert ws.count.eq(0).all(), "tile counters must be reset for the next launch"
        real = slots[:n_real].long()
        assert torch.equal(held_k.cpu()[real], out[:n_real, 1].cpu().to(case.held_dtype)), "held != emitted action"
