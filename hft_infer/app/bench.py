"""`hft-infer bench`: the service under open-loop synthetic load, measured end to end.

The service runs as a child (`hft-infer serve`, exactly as a user starts it)
on a private runtime dir, so it cannot collide with a running service. This
process generates the synthetic feed and fixes every event's intended send
time (constant or Poisson at --rate); a pacer process sends it and collector
processes receive the decisions (hft_infer.app.drive, shared with `replay`).
`--null-service` measures the harness floor instead (hft_infer.app.null_service);
`--with-floor` measures the floor first and then the service, with the same
feed and placement, and reports both. `--shards N` runs N services (or null
services) on the one feed, one shard of the universe each
(hft_infer.app.shards).

CLI level: may use `replay` (the service core may not).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np

from hft_infer.app.drive import HarnessOptions, Load, Target, drive, floor_ratios, print_result
from hft_infer.app.launcher import private_runtime_dir
from hft_infer.config import Config, load_config
from hft_infer.errors import UserError
from hft_infer.replay.pacer import constant_rate, encode_feed, poisson_rate, save_feed
from hft_infer.replay.synthetic import SyntheticConfig, generate
from hft_infer.sharding import event_counts


def _on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through drive's cleanup: children stopped, runtime dir removed


def main(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)  # e.g. `timeout` (tools/bench_shards.sh)
    out, _stats = run(args)
    if "per_shard" in out:
        from hft_infer.app.shards_report import print_shards, shards_exit_status

        print_shards(out)
        if args.json:
            print(f"json: {args.json}")
        return shards_exit_status(out, "bench")
    what = "the null service (harness floor)" if out["service"] == "null" else \
        f"engine={out['engine']}" + (f" ({out['precision']})" if out.get("precision") else "") + \
        f", model={out['model_version']}"
    print_result(out, f"hft-infer bench — {out['rate_offered']:g} events/s offered, {out['rate_achieved']:,.0f} "
                      f"achieved, {what}")
    if args.json:
        print(f"json: {args.json}")
    return exit_status(out, "bench")


def exit_status(out: dict, label: str) -> int:
    """1, with a line saying why, when the service failed or an event was lost."""
    reasons = []
    for name, o in ([("floor", out["floor"])] if "floor" in out else []) + [("", out)]:
        where = f" ({name} run)" if name else ""
        code = o["service_exit_code"]
        if code not in (0, None):
            reasons.append(f"the service exited with code {code}{where}; see {o['run_dir']}/service.log")
        lost = o["accounting"]["lost"]
        if lost > 0:
            reasons.append(f"{lost:,} of {o['accounting']['sent']:,} events lost{where}: sent, but neither "
                           "decided, shed, conflated nor rejected (never received, or their answers never came back)")
    for r in reasons:
        print(f"{label}: exit 1: {r}", file=sys.stderr)
    return 1 if reasons else 0


def check_harness_args(args: argparse.Namespace) -> None:
    if args.collectors < 1:
        raise UserError(f"--collectors must be >= 1 (got {args.collectors})")
    if not args.null_delay_us >= 0:
        raise UserError(f"--null-delay-us must be >= 0 (got {args.null_delay_us:g})")
    if not 1 <= args.feed_batch <= 65536:
        raise UserError(f"--feed-batch must be 1..65536 (1: one event per frame), got {args.feed_batch}")


def check_output_paths(args: argparse.Namespace) -> None:
    """Fail before the run, not after it, when the results could not be written."""
    if args.json:
        path = Path(args.json)
        parent = path.parent if str(path.parent) else Path(".")
        if path.is_dir():
            raise UserError(f"--json {args.json}: is a directory")
        if not parent.is_dir():
            raise UserError(f"--json {args.json}: directory {parent} does not exist")
        if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise UserError(f"--json {args.json}: not writable")
    if args.run_dir:
        try:
            Path(args.run_dir).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"--run-dir {args.run_dir}: {e.strerror}") from None


def model_levels(cfg: Config) -> int:
    """Book levels the config's model reads (the feed carries that many); a missing or bad
    checkpoint is a one-line error."""
    from hft_infer.models.checkpoint import CheckpointError, load_model

    if cfg.model.module:  # your own module: its row width is declared in the config
        return cfg.model.levels
    try:
        return load_model(cfg.model.checkpoint, preset=cfg.model.preset, seed=cfg.model.seed,
                          mode=cfg.model.mode)[0].spec.levels
    except CheckpointError as e:
        raise UserError(f"model.checkpoint: {e}") from None


def run_with_floor(load: Load, target: Target, run_dir: Path, *, with_floor: bool, label: str, quiet: bool,
                   harness: HarnessOptions, extra: dict, drive=drive):
    """One drive, or the null service's floor and then the target with the same feed file
    (`drive`: hft_infer.app.drive.drive or a function with its signature and result)."""
    if not with_floor:
        return drive(load, target, run_dir, quiet=quiet, label=label, extra=extra, harness=harness)
    keep = private_runtime_dir(f"hft-{label}-feed-")
    try:
        load.feed_file = os.path.join(keep, "feed.npz")
        save_feed(load.feed_file, load.feed, load.offsets_ns)
        floor_target = Target(target.cfg, target.config_path, target.overrides, start_service=True, null=True,
                              null_egress=target.null_egress, null_delay_us=target.null_delay_us)
        if not quiet:
            print(f"{label}: the floor first (null service)", file=sys.stderr, flush=True)
        floor, _, _ = drive(load, floor_target, run_dir / "floor", quiet=quiet, label=label, extra=extra,
                            harness=harness)
        (run_dir / "floor" / "summary.json").write_text(json.dumps(floor, indent=2))
        out, stats, result = drive(load, target, run_dir, quiet=quiet, label=label, extra=extra, harness=harness)
    finally:
        load.feed_file = None
        shutil.rmtree(keep, ignore_errors=True)
    floor.pop("config", None)  # the same as the service's
    out["floor"] = floor
    out["vs_floor"] = floor_ratios(floor["aggregate"], out["aggregate"]) if "aggregate" in out else \
        floor_ratios(floor, out)
    return out, stats, result


def shard_weights_override(ids: list[int], instrument: np.ndarray) -> str:
    """`universe.shard_weights=[...]`: each configured id's events in the feed, in ids order."""
    counts, _ = event_counts(ids, instrument)  # bench's feed holds only configured ids
    return "universe.shard_weights=[" + ",".join(map(str, counts)) + "]"


