"""The CPU executors' batched products (models/products.py): each backend computes a @ b into
the caller's buffer in place (a strided view too), `auto` times only products worth timing
and decides by its margin, and the service's CPU engine makes its buckets' plans at start-up
and says which backend their products took."""

from __future__ import annotations

import numpy as np
import pytest

from hft_infer.config import ConfigError, load_config
from hft_infer.models import products as P
from hft_infer.runner.select import build_runtime

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/unit/conftest.py


def _operands(m: int, k: int, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    return a, b


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_each_backend_writes_the_product_into_a_strided_buffer_in_place(backend):
    a, b = _operands(6, 40, 9)
    buf = np.ones((8, 10), np.float32)  # [:6, :-1] is the product's out; the 1 column and rows 6.. stay
    product = P.bind_product(a, b, buf[:6, :-1], backend)
    assert product.backend == backend
    product()
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(buf[:6, :-1], want, rtol=0, atol=1e-4)
    assert (buf[:, -1] == 1).all() and (buf[6:] == 1).all()
    # Bound to the buffers, not their values: new inputs, same call.
    a[:] = 2 * a
    product()
    np.testing.assert_allclose(buf[:6, :-1], 2 * want, rtol=0, atol=2e-4)


def test_the_two_backends_agree_within_fp32_summation_order():
    a, b = _operands(64, 1376, 128, seed=3)
    outs = {}
    for backend in ("numpy", "torch"):
        outs[backend] = np.empty((64, 128), np.float32)
        P.bind_product(a, b, outs[backend], backend)()
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)  # the sums' magnitude
    assert (np.abs(outs["numpy"] - outs["torch"]) <= 1e-6 * scale).all()


def test_unknown_backends_are_refused_with_the_choices():
    a, b = _operands(2, 3, 4)
    out = np.empty((2, 4), np.float32)
    with pytest.raises(ValueError, match="'auto', 'numpy', 'torch'"):
        P.bind_product(a, b, out, "blas")
    with pytest.raises(ValueError, match="'numpy' or 'torch'"):
        P.BoundProduct(a, b, out, "auto")


def test_auto_leaves_small_products_to_numpy_without_timing_them(monkeypatch):
    timed = []
    monkeypatch.setattr(P, "_best_times", lambda *ps: timed.append(ps) or [1.0, 0.0])
    a, b = _operands(4, 32, 16)  # 2,048 multiply-adds < TIMED_MIN
    assert P.bind_product(a, b, np.empty((4, 16), np.float32), "auto").backend == "numpy"
    assert timed == []


@pytest.mark.parametrize(("t_numpy", "t_torch", "chosen"),
                         [(100.0, 89.0, "torch"), (100.0, 91.0, "numpy"), (100.0, 150.0, "numpy")])
def test_auto_takes_torch_only_past_its_margin(monkeypatch, t_numpy, t_torch, chosen):
    seen = []

    def fake_times(*products):
        seen.append([p.backend for p in products])
        return [t_numpy, t_torch]
    monkeypatch.setattr(P, "_best_times", fake_times)
    a, b = _operands(64, 64, 64)  # 262,144 multiply-adds: timed
    out = np.empty((64, 64), np.float32)
    product = P.bind_product(a, b, out, "auto")
    assert seen == [["numpy", "torch"]]
    assert product.backend == chosen
    product()
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=0, atol=1e-3)


def test_auto_really_times_both_and_binds_a_working_product():
    a, b = _operands(16, 1376, 128)
    out = np.empty((16, 128), np.float32)
    t_numpy, t_torch = P._best_times(P.BoundProduct(a, b, out, "numpy"), P.BoundProduct(a, b, out, "torch"))
    assert t_numpy > 0 and t_torch > 0
    product = P.bind_product(a, b, out, "auto")
    out[:] = np.nan
    product()
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=0, atol=1e-3)


def _cpu_runtime(*overrides: str):
    cfg = load_config(None, ['model.checkpoint=""', 'model.preset="mlp_small"', 'runner.engine="eager"',
                             "runner.buckets=[1, 2, 8]", "scheduler.max_batch=8", *overrides])
    return build_runtime(cfg, 5)


@pytest.mark.parametrize("setting", ["numpy", "torch"])
def test_the_cpu_engine_plans_its_buckets_at_start_up_and_names_the_products(setting):
    runtime = _cpu_runtime(f'runner.cpu_products="{setting}"')
    executor = runtime.engine.executor
    assert sorted(executor._plans) == [2, 8]  # batch 1 has its own gemv path
    backends = {p.backend for plan in executor._plans.values() for p in plan.products}
    assert backends == {setting}
    assert f"products {setting}: " in runtime.engine.reason
    assert ("torch for 6 of 6" in runtime.engine.reason) == (setting == "torch")


def test_the_default_is_auto_and_a_bad_setting_is_a_config_error():
    assert "products auto: " in _cpu_runtime().engine.reason
    with pytest.raises(ConfigError, match="cpu_products"):
        _cpu_runtime('runner.cpu_products="blas"')
