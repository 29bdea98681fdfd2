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
    with pytest.raises(ValueError, match="'numpy', 'torch' or 'bf16'"):
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


# ------------------------------------------------------------ bf16 (runner.precision = "bf16")

BF16_REL = 2 ** -7  # bf16 keeps 8 significant bits: each rounding is within 2^-8 relative


@pytest.mark.parametrize("weights", ["a", "b"])
def test_a_bf16_product_writes_into_a_strided_buffer_within_bf16_rounding(weights):
    a, b = _operands(6, 40, 9, seed=5)
    buf = np.ones((8, 10), np.float32)
    product = P.BoundProduct(a, b, buf[:6, :-1], "bf16", weights=weights)
    assert product.backend == "bf16"
    product()
    want = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    err = np.abs(buf[:6, :-1] - want)
    assert (err <= 2 * BF16_REL * scale).all()  # inputs and output each rounded once
    assert err.max() > 1e-6 * scale.max()  # and it really ran in bf16 (fp32 would be ~1e-7)
    assert (buf[:, -1] == 1).all() and (buf[6:] == 1).all()


@pytest.mark.parametrize("weights", ["a", "b"])
def test_a_bf16_product_rereads_the_activations_but_holds_the_weights_from_bind(weights):
    a, b = _operands(4, 32, 8, seed=6)
    out = np.empty((4, 8), np.float32)
    product = P.BoundProduct(a, b, out, "bf16", weights=weights)
    product()
    first = out.copy()
    act, w = (a, b) if weights == "b" else (b, a)
    act *= 2  # exact in bf16 too: the result doubles exactly
    product()
    np.testing.assert_array_equal(out, 2 * first)
    w[:] = 0  # converted at bind: a weight matrix never changes under a bound product
    product()
    np.testing.assert_array_equal(out, 2 * first)


def test_a_bf16_product_needs_its_weight_operand_named():
    a, b = _operands(2, 3, 4)
    with pytest.raises(ValueError, match="weight operand named"):
        P.BoundProduct(a, b, np.empty((2, 4), np.float32), "bf16")


@pytest.mark.parametrize(("times", "chosen"), [
    ((100.0, 95.0, 80.0), "bf16"),   # torch not past numpy's margin; bf16 is
    ((100.0, 80.0, 75.0), "torch"),  # bf16 not past torch's margin (0.9 x 80 = 72)
    ((100.0, 80.0, 70.0), "bf16"),
    ((100.0, 120.0, 95.0), "numpy"),
])
def test_auto_with_bf16_weights_times_three_and_takes_a_later_one_only_past_the_margin(monkeypatch, times, chosen):
    seen = []
    monkeypatch.setattr(P, "_best_times", lambda *ps: seen.append([p.backend for p in ps]) or list(times))
    a, b = _operands(64, 64, 64)
    out = np.empty((64, 64), np.float32)
    product = P.bind_product(a, b, out, "auto", bf16_weights="b")
    assert seen == [["numpy", "torch", "bf16"]]
    assert product.backend == chosen


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_forced_backend_runs_the_eligible_products_in_bf16(backend):
    a, b = _operands(8, 64, 16)
    out = np.empty((8, 16), np.float32)
    assert P.bind_product(a, b, out, backend, bf16_weights="b").backend == "bf16"
    assert P.bind_product(a, b, out, backend).backend == backend


def test_the_cpu_engine_in_bf16_names_its_products_and_its_start_up_check():
    runtime = _cpu_runtime('runner.precision="bf16"', 'runner.cpu_products="torch"')
    executor = runtime.engine.executor
    for plan in executor._plans.values():  # the two hidden layers in bf16, the head fp32
        assert [p.backend for p in plan.products] == ["bf16", "bf16", "torch"]
    reason = runtime.engine.reason
    assert "products torch, precision bf16: torch for 2 of 6 (batches 2-8), bf16 for 4 of 6 (batches 2-8)" in reason
    assert "bf16 self-check against fp32: largest score difference" in reason
    assert not any(runtime.store.count)  # the check's rows are gone


