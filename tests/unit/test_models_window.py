"""Executors through their public interface over a real ring, for both backends (numpy, what
the eager engine runs, and torch, the previous path): the incremental window method equals
recomputing the window, stream mode equals nn.LSTM over the full history, and MLP windows
(including an instrument's first W-1 rows) equal the model's own reference."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
import torch

from hft_infer.models import PRESETS, build_model, dataset as ds
from hft_infer.models.build import BACKENDS, build_executor
from hft_infer.models.cached import MlpCachedExecutor
from hft_infer.models.features import preprocess
from hft_infer.models.incremental import LstmIncrementalExecutor
from hft_infer.models.numpy_lstm import LstmIncrementalNumpyExecutor, LstmStreamNumpyExecutor
from hft_infer.models.numpy_mlp import MlpNumpyExecutor
from hft_infer.models.torch_executors import LstmRecomputeExecutor, LstmStreamExecutor
from hft_infer.replay.synthetic import SyntheticConfig, generate

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/unit/conftest.py


def _sharp(model):
    """Make scores sensitive: normalisation constants from synthetic rows (with the identity,
    raw bps and log sizes saturate the gates and every state looks alike) and a larger head,
    so that scores spread over [-1, 1] and a wrong state cannot hide under the tolerance."""
    levels = model.spec.levels
    rows = torch.from_numpy(ds.raw_rows(generate(4000, SyntheticConfig(instruments=4, levels=levels, seed=99)),
                                        levels))
    feats = preprocess(rows.double(), levels)
    with torch.no_grad():
        model.set_normalisation(feats.mean(0), 1.0 / feats.std(0).clamp_min(1e-3))
        model.head.weight.mul_(100.0)
        for name, p in model.named_parameters():
            if name.startswith(("lstm.weight_ih", "layers.")):
                p.mul_(3.0)
    return model


def _stream(n_events: int, instruments: int, seed: int, levels: int = 10) -> tuple[np.ndarray, torch.Tensor]:
    """(instrument per event, raw rows) of a synthetic feed: realistic rows, interleaved instruments."""
    ev = generate(n_events, SyntheticConfig(instruments=instruments, levels=levels, seed=seed, burstiness=0.5,
                                          activity_dispersion=0.0))
    return ev["instrument"].astype(np.int64), torch.from_numpy(ds.raw_rows(ev, levels))


def _drive(executors: dict, inst: np.ndarray, rows: torch.Tensor, ring: torch.Tensor, max_batch: int,
           seed: int, out_dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    """Feed events as the service would: write each row into its slot's ring, batch triggers
    (random batch sizes, distinct slots, in order), pad some batches with the sink slot at a
    random position (its scores are ignored; it must not disturb the other slots).
    Returns ({name: score per event}, position per event)."""
    rng = np.random.default_rng(seed)
    n_slots, r, _ = ring.shape
    sink = n_slots - 1
    next_pos = np.zeros(n_slots, dtype=np.int64)
    positions = np.empty(inst.size, dtype=np.int64)
    scores = {name: torch.full((inst.size,), float("nan"), dtype=out_dtype) for name in executors}
    i = 0
    while i < inst.size:
        want = int(rng.integers(1, max_batch + 1))
        batch, seen = [], set()
        while i < inst.size and len(batch) < want and int(inst[i]) not in seen:
            s = int(inst[i])
            seen.add(s)
            positions[i] = next_pos[s]
            ring[s, next_pos[s] % r] = rows[i]
            next_pos[s] += 1
            batch.append(i)
            i += 1
        slots = inst[batch].tolist()
        pos = positions[batch].tolist()
        pad = int(rng.integers(0, max_batch - len(batch) + 1)) if rng.random() < 0.3 else 0
        slots_a = np.array(slots + [sink] * pad, dtype=np.int64)
        pos_a = np.array(pos + [int(rng.integers(0, 10_000))] * pad, dtype=np.int64)
        for name, ex in executors.items():
            out = np.empty(slots_a.shape[0], dtype=np.dtype(str(out_dtype).removeprefix("torch.")))
            ex.step(slots_a, pos_a, out)
            scores[name][batch] = torch.from_numpy(out[: len(batch)])
    return scores, positions


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("dtype", "tol", "window", "hidden", "n_events", "ring_extra"),
    [
        # float64: only summation order differs between the methods.
        ("float64", 1e-10, 7, (24, 24, 24), 2000, 3),
        ("float64", 1e-10, 50, (32, 32), 1200, 0),
        # float32 at the lstm_a preset's real size (2 x 128, W = 50).
        ("float32", 1e-5, 50, (128, 128), 1000, 14),
    ],
)
def test_incremental_equals_recompute(backend, dtype, tol, window, hidden, n_events, ring_extra):
    spec = msgspec.structs.replace(PRESETS["lstm_a"], window=window, hidden=hidden, dtype=dtype)
    model = _sharp(build_model(spec, seed=11))
    instruments = 4
    inst, rows = _stream(n_events, instruments, seed=window)
    ring = torch.zeros(instruments + 1, window + ring_extra, spec.features)
    exs = {
        "incremental": build_executor(model, ring, max_batch=8, mode="window", window_method="incremental",
                                      backend=backend),
        "recompute": build_executor(model, ring, max_batch=8, mode="window", window_method="recompute"),
    }
    want = LstmIncrementalNumpyExecutor if backend == "numpy" else LstmIncrementalExecutor
    assert isinstance(exs["incremental"], want) and exs["incremental"].stateful
    assert isinstance(exs["recompute"], LstmRecomputeExecutor) and not exs["recompute"].stateful
    scores, positions = _drive(exs, inst, rows, ring, 8, seed=1, out_dtype=spec.torch_dtype)
    inc, rec = scores["incremental"], scores["recompute"]
    assert not torch.isnan(inc).any() and not torch.isnan(rec).any()
    # Every slot wrapped its circular buffer of open windows several times.
    assert all(positions[inst == s].max() > 3 * window for s in range(instruments))
    assert (inc - rec).abs().max().item() <= tol
    assert inc.std().item() > 0.05  # the scores vary: equality is not two constants agreeing


def test_recompute_matches_forward_window_per_instrument():
    """The recompute executor (the reference) against model.forward_window on each
    instrument's explicit history, including the short windows at its start."""
    spec = msgspec.structs.replace(PRESETS["lstm_a"], window=9, hidden=(16, 16), dtype="float64")
    model = _sharp(build_model(spec, seed=2))
    inst, rows = _stream(600, 4, seed=3)
    ring = torch.zeros(5, 9, spec.features)
    ex = build_executor(model, ring, max_batch=4, mode="window", window_method="recompute")
    scores, positions = _drive({"rec": ex}, inst, rows, ring, 4, seed=2, out_dtype=torch.float64)
    with torch.inference_mode():
        for s in range(4):
            hist = rows[inst == s]
            got = scores["rec"][inst == s]
            for t in range(hist.shape[0]):
                want = model.forward_window(hist[max(0, t - 8): t + 1][None])[0]
                assert abs(got[t].item() - want.item()) <= 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("dtype", "tol"), [("float64", 1e-10), ("float32", 1e-5)])
