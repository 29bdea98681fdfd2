"""Launchers are safe to capture in a CUDA graph: no allocation, no host sync (capture would
fail), no data-dependent host control flow (replays with new inputs give the eager results)."""

from __future__ import annotations

import pytest
import torch
from kernels_testlib import make_lstm, make_mlp, make_rows, require_device

from hft_infer.kernels.common import OUT_COLS
from hft_infer.kernels.lstm import prepare_lstm_weights
from hft_infer.kernels.lstm_stream import alloc_stream_state, alloc_stream_workspace, lstm_stream_step
from hft_infer.kernels.lstm_window import alloc_window_state, alloc_window_workspace, lstm_window_step
from hft_infer.kernels.mlp import alloc_mlp_workspace, mlp_step, prepare_mlp_weights

LEVELS, WINDOW, N_INST, BATCH, STEPS = 10, 50, 16, 8, 12


def _setup(kind: str, precision: str, persistent: bool, dev: torch.device, gen: torch.Generator):
    """A step function over static buffers plus the state tensors it mutates."""
    f = 4 * LEVELS + 2
    n_slots = N_INST + 1
    if kind == "mlp":
        params = make_mlp(LEVELS, 32, (128, 64), gen)
        w = prepare_mlp_weights(params, precision=precision, device=dev)
        ws = alloc_mlp_workspace(w, BATCH)
        ring = torch.zeros(n_slots, 40, f, device=dev)
        state = [ring]
        run = lambda b, held, out: mlp_step(w, ws, ring, b["slots"], b["positions"], b["thr"], held, out,  # noqa: E731
                                            rows=b["rows"])
    else:
        hidden, layers = 128, 2
        params, _ = make_lstm(LEVELS, hidden, layers, gen)
        w = prepare_lstm_weights(params, precision=precision, device=dev)
        if kind == "lstm_window":
            ws = alloc_window_workspace(w, BATCH, WINDOW)
            h, c = alloc_window_state(w, n_slots, WINDOW)
            run = lambda b, held, out: lstm_window_step(  # noqa: E731
                w, ws, h, c, b["rows"], b["slots"], b["positions"], b["thr"], held, out, persistent=persistent)
        else:
            ws = alloc_stream_workspace(w, BATCH)
            h, c = alloc_stream_state(w, n_slots)
            run = lambda b, held, out: lstm_stream_step(  # noqa: E731
                w, ws, h, c, b["rows"], b["slots"], b["thr"], held, out, persistent=persistent)
        state = [h, c]
    return run, state


@pytest.mark.gpu
@pytest.mark.parametrize("kind,persistent", [("mlp", True), ("lstm_window", True), ("lstm_window", False),
                                             ("lstm_stream", True), ("lstm_stream", False)])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_graph_replay_equals_eager(kind, persistent, precision):
    dev = require_device("cuda")
    gen = torch.Generator().manual_seed(5)
    f = 4 * LEVELS + 2
    eager_run, eager_state = _setup(kind, precision, persistent, dev, torch.Generator().manual_seed(1))
    graph_run, graph_state = _setup(kind, precision, persistent, dev, torch.Generator().manual_seed(1))
    static = {"rows": torch.zeros(BATCH, f, device=dev), "slots": torch.zeros(BATCH, dtype=torch.int32, device=dev),
              "positions": torch.zeros(BATCH, dtype=torch.int64, device=dev),
              "thr": torch.tensor([0.125, 0.0625], device=dev)}
    held_e = torch.zeros(N_INST + 1, dtype=torch.int32, device=dev)
    held_g = held_e.clone()
    out_g = torch.zeros(BATCH, OUT_COLS, device=dev)
    # Warm up (compiles) on throwaway state, then capture on the real one.
    warm_run, _ = _setup(kind, precision, persistent, dev, torch.Generator().manual_seed(2))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        warm_run(static, held_e.clone(), out_g)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_run(static, held_g, out_g)
    nxt = [0] * N_INST
    for step in range(STEPS):
        slots = torch.randperm(N_INST, generator=gen)[:BATCH]
        pos = torch.tensor([nxt[s] for s in slots.tolist()])
        for s_ in slots.tolist():
            nxt[s_] += 1
        batch = {"rows": make_rows(BATCH, LEVELS, gen).to(dev), "slots": slots.int().to(dev),
                 "positions": pos.to(dev), "thr": static["thr"]}
        out_e = torch.full((BATCH, OUT_COLS), float("nan"), device=dev)
        eager_run(batch, held_e, out_e)
        for k in ("rows", "slots", "positions"):
            static[k].copy_(batch[k])
        out_g.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        # same kernels, same inputs, fixed reduction orders: bit-identical
        assert torch.equal(out_g, out_e), f"step {step}: graph replay differs from eager"
        assert torch.equal(held_g, held_e)
        for a, b in zip(graph_state, eager_state):
            assert torch.equal(a, b), f"step {step}: state differs"
