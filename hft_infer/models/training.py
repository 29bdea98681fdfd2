"""Training a built-in model on an event table: labels, the loop, the held-out split.

Offline (`hft-infer train`, app/train_cmd.py; the tests). Task: from an
instrument's last W raw rows predict the sign of its mid move over its next
`horizon` events (down / flat / up; a move of at most `dead_zone_ticks` ticks
is flat), as `models.dataset.future_move_labels` defines it. Normalisation
constants come from the training rows (per feature mean and 1/std after
`features.preprocess`). AdamW with a one-cycle learning rate, cross-entropy.

Deterministic: for a given torch version, thread count (set here, from the
recipe) and input, the weights are the same bits: fixed seeds (model init,
shuffling), deterministic algorithms, no data-dependent thread use. Nothing
run-dependent (times, host names) goes into the returned info.
"""

from __future__ import annotations

import contextlib
import platform
from typing import Annotated, Callable

import msgspec
import numpy as np
import torch
from msgspec import Meta

from hft_infer.models import build_model, dataset as ds
from hft_infer.models.base import WindowModel
from hft_infer.models.features import preprocess
from hft_infer.models.spec import ModelSpec


class Recipe(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    horizon_events: Annotated[int, Meta(ge=1)] = 10
    """Label: the mid move over the instrument's next this many events."""
    dead_zone_ticks: Annotated[float, Meta(ge=0)] = 0.5
    """A move of at most this many ticks is flat."""
    tick: Annotated[float, Meta(gt=0)] = 0.01
    """Price tick of the data (the dead zone's unit)."""
    seed: int = 7
    """Model init and shuffling."""
    threads: Annotated[int, Meta(ge=1)] = 1
    """torch intra-op threads while training: CPU reductions depend on it, so it is part of the recipe."""
    epochs: Annotated[int, Meta(ge=1)] = 3
    batch: Annotated[int, Meta(ge=1)] = 1024
    lr: Annotated[float, Meta(gt=0)] = 3e-3
    """Peak learning rate of the one-cycle schedule."""
    weight_decay: Annotated[float, Meta(ge=0)] = 1e-4


class TrainingError(ValueError):
    """Data that cannot train a model (no labelled window); one line."""


Progress = Callable[[int, int, float], None]
"""progress(step, total_steps, mean loss of the epoch so far)."""


def normalisation(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = features.mean(dim=0)
    std = features.std(dim=0) if features.shape[0] > 1 else torch.zeros_like(mean)
    # A constant feature (std ~ 0) passes through centred, not blown up.
    inv_std = torch.where(std > 1e-6, 1.0 / std.clamp_min(1e-6), torch.ones_like(std))
    return mean, inv_std


def labelled_windows(events: np.ndarray, spec: ModelSpec, recipe: Recipe
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(raw rows [N, F], window index [M, W] into rows + a zero pad row, labels [M]) of the
    labelled events of the table. MLP: every labelled event (missing rows are the zero pad
    row, as the MLP is served). LSTM: only full windows (served, a window at an instrument's
    start is shorter, from a zero state: models/lstm.py)."""
    rows = ds.raw_rows(events, spec.levels)
    labels, valid = ds.future_move_labels(events, rows, recipe.horizon_events, recipe.dead_zone_ticks, recipe.tick)
    index, pad = ds.window_index(events, spec.window)
    if spec.kind == "lstm":
        valid &= (index != pad).all(axis=1)
    return rows, index[valid], labels[valid]


def split_by_time(events: np.ndarray, heldout_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out): the table's first 1 - fraction of events and the rest (time order,
    every instrument across the cut; nothing of the held-out part is seen in training)."""
    if not 0.0 < heldout_fraction < 1.0:
        raise TrainingError(f"held-out fraction must be in (0, 1), got {heldout_fraction}")
    cut = int(round(events.shape[0] * (1.0 - heldout_fraction)))
    return events[:cut], events[cut:]


@contextlib.contextmanager
def recipe_threads(recipe: Recipe):
    """The recipe's torch threads and deterministic algorithms inside; the caller's threads,
    determinism setting and global RNG as they were after. Everything whose floats go into a
    checkpoint runs inside (training and the held-out metrics of its header): CPU reductions
    depend on the thread count, and a caller's may be anything (a test process, the service's)."""
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    rng = torch.random.get_rng_state()
    torch.set_num_threads(recipe.threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
        torch.random.set_rng_state(rng)


def train(events: np.ndarray, spec: ModelSpec, recipe: Recipe, progress: Progress | None = None
          ) -> WindowModel:
    """A model of `spec` trained on the table's labelled windows (eval mode on return)."""
    with recipe_threads(recipe):
        return _train(events, spec, recipe, progress)


def _train(events: np.ndarray, spec: ModelSpec, recipe: Recipe, progress: Progress | None) -> WindowModel:
    rows, index, labels = labelled_windows(events, spec, recipe)
    if labels.shape[0] == 0:
        raise TrainingError(f"no labelled window in {events.shape[0]} events (a label needs the instrument's "
                            f"event {recipe.horizon_events} ahead and a book at both ends: lower --horizon "
                            f"or give more data)")
    torch.manual_seed(recipe.seed)
    model = build_model(spec, recipe.seed)
    # Preprocess every row once (rows are independent), then gather windows per batch.
    raw = torch.from_numpy(np.concatenate([rows, np.zeros((1, rows.shape[1]), np.float32)])).to(spec.torch_dtype)
    feats = preprocess(raw, spec.levels)
    mean, inv_std = normalisation(feats[:-1])
    model.set_normalisation(mean, inv_std)
    feats = (feats - mean) * inv_std
    sample_idx = torch.from_numpy(index)
    y = torch.from_numpy(labels)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    per_epoch = -(-y.shape[0] // recipe.batch)
    steps = recipe.epochs * per_epoch
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=recipe.lr, total_steps=steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(recipe.seed)
    loss_fn = torch.nn.CrossEntropyLoss()
    step = 0
    for _ in range(recipe.epochs):
        perm = torch.randperm(y.shape[0], generator=gen)
        total, count = 0.0, 0
        for s in range(0, perm.shape[0], recipe.batch):
            b = perm[s: s + recipe.batch]
            x = feats.index_select(0, sample_idx[b].view(-1)).view(b.shape[0], spec.window, -1)
            loss = loss_fn(model.logits(x), y[b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * b.shape[0]
            count += b.shape[0]
            step += 1
            if progress is not None:
                progress(step, steps, total / count)
    return model.eval()


def cpu_model() -> str:
    """The CPU the float results depend on: its model name and torch's kernel capability. The
    same torch build gives different weights on different CPUs (measured: the shipped default
    retrained on an Intel Xeon differed from the AMD EPYC's by up to 0.13 after 3 epochs, both
    AVX512: the BLAS takes other code paths), so a byte-for-byte retrain needs this CPU too."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name} ({torch.backends.cpu.get_cpu_capability()})"


def info_of(spec: ModelSpec, recipe: Recipe, data: dict) -> dict:
    """The checkpoint header's `extra`: the recipe, the data description, the torch version and
    the CPU that trained it."""
    return {"preset": spec.name, **msgspec.to_builtins(recipe), "data": data, "torch": str(torch.__version__),
            "cpu": cpu_model()}
