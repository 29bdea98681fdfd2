"""Event tables -> raw feature rows, labels and windows, for training and evaluation.

Offline only (training, the metrics test, benchmarks): the service builds the
same raw rows incrementally in its feature store. The row layout is
`features.py`'s; trade rows repeat the instrument's last book, exactly as the
feature store does. Reads the event table's columns by name, so it does not
import `replay` (the service core never does).

Class labels: 0 = down, 1 = flat, 2 = up (the models' output order).
"""

from __future__ import annotations

import numpy as np

from hft_infer.models.features import row_width, trade_price_index, trade_size_index

DOWN, FLAT, UP = 0, 1, 2
KIND_TRADE = 1  # replay.events.KIND_TRADE (transport.schema.Kind.TRADE)


def instrument_order(events: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, starts, counts): `events[order]` is instrument-major, time order within an
    instrument; instrument i's rows are order[starts[i] : starts[i] + counts[i]]."""
    inst = events["instrument"].astype(np.int64)
    n_inst = int(inst.max()) + 1 if inst.size else 0
    order = np.argsort(inst, kind="stable")
    counts = np.bincount(inst, minlength=n_inst)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    return order, starts, counts


def raw_rows(events: np.ndarray, levels: int) -> np.ndarray:
    """float32 [N, 4*levels+2] raw rows in the table's order (see features.py)."""
    n = events.shape[0]
    book_levels = events.dtype["book"].shape[0]
    rows = np.zeros((n, row_width(levels)), dtype=np.float32)
    if n == 0:
        return rows
    use = min(levels, book_levels)
    is_trade = events["kind"] == KIND_TRADE
    order, starts, counts = instrument_order(events)
    # For every event, the index (in instrument-major order) of the instrument's
    # latest quote at or before it; -1 where no quote came yet (zero book).
    k = np.arange(n)
    quote_at = np.where(is_trade[order], -1, k)
    seg_start = np.repeat(starts, counts)
    last_quote = np.maximum.accumulate(np.maximum(quote_at, np.where(k == seg_start, seg_start - 1, -1)))
    has_book = last_quote >= seg_start
    src = order[np.where(has_book, last_quote, 0)]
    book = events["book"][:, :use, :].reshape(n, 4 * use)
    # Quotes carry only n_levels levels; the rest of `book` is zero by contract.
    rows[order, : 4 * use] = np.where(has_book[:, None], book[src], 0.0)
    rows[:, trade_price_index(levels)] = np.where(is_trade, events["price"], 0.0)
    rows[:, trade_size_index(levels)] = np.where(is_trade, events["side"] * events["size"], 0.0)
    return rows


def mid_prices(rows: np.ndarray) -> np.ndarray:
    """float64 [N] mid of each raw row (0 where the row has no book)."""
    return 0.5 * (rows[:, 0].astype(np.float64) + rows[:, 2].astype(np.float64))


def future_move_labels(events: np.ndarray, rows: np.ndarray, horizon: int, dead_zone_ticks: float,
                       tick: float) -> tuple[np.ndarray, np.ndarray]:
    """(labels int64 [N], valid bool [N]): sign of the instrument's mid move from event t to its
    event t + horizon; |move| <= dead_zone_ticks * tick is flat. Invalid where t + horizon does
    not exist or either mid is missing."""
    n = events.shape[0]
    order, starts, counts = instrument_order(events)
    mid = mid_prices(rows)[order]
    seg_end = np.repeat(starts + counts, counts)
    k = np.arange(n)
    ahead = k + horizon
    valid_s = (ahead < seg_end) & (mid > 0)
    ahead = np.minimum(ahead, n - 1)
    valid_s &= mid[ahead] > 0
    move = mid[ahead] - mid
    lab = np.where(move > dead_zone_ticks * tick, UP, np.where(move < -dead_zone_ticks * tick, DOWN, FLAT))
    labels = np.empty(n, dtype=np.int64)
    valid = np.empty(n, dtype=bool)
    labels[order] = lab
    valid[order] = valid_s
    return labels, valid


def last_move_sign(events: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """float64 [N]: sign of the instrument's latest mid change at or before each event (0 if none)."""
    n = events.shape[0]
    order, starts, counts = instrument_order(events)
    mid = mid_prices(rows)[order]
    seg_start = np.repeat(starts, counts)
    k = np.arange(n)
    change = np.zeros(n)
    prev_ok = (k > seg_start)
    change[1:] = np.where(prev_ok[1:], mid[1:] - mid[:-1], 0.0)
    moved_at = np.where(change != 0, k, -1)
    last = np.maximum.accumulate(np.maximum(moved_at, np.where(k == seg_start, seg_start - 1, -1)))
    sign = np.where(last >= seg_start, np.sign(change[np.maximum(last, 0)]), 0.0)
    out = np.empty(n)
    out[order] = sign
    return out


def level0_imbalance(rows: np.ndarray) -> np.ndarray:
    """float64 [N]: (bid size - ask size) / (bid size + ask size) at level 0 (0 without a book)."""
    b = rows[:, 1].astype(np.float64)
    a = rows[:, 3].astype(np.float64)
    tot = a + b
    return np.where(tot > 0, (b - a) / np.where(tot > 0, tot, 1.0), 0.0)


def window_index(events: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """(index int64 [N, window], pad_row int): row indices, oldest first, of each event's window
    (the instrument's rows t-window+1..t) into `np.concatenate([rows, pad])`, where the pad row
    (index N) stands for the missing rows before an instrument's first event."""
    n = events.shape[0]
    order, starts, counts = instrument_order(events)
    k = np.arange(n)
    seg_start = np.repeat(starts, counts)
    src = k[:, None] + np.arange(-window + 1, 1)[None, :]
    idx_sorted = np.where(src >= seg_start[:, None], order[np.maximum(src, 0)], n)
    index = np.empty((n, window), dtype=np.int64)
    index[order] = idx_sorted
    return index, n
