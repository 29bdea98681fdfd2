"""A graph step's inputs staged on the host and sent to the device in one copy.

Measured on the H200 host (tools/diag_graph_inputs.py, 2026-12-02): a kernel's reads
of pinned host memory (UVA) are served about one PCIe transaction at a time, ~1 µs
each, whatever the parallelism of the grid: lstm_a's window kernel reading its slots,
positions and rows from host memory in place took 14.9 ms a step at batch 1 (49 ms at
batch 8), and even a gather kernel that reads each row once took 163 µs for mlp_small's
32-row window at batch 1 (858 µs at batch 8). The copy engine moves the same bytes
in one DMA. So no kernel of the graph engine reads host memory:

1. at submit, on the loop's thread, `gather(i, b)` copies each entry's rows out of the
   pinned host feature ring (numpy `take`, no allocation) into staging buffer i, next
   to the slots and positions the loop wrote there; rows before an instrument's first
   are zero rows (the window semantics of models/executor.py);
2. the captured graph of (buffer i, bucket b) starts with `upload(i, b)`: ONE
   host-to-device copy node of the buffer's first bytes (slots, positions, then the
   b entries' rows), then the model's kernels read device memory only.

Layout of each pinned buffer (and of the one device buffer, shared by every graph:
replays are ordered on one stream, so step k+1's copy runs after step k's kernels):

    int64 slots [max_batch] | int64 positions [max_batch] | float32 rows [max_batch, G, F]

G = rows per entry: 1 for the LSTMs (the new row; their state holds the past), W for
window readers (the MLP, custom modules: the whole window).

`RowGather` is step 1 alone: the persistent engine gathers into its request ring's
payload (kernels/persistent.py), which the ring's own copy graph moves to the device.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["RowGather", "StepStaging"]


class RowGather:
    """Each batch entry's rows out of the pinned host feature ring, into a caller's buffer
    (numpy `take` into preallocated index scratch: nothing allocates per step). A batch of at
    most SLICES_MAX entries is copied entry by entry as slices of the ring instead: one or two
    numpy assignments per entry against the take path's five to eight numpy calls, which cost
    ~2-4 µs each on the H200 host with the caches cold from the idle loop (the take path gathered
    mlp_small's 32-row window at batch 1 in 34 µs at the median there, lstm_a's one row in 10-13:
    bench_hotpath --cycle-parts, docs/bench/h200-68bc6aa/)."""

    SLICES_MAX = 4

    def __init__(self, ring_h: torch.Tensor, *, max_batch: int, rows_per_entry: int) -> None:
        n_slots, self.ring_len, self.width = ring_h.shape
        if rows_per_entry > self.ring_len:
            raise ValueError(f"{rows_per_entry} rows per entry do not fit the feature ring's {self.ring_len}")
        self.rows_per_entry = g = rows_per_entry
        self._ring = ring_h.numpy()  # [n_slots, R, F], a view
        self._ring_flat = self._ring.reshape(n_slots * self.ring_len, self.width)  # a view
        if not np.may_share_memory(self._ring_flat, self._ring):
            raise ValueError("the feature ring must be contiguous (the gather reads it in place)")
        self._offsets = np.arange(-(g - 1), 1, dtype=np.int64)
        self._idx = np.zeros((max_batch, g), dtype=np.int64)
        self._base = np.zeros((max_batch, 1), dtype=np.int64)
        self._missing = np.zeros((max_batch, g), dtype=bool)

    def gather(self, slots: np.ndarray, positions: np.ndarray, out: np.ndarray) -> None:
        """out[b] (float32 [G, F]) <- rows positions[b]-G+1..positions[b] of slot slots[b],
        oldest first; rows before position 0 are zero rows."""
        b = len(slots)
        if b <= self.SLICES_MAX:
            self._gather_slices(slots.tolist(), positions.tolist(), out)
            return
        r = self.ring_len
        if self.rows_per_entry == 1:
            idx = self._idx[:b, 0]
            np.remainder(positions, r, out=idx)
            idx += np.multiply(slots, r, out=self._base[:b, 0])
            np.take(self._ring_flat, idx, axis=0, out=out[:, 0], mode="clip")
            return
        idx = np.add(positions[:, None], self._offsets, out=self._idx[:b])
        missing = np.less(idx, 0, out=self._missing[:b]) if positions.min() < self.rows_per_entry - 1 else None
        np.remainder(idx, r, out=idx)
        idx += np.multiply(slots[:, None], r, out=self._base[:b])
        np.take(self._ring_flat, idx, axis=0, out=out, mode="clip")
        if missing is not None:
            out[missing] = 0.0

    def _gather_slices(self, slots: list[int], positions: list[int], out: np.ndarray) -> None:
        """`gather` for a few entries, exactly as the take path: each entry's G rows are one slice
        of its slot's ring, or two where they wrap past its end; rows before position 0 are zeros,
        and the rows from 0 to a position below G - 1 never wrap (G <= the ring's length). One row
        per entry is the ring's row at the position modulo its length, whatever its sign."""
        ring, r, g = self._ring, self.ring_len, self.rows_per_entry
        for k, (slot, pos) in enumerate(zip(slots, positions)):
            dst = out[k]
            if g == 1:
                dst[0] = ring[slot, pos % r]
                continue
            lo = pos - g + 1
            if lo < 0:
                if pos < 0:
                    dst[:] = 0.0
                    continue
                dst[:-lo] = 0.0
                dst[-lo:] = ring[slot, :pos + 1]
                continue
            start = lo % r
            end = start + g
            if end <= r:
                dst[:] = ring[slot, start:end]
            else:
                dst[:r - start] = ring[slot, start:]
                dst[r - start:] = ring[slot, :end - r]

    def address(self) -> int:
        return int(self._ring_flat.ctypes.data)


class StepStaging:
    def __init__(self, ring_h: torch.Tensor, *, max_batch: int, rows_per_entry: int, n_buffers: int,
                 device: torch.device) -> None:
        """ring_h: the feature store's host ring float32 [n_slots, R, F] (pinned where a GPU
        reads it). Allocates n_buffers host buffers (pinned on a CUDA device) and one device
        buffer."""
        self._gather = RowGather(ring_h, max_batch=max_batch, rows_per_entry=rows_per_entry)
        self.width = ring_h.shape[2]
        self.max_batch = max_batch
        self.rows_per_entry = g = rows_per_entry
        self._header = 16 * max_batch
        self._row_bytes = 4 * g * self.width  # one entry's rows
        total = self._header + max_batch * self._row_bytes
        pin = device.type == "cuda"
        self._host = [torch.zeros(total, dtype=torch.uint8) for _ in range(n_buffers)]
        if pin:
            self._host = [t.pin_memory() for t in self._host]
        self._dev = torch.zeros(total, dtype=torch.uint8, device=device)
        self.slots = [self._ints(t, 0).numpy() for t in self._host]
        self.positions = [self._ints(t, 1).numpy() for t in self._host]
        self.rows = [self._rows(t).numpy() for t in self._host]
        self.slots_d, self.positions_d, self.rows_d = self._ints(self._dev, 0), self._ints(self._dev, 1), \
            self._rows(self._dev)

    def _ints(self, buf: torch.Tensor, k: int) -> torch.Tensor:
        mb = self.max_batch
        return buf[8 * k * mb: 8 * (k + 1) * mb].view(torch.int64)

    def _rows(self, buf: torch.Tensor) -> torch.Tensor:
        return buf[self._header:].view(torch.float32).view(self.max_batch, self.rows_per_entry, self.width)

    def gather(self, i: int, b: int) -> None:
        """Buffer i's rows[:b] from the ring at its slots[:b], positions[:b] (host, in place)."""
        self._gather.gather(self.slots[i][:b], self.positions[i][:b], self.rows[i][:b])

    def upload(self, i: int, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Copy buffer i's first b entries to the device (capturable: one copy node);
        returns the device slots[:b], positions[:b], rows[:b] ([b, G, F])."""
        n = self._header + b * self._row_bytes
        self._dev[:n].copy_(self._host[i][:n], non_blocking=True)
        return self.slots_d[:b], self.positions_d[:b], self.rows_d[:b]

    def addresses(self) -> tuple[int, ...]:
        """The buffers' addresses (a CUDA graph's inputs: they must never move)."""
        return tuple(t.data_ptr() for t in (*self._host, self._dev)) + (self._gather.address(),)
