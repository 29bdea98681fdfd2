"""Window gather: each trigger's last W raw rows from the feature ring into a dense batch.

The graph engine serves a custom torch module (models/custom.py) with this kernel
in front of it: it reads slots and positions from the engine's pinned staging
arrays and the rows from the pinned host feature ring (UVA, as the model kernels
do), so the captured step needs no host copy, and writes

    out[b, w, :] = ring[slot_b, (pos_b - W + 1 + w) % R, :]   where pos_b - W + 1 + w >= 0, else 0
    slots_out[b] = slot_b                                       (a device copy, for the policy's index)
    positions_out[b] = pos_b                                    (optional: a device copy)

i.e. the window semantics of executor.py (oldest row first, rows before an
instrument's first are zero rows). `gather_window_reference` is the torch reference.

The graph engine's built-in kernels use it the same way (runner/gpu.py, `KernelStep`): one
gather node reads everything the step needs from host memory in parallel (n x W programs, one
PCIe round trip each), then the model kernel reads device memory only. (Read in place through
UVA, every one of the model kernel's loads of slots, positions and rows was a volatile PCIe
read, issued again per tile, layer and phase: lstm_a's step measured ~14.6 ms on the H200.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hft_infer.kernels.common import interpreting


@triton.jit(do_not_specialize=["R"])
def _gather_window_kernel(ring_ptr, slots_ptr, pos_ptr, out_ptr, slots_out_ptr, pos_out_ptr, R,
                          W: tl.constexpr, F: tl.constexpr, BLOCK_F: tl.constexpr, VOL: tl.constexpr,
                          POS_OUT: tl.constexpr):
    b = tl.program_id(0)
    w = tl.program_id(1)
    slot = tl.load(slots_ptr + b, volatile=VOL).to(tl.int64)
    pos = tl.load(pos_ptr + b, volatile=VOL).to(tl.int64)
    p = pos - (W - 1) + w
    ok = p >= 0
    row = slot * R + tl.where(ok, p, 0) % R
    cols = tl.arange(0, BLOCK_F)
    cmask = cols < F
    vals = tl.load(ring_ptr + row * F + cols, mask=cmask & ok, other=0.0, volatile=VOL)
    tl.store(out_ptr + (b * W + w) * F + cols, vals, mask=cmask)
    tl.store(slots_out_ptr + b, slot, mask=w == 0)
    if POS_OUT:
        tl.store(pos_out_ptr + b, pos, mask=w == 0)


def gather_window(ring: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, out: torch.Tensor,
                  slots_out: torch.Tensor, positions_out: torch.Tensor | None = None) -> None:
    """ring float32 [S, R, F] (device, or pinned host read through UVA); slots, positions int64 [n];
    out float32 [n, W, F], slots_out (and positions_out) int64 [>= n] on the device. No
    allocation, no host sync: capturable in a CUDA graph."""
    n, window, width = out.shape
    if (ring.shape[2] != width or slots.shape[0] != n or positions.shape[0] != n or slots_out.shape[0] < n
            or (positions_out is not None and positions_out.shape[0] < n)):
        raise ValueError(f"gather_window: ring {tuple(ring.shape)}, out {tuple(out.shape)}, "
                         f"{slots.shape[0]} slots, {positions.shape[0]} positions do not agree")
    if n == 0:
        return
    host_in = any(t.device.type == "cpu" for t in (ring, slots, positions)) and not interpreting()
    pos_out = positions_out if positions_out is not None else slots_out
    _gather_window_kernel[(n, window)](ring, slots, positions, out, slots_out, pos_out, ring.shape[1], W=window,
                                       F=width, BLOCK_F=triton.next_power_of_2(width), VOL=host_in,
                                       POS_OUT=positions_out is not None)


def gather_window_reference(ring: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
                            window: int) -> torch.Tensor:
    """float32 [n, W, F]: the rows gather_window writes."""
    p = positions.long()[:, None] + torch.arange(-window + 1, 1, device=positions.device)
    rows = ring[slots.long()[:, None], p.remainder(ring.shape[1])]
    return torch.where((p >= 0)[:, :, None], rows, torch.zeros((), dtype=ring.dtype, device=ring.device))
