"""The feature ring's depth (runner/select.py, ring_depth): the rows a step may still read, and no
more, since the ring is n_slots x depth rows, pinned on a GPU host."""

from __future__ import annotations

import pytest

from hft_infer.app.serve import ring_summary
from hft_infer.config import load_config
from hft_infer.runner.select import RING_DEPTH_MIN, build_runtime


@pytest.fixture
def runtimes():
    """make(*overrides) -> (config, Runtime) of mlp_small on the CPU over 4 instruments; engines closed after."""
    made = []

    def make(*overrides: str):
        cfg = load_config(None, ['model.checkpoint=""', 'model.preset="mlp_small"', 'runner.device="cpu"',
                                 "universe.instruments=4", *overrides])
        rt = build_runtime(cfg, 4)
        made.append(rt)
        return cfg, rt

    yield make
    for rt in made:
        rt.engine.close()


def test_a_conflating_model_on_an_engine_that_copies_its_rows_holds_the_floor(runtimes):
    cfg, rt = runtimes()  # the default model: mlp_small, conflating, window 32
    assert not rt.sequential and rt.model.spec.window < RING_DEPTH_MIN
    assert rt.store.depth == RING_DEPTH_MIN  # not window + 2 x max_drain (544 until 2026-12-05)
    assert rt.inflight_rows == 2 * cfg.ingest.max_drain  # still the loop's cap, for an engine reading in flight


def test_a_sequential_model_holds_its_window_and_its_queue(runtimes):
    _, rt = runtimes('scheduler.conflate="off"', "scheduler.max_pending_per_instrument=1000")
    assert rt.sequential
    assert rt.store.depth == rt.model.spec.window + 1000


def test_an_lstm_keeping_its_state_holds_one_row_a_step_and_its_queue(runtimes):
    """Stream mode and the incremental window read each event's own row (the state holds the past):
    the window (50 rows for lstm_a) takes no room in the ring; recomputing the window does."""
    for mode in ('model.mode="stream"', 'model.window_method="incremental"'):
        _, rt = runtimes('model.preset="lstm_a"', mode, "scheduler.max_pending_per_instrument=1000")
        assert rt.sequential and rt.model.spec.window > 1
        assert rt.store.depth == 1 + 1000
    _, rt = runtimes('model.preset="lstm_a"', 'model.window_method="recompute"', 'scheduler.conflate="off"',
                     "scheduler.max_pending_per_instrument=1000")
    assert rt.sequential and rt.store.depth == rt.model.spec.window + 1000


def test_a_cpu_worker_reading_the_ring_in_flight_also_holds_what_the_loop_ingests_meanwhile(runtimes):
    _, plain = runtimes('scheduler.conflate="off"', "scheduler.max_pending_per_instrument=1000")
    cfg, worker = runtimes('scheduler.conflate="off"', "scheduler.max_pending_per_instrument=1000",
                           "runner.cpu_worker=true", "ingest.max_drain=100")
    assert worker.store.depth == plain.store.depth + 2 * 100 == worker.model.spec.window + 1000 + 200


def test_the_ready_line_says_what_the_ring_costs(runtimes):
    _, rt = runtimes('scheduler.conflate="off"', "scheduler.max_pending_per_instrument=1000")
    store = rt.store
    rows = (store.n_slots + 1) * store.depth  # the padding sink's slot too
    assert ring_summary(store) == f"ring_depth={store.depth} ring_mb={rows * store.width * 4 / 1e6:.1f}"
