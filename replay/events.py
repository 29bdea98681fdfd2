"""The columnar event table every market-data source produces.

A numpy structured array, one row per event, `ts_*_ns` int64 columns (as in
hftbacktest's event arrays). The replayer turns rows into wire frames with
`encode_frames`, through the same transport a live feed uses, so the service
cannot tell a replay from a live feed.
"""

from __future__ import annotations

import numpy as np

from hft_infer.transport.codec import encode, topic_for
from hft_infer.transport.schema import Kind, Quote, Trade

KIND_QUOTE = int(Kind.QUOTE)
KIND_TRADE = int(Kind.TRADE)


def event_dtype(levels: int) -> np.dtype:
    """Structured dtype of an event table whose quotes carry up to `levels` levels."""
    return np.dtype([
        ("ts_exchange_ns", "<i8"),  # exchange/original timestamp (drives --speed pacing)
        ("instrument", "<u4"),
        ("kind", "u1"),  # KIND_QUOTE | KIND_TRADE
        ("n_levels", "<u2"),  # quotes: levels present in `book` (rest zero)
        ("side", "i1"),  # trades: +1 buyer-initiated, -1 seller-initiated
        ("priority", "i1"),  # -1: the service's config decides
        ("seq", "<i8"),  # per-instrument sequence, +1 per event
        ("price", "<f8"),  # trades
        ("size", "<f8"),  # trades
        ("book", "<f4", (levels, 4)),  # quotes: bid_px, bid_size, ask_px, ask_size per level
    ])


def empty_events(n: int, levels: int) -> np.ndarray:
    ev = np.zeros(n, dtype=event_dtype(levels))
    ev["priority"] = -1
    return ev


def to_message(row: np.void, ts_send_ns: int = 0) -> Quote | Trade:
    """One table row as its wire Struct."""
    if row["kind"] == KIND_QUOTE:
        n = int(row["n_levels"])
        return Quote(int(row["instrument"]), int(row["seq"]), int(row["ts_exchange_ns"]), ts_send_ns, n,
                     row["book"][:n].astype("<f4").tobytes(), int(row["priority"]))
    return Trade(int(row["instrument"]), int(row["seq"]), int(row["ts_exchange_ns"]), ts_send_ns,
                 float(row["price"]), float(row["size"]), int(row["side"]), int(row["priority"]))


def encode_frames(events: np.ndarray, ts_send_ns: np.ndarray | None = None) -> list[tuple[bytes, bytes]]:
    """(topic, payload) per event; `ts_send_ns` per event if given, else 0."""
    out = []
    for i in range(events.shape[0]):
        row = events[i]
        ts = int(ts_send_ns[i]) if ts_send_ns is not None else 0
        out.append((topic_for(int(row["instrument"])), encode(to_message(row, ts))))
    return out


def busiest_instrument(instruments: np.ndarray, elapsed_s: float) -> dict | None:
    """The instrument with the most events in `instruments` (an event table's column), its share
    of them and its events/s over `elapsed_s`.

    A stateful model steps one row per instrument per step (scheduler.py), so it cannot decide
    more than steps/s x (events / busiest's events) events per second: the busiest instrument's
    rate is the step rate such a model needs, whatever the batch size (docs/notes/replay.md,
    *Where scaling stops*). None for no events."""
    if instruments.size == 0:
        return None
    ids, counts = np.unique(instruments, return_counts=True)
    k = int(np.argmax(counts))
    n = int(counts[k])
    return {"id": int(ids[k]), "events": n, "share": n / instruments.size,
            "per_s": n / elapsed_s if elapsed_s > 0 else None}


def beyond_step_rate(instruments: np.ndarray, elapsed_s: float, steps_per_s: float | None) -> int | None:
    """Events of `instruments` (an event table's column, over `elapsed_s`) beyond what a stateful
    model stepping `steps_per_s` can take, one row per instrument per step: each instrument's
    events past steps_per_s x elapsed_s. However many rows a step holds, they are shed (or wait
    ever longer); the shed such a loop cannot avoid at that step rate (BENCHMARKS.md wave 26:
    12 lstm_a shards stepping ~2,060 times/s shed 3.3 % at steady state, this bound 2.4 %).
    None when the step rate was not measured."""
    if steps_per_s is None or elapsed_s <= 0:
        return None
    _, counts = np.unique(instruments, return_counts=True)
    return int(np.maximum(counts - steps_per_s * elapsed_s, 0).sum().round())
