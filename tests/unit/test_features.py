"""FeatureStore: rows land where the model reads them, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest

from hft_infer.features import FeatureStore
from hft_infer.models.features import row_width, trade_price_index, trade_size_index
from hft_infer.transport.codec import IngressDecoder, encode, pack_book
from hft_infer.transport.schema import Quote


def _decoded_book(levels: np.ndarray):
    q = IngressDecoder().decode(encode(Quote(1, 0, 0, 0, levels.shape[0], pack_book(levels))))
    return q.book, q.n_levels


def test_quote_rows_are_copied_exactly_and_wrap_around():
    store = FeatureStore(n_slots=3, levels=4, depth=5)
    rng = np.random.default_rng(0)
    written = []
    for k in range(12):
        lv = (rng.random((4, 4)) * 100).astype(np.float32)
        book, n = _decoded_book(lv)
        pos = store.write_quote(1, book, n)
        assert pos == k
        written.append(lv.reshape(-1))
    for k in range(12 - 5, 12):  # the last `depth` rows survive
        row = store.row(1, k)
        np.testing.assert_array_equal(row[:16], written[k])
        assert row[trade_price_index(4)] == 0 and row[trade_size_index(4)] == 0
    assert store.count[1] == 12 and store.count[0] == 0 and store.count[2] == 0
    assert not store.array[0].any() and not store.array[2].any()  # neighbours untouched


def test_fewer_levels_are_zero_filled_and_more_levels_truncated():
    store = FeatureStore(n_slots=1, levels=3, depth=2)
    big = np.arange(1, 5 * 4 + 1, dtype=np.float32).reshape(5, 4)
    store.write_quote(0, *_decoded_book(big))
    np.testing.assert_array_equal(store.row(0, 0)[:12], big[:3].reshape(-1))
    small = np.full((1, 4), 7.0, np.float32)
    store.write_quote(0, *_decoded_book(small))  # overwrites a row that held 3 levels
    row = store.row(0, 1)
    np.testing.assert_array_equal(row[:4], [7, 7, 7, 7])
    assert not row[4:].any()


def test_trade_row_repeats_last_book_and_sets_trade_fields():
    store = FeatureStore(n_slots=2, levels=2, depth=4)
    lv = np.array([[100, 5, 100.5, 6], [99.5, 7, 101, 8]], np.float32)
    store.write_quote(0, *_decoded_book(lv))
    pos = store.write_trade(0, 100.5, -3.0)
    row = store.row(0, pos)
    np.testing.assert_array_equal(row[:8], lv.reshape(-1))
    assert row[trade_price_index(2)] == np.float32(100.5) and row[trade_size_index(2)] == -3.0
    pos = store.write_trade(1, 50.0, 2.0)  # no book yet: zeros + trade
    assert not store.row(1, pos)[:8].any() and store.row(1, pos)[8] == 50.0


def test_window_view_zero_pads_history():
    store = FeatureStore(n_slots=1, levels=1, depth=3)
    for k in range(2):
        store.write_quote(0, *_decoded_book(np.full((1, 4), k + 1, np.float32)))
    w = store.window(0, 1, 3)
    assert w.shape == (3, row_width(1))
    assert not w[0].any() and w[1, 0] == 1 and w[2, 0] == 2


def test_tensor_and_array_share_memory():
    store = FeatureStore(n_slots=1, levels=1, depth=2)
    store.write_quote(0, *_decoded_book(np.full((1, 4), 3.0, np.float32)))
    assert float(store.tensor[0, 0, 0]) == 3.0
    store.reset()
    assert store.count[0] == 0 and float(store.tensor.abs().sum()) == 0.0


def test_depth_must_be_positive():
    with pytest.raises(ValueError):
        FeatureStore(1, 1, 0)


def test_put_rows_stores_whole_rows_as_the_byte_writes_do():
    """put_rows (the column path's) and write_books (the burst path's) leave each row exactly as
    write_quote_at / write_trade_at leave it: the book, then the trade fields (zeros for a quote)."""
    levels, depth = 3, 4
    a, b = FeatureStore(n_slots=2, levels=levels, depth=depth), FeatureStore(n_slots=2, levels=levels, depth=depth)
    a.array[:] = b.array[:] = 9.0  # old contents: every byte of a row must be written
    rng = np.random.default_rng(1)
    books = (rng.random((5, 4 * levels)) * 50).astype(np.float32)
    slots, positions = [0, 0, 1, 1, 0], [0, 1, 2, 7, 6]  # ring rows 0, 1, 6, 7 (7 % 4 = 3), 2
    at = np.asarray(slots) * depth + np.asarray(positions) % depth
    fields = np.array([[0, 0], [101.5, -2.0], [0, 0], [99.0, 4.0], [0, 0]], np.float32)
    a.put_rows(at, a.book_items(books), fields)
    for j, (s, p) in enumerate(zip(slots, positions)):
        b.write_quote_at(s, p, books[j].tobytes(), levels)
        if fields[j].any():
            b._flat[s * depth + p % depth, 4 * levels:] = fields[j]  # a trade's fields (its book given here)
    np.testing.assert_array_equal(a.array, b.array)
    c = FeatureStore(n_slots=2, levels=levels, depth=depth)
    c.array[:] = 9.0
    c.write_books([1, 0], [5, 3], books, [4, 2])  # rows (1, 5) = books[4], (0, 3) = books[2], no trade fields
    assert c.row(1, 5).tolist() == books[4].tolist() + [0.0, 0.0]
    assert c.row(0, 3).tolist() == books[2].tolist() + [0.0, 0.0]
    assert (c.row(0, 0) == 9.0).all(), "no other row touched"


def test_books_of_another_width_are_refused():
    store = FeatureStore(n_slots=1, levels=3, depth=2)
    with pytest.raises(ValueError, match="expected \\[k, 12\\] for 3 levels"):
        store.book_items(np.zeros((2, 10), np.float32))
