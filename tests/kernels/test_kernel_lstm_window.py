"""Window-mode LSTM step: kernel vs the incremental torch reference (fp32, float64) and
vs recomputing torch.nn.LSTM (float64) over each emitted window from zero state."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import pytest
import torch
from kernels_testlib import TOL, check_out, make_lstm, make_rows, make_schedule, rel_err, require_device

from hft_infer.kernels.common import COL_LOGITS, OUT_COLS, features_reference
from hft_infer.kernels.lstm_window import (
    alloc_window_state,
    alloc_window_workspace,
    lstm_window_reference,
    lstm_window_step,
    prepare_lstm_weights,
)


@dataclass(frozen=True)
class Case:
    device: str
    levels: int
    window: int
    hidden: int
    layers: int
    precision: str
    block_h: int
    persistent: bool
    batches: tuple[int, ...]
    n_inst: int
    pad: int = 1
    ring: bool = True
    recompute_every: int = 1
    block_m: int | None = None
    max_programs: int | None = None


def _cases():
    cpu = [
        # 3 programs (H=10 over block_h=4: the last one half empty), a launch per phase;
        # 2 instruments interleaved, each past W rows (the circular buffer wraps)
        Case("cpu", 2, 3, 10, 3, "fp32", 4, False, (2, 1, 2, 2, 1), 2),
        # one program: the persistent launch with its grid barriers runs under the interpreter
        Case("cpu", 2, 4, 12, 2, "fp32", 16, True, (2, 1, 2, 2, 2, 1, 2), 2),
        Case("cpu", 2, 3, 8, 2, "bf16", 4, False, (2, 2, 2, 2), 2),
        # 16-row tiles: 4 entries x 6 windows = 24 rows, two tiles over a split grid (2 x 2 programs)
        Case("cpu", 1, 6, 7, 1, "fp32", 4, False, (3, 3, 3), 3, ring=False, block_m=16),
        # the same with one program per hidden block (max_programs = NB): it runs both tiles, and
        # projects entry 2, which spans the two, once for each
        Case("cpu", 1, 6, 7, 1, "fp32", 4, False, (3, 3, 3), 3, ring=False, block_m=16, max_programs=2),
        # 18 entries x 3 windows over 16-row tiles, 2 x 4 programs: the head and decisions of entries
        # 16-17 are the second program's share (16 entries a program)
        Case("cpu", 1, 3, 7, 1, "fp32", 4, False, (18, 17, 18), 18, ring=False, block_m=16),
    ]
    long = (64,) * 52 + (1, 8, 64, 5, 64, 1, 8, 64)  # every instrument past W=50 rows, then mixed batches
    gpu = [Case("cuda", 10, 50, 128, 2, p, 4, True, long, 64, recompute_every=7) for p in ("fp32", "tf32", "bf16")]
    gpu += [Case("cuda", 10, 50, 256, 3, p, 4, True, long, 64, recompute_every=7) for p in ("fp32", "bf16")]
    gpu += [
        Case("cuda", 10, 50, 128, 2, "fp32", 4, False, (64,) * 3 + (8, 1), 64),
        # irregular: odd H over 8-unit blocks, odd W, batches 1..max of 20 instruments
        Case("cuda", 3, 7, 45, 2, "fp32", 8, True, (20, 1, 7, 20, 3, 20, 20, 11, 20, 20, 2), 20),
        Case("cuda", 3, 7, 45, 3, "bf16", 4, False, (20, 1, 7, 20, 3, 20, 20, 11, 20, 20, 2), 20),
    ]
    ids = lambda c: (f"{c.device}-{c.precision}-L{c.layers}xH{c.hidden}-W{c.window}-bh{c.block_h}-"  # noqa: E731
                     f"{'persistent' if c.persistent else 'phased'}{f'-mp{c.max_programs}' if c.max_programs else ''}")
    return ([pytest.param(c, id=ids(c)) for c in cpu]
            + [pytest.param(c, marks=pytest.mark.gpu, id=ids(c)) for c in gpu])


def _recompute_logits(lstm64, params64, history, slots, positions, window, dev) -> torch.Tensor:
    """torch.nn.LSTM (float64) over rows max(0, t-W+1)..t of each entry, from zero state."""
    wins, last = [], []
    for s, t in zip(slots, positions):
        start = max(0, t - window + 1)
        idx = [start + min(j, t - start) for j in range(window)]  # left-aligned, tail repeats the last row
        wins.append(torch.stack([history[s][i] for i in idx]))
        last.append(t - start)
    x = features_reference(torch.stack(wins).to(dev, torch.float64), params64.mean, params64.inv_std)
    seq, _ = lstm64.to(dev)(x)
    top = seq[torch.arange(len(last), device=dev), torch.tensor(last, device=dev)]
    return top @ params64.head_weight.t() + params64.head_bias


@pytest.mark.parametrize("case", _cases())
def test_lstm_window_matches_references(case: Case):
    dev = require_device(case.device)
    gen = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))
    params, lstm64 = make_lstm(case.levels, case.hidden, case.layers, gen)
    p32, p64 = params.to(torch.float32, dev), params.to(torch.float64, dev)
    f = 4 * case.levels + 2
    n_slots = case.n_inst + 1
    sink = n_slots - 1
    w = prepare_lstm_weights(params, precision=case.precision, device=dev, block_h=case.block_h)
    ws = alloc_window_workspace(w, max(case.batches) + case.pad, case.window, max_programs=case.max_programs)
    h, c = alloc_window_state(w, n_slots, case.window)
    h32, c32 = torch.zeros_like(h), torch.zeros_like(c)
    h64, c64 = h.double(), c.double()
    held, held32, held64 = (torch.zeros(n_slots, dtype=torch.int32, device=dev) for _ in range(3))
    thr = (0.125, 0.0625)  # exact in fp32: the kernel compares in fp32, the checks in float64
    t32 = torch.tensor(thr, device=dev)
    t64 = t32.double()
    ring_len = case.window + 2
    ring = torch.zeros(n_slots, ring_len, f, device=dev) if case.ring else None
    ring_ref = torch.zeros(n_slots, ring_len, f) if case.ring else None
    history: dict[int, list[torch.Tensor]] = {s: [] for s in range(case.n_inst)}
    sched = make_schedule(case.n_inst, sink, list(case.batches), seed=7, pad=case.pad)
    worst = {"kernel_vs_f64": 0.0}
    for step, (slots_l, pos_l) in enumerate(sched.steps):
        n = len(slots_l)
        n_real = n - case.pad
        rows = make_rows(n, case.levels, gen)
        for i in range(n_real):
            history[slots_l[i]].append(rows[i])
        slots = torch.tensor(slots_l, dtype=torch.int32, device=dev)
        positions = torch.tensor(pos_l, dtype=torch.int64, device=dev)
        out = torch.full((n, OUT_COLS), float("nan"), device=dev)  # poison
        ws.scratch.fill_(float("nan"))  # nothing may read scratch it did not write this step
        idle = torch.ones(n_slots, dtype=torch.bool, device=dev)
        idle[slots.long()] = False
        h_before, c_before = h[idle].clone(), c[idle].clone()
        prev, prev32, prev64 = held[slots.long()].clone(), held32[slots.long()].clone(), held64[slots.long()].clone()

        lstm_window_step(w, ws, h, c, rows.to(dev), slots, positions, t32, held, out, ring=ring,
                         persistent=case.persistent, block_m=case.block_m)
        out32 = lstm_window_reference(p32, h32, c32, rows.to(dev), slots, positions, t32, held32,
                                      torch.empty(n, OUT_COLS, device=dev))
        out64 = lstm_window_reference(p64, h64, c64, rows.to(dev), slots, positions, t64, held64,
                                      torch.empty(n, OUT_COLS, device=dev, dtype=torch.float64))
        tol = TOL[case.precision]
        check_out(out32, out64, TOL["fp32"], n_real, prev_held=prev32, ref_prev_held=prev64, thr=thr,
                  what=f"step {step}: fp32 reference vs float64")
        e = check_out(out, out64, tol, n_real, prev_held=prev, ref_prev_held=prev64, thr=thr,
                      what=f"step {step}: kernel vs float64")
        check_out(out, out32, tol, n_real, prev_held=prev, ref_prev_held=prev32, thr=thr,
                  what=f"step {step}: kernel vs fp32 reference")
        worst["kernel_vs_f64"] = max(worst["kernel_vs_f64"], e["logits"])
        real = torch.zeros(n_slots, dtype=torch.bool, device=dev)
        real[:case.n_inst] = True
        for name, got, want in (("h", h, h64), ("c", c, c64)):
            err = rel_err(got[real], want[real])
            assert err <= tol, f"step {step}: state {name} rel err {err:.3g} > {tol:g}"
        assert torch.equal(h[idle], h_before) and torch.equal(c[idle], c_before), "touched a slot not in the batch"
        if case.ring:
            ring_ref[torch.tensor(slots_l), torch.remainder(torch.tensor(pos_l), ring_len)] = rows
            assert torch.equal(ring.cpu(), ring_ref), "fused ring scatter"
        if step % case.recompute_every == 0 or step == len(sched.steps) - 1:
            # the incremental method == recomputing the window from zero state
            rec = _recompute_logits(lstm64, p64, history, slots_l[:n_real], pos_l[:n_real], case.window, dev)
            err = rel_err(out[:n_real, COL_LOGITS:COL_LOGITS + 3], rec)
            assert err <= tol, f"step {step}: kernel vs nn.LSTM recompute rel err {err:.3g} > {tol:g}"
            err = rel_err(out64[:n_real, COL_LOGITS:COL_LOGITS + 3], rec)
            assert err <= 1e-10, f"step {step}: float64 incremental reference vs recompute {err:.3g}"
    assert ws.sync[0].item() == 0, "barrier counter must be back at zero after a launch"


@pytest.mark.parametrize("hidden", [12, 40, 80, 128, 256])
def test_prefetch_plans_fit_their_budget_and_cover_every_chunk(hidden):
    """`prefetch_plan`: both operands at once only within the budget; a group of chunks within it,
    dividing the operand's chunks (the groups are a loop over equal parts), the largest that does."""
    from hft_infer.kernels.lstm import prefetch_plan, prepare_lstm_weights

    params, _ = make_lstm(2, hidden, 2, torch.Generator().manual_seed(hidden))
    w = prepare_lstm_weights(params, device="cpu", block_h=4)
    nch = w.kh // w.block_k
    for block_m in (16, 32, 64, 128):
        for budget in (0, 1024, 2048, 4096, 8192):
            plan = prefetch_plan(w, block_m, budget)
            assert plan["BOTH"] == (2 * block_m * w.kh <= budget)
            g = plan["GROUP"]
            assert g >= 1 and nch % g == 0 and (g == 1 or g * block_m * w.block_k <= budget), (block_m, budget, plan)
            bigger = 2 * g
            assert not (nch % bigger == 0 and bigger * block_m * w.block_k <= budget), "not the largest group"
