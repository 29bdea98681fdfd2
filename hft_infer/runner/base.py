"""The engine interface: what the hot loop needs from a model runner.

The hot loop fills `slots[:n]` and `positions[:n]` (host int64 arrays owned by
the engine; on a GPU they are pinned), calls `step(n)`, and reads
`scores[:n]` and `actions[:n]`. The engine pads the batch to its bucket with
the feature store's sink slot, runs the model and the decision policy, and
returns when the outputs are in host memory. Engines own every buffer they
touch; nothing is allocated per step by our code.

Implementations: `eager` (CPU, torch references with preallocated buffers),
`graph` (CUDA graph per bucket), `persistent` (persistent Triton kernel).
"""

from __future__ import annotations

import bisect

import numpy as np


class BucketMap:
    """Maps a batch size to the smallest configured bucket that holds it."""

    def __init__(self, buckets: list[int]) -> None:
        self.buckets = sorted(buckets)

    def bucket(self, n: int) -> int:
        i = bisect.bisect_left(self.buckets, n)
        if i == len(self.buckets):
            raise ValueError(f"batch of {n} exceeds the largest bucket {self.buckets[-1]}")
        return self.buckets[i]

    @property
    def largest(self) -> int:
        return self.buckets[-1]


class Engine:
    """Base class: host-side buffers and bucket padding."""

    name = "base"

    def __init__(self, buckets: list[int], sink_slot: int, *, stateful: bool, reason: str) -> None:
        self.bucket_map = BucketMap(buckets)
        self.max_batch = self.bucket_map.largest
        self.sink_slot = sink_slot
        self.stateful = stateful
        self.reason = reason
        self.slots = self._host_array(self.max_batch, np.int64)
        self.positions = self._host_array(self.max_batch, np.int64)
        self.scores = self._host_array(self.max_batch, np.float32)
        self.actions = self._host_array(self.max_batch, np.int64)
        self.slots[:] = sink_slot
        self.ready = False  # warmed up (and, on a GPU, captured or launched)

    def _host_array(self, n: int, dtype) -> np.ndarray:
        return np.zeros(n, dtype=dtype)

    def pad(self, n: int) -> int:
        """Fill slots/positions n..bucket with the sink; returns the bucket size."""
        b = self.bucket_map.bucket(n)
        if b > n:
            self.slots[n:b] = self.sink_slot
            self.positions[n:b] = 0
        return b

    def step(self, n: int) -> None:
        raise NotImplementedError

    def warm_up(self, rounds: int = 3) -> None:
        """Run every bucket a few times (allocator, caches, lazy init), then reset state."""
        for b in self.bucket_map.buckets:
            for _ in range(rounds):
                self.slots[:b] = self.sink_slot
                self.positions[:b] = 0
                self.step(b)
        self.reset()
        self.ready = True

    def reset(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass
