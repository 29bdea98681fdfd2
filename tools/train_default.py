#!/usr/bin/env python3
"""Train the default model shipped in the package (hft_infer/models/weights/default.safetensors).

    python tools/train_default.py                 # writes the shipped weights, prints the metrics
    python tools/train_default.py --out /tmp/x.safetensors

Task: from the last W=32 raw rows of an instrument (mlp_small), predict the sign
of its mid move over its next HORIZON events (down / flat / up; a move within
DEAD_ZONE_TICKS is flat), on the synthetic generator's data. Normalisation
constants come from the training rows. Deterministic: fixed seeds, fixed
thread count, deterministic algorithms; about a minute on 2 CPU cores.
Held-out metrics (a different generator seed) against naive predictors go
to stdout and into the checkpoint header, where a test reads them back.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import msgspec
import numpy as np
import torch

from hft_infer.models import build_model, dataset as ds, preset
from hft_infer.models.checkpoint import builtin_path, save_checkpoint
from hft_infer.models.evaluation import PREDICTORS, evaluate, format_table
from hft_infer.models.features import preprocess
from hft_infer.replay.synthetic import SyntheticConfig, generate

PRESET = "mlp_small"
HORIZON = 10
DEAD_ZONE_TICKS = 0.5
TRAIN_DATA = SyntheticConfig(seed=101)
TRAIN_EVENTS = 300_000
HELDOUT_DATA = SyntheticConfig(seed=202)
HELDOUT_EVENTS = 200_000
SEED = 7
THREADS = 1  # fixed: CPU matmul reductions depend on the thread count; one thread also
# beats two on a busy 2-core machine (OpenMP barriers wait on preempted threads)
EPOCHS = 3
BATCH = 1024
LR = 3e-3
WEIGHT_DECAY = 1e-4
VERSION = "default-1"


def normalisation(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = features.mean(dim=0)
    std = features.std(dim=0)
    # A constant feature (std ~ 0) passes through centred, not blown up.
    inv_std = torch.where(std > 1e-6, 1.0 / std.clamp_min(1e-6), torch.ones_like(std))
    return mean, inv_std


def train(log=print) -> tuple[torch.nn.Module, dict]:
    torch.manual_seed(SEED)
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    spec = preset(PRESET)
    t0 = time.perf_counter()
    events = generate(TRAIN_EVENTS, TRAIN_DATA)
    rows = ds.raw_rows(events, spec.levels)
    labels, valid = ds.future_move_labels(events, rows, HORIZON, DEAD_ZONE_TICKS, TRAIN_DATA.tick)
    index, pad = ds.window_index(events, spec.window)
    log(f"data: {TRAIN_EVENTS} events, {int(valid.sum())} labelled windows ({time.perf_counter() - t0:.1f} s)")

    model = build_model(spec, SEED)
    # Preprocess every row once (rows are independent), then gather windows per batch.
    raw = torch.from_numpy(np.concatenate([rows, np.zeros((1, rows.shape[1]), np.float32)]))
    feats = preprocess(raw, spec.levels)
    mean, inv_std = normalisation(feats[:-1])
    model.set_normalisation(mean, inv_std)
    feats = (feats - mean) * inv_std
    sample_idx = torch.from_numpy(index[valid])
    y = torch.from_numpy(labels[valid])

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    steps = EPOCHS * (-(-y.shape[0] // BATCH))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(SEED)
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(EPOCHS):
        perm = torch.randperm(y.shape[0], generator=gen)
        total, count = 0.0, 0
        for s in range(0, perm.shape[0], BATCH):
            b = perm[s: s + BATCH]
            x = feats.index_select(0, sample_idx[b].view(-1)).view(b.shape[0], spec.window, -1)
            logits = model.logits(x)
            loss = loss_fn(logits, y[b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * b.shape[0]
            count += b.shape[0]
        log(f"epoch {epoch + 1}/{EPOCHS}: loss {total / count:.4f} ({time.perf_counter() - t0:.1f} s)")
    model.eval()
    info = {
        "preset": PRESET, "horizon_events": HORIZON, "dead_zone_ticks": DEAD_ZONE_TICKS,
        "train_data": msgspec.to_builtins(TRAIN_DATA), "train_events": TRAIN_EVENTS,
        "heldout_data": msgspec.to_builtins(HELDOUT_DATA), "heldout_events": HELDOUT_EVENTS,
        "seed": SEED, "threads": THREADS, "epochs": EPOCHS, "batch": BATCH, "lr": LR,
        "weight_decay": WEIGHT_DECAY, "torch": str(torch.__version__),
    }
    return model, info


def heldout_metrics(model: torch.nn.Module, info: dict) -> dict:
    data = msgspec.convert(info["heldout_data"], type=SyntheticConfig)
    events = generate(info["heldout_events"], data)
    return evaluate(model, events, horizon=info["horizon_events"], dead_zone_ticks=info["dead_zone_ticks"],
                    tick=data.tick)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=builtin_path("default"),
                   help="checkpoint to write (default: the shipped builtin:default)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    model, info = train()
    metrics = heldout_metrics(model, info)
    print(f"\nheld-out ({info['heldout_events']} events, seed {info['heldout_data']['seed']}, "
          f"horizon {HORIZON} events):")
    print(format_table(metrics))
    beaten = [n for n in PREDICTORS[1:] for k in ("accuracy", "auc") if metrics["model"][k] <= metrics[n][k]]
    info["heldout_metrics"] = metrics
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # Nothing run-dependent (times, paths) goes into the header: a rerun writes the same bytes.
    version = save_checkpoint(model, args.out, version=VERSION, extra=info)
    print(f"\nwrote {args.out} ({version}) in {time.perf_counter() - t0:.1f} s")
    if beaten:
        print(f"warning: the model does not beat {sorted(set(beaten))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
