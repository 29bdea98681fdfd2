"""Checkpoints: safetensors weights + a typed metadata header; torch state_dicts; presets.

A `.safetensors` checkpoint written by `save_checkpoint` holds the model's
`state_dict` tensors and, under the metadata key `hft_infer`, the JSON of a
`CheckpointHeader` (format version, model spec, normalisation constants, the
producer's version label, training info). Loading rebuilds the model from the
spec and validates every tensor against it; every problem is a
`CheckpointError` whose one-line message names the file and the tensor.

Expected tensor names (what a `.pt` state_dict from elsewhere must use):
  mlp:  layers.{i}.weight, layers.{i}.bias, head.weight, head.bias
  lstm: lstm.weight_ih_l{k}, lstm.weight_hh_l{k}, lstm.bias_ih_l{k}, lstm.bias_hh_l{k},
        head.weight, head.bias   (exactly torch.nn.LSTM(batch_first=True) + nn.Linear)
  optional in a .pt: norm_mean, norm_inv_std [F] (identity normalisation when absent).
"""

from __future__ import annotations

import hashlib
import os
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec
import torch

from hft_infer.models import build_model
from hft_infer.models.base import WindowModel
from hft_infer.models.spec import PRESETS, ModelSpec

FORMAT = "hft-infer-checkpoint"
FORMAT_VERSION = 1
META_KEY = "hft_infer"
BUILTIN_PREFIX = "builtin:"
NORM_KEYS = ("norm_mean", "norm_inv_std")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message is one line naming the file."""


class CheckpointHeader(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    version: str
    """The producer's label (e.g. 'default-1')."""
    spec: ModelSpec
    norm_mean: list[float]
    """Per-feature mean subtracted after preprocess (F values)."""
    norm_inv_std: list[float]
    """Per-feature 1/std multiplied after the mean (F values)."""
    extra: dict[str, Any] = {}
    """Training info: data config, seeds, held-out metrics."""


def weights_digest(model: WindowModel) -> str:
    """sha256 hex of the state_dict tensors (sorted by name, with dtype and shape) and the
    normalisation constants: the identity of what the model computes."""
    h = hashlib.sha256()
    tensors = dict(model.state_dict())
    tensors.update({"norm_mean": model.norm_mean, "norm_inv_std": model.norm_inv_std})
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def version_string(model: WindowModel) -> str:
    return f"{model.spec.name}@{weights_digest(model)[:8]}"


def save_checkpoint(model: WindowModel, path: str | os.PathLike, *, version: str,
                    extra: dict[str, Any] | None = None) -> str:
    """Write `model` as a .safetensors checkpoint (atomically); returns its version string."""
    from safetensors.torch import save_file

    header = CheckpointHeader(
        version=version, spec=model.spec,
        norm_mean=model.norm_mean.double().tolist(), norm_inv_std=model.norm_inv_std.double().tolist(),
        extra=extra or {},
    )
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={META_KEY: msgspec.json.encode(header).decode()})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # like any file we write: the library's temp file is 0600
    os.replace(tmp, path)
    return version_string(model)


def builtin_path(name: str) -> Path:
    return Path(str(resources.files("hft_infer.models").joinpath("weights", f"{name}.safetensors")))


def builtin_names() -> list[str]:
    folder = Path(str(resources.files("hft_infer.models").joinpath("weights")))
    return sorted(p.stem for p in folder.glob("*.safetensors")) if folder.is_dir() else []


def read_header(path: str | os.PathLike) -> CheckpointHeader:
    """The typed header of a .safetensors checkpoint (weights not loaded)."""
    from safetensors import SafetensorError, safe_open

    src = str(path)
    _check_readable(src)
    try:
        with safe_open(src, framework="pt") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{src}: not a safetensors file: {_one_line(e)}") from None
    return _parse_header(src, meta)


