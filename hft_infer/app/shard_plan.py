"""`hft-infer shard-plan`: universe.shard_weights from recorded market data, and how evenly N
shards would split it by position and by those weights.

A shard's capacity is in events/s, so the busiest shard sets what N shards deliver together
(hft_infer/sharding.py). This counts each configured instrument's events in a capture, LOBSTER
files or the synthetic feed, prints a row per shard for both splits, and writes the
`shard_weights` line that every shard's `[universe]` section should carry (`--out`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from hft_infer.app.replay_cmd import load_lobster_source, read_capture_source, source_kind
from hft_infer.config import load_config
from hft_infer.errors import UserError
from hft_infer.replay.capture import decode_events
from hft_infer.replay.synthetic import SyntheticConfig, generate
from hft_infer.sharding import event_counts, load_spread, shard_of_positions

LEVELS = 1  # only the instrument column is read; a capture with more levels decodes the same ids


def source_instruments(args: argparse.Namespace, universe: list[int]) -> tuple[np.ndarray, str]:
    """(instrument id of every event, what was read)."""
    kind = source_kind(args)
    if kind == "synthetic":
        if args.events < 1:
            raise UserError(f"--events must be >= 1 (got {args.events})")
        inst = generate(args.events, SyntheticConfig(instruments=len(universe), seed=args.seed))["instrument"]
        return np.asarray(universe, dtype=np.int64)[inst], f"the synthetic feed (seed {args.seed})"
    if kind == "capture":
        if len(args.sources) != 1:
            raise UserError("shard-plan reads one capture file at a time")
        events = decode_events(read_capture_source(args.sources[0], quiet=True), LEVELS).events
        return events["instrument"].astype(np.int64), args.sources[0]
    result = load_lobster_source(args.sources, levels=LEVELS, strict=args.strict,
                                 instrument_ids=args.instrument_ids, quiet=True)
    return result.events["instrument"].astype(np.int64), ", ".join(args.sources)


def split_rows(counts: list[int], shard: list[int], n: int) -> list[tuple[int, int]]:
    """(instruments, events) of each shard under one plan."""
    rows = [[0, 0] for _ in range(n)]
    for c, k in zip(counts, shard):
        rows[k][0] += 1
        rows[k][1] += c
    return [(a, b) for a, b in rows]


def main(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    n = args.shards
    universe = cfg.universe.all_ids()
    if not 1 <= n <= len(universe):
        raise UserError(f"--shards must be 1..{len(universe)} (the universe's instruments; got {n})")
    instruments, what = source_instruments(args, universe)
    counts, outside = event_counts(universe, instruments)
    total = sum(counts)
    if total == 0:
        raise UserError(f"{what}: no event of the universe's {len(universe)} instruments (universe.ids / "
                        "universe.instruments name the ids the service serves)")
    by_position = split_rows(counts, shard_of_positions(len(universe), n), n)
    by_weight = split_rows(counts, shard_of_positions(len(universe), n, [float(c) for c in counts]), n)
    mean = total / n
    print(f"shard-plan: {n} shard(s) over {len(universe)} instruments, {total:,} events from {what}"
          + (f" ({outside:,} events of instruments outside the universe not counted)" if outside else ""))
    print(f"{'shard':>5}  {'by position: instr':>18}  {'events':>10}  {'x mean':>6}  "
          f"{'by weights: instr':>17}  {'events':>10}  {'x mean':>6}")
    for k in range(n):
        (pi, pe), (wi, we) = by_position[k], by_weight[k]
        print(f"{k:>5}  {pi:>18}  {pe:>10,}  {pe / mean:>6.3f}  {wi:>17}  {we:>10,}  {we / mean:>6.3f}")
    pos_max, pos_min = load_spread([e for _, e in by_position])
    w_max, w_min = load_spread([e for _, e in by_weight])
    print(f"busiest shard: {pos_max:.3f}x the mean by position, {w_max:.3f}x by weights "
          f"(quietest {pos_min:.3f}x, {w_min:.3f}x)")
    line = "shard_weights = [" + ", ".join(map(str, counts)) + "]"
    if args.out:
        Path(args.out).write_text(f"# hft-infer shard-plan: events of each instrument (universe order) in {what}\n"
                                  f"# put this line in the [universe] section of every shard's config\n"
                                  f"[universe]\n{line}\n")
        print(f"wrote {args.out}: the [universe] shard_weights line for every shard's config")
    else:
        print("every shard's config, [universe] section (or --out FILE):", file=sys.stderr)
        print(line)
    return 0
