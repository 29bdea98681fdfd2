"""Checkpoints: round trips (safetensors and torch state_dict) and every load error path."""

from __future__ import annotations

import json
import os
import re

import msgspec
import pytest
import torch
from safetensors.torch import load_file, save_file

from hft_infer.models import PRESETS, build_model
from hft_infer.models.checkpoint import (
    META_KEY,
    CheckpointError,
    load_model,
    read_header,
    save_checkpoint,
    version_string,
)

SMALL_LSTM = msgspec.structs.replace(PRESETS["lstm_a"], name="tiny_lstm", window=5, hidden=(8, 8))


@pytest.fixture
def lstm():
    model = build_model(SMALL_LSTM, seed=3)
    model.set_normalisation(torch.linspace(-1, 1, SMALL_LSTM.features), torch.linspace(0.5, 2, SMALL_LSTM.features))
    return model


@pytest.fixture
def saved(tmp_path, lstm):
    path = tmp_path / "m.safetensors"
    save_checkpoint(lstm, path, version="t-1", extra={"note": "x", "metrics": {"auc": 0.7}})
    return path


def _raw(spec, batch=3, rows=None):
    g = torch.Generator().manual_seed(0)
    return torch.rand(batch, rows or spec.window, spec.features, generator=g) * 50 + 1


def _error(match: str, fn, *args, **kwargs) -> str:
    with pytest.raises(CheckpointError) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert "\n" not in msg
    assert re.search(match, msg), msg
    return msg


def test_safetensors_round_trip(saved, lstm):
    model, version = load_model(str(saved))
    assert version == version_string(lstm)
    assert re.fullmatch(r"tiny_lstm@[0-9a-f]{8}", version)
    assert model.spec == SMALL_LSTM
    torch.testing.assert_close(model.norm_mean, lstm.norm_mean, rtol=0, atol=0)
    torch.testing.assert_close(model.norm_inv_std, lstm.norm_inv_std, rtol=0, atol=0)
    raw = _raw(SMALL_LSTM)
    with torch.inference_mode():
        torch.testing.assert_close(model.forward_window(raw), lstm.forward_window(raw), rtol=0, atol=0)
    header = read_header(saved)
    assert header.version == "t-1" and header.extra == {"note": "x", "metrics": {"auc": 0.7}}
    assert not model.training


def test_mlp_and_float64_round_trip(tmp_path):
    spec = msgspec.structs.replace(PRESETS["mlp_small"], window=4, hidden=(8,), dtype="float64")
    mlp = build_model(spec, seed=1)
    path = tmp_path / "mlp.safetensors"
    version = save_checkpoint(mlp, path, version="v")
    model, loaded_version = load_model(str(path))
    assert loaded_version == version and model.spec.dtype == "float64"
    raw = _raw(spec)
    with torch.inference_mode():
        torch.testing.assert_close(model.forward_window(raw), mlp.forward_window(raw), rtol=0, atol=0)


def test_version_tracks_weights_and_normalisation(lstm):
    v0 = version_string(lstm)
    other = build_model(SMALL_LSTM, seed=4)
    assert version_string(other) != v0
    lstm.norm_mean[0] += 1
    assert version_string(lstm) != v0


def test_preset_with_seed(tmp_path):
    a, va = load_model("", preset="mlp_small", seed=1)
    b, vb = load_model("", preset="mlp_small", seed=1)
    c, vc = load_model("", preset="mlp_small", seed=2)
    assert va == vb != vc and va.startswith("mlp_small@")
    assert a.spec == PRESETS["mlp_small"]


def test_torch_state_dict_round_trip(tmp_path):
    lstm = build_model(PRESETS["lstm_a"], seed=8)
    path = tmp_path / "w.pt"
    torch.save(lstm.state_dict(), path)
    model, version = load_model(str(path), preset="lstm_a")
    assert version == version_string(lstm)
    assert torch.equal(model.norm_inv_std, torch.ones(PRESETS["lstm_a"].features))  # identity without norm keys
    sd = dict(lstm.state_dict())
    sd["norm_mean"] = torch.full((42,), 0.5)
    sd["norm_inv_std"] = torch.full((42,), 2.0)
    torch.save(sd, path)
    model, _ = load_model(str(path), preset="lstm_a", mode="stream")
    assert torch.equal(model.norm_mean, sd["norm_mean"]) and torch.equal(model.norm_inv_std, sd["norm_inv_std"])
    raw = _raw(PRESETS["lstm_a"], rows=7)
    with torch.inference_mode():
        lstm.set_normalisation(sd["norm_mean"], sd["norm_inv_std"])
        torch.testing.assert_close(model.forward_window(raw), lstm.forward_window(raw), rtol=0, atol=0)


