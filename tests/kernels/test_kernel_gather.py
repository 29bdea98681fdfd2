"""The window gather in front of a custom module on the GPU (kernels/gather.py), and the graph
engine's step for custom modules (runner/torch_step.py) against the CPU engine.

On a machine without CUDA both run on the CPU under Triton's interpreter (conftest.py); the
CUDA graph capture itself is tests/integration/test_gpu_custom_model.py's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hft_infer.features import FeatureStore
from hft_infer.kernels.gather import gather_window, gather_window_reference
from hft_infer.models.custom import CustomExecutor, load_custom
from hft_infer.models.decision import DecisionPolicy
from hft_infer.runner.base import Engine
from hft_infer.runner.eager import EagerEngine
from hft_infer.runner.self_check import check_stream, compare, drive

ROOT = Path(__file__).resolve().parents[2]
CNN = f"{ROOT}/tests/user_models/cnn.py:make_model"


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("window,width,rows", [(1, 10, 3), (5, 42, 7), (32, 42, 40), (7, 13, 7)])
def test_gather_matches_the_reference(window, width, rows):
    dev = _device()
    gen = torch.Generator().manual_seed(window * 100 + width)
    ring = torch.randn(6, rows, width, generator=gen).to(dev)
    # positions before a full window, far past it (ring wrap), the sink slot repeated
    slots = torch.tensor([0, 5, 2, 5, 3], dtype=torch.int64, device=dev)
    positions = torch.tensor([0, window - 2, 3 * rows + 1, 0, window + 4], dtype=torch.int64, device=dev).clamp(min=0)
    out = torch.full((5, window, width), float("nan"), device=dev)
    slots_out = torch.full((5,), -1, dtype=torch.int64, device=dev)
    positions_out = torch.full((6,), -1, dtype=torch.int64, device=dev)  # longer than the batch: [:n] written
    gather_window(ring, slots, positions, out, slots_out, positions_out)
    torch.testing.assert_close(out, gather_window_reference(ring, slots, positions, window), rtol=0, atol=0)
    assert slots_out.tolist() == slots.tolist()
    assert positions_out.tolist() == positions.tolist() + [-1]


def test_gather_refuses_shapes_that_do_not_agree():
    ring = torch.zeros(3, 8, 10)
    with pytest.raises(ValueError, match="do not agree"):
        gather_window(ring, torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64),
                      torch.zeros(2, 4, 11), torch.zeros(2, dtype=torch.int64))


class _LaunchedEngine(Engine):
    """The graph engine's buffers and step without the graphs: TorchStep.launch on each batch
    (what a captured graph replays), usable on the CPU."""

    name = "launched"

    def __init__(self, kstep, buckets, sink_slot):
        super().__init__(buckets, sink_slot, stateful=False, reason="test")
        self.kstep = kstep
        self._out = torch.zeros(self.max_batch, 5)

    def _launch(self, i, n):
        b = self.pad(i, n)
        self.kstep.launch(torch.from_numpy(self._slots[i][:b]), torch.from_numpy(self._positions[i][:b]),
                          self._out[:b])
        self._scores[i][:n] = self._out[:n, 0].numpy()
        self._actions[i][:n] = self._out[:n, 1].numpy()

    def reset(self):
        self.kstep.reset()

    def reset_slots(self, slots):
        self.kstep.reset_slots(slots)


def test_torch_step_agrees_with_the_cpu_engine():
    from hft_infer.runner.torch_step import TorchStep

    model, _ = load_custom(CNN, window=32, levels=10)
    n_slots, buckets = 12, [1, 2, 4, 8]
    ref_store = FeatureStore(n_slots, 10, 40)
    ref = EagerEngine(CustomExecutor(model, ref_store.tensor, 8), DecisionPolicy(0.05, 0.02, n_slots + 1, 8),
                      buckets, ref_store.sink_slot, reason="reference")
    store = FeatureStore(n_slots, 10, 40)
    kstep = TorchStep(model, ring_h=store.tensor, max_batch=8, precision="fp32", threshold=0.05, hysteresis=0.02,
                      device=_device())
    engine = _LaunchedEngine(kstep, buckets, store.sink_slot)
    worst = compare(engine, store, ref, ref_store, n_slots=n_slots, precision="fp32")
    assert worst < 1e-5
    # actions too (held positions on the step's device), and the original model stays on the CPU
    data, slots, batches = check_stream(store.width, n_slots, 8)
    want_s, _ = drive(ref, ref_store, data, slots, batches)
    threshold = float(np.median(np.abs(want_s)))  # a threshold inside the scores' range: every action occurs
    ref.policy.threshold = threshold
    kstep.thresholds[0] = threshold
    ref.reset()
    engine.reset()
    want_s, want_a = drive(ref, ref_store, data, slots, batches)
    got_s, got_a = drive(engine, store, data, slots, batches)
    np.testing.assert_allclose(got_s, want_s, atol=1e-5, rtol=0)
    assert (got_a == want_a).all() and len(set(want_a.tolist())) >= 2
    assert next(model.parameters()).device.type == "cpu"


def test_torch_step_refuses_bf16():
    from hft_infer.runner.torch_step import TorchStep

    model, _ = load_custom(CNN, window=32, levels=10)
    with pytest.raises(ValueError, match="bf16"):
        TorchStep(model, ring_h=torch.zeros(3, 32, 42), max_batch=4, precision="bf16", threshold=0.2,
                  hysteresis=0.0, device="cpu")
