"""Capture files: every frame of a live feed with its receive time, append-safe.

Written by `hft-infer record` (replay/recorder.py), read back as a replay
source. All integers are little-endian.

File header (once)::

    magic        8 bytes  b"HFTCAP\\r\\n" (the CR LF shows up mangled if the file went through a text-mode copy)
    version      u16      1
    flags        u16      bit 0: messages were declared topic-framed (topic frame + payload)
    created_ns   i64      CLOCK_REALTIME ns when the file was created
    meta_len     u32      length of the metadata that follows
    meta         bytes    JSON object: endpoint, socket_type, topics, host, pid, ...
    header_crc   u32      CRC-32 of everything above

Then blocks, each written with a single write() call::

    magic        4 bytes  b"CBLK"
    n_records    u32      messages in this block
    n_frames     u32      frames in this block (a message has one or more)
    payload_len  u32      bytes of payload after this header
    first_ns     i64      receive time of the first record
    last_ns      i64      receive time of the last record
    payload_crc  u32      CRC-32 of the payload
    header_crc   u32      CRC-32 of the 36 bytes above
    payload:     recv_ns i64[n_records] | frame_count u32[n_records] | frame_len u32[n_frames] | frame bytes

The payload is columnar rather than record by record so that a reader
decodes a whole block with a few `numpy.frombuffer` calls instead of a struct
unpack per record.

A clean close appends a trailer::

    magic        4 bytes  b"CEND"
    n_blocks     u32
    n_records    u64
    n_frames     u64
    first_ns     i64
    last_ns      i64
    crc          u32      CRC-32 of the 40 bytes above

Crash safety: a block is only written once complete, in one write(), so a
crash (or kill -9) leaves at most one torn block at the end; the writer's
unflushed records (at most `flush_records` or `flush_ms` worth) are what is
lost. Readers check the header CRC (a torn header), the length (a torn
payload) and the payload CRC (corruption), keep every complete block and
report what they dropped. The trailer lets `capture_info` answer in O(1);
without one (a crash) it walks the block headers, which costs one small read
per block. `CaptureWriter(append=True)` resumes a file: it cuts a torn tail
or the trailer and keeps writing blocks.

`fsync=True` makes every block durable against power loss, at the cost of a
disk round trip per block; without it a crash of the process loses nothing
that was flushed, a crash of the machine may lose what the page cache held.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import struct
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np

from hft_infer.transport.schema import Heartbeat, IngressMessage, Quote, Trade

from .events import KIND_QUOTE, KIND_TRADE, empty_events

log = logging.getLogger(__name__)

MAGIC = b"HFTCAP\r\n"
VERSION = 1
FLAG_TOPIC_FRAME = 1

_FILE_HEAD = struct.Struct("<8sHHqI")
_CRC = struct.Struct("<I")
BLOCK_MAGIC = b"CBLK"
_BLOCK = struct.Struct("<4sIIIqqII")
_BLOCK_CRC_SPAN = _BLOCK.size - 4
TRAILER_MAGIC = b"CEND"
_TRAILER = struct.Struct("<4sIQQqqI")
_TRAILER_CRC_SPAN = _TRAILER.size - 4

# Default flush policy. 4096 records of ~100-200 bytes is a ~0.5-1 MB block:
# big enough that the per-block write and CRC cost nothing per record, small
# enough to bound what a crash loses. 200 ms bounds it in time on a slow feed.
FLUSH_RECORDS = 4096
FLUSH_BYTES = 4 << 20
FLUSH_MS = 200


class CaptureError(ValueError):
    """A file that is not a readable capture (bad magic, version or header); one line."""


@dataclass(frozen=True)
class CaptureHeader:
    version: int
    topic_frame: bool
    created_ns: int
    meta: dict
    size: int  # bytes, where the first block starts

    @property
    def endpoint(self) -> str:
        return str(self.meta.get("endpoint", ""))


def _encode_header(created_ns: int, topic_frame: bool, meta: dict) -> bytes:
    meta_bytes = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    head = _FILE_HEAD.pack(MAGIC, VERSION, FLAG_TOPIC_FRAME if topic_frame else 0, created_ns, len(meta_bytes))
    body = head + meta_bytes
    return body + _CRC.pack(zlib.crc32(body))


def _decode_header(buf: bytes | memoryview, path: str | Path) -> CaptureHeader:
    if len(buf) < _FILE_HEAD.size or bytes(buf[:8]) != MAGIC:
        if len(buf) >= 6 and bytes(buf[:6]) == MAGIC[:6]:
            raise CaptureError(f"{path}: capture header is damaged (line endings converted, or truncated)")
        raise CaptureError(f"{path}: not a capture file (no {MAGIC[:6].decode()} header)")
    magic, version, flags, created_ns, meta_len = _FILE_HEAD.unpack_from(buf, 0)
    if version != VERSION:
        raise CaptureError(f"{path}: capture version {version} is not supported (this reader knows {VERSION})")
    end = _FILE_HEAD.size + meta_len
    if len(buf) < end + 4:
        raise CaptureError(f"{path}: capture header is truncated")
    (crc,) = _CRC.unpack_from(buf, end)
    if zlib.crc32(buf[:end]) != crc:
        raise CaptureError(f"{path}: capture header CRC mismatch (damaged file)")
    try:
        meta = json.loads(bytes(buf[_FILE_HEAD.size:end]))
    except ValueError:
        raise CaptureError(f"{path}: capture metadata is not valid JSON") from None
    return CaptureHeader(version, bool(flags & FLAG_TOPIC_FRAME), created_ns, meta, end + 4)


class CaptureWriter:
    """Appends records (receive time + frames of one message) in CRC-checked blocks.

    `add` only appends to lists (the recorder's per-message cost); a block is
    encoded and written when `flush_records` records or `flush_bytes` bytes
    are pending, or by `flush_if_due` once the oldest pending record is
    `flush_ms` old. Use as a context manager, or call `close()`: it flushes
    and writes the trailer.
    """

    def __init__(self, path: str | Path, *, endpoint: str = "", topic_frame: bool = True,
                 meta: dict | None = None, flush_records: int = FLUSH_RECORDS, flush_bytes: int = FLUSH_BYTES,
                 flush_ms: float = FLUSH_MS, fsync: bool = False, append: bool = False,
                 overwrite: bool = False) -> None:
        if flush_records < 1 or flush_bytes < 1 or flush_ms <= 0:
            raise ValueError("flush_records, flush_bytes and flush_ms must be positive")
        self.path = Path(path)
        self.flush_records = flush_records
        self.flush_bytes = flush_bytes
        self.flush_ns = int(flush_ms * 1e6)
        self.fsync = fsync
        self.records = 0
        self.frames = 0
        self.blocks = 0
        self.frame_bytes = 0
        self.first_ns = 0
        self.last_ns = 0
        self._ts: list[int] = []
        self._counts: list[int] = []
        self._frames: list[bytes] = []
        self._pending_bytes = 0
        self._pending_since = 0  # monotonic ns of the oldest pending record
        self._closed = False
        if append and self.path.exists() and self.path.stat().st_size > 0:
            self._f = self._resume()
        else:
            if self.path.exists() and not (overwrite or append):
                raise FileExistsError(f"{self.path}: file exists (overwrite or append it explicitly)")
            full_meta = {"endpoint": endpoint, "host": socket.gethostname(), "pid": os.getpid(),
                         "writer": "hft-infer", **(meta or {})}
            self._f = open(self.path, "wb", buffering=0)
            self._write(_encode_header(time.time_ns(), topic_frame, full_meta))
            self._sync()
        self.header = _decode_header(_read_prefix(self.path), self.path)

    def _resume(self):
        """Open an existing capture for appending: cut the trailer and any torn tail."""
        info = _scan(self.path, verify=True)
        f = open(self.path, "r+b", buffering=0)
        f.truncate(info["_end_of_blocks"])
        f.seek(0, os.SEEK_END)
        self.records, self.frames, self.blocks = info["records"], info["frames"], info["blocks"]
        self.frame_bytes = info["frame_bytes"]
        self.first_ns, self.last_ns = info["first_recv_ns"], info["last_recv_ns"]
        for p in info["problems"]:
            log.warning("%s: resuming: %s", self.path, p)
        return f

    def _write(self, buf: bytes) -> None:
        view = memoryview(buf)
        while view:
            n = self._f.write(view)
            view = view[n:]

    def _sync(self) -> None:
        if self.fsync:
            os.fsync(self._f.fileno())

    @property
    def pending(self) -> int:
        return len(self._ts)

    def add(self, recv_ns: int, frames: Sequence[bytes]) -> None:
        """One received message: its receive time and its frames (bytes-like)."""
        ts = self._ts
        if not ts:
            self._pending_since = time.monotonic_ns()
        ts.append(recv_ns)
        self._counts.append(len(frames))
        self._frames.extend(frames)
        self._pending_bytes += sum(map(len, frames))
        if len(ts) >= self.flush_records or self._pending_bytes >= self.flush_bytes:
            self.flush()

    @property
    def flush_due_ns(self) -> int | None:
        """Monotonic ns at which the pending records are due to be written (None: nothing pending)."""
        return self._pending_since + self.flush_ns if self._ts else None

    def flush_if_due(self, now_mono_ns: int | None = None) -> bool:
        """Flush if the oldest pending record has waited `flush_ms`; True if it wrote a block."""
        if self._ts and (now_mono_ns or time.monotonic_ns()) - self._pending_since >= self.flush_ns:
            self.flush()
            return True
        return False

    def flush(self) -> None:
        """Write the pending records as one block (one write call)."""
        n = len(self._ts)
        if n == 0:
            return
        ts = np.array(self._ts, dtype="<i8")
        counts = np.array(self._counts, dtype="<u4")
        lengths = np.fromiter(map(len, self._frames), dtype="<u4", count=len(self._frames))
        data = b"".join(self._frames)
        parts = [ts.tobytes(), counts.tobytes(), lengths.tobytes(), data]
        crc = 0
        for p in parts:
            crc = zlib.crc32(p, crc)
        payload_len = sum(map(len, parts))
        first, last = int(ts[0]), int(ts[-1])
        head = _BLOCK.pack(BLOCK_MAGIC, n, len(self._frames), payload_len, first, last, crc, 0)
        head = head[:_BLOCK_CRC_SPAN] + _CRC.pack(zlib.crc32(head[:_BLOCK_CRC_SPAN]))
        self._write(b"".join([head, *parts]))
        self._sync()
        if self.records == 0:
            self.first_ns = first
        self.last_ns = last
        self.records += n
        self.frames += len(self._frames)
        self.blocks += 1
        self.frame_bytes += len(data)
        self._ts, self._counts, self._frames = [], [], []
        self._pending_bytes = 0

    def close(self) -> None:
        """Flush, write the trailer, close. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush()
            body = _TRAILER.pack(TRAILER_MAGIC, self.blocks, self.records, self.frames, self.first_ns,
                                 self.last_ns, 0)[:_TRAILER_CRC_SPAN]
            self._write(body + _CRC.pack(zlib.crc32(body)))
            self._sync()
        finally:
            self._f.close()

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_capture(path: str | Path, recv_ns: Iterable[int], messages: Iterable[Sequence[bytes]], *,
                  endpoint: str = "", topic_frame: bool = True, overwrite: bool = False,
                  **writer_kw) -> int:
    """Write a whole capture at once (tools, tests, converters); returns the record count."""
    with CaptureWriter(path, endpoint=endpoint, topic_frame=topic_frame, overwrite=overwrite, **writer_kw) as w:
        for ts, frames in zip(recv_ns, messages, strict=True):
            w.add(int(ts), frames)
    return w.records


@dataclass
class Capture:
    """A capture in memory: columns over one buffer holding the file.

    Record i was received at `recv_ts_ns[i]` and has the frames
    `frame_first[i]` .. `frame_first[i+1]-1`; frame j is
    `data[frame_offset[j] : frame_offset[j] + frame_length[j]]`.
    """

    path: Path
    header: CaptureHeader
    recv_ts_ns: np.ndarray  # int64, one per record (message)
    frame_first: np.ndarray  # int64, n_records + 1
    frame_offset: np.ndarray  # int64, one per frame, into `data`
    frame_length: np.ndarray  # int64, one per frame
    data: bytes
    clean: bool  # the file ends with a valid trailer (closed cleanly)
    blocks: int
    problems: list[str] = field(default_factory=list)  # what was dropped, and why
    lost_records: int = 0  # records in blocks that were dropped (where their header could be read)
    lost_bytes: int = 0  # bytes of the file that were not used

    def __len__(self) -> int:
        return int(self.recv_ts_ns.shape[0])

    @property
    def n_frames(self) -> int:
        return int(self.frame_offset.shape[0])

    def frames(self, i: int) -> tuple[bytes, ...]:
        d, off, ln = self.data, self.frame_offset, self.frame_length
        return tuple(d[int(off[j]):int(off[j] + ln[j])] for j in range(int(self.frame_first[i]),
                                                                       int(self.frame_first[i + 1])))

    def all_frames(self) -> list[bytes]:
        """Every frame as its own bytes object, in order (for building send lists)."""
        d = self.data
        return [d[o:o + n] for o, n in zip(self.frame_offset.tolist(), self.frame_length.tolist())]

    def messages(self) -> list[tuple[bytes, ...]]:
        """Every record's frames as a tuple, in order."""
        flat = self.all_frames()
        first = self.frame_first.tolist()
        counts = np.diff(self.frame_first)
        if counts.size and (counts == counts[0]).all():  # the usual case: all topic+payload or all single
            k = int(counts[0])
            return list(zip(*(flat[j::k] for j in range(k)))) if k else [()] * len(self)
        return [tuple(flat[first[i]:first[i + 1]]) for i in range(len(self))]

    def payloads(self) -> list[bytes]:
        """The last frame of every record (the message; a topic frame, if any, precedes it)."""
        d = self.data
        last = self.frame_first[1:] - 1
        if np.any(last < self.frame_first[:-1]):
            raise CaptureError(f"{self.path}: a record has no frames")
        return [d[o:o + n] for o, n in zip(self.frame_offset[last].tolist(), self.frame_length[last].tolist())]


def _read_prefix(path: Path, n: int = 1 << 16) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def _walk(buf, start: int, end_of_file: int, *, verify: bool, on_block) -> dict:
    """Walk blocks in `buf` (bytes, or a reader returning bytes at an offset).

    Calls on_block(offset_of_payload, header_tuple) for every good block.
    Returns counters and problems; shared by the reader, the info scan and
    the appending writer so that all three agree on what a good block is.
    """
    pos = start
    st = {"blocks": 0, "records": 0, "frames": 0, "frame_bytes": 0, "problems": [], "lost_records": 0,
          "clean": False, "trailer": None}
    while pos < end_of_file:
        remaining = end_of_file - pos
        magic = buf(pos, 4)
        if magic == TRAILER_MAGIC and remaining >= _TRAILER.size:
            raw = buf(pos, _TRAILER.size)
            t = _TRAILER.unpack(raw)
            if zlib.crc32(raw[:_TRAILER_CRC_SPAN]) == t[6]:
                st["trailer"] = t
                st["clean"] = remaining == _TRAILER.size
                if not st["clean"]:
                    st["problems"].append(f"{remaining - _TRAILER.size} bytes after the trailer ignored")
                if (t[1], t[2], t[3]) != (st["blocks"], st["records"], st["frames"]):
                    st["problems"].append(
                        f"trailer says {t[2]} records in {t[1]} blocks, found {st['records']} in {st['blocks']}")
                st["end"] = pos
                return st
        if magic == TRAILER_MAGIC:  # a crash while closing: every block before it is intact
            st["problems"].append(f"torn or damaged trailer at offset {pos} ({remaining} bytes): ignored")
            break
        if remaining < _BLOCK.size:
            st["problems"].append(f"torn block header at offset {pos} ({remaining} bytes): ignored")
            break
        raw = buf(pos, _BLOCK.size)
        h = _BLOCK.unpack(raw)
        if h[0] != BLOCK_MAGIC or zlib.crc32(raw[:_BLOCK_CRC_SPAN]) != h[7]:
            what = "bad block magic" if h[0] != BLOCK_MAGIC else "block header CRC mismatch"
            st["problems"].append(f"{what} at offset {pos}: the remaining {remaining} bytes are unreadable")
            break
        _, n_rec, n_frames, payload_len, _, _, payload_crc, _ = h
        body = pos + _BLOCK.size
        if payload_len > end_of_file - body:
            st["problems"].append(f"torn last block at offset {pos} ({remaining} of {_BLOCK.size + payload_len} "
                                  f"bytes): {n_rec} record(s) lost")
            st["lost_records"] += n_rec
            break
        if payload_len < 12 * n_rec + 4 * n_frames:
            st["problems"].append(f"block at offset {pos} is inconsistent (payload too short): "
                                  f"{n_rec} records skipped")
            st["lost_records"] += n_rec
        elif verify and zlib.crc32(buf(body, payload_len)) != payload_crc:
            st["problems"].append(f"block at offset {pos} fails its CRC: {n_rec} record(s) skipped")
            st["lost_records"] += n_rec
        elif on_block is None or on_block(body, h):
            st["blocks"] += 1
            st["records"] += n_rec
            st["frames"] += n_frames
            st["frame_bytes"] += payload_len - 12 * n_rec - 4 * n_frames
        else:
            st["problems"].append(f"block at offset {pos} is inconsistent (frame counts or lengths do not add up): "
                                  f"{n_rec} records skipped")
            st["lost_records"] += n_rec
        pos = body + payload_len
    st["end"] = pos
    return st


def read_capture(path: str | Path, *, verify: bool = True) -> Capture:
    """Read a whole capture into memory; every complete, CRC-valid block is kept.

    A torn or damaged tail (a crash while recording) is dropped with a
    warning and described in `Capture.problems`; a file that is not a capture
    at all raises CaptureError.
    """
    path = Path(path)
    data = path.read_bytes()
    header = _decode_header(data, path)
    ts_parts, counts_parts, off_parts, len_parts = [], [], [], []

    def on_block(body: int, h) -> bool:
        _, n, nf, payload_len, _, _, _, _ = h
        ts = np.frombuffer(data, "<i8", n, body)
        counts = np.frombuffer(data, "<u4", n, body + 8 * n)
        lengths = np.frombuffer(data, "<u4", nf, body + 12 * n).astype(np.int64)
        frames_at = body + 12 * n + 4 * nf
        if int(counts.sum()) != nf or frames_at + int(lengths.sum()) != body + payload_len:
            return False
        ends = np.cumsum(lengths)
        ts_parts.append(ts)
        counts_parts.append(counts)
        off_parts.append(frames_at + ends - lengths)
        len_parts.append(lengths)
        return True

    st = _walk(lambda o, n: data[o:o + n], header.size, len(data), verify=verify, on_block=on_block)

    def cat(parts, dtype):
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

    counts = cat(counts_parts, np.int64)
    first = np.zeros(counts.shape[0] + 1, np.int64)
    np.cumsum(counts, out=first[1:])
    used_end = st["end"] + (_TRAILER.size if st["trailer"] is not None else 0)
    cap = Capture(path, header, cat(ts_parts, np.int64), first, cat(off_parts, np.int64),
                  cat(len_parts, np.int64), data, st["clean"], st["blocks"], st["problems"],
                  st["lost_records"], len(data) - used_end)
    for p in cap.problems:
        log.warning("%s: %s", path, p)
    return cap


def _scan(path: Path, *, verify: bool) -> dict:
    """Counts from the block headers (and payload CRCs if verify), without keeping the data."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        header = _decode_header(f.read(min(size, 1 << 16)), path)
        first_last = []

        def read(o: int, n: int) -> bytes:
            f.seek(o)
            return f.read(n)

        def on_block(body: int, h) -> bool:
            first_last.append((h[4], h[5]))
            return True

        st = _walk(read, header.size, size, verify=verify, on_block=on_block)
    used_end = st["end"] + (_TRAILER.size if st["trailer"] is not None else 0)
    return {
        "path": str(path),
        "version": header.version,
        "created_ns": header.created_ns,
        "endpoint": header.endpoint,
        "topic_frame": header.topic_frame,
        "meta": header.meta,
        "records": st["records"],
        "frames": st["frames"],
        "blocks": st["blocks"],
        "first_recv_ns": first_last[0][0] if first_last else 0,
        "last_recv_ns": first_last[-1][1] if first_last else 0,
        "clean": st["clean"],
        "lost_records": st["lost_records"],
        "lost_bytes": size - used_end,
        "file_bytes": size,
        "frame_bytes": st["frame_bytes"],
        "problems": st["problems"],
        "_end_of_blocks": st["end"],
    }


def capture_info(path: str | Path, *, verify: bool = False) -> dict:
    """How many records (events) a capture holds, and whether it was closed cleanly.

    Reads only the file header and the block headers (one small read per
    block), or just the trailer when the file ends with a valid one;
    `verify=True` also checks every payload CRC. Keys: records, frames,
    blocks, first_recv_ns, last_recv_ns, duration_s, clean, lost_records,
    lost_bytes, file_bytes, frame_bytes, endpoint, created_ns, topic_frame,
    version, meta, problems.
    """
    path = Path(path)
    size = path.stat().st_size
    info = None
    if not verify and size >= _TRAILER.size:
        with open(path, "rb") as f:
            header = _decode_header(f.read(min(size, 1 << 16)), path)
            f.seek(size - _TRAILER.size)
            raw = f.read(_TRAILER.size)
        t = _TRAILER.unpack(raw)
        if t[0] == TRAILER_MAGIC and zlib.crc32(raw[:_TRAILER_CRC_SPAN]) == t[6]:
            end = size - _TRAILER.size
            info = {
                "path": str(path), "version": header.version, "created_ns": header.created_ns,
                "endpoint": header.endpoint, "topic_frame": header.topic_frame, "meta": header.meta,
                "records": t[2], "frames": t[3], "blocks": t[1], "first_recv_ns": t[4], "last_recv_ns": t[5],
                "clean": True, "lost_records": 0, "lost_bytes": 0, "file_bytes": size,
                # frame bytes: what is left of the blocks after headers, timestamps and lengths
                "frame_bytes": end - header.size - t[1] * _BLOCK.size - 12 * t[2] - 4 * t[3],
                "problems": [],
            }
    if info is None:
        info = _scan(path, verify=verify)
        info.pop("_end_of_blocks")
    info["duration_s"] = (info["last_recv_ns"] - info["first_recv_ns"]) / 1e9 if info["records"] else 0.0
    return info


@dataclass
class DecodedCapture:
    events: np.ndarray  # event table (Quote and Trade messages, in capture order)
    record_index: np.ndarray  # int64: the capture record each event came from
    heartbeats: int
    undecodable: int  # payloads that are not Quote/Trade/Heartbeat (counted, skipped)


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
    quotes: list[tuple[int, Quote]] = []
    trades: list[tuple[int, Trade]] = []
    heartbeats = undecodable = 0
    for i, p in enumerate(payloads):
        try:
            m = dec(p)
        except msgspec.DecodeError:
            undecodable += 1
            continue
        t = type(m)
        if t is Quote:
            quotes.append((i, m))
        elif t is Trade:
            trades.append((i, m))
        elif t is Heartbeat:
            heartbeats += 1
    if levels is None:
        levels = max([q.n_levels for _, q in quotes], default=1) or 1
    n = len(quotes) + len(trades)
    ev = empty_events(n, levels)
    rec = np.array([i for i, _ in quotes] + [i for i, _ in trades], dtype=np.int64)
    nq = len(quotes)
    if nq:
        qs = [q for _, q in quotes]
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
        ts_ = [t for _, t in trades]
        sl = slice(nq, n)
        ev["instrument"][sl] = [t.instrument for t in ts_]
        ev["seq"][sl] = [t.seq for t in ts_]
        ev["ts_exchange_ns"][sl] = [t.ts_exchange_ns for t in ts_]
        ev["priority"][sl] = [t.priority for t in ts_]
        ev["kind"][sl] = KIND_TRADE
        ev["price"][sl] = [t.price for t in ts_]
        ev["size"][sl] = [t.size for t in ts_]
        ev["side"][sl] = [t.side for t in ts_]
    order = np.argsort(rec, kind="stable")  # back to capture order
    return DecodedCapture(ev[order], rec[order], heartbeats, undecodable)


def to_events(capture: Capture, levels: int | None = None) -> np.ndarray:
    """The capture's Quote/Trade messages as an event table (heartbeats and junk skipped)."""
    return decode_events(capture, levels).events


def main(argv: list[str] | None = None) -> int:
    """`python -m hft_infer.replay.capture FILE [--verify]`: print capture_info as JSON."""
    p = argparse.ArgumentParser(prog="python -m hft_infer.replay.capture", description=main.__doc__)
    p.add_argument("file")
    p.add_argument("--verify", action="store_true", help="also check every block's CRC (reads the whole file)")
    args = p.parse_args(argv)
    try:
        info = capture_info(args.file, verify=args.verify)
    except (CaptureError, OSError) as e:
        print(f"error: {e}", file=__import__("sys").stderr)
        return 2
    print(json.dumps(info, indent=2))
    return 0


__all__ = [
    "Capture",
    "CaptureError",
    "CaptureHeader",
    "CaptureWriter",
    "DecodedCapture",
    "capture_info",
    "decode_events",
    "read_capture",
    "to_events",
    "write_capture",
]

if __name__ == "__main__":
    raise SystemExit(main())
