"""RowGather (runner/staging.py: the GPU engines' host gather out of the feature ring) gives the
same rows whether a batch is copied as ring slices (a few entries) or by numpy take (more):
windows that wrap the ring, windows before an instrument's first row (zeros), one row per
entry (the LSTMs) and the whole window (the MLP)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from hft_infer.runner.staging import RowGather

WIDTH = 3


def _gathers(ring_len: int, g: int, entries: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    n_slots = 5
    ring = torch.arange(n_slots * ring_len * WIDTH, dtype=torch.float32).reshape(n_slots, ring_len, WIDTH) + 1
    gather = RowGather(ring, max_batch=64, rows_per_entry=g)
    slots = np.array([s for s, _ in entries], dtype=np.int64)
    positions = np.array([p for _, p in entries], dtype=np.int64)
    by_slices = np.full((len(entries), g, WIDTH), np.nan, dtype=np.float32)
    gather._gather_slices(slots.tolist(), positions.tolist(), by_slices)
    # the take path on the same entries, repeated past SLICES_MAX so that `gather` takes it
    reps = RowGather.SLICES_MAX // len(entries) + 1
    by_take = np.full((len(entries) * reps, g, WIDTH), np.nan, dtype=np.float32)
    gather.gather(np.tile(slots, reps), np.tile(positions, reps), by_take)
    # and what the window means, row by row: positions pos-g+1..pos of the slot, zeros before 0;
    # one row per entry: the ring's row at pos modulo its length, whatever its sign (the take path's
    # rule, which the persistent kernel's tests rely on)
    expected = np.zeros((len(entries), g, WIDTH), dtype=np.float32)
    for k, (slot, pos) in enumerate(entries):
        for j, p in enumerate(range(pos - g + 1, pos + 1)):
            if p >= 0 or g == 1:
                expected[k, j] = ring[slot, p % ring_len].numpy()
    assert np.array_equal(by_take[:len(entries)], expected)
    return by_slices, expected


@settings(max_examples=200, deadline=None)
@given(data=st.data(), ring_len=st.integers(1, 40), g_frac=st.floats(0, 1))
def test_slices_and_take_gather_the_same_rows(data, ring_len, g_frac):
    g = max(1, round(g_frac * ring_len))
    entries = data.draw(st.lists(st.tuples(st.integers(0, 4), st.integers(-50, 200)), min_size=1,
                                 max_size=RowGather.SLICES_MAX))
    by_slices, expected = _gathers(ring_len, g, entries)
    assert np.array_equal(by_slices, expected)


@pytest.mark.parametrize("ring_len,g,entries", [
    (8, 1, [(0, 0), (4, 7), (2, 8), (1, -3)]),  # one row: the first, the ring's last, wrapped, negative
    (8, 8, [(1, 3)]),  # the whole ring, five rows of zeros before position 0
    (8, 5, [(3, 9), (3, 12)]),  # 5..9 wraps past the end (8, 9 -> 0, 1); 8..12 wraps exactly at 8
    (40, 32, [(0, 31), (0, 30), (4, 100), (2, -1)]),  # mlp_small's window: full, one zero row, deep, none
])
def test_windows_that_wrap_or_start_before_the_first_row(ring_len, g, entries):
    by_slices, expected = _gathers(ring_len, g, entries)
    assert np.array_equal(by_slices, expected)