def test_the_cpu_engine_refuses_bf16_when_its_scores_leave_the_tolerance(monkeypatch):
    from hft_infer.runner import self_check

    monkeypatch.setitem(self_check.TOLERANCE, "bf16", 1e-9)  # a model far more sensitive than any preset
    with pytest.raises(ConfigError, match=r'runner.precision = "bf16" on the CPU engine: self-check failed'):
        _cpu_runtime('runner.precision="bf16"', 'runner.cpu_products="torch"')
    # Without the check it serves, as the message says.
    runtime = _cpu_runtime('runner.precision="bf16"', 'runner.cpu_products="torch"', "runner.self_check=false")
    assert "bf16 self-check" not in runtime.engine.reason


def test_tf32_on_the_cpu_runs_fp32_and_says_so():
    runtime = _cpu_runtime('runner.precision="tf32"', 'runner.cpu_products="torch"')
    assert "tf32 is a GPU tensor-core format" in runtime.engine.reason
    assert {p.backend for plan in runtime.engine.executor._plans.values() for p in plan.products} == {"torch"}


@pytest.mark.parametrize(("preset", "mode", "method"), [
    ("mlp_small", "window", "incremental"),
    ("lstm_a", "stream", "incremental"),
    ("lstm_a", "window", "incremental"),  # the per-row input projection in bf16 too
])
def test_bf16_executors_track_their_fp32_executor_step_after_step(preset, mode, method):
    """The executors in bf16 against themselves in fp32, over steps that carry recurrent state
    (LSTM: the rounding must not accumulate), at a batch where every eligible product is bf16."""
    import torch

    from hft_infer.models import PRESETS, build_model
    from hft_infer.models.build import build_executor

    model = build_model(PRESETS[preset], seed=0)
    spec = model.spec
    n, steps = 8, 12
    rng = np.random.default_rng(1)
    ring = np.empty((n + 1, 64, spec.features), np.float32)
    ring[:] = 100 + rng.normal(0, 0.05, ring.shape)
    ring[..., 1::4] = rng.integers(1, 500, ring[..., 1::4].shape)
    ring[..., 3::4] = rng.integers(1, 500, ring[..., 3::4].shape)
    execs = {p: build_executor(model, ring, max_batch=n, mode=mode, window_method=method, products="torch",
                               precision=p) for p in ("fp32", "bf16")}
    plan = execs["bf16"]._plan(n)
    assert [p.backend for p in plan.products if p is not plan.head] == ["bf16"] * (len(plan.products) - 1)
    slots = np.arange(n, dtype=np.int64)
    worst = 0.0
    for t in range(steps):
        outs = {}
        for p, ex in execs.items():
            outs[p] = np.empty(n, np.float32)
            ex.step(slots, np.full(n, t, np.int64), outs[p])
        assert torch.isfinite(torch.from_numpy(outs["bf16"])).all()
        worst = max(worst, float(np.abs(outs["bf16"] - outs["fp32"]).max()))
    assert 0 < worst <= 1e-2


def test_the_bf16_hardware_note_reads_the_cpu_flags():
    from hft_infer.runner.select import _bf16_hardware_note

    amx = "processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16 amx_bf16 amx_tile\nflags : ignored\n"
    assert P.bf16_hardware(amx) == ["amx_bf16", "avx512_bf16"]
    assert _bf16_hardware_note(amx) == "; bf16 hardware: amx_bf16, avx512_bf16"
    zen3 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n"
    assert P.bf16_hardware(zen3) == []
    assert "WARNING: this CPU has neither AMX nor AVX512-BF16" in _bf16_hardware_note(zen3)
    assert P.bf16_hardware("processor : 0\n") is None  # no flags line: unknown
    assert "unknown" in _bf16_hardware_note("processor : 0\n")
    # The engine says what this machine's own flags are.
    for check in ("true", "false"):
        runtime = _cpu_runtime('runner.precision="bf16"', 'runner.cpu_products="torch"', f"runner.self_check={check}")
        assert _bf16_hardware_note() in runtime.engine.reason