def test_stream_equals_lstm_over_full_history(backend, dtype, tol):
    spec = msgspec.structs.replace(PRESETS["lstm_b"], hidden=(32, 32, 32), dtype=dtype)
    model = _sharp(build_model(spec, seed=4))
    inst, rows = _stream(1500, 5, seed=8)
    ring = torch.zeros(6, 4, spec.features)  # stream reads one row: a short ring is enough
    ex = build_executor(model, ring, max_batch=5, mode="stream", window_method="incremental", backend=backend)
    assert isinstance(ex, LstmStreamNumpyExecutor if backend == "numpy" else LstmStreamExecutor) and ex.stateful
    scores, _ = _drive({"stream": ex}, inst, rows, ring, 5, seed=3, out_dtype=spec.torch_dtype)
    with torch.inference_mode():
        for s in range(5):
            want, _ = model.forward_stream(rows[inst == s][None])
            got = scores["stream"][inst == s]
            assert (got - want[0]).abs().max().item() <= tol


@pytest.mark.parametrize("backend", BACKENDS)
def test_reset_restarts_every_slot(backend):
    spec = msgspec.structs.replace(PRESETS["lstm_a"], window=5, hidden=(8, 8), dtype="float64")
    model = build_model(spec, seed=5)
    inst, rows = _stream(400, 3, seed=4)
    for mode in ("window", "stream"):
        ring = torch.zeros(4, 8, spec.features)
        ex = build_executor(model, ring, max_batch=3, mode=mode, window_method="incremental", backend=backend)
        first, _ = _drive({"x": ex}, inst, rows, ring, 3, seed=5, out_dtype=torch.float64)
        ex.reset()
        ring.zero_()
        again, _ = _drive({"x": ex}, inst, rows, ring, 3, seed=5, out_dtype=torch.float64)
        torch.testing.assert_close(first["x"], again["x"], rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mlp_window_pads_with_zero_raw_rows_oldest_first(backend):
    spec = msgspec.structs.replace(PRESETS["mlp_small"], window=6, hidden=(16, 8), dtype="float64")
    model = _sharp(build_model(spec, seed=6))
    inst, rows = _stream(500, 4, seed=6)
    ring = torch.zeros(5, 6, spec.features)  # R == W: the window exactly fills the ring
    ex = build_executor(model, ring, max_batch=4, mode="window", window_method="incremental", backend=backend)
    want = MlpNumpyExecutor if backend == "numpy" else MlpCachedExecutor
    assert isinstance(ex, want) and not ex.stateful  # window_method does not apply
    scores, _ = _drive({"mlp": ex}, inst, rows, ring, 4, seed=7, out_dtype=torch.float64)
    zero = torch.zeros(5, spec.features)
    with torch.inference_mode():
        for s in range(4):
            hist = torch.cat([zero, rows[inst == s]])  # W-1 zero raw rows before the first row
            windows = hist.unfold(0, 6, 1).permute(0, 2, 1)  # [T, W, F], oldest first
            want = model.forward_window(windows)
            got = scores["mlp"][inst == s]
            assert (got - want).abs().max().item() <= 1e-12
            # The first rows really saw padding: not the same as windows of repeated rows.
            assert windows[0, :5].abs().sum() == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("preset", "mode"), [("lstm_a", "window"), ("lstm_a", "stream"), ("mlp_small", "window")])
