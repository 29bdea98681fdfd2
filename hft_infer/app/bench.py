"""`hft-infer bench`: the service under open-loop synthetic load, measured end to end.

The service runs as a child (`hft-infer serve`, exactly as a user starts it)
on a private runtime dir, so it cannot collide with a running service. This
process generates the synthetic feed, fixes every event's intended send time
(constant or Poisson at --rate), paces it and collects decisions and the
service's stage histograms (hft_infer.app.drive, shared with `replay`).

CLI level: may use `replay` (the service core may not).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from hft_infer.app.drive import Load, Target, drive, print_result
from hft_infer.config import Config, load_config
from hft_infer.errors import UserError
from hft_infer.models.checkpoint import load_model
from hft_infer.replay.pacer import constant_rate, encode_feed, poisson_rate
from hft_infer.replay.synthetic import SyntheticConfig, generate


def main(args: argparse.Namespace) -> int:
    out, _stats = run(args)
    print_result(out, f"hft-infer bench — {out['rate_offered']:g} events/s offered, {out['rate_achieved']:,.0f} "
                      f"achieved, engine={out['engine']}, model={out['model_version']}")
    if out["service_exit_code"] != 0:
        print(f"bench: the service exited with code {out['service_exit_code']}; see {out['run_dir']}/service.log",
              file=sys.stderr)
        return 1
    return 0 if out["accounting"]["lost"] == 0 else 1


def pacer_spins(choice: str) -> bool:
    """`--pacer auto`: a spinning pacer needs a core of its own next to the service and the
    I/O threads; on a 2-core machine it starves them (measured: tick-to-decision p50 9 ms
    spinning vs 1.1-1.8 ms sleeping at 10k events/s on the dev VM, BENCHMARKS.md)."""
    if choice == "auto":
        return (os.cpu_count() or 1) >= 4
    return choice == "spin"


def model_levels(cfg: Config) -> int:
    return load_model(cfg.model.checkpoint, preset=cfg.model.preset, seed=cfg.model.seed,
                      mode=cfg.model.mode)[0].spec.levels


def run(args: argparse.Namespace):
    """Run one bench; returns the result dict (also run_dir/summary.json) and the stats
    receiver (every interval snapshot the service shipped, e.g. for soak analysis)."""
    if args.rate <= 0 or args.duration <= 0 or args.warmup < 0:
        raise UserError("--rate and --duration must be > 0, --warmup >= 0")
    cfg: Config = load_config(args.config, args.overrides)
    run_dir = Path(args.run_dir or os.path.join("runs", f"bench-{time.strftime('%Y%m%d-%H%M%S')}"))
    ids = cfg.universe.owned_ids()
    n_inst = args.instruments or len(ids)
    if n_inst > len(ids):
        raise UserError(f"--instruments {n_inst} exceeds the service's universe ({len(ids)} instruments)")
    n_warm = int(args.rate * args.warmup)
    n_total = n_warm + int(args.rate * args.duration)
    if not args.quiet:
        print(f"bench: generating {n_total:,} synthetic events over {n_inst} instruments ...", file=sys.stderr)
    events = generate(n_total, SyntheticConfig(instruments=n_inst, levels=model_levels(cfg), seed=args.seed,
                                               rate_hz=args.rate))
    if ids != list(range(len(ids))):  # map generator ids 0..n-1 onto the configured ids
        events["instrument"] = np.asarray(ids, dtype=np.uint32)[events["instrument"]]
    offsets = poisson_rate(n_total, args.rate, args.seed) if args.poisson else constant_rate(n_total, args.rate)
    load = Load(events, encode_feed(events), offsets, measure_from=n_warm,
                description=f"{args.rate:g} events/s for {args.duration:g} s + {args.warmup:g} s warm-up, "
                            f"{'Poisson' if args.poisson else 'constant'} arrivals")
    out, stats, _ = drive(load, Target(cfg, args.config, list(args.overrides), start_service=True), run_dir,
                          quiet=args.quiet, label="bench", spin=pacer_spins(args.pacer),
                          extra={"rate_offered": args.rate, "duration_s": args.duration, "warmup_s": args.warmup,
                                 "instruments": n_inst})
    text = json.dumps(out, indent=2)
    (run_dir / "summary.json").write_text(text)
    if args.json:
        Path(args.json).write_text(text)
    return out, stats
