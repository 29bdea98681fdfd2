"""Which shard serves which instrument.

By default shard I of N serves the instruments at positions p (in `universe.ids`, or
0..instruments-1) with p % N == I. That splits the instruments evenly, not the events: a
feed's activity is skewed (a few instruments trade far more than the rest), and a shard's
capacity is in events/s, so the shard that draws the busiest instruments saturates first
and sets what N shards deliver together. bench's synthetic feed (lognormal activity,
sigma 0.5) over 1,024 instruments gives the busiest of 12 shards 1.11x the mean events
by position (1.04x of 4, 1.06x of 8), and the quietest 0.86x: at 84k events/s a shard on
average, one shard is offered 93k while another idles at 72k.

`universe.shard_weights` (each instrument's expected events/s, e.g. yesterday's counts:
`hft-infer bench --balance-shards` passes the feed's own) balances the load instead: the
greedy longest-processing-time rule, heaviest instrument first, each to the shard with the
least weight so far (ties: fewer instruments, then the lower index). Its busiest shard
carries at most the mean plus the heaviest single instrument's weight. Every shard computes
the same plan from the same list (same order, same float sums), so the shards of one
deployment agree without talking to each other: give every shard's config the same list.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def shard_of_positions(n: int, shard_count: int, weights: Sequence[float] = ()) -> list[int]:
    """The shard (0..shard_count-1) of each of n instrument positions: position % shard_count
    without weights, else the balanced plan above (weights: one non-negative number per position)."""
    if not weights:
        return [p % shard_count for p in range(n)]
    if len(weights) != n:
        raise ValueError(f"{len(weights)} shard weights for {n} instruments (one per instrument needed)")
    shard = [0] * n
    heap = [(0.0, 0, k) for k in range(shard_count)]  # (weight so far, instruments so far, shard)
    for p in sorted(range(n), key=lambda p: (-weights[p], p)):
        load, count, k = heap[0]
        shard[p] = k
        heapq.heapreplace(heap, (load + weights[p], count + 1, k))
    return shard


def load_spread(per_shard: Sequence[float]) -> tuple[float, float]:
    """(busiest, quietest) shard's load as a multiple of the mean; (1, 1) when nothing is loaded."""
    mean = sum(per_shard) / len(per_shard) if per_shard else 0.0
    if mean <= 0.0:
        return 1.0, 1.0
    return max(per_shard) / mean, min(per_shard) / mean


def event_counts(universe: Sequence[int], instruments) -> tuple[list[int], int]:
    """(events of each universe id, in universe order; events of ids outside the universe) in an
    array of instrument ids: the weights `bench --balance-shards` and `hft-infer shard-plan` use."""
    import numpy as np  # here, not at import: config.py imports this module

    ids, counts = np.unique(np.asarray(instruments), return_counts=True)
    position = {i: p for p, i in enumerate(universe)}
    per = [0] * len(universe)
    outside = 0
    for i, c in zip(ids.tolist(), counts.tolist()):
        if i in position:
            per[position[i]] = c
        else:
            outside += c
    return per, outside