def test_a_plain_nn_lstm_trained_elsewhere_loads(tmp_path):
    """The documented key names are exactly torch.nn.LSTM's and nn.Linear's."""
    spec = PRESETS["lstm_a"]
    lstm = torch.nn.LSTM(spec.features, 128, num_layers=2, batch_first=True)
    head = torch.nn.Linear(128, 3)
    sd = {f"lstm.{k}": v for k, v in lstm.state_dict().items()}
    sd.update({f"head.{k}": v for k, v in head.state_dict().items()})
    torch.save(sd, tmp_path / "elsewhere.pt")
    model, _ = load_model(str(tmp_path / "elsewhere.pt"), preset="lstm_a")
    raw = _raw(spec, rows=10)
    from hft_infer.models.features import preprocess

    with torch.inference_mode():
        out, _ = lstm(preprocess(raw, spec.levels))
        want = torch.softmax(head(out[:, -1]), -1)
        torch.testing.assert_close(model.forward_window(raw), want[:, 2] - want[:, 0])


# --- error paths -------------------------------------------------------------------------


def test_missing_file_and_directory(tmp_path):
    _error(r"nope\.safetensors: cannot read: no such file", load_model, str(tmp_path / "nope.safetensors"))
    d = tmp_path / "dir.safetensors"
    d.mkdir()
    _error(r"dir\.safetensors: cannot read: not a file", load_model, str(d))
    _error(r"nope\.pt: cannot read: no such file", load_model, str(tmp_path / "nope.pt"), preset="lstm_a")


def test_not_a_safetensors_file(tmp_path):
    p = tmp_path / "junk.safetensors"
    p.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    _error(r"junk\.safetensors: not a safetensors file", load_model, str(p))
    p.write_bytes(b"")
    _error(r"junk\.safetensors: not a safetensors file", load_model, str(p))


def _rewrite(saved, tmp_path, *, meta=None, tensors=None, name="bad.safetensors"):
    t = load_file(str(saved)) if tensors is None else tensors
    out = tmp_path / name
    save_file(t, str(out), metadata=meta)
    return str(out)


def _meta(saved) -> dict:
    return json.loads(msgspec.json.encode(read_header(saved)))


def test_bad_headers(saved, tmp_path):
    _error(r"bad\.safetensors: bad header: no 'hft_infer' metadata", load_model,
           _rewrite(saved, tmp_path, meta={"other": "x"}))
    _error(r"bad header: .*", load_model, _rewrite(saved, tmp_path, meta={META_KEY: "{not json"}))
    meta = _meta(saved)
    _error(r"bad header: format is not", load_model,
           _rewrite(saved, tmp_path, meta={META_KEY: json.dumps({**meta, "format": "other"})}))
    _error(r"bad header: format_version 99 is not supported", load_model,
           _rewrite(saved, tmp_path, meta={META_KEY: json.dumps({**meta, "format_version": 99})}))
    bad_spec = {**meta, "spec": {**meta["spec"], "kind": "gru"}}
    _error(r"bad header: .*spec\.kind", load_model, _rewrite(saved, tmp_path, meta={META_KEY: json.dumps(bad_spec)}))
    short = {**meta, "norm_mean": meta["norm_mean"][:-1]}
    _error(r"bad\.safetensors: norm_mean has shape \[41\], expected \[42\]", load_model,
           _rewrite(saved, tmp_path, meta={META_KEY: json.dumps(short)}))


def test_unknown_preset_in_header(saved, tmp_path):
    meta = _meta(saved)
    # A header spec is self-contained (its name is a label), so an unknown *name* loads...
    renamed = {**meta, "spec": {**meta["spec"], "name": "my_model"}}
    model, version = load_model(_rewrite(saved, tmp_path, meta={META_KEY: json.dumps(renamed)}))
    assert version.startswith("my_model@")
    # ...but the config's preset must name a known preset, and match the checkpoint.
    _error(r"model\.preset: unknown preset 'lstm_z'", load_model, str(saved), preset="lstm_z")
    _error(r"holds a 'tiny_lstm' model but model\.preset is 'lstm_a'", load_model, str(saved), preset="lstm_a")