def load_model(checkpoint: str, *, preset: str = "", seed: int = 0, mode: str = "window"
               ) -> tuple[WindowModel, str]:
    """(model in eval mode, version string 'NAME@<8 hex of weights_digest>') for a model config's
    checkpoint: a .safetensors path, 'builtin:NAME', a .pt/.pth torch state_dict (needs
    `preset`), or '' (`preset` with weights drawn from `seed`)."""
    if mode not in ("window", "stream"):
        raise CheckpointError(f"model mode must be 'window' or 'stream', got {mode!r}")
    if checkpoint == "":
        if not preset:
            raise CheckpointError("model.checkpoint is empty and model.preset is not set: nothing to load")
        model = build_model(_preset_spec(preset, "model.preset"), seed)
    elif checkpoint.startswith(BUILTIN_PREFIX):
        name = checkpoint[len(BUILTIN_PREFIX):]
        path = builtin_path(name)
        if not path.is_file():
            have = ", ".join(builtin_names()) or "none"
            raise CheckpointError(f"{checkpoint}: no built-in checkpoint {name!r} (have: {have})")
        model = _load_safetensors(str(path), preset, label=checkpoint)
    elif checkpoint.endswith(".safetensors"):
        model = _load_safetensors(checkpoint, preset, label=checkpoint)
    elif checkpoint.endswith((".pt", ".pth")):
        model = _load_state_dict_file(checkpoint, preset)
    else:
        raise CheckpointError(f"{checkpoint}: unknown checkpoint type (expected .safetensors, .pt/.pth, "
                              f"builtin:NAME, or '' with a preset)")
    if mode == "stream" and model.spec.kind != "lstm":
        raise CheckpointError(f"{checkpoint or preset}: model {model.spec.name} is an mlp; "
                              f"mode 'stream' needs an lstm")
    return model.eval(), version_string(model)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _check_readable(src: str) -> None:
    if not os.path.exists(src):
        raise CheckpointError(f"{src}: cannot read: no such file")
    if not os.path.isfile(src):
        raise CheckpointError(f"{src}: cannot read: not a file")
    if not os.access(src, os.R_OK):
        raise CheckpointError(f"{src}: cannot read: permission denied")


def _preset_spec(name: str, what: str) -> ModelSpec:
    try:
        return PRESETS[name]
    except KeyError:
        raise CheckpointError(f"{what}: unknown preset {name!r} (known: {', '.join(PRESETS)})") from None


def _parse_header(src: str, meta: dict[str, str]) -> CheckpointHeader:
    raw = meta.get(META_KEY)
    if raw is None:
        raise CheckpointError(f"{src}: bad header: no {META_KEY!r} metadata (not written by save_checkpoint; "
                              f"load plain weights as a .pt state_dict with model.preset)")
    try:
        fmt = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise CheckpointError(f"{src}: bad header: {_one_line(e)}") from None
    if not isinstance(fmt, dict) or fmt.get("format") != FORMAT:
        raise CheckpointError(f"{src}: bad header: format is not {FORMAT!r}")
    if fmt.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{src}: bad header: format_version {fmt.get('format_version')!r} is not "
                              f"supported (this build reads {FORMAT_VERSION})")
    try:
        return msgspec.convert(fmt, type=CheckpointHeader)
    except msgspec.ValidationError as e:
        raise CheckpointError(f"{src}: bad header: {_one_line(e)}") from None


def _check_preset(src: str, spec: ModelSpec, preset: str) -> None:
    if preset and preset != spec.name:
        _preset_spec(preset, "model.preset")
        raise CheckpointError(f"{src}: holds a {spec.name!r} model but model.preset is {preset!r} "
                              f"(leave model.preset empty to use the checkpoint's)")


