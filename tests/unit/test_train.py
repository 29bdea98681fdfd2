"""`hft-infer train`: the shipped default is exactly what the command writes; training is
deterministic; bad arguments are one-line errors. (Training on LOBSTER files and captures,
then serving and verifying the result: tests/integration/test_train_serve.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hft_infer.app.cli import main as cli_main
from hft_infer.app.train_cmd import DEFAULT_COMMAND
from hft_infer.models.checkpoint import builtin_path, load_model, read_header
from hft_infer.models.training import cpu_model


def test_the_shipped_default_is_what_the_training_command_writes(tmp_path):
    """CI's configuration (CPU torch 2.13.0, the CPU model the header names; the command fixes its
    own thread count) reproduces the shipped file byte for byte: weights, normalisation and header
    (recipe, data, held-out metrics)."""
    shipped = builtin_path("default")
    header = read_header(shipped)
    if header.extra["torch"] != str(torch.__version__):
        pytest.skip(f"the default was trained with torch {header.extra['torch']}, this is {torch.__version__}: "
                    "float results may differ between torch versions")
    if header.extra.get("cpu") != cpu_model():
        pytest.skip(f"the default was trained on {header.extra.get('cpu', 'another CPU')}, this is {cpu_model()}: "
                    "float results differ between CPUs (this CPU: test_training_is_deterministic_and_follows_its_seed)")
    out = tmp_path / "default.safetensors"
    assert cli_main(["train", *DEFAULT_COMMAND, "--quiet", "--out", str(out)]) == 0
    if out.read_bytes() != shipped.read_bytes():
        got, _ = load_model(str(out))
        want, _ = load_model("builtin:default")
        diffs = {k: float((v - want.state_dict()[k]).abs().max()) for k, v in got.state_dict().items()}
        raise AssertionError(f"retrained default differs from the shipped one: max |diff| per tensor {diffs}; "
                             "regenerate with `python tools/train_default.py` (on CI's configuration)")
    assert header.version == "default-2" and header.extra["threads"] == 1


def _train(tmp_path, name, *extra):
    out = tmp_path / f"{name}.safetensors"
    assert cli_main(["train", "synthetic", "--events", "6000", "--heldout-events", "3000", "--epochs", "1",
                     "--batch", "256", "--quiet", "--out", str(out), *extra]) == 0
    return out


def test_training_is_deterministic_and_follows_its_seed(tmp_path, capsys):
    a = _train(tmp_path, "a")
    b = _train(tmp_path, "b")
    c = _train(tmp_path, "c", "--seed", "8")
    assert a.read_bytes() == b.read_bytes() and a.read_bytes() != c.read_bytes()
    printed = capsys.readouterr().out
    assert "| model |" in printed and "| imbalance_sign |" in printed and "wrote" in printed
    extra = read_header(a).extra
    assert extra["data"]["train_events"] == 6000 and extra["epochs"] == 1
    assert 0.0 < extra["heldout_metrics"]["model"]["accuracy"] < 1.0


def test_a_spec_trains_an_lstm(tmp_path):
    spec = '{"name": "tiny_lstm", "kind": "lstm", "window": 8, "hidden": [16]}'
    out = _train(tmp_path, "lstm", "--spec", spec)
    model, version = load_model(str(out))
    assert model.spec.kind == "lstm" and model.spec.window == 8 and version.startswith("tiny_lstm@")


@pytest.mark.parametrize("args,message", [
    (["synthetic", "--out", "x.pt"], "is a .safetensors file"),
    (["synthetic", "--out", "/no/such/dir/x.safetensors"], "does not exist"),
    (["synthetic", "--spec", "{\"kind\": \"cnn\"}", "--out", "x.safetensors"], "--spec:"),
    (["synthetic", "--preset", "huge", "--out", "x.safetensors"], "--preset: unknown model preset 'huge'"),
    (["nowhere_message_1.csv", "--out", "x.safetensors"], "nowhere_message_1.csv"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, args, message):
    r = subprocess.run([sys.executable, "-m", "hft_infer", "train", *args], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