def test_float32_out_from_float64_model_and_padding_sink_repeats(backend, preset, mode):
    spec = msgspec.structs.replace(PRESETS[preset], window=4, hidden=(8, 8), dtype="float64")
    model = build_model(spec, seed=7)
    ring = torch.rand(3, 4, spec.features) * 100
    ex = build_executor(model, ring, max_batch=4, mode=mode, window_method="incremental", backend=backend)
    out = np.empty(4, dtype=np.float32)
    ex.step(np.array([0, 2, 2, 2]), np.array([0, 5, 5, 5]), out)
    assert np.isfinite(out).all() and (np.abs(out) <= 1).all()


def test_builder_and_step_errors():
    mlp = build_model(PRESETS["mlp_small"])
    lstm = build_model(msgspec.structs.replace(PRESETS["lstm_a"], hidden=(8, 8)))
    f = PRESETS["mlp_small"].features
    ring = torch.zeros(3, 32, f)
    with pytest.raises(ValueError, match="mode 'stream' needs an lstm"):
        build_executor(mlp, ring, max_batch=2, mode="stream", window_method="incremental")
    with pytest.raises(ValueError, match="mode must be one of"):
        build_executor(lstm, ring, max_batch=2, mode="batch", window_method="incremental")
    with pytest.raises(ValueError, match="window_method must be one of"):
        build_executor(lstm, ring, max_batch=2, mode="window", window_method="fast")
    with pytest.raises(ValueError, match="backend must be one of"):
        build_executor(lstm, ring, max_batch=2, mode="window", window_method="incremental", backend="jax")
    with pytest.raises(ValueError, match="ring must be float32"):
        build_executor(mlp, ring.double(), max_batch=2, mode="window", window_method="recompute")
    with pytest.raises(ValueError, match="ring rows are 10 wide"):
        build_executor(mlp, torch.zeros(3, 32, 10), max_batch=2, mode="window", window_method="recompute")
    with pytest.raises(ValueError, match="ring holds 32 rows per slot, this executor needs >= 50"):
        build_executor(lstm, ring, max_batch=2, mode="window", window_method="recompute")
    # The incremental method reads only the newest row: a short ring is fine.
    build_executor(lstm, ring, max_batch=2, mode="window", window_method="incremental")
    with pytest.raises(ValueError, match="ring must be C-contiguous float32"):
        build_executor(mlp, ring.numpy()[:, ::2], max_batch=2, mode="window", window_method="recompute")
    for backend in BACKENDS:
        ex = build_executor(mlp, ring, max_batch=2, mode="window", window_method="recompute", backend=backend)
        with pytest.raises(ValueError, match="batch of 3 exceeds max_batch 2"):
            ex.step(np.array([0, 1, 2]), np.array([0, 0, 0]), np.empty(3, np.float32))
