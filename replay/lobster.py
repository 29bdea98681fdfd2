"""LOBSTER message + orderbook CSV pairs as an event table.

LOBSTER (https://lobsterdata.com) ships one trading day of one ticker as two
CSV files without a header, row i of one describing row i of the other:

- ``TICKER_DATE_START_END_message_LEVEL.csv``: time (seconds after
  midnight, a decimal with up to 9 places), type (1 new limit order,
  2 partial cancellation, 3 deletion, 4 execution of a visible order,
  5 execution of a hidden order, 6 cross/auction trade, 7 trading halt),
  order id, size, price (dollars x 10000), direction (-1 sell, 1 buy limit
  order; for executions the side of the *resting* order);
- ``TICKER_DATE_START_END_orderbook_LEVEL.csv``: the book *after* that
  message, per level ask price, ask size, bid price, bid size (prices x 10000;
  missing levels hold the dummy prices 9999999999 / -9999999999, size 0).

Mapping (docs/notes/replay.md has the reasons):

- types 1, 2, 3 -> one quote carrying the book after the message;
- type 4 -> a trade (price / 10000, size, side = -direction: the aggressor is
  the opposite of the resting order), then a quote with the book after the
  execution (`quote_after_execution=False` leaves the quote out);
- type 5 -> a trade only (a hidden order's execution leaves the visible book
  unchanged);
- type 6 -> a trade only; side = -direction as LOBSTER reports it, although an
  auction cross has no real aggressor;
- type 7 -> no event; halts (price -1), quote resumptions (0) and trade
  resumptions (1) are counted.

Quotes use our level layout (bid_px, bid_size, ask_px, ask_size per level,
float32, prices / 10000). Dummy levels become price 0, size 0; `n_levels` is
the depth of the deeper side (last real level + 1), at least 1, so an empty
book is one all-zero level, which the service's validator accepts.

`ts_exchange_ns` is midnight UTC of the file name's date plus the message time
parsed exactly from its decimal text (never through a float). LOBSTER times
are New York wall-clock seconds, so the result is that wall-clock time read
as if it were UTC: differences (what pacing uses) are exact, the absolute
value is off by the New York UTC offset. Files without a date in their name
start at epoch 0.

Parsing is bulk (replay/lobster_text.py): lines go to `numpy.loadtxt` (C) in chunks; only a chunk that
fails is re-parsed in smaller pieces and, finally, line by line, to name each
malformed line as ``file:line: reason``. Times are decoded with vectorised
byte arithmetic. A million-row, 10-level day takes a few seconds.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .events import KIND_QUOTE, KIND_TRADE, empty_events
from .lobster_text import TIME_FIELD_BYTES, parse_table, time_ns_from_text, times_ns

__all__ = ["LobsterError", "LobsterName", "LobsterResult", "assign_seq", "find_pairs", "load_lobster", "parse_name",
           "time_ns_from_text"]

PRICE_SCALE = 10_000
DUMMY_ASK_PRICE = 9_999_999_999
DUMMY_BID_PRICE = -9_999_999_999
MESSAGE_COLUMNS = 6
MAX_INSTRUMENT_ID = 0xFFFFFFFD  # 0xFFFFFFFF: service topic, 0xFFFFFFFE: DecisionBatch topic

# Lines per loadtxt call: big enough that the call overhead vanishes, small
# enough that a 10-level chunk's int64 table stays ~20 MB.
CHUNK_LINES = 65_536

_NAME = re.compile(r"^(?P<ticker>.+?)_(?P<date>\d{4}-\d{2}-\d{2})_(?P<start>\d+)_(?P<end>\d+)_"
                   r"(?P<kind>message|orderbook)_(?P<level>\d+)\.csv$")


class LobsterError(ValueError):
    """A LOBSTER input that cannot be loaded; the message is one line (``file:line: reason``)."""


@dataclass(frozen=True)
class LobsterName:
    """What a LOBSTER file name says (all None when the name has another shape)."""

    ticker: str
    date: str | None
    levels: int | None

    @property
    def midnight_ns(self) -> int:
        """Midnight UTC of the date in ns since the epoch; 0 without a date."""
        if self.date is None:
            return 0
        d = _dt.date.fromisoformat(self.date)
        return int(_dt.datetime(d.year, d.month, d.day, tzinfo=_dt.timezone.utc).timestamp()) * 1_000_000_000


def parse_name(path: str | Path) -> LobsterName:
    name = Path(path).name
    m = _NAME.match(name)
    if m is None:
        stem = Path(path).stem
        ticker = stem.split("_message")[0].split("_orderbook")[0]
        return LobsterName(ticker, None, None)
    try:
        _dt.date.fromisoformat(m["date"])
        date = m["date"]
    except ValueError:
        date = None
    return LobsterName(m["ticker"], date, int(m["level"]))


def find_pairs(paths: Iterable[str | Path]) -> list[tuple[Path, Path]]:
    """(message file, orderbook file) pairs from message files, orderbook files or folders.

    The orderbook file of ``X_message_L.csv`` is ``X_orderbook_L.csv`` in the
    same folder. A folder contributes its ``*_message_*.csv`` files in name
    order. A path given twice (or as both halves of a pair) is used once.
    """
    out: list[tuple[Path, Path]] = []
    seen: set[Path] = set()
    for p in map(Path, paths):
        if p.is_dir():
            candidates = sorted(p.glob("*_message_*.csv"))
            if not candidates:
                raise LobsterError(f"{p}: no *_message_*.csv files in this folder")
        else:
            candidates = [p]
        for c in candidates:
            if "_orderbook_" in c.name and "_message_" not in c.name:
                head, _, tail = c.name.rpartition("_orderbook_")
                c = c.with_name(f"{head}_message_{tail}")
            if "_message_" not in c.name:
                raise LobsterError(f"{c}: not a LOBSTER message file (expected *_message_*.csv)")
            head, _, tail = c.name.rpartition("_message_")
            book = c.with_name(f"{head}_orderbook_{tail}")
            if not c.is_file():
                raise LobsterError(f"{c}: no such message file")
            if not book.is_file():
                raise LobsterError(f"{c}: matching orderbook file {book.name} not found")
            key = c.resolve()
            if key not in seen:
                seen.add(key)
                out.append((c, book))
    return out


@dataclass
class LobsterResult:
    events: np.ndarray  # event_dtype(levels), merged in time order, per-instrument seq from 0
    skipped: list[str]  # "file:line: reason" for each malformed line (the first `max_reported`)
    counts: dict[str, int]  # rows, events, quotes, trades, skipped_rows, halts, ..., type_1..type_7
    instruments: dict[int, str] = field(default_factory=dict)  # instrument id -> ticker
    levels: int = 0


# -- one message/orderbook pair --------------------------------------------------


def _orderbook_columns(book_path: Path, name: LobsterName) -> int:
    """Columns per orderbook row: from the file name's level, else the first lines."""
    if name.levels is not None and name.levels > 0:
        return 4 * name.levels
    counts = []
    with open(book_path, "rb") as f:
        for line in itertools.islice(f, 100):
            if line.strip():
                counts.append(line.count(b",") + 1)
    if not counts:
        return 4  # empty file: any shape will do, there are no rows
    ncols = max(set(counts), key=counts.count)
    if ncols % 4:
        raise LobsterError(f"{book_path}: rows have {ncols} fields, not a multiple of 4 "
                           "(ask price, ask size, bid price, bid size per level)")
    return ncols