def _load_safetensors(src: str, preset: str, label: str) -> WindowModel:
    from safetensors import SafetensorError, safe_open

    _check_readable(src)
    try:
        with safe_open(src, framework="pt") as f:
            header = _parse_header(label, f.metadata() or {})
            _check_preset(label, header.spec, preset)
            model = build_model(header.spec, 0)
            expected = model.state_dict()
            _check_names(label, expected, set(f.keys()))
            tensors = {}
            for name, ref in expected.items():
                sl = f.get_slice(name)
                _check_tensor(label, name, ref, tuple(sl.get_shape()), _safetensors_dtype(sl.get_dtype()))
                tensors[name] = f.get_tensor(name)
    except SafetensorError as e:
        raise CheckpointError(f"{label}: not a safetensors file: {_one_line(e)}") from None
    model.load_state_dict(tensors, strict=True)
    _set_norm(label, model, header.norm_mean, header.norm_inv_std)
    return model


def _load_state_dict_file(src: str, preset: str) -> WindowModel:
    if not preset:
        raise CheckpointError(f"{src}: a torch state_dict does not carry its model config: set model.preset")
    spec = _preset_spec(preset, "model.preset")
    _check_readable(src)
    try:
        state = torch.load(src, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many types for a bad file; all mean the same here
        raise CheckpointError(f"{src}: not a torch state_dict file: {_one_line(e)}") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        hint = " (it looks like a training checkpoint: save model.state_dict() alone)" \
            if isinstance(state, dict) and "state_dict" in state else ""
        raise CheckpointError(f"{src}: not a state_dict (a mapping of names to tensors){hint}")
    state = dict(state)
    norm = {k: state.pop(k) for k in NORM_KEYS if k in state}
    model = build_model(spec, 0)
    expected = model.state_dict()
    _check_names(src, expected, set(state))
    for name, ref in expected.items():
        t = state[name]
        _check_tensor(src, name, ref, tuple(t.shape), t.dtype)
    model.load_state_dict(state, strict=True)
    if norm:
        if len(norm) != 2:
            missing = next(k for k in NORM_KEYS if k not in norm)
            raise CheckpointError(f"{src}: tensor {missing!r} is missing (norm_mean and norm_inv_std come together)")
        for name in NORM_KEYS:
            _check_tensor(src, name, getattr(model, name), tuple(norm[name].shape), norm[name].dtype)
        _set_norm(src, model, norm["norm_mean"], norm["norm_inv_std"])
    return model


def _check_names(src: str, expected: dict[str, torch.Tensor], present: set[str]) -> None:
    for name in expected:
        if name not in present:
            raise CheckpointError(f"{src}: tensor {name!r} is missing")
    for name in sorted(present):
        if name not in expected:
            raise CheckpointError(f"{src}: tensor {name!r} is unexpected for this model")


def _check_tensor(src: str, name: str, ref: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype | None) -> None:
    if shape != tuple(ref.shape):
        raise CheckpointError(f"{src}: tensor {name!r} has shape {list(shape)}, expected {list(ref.shape)}")
    if dtype != ref.dtype:
        raise CheckpointError(f"{src}: tensor {name!r} has dtype {_dtype_name(dtype)}, "
                              f"expected {_dtype_name(ref.dtype)}")


_ST_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
              "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
              "U8": torch.uint8, "BOOL": torch.bool}


def _safetensors_dtype(name: str) -> torch.dtype | None:
    return _ST_DTYPES.get(name)


def _dtype_name(dtype: torch.dtype | None) -> str:
    return "unknown" if dtype is None else str(dtype).removeprefix("torch.")


def _set_norm(src: str, model: WindowModel, mean: Any, inv_std: Any) -> None:
    f = model.spec.features
    mean = torch.as_tensor(mean, dtype=model.spec.torch_dtype)
    inv_std = torch.as_tensor(inv_std, dtype=model.spec.torch_dtype)
    for name, t in (("norm_mean", mean), ("norm_inv_std", inv_std)):
        if tuple(t.shape) != (f,):
            raise CheckpointError(f"{src}: {name} has shape {list(t.shape)}, expected [{f}]")
        if not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{src}: {name} has non-finite values")
    model.set_normalisation(mean, inv_std)
