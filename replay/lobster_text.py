"""LOBSTER CSV text -> numbers, exactly and in bulk (replay/lobster.py maps them to events).

Lines go to `numpy.loadtxt` (C) in chunks; a chunk that fails is re-parsed in
smaller pieces and, finally, line by line, so that each malformed line is named
with its reason. Times (seconds after midnight, a decimal with up to 9 places)
are decoded with vectorised byte arithmetic, never through a float;
`time_ns_from_text` is the one-line reference the vectorised path must agree with.
"""

from __future__ import annotations

import re
import warnings

import numpy as np

# A chunk that fails is retried in pieces of this size before going line by line.
SUBCHUNK_LINES = 1_024
# Time text up to this many bytes; a longer field is rejected, never truncated.
TIME_FIELD_BYTES = 40

MESSAGE_DTYPE = np.dtype([("time", f"S{TIME_FIELD_BYTES}"), ("type", "<i8"), ("order_id", "<i8"),
                           ("size", "<i8"), ("price", "<i8"), ("direction", "<i8")])

_TIME = re.compile(rb"(\d{1,9})(?:\.(\d{0,9}))?")
_POW10 = 10 ** np.arange(19, dtype=np.int64)


# -- exact time parsing --------------------------------------------------------


def time_ns_from_text(text: bytes) -> int | str:
    """Seconds-after-midnight text -> integer ns, or the reason it is malformed.

    The reference implementation: `times_ns` below must agree with it
    wherever it accepts (tests check).
    """
    s = text.strip()
    m = _TIME.fullmatch(s)
    if m is None:
        if re.fullmatch(rb"\d+\.\d{10,}", s):
            return f"time {s.decode(errors='replace')!r} has more than 9 decimal places"
        if re.fullmatch(rb"\d{10,}(\.\d*)?", s):
            return f"time {s.decode(errors='replace')!r} is out of range"
        return f"time {s.decode(errors='replace')!r} is not a decimal number of seconds"
    return int(m[1]) * 1_000_000_000 + int((m[2] or b"").ljust(9, b"0"))


def times_ns(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised `time_ns_from_text` over an S-dtype array: (ns, ok).

    Byte arithmetic on the (rows, width) uint8 view: digit j contributes
    d * 10**e with e = 9 + dot - j - (j < dot), so rows that share the dot
    position and length (in a LOBSTER file, nearly all of them) share one
    weight vector and are decoded by one integer matrix-vector product. Rows
    with anything unusual (spaces, signs, too many digits) come back not ok
    and go to the reference parser, which either accepts them or says why not.
    """
    n = raw.shape[0]
    vals = np.zeros(n, np.int64)
    if n == 0:
        return vals, np.zeros(0, bool)
    w = raw.dtype.itemsize
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(n, w)
    used = b != 0
    ok = ~used[:, -1]  # a full-width field may have been cut by the reader
    length = used.sum(axis=1)
    width = max(int(length.max()), 1)
    b, used = b[:, :width], used[:, :width]
    col = np.arange(width)
    d = b - np.uint8(0x30)  # wraps around below '0': d < 10 only for digits
    digit = d < 10
    dot = b == 0x2E
    ndots = dot.sum(axis=1)
    dotpos = np.where(ndots == 1, dot.argmax(axis=1), length)
    ok &= ((digit | dot) == used).all(axis=1)  # only digits and one dot, nulls only as padding
    ok &= (used == (col < length[:, None])).all(axis=1)
    ok &= (ndots <= 1) & (dotpos >= 1) & (dotpos <= 9) & (length - dotpos - 1 <= 9)
    key = np.where(ok, dotpos * (width + 1) + length, -1)
    for k in np.unique(key[ok]):
        rows = np.flatnonzero(key == k)
        dp, ln = divmod(int(k), width + 1)
        exp = 9 + dp - col - (col < dp)
        weights = np.where((col < ln) & (col != dp), _POW10[np.clip(exp, 0, 18)], 0)
        vals[rows] = d[rows].astype(np.int64) @ weights
    return vals, ok


# -- bulk CSV parsing with per-line diagnosis -----------------------------------


def loadtxt(lines: list[bytes], dtype: np.dtype, ndmin: int) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "input contained no data" for an all-blank chunk
        return np.loadtxt(lines, dtype=dtype, delimiter=",", comments=None, ndmin=ndmin)


def _line_fields(line: bytes, ncols: int) -> list[bytes] | str:
    s = line.rstrip(b"\r\n")
    if not s.strip():
        return "empty line"
    fields = s.split(b",")
    if len(fields) != ncols:
        return f"expected {ncols} fields, got {len(fields)}"
    return fields


def _int_field(f: bytes, k: int) -> int | str:
    try:
        v = int(f)
    except ValueError:
        return f"field {k + 1} is not an integer: {f.strip().decode(errors='replace')!r}"
    if not -(1 << 63) <= v < (1 << 63):
        return f"field {k + 1} is out of range: {f.strip().decode(errors='replace')}"
    return v


def parse_table(lines: list[bytes], ncols: int, structured: bool) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """Parse lines as ncols-field CSV rows: (table, ok mask, {index: reason}).

    Fast path: one loadtxt call. loadtxt silently skips blank lines and says
    nothing useful per line, so a chunk that fails (or comes back with the
    wrong shape) is split and retried, and only small failing pieces are
    parsed line by line.
    """
    n = len(lines)
    dtype = MESSAGE_DTYPE if structured else np.dtype("<i8")
    if n == 0:
        return (np.zeros(0, dtype) if structured else np.zeros((0, ncols), dtype)), np.zeros(0, bool), {}
    try:
        arr = loadtxt(lines, dtype, 1 if structured else 2)
        if arr.shape[0] == n and (structured or arr.shape[1] == ncols):
            return arr, np.ones(n, bool), {}
    except ValueError:
        pass
    if n > SUBCHUNK_LINES:
        parts = [parse_table(lines[i:i + SUBCHUNK_LINES], ncols, structured) for i in range(0, n, SUBCHUNK_LINES)]
        reasons: dict[int, str] = {}
        for j, (_, _, r) in enumerate(parts):
            reasons.update({j * SUBCHUNK_LINES + k: v for k, v in r.items()})
        return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), reasons)
    arr = np.zeros(n, dtype) if structured else np.zeros((n, ncols), dtype)
    ok = np.zeros(n, bool)
    reasons = {}
    for i, line in enumerate(lines):
        fields = _line_fields(line, ncols)
        if isinstance(fields, str):
            reasons[i] = fields
            continue
        first_int = 1 if structured else 0
        vals = [_int_field(f, k) for k, f in enumerate(fields) if k >= first_int]
        bad = next((v for v in vals if isinstance(v, str)), None)
        if bad is not None:
            reasons[i] = bad
            continue
        if structured:
            t = fields[0].strip()
            if len(t) >= TIME_FIELD_BYTES:
                reasons[i] = f"time field is longer than {TIME_FIELD_BYTES - 1} characters"
                continue
            arr[i] = (t, *vals)
        else:
            arr[i] = vals
        ok[i] = True
    return arr, ok, reasons
