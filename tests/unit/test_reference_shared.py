"""The row transform, score and decision policy are defined once (kernels/reference.py): the CPU
models, the CPU engine's numpy tail and the Triton kernels' torch references all compute them
through it. These checks tie each user to the definition."""

from __future__ import annotations

import numpy as np
import torch

from hft_infer.kernels import reference
from hft_infer.kernels.common import COL_ACTION, COL_SCORE, OUT_COLS, decide_reference, features_reference
from hft_infer.models.base import scores_into
from hft_infer.models.cached import scores_np
from hft_infer.models.checkpoint import load_model
from hft_infer.models.decision import DecisionPolicy


def _raw_rows(n: int, levels: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = rng.uniform(0.0, 200.0, size=(n, 4 * levels + 2)).astype(np.float32)
    raw[::7, 0] = 0.0  # no bid: mid not positive for some rows
    raw[:, -1] *= rng.choice([-1.0, 1.0], size=n)  # signed trade size
    return raw


def test_model_features_and_kernel_reference_are_the_same_transform():
    model, _ = load_model("", preset="mlp_small", seed=3)
    raw = torch.from_numpy(_raw_rows(64, model.spec.levels))
    with torch.inference_mode():
        ours = model.features(raw)
        kern = features_reference(raw, model.norm_mean, model.norm_inv_std)
    assert torch.equal(ours, kern)
    np_feat = reference.features(raw.numpy(), model.norm_mean.numpy(), model.norm_inv_std.numpy())
    np.testing.assert_allclose(np_feat, ours.numpy(), rtol=2e-6, atol=2e-6)  # numpy vs torch libm


def test_every_score_implementation_matches_the_definition():
    logits = torch.randn(50, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float32) * 4
    want = reference.scores(logits.double()).numpy()
    got_np = np.empty(50, np.float32)
    scores_np(logits.numpy(), got_np)
    got_t = torch.empty(50, dtype=torch.float32)
    scores_into(logits.clone(), got_t, torch.empty(50, 1))
    for got in (got_np, got_t.numpy()):
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-7)


def test_decision_policy_and_kernel_reference_agree_on_every_rule():
    # scores on both sides of threshold and threshold - hysteresis, from each held state
    thr, hyst = 0.25, 0.125
    scores = np.array([0.5, 0.25, 0.2, 0.125, 0.0, -0.125, -0.2, -0.25, -0.5] * 3, np.float32)
    held = np.repeat(np.array([-1, 0, 1], np.int8), 9)
    slots = np.arange(scores.size)
    policy = DecisionPolicy(thr, hyst, n_slots=scores.size, max_batch=scores.size)
    policy._held_np[:] = held
    actions = np.empty(scores.size, np.int64)
    policy.apply_numpy(slots, scores, actions)
    # the kernels' reference, from logits whose score is s: (0, -inf, log((1+s)/(1-s)))
    held_t = torch.from_numpy(held.astype(np.int32))
    out = torch.empty(scores.size, OUT_COLS)
    logits = torch.zeros(scores.size, 3, dtype=torch.float64)
    s64 = torch.from_numpy(scores.astype(np.float64))
    logits[:, 2] = torch.log1p(s64) - torch.log1p(-s64)
    logits[:, 1] = -1e9
    decide_reference(logits, torch.tensor([thr, hyst], dtype=torch.float64), held_t, torch.from_numpy(slots), out)
    assert out[:, COL_SCORE].numpy() == pytest_approx(scores)
    assert out[:, COL_ACTION].numpy().astype(np.int64).tolist() == actions.tolist()
    assert held_t.numpy().tolist() == policy._held_np.tolist()
    # the rule itself, spelled out: fresh signals win, holds keep inside the band
    assert actions.reshape(3, 9).tolist() == [[1, 0, 0, 0, 0, -1, -1, -1, -1],
                                              [1, 0, 0, 0, 0, 0, 0, 0, -1],
                                              [1, 1, 1, 1, 0, 0, 0, 0, -1]]


def pytest_approx(x):
    import pytest

    return pytest.approx(x, abs=1e-6)
