"""Persistent engine (kernel spinning on pinned-memory flags) against the window-LSTM
launch and the float64 reference.

CPU: the interpreter runs the kernel to its end, so each request is posted with the
stop flag already raised: the kernel serves it and exits. CUDA: a child process runs
the engine for many requests while the host spins on the done flag (a hung kernel
must not hang the test run: the child has a timeout and takes its GPU context along).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib

import pytest
import torch
from kernels_testlib import TOL, make_lstm, make_rows, rel_err, require_device

from hft_infer.kernels.common import COL_LOGITS, OUT_COLS
from hft_infer.kernels.engine import LstmWindowEngine
from hft_infer.kernels.lstm import prepare_lstm_weights
from hft_infer.kernels.lstm_window import (
    alloc_window_state,
    alloc_window_workspace,
    lstm_window_reference,
    lstm_window_step,
)


@pytest.mark.parametrize("device", [pytest.param("cpu", id="cpu")])
def test_engine_serves_requests_like_the_launch(device):
    dev = require_device(device)
    gen = torch.Generator().manual_seed(3)
    params, _ = make_lstm(2, 12, 2, gen)
    window, n_slots = 4, 5
    w = prepare_lstm_weights(params, device=dev, block_h=16)  # one program: the interpreter cannot spin
    ws = alloc_window_workspace(w, 4, window, max_programs=1)
    h, c = alloc_window_state(w, n_slots, window)
    held = torch.zeros(n_slots, dtype=torch.int32)
    thr = torch.tensor([0.125, 0.0625])
    ring = torch.zeros(n_slots, window + 1, 10)
    eng = LstmWindowEngine(w, ws, h, c, thr, held, max_batch=4, ring=ring)
    # the same steps through lstm_window_step, and through the float64 reference
    ws_l = alloc_window_workspace(w, 4, window, max_programs=1)
    h_l, c_l = alloc_window_state(w, n_slots, window)
    held_l = held.clone()
    p64 = params.to(torch.float64)
    h64, c64 = h.double(), c.double()
    held64 = held.clone()
    nxt = [0] * (n_slots - 1)
    for step, slots_l in enumerate([[0, 2, 3], [1], [3, 0], [2, 1, 0, 3], [0]]):
        n = len(slots_l)
        rows = make_rows(n, 2, gen)
        slots = torch.tensor(slots_l, dtype=torch.int32)
        pos = torch.tensor([nxt[s] for s in slots_l], dtype=torch.int32)
        for s in slots_l:
            nxt[s] += 1
        eng.rows[:n], eng.slots[:n], eng.positions[:n] = rows, slots, pos
        eng.out.fill_(float("nan"))
        eng.submit(n)
        eng.ctrl[2] = 1  # stop once served: the interpreter returns from start() only at the end
        eng.start()
        out = eng.wait(timeout_s=1.0).clone()
        eng.ctrl[2] = 0
        ref = torch.full((n, OUT_COLS), float("nan"))
        lstm_window_step(w, ws_l, h_l, c_l, rows, slots, pos, thr, held_l, ref, persistent=False)
        out64 = lstm_window_reference(p64, h64, c64, rows, slots, pos, thr.double(), held64,
                                      torch.empty(n, OUT_COLS, dtype=torch.float64))
        # same kernel code, same inputs: bit-identical to the launched step
        assert torch.equal(out, ref), f"step {step}"
        assert torch.equal(h, h_l) and torch.equal(c, c_l) and torch.equal(held, held_l)
        assert rel_err(out[:, COL_LOGITS:COL_LOGITS + 3], out64[:, COL_LOGITS:]) <= TOL["fp32"]
        assert eng.ctrl.tolist()[:2] == [step + 1, step + 1]
    assert ws.sync[0].item() == 0


def _gpu_child(precision: str) -> None:
    """Runs in its own process: the engine on the GPU, float64 reference on the CPU (no
    GPU work besides the engine while it runs: nothing may wait on it)."""
    import time

    import numpy as np

    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(zlib.crc32(precision.encode()))
    levels, hidden, layers, window, n_inst = 10, 128, 2, 50, 64
    params, _ = make_lstm(levels, hidden, layers, gen)
    w = prepare_lstm_weights(params, precision=precision, device=dev)
    max_batch = 64
    # 32 programs: the engine leaves most SMs free
    ws = alloc_window_workspace(w, max_batch + 1, window, max_programs=w.n_blocks)
    h, c = alloc_window_state(w, n_inst + 1, window)
    held = torch.zeros(n_inst + 1, dtype=torch.int32, device=dev)
    thr = torch.tensor([0.125, 0.0625], device=dev)
    eng = LstmWindowEngine(w, ws, h, c, thr, held, max_batch=max_batch)
    eng.precompile()
    p64 = params.to(torch.float64)
    h64 = torch.zeros(n_inst + 1, layers, window, hidden, dtype=torch.float64)
    c64 = torch.zeros_like(h64)
    held64 = torch.zeros(n_inst + 1, dtype=torch.int32)
    thr64 = torch.tensor([0.125, 0.0625], dtype=torch.float64)
    rnd = np.random.default_rng(0)
    nxt = np.zeros(n_inst, dtype=np.int64)
    worst, lat = 0.0, []
    eng.start()
    try:
        for step in range(120):
            n = [1, 8, 64, 5][step % 4]
            slots_l = rnd.choice(n_inst, size=n, replace=False)
            rows = make_rows(n, levels, gen)
            pos = torch.tensor(nxt[slots_l], dtype=torch.int32)
            nxt[slots_l] += 1
            eng.rows[:n] = rows
            eng.slots[:n] = torch.tensor(slots_l, dtype=torch.int32)
            eng.positions[:n] = pos
            t0 = time.perf_counter_ns()
            eng.submit(n)
            out = eng.wait(timeout_s=5.0)
            lat.append(time.perf_counter_ns() - t0)
            out64 = lstm_window_reference(p64, h64, c64, rows, torch.tensor(slots_l), pos, thr64, held64,
                                          torch.empty(n, OUT_COLS, dtype=torch.float64))
            err = rel_err(out[:, COL_LOGITS:COL_LOGITS + 3].clone(), out64[:, COL_LOGITS:])
            worst = max(worst, err)
            assert err <= TOL[precision], f"step {step}: engine vs float64 {err:.3g}"
    finally:
        eng.stop(timeout_s=5.0)
    torch.cuda.synchronize()
    assert rel_err(h[:n_inst].cpu(), h64[:n_inst]) <= TOL[precision]
    assert ws.sync[0].item() == 0
    us = np.array(lat[20:]) / 1e3
    print(json.dumps({"precision": precision, "worst_rel_err": worst, "p50_us": float(np.percentile(us, 50)),
                      "p99_us": float(np.percentile(us, 99)), "max_us": float(us.max())}))


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_engine_on_gpu(precision):
    require_device("cuda")
    env = dict(os.environ)
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), precision], capture_output=True, text=True,
                              timeout=150, env=env, cwd=os.path.dirname(os.path.abspath(__file__)))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"engine child timed out (hung kernel?): {e.stdout!s:.2000} {e.stderr!s:.2000}")
    print(proc.stdout)
    assert proc.returncode == 0, f"engine child failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


if __name__ == "__main__":
    try:
        _gpu_child(sys.argv[1])
    except BaseException:  # noqa: BLE001 - report, then leave without atexit work that could wait on the GPU
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