class _Reporter:
    """Collects `file:line: reason` lines; raises on the first one when strict."""

    def __init__(self, strict: bool, max_reported: int) -> None:
        self.strict = strict
        self.max_reported = max_reported
        self.lines: list[str] = []
        self.total = 0

    def add(self, path: Path, line_no: int, reason: str) -> None:
        msg = f"{path}:{line_no}: {reason}"
        if self.strict:
            raise LobsterError(msg)
        self.total += 1
        if len(self.lines) < self.max_reported:
            self.lines.append(msg)


def _check_messages(msg: np.ndarray, ok: np.ndarray, reasons: dict[int, str], times: np.ndarray,
                    prev_time: int | None) -> None:
    """Semantic checks of parsed message rows; failures go to `reasons`, ok cleared."""
    typ, size, price, direction = msg["type"], msg["size"], msg["price"], msg["direction"]
    market = (typ >= 1) & (typ <= 6)
    bad = ok & ((typ < 1) | (typ > 7)
                | (market & ((direction != 1) & (direction != -1)))
                | (market & (size < 0)) | (market & (price <= 0))
                | ((typ == 7) & ((price < -1) | (price > 1))))
    for i in np.flatnonzero(bad):
        t, d, s, p = int(typ[i]), int(direction[i]), int(size[i]), int(price[i])
        if not 1 <= t <= 7:
            reasons[i] = f"unknown message type {t} (expected 1..7)"
        elif t == 7:
            reasons[i] = f"halt message price must be -1, 0 or 1, got {p}"
        elif d not in (1, -1):
            reasons[i] = f"direction must be 1 or -1, got {d}"
        elif s < 0:
            reasons[i] = f"negative size {s}"
        else:
            reasons[i] = f"price must be positive, got {p}"
    ok &= ~bad
    # A time earlier than the previous line's cannot be placed: the book rows
    # are sequential states, so sorting would scramble them. Compared with the
    # line just before (not a running maximum), so one bad time costs at most
    # the next line too, not the rest of the file.
    idx = np.flatnonzero(ok)
    if idx.size:
        prev = np.empty(idx.size, np.int64)
        prev[1:] = times[idx[:-1]]
        prev[0] = prev_time if prev_time is not None else times[idx[0]]
        back = times[idx] < prev
        for j in np.flatnonzero(back):
            i = idx[j]
            reasons[i] = f"time goes backwards ({int(times[i])} ns < previous {int(prev[j])} ns after midnight)"
            ok[i] = False


