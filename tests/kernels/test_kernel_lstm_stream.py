"""Stream-mode LSTM step: kernel vs the torch reference (fp32, float64) and vs running
torch.nn.LSTM (float64) over each instrument's whole history."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import pytest
import torch
from kernels_testlib import TOL, check_out, make_lstm, make_rows, make_schedule, rel_err, require_device

from hft_infer.kernels.common import COL_LOGITS, OUT_COLS, features_reference
from hft_infer.kernels.lstm import prepare_lstm_weights
from hft_infer.kernels.lstm_stream import (
    alloc_stream_state,
    alloc_stream_workspace,
    lstm_stream_reference,
    lstm_stream_step,
)


@dataclass(frozen=True)
class Case:
    device: str
    levels: int
    hidden: int
    layers: int
    precision: str
    block_h: int
    persistent: bool
    batches: tuple[int, ...]
    n_inst: int
    pad: int = 1
    ring: bool = False
    recompute_every: int = 1
    block_m: int | None = None


def _cases():
    cpu = [
        # 3 programs (the last one partly empty), a launch per phase, 4 instruments interleaved
        Case("cpu", 2, 10, 2, "fp32", 4, False, (3, 1, 4, 2, 3), 4, ring=True),
        # one program: the persistent launch (grid barriers) under the interpreter
        Case("cpu", 1, 9, 3, "fp32", 16, True, (2, 3, 1, 3), 3),
        Case("cpu", 2, 8, 2, "bf16", 4, False, (3, 2, 3), 3),
        # 19 entries: two 16-row tiles over a split grid (2 x 2 programs)
        Case("cpu", 1, 6, 1, "fp32", 4, False, (18, 17), 18, block_m=16),
    ]
    mixed = (1, 8, 64, 64, 3, 64, 17, 64, 1, 64)
    # (tf32 and the phased launch of the real presets are covered by the window tests: same kernel)
    gpu = [Case("cuda", 10, 128, 2, p, 4, True, mixed * 3, 64, recompute_every=5, ring=p == "fp32")
           for p in ("fp32", "bf16")]
    gpu += [Case("cuda", 10, 256, 3, p, 4, True, mixed * 3, 64, recompute_every=5) for p in ("fp32", "bf16")]
    gpu += [
        # more than one 64-row tile per program; odd H over 8-unit blocks
        Case("cuda", 3, 45, 2, "fp32", 8, True, (100, 1, 77, 100, 5), 100, ring=True),
        Case("cuda", 3, 45, 3, "bf16", 4, False, (100, 1, 77, 100, 5), 100),
    ]
    ids = lambda c: (f"{c.device}-{c.precision}-L{c.layers}xH{c.hidden}-bh{c.block_h}-"  # noqa: E731
                     f"{'persistent' if c.persistent else 'phased'}")
    return ([pytest.param(c, id=ids(c)) for c in cpu]
            + [pytest.param(c, marks=pytest.mark.gpu, id=ids(c)) for c in gpu])


@pytest.mark.parametrize("case", _cases())
def test_lstm_stream_matches_references(case: Case):
    dev = require_device(case.device)
    gen = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))
    params, lstm64 = make_lstm(case.levels, case.hidden, case.layers, gen)
    lstm64 = lstm64.to(dev)
    p32, p64 = params.to(torch.float32, dev), params.to(torch.float64, dev)
    f = 4 * case.levels + 2
    n_slots = case.n_inst + 1
    sink = n_slots - 1
    w = prepare_lstm_weights(params, precision=case.precision, device=dev, block_h=case.block_h)
    ws = alloc_stream_workspace(w, max(case.batches) + case.pad)
    h, c = alloc_stream_state(w, n_slots)
    h32, c32 = torch.zeros_like(h), torch.zeros_like(c)
    h64, c64 = h.double(), c.double()
    held, held32, held64 = (torch.zeros(n_slots, dtype=torch.int32, device=dev) for _ in range(3))
    thr = (0.125, 0.0625)  # exact in fp32: the kernel compares in fp32, the checks in float64
    t32 = torch.tensor(thr, device=dev)
    t64 = t32.double()
    ring_len = 5
    ring = torch.zeros(n_slots, ring_len, f, device=dev) if case.ring else None
    ring_ref = torch.zeros(n_slots, ring_len, f) if case.ring else None
    history: dict[int, list[torch.Tensor]] = {s: [] for s in range(case.n_inst)}
    sched = make_schedule(case.n_inst, sink, list(case.batches), seed=11, pad=case.pad)
    for step, (slots_l, pos_l) in enumerate(sched.steps):
        n = len(slots_l)
        n_real = n - case.pad
        rows = make_rows(n, case.levels, gen)
        for i in range(n_real):
            history[slots_l[i]].append(rows[i])
        slots = torch.tensor(slots_l, dtype=torch.int32, device=dev)
        positions = torch.tensor(pos_l, dtype=torch.int64, device=dev)
        out = torch.full((n, OUT_COLS), float("nan"), device=dev)  # poison
        ws.scratch.fill_(float("nan"))
        idle = torch.ones(n_slots, dtype=torch.bool, device=dev)
        idle[slots.long()] = False
        h_before, c_before = h[idle].clone(), c[idle].clone()
        prev, prev32, prev64 = held[slots.long()].clone(), held32[slots.long()].clone(), held64[slots.long()].clone()

        lstm_stream_step(w, ws, h, c, rows.to(dev), slots, t32, held, out, positions=positions, ring=ring,
                         persistent=case.persistent, block_m=case.block_m)
        out32 = lstm_stream_reference(p32, h32, c32, rows.to(dev), slots, t32, held32,
                                      torch.empty(n, OUT_COLS, device=dev))
        out64 = lstm_stream_reference(p64, h64, c64, rows.to(dev), slots, t64, held64,
                                      torch.empty(n, OUT_COLS, device=dev, dtype=torch.float64))
        tol = TOL[case.precision]
        check_out(out32, out64, TOL["fp32"], n_real, prev_held=prev32, ref_prev_held=prev64, thr=thr,
                  what=f"step {step}: fp32 reference vs float64")
        check_out(out, out64, tol, n_real, prev_held=prev, ref_prev_held=prev64, thr=thr,
                  what=f"step {step}: kernel vs float64")
        check_out(out, out32, tol, n_real, prev_held=prev, ref_prev_held=prev32, thr=thr,
                  what=f"step {step}: kernel vs fp32 reference")
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
            # stream mode == torch.nn.LSTM over the instrument's whole history from zero state
            logits = []
            for s in slots_l[:n_real]:
                x = features_reference(torch.stack(history[s]).to(dev, torch.float64), p64.mean, p64.inv_std)
                seq, _ = lstm64(x[None])
                logits.append(seq[0, -1] @ p64.head_weight.t() + p64.head_bias)
            rec = torch.stack(logits)
            err = rel_err(out[:n_real, COL_LOGITS:COL_LOGITS + 3], rec)
            assert err <= tol, f"step {step}: kernel vs nn.LSTM rel err {err:.3g} > {tol:g}"
            assert rel_err(out64[:n_real, COL_LOGITS:COL_LOGITS + 3], rec) <= 1e-10
    assert ws.sync[0].item() == 0, "barrier counter must be back at zero after a launch"
