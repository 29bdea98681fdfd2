"""Per-instrument feature state: a ring of raw feature rows per slot, allocated once.

Layout (models/features.py defines a row): `ring[slot, position % depth, :]`,
float32, C-contiguous, one extra slot at the end that the runner uses as the
padding sink for batches padded to a bucket. `count[slot]` is the number of
rows ever written for the slot, so the newest row of a slot is at absolute
position `count - 1`.

Writes are byte copies through a memoryview of the ring (~0.3 us for a
10-level row on the dev VM against ~1 us for a numpy slice assignment,
tools/bench_hotpath.py): a quote's packed float32 block is already in the
row layout, so `write_quote` is one memcpy from the receive buffer plus
zero-fill of the missing levels and trade fields. A trade row repeats the
instrument's last book and sets the two trade fields. The ingest's burst path
takes positions as it accepts events and writes a chunk's rows afterwards
(`write_*_at`, and `write_books`: one numpy fancy assignment for the quotes of
a chunk, cheaper than a copy each from about 16 rows).

The ring memory is allocated by torch so that the same buffer can be pinned
for a GPU engine (read in place by the persistent kernels through the UVA mapping; the
graph engine gathers from it into its staging buffer, runner/staging.py);
the CPU engine reads it through views of the same storage.

Depth: rows stay in the ring until every request that may read them is done
(runner/select.py, ring_depth, sizes it: the rows a step reads -- the
model's window, or the event's own row for an LSTM that keeps its state --
and the pending rows of a sequential slot; with runner.cpu_worker, whose step reads the ring
while the loop ingests, also the rows the loop may ingest meanwhile, which it
bounds per step (stepper.py); at least RING_DEPTH_MIN rows). Memory is
n_slots x depth x row bytes, pinned on a GPU host: 256 rows of 10 levels are
43 KB a slot, 430 MB for 10,000 instruments. Values are validated before
they are written (transport/codec.py): every float is finite, non-negative
and below 2**127, so the float32 packing here cannot overflow.
"""

from __future__ import annotations

import struct

import numpy as np
import torch

from hft_infer.models.features import row_width
from hft_infer.transport.schema import BYTES_PER_LEVEL

_TRADE_FIELDS = struct.Struct("<ff")