def _check_book(book: np.ndarray, ok: np.ndarray, reasons: dict[int, str]) -> None:
    """book: (rows, levels, 4) int64 as ask px, ask size, bid px, bid size."""
    ask_px, ask_sz, bid_px, bid_sz = book[..., 0], book[..., 1], book[..., 2], book[..., 3]
    bad_level = (((ask_px != DUMMY_ASK_PRICE) & (ask_px <= 0)) | ((bid_px != DUMMY_BID_PRICE) & (bid_px <= 0))
                 | (ask_sz < 0) | (bid_sz < 0))
    bad = ok & bad_level.any(axis=1)
    for i in np.flatnonzero(bad):
        k = int(bad_level[i].argmax())
        a, asz, b, bsz = (int(v) for v in book[i, k])
        if asz < 0 or bsz < 0:
            reasons[i] = f"level {k + 1}: negative size"
        elif a != DUMMY_ASK_PRICE and a <= 0:
            reasons[i] = f"level {k + 1}: ask price {a} is neither positive nor the dummy {DUMMY_ASK_PRICE}"
        else:
            reasons[i] = f"level {k + 1}: bid price {b} is neither positive nor the dummy {DUMMY_BID_PRICE}"
    ok &= ~bad


def _to_levels(book: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """LOBSTER (rows, file_levels, 4) -> our (rows, levels, 4) float32 and n_levels."""
    rows, file_levels = book.shape[0], book.shape[1]
    k = min(levels, file_levels)
    b = book[:, :k]
    ask_real = b[..., 0] != DUMMY_ASK_PRICE
    bid_real = b[..., 2] != DUMMY_BID_PRICE
    out = np.zeros((rows, levels, 4), np.float32)
    out[:, :k, 0] = np.where(bid_real, b[..., 2] / PRICE_SCALE, 0.0)
    out[:, :k, 1] = np.where(bid_real, b[..., 3], 0)
    out[:, :k, 2] = np.where(ask_real, b[..., 0] / PRICE_SCALE, 0.0)
    out[:, :k, 3] = np.where(ask_real, b[..., 1], 0)

    def depth(real: np.ndarray) -> np.ndarray:  # last real level + 1 (a gap does not cut the book short)
        return np.where(real.any(axis=1), k - real[:, ::-1].argmax(axis=1), 0)

    n_levels = np.maximum(np.maximum(depth(ask_real), depth(bid_real)), 1) if k else np.ones(rows, np.int64)
    return out, n_levels


def _events_for_rows(msg: np.ndarray, times: np.ndarray, book: np.ndarray, n_levels: np.ndarray, *,
                     levels: int, instrument: int, midnight_ns: int, quote_after_execution: bool) -> np.ndarray:
    typ = msg["type"]
    per_row = np.where(typ == 7, 0, 1) + ((typ == 4) & quote_after_execution)
    total = int(per_row.sum())
    ev = empty_events(total, levels)
    if total == 0:
        return ev
    rows = np.repeat(np.arange(typ.shape[0]), per_row)
    first = np.ones(total, bool)
    first[1:] = rows[1:] != rows[:-1]
    rtyp = typ[rows]
    trade = first & (rtyp >= 4) & (rtyp <= 6)
    quote = ~trade
    ev["ts_exchange_ns"] = midnight_ns + times[rows]
    ev["instrument"] = instrument
    ev["kind"] = np.where(trade, KIND_TRADE, KIND_QUOTE)
    qrows = rows[quote]
    ev["n_levels"][quote] = n_levels[qrows]
    ev["book"][quote] = book[qrows]
    trows = rows[trade]
    ev["price"][trade] = msg["price"][trows] / PRICE_SCALE
    ev["size"][trade] = msg["size"][trows]
    ev["side"][trade] = -msg["direction"][trows]
    return ev


def _load_pair(msg_path: Path, book_path: Path, *, instrument: int, levels: int, file_columns: int,
               midnight_ns: int, quote_after_execution: bool, report: _Reporter,
               counts: dict[str, int]) -> list[np.ndarray]:
    chunks: list[np.ndarray] = []
    prev_time: int | None = None
    line0 = 0  # lines before this chunk
    file_levels = file_columns // 4
    with open(msg_path, "rb") as mf, open(book_path, "rb") as bf:
        while True:
            mlines = list(itertools.islice(mf, CHUNK_LINES))
            blines = list(itertools.islice(bf, CHUNK_LINES))
            if not mlines and not blines:
                break
            n = max(len(mlines), len(blines))
            msg, mok, mreasons = parse_table(mlines, MESSAGE_COLUMNS, structured=True)
            book, bok, breasons = parse_table(blines, file_columns, structured=False)
            times, tok = times_ns(msg["time"])
            for i in np.flatnonzero(mok & ~tok):
                if len(msg["time"][i]) >= TIME_FIELD_BYTES:  # loadtxt cut it to the field width
                    mreasons[i] = f"time field is longer than {TIME_FIELD_BYTES - 1} characters"
                    mok[i] = False
                    continue
                t = time_ns_from_text(msg["time"][i])
                if isinstance(t, str):
                    mreasons[i] = t
                    mok[i] = False
                else:
                    times[i] = t
            _check_messages(msg, mok, mreasons, times, prev_time)
            if mok.any():
                prev_time = int(times[np.flatnonzero(mok)[-1]])
            book = book.reshape(len(blines), file_levels, 4)
            _check_book(book, bok, breasons)
            # Pair by line: a line missing on either side is reported on the other.
            for i in range(len(blines), len(mlines)):
                mreasons.setdefault(i, "no orderbook row for this message (the orderbook file is shorter)")
            for i in range(len(mlines), len(blines)):
                breasons.setdefault(i, "orderbook row without a message row (the message file is shorter)")
            for i in sorted(set(mreasons) | set(breasons)):
                if i in mreasons:
                    report.add(msg_path, line0 + i + 1, mreasons[i])
                if i in breasons:
                    report.add(book_path, line0 + i + 1, breasons[i])
            m = min(len(mlines), len(blines))
            keep = np.flatnonzero(mok[:m] & bok[:m])
            counts["rows"] += n
            counts["skipped_rows"] += n - keep.size
            if keep.size:
                if keep.size == n:  # the usual clean chunk: no copies
                    msg_k, times_k, book_k = msg, times, book
                else:
                    msg_k, times_k, book_k = msg[keep], times[keep], book[keep]
                typ = msg_k["type"]
                for t in range(1, 8):
                    counts[f"type_{t}"] += int((typ == t).sum())
                halt_px = msg_k["price"][typ == 7]
                counts["halts"] += int((halt_px == -1).sum())
                counts["quote_resumes"] += int((halt_px == 0).sum())
                counts["trade_resumes"] += int((halt_px == 1).sum())
                out_book, n_levels = _to_levels(book_k, levels)
                chunks.append(_events_for_rows(msg_k, times_k, out_book, n_levels, levels=levels,
                                               instrument=instrument, midnight_ns=midnight_ns,
                                               quote_after_execution=quote_after_execution))
            line0 += n
    return chunks


def _resolve_ids(pairs: Sequence[tuple[Path, Path]], names: list[LobsterName],
                 instrument_ids: Sequence[int] | Mapping[str, int] | None) -> list[int]:
    if instrument_ids is None:
        ids = list(range(len(pairs)))
    elif isinstance(instrument_ids, Mapping):
        ids = []
        for (mp, _), nm in zip(pairs, names):
            for key in (str(mp), Path(mp).name, nm.ticker):
                if key in instrument_ids:
                    ids.append(int(instrument_ids[key]))
                    break
            else:
                raise LobsterError(f"{mp}: no instrument id for ticker {nm.ticker!r} in the mapping")
    else:
        ids = [int(i) for i in instrument_ids]
        if len(ids) != len(pairs):
            raise LobsterError(f"{len(ids)} instrument ids for {len(pairs)} message/orderbook pairs")
    for i in ids:
        if not 0 <= i <= MAX_INSTRUMENT_ID:
            raise LobsterError(f"instrument id {i} outside 0..{MAX_INSTRUMENT_ID}")
    return ids


def assign_seq(events: np.ndarray) -> None:
    """Per-instrument sequence numbers 0, 1, 2, ... in table order (in place)."""
    n = events.shape[0]
    if n == 0:
        return
    order = np.argsort(events["instrument"], kind="stable")
    inst = events["instrument"][order]
    starts = np.flatnonzero(np.r_[True, inst[1:] != inst[:-1]])
    group_start = np.repeat(starts, np.diff(np.r_[starts, n]))
    seq = np.empty(n, np.int64)
    seq[order] = np.arange(n) - group_start
    events["seq"] = seq


def load_lobster(pairs: Sequence[tuple[str | Path, str | Path]], *, levels: int | None = None,
                 strict: bool = False, instrument_ids: Sequence[int] | Mapping[str, int] | None = None,
                 quote_after_execution: bool = True, max_reported: int = 1000) -> LobsterResult:
    """Load LOBSTER (message, orderbook) pairs, one instrument each, into one event table.

    levels: book levels per quote (None: the deepest file's). A file with
    more levels is cut, one with fewer is padded with zeros.
    strict: raise LobsterError at the first malformed line instead of
    skipping it (skipped lines are listed in `skipped`, the first
    `max_reported` of them, and counted in counts["skipped_rows"]).
    instrument_ids: one id per pair, or a mapping from ticker (or message file
    name or path) to id; default: the pair's position.
    Events are merged in time order (stable: at equal times, list order,
    then file order) and numbered per instrument from 0.
    """
    pairs = [(Path(m), Path(b)) for m, b in pairs]
    if not pairs:
        raise LobsterError("no LOBSTER files given")
    names = [parse_name(m) for m, _ in pairs]
    ids = _resolve_ids(pairs, names, instrument_ids)
    columns = [_orderbook_columns(b, nm) for (_, b), nm in zip(pairs, names)]
    if levels is None:
        levels = max(c // 4 for c in columns)
    if levels < 1:
        raise LobsterError(f"levels must be >= 1, got {levels}")
    report = _Reporter(strict, max_reported)
    counts = dict.fromkeys(["rows", "skipped_rows", "events", "quotes", "trades", "halts", "quote_resumes",
                            "trade_resumes", *(f"type_{t}" for t in range(1, 8))], 0)
    chunks: list[np.ndarray] = []
    for (mp, bp), nm, inst, cols in zip(pairs, names, ids, columns):
        chunks += _load_pair(mp, bp, instrument=inst, levels=levels, file_columns=cols,
                             midnight_ns=nm.midnight_ns, quote_after_execution=quote_after_execution,
                             report=report, counts=counts)
    events = np.concatenate(chunks) if chunks else empty_events(0, levels)
    if len(pairs) > 1 and events.shape[0]:
        events = events[np.argsort(events["ts_exchange_ns"], kind="stable")]
    assign_seq(events)
    counts["events"] = int(events.shape[0])
    counts["quotes"] = int((events["kind"] == KIND_QUOTE).sum())
    counts["trades"] = int((events["kind"] == KIND_TRADE).sum())
    counts["malformed_lines"] = report.total
    instruments: dict[int, str] = {}
    for inst, nm in zip(ids, names):
        instruments.setdefault(inst, nm.ticker)
    return LobsterResult(events, report.lines, counts, instruments, levels)


__all__ = [
    "LobsterError",
    "LobsterName",
    "LobsterResult",
    "assign_seq",
    "find_pairs",
    "load_lobster",
    "parse_name",
    "time_ns_from_text",
]
