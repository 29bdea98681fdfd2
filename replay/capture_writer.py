"""Writing captures: `CaptureWriter` appends records in CRC-checked blocks, one write() per block.

Format: `capture_format`. Crash safety: a block is only written once
complete, so a crash leaves at most one torn block at the end and loses only
the records not yet flushed (at most `flush_records` or `flush_ms` worth).
`CaptureWriter(append=True)` resumes a file: it cuts a torn tail or the
trailer and keeps writing blocks. `fsync=True` makes every block durable
against power loss, at the cost of a disk round trip per block.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from .capture_format import (
    BLOCK,
    BLOCK_CRC_SPAN,
    BLOCK_MAGIC,
    CRC,
    TRAILER,
    TRAILER_CRC_SPAN,
    TRAILER_MAGIC,
    decode_header,
    encode_header,
    read_prefix,
)
from .capture_reader import scan

log = logging.getLogger("hft_infer.replay.capture")

# Default flush policy. 4096 records of ~100-200 bytes is a ~0.5-1 MB block:
# big enough that the per-block write and CRC cost nothing per record, small
# enough to bound what a crash loses. 200 ms bounds it in time on a slow feed.
FLUSH_RECORDS = 4096
FLUSH_BYTES = 4 << 20
FLUSH_MS = 200


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
            self._write(encode_header(time.time_ns(), topic_frame, full_meta))
            self._sync()
        self.header = decode_header(read_prefix(self.path), self.path)

    def _resume(self):
        """Open an existing capture for appending: cut the trailer and any torn tail."""
        info = scan(self.path, verify=True)
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
        head = BLOCK.pack(BLOCK_MAGIC, n, len(self._frames), payload_len, first, last, crc, 0)
        head = head[:BLOCK_CRC_SPAN] + CRC.pack(zlib.crc32(head[:BLOCK_CRC_SPAN]))
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
            body = TRAILER.pack(TRAILER_MAGIC, self.blocks, self.records, self.frames, self.first_ns,
                                 self.last_ns, 0)[:TRAILER_CRC_SPAN]
            self._write(body + CRC.pack(zlib.crc32(body)))
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



__all__ = ["FLUSH_BYTES", "FLUSH_MS", "FLUSH_RECORDS", "CaptureWriter", "write_capture"]
