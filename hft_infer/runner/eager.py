"""The CPU engine: the models' executors on preallocated buffers.

Inputs and outputs are numpy arrays shared with torch tensors (no copies);
each bucket has its own fixed views, so a step is: pad to the bucket, run
the executor and the decision policy under `torch.inference_mode()`. The
executors preallocate their scratch for the largest bucket. `submit` runs the
step; `poll` is True at once (runner/base.py).
"""

from __future__ import annotations

import torch

from hft_infer.runner.base import Engine


class EagerEngine(Engine):
    name = "eager"

    def __init__(self, executor, policy, buckets: list[int], sink_slot: int, *, reason: str,
                 threads: int = 1) -> None:
        super().__init__(buckets, sink_slot, stateful=executor.stateful, reason=reason)
        # One intra-op thread: the hot loop owns its core and a thread pool
        # hand-off costs more than the small matmuls it would split.
        torch.set_num_threads(threads)
        self.executor = executor
        self.policy = policy
        slots = torch.from_numpy(self._slots[0])
        positions = torch.from_numpy(self._positions[0])
        scores = torch.from_numpy(self._scores[0])
        self._views = {b: (slots[:b], positions[:b], scores[:b]) for b in self.bucket_map.buckets}

    def _launch(self, i: int, n: int) -> None:
        b = self.pad(i, n)
        slots, positions, scores = self._views[b]
        with torch.inference_mode():
            self.executor.step(slots, positions, scores)
        self.policy.apply_numpy(self._slots[0][:b], self._scores[0][:b], self._actions[0][:b])

    def reset(self) -> None:
        self.executor.reset()
        self.policy.reset()

    def reset_slots(self, slots) -> None:
        self.executor.reset_slots(slots)
        self.policy.reset_slots(slots)
