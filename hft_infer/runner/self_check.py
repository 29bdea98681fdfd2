"""Start-up self-check of a device engine against the CPU reference (runner.self_check).

Before a GPU engine serves, a fixed stream of random book rows is stepped through
it and through the CPU engine (numpy executors, models/build.py) in the same
batches: distinct slots per batch, every slot's rows in order, batch sizes
varying from 1 to the largest bucket so that every code path and every reuse
of a buffer at another batch size is exercised. The scores must agree within
the rounding of the configured precision; otherwise the engine is refused with
the figures (and `engine = "auto"` falls through to the next candidate), so a
kernel that computes something else never decides anything.

Why it exists: for three waves the persistent kernels diverged from the CPU on the
H200 host (and from the launched kernels, which agreed with it) from the first reuse of
a request-ring slot, while their kernel tests passed: Triton's pipeliner had turned
their volatile loads into L1-cached cp.async copies (found and fixed at 08b885d,
BENCHMARKS.md wave 6). A check that runs on the machine that serves caught it there
and catches any future regression of the same kind at start-up, in a few hundred steps.

The same stream is then timed through both engines (`time_stream`), and `engine = "auto"`
refuses a device engine that takes more than SPEED_MARGIN times as long as the CPU engine
for it: a device engine that computes the right thing far too slowly (measured on the
H200 host at 916d9c4: the graph engine's lstm_a step ~14.6 ms at batch 1 against ~40 µs a
wave earlier) would turn every overload into a collapse; the CPU engine then serves.

Cost: ROWS rows, in ~60 batches, twice on each engine (~0.1-0.5 s on a GPU, dominated by the CPU
reference). The engine's model state and the feature rows are zeroed afterwards.
"""

from __future__ import annotations

import time

import numpy as np

from hft_infer.features import FeatureStore
from hft_infer.runner.base import EngineFailure

ROWS = 300
SPEED_MARGIN = 2.0
"""`auto` refuses a device engine slower than this many times the CPU engine on the check stream
(generous: the stream's batches are small, where a GPU step gains least over the CPU)."""
TOLERANCE = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 3e-2}  # |score| is O(0.1); fp32 differences seen ~1e-6
"""Largest score difference accepted, by runner.precision (different summation orders and,
for tf32/bf16, products rounded to 10/7 mantissa bits)."""


def check_stream(width: int, n_slots: int, max_batch: int, rows: int = ROWS, seed: int = 7):
    """(rows float32 [rows, width], slots per row, batch sizes): book-like rows around 100 with
    integer sizes, batches of distinct slots whose sizes cycle through 1..max_batch at random."""
    rng = np.random.default_rng(seed)
    data = (100 + rng.normal(0, 0.05, (rows, width))).astype(np.float32)
    data[:, 1::4] = rng.integers(1, 500, data[:, 1::4].shape)  # bid sizes
    data[:, 3::4] = rng.integers(1, 500, data[:, 3::4].shape)  # ask sizes
    sizes = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= min(max_batch, n_slots)] or [1]
    slots, batches = [], []
    while len(slots) < rows:
        b = min(int(rng.choice(sizes)), rows - len(slots))
        slots.extend(rng.permutation(n_slots)[:b].tolist())
        batches.append(b)
    return data, np.asarray(slots, dtype=np.int64), batches


def drive(engine, store: FeatureStore, data: np.ndarray, slots: np.ndarray, batches: list[int], *,
          fresh: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Write each row into `store` at its slot's next position and step the batches, one at a
    time; (scores, actions). fresh: zero the store first (else go on from where it is)."""
    if fresh:
        store.reset()
    scores, actions = [], []
    i = 0
    for b in batches:
        stage(engine, store, data[i:i + b], slots[i:i + b])
        sc, ac = engine.step(b)
        scores.append(np.array(sc, dtype=np.float32))
        actions.append(np.array(ac))
        i += b
    return np.concatenate(scores), np.concatenate(actions)


def stage(engine, store: FeatureStore, rows: np.ndarray, slots: np.ndarray) -> None:
    """Write `rows` (one per request) at their slots' next positions in `store` and fill the
    engine's next request buffers with those slots and positions (the ingest's part of a step)."""
    e_slots, e_positions = engine.request()
    for k in range(len(rows)):
        slot = int(slots[k])
        pos = store.count[slot]
        store.array[slot, pos % store.depth] = rows[k]
        store.count[slot] = pos + 1
        e_slots[k] = slot
        e_positions[k] = pos


def compare(engine, store: FeatureStore, reference, reference_store: FeatureStore, *, n_slots: int,
            precision: str) -> float:
    """Step the check stream through both engines; raise EngineFailure when they disagree.
    Returns the largest score difference. Both stores are left zeroed."""
    max_batch = min(engine.max_batch, reference.max_batch)
    data, slots, batches = check_stream(store.width, n_slots, max_batch)
    want, _ = drive(reference, reference_store, data, slots, batches)
    got, _ = drive(engine, store, data, slots, batches)
    store.reset()
    reference_store.reset()
    diff = np.abs(got.astype(np.float64) - want)
    worst = float(np.nanmax(diff)) if np.isfinite(got).all() else float("inf")
    tol = TOLERANCE[precision]
    if not worst <= tol:
        bad = np.flatnonzero(~(diff <= tol))
        starts = np.cumsum([0] + batches[:-1])
        first = int(bad[0])
        req = int(np.searchsorted(starts, first, side="right") - 1)
        raise EngineFailure(
            f"self-check failed: {len(bad)} of {len(got)} scores differ from the CPU reference by more than "
            f"{tol:g} (largest {worst:.3g}; first at row {first}, request {req} of {len(batches)}, "
            f"batch of {batches[req]}): this engine computes something else here")
    return worst


def time_stream(engine, store: FeatureStore, reference, reference_store: FeatureStore, *,
                n_slots: int) -> tuple[float, float]:
    """Seconds the check stream takes through `engine` and through `reference` (after `compare`:
    both warm, every CUDA graph replayed once). Both stores are left zeroed; the engines'
    model state is not (the caller resets it)."""
    max_batch = min(engine.max_batch, reference.max_batch)
    data, slots, batches = check_stream(store.width, n_slots, max_batch, seed=11)
    t0 = time.perf_counter()
    drive(engine, store, data, slots, batches)
    t1 = time.perf_counter()
    drive(reference, reference_store, data, slots, batches)
    t2 = time.perf_counter()
    store.reset()
    reference_store.reset()
    return t1 - t0, t2 - t1


def too_slow(name: str, engine_s: float, cpu_s: float) -> str | None:
    """Why `auto` refuses a device engine that took `engine_s` for the check stream against the
    CPU engine's `cpu_s`, or None when it is fast enough."""
    if engine_s <= SPEED_MARGIN * cpu_s:
        return None
    return (f"{name} is slower than the CPU engine here: the self-check stream took {engine_s * 1e3:.2f} ms "
            f"on it against {cpu_s * 1e3:.2f} ms on the CPU (more than {SPEED_MARGIN:g}x)")
