"""The garbage collector around a latency-critical loop: freeze the heap, collect only when told.

A full collection walks every tracked object: with a loaded model, a feed
table or a warmed-up service that is hundreds of thousands of objects and a
pause of milliseconds (tools/bench_hotpath.py measures it). So a loop that
must not pause does this once, after its set-up:

    with FrozenHeap() as heap:         # gc.collect(), gc.freeze(), gc.disable()
        while running:
            ...
            heap.collect_young()       # in housekeeping, never mid-burst

`gc.freeze()` moves every live object into a permanent generation that no
collection scans again; with automatic collection off, the cycles the loop
itself makes (few: the hot path allocates little) are collected by
`collect_young()`, a generation-0 collection that costs microseconds because
only objects made since the last one are scanned.

On exit the collector is put back as it was found: automatic collection is
re-enabled if it was on, and the heap is unfrozen if it was not frozen
before (gc.unfreeze() cannot undo one freeze of several, so an inner
FrozenHeap inside an outer one leaves the outer's freeze in place).

A leaf: imports nothing of the project, so the service and the replay
pacer use the same helper.
"""

from __future__ import annotations

import gc

# Young objects allowed to pile up before collect_young() collects them. gc's
# own default threshold is 700 (2000 since Python 3.13); housekeeping runs
# about once a second, so this bounds one young collection's work instead.
YOUNG_THRESHOLD = 10_000


class FrozenHeap:
    """Context manager: collect, freeze, disable automatic collection; restore on exit.

    `enabled=False` makes every method a no-op (a config switch such as
    `cpu.gc_freeze` without an `if` at each call site). `frozen_objects` is
    the number of objects in the permanent generation after `freeze()`.
    """

    def __init__(self, *, enabled: bool = True, young_threshold: int = YOUNG_THRESHOLD) -> None:
        self.enabled = enabled
        self.young_threshold = young_threshold
        self.active = False
        self.frozen_objects = 0
        self._was_enabled = True
        self._was_frozen = False

    def freeze(self) -> int:
        """Collect everything, freeze what survives, turn automatic collection off.

        Returns the number of frozen objects (0 when disabled)."""
        if not self.enabled or self.active:
            return self.frozen_objects
        self._was_enabled = gc.isenabled()
        self._was_frozen = gc.get_freeze_count() > 0
        gc.collect()
        gc.freeze()
        gc.disable()
        self.active = True
        self.frozen_objects = gc.get_freeze_count()
        return self.frozen_objects

    def restore(self) -> None:
        """Put the collector back as freeze() found it. Idempotent."""
        if not self.active:
            return
        self.active = False
        if not self._was_frozen:
            gc.unfreeze()
        if self._was_enabled:
            gc.enable()

    def collect_young(self) -> int:
        """Collect generation 0 if more than `young_threshold` objects are waiting.

        Call from housekeeping only (it is the pause the loop avoids elsewhere).
        Returns the number of unreachable objects found (0 when nothing ran)."""
        if not self.active or gc.get_count()[0] <= self.young_threshold:
            return 0
        return gc.collect(0)

    def __enter__(self) -> FrozenHeap:
        self.freeze()
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


__all__ = ["YOUNG_THRESHOLD", "FrozenHeap"]
