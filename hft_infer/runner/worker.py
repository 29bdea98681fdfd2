"""A CPU engine whose steps run on a worker thread, so that the hot loop keeps ingesting.

`runner.cpu_worker = true` wraps the eager engine: `submit` hands the step to
a worker thread and returns; `poll` is True once the worker has finished.
torch and numpy release the GIL inside their kernels, so on a machine with a
core to spare the ingest runs while the model computes. What it costs: a
thread hand-off per step (tens of microseconds in CPython: a condition
variable wake-up), which is why it is off by default and pays only when a
step is long against the per-event work (measured in BENCHMARKS.md).

One step in flight at a time (the eager engine has one staging buffer), in
submission order, so the engine's per-slot state sees steps in order.
"""

from __future__ import annotations

import threading

from hft_infer.runner.base import Engine, EngineFailure


class WorkerEngine(Engine):
    max_inflight = 1
    reads_ring_in_flight = True  # the worker reads the ring while the loop ingests
    done_at_submit = False

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.name = inner.name
        self.reason = inner.reason + "; steps on a worker thread (runner.cpu_worker)"
        self.bucket_map = inner.bucket_map
        self.max_batch = inner.max_batch
        self.sink_slot = inner.sink_slot
        self.stateful = inner.stateful
        self.ready = inner.ready
        self.in_flight = 0
        self._job = threading.Condition()
        self._todo: tuple[int, int] | None = None
        self._finished = False
        self._error: BaseException | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="hft-infer-step", daemon=True)
        self._thread.start()

    @property
    def can_submit(self) -> bool:
        return self.in_flight == 0

    def request(self):
        return self.inner.request()

    def submit(self, n: int) -> None:
        if self.in_flight:
            raise RuntimeError("submit with the worker's step in flight")
        self.in_flight = 1
        self._finished = False
        with self._job:
            self._todo = (0, n)
            self._job.notify()

    def poll(self) -> bool:
        if self._error is not None:
            raise EngineFailure(f"CPU step failed on the worker: {type(self._error).__name__}: {self._error}")
        return self.in_flight > 0 and self._finished

    def collect(self):
        self.in_flight = 0
        return self.inner.collect()

    def _run(self) -> None:
        inner = self.inner
        while True:
            with self._job:
                while self._todo is None and not self._stop:
                    self._job.wait()
                if self._stop:
                    return
                _, n = self._todo
                self._todo = None
            try:
                inner.submit(n)  # the eager engine's submit is the step
            except BaseException as e:  # noqa: BLE001 - reported by the next poll, on the loop's thread
                self._error = e
            self._finished = True  # a plain store: the GIL orders it after the step's writes

    def warm_up(self, rounds: int = 3) -> None:
        self.inner.warm_up(rounds)
        self.ready = True

    def reset(self) -> None:
        self.inner.reset()

    def reset_slots(self, slots) -> None:
        while self.in_flight and not self.poll():
            pass
        self.inner.reset_slots(slots)

    def close(self) -> None:
        with self._job:
            self._stop = True
            self._job.notify()
        self._thread.join(timeout=5.0)
        self.inner.close()
