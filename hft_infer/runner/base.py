"""The engine interface: what the hot loop needs from a model runner.

The loop never waits for the device. A step goes through three calls:

    slots, positions = engine.request()      # host int64 arrays of the next free staging buffer
    slots[:n] = ...; positions[:n] = ...     # written in place (pinned on a GPU)
    engine.submit(n)                         # starts the step; returns at once
    ...                                      # keep draining, decoding, staging the next batch
    if engine.poll():                        # the oldest in-flight step is done?
        scores, actions = engine.collect()   # its outputs [:n] (valid until the next collect)

Steps complete in submission order. `can_submit` is False while every staging
buffer is in flight (`max_inflight` of them: double buffering means the host
writes batch k+1 while batch k runs). A CPU engine's `submit` runs the step
(its `poll` is True at once); the interface is the same, so the loop has one
shape for every engine.

The engine pads a batch to its bucket with the feature store's sink slot,
runs the model and the decision policy, and leaves the outputs in host
memory. Engines own every buffer they touch; nothing is allocated per step.

`reset_slots(slots)` zeroes per-instrument model state (a Reset on the feed);
it is ordered after every submitted step.

Implementations: `eager` (CPU), `graph` (CUDA graph per bucket), `persistent`
(persistent Triton kernel fed through a request ring in pinned memory).
"""

from __future__ import annotations

import bisect

import numpy as np


class EngineFailure(RuntimeError):
    """An engine that cannot go on (stuck kernel, failed capture, a CUDA error): fatal for the
    service, which answers what is pending, says so in a final Status and exits non-zero."""


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
    """Base class: staging buffers, bucket padding and the in-flight FIFO of a synchronous
    engine (subclasses with a device override `_launch`, `_done`, `_outputs`)."""

    name = "base"
    max_inflight = 1
    # The products' precision as this engine runs them (runner.precision; the CPU engine runs tf32
    # as fp32): reported in Status, which `replay --verify` holds the decisions to
    precision = "fp32"
    # True when a step in flight still reads the host feature ring (the loop must then not
    # overwrite its rows: stepper.py); the GPU engines copy a step's rows at submit
    reads_ring_in_flight = False
    # True when submit runs the step (poll is True at once): the stepper answers it within submit;
    # an asynchronous engine's step is polled by the loop, not at submit (an event query, ~1-3 µs)
    done_at_submit = True
    # An FD that is readable while a finished step waits to be collected, for engines whose steps
    # run on a thread of this process (runner/worker.py): the loop sleeps on it instead of spinning,
    # since a spinning loop holds the GIL that the step's thread needs between its kernels
    done_fd: int | None = None

    def __init__(self, buckets: list[int], sink_slot: int, *, stateful: bool, reason: str) -> None:
        self.bucket_map = BucketMap(buckets)
        self.max_batch = self.bucket_map.largest
        self.sink_slot = sink_slot
        self.stateful = stateful
        self.reason = reason
        k = self.max_inflight
        self._slots = [self._host_array(self.max_batch, np.int64) for _ in range(k)]
        self._positions = [self._host_array(self.max_batch, np.int64) for _ in range(k)]
        self._scores = [self._host_array(self.max_batch, np.float32) for _ in range(k)]
        self._actions = [self._host_array(self.max_batch, np.int64) for _ in range(k)]
        for s in self._slots:
            s[:] = sink_slot
        self._n = [0] * k  # batch size of each buffer's step
        self._head = 0  # oldest in-flight buffer
        self.in_flight = 0
        self.ready = False  # warmed up (and, on a GPU, captured or launched)

    # ------------------------------------------------------------ buffers

    def _host_array(self, n: int, dtype) -> np.ndarray:
        return np.zeros(n, dtype=dtype)

    @property
    def can_submit(self) -> bool:
        return self.in_flight < self.max_inflight

    def _next(self) -> int:
        return (self._head + self.in_flight) % self.max_inflight

    def request(self) -> tuple[np.ndarray, np.ndarray]:
        """slots, positions of the next free staging buffer (write [:n], then submit(n))."""
        i = self._next()
        return self._slots[i], self._positions[i]

    def pad(self, i: int, n: int) -> int:
        """Fill buffer i's slots/positions n..bucket with the sink; returns the bucket size."""
        b = self.bucket_map.bucket(n)
        if b > n:
            self._slots[i][n:b] = self.sink_slot
            self._positions[i][n:b] = 0
        return b

    # ------------------------------------------------------------ the step

    def submit(self, n: int) -> None:
        if self.in_flight >= self.max_inflight:  # cold: a loop bug
            raise RuntimeError("submit with every staging buffer in flight")
        i = self._next()
        self._n[i] = n
        self._launch(i, n)
        self.in_flight += 1

    def poll(self) -> bool:
        """True when the oldest in-flight step has finished (False when none is in flight)."""
        return self.in_flight > 0 and self._done(self._head)

    def collect(self) -> tuple[np.ndarray, np.ndarray]:
        """scores[:n], actions[:n] of the oldest in-flight step (which must be done)."""
        i = self._head
        self._outputs(i)
        self._head = (i + 1) % self.max_inflight
        self.in_flight -= 1
        n = self._n[i]
        return self._scores[i][:n], self._actions[i][:n]

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        """Wait for the oldest in-flight step and collect it (cold paths: reset, drain, tests)."""
        while not self.poll():
            pass
        return self.collect()

    def step(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Synchronous step on the next buffer (tools, tests, warm-up): submit + finish."""
        self.submit(n)
        return self.finish()

    def _launch(self, i: int, n: int) -> None:
        raise NotImplementedError

    def _done(self, i: int) -> bool:
        return True

    def _outputs(self, i: int) -> None:
        """Move buffer i's finished outputs into _scores[i] / _actions[i] (device engines)."""

    # ------------------------------------------------------------ life cycle

    def warm_up(self, rounds: int = 3) -> None:
        """Run every bucket a few times (allocator, caches, lazy init), then reset state."""
        for b in self.bucket_map.buckets:
            for _ in range(rounds):
                slots, positions = self.request()
                slots[:b] = self.sink_slot
                positions[:b] = 0
                self.step(b)
        self.reset()
        self.ready = True

    def reset(self) -> None:
        """Zero every slot's model state (no step in flight)."""
        raise NotImplementedError

    def reset_slots(self, slots: np.ndarray) -> None:
        """Zero the model state of these slots, after every submitted step."""
        raise NotImplementedError

    def close(self) -> None:
        pass