def run(args: argparse.Namespace):
    """Run one bench; returns the result dict (also run_dir/summary.json) and the stats
    receiver (every interval snapshot the service shipped, e.g. for soak analysis)."""
    for name, value, ok in (("rate", args.rate, args.rate > 0), ("duration", args.duration, args.duration > 0),
                            ("warmup", args.warmup, args.warmup >= 0)):
        if not ok:
            raise UserError(f"--{name} must be {'>= 0' if name == 'warmup' else '> 0'} (got {value:g})")
    if args.instruments is not None and args.instruments < 1:
        raise UserError(f"--instruments must be >= 1 (got {args.instruments})")
    check_harness_args(args)
    check_output_paths(args)
    cfg: Config = load_config(args.config, args.overrides)
    run_dir = Path(args.run_dir or os.path.join("runs", f"bench-{time.strftime('%Y%m%d-%H%M%S')}"))
    ids = cfg.universe.owned_ids()
    n_inst = args.instruments or len(ids)
    if n_inst > len(ids):
        raise UserError(f"--instruments {n_inst} exceeds the service's universe ({len(ids)} instruments)")
    n_warm = int(args.rate * args.warmup)
    n_total = n_warm + int(args.rate * args.duration)
    if n_total < 1:
        raise UserError(f"--rate {args.rate:g} x --duration {args.duration:g} s is less than one event")
    if args.shards is not None:
        from hft_infer.app.shards import check_shard_count

        check_shard_count(args.shards, cfg, n_inst)
    if args.shard_collectors is not None and (args.shards is None or args.shard_collectors < 1):
        raise UserError("--shard-collectors must be >= 1 and needs --shards")
    if args.balance_shards and args.shards is None:
        raise UserError("--balance-shards goes with --shards N")
    if args.balance_shards and cfg.universe.shard_weights:
        raise UserError("--balance-shards computes universe.shard_weights from the feed: the config already sets "
                        "them (drop one or the other)")
    if args.shards is not None and args.collectors > 1:
        raise UserError("--collectors splits one service's topics; with --shards, --shard-collectors K gives "
                        "K collectors of N/K shards each")
    levels = model_levels(cfg)
    if not args.quiet:
        print(f"bench: generating {n_total:,} synthetic events over {n_inst} instruments ...", file=sys.stderr)
    events = generate(n_total, SyntheticConfig(instruments=n_inst, levels=levels, seed=args.seed,
                                               rate_hz=args.rate))
    if ids != list(range(len(ids))):  # map generator ids 0..n-1 onto the configured ids
        events["instrument"] = np.asarray(ids, dtype=np.uint32)[events["instrument"]]
    offsets = poisson_rate(n_total, args.rate, args.seed) if args.poisson else constant_rate(n_total, args.rate)
    overrides = list(args.overrides)
    if args.balance_shards:
        overrides.append(shard_weights_override(ids, events["instrument"]))
    load = Load(events, encode_feed(events), offsets, measure_from=n_warm,
                description=f"{args.rate:g} events/s for {args.duration:g} s + {args.warmup:g} s warm-up, "
                            f"{'Poisson' if args.poisson else 'constant'} arrivals")
    target = Target(cfg, args.config, overrides, start_service=True, null=args.null_service,
                    null_egress=args.null_egress, null_delay_us=args.null_delay_us)
    driver = drive
    if args.shards is not None:
        from hft_infer.app.shards import drive_shards

        def driver(load, target, run_dir, **kw):
            return drive_shards(load, target, args.shards, run_dir, collectors=args.shard_collectors, **kw), None, None
    out, stats, _ = run_with_floor(load, target, run_dir, with_floor=args.with_floor, label="bench",
                                   quiet=args.quiet, harness=HarnessOptions(args.pacer, args.collectors,
                                                                          feed_batch=args.feed_batch),
                                   extra={"rate_offered": args.rate, "duration_s": args.duration,
                                          "warmup_s": args.warmup, "instruments": n_inst}, drive=driver)
    text = json.dumps(out, indent=2)
    (run_dir / "summary.json").write_text(text)
    if args.json:
        Path(args.json).write_text(text)
    return out, stats