def test_tensor_mismatches_name_the_tensor(saved, tmp_path):
    good = load_file(str(saved))
    meta = {META_KEY: json.dumps(_meta(saved))}
    missing = {k: v for k, v in good.items() if k != "lstm.bias_hh_l1"}
    _error(r"bad\.safetensors: tensor 'lstm\.bias_hh_l1' is missing", load_model,
           _rewrite(saved, tmp_path, meta=meta, tensors=missing))
    extra = {**good, "lstm.weight_ih_l2": torch.zeros(4)}
    _error(r"tensor 'lstm\.weight_ih_l2' is unexpected", load_model,
           _rewrite(saved, tmp_path, meta=meta, tensors=extra))
    shaped = {**good, "head.weight": torch.zeros(3, 9)}
    _error(r"tensor 'head\.weight' has shape \[3, 9\], expected \[3, 8\]", load_model,
           _rewrite(saved, tmp_path, meta=meta, tensors=shaped))
    typed = {**good, "head.bias": good["head.bias"].double()}
    _error(r"tensor 'head\.bias' has dtype float64, expected float32", load_model,
           _rewrite(saved, tmp_path, meta=meta, tensors=typed))


def test_builtin_and_kind_errors(tmp_path):
    _error(r"builtin:nope: no built-in checkpoint 'nope' \(have: .*default", load_model, "builtin:nope")
    _error(r"model\.bin: unknown checkpoint type", load_model, "model.bin")
    _error(r"model\.checkpoint is empty and model\.preset is not set", load_model, "")
    _error(r"model\.preset: unknown preset 'big'", load_model, "", preset="big")
    _error(r"mode 'stream' needs an lstm", load_model, "", preset="mlp_small", mode="stream")
    _error(r"model mode must be 'window' or 'stream'", load_model, "", preset="lstm_a", mode="batch")


def test_state_dict_errors(tmp_path):
    lstm = build_model(PRESETS["lstm_a"], seed=1)
    p = tmp_path / "w.pt"
    torch.save(lstm.state_dict(), p)
    _error(r"w\.pt: a torch state_dict does not carry its model config: set model\.preset", load_model, str(p))
    _error(r"model\.preset: unknown preset 'x'", load_model, str(p), preset="x")
    _error(r"w\.pt: tensor 'layers\.0\.weight' is missing", load_model, str(p), preset="mlp_small")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"definitely not a zip or pickle")
    _error(r"junk\.pt: not a torch state_dict file", load_model, str(junk), preset="lstm_a")
    torch.save({"state_dict": lstm.state_dict(), "epoch": 3}, p)
    _error(r"w\.pt: not a state_dict .*save model\.state_dict\(\) alone", load_model, str(p), preset="lstm_a")
    torch.save([1, 2], p)
    _error(r"w\.pt: not a state_dict", load_model, str(p), preset="lstm_a")
    sd = dict(lstm.state_dict())
    sd["lstm.weight_hh_l0"] = sd["lstm.weight_hh_l0"].double()
    torch.save(sd, p)
    _error(r"tensor 'lstm\.weight_hh_l0' has dtype float64, expected float32", load_model, str(p), preset="lstm_a")
    sd = {**lstm.state_dict(), "norm_mean": torch.zeros(42)}
    torch.save(sd, p)
    _error(r"tensor 'norm_inv_std' is missing", load_model, str(p), preset="lstm_a")
    sd = {**lstm.state_dict(), "norm_mean": torch.zeros(40), "norm_inv_std": torch.ones(40)}
    torch.save(sd, p)
    _error(r"tensor 'norm_mean' has shape \[40\], expected \[42\]", load_model, str(p), preset="lstm_a")


def test_save_is_atomic_and_readable(tmp_path, lstm):
    path = tmp_path / "m.safetensors"
    save_checkpoint(lstm, path, version="a")
    assert not (tmp_path / "m.safetensors.tmp").exists()
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # like any file we write (not the temp's 0600)
