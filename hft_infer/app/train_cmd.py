"""`hft-infer train`: train a built-in model on recorded or synthetic data into a checkpoint.

    hft-infer train synthetic --out model.safetensors
    hft-infer train day/AAPL_..._message_10.csv day/AAPL_..._orderbook_10.csv --out aapl.safetensors
    hft-infer train session.cap --preset lstm_a --out lstm.safetensors

Sources: 'synthetic' (the generator; held out: the same generator with another seed),
LOBSTER message/orderbook files or folders, or one capture file of `hft-infer record`
(held out: the last --heldout-fraction of the events in time). The model: a preset
(`--preset`, default mlp_small) or a spec (`--spec '{"kind": "mlp", "window": 16,
"hidden": [64]}'`, ModelSpec's fields). Labels and the loop: models/training.py.
Writes a .safetensors checkpoint whose header holds the spec, the normalisation,
the recipe, the data and the held-out metrics, then prints the held-out accuracy
and AUC against the naive predictors. Deterministic: same torch version, thread
count (`--threads`, set inside the command) and data, same bytes.

The shipped default (`builtin:default`) is `DEFAULT_COMMAND`:

    hft-infer train synthetic --version default-2 --out hft_infer/models/weights/default.safetensors
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import msgspec
import numpy as np

from hft_infer.errors import UserError

DEFAULT_COMMAND = ["synthetic", "--version", "default-2"]
"""Arguments (before --out) that train the shipped default model."""
# The arguments and their defaults (the default recipe): parser.add_train_arguments.


def _spec(args):
    from hft_infer.models.spec import ModelSpec, preset

    if args.spec:
        try:
            return msgspec.json.decode(args.spec, type=ModelSpec)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
            raise UserError(f"--spec: {' '.join(str(e).split())}") from None
    try:
        return preset(args.preset or "mlp_small")
    except ValueError as e:
        raise UserError(f"--preset: {e}") from None


def load_data(args, levels: int) -> tuple[np.ndarray, np.ndarray, dict, float]:
    """(train events, held-out events, data description for the header, tick)."""
    from hft_infer.app.replay_cmd import source_kind
    from hft_infer.models.training import TrainingError, split_by_time

    kind = source_kind(args)
    if kind == "synthetic":
        from hft_infer.replay.synthetic import SyntheticConfig, generate

        if args.events < 1 or args.heldout_events < 1:
            raise UserError("--events and --heldout-events must be >= 1")
        train_cfg = SyntheticConfig(seed=args.data_seed, levels=max(levels, 1))
        held_cfg = msgspec.structs.replace(train_cfg, seed=args.heldout_seed)
        data = {"source": "synthetic", "train": msgspec.to_builtins(train_cfg), "train_events": args.events,
                "heldout": msgspec.to_builtins(held_cfg), "heldout_events": args.heldout_events}
        return generate(args.events, train_cfg), generate(args.heldout_events, held_cfg), data, train_cfg.tick
    if kind == "capture":
        from hft_infer.app.replay_cmd import read_capture_source
        from hft_infer.replay.capture import decode_events

        if len(args.sources) != 1:
            raise UserError("train on one capture file at a time")
        events = decode_events(read_capture_source(args.sources[0], quiet=args.quiet), levels).events
        files = [os.path.basename(args.sources[0])]
    else:
        from hft_infer.app.replay_cmd import load_lobster_source

        result = load_lobster_source(args.sources, levels=levels, strict=args.strict,
                                     instrument_ids=args.instrument_ids, quiet=args.quiet)
        events = result.events
        files = sorted({os.path.basename(s) for s in args.sources})
    try:
        train, held = split_by_time(events, args.heldout_fraction)
    except TrainingError as e:
        raise UserError(f"--heldout-fraction: {e}") from None
    data = {"source": kind, "files": files, "events": int(events.shape[0]), "heldout_fraction": args.heldout_fraction,
            "train_events": int(train.shape[0]), "heldout_events": int(held.shape[0])}
    return train, held, data, 0.01


def _progress(quiet: bool):
    """(callback, context manager) of a rich progress bar on stderr (nothing with --quiet)."""
    import contextlib

    if quiet:
        return None, contextlib.nullcontext()
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
                   TimeRemainingColumn(), console=Console(stderr=True), transient=False)
    task = bar.add_task("train", total=None, loss="-")

    def update(step: int, total: int, loss: float) -> None:
        bar.update(task, completed=step, total=total, loss=f"{loss:.4f}")

    return update, bar


def heldout_metrics(model, events: np.ndarray, recipe) -> dict:
    """Held-out metrics for the checkpoint header, under the recipe's threads (its floats are in
    the file: the same bytes whatever the caller's thread count)."""
    from hft_infer.models.evaluation import evaluate
    from hft_infer.models.training import recipe_threads

    with recipe_threads(recipe):
        return evaluate(model, events, horizon=recipe.horizon_events, dead_zone_ticks=recipe.dead_zone_ticks,
                        tick=recipe.tick)


def main(args: argparse.Namespace) -> int:
    from hft_infer.models.checkpoint import save_checkpoint
    from hft_infer.models.evaluation import PREDICTORS, format_table
    from hft_infer.models.training import Recipe, TrainingError, info_of, train

    out = Path(args.out)
    if out.suffix != ".safetensors":
        raise UserError(f"--out {args.out}: the checkpoint is a .safetensors file")
    if not out.parent.is_dir():
        raise UserError(f"--out {args.out}: directory {out.parent} does not exist")
    spec = _spec(args)
    t0 = time.perf_counter()
    train_ev, held_ev, data, tick = load_data(args, spec.levels)
    try:
        recipe = Recipe(horizon_events=args.horizon, dead_zone_ticks=args.dead_zone_ticks,
                        tick=args.tick if args.tick is not None else tick, seed=args.seed, threads=args.threads,
                        epochs=args.epochs, batch=args.batch, lr=args.lr, weight_decay=args.weight_decay)
    except (msgspec.ValidationError, TypeError) as e:
        raise UserError(f"training options: {e}") from None
    print(f"train: {spec.name} ({spec.kind}, window {spec.window}, {spec.levels} levels) on {data['source']}: "
          f"{train_ev.shape[0]} events, held out {held_ev.shape[0]}", file=sys.stderr)
    update, bar = _progress(args.quiet)
    try:
        with bar:
            model = train(train_ev, spec, recipe, progress=update)
    except TrainingError as e:
        raise UserError(str(e)) from None
    metrics = heldout_metrics(model, held_ev, recipe)
    n = int(metrics["labels"]["n"])
    print(f"held-out: {n} labelled events ({data['source']}), horizon {recipe.horizon_events} events")
    print(format_table(metrics))
    info = info_of(spec, recipe, data)
    info["heldout_metrics"] = metrics
    # Nothing run-dependent (times, paths) goes into the header: a rerun writes the same bytes.
    version = save_checkpoint(model, out, version=args.version, extra=info)
    print(f"wrote {out} ({version}) in {time.perf_counter() - t0:.1f} s")
    m = metrics["model"]
    beaten = sorted({name for name in PREDICTORS[1:] for key in ("accuracy", "auc")
                     if not math.isnan(m[key]) and m[key] <= metrics[name][key]})
    if n == 0 or math.isnan(m["auc"]):
        print("warning: too few held-out labels to score the model (more data, or a larger --heldout-fraction)",
              file=sys.stderr)
    elif beaten:
        print(f"warning: the model does not beat {beaten} on the held-out data", file=sys.stderr)
    return 0
