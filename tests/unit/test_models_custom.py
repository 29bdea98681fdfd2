"""model.module: a user's torch module loaded from a factory, a .py file, TorchScript or
torch.export; its output checked at load; the CPU executor against the module on each window."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hft_infer.config import ConfigError, load_config
from hft_infer.models import dataset as ds
from hft_infer.models.custom import CustomExecutor, CustomModelError, load_configured, load_custom
from hft_infer.replay.synthetic import SyntheticConfig, generate

ROOT = Path(__file__).resolve().parents[2]
FILE = ROOT / "tests" / "user_models" / "cnn.py"
CNN = f"{FILE}:make_model"


pytestmark = pytest.mark.usefixtures("one_thread")


def _windows(model, events):
    rows = ds.raw_rows(events, model.spec.levels)
    index, _ = ds.window_index(events, model.spec.window)
    raw = torch.from_numpy(np.concatenate([rows, np.zeros((1, rows.shape[1]), np.float32)]))
    return raw[torch.from_numpy(index)]


@pytest.mark.parametrize("factory,window", [("make_model", 32), ("make_gru", 20)])
def test_the_executor_computes_the_module_on_each_window(factory, window):
    model, version = load_custom(f"{FILE}:{factory}", window=window, levels=10)
    assert version.startswith(f"{factory}@") and model.spec.kind == "custom" and model.spec.features == 42
    ev = generate(400, SyntheticConfig(instruments=3, seed=9))
    rows = ds.raw_rows(ev, 10)
    ring = torch.zeros(4, window + 5, 42)
    ex = CustomExecutor(model, ring, max_batch=4)
    pos = [0, 0, 0]
    got = np.empty(ev.size, np.float32)
    for i, s in enumerate(ev["instrument"].tolist()):
        ring[s, pos[s] % ring.shape[1]] = torch.from_numpy(rows[i])
        out = np.empty(2, np.float32)
        ex.step(np.array([s, 3], np.int64), np.array([pos[s], 0], np.int64), out)  # with the padding sink
        got[i] = out[0]
        pos[s] += 1
    with torch.inference_mode():
        want = model.forward_window(_windows(model, ev)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert np.ptp(want) > 1e-3  # the scores vary: the test can tell windows apart


def test_torchscript_and_export_files_load_and_agree(tmp_path):
    model, _ = load_custom(CNN, window=32, levels=10)
    x = torch.randn(5, 32, 42)
    with torch.inference_mode():
        want = model.net(x)
    script = tmp_path / "cnn.pt"
    torch.jit.save(torch.jit.script(model.net), str(script))
    exported = tmp_path / "cnn.pt2"
    batch = torch.export.Dim("batch", min=1, max=4096)
    ep = torch.export.export(model.net, (torch.zeros(4, 32, 42),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(ep, str(exported))
    for path in (script, exported):
        loaded, version = load_custom(str(path), window=32, levels=10)
        assert version.startswith("cnn@")
        with torch.inference_mode():
            torch.testing.assert_close(loaded.net(x), want, rtol=0, atol=1e-6)
    # a static-batch export fails the load-time check with the shape it was given
    static = tmp_path / "static.pt2"
    torch.export.save(torch.export.export(model.net, (torch.zeros(4, 32, 42),)), str(static))
    with pytest.raises(CustomModelError, match=r"forward on a \[1, 32, 42\] window .* raised .*x.size\(\)\[0\] == 4"):
        load_custom(str(static), window=32, levels=10)


@pytest.mark.parametrize("module,message", [
    (f"{FILE}:make_wrong_shape", r"returned shape \[1, 2\], expected \[1, 3\]"),
    (f"{FILE}:make_not_a_module", "returned str, expected a torch.nn.Module"),
    (f"{FILE}:missing", "has no attribute 'missing'"),
    ("no_such_package.models:make", "cannot import module 'no_such_package.models': ModuleNotFoundError"),
    ("tests/nowhere.py:make", "no such file tests/nowhere.py"),
    ("just-a-name", "expected 'package.module:factory'"),
    ("nowhere.pt2", "no such file nowhere.pt2"),
])
def test_bad_modules_are_one_line_errors(module, message):
    with pytest.raises(CustomModelError, match=message) as info:
        load_custom(module, window=32, levels=10)
    assert "\n" not in str(info.value) and module in str(info.value)


def test_wrong_window_width_and_factory_errors(tmp_path):
    # the CNN reads 42 features: a 5-level row (22 wide) fails at load, naming the shape
    with pytest.raises(CustomModelError, match=r"forward on a \[1, 32, 22\] window .* raised RuntimeError"):
        load_custom(CNN, window=32, levels=5)
    with pytest.raises(CustomModelError, match=r"make_model\(\*\*module_args\) raised TypeError"):
        load_custom(CNN, window=32, levels=10, args={"nope": 1})
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not torchscript")
    with pytest.raises(CustomModelError, match="not a TorchScript file"):
        load_custom(str(bad), window=32, levels=10)


def test_the_config_section_selects_the_module():
    cfg = load_config(None, [f'model.module="{CNN}"', "model.module_args={channels=8}", "model.window=16"])
    model, version = load_configured(cfg.model)
    assert model.spec.window == 16 and model.net.conv1.out_channels == 8 and version.startswith("make_model@")
    with pytest.raises(CustomModelError, match="model.mode must be \"window\""):
        load_configured(load_config(None, [f'model.module="{CNN}"', 'model.mode="stream"']).model)
    with pytest.raises(ConfigError, match="model.input"):
        load_config(None, ['model.input="bytes"'])
    from hft_infer.runner.select import build_runtime

    rt = build_runtime(load_config(None, [f'model.module="{CNN}"', 'runner.device="cpu"']), 8)
    assert rt.engine.name == "eager" and "custom module" in rt.engine.reason and rt.conflate
    with pytest.raises(ConfigError, match=r"^model: model.module .*returned shape"):
        build_runtime(load_config(None, [f'model.module="{FILE}:make_wrong_shape"']), 8)


def test_a_forward_that_fails_mid_stream_is_an_engine_failure():
    from hft_infer.runner.base import EngineFailure

    model, _ = load_custom(f"{FILE}:make_fails_later", window=4, levels=10)
    ex = CustomExecutor(model, torch.zeros(6, 8, 42), max_batch=8)
    out = np.empty(4, np.float32)
    ex.step(np.arange(3), np.zeros(3, np.int64), out[:3])
    with pytest.raises(EngineFailure, match=r"forward on a batch of 4 raised RuntimeError: this model breaks"):
        ex.step(np.arange(4), np.zeros(4, np.int64), out)


def test_bench_and_replay_feed_a_custom_model_the_levels_its_config_declares():
    """bench/replay size the synthetic books from model_levels(): a module's own levels, not
    the built-in checkpoint's 10."""
    from hft_infer.app.bench import model_levels

    assert model_levels(load_config(None, [])) == 10
    cfg = load_config(None, [f'model.module="{CNN}"', "model.levels=4"])
    assert model_levels(cfg) == 4
