"""FrozenHeap: the collector is frozen and off inside, young cycles collected on request, restored after.

Runs in pytest's own process: every test leaves the collector as it found it
(checked by the fixture), which is the property under test anyway.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from hft_infer.heap import FrozenHeap


class Node:
    def __init__(self) -> None:
        self.other = self


def cyclic_garbage() -> weakref.ref:
    """A reference cycle nobody holds: only the cycle collector can free it."""
    return weakref.ref(Node())


@pytest.fixture(autouse=True)
def collector_untouched():
    assert gc.isenabled() and gc.get_freeze_count() == 0
    yield
    assert gc.isenabled(), "automatic collection left off"
    assert gc.get_freeze_count() == 0, "heap left frozen"


def test_inside_the_heap_is_frozen_and_collection_is_off():
    before = cyclic_garbage()
    with FrozenHeap() as heap:
        assert before() is None  # the initial full collection freed it: it is not frozen forever
        assert not gc.isenabled()
        assert heap.frozen_objects > 0 and gc.get_freeze_count() > 0
    assert heap.active is False


def test_young_cycles_wait_for_collect_young():
    with FrozenHeap(young_threshold=0) as heap:
        ref = cyclic_garbage()
        junk = [[i] for i in range(5000)]  # allocations that would trigger an automatic collection
        del junk
        assert ref() is not None  # nothing collected it behind our back
        assert heap.collect_young() >= 1
        assert ref() is None


def test_collect_young_skips_below_the_threshold():
    with FrozenHeap(young_threshold=1_000_000) as heap:
        ref = cyclic_garbage()
        assert heap.collect_young() == 0 and ref() is not None
    gc.collect()
    assert ref() is None


def test_restored_after_an_exception():
    with pytest.raises(RuntimeError):
        with FrozenHeap():
            raise RuntimeError("loop failed")


def test_inner_heap_keeps_the_outer_freeze():
    with FrozenHeap() as outer:
        with FrozenHeap():
            pass
        assert gc.get_freeze_count() > 0 and not gc.isenabled()  # the outer still holds
        assert outer.active


def test_collection_left_off_by_the_caller_stays_off():
    gc.disable()
    try:
        with FrozenHeap():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_disabled_changes_nothing():
    with FrozenHeap(enabled=False) as heap:
        assert gc.isenabled() and gc.get_freeze_count() == 0
        assert heap.collect_young() == 0 and heap.frozen_objects == 0
