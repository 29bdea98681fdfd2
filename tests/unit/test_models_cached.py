"""The feature-caching MLP executor gives the reference executor's scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hft_infer.models import build_model, preset
from hft_infer.models.cached import MlpCachedExecutor
from hft_infer.models.executor import MlpWindowExecutor, build_executor


def _ring(n_slots, depth, f):
    return torch.zeros(n_slots + 1, depth, f)


@pytest.mark.parametrize("conflating", [True, False])
def test_cached_equals_reference_over_interleaved_streams(conflating):
    torch.manual_seed(0)
    spec = preset("mlp_small")
    model = build_model(spec, seed=3)
    model.set_normalisation(torch.randn(spec.features) * 0.1, torch.rand(spec.features) + 0.5)
    n_slots, depth = 6, spec.window + 40
    ring = _ring(n_slots, depth, spec.features)
    ref = MlpWindowExecutor(model, ring, 8)
    fast = MlpCachedExecutor(model, ring, 8)
    rng = np.random.default_rng(1)
    count = [0] * (n_slots + 1)
    compared = 0
    for step in range(150):
        # write 1..4 rows to random slots (conflation: several rows between steps)
        for _ in range(rng.integers(1, 5)):
            s = int(rng.integers(0, n_slots))
            row = torch.from_numpy((100 + rng.normal(0, 0.1, spec.features)).astype(np.float32))
            row[1::4] = torch.from_numpy(rng.integers(1, 300, row[1::4].shape[0]).astype(np.float32))
            ring[s, count[s] % depth] = row
            count[s] += 1
            if not conflating:
                break
        live = [s for s in range(n_slots) if count[s] > 0]
        pick = rng.permutation(live)[: rng.integers(1, len(live) + 1)]
        b = 8
        slots = torch.full((b,), n_slots, dtype=torch.int64)  # padded with the sink
        pos = torch.zeros(b, dtype=torch.int64)
        slots[: len(pick)] = torch.from_numpy(pick.astype(np.int64))
        pos[: len(pick)] = torch.tensor([count[s] - 1 for s in pick])
        a, c = torch.empty(b), torch.empty(b)
        ref.step(slots, pos, a)
        fast.step(slots, pos, c)
        n = len(pick)
        assert torch.allclose(a[:n], c[:n], atol=1e-5, rtol=0), (step, (a[:n] - c[:n]).abs().max())
        compared += n
    assert compared > 300


def test_build_executor_uses_the_cached_mlp_and_reset_clears_the_cache():
    spec = preset("mlp_small")
    model = build_model(spec, seed=1)
    ring = _ring(2, spec.window, spec.features)
    ex = build_executor(model, ring, max_batch=4)
    assert isinstance(ex, MlpCachedExecutor)
    ring[0, 0] = 100.0
    out = torch.empty(1)
    ex.step(torch.tensor([0]), torch.tensor([0]), out)
    assert ex.upto[0] == 1
    ex.reset()
    assert ex.upto[0] == 0
