"""Model specs, presets and the modules built from them."""

from __future__ import annotations

import msgspec
import pytest
import torch

from hft_infer.models import PRESETS, ModelSpec, build_model, preset
from hft_infer.models.features import preprocess


def n_params(spec: ModelSpec) -> int:
    """Parameter count from the spec alone (nn.LSTM: 4H x (in + H) weights + 2 x 4H biases)."""
    f, h = spec.features, spec.hidden
    if spec.kind == "lstm":
        total = sum(4 * h[0] * ((f if k == 0 else h[0]) + h[0]) + 8 * h[0] for k in range(spec.layers))
        return total + 3 * h[0] + 3
    widths = [spec.window * f, *h, 3]
    return sum(a * b + b for a, b in zip(widths, widths[1:]))


def test_presets_are_sized_as_declared():
    for name, spec in PRESETS.items():
        model = build_model(spec)
        assert sum(p.numel() for p in model.parameters()) == n_params(spec), name
    assert PRESETS["lstm_a"].hidden == (128, 128) and PRESETS["lstm_b"].hidden == (256,) * 3
    assert all(PRESETS[n].window == 50 and PRESETS[n].levels == 10 for n in ("lstm_a", "lstm_b", "lstm_c"))
    ratio = n_params(PRESETS["lstm_c"]) / n_params(PRESETS["lstm_a"])
    assert 150 < ratio < 250  # "~200x lstm_a's parameters"


def test_spec_validation():
    with pytest.raises(ValueError, match="outputs must be 3"):
        ModelSpec(kind="mlp", window=4, hidden=(8,), outputs=2)
    with pytest.raises(ValueError, match="share one hidden size"):
        ModelSpec(kind="lstm", window=4, hidden=(8, 16))
    with pytest.raises(ValueError, match="at least one layer"):
        ModelSpec(kind="mlp", window=4, hidden=())
    with pytest.raises(msgspec.ValidationError, match="kind"):
        msgspec.convert({"kind": "gru", "window": 4, "hidden": [8]}, type=ModelSpec)
    with pytest.raises(ValueError, match="unknown model preset 'x' \\(known: mlp_small, lstm_a"):
        preset("x")


def test_build_model_is_seeded_and_leaves_the_global_rng_alone():
    spec = msgspec.structs.replace(PRESETS["lstm_a"], hidden=(8, 8))
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a = build_model(spec, seed=5)
    after = torch.rand(3)
    assert torch.equal(before, after)
    b = build_model(spec, seed=5)
    c = build_model(spec, seed=6)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.head.weight, c.head.weight)


def test_forward_window_contract():
    mlp = build_model(msgspec.structs.replace(PRESETS["mlp_small"], window=4, hidden=(8,)))
    lstm = build_model(msgspec.structs.replace(PRESETS["lstm_a"], window=4, hidden=(8, 8)))
    raw = torch.rand(5, 4, 42) * 100
    for model in (mlp, lstm):
        s = model.forward_window(raw)
        assert s.shape == (5,) and bool(((s >= -1) & (s <= 1)).all())
    assert lstm.forward_window(raw[:, :2]).shape == (5,)  # shorter windows at an instrument's start
    with pytest.raises(ValueError, match="mlp window is 4 rows, got 3"):
        mlp.forward_window(raw[:, :3])
    with pytest.raises(ValueError, match="lstm window holds 1..4 rows, got 5"):
        lstm.forward_window(torch.rand(2, 5, 42))


def test_normalisation_is_applied_after_preprocess():
    spec = msgspec.structs.replace(PRESETS["mlp_small"], window=2, hidden=(4,), dtype="float64")
    model = build_model(spec)
    mean, inv_std = torch.rand(42, dtype=torch.float64), torch.rand(42, dtype=torch.float64) + 0.5
    model.set_normalisation(mean, inv_std)
    raw = torch.rand(3, 2, 42) * 100
    torch.testing.assert_close(model.features(raw), (preprocess(raw.double(), 10) - mean) * inv_std)
    with pytest.raises(ValueError, match="shape \\(42,\\)"):
        model.set_normalisation(mean[:3], inv_std)
