"""The start-up self-check (runner/self_check.py) on CPU engines: the function the GPU path
runs, fed an engine that agrees (the same model) and one that does not (other weights)."""

from __future__ import annotations

import numpy as np
import pytest

from hft_infer.config import load_config
from hft_infer.runner.base import EngineFailure
from hft_infer.runner.select import build_runtime
from hft_infer.runner.self_check import SPEED_MARGIN, check_stream, compare, time_stream, too_slow

N = 8


def _eager(seed: int, preset: str = "mlp_small", mode: str = "window"):
    cfg = load_config(None, ['model.checkpoint=""', f'model.preset="{preset}"', f'model.mode="{mode}"',
                             f"model.seed={seed}", 'runner.engine="eager"', 'runner.device="cpu"',
                             "runner.buckets=[1, 2, 4, 8]", "scheduler.max_batch=8", f"universe.instruments={N}"])
    return build_runtime(cfg, N)


def test_the_check_stream_varies_batch_sizes_with_distinct_slots():
    data, slots, batches = check_stream(42, N, 8)
    assert sum(batches) == len(slots) == len(data) and {1, 2, 4, 8} <= set(batches)  # (the last may be cut)
    i = 0
    for b in batches:
        assert len(set(slots[i:i + b].tolist())) == b  # distinct slots within a batch
        i += b
    assert np.isfinite(data).all() and (data[:, 1::4] >= 1).all()


@pytest.mark.parametrize("preset, mode", [("mlp_small", "window"), ("lstm_a", "stream")])
def test_an_engine_that_agrees_passes_and_leaves_the_rows_zeroed(preset, mode):
    a, b = _eager(3, preset, mode), _eager(3, preset, mode)
    worst = compare(a.engine, a.store, b.engine, b.store, n_slots=N, precision="fp32")
    assert worst <= 1e-6
    assert not a.store.array.any() and a.store.count == [0] * (N + 1)


def test_an_engine_that_computes_something_else_is_refused_with_the_figures():
    a, b = _eager(3), _eager(4)  # other weights: other scores
    with pytest.raises(EngineFailure, match=r"self-check failed: \d+ of 300 scores differ .* first at row 0"):
        compare(a.engine, a.store, b.engine, b.store, n_slots=N, precision="bf16")


def test_the_stream_is_timed_through_both_engines_and_the_rows_left_zeroed():
    a, b = _eager(3), _eager(3)
    engine_s, cpu_s = time_stream(a.engine, a.store, b.engine, b.store, n_slots=N)
    assert engine_s > 0 and cpu_s > 0
    assert not a.store.array.any() and not b.store.array.any() and a.store.count == [0] * (N + 1)


def test_auto_refuses_a_device_engine_slower_than_the_margin_and_says_by_how_much():
    assert too_slow("graph", 0.010, 0.006) is None  # within SPEED_MARGIN: the device engine serves
    why = too_slow("graph", 0.840, 0.006)
    assert why is not None and "graph is slower than the CPU engine" in why and "840.00 ms" in why
    assert "6.00 ms" in why and f"{SPEED_MARGIN:g}x" in why
