"""universe.shard_weights: shards balanced by each instrument's expected activity, the same plan in
every shard's config (hft_infer/sharding.py), and position % N without weights."""

from __future__ import annotations

import numpy as np
import pytest

from hft_infer.config import ConfigError, load_config
from hft_infer.replay.synthetic import SyntheticConfig, generate
from hft_infer.sharding import load_spread, shard_of_positions


def _owned(n_shards: int, weights: list[float], extra=()) -> list[list[int]]:
    w = "[" + ",".join(repr(float(x)) for x in weights) + "]"
    return [load_config(None, [*extra, f"universe.shard_index={i}", f"universe.shard_count={n_shards}",
                               f"universe.shard_weights={w}"]).universe.owned_ids() for i in range(n_shards)]


def test_without_weights_the_split_is_position_modulo_n():
    assert shard_of_positions(7, 3) == [0, 1, 2, 0, 1, 2, 0]
    owned = [load_config(None, [f"universe.shard_index={i}", "universe.shard_count=3"]).universe.owned_ids()
             for i in range(3)]
    assert owned[1] == list(range(1, 64, 3))


def test_weighted_shards_partition_the_universe_and_balance_a_skewed_feed():
    """bench's synthetic feed over 64 instruments (lognormal activity): by position the busiest of 8 shards
    carries well over the mean; by its own counts every shard is within the heaviest instrument of it."""
    inst = generate(200_000, SyntheticConfig(instruments=64, seed=3))["instrument"]
    counts = np.bincount(inst, minlength=64).astype(float)
    owned = _owned(8, list(counts))
    assert sorted(sum(owned, [])) == list(range(64))
    assert all(set(a).isdisjoint(b) for a in owned for b in owned if a is not b)
    balanced = [counts[o].sum() for o in owned]
    by_position = [counts[k::8].sum() for k in range(8)]
    mean = counts.sum() / 8
    assert max(balanced) <= mean + counts.max()  # the greedy rule's bound
    assert load_spread(balanced)[0] < load_spread(by_position)[0]
    assert load_spread(balanced)[0] < 1.03 and load_spread(by_position)[0] > 1.05


def test_heaviest_first_to_the_lightest_shard():
    # 9 -> s0; 5 -> s1; 4 -> s1 (5 < 9); 3 -> s0 (both at 9: s0 has fewer instruments)
    assert shard_of_positions(4, 2, [4.0, 9.0, 3.0, 5.0]) == [1, 0, 0, 1]
    # equal weights: ties go to the shard with fewer instruments, then the lower index (round robin)
    assert shard_of_positions(5, 2, [1.0] * 5) == [0, 1, 0, 1, 0]
    # instruments nobody expects to trade spread by count over the lighter shards, not all onto one
    assert np.bincount(shard_of_positions(10, 3, [100.0] + [0.0] * 9)).tolist() == [1, 5, 4]


def test_explicit_ids_are_weighted_in_their_order():
    owned = _owned(2, [1.0, 10.0, 1.0, 1.0], extra=["universe.ids=[40, 7, 9, 3]"])
    assert owned == [[7], [40, 9, 3]]


def test_weights_must_match_the_universe_and_be_finite():
    with pytest.raises(ConfigError, match="3 entries for 2 instruments"):
        load_config(None, ["universe.ids=[5, 6]", "universe.shard_weights=[1, 2, 3]"])
    with pytest.raises(ConfigError, match="finite"):
        load_config(None, ["universe.instruments=2", "universe.shard_weights=[1, inf]"])
    with pytest.raises(ValueError, match="one per instrument"):
        shard_of_positions(3, 2, [1.0])
    assert load_spread([0, 0]) == (1.0, 1.0) and load_spread([3, 1]) == (1.5, 0.5)
