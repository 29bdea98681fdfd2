"""Ring scatter and window gather against their torch references."""

from __future__ import annotations

import pytest
import torch
from kernels_testlib import TOL, device_params, make_norm, make_rows, rel_err, require_device

from hft_infer.kernels.ring import ring_gather, ring_gather_reference, ring_scatter, ring_scatter_reference


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("levels,ring_len,n", [(2, 7, 1), (3, 5, 6), (10, 64, 33)])
def test_scatter_matches_reference(device, levels, ring_len, n):
    dev = require_device(device)
    gen = torch.Generator().manual_seed(levels * 100 + n)
    n_slots = n + 2
    ring = torch.randn(n_slots, ring_len, 4 * levels + 2, generator=gen)
    rows = make_rows(n, levels, gen)
    slots = torch.randperm(n_slots - 1, generator=gen)[:n].int()
    # positions past the ring length wrap; the sink entry's negative one must too
    positions = torch.randint(0, 5 * ring_len, (n,), generator=gen)
    slots[-1], positions[-1] = n_slots - 1, -3
    want = ring.clone()
    ring_scatter_reference(want, rows, slots, positions)
    got = ring.to(dev)
    ring_scatter(got, rows.to(dev), slots.to(dev), positions.to(dev))
    assert torch.equal(got.cpu(), want)  # a copy: bit-exact


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("levels,window,ring_len,n", [(2, 5, 7, 3), (3, 7, 7, 1), (10, 50, 64, 9)])
@pytest.mark.parametrize("normalise", [False, True], ids=["raw", "features"])
def test_gather_matches_reference(device, levels, window, ring_len, n, normalise):
    dev = require_device(device)
    gen = torch.Generator().manual_seed(window * 10 + n)
    f = 4 * levels + 2
    n_slots = n + 1
    ring = make_rows(n_slots * ring_len, levels, gen).view(n_slots, ring_len, f)
    slots = torch.randperm(n_slots, generator=gen)[:n].int()
    # early positions: part of the window lies before position 0 (zero raw rows)
    positions = torch.randint(0, 3 * window, (n,), generator=gen)
    positions[0] = window // 2
    mean, inv_std = make_norm(levels, gen) if normalise else (None, None)
    out = torch.full((n, window, f), float("nan"), device=dev)  # poison: every element must be written
    ring_gather(ring.to(dev), slots.to(dev), positions.to(dev), out,
                mean.to(dev) if normalise else None, inv_std.to(dev) if normalise else None)
    ref32 = ring_gather_reference(ring, slots, positions, window, mean, inv_std)
    if not normalise:
        assert torch.equal(out.cpu(), ref32)
        return
    ref64 = ring_gather_reference(ring.double(), slots, positions, window, mean.double(), inv_std.double())
    # elementwise transform of grid prices: fp32 rounding of a few operations
    # (GPU division and log are ~2 ulp); the reference itself sits within it.
    assert rel_err(ref32, ref64) <= TOL["fp32"]
    assert rel_err(out, ref64) <= TOL["fp32"]
    assert rel_err(out, ref32) <= TOL["fp32"]
