"""Bring your own torch model: `model.module` names an `nn.Module` that the service serves.

What the module is given and must return (the contract):

    input   float32 [B, W, F]: for each decision the instrument's last W rows, oldest first;
            F = 4 * levels + 2 (models/features.py documents every column). With
            `model.input = "features"` (default) each row is the built-in feature row
            (`features.preprocess`: prices in basis points from the mid, sizes as log1p,
            the signed trade size); with "raw" it is the raw row as the ingest wrote it
            (prices, sizes). Rows before an instrument's first are all-zero rows (the
            features of a zero raw row are zeros too), so the shape never changes.
    output  [B, 3] logits, float: down, flat, up. The service scores them as
            softmax[up] - softmax[down] and applies the decision policy, as for the
            built-in models.

The module must be a function of its window alone (no state between calls; it is
put in eval mode): the CPU engine may conflate triggers, the GPU engine replays
one captured CUDA graph per batch bucket, and `replay --verify` recomputes every
decided event's score offline from its window. Custom row layouts: the ingest
writes the built-in raw row (vectorised, no per-event Python); a model that wants
other columns derives them from the raw row inside its forward (`input = "raw"`).

Where it comes from (`model.module`):

    "package.module:factory"      imported; factory(**model.module_args) -> nn.Module
    "path/to/file.py:factory"     the file imported as a module, then as above
    "model.pt"                    a TorchScript file (torch.jit.save)
    "model.pt2"                   a torch.export file (torch.export.save); export it with a
                                  dynamic batch dimension

At load the module is run on dummy windows of batch 1 and 3 and its output shape
checked; every problem is a `CustomModelError` with one line naming the module.
The version string is `NAME@<first 8 hex of sha256>` over the module's state_dict
(names, dtypes, shapes, bytes) and the declared window, levels and input.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hft_infer.models.base import scores_from_logits, scores_into
from hft_infer.models.executor import Executor
from hft_infer.models.features import preprocess, row_width
from hft_infer.models.spec import OUTPUTS
from hft_infer.models.torch_executors import as_tensors, window_rows
from hft_infer.runner.base import EngineFailure

INPUTS = ("features", "raw")
CHECK_BATCHES = (1, 3)


class CustomModelError(ValueError):
    """A `model.module` that cannot be served; the message is one line naming it."""


@dataclass(frozen=True)
class CustomSpec:
    """What the runtime reads of a model's spec (models/spec.py's ModelSpec has the same names)."""

    name: str
    window: int
    levels: int
    input: str = "features"
    kind: str = "custom"
    outputs: int = OUTPUTS
    dtype: str = "float32"

    @property
    def features(self) -> int:
        return row_width(self.levels)

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.float32


class CustomModel(nn.Module):
    """A user's module behind the interface the executors and `replay --verify` use:
    `features(raw rows)` per row, `logits(windows)`, `forward_window(raw windows) -> scores`."""

    def __init__(self, net: nn.Module, spec: CustomSpec, source: str) -> None:
        super().__init__()
        self.net = net
        self.spec = spec
        self.source = source

    def features(self, raw: torch.Tensor) -> torch.Tensor:
        raw = raw.to(torch.float32)
        return preprocess(raw, self.spec.levels) if self.spec.input == "features" else raw

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def forward_window(self, raw: torch.Tensor) -> torch.Tensor:
        return scores_from_logits(self.logits(self.features(raw)).float())

    def forward(self, raw: torch.Tensor) -> torch.Tensor:
        return self.forward_window(raw)


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]


def _import_target(target: str, what: str):
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise CustomModelError(f"{what}: no such file {target}")
        name = f"hft_infer_user_{re.sub(r'[^A-Za-z0-9_]', '_', path.stem)}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise CustomModelError(f"{what}: cannot import {target} as a Python file")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses and pickling look their module up here
        try:
            spec.loader.exec_module(mod)
        except Exception as e:  # noqa: BLE001 - whatever the user's file raises is reported in one line
            sys.modules.pop(name, None)
            raise CustomModelError(f"{what}: importing {target} failed: {_one_line(e)}") from None
        return mod
    try:
        return importlib.import_module(target)
    except Exception as e:  # noqa: BLE001 - ModuleNotFoundError, or anything the module raises at import
        raise CustomModelError(f"{what}: cannot import module {target!r}: {_one_line(e)}") from None


def _from_factory(module: str, args: dict[str, Any], what: str) -> tuple[nn.Module, str]:
    target, sep, factory = module.rpartition(":")
    if not sep or not target or not factory.isidentifier():
        raise CustomModelError(f"{what}: expected 'package.module:factory', 'path/to/file.py:factory', "
                               f"a TorchScript .pt or a torch.export .pt2 file")
    mod = _import_target(target, what)
    fn = getattr(mod, factory, None)
    if fn is None:
        raise CustomModelError(f"{what}: {target} has no attribute {factory!r}")
    if not callable(fn):
        raise CustomModelError(f"{what}: {target}:{factory} is not callable")
    try:
        net = fn(**args)
    except Exception as e:  # noqa: BLE001 - the user's factory: one line, not a traceback
        raise CustomModelError(f"{what}: {factory}(**module_args) raised {_one_line(e)}") from None
    return net, factory


def _from_file(path: str, what: str) -> tuple[nn.Module, str]:
    if not Path(path).is_file():
        raise CustomModelError(f"{what}: no such file {path}")
    try:
        if path.endswith(".pt2"):
            net = torch.export.load(path).module()
        else:
            net = torch.jit.load(path, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - torch raises many types for a bad file; all mean the same here
        kind = "torch.export" if path.endswith(".pt2") else "TorchScript"
        raise CustomModelError(f"{what}: not a {kind} file: {_one_line(e)}") from None
    return net, Path(path).stem


def check_output(net: nn.Module, spec: CustomSpec, what: str, device: str | torch.device = "cpu") -> None:
    """Run the module on zero windows of CHECK_BATCHES rows; CustomModelError unless each
    gives finite float logits [B, 3]."""
    for b in CHECK_BATCHES:
        x = torch.zeros(b, spec.window, spec.features, dtype=torch.float32, device=device)
        try:
            with torch.inference_mode():
                out = net(x)
        except Exception as e:  # noqa: BLE001 - a forward that fails on the declared shape
            raise CustomModelError(f"{what}: forward on a [{b}, {spec.window}, {spec.features}] window "
                                   f"(model.window, 4 * model.levels + 2) raised {_one_line(e)}") from None
        if not isinstance(out, torch.Tensor):
            raise CustomModelError(f"{what}: forward returned {type(out).__name__}, expected a tensor of "
                                   f"logits [B, 3]")
        if tuple(out.shape) != (b, OUTPUTS):
            raise CustomModelError(f"{what}: forward on a [{b}, {spec.window}, {spec.features}] window "
                                   f"returned shape {list(out.shape)}, expected [{b}, {OUTPUTS}] "
                                   f"(logits: down, flat, up)")
        if not out.is_floating_point():
            raise CustomModelError(f"{what}: forward returned dtype {out.dtype}, expected float logits")
        if not bool(torch.isfinite(out).all()):
            raise CustomModelError(f"{what}: forward on a zero window returned non-finite logits")


def digest(net: nn.Module, spec: CustomSpec) -> str:
    h = hashlib.sha256(f"{spec.window}|{spec.levels}|{spec.input}|".encode())
    state = net.state_dict()
    for name in sorted(state):
        t = state[name].detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def load_custom(module: str, *, window: int, levels: int, input: str = "features",
                args: dict[str, Any] | None = None) -> tuple[CustomModel, str]:
    """(CustomModel in eval mode on the CPU, version string) for a `model.module` value."""
    what = f"model.module {module!r}"
    if input not in INPUTS:
        raise CustomModelError(f"{what}: model.input must be one of {INPUTS}, got {input!r}")
    if module.endswith((".pt", ".pt2")):
        if args:
            raise CustomModelError(f"{what}: model.module_args apply to a factory, not to a saved file")
        net, name = _from_file(module, what)
    else:
        net, name = _from_factory(module, dict(args or {}), what)
    if not isinstance(net, nn.Module):
        raise CustomModelError(f"{what}: the factory returned {type(net).__name__}, expected a torch.nn.Module")
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64] or "custom"
    spec = CustomSpec(name=name, window=window, levels=levels, input=input)
    try:
        net = net.eval()
    except Exception:  # noqa: BLE001 - an exported GraphModule refuses eval(); it is traced in eval already
        pass
    check_output(net, spec, what)
    model = CustomModel(net, spec, module)
    return model, f"{name}@{digest(net, spec)[:8]}"


class CustomExecutor(Executor):
    """CPU step of a custom module: gather each trigger's window [n, W, F] from the ring
    (missing rows zero), transform the rows (`model.input`), run the module under
    inference_mode on a preallocated input, score the logits. Stateless: triggers may be
    conflated. A forward that raises mid-stream is an EngineFailure (the service answers
    what is pending, says why in its final Status and exits non-zero)."""

    stateful = False
    backend = "torch"

    def __init__(self, model: CustomModel, ring, max_batch: int) -> None:
        self.ring_rows = model.spec.window
        super().__init__(model, ring, max_batch)
        w, f = self.window, self.width
        self._ring_flat = self.ring.view(self.n_slots * self.ring_len, f)
        self._offsets = torch.arange(-w + 1, 1, dtype=torch.int64)
        self._idx = torch.empty(max_batch, w, dtype=torch.int64)
        self._base = torch.empty(max_batch, dtype=torch.int64)
        self._mask = torch.empty(max_batch, w, dtype=torch.bool)
        self._rows = torch.empty(max_batch * w, f, dtype=torch.float32)
        self._x = torch.empty(max_batch, w, f, dtype=torch.float32)
        self._logits = torch.empty(max_batch, OUTPUTS, dtype=torch.float32)
        self._sums = torch.empty(max_batch, 1, dtype=torch.float32)
        self.net = model.net

    @torch.inference_mode()
    def step(self, slots, positions, out) -> None:
        slots, positions, out = as_tensors(slots, positions, out)
        n = self._check_batch(slots)
        rows = window_rows(self, slots, positions, n)
        x = self._x[:n]
        x.copy_(self.model.features(rows))
        logits = self._logits[:n]
        try:
            logits.copy_(self.net(x))
        except Exception as e:  # noqa: BLE001 - the user's forward failed mid-stream: fatal, in one line
            raise EngineFailure(f"model.module {self.model.source!r}: forward on a batch of {n} raised "
                                f"{_one_line(e)}") from None
        scores_into(logits, out, self._sums[:n])


def load_configured(mcfg) -> tuple[Any, str]:
    """(model, version) for a config's `[model]` section (config.ModelConfig): the custom module
    when `module` is set, else the checkpoint or preset (checkpoint.load_model). Raises
    CustomModelError or CheckpointError (both ValueErrors with one-line messages)."""
    if mcfg.module:
        if mcfg.mode != "window":
            raise CustomModelError(f"model.module {mcfg.module!r}: a custom module is a window model; "
                                   f"model.mode must be \"window\", got {mcfg.mode!r}")
        return load_custom(mcfg.module, window=mcfg.window, levels=mcfg.levels, input=mcfg.input,
                           args=mcfg.module_args)
    from hft_infer.models.checkpoint import load_model

    return load_model(mcfg.checkpoint, preset=mcfg.preset, seed=mcfg.seed, mode=mcfg.mode)
