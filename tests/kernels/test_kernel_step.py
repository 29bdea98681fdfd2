"""The graph engine's step against the CPU engine: the staging (runner/staging.py: the host
gather of each entry's rows, then the one upload) and `launch` of `KernelStep` (the fused
kernels of every built-in family and mode) and `TorchStep` (a custom module), which is what
each captured CUDA graph replays.

Here they run launched (no graph): on the CPU under Triton's interpreter without CUDA
(conftest.py), compiled on a GPU. The capture itself is tests/integration/test_gpu_engines.py's
and test_gpu_custom_model.py's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from kernels_testlib import LaunchedEngine

from hft_infer.features import FeatureStore
from hft_infer.models import build_model
from hft_infer.models.build import build_executor
from hft_infer.models.custom import CustomExecutor, load_custom
from hft_infer.models.decision import DecisionPolicy
from hft_infer.models.spec import ModelSpec
from hft_infer.runner.eager import EagerEngine
from hft_infer.runner.gpu import KernelStep
from hft_infer.runner.self_check import check_stream, compare, drive
from hft_infer.runner.staging import StepStaging

ROOT = Path(__file__).resolve().parents[2]
CNN = f"{ROOT}/tests/user_models/cnn.py:make_model"
BUCKETS = [1, 2, 4]


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("rows_per_entry", [1, 5])
def test_staging_gathers_each_entrys_rows_and_uploads_them(rows_per_entry):
    """The window semantics of models/executor.py: rows t-G+1..t of the slot, oldest first, ring
    wrap-around, zero rows before position 0; the upload carries slots, positions and rows."""
    gen = torch.Generator().manual_seed(rows_per_entry)
    ring = torch.randn(4, 7, 6, generator=gen)
    st = StepStaging(ring, max_batch=4, rows_per_entry=rows_per_entry, n_buffers=2, device=torch.device(_device()))
    slots, positions = np.array([2, 0, 3]), np.array([1, 9, 30])  # before a full window, wrapped twice, 4x
    st.slots[1][:3], st.positions[1][:3] = slots, positions
    st.rows[1][:] = np.nan  # poison: every row read must be written
    st.gather(1, 3)
    for b, (s, p) in enumerate(zip(slots, positions)):
        for w in range(rows_per_entry):
            q = p - rows_per_entry + 1 + w
            want = ring[s, q % 7].numpy() if q >= 0 else np.zeros(6, dtype=np.float32)
            np.testing.assert_array_equal(st.rows[1][b, w], want)
    assert np.isnan(st.rows[1][3]).all() and not np.isnan(st.rows[0]).any()  # only [:b] of buffer i
    sl, po, rows = st.upload(1, 3)
    assert sl.tolist() == slots.tolist() and po.tolist() == positions.tolist()
    np.testing.assert_array_equal(rows.cpu().numpy(), st.rows[1][:3])


def test_staging_refuses_a_window_longer_than_the_ring():
    with pytest.raises(ValueError, match="do not fit"):
        StepStaging(torch.zeros(3, 8, 10), max_batch=2, rows_per_entry=9, n_buffers=1, device=torch.device("cpu"))


def _agree(ref, ref_store, engine, store, kstep, n_slots, max_batch, rows=60):
    """Scores and actions of the check stream, with a threshold inside the scores' range so that
    every action occurs and the held positions matter."""
    data, slots, batches = check_stream(store.width, n_slots, max_batch, rows=rows)
    want_s, _ = drive(ref, ref_store, data, slots, batches)
    threshold = float(np.median(np.abs(want_s)))
    ref.policy.threshold = threshold
    kstep.thresholds[0] = threshold
    ref.reset()
    engine.reset()
    want_s, want_a = drive(ref, ref_store, data, slots, batches)
    got_s, got_a = drive(engine, store, data, slots, batches)
    np.testing.assert_allclose(got_s, want_s, atol=1e-5, rtol=0)
    assert (got_a == want_a).all() and len(set(want_a.tolist())) >= 2


@pytest.mark.parametrize("kind,mode", [("mlp", "window"), ("lstm", "window"), ("lstm", "stream")])
def test_kernel_step_agrees_with_the_cpu_engine(kind, mode):
    levels, n_slots, depth, max_batch = 2, 6, 12, 4
    spec = ModelSpec(name=f"tiny_{kind}", kind=kind, levels=levels, window=4,
                     hidden=(24, 12) if kind == "mlp" else (8, 8))
    model = build_model(spec, seed=3)
    ref_store = FeatureStore(n_slots, levels, depth)
    ref = EagerEngine(build_executor(model, ref_store.tensor, max_batch=max_batch, mode=mode),
                      DecisionPolicy(0.05, 0.02, n_slots + 1, max_batch), BUCKETS, ref_store.sink_slot,
                      reason="reference")
    store = FeatureStore(n_slots, levels, depth)
    kstep = KernelStep(model, mode=mode, window_method="incremental", ring_h=store.tensor, max_batch=max_batch,
                       precision="fp32", threshold=0.05, hysteresis=0.02, device=_device())
    engine = LaunchedEngine(kstep, BUCKETS, store.sink_slot)
    _agree(ref, ref_store, engine, store, kstep, n_slots, max_batch)


def test_lstm_step_cut_per_batch_size_agrees_with_the_cpu_engine():
    """Window states enough for every cut of `phased_geometry` (48, 192 and 1,536 rows at batch
    1, 4 and 32): the weights packed for each block_h it uses, against the CPU engine."""
    from hft_infer.kernels.lstm import phased_geometry

    levels, n_slots, depth, max_batch, buckets = 2, 40, 8, 32, [1, 4, 32]
    spec = ModelSpec(name="tiny_lstm_wide", kind="lstm", levels=levels, window=48, hidden=(32, 32))
    model = build_model(spec, seed=5)
    ref_store = FeatureStore(n_slots, levels, depth)
    ref = EagerEngine(build_executor(model, ref_store.tensor, max_batch=max_batch, mode="window"),
                      DecisionPolicy(0.05, 0.02, n_slots + 1, max_batch), buckets, ref_store.sink_slot,
                      reason="reference")
    store = FeatureStore(n_slots, levels, depth)
    kstep = KernelStep(model, mode="window", window_method="incremental", ring_h=store.tensor, max_batch=max_batch,
                       precision="fp32", threshold=0.05, hysteresis=0.02, device=_device())
    engine = LaunchedEngine(kstep, buckets, store.sink_slot)
    cuts = {phased_geometry(b * spec.window, "fp32", 32) for b in buckets}
    assert len(cuts) == 3 and sorted(kstep._launched) == [4, 16]
    _agree(ref, ref_store, engine, store, kstep, n_slots, max_batch, rows=120)


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
    engine = LaunchedEngine(kstep, buckets, store.sink_slot)
    worst = compare(engine, store, ref, ref_store, n_slots=n_slots, precision="fp32")
    assert worst < 1e-5
    _agree(ref, ref_store, engine, store, kstep, n_slots, 8, rows=300)
    assert next(model.parameters()).device.type == "cpu"  # the CPU engine of the self-check keeps the original


def test_torch_step_refuses_bf16():
    from hft_infer.runner.torch_step import TorchStep

    model, _ = load_custom(CNN, window=32, levels=10)
    with pytest.raises(ValueError, match="bf16"):
        TorchStep(model, ring_h=torch.zeros(3, 32, 42), max_batch=4, precision="bf16", threshold=0.2,
                  hysteresis=0.0, device="cpu")
