"""A capture's Quote and Trade messages as the columnar event table every source produces.

ts_send_ns is not part of the table (it is the publisher's clock; the
capture's recv_ts_ns is beside it). Heartbeats are counted, undecodable
payloads counted and skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np

from hft_infer.transport.codec import events_of_batch
from hft_infer.transport.schema import EventBatch, Heartbeat, IngressMessage, Quote, Trade

from .capture_format import CaptureError
from .capture_reader import Capture
from .events import KIND_QUOTE, KIND_TRADE, empty_events


@dataclass
class DecodedCapture:
    events: np.ndarray  # event table (Quote and Trade messages, in capture order)
    record_index: np.ndarray  # int64: the capture record each event came from
    heartbeats: int
    undecodable: int  # payloads that are not Quote/Trade/Heartbeat/EventBatch (counted, skipped)


def decode_events(capture: Capture, levels: int | None = None) -> DecodedCapture:
    """Decode the captured Quote/Trade messages into an event table.

    levels: book levels of the table (None: the largest n_levels seen, at
    least 1); deeper quotes are cut, shallower ones padded with zeros. The
    payload is a record's last frame, so topic-framed and single-frame
    captures both work. ts_send_ns is not part of the table (it is the
    publisher's clock; the capture's recv_ts_ns is next to it).
    """
    dec = msgspec.msgpack.Decoder(IngressMessage).decode
    payloads = capture.payloads()
    quotes: list[tuple[int, int, Quote]] = []  # (record, event within the record, message)
    trades: list[tuple[int, int, Trade]] = []
    heartbeats = undecodable = 0
    for i, p in enumerate(payloads):
        try:
            m = dec(p)
        except msgspec.DecodeError:
            undecodable += 1
            continue
        t = type(m)
        if t is Quote:
            quotes.append((i, 0, m))
        elif t is Trade:
            trades.append((i, 0, m))
        elif t is Heartbeat:
            heartbeats += 1
        elif t is EventBatch:  # its events, each from this record, in order
            events = events_of_batch(m)
            if events is None:
                undecodable += 1
                continue
            for k, e in enumerate(events):
                (quotes if type(e) is Quote else trades).append((i, k, e))
    if levels is None:
        levels = max([q.n_levels for _, _, q in quotes], default=1) or 1
    n = len(quotes) + len(trades)
    ev = empty_events(n, levels)
    rec = np.array([i for i, _, _ in quotes] + [i for i, _, _ in trades], dtype=np.int64)
    sub = np.array([k for _, k, _ in quotes] + [k for _, k, _ in trades], dtype=np.int64)
    nq = len(quotes)
    if nq:
        qs = [q for _, _, q in quotes]
        ev["instrument"][:nq] = [q.instrument for q in qs]
        ev["seq"][:nq] = [q.seq for q in qs]
        ev["ts_exchange_ns"][:nq] = [q.ts_exchange_ns for q in qs]
        ev["priority"][:nq] = [q.priority for q in qs]
        ev["kind"][:nq] = KIND_QUOTE
        n_lv = np.array([q.n_levels for q in qs], dtype=np.int64)
        sizes = np.array([len(q.book) for q in qs], dtype=np.int64)
        if np.any(sizes != 16 * n_lv):
            bad = int(np.flatnonzero(sizes != 16 * n_lv)[0])
            raise CaptureError(f"{capture.path}: record {quotes[bad][0]}: quote book is {sizes[bad]} bytes "
                               f"for n_levels {n_lv[bad]}")
        ev["n_levels"][:nq] = np.minimum(n_lv, levels)
        # One buffer of all books, grouped by depth: a numpy copy per depth, not per quote.
        for depth in np.unique(n_lv).tolist():
            rows = np.flatnonzero(n_lv == depth)
            if depth == 0:
                continue
            block = np.frombuffer(b"".join([qs[r].book for r in rows.tolist()]), "<f4").reshape(-1, depth, 4)
            k = min(depth, levels)
            ev["book"][rows, :k] = block[:, :k]
    if trades:
        ts_ = [t for _, _, t in trades]
        sl = slice(nq, n)
        ev["instrument"][sl] = [t.instrument for t in ts_]
        ev["seq"][sl] = [t.seq for t in ts_]
        ev["ts_exchange_ns"][sl] = [t.ts_exchange_ns for t in ts_]
        ev["priority"][sl] = [t.priority for t in ts_]
        ev["kind"][sl] = KIND_TRADE
        ev["price"][sl] = [t.price for t in ts_]
        ev["size"][sl] = [t.size for t in ts_]
        ev["side"][sl] = [t.side for t in ts_]
    order = np.lexsort((sub, rec))  # back to capture order (and feed order within an EventBatch)
    return DecodedCapture(ev[order], rec[order], heartbeats, undecodable)


def to_events(capture: Capture, levels: int | None = None) -> np.ndarray:
    """The capture's Quote/Trade messages as an event table (heartbeats and junk skipped)."""
    return decode_events(capture, levels).events



__all__ = ["DecodedCapture", "decode_events", "to_events"]