class FeatureStore:
    """Rings of raw rows for `n_slots` instruments (+1 padding sink)."""

    def __init__(self, n_slots: int, levels: int, depth: int, *, pin_memory: bool = False) -> None:
        if depth < 1:
            raise ValueError("ring depth must be >= 1")
        self.n_slots = n_slots
        self.levels = levels
        self.depth = depth
        self.width = row_width(levels)
        self.sink_slot = n_slots
        self.tensor = torch.zeros((n_slots + 1, depth, self.width), dtype=torch.float32,
                                  pin_memory=pin_memory)
        self.array = self.tensor.numpy()  # same memory
        self._flat = self.array.reshape(-1, self.width)  # a view: row index = slot * depth + pos % depth
        # the same rows in two parts: each row's book (the levels' float32s) and its two trade
        # fields, an opaque item each, so that a burst's books, gathered from the frames' columns,
        # scatter into the ring (`put_rows`: numpy's scatter of an item is a memcpy) without first
        # being copied into whole rows of a scratch array
        self.book_item_dtype = np.dtype((np.void, 4 * levels * 4))
        self.trade_item_dtype = np.dtype((np.void, (self.width - 4 * levels) * 4))
        halves = self._flat.view(np.dtype([("book", self.book_item_dtype), ("trade", self.trade_item_dtype)]))
        self.row_books, self.row_trades = halves["book"].reshape(-1), halves["trade"].reshape(-1)
        self._no_trade = np.zeros(1, self.trade_item_dtype)[0]
        self._bytes = memoryview(self.array).cast("B")
        self._row_bytes = self.width * 4
        self._slot_bytes = depth * self._row_bytes
        self._book_bytes = levels * BYTES_PER_LEVEL
        self._zeros = bytes(self._row_bytes)
        self.count = [0] * (n_slots + 1)  # rows written per slot (Python ints: cheap to bump)

    def write_quote(self, slot: int, book, n_levels: int) -> int:
        """Copy a quote's packed book into the slot's next row; returns the row's position."""
        pos = self.count[slot]
        self.write_quote_at(slot, pos, book, n_levels)
        self.count[slot] = pos + 1
        return pos

    def write_trade(self, slot: int, price: float, signed_size: float) -> int:
        """Next row = the slot's last book + trade price and signed size; returns its position."""
        pos = self.count[slot]
        self.write_trade_at(slot, pos, price, signed_size)
        self.count[slot] = pos + 1
        return pos

    # The ingest's burst path (ingest.py) takes the positions first (it bumps `count` as it
    # accepts events) and writes the rows when the burst is handled: these leave `count` alone.

    def write_quote_at(self, slot: int, pos: int, book, n_levels: int) -> None:
        off = slot * self._slot_bytes + (pos % self.depth) * self._row_bytes
        nbytes = n_levels * BYTES_PER_LEVEL
        full = self._book_bytes
        mv = self._bytes
        if nbytes >= full:
            mv[off:off + full] = book[:full] if nbytes > full else book
            mv[off + full:off + self._row_bytes] = self._zeros[full:]
        else:
            mv[off:off + nbytes] = book
            mv[off + nbytes:off + self._row_bytes] = self._zeros[nbytes:]

    def write_trade_at(self, slot: int, pos: int, price: float, signed_size: float) -> None:
        """Row `pos` = row `pos - 1`'s book (zeros at 0) + the trade: row pos - 1 must be written."""
        rb = self._row_bytes
        off = slot * self._slot_bytes + (pos % self.depth) * rb
        mv = self._bytes
        full = self._book_bytes
        if pos > 0:
            prev = slot * self._slot_bytes + ((pos - 1) % self.depth) * rb
            mv[off:off + full] = mv[prev:prev + full]
        else:
            mv[off:off + full] = self._zeros[:full]
        _TRADE_FIELDS.pack_into(mv, off + full, price, signed_size)

    def write_books(self, slots: list[int], positions: list[int], books: np.ndarray, index: list[int]) -> None:
        """Rows (slots[j], positions[j]) = books[index[j]] (float32 [k, 4 x levels], C-contiguous)
        with zero trade fields, by two fancy assignments (`put_rows`), for a burst (from ~16 rows
        this costs less than a memoryview copy each: ~240 against ~750 ns/row at 64 on the dev
        VM). No two (slot, position) pairs may share a ring row (at most `depth` rows per slot)."""
        depth = self.depth
        at = np.asarray(slots, dtype=np.intp) * depth
        at += np.asarray(positions, dtype=np.intp) % depth
        self.put_rows(at, self.book_items(books).take(index))

    def book_items(self, books: np.ndarray) -> np.ndarray:
        """float32 books [k, 4 x levels] (C-contiguous) as k opaque items of `book_item_dtype`: a view."""
        if books.ndim != 2 or books.shape[1] != 4 * self.levels:
            raise ValueError(f"books of shape {books.shape}, expected [k, {4 * self.levels}] for {self.levels} levels")
        return books.view(self.book_item_dtype).reshape(-1)

    def put_rows(self, at: np.ndarray, books: np.ndarray, trade_fields: np.ndarray | None = None) -> None:
        """Ring rows `at` (flat row numbers: slot x depth + position % depth) = `books` (items of
        `book_item_dtype`, one a row) and `trade_fields` (float32 [k, 2]: price, signed size; None:
        zeros): whole rows, as a scratch array of rows stored in one assignment would leave them,
        without building one (one copy of the books fewer: the caller's gather, then this scatter).
        No row may appear twice in `at` (numpy does not say which of two assignments to one element
        stays)."""
        self.row_books[at] = books
        if trade_fields is None:
            self.row_trades[at] = self._no_trade
        else:
            self.row_trades[at] = trade_fields.view(self.trade_item_dtype).reshape(-1)

    def row(self, slot: int, position: int) -> np.ndarray:
        """A copy of one row (tests, debugging)."""
        return self.array[slot, position % self.depth].copy()

    def window(self, slot: int, position: int, length: int) -> np.ndarray:
        """Rows position-length+1..position (zeros before the first row), oldest first (tests)."""
        out = np.zeros((length, self.width), np.float32)
        for k in range(length):
            p = position - length + 1 + k
            if p >= 0:
                out[k] = self.array[slot, p % self.depth]
        return out

    def reset(self) -> None:
        self.array[...] = 0
        self.count = [0] * (self.n_slots + 1)

    def reset_slots(self, slots) -> None:
        """Forget these slots' rows: they start again at position 0 (a Reset on the feed)."""
        for slot in slots:
            self.array[slot] = 0
            self.count[slot] = 0
