"""The graph engine's step (runner/gpu.py `KernelStep.launch`: the gather node, then the model
kernel on device buffers) against the CPU engine, for every built-in family and mode.

`KernelStep.launch` is what each captured CUDA graph replays; here it runs launched (no
graph), on the CPU under Triton's interpreter without CUDA (conftest.py), compiled on a GPU.
The capture itself is tests/integration/test_gpu_engines.py's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hft_infer.features import FeatureStore
from hft_infer.models import build_model
from hft_infer.models.build import build_executor
from hft_infer.models.decision import DecisionPolicy
from hft_infer.models.spec import ModelSpec
from hft_infer.runner.base import Engine
from hft_infer.runner.eager import EagerEngine
from hft_infer.runner.gpu import KernelStep
from hft_infer.runner.self_check import check_stream, drive

LEVELS, N_SLOTS, DEPTH, MAX_BATCH = 2, 6, 12, 4


class _LaunchedEngine(Engine):
    """A graph engine's buffers and step without the graphs: KernelStep.launch per batch."""

    name = "launched"

    def __init__(self, kstep: KernelStep, sink_slot: int, *, stage_inputs: bool):
        super().__init__([1, 2, 4], sink_slot, stateful=kstep.stateful, reason="test")
        self.kstep = kstep
        kstep.alloc_launched(self.max_batch, stage_inputs=stage_inputs)
        self._out = torch.zeros(self.max_batch, 5, device=kstep.device)

    def _launch(self, i, n):
        b = self.pad(i, n)
        dev = self.kstep.device
        slots, positions = (torch.from_numpy(a[:b]).to(dev) for a in (self._slots[i], self._positions[i]))
        self.kstep.launch(slots, positions, self._out[:b])
        out = self._out[:n].cpu()
        self._scores[i][:n] = out[:, 0].numpy()
        self._actions[i][:n] = out[:, 1].numpy()

    def reset(self):
        self.kstep.reset()

    def reset_slots(self, slots):
        self.kstep.reset_slots(slots)


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("kind,mode,stage", [("mlp", "window", True), ("lstm", "window", True),
                                             ("lstm", "stream", True), ("mlp", "window", False)])
def test_kernel_step_agrees_with_the_cpu_engine(kind, mode, stage):
    spec = ModelSpec(name=f"tiny_{kind}", kind=kind, levels=LEVELS, window=4,
                     hidden=(24, 12) if kind == "mlp" else (8, 8))
    model = build_model(spec, seed=3)
    thr, hyst = 0.05, 0.02
    ref_store = FeatureStore(N_SLOTS, LEVELS, DEPTH)
    ref = EagerEngine(build_executor(model, ref_store.tensor, max_batch=MAX_BATCH, mode=mode),
                      DecisionPolicy(thr, hyst, N_SLOTS + 1, MAX_BATCH), [1, 2, 4], ref_store.sink_slot,
                      reason="reference")
    store = FeatureStore(N_SLOTS, LEVELS, DEPTH)
    kstep = KernelStep(model, mode=mode, window_method="incremental", ring_h=store.tensor, max_batch=MAX_BATCH,
                       precision="fp32", threshold=thr, hysteresis=hyst, device=_device())
    engine = _LaunchedEngine(kstep, store.sink_slot, stage_inputs=stage)
    data, slots, batches = check_stream(store.width, N_SLOTS, MAX_BATCH, rows=60)
    want_s, _ = drive(ref, ref_store, data, slots, batches)
    # a threshold inside the scores' range, so that every action occurs and the held positions matter
    threshold = float(np.median(np.abs(want_s)))
    ref.policy.threshold = threshold
    kstep.thresholds[0] = threshold
    ref.reset()
    want_s, want_a = drive(ref, ref_store, data, slots, batches)
    got_s, got_a = drive(engine, store, data, slots, batches)
    np.testing.assert_allclose(got_s, want_s, atol=1e-5, rtol=0)
    assert (got_a == want_a).all() and len(set(want_a.tolist())) >= 2
