"""Held-out metrics of a model against naive predictors (offline: training and tests).

Task: the sign of the instrument's mid move over its next `horizon` events,
3 classes (down / flat / up, flat within a dead zone). Two numbers per
predictor:

* accuracy: predicted class == label, over all labelled events;
* auc: ROC AUC of the score for up vs down, over the events whose label is not
  flat (a constant score gets 0.5).

Naive predictors: always-flat; last-move persistence (the sign of the
instrument's latest mid change); imbalance sign (level-0 size imbalance; its
value is the score for the AUC). The model predicts argmax of its logits and
scores softmax[up] - softmax[down].
"""

from __future__ import annotations

import numpy as np
import torch

from hft_infer.models import dataset as ds
from hft_infer.models.base import WindowModel, scores_from_logits

PREDICTORS = ("model", "always_flat", "last_move", "imbalance_sign")


def roc_auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Mann-Whitney ROC AUC with average ranks for ties (0.5 for a constant score)."""
    scores = np.asarray(scores, dtype=np.float64)
    positive = np.asarray(positive, dtype=bool)
    n_pos = int(positive.sum())
    n_neg = positive.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC needs both classes")
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(scores.size)
    ranks[order] = np.arange(1, scores.size + 1)
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.bincount(inverse, weights=ranks) / counts)[inverse]
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def window_logits(model: WindowModel, rows: np.ndarray, index: np.ndarray, chunk: int = 8192) -> torch.Tensor:
    """Logits [M, 3] of the model over windows `index` [M, W] (oldest first) into
    `np.concatenate([rows, zero_row])`: the zero raw row stands for the missing rows before
    an instrument's first (MLP semantics). Features are per-row, so each row is
    preprocessed and normalised once (`model.features`) and the windows are gathered
    after: the same numbers as `forward_window` on each raw window, W times cheaper."""
    raw = torch.from_numpy(np.concatenate([rows, np.zeros((1, rows.shape[1]), dtype=np.float32)]))
    idx = torch.from_numpy(index)
    out = []
    with torch.inference_mode():
        feats = model.features(raw)
        for s in range(0, idx.shape[0], chunk):
            part = idx[s: s + chunk]
            x = feats.index_select(0, part.reshape(-1)).view(part.shape[0], part.shape[1], -1)
            out.append(model.logits(x))
    return torch.cat(out) if out else torch.empty(0, model.spec.outputs, dtype=model.spec.torch_dtype)


def evaluate(model: WindowModel, events: np.ndarray, *, horizon: int, dead_zone_ticks: float, tick: float
             ) -> dict[str, dict[str, float]]:
    """{predictor: {"accuracy": .., "auc": ..}} plus {"labels": {class frequencies, n}} on `events`."""
    if events.shape[0] == 0:
        nan = {"accuracy": float("nan"), "auc": float("nan")}
        return {**{name: dict(nan) for name in PREDICTORS},
                "labels": {"n": 0.0, "down": float("nan"), "flat": float("nan"), "up": float("nan")}}
    rows = ds.raw_rows(events, model.spec.levels)
    labels, valid = ds.future_move_labels(events, rows, horizon, dead_zone_ticks, tick)
    index, _ = ds.window_index(events, model.spec.window)
    logits = window_logits(model, rows, index[valid])
    model_score = scores_from_logits(logits).double().numpy()
    model_class = logits.argmax(dim=1).numpy()
    y = labels[valid]
    last = ds.last_move_sign(events, rows)[valid]
    imb = ds.level0_imbalance(rows)[valid]
    preds = {
        "model": (model_class, model_score),
        "always_flat": (np.full(y.shape, ds.FLAT), np.zeros(y.shape)),
        "last_move": (np.sign(last).astype(np.int64) + 1, last),
        "imbalance_sign": (np.sign(imb).astype(np.int64) + 1, imb),
    }
    directional = y != ds.FLAT
    result: dict[str, dict[str, float]] = {}
    both = y.size > 0 and 0 < int((y[directional] == ds.UP).sum()) < int(directional.sum())
    for name, (cls, score) in preds.items():
        result[name] = {  # NaN where the held-out data cannot score it (no labels; no up or no down label)
            "accuracy": float(np.mean(cls == y)) if y.size else float("nan"),
            "auc": roc_auc(score[directional], y[directional] == ds.UP) if both else float("nan"),
        }
    freq = np.bincount(y, minlength=3) / max(y.size, 1)
    result["labels"] = {"n": float(y.size), "down": float(freq[0]), "flat": float(freq[1]), "up": float(freq[2])}
    return result


def format_table(metrics: dict[str, dict[str, float]]) -> str:
    lines = ["| predictor | accuracy | AUC (up vs down) |", "| --- | ---: | ---: |"]
    for name in PREDICTORS:
        m = metrics[name]
        lines.append(f"| {name} | {m['accuracy']:.4f} | {m['auc']:.4f} |")
    lab = metrics["labels"]
    lines.append(f"\nlabels: n={int(lab['n'])}, down {lab['down']:.3f}, flat {lab['flat']:.3f}, up {lab['up']:.3f}")
    return "\n".join(lines)
