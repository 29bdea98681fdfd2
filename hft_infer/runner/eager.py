"""The CPU engine: the models' executors on preallocated buffers.

Inputs and outputs are the base engine's numpy staging arrays; each bucket
has its own fixed views, so a step is: pad to the bucket, run the executor
(numpy by default, models/build.py) and the decision policy. The executors
preallocate their scratch for the largest bucket. `submit` runs the step;
`poll` is True at once (runner/base.py).
"""

from __future__ import annotations

from hft_infer.runner.base import Engine


def limit_cpu_threads(threads: int) -> dict[str, int]:
    """Pin torch's intra-op pool and every BLAS library loaded in this process (numpy's
    bundled OpenBLAS, which picks its thread count when it loads -- 2 on the dev VM, before
    the hot thread is pinned) to `threads`. Returns {library: threads} as now set.

    One thread: the hot loop owns its core, a pool hand-off costs more than the small
    matrix products it would split, and on a busy 2-core machine a second thread waits
    on the other core at every call (seen ~15x slower). threadpoolctl sets the count
    through each library's own API at run time, so it holds whatever was imported first
    and whatever the environment said."""
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    torch.set_num_threads(threads)
    threadpool_limits(limits=threads, user_api="blas")
    applied = {f"torch-{torch.__version__}": torch.get_num_threads()}
    for lib in threadpool_info():
        if lib["user_api"] == "blas":
            applied[f"{lib['internal_api']}-{lib['version']}"] = lib["num_threads"]
    return applied


class EagerEngine(Engine):
    name = "eager"

    def __init__(self, executor, policy, buckets: list[int], sink_slot: int, *, reason: str,
                 threads: int = 1) -> None:
        super().__init__(buckets, sink_slot, stateful=executor.stateful, reason=reason)
        self.threads = limit_cpu_threads(threads)
        self.executor = executor
        self.policy = policy
        if self.max_inflight != 1:  # _launch uses buffer 0: a synchronous engine has one
            raise AssertionError("EagerEngine runs one step at a time")
        slots, positions, scores, actions = self._slots[0], self._positions[0], self._scores[0], self._actions[0]
        self._views = {b: (slots[:b], positions[:b], scores[:b], actions[:b]) for b in self.bucket_map.buckets}
        # Steps run padded to the buckets: their plans (and the numpy executors' choice of
        # product backend, models/products.py) are made here, not by the first step of each size.
        executor.prepare(self.bucket_map.buckets)
        detail = executor.describe()
        if detail:
            self.reason = f"{self.reason}; {detail}"

    def _launch(self, i: int, n: int) -> None:
        slots, positions, scores, actions = self._views[self.pad(i, n)]
        self.executor.step(slots, positions, scores)
        self.policy.apply_numpy(slots, scores, actions)

    def reset(self) -> None:
        self.executor.reset()
        self.policy.reset()

    def reset_slots(self, slots) -> None:
        self.executor.reset_slots(slots)
        self.policy.reset_slots(slots)
