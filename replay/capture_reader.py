"""Reading captures: the whole file into columns (`read_capture`), or just its counts (`capture_info`).

Readers keep every complete, CRC-valid block and report what they dropped
(a torn tail after a crash, a damaged block); a file that is not a capture
at all raises CaptureError. Format: `capture_format`.
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .capture_format import (
    BLOCK,
    TRAILER,
    TRAILER_CRC_SPAN,
    TRAILER_MAGIC,
    CaptureError,
    CaptureHeader,
    decode_header,
    walk_blocks,
)

log = logging.getLogger("hft_infer.replay.capture")

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



def read_capture(path: str | Path, *, verify: bool = True) -> Capture:
    """Read a whole capture into memory; every complete, CRC-valid block is kept.

    A torn or damaged tail (a crash while recording) is dropped with a
    warning and described in `Capture.problems`; a file that is not a capture
    at all raises CaptureError.
    """
    path = Path(path)
    data = path.read_bytes()
    header = decode_header(data, path)
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

    st = walk_blocks(lambda o, n: data[o:o + n], header.size, len(data), verify=verify, on_block=on_block)

    def cat(parts, dtype):
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

    counts = cat(counts_parts, np.int64)
    first = np.zeros(counts.shape[0] + 1, np.int64)
    np.cumsum(counts, out=first[1:])
    used_end = st["end"] + (TRAILER.size if st["trailer"] is not None else 0)
    cap = Capture(path, header, cat(ts_parts, np.int64), first, cat(off_parts, np.int64),
                  cat(len_parts, np.int64), data, st["clean"], st["blocks"], st["problems"],
                  st["lost_records"], len(data) - used_end)
    for p in cap.problems:
        log.warning("%s: %s", path, p)
    return cap


def scan(path: Path, *, verify: bool) -> dict:
    """Counts from the block headers (and payload CRCs if verify), without keeping the data."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        header = decode_header(f.read(min(size, 1 << 16)), path)
        first_last = []

        def read(o: int, n: int) -> bytes:
            f.seek(o)
            return f.read(n)

        def on_block(body: int, h) -> bool:
            first_last.append((h[4], h[5]))
            return True

        st = walk_blocks(read, header.size, size, verify=verify, on_block=on_block)
    used_end = st["end"] + (TRAILER.size if st["trailer"] is not None else 0)
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
    if not verify and size >= TRAILER.size:
        with open(path, "rb") as f:
            header = decode_header(f.read(min(size, 1 << 16)), path)
            f.seek(size - TRAILER.size)
            raw = f.read(TRAILER.size)
        t = TRAILER.unpack(raw)
        if t[0] == TRAILER_MAGIC and zlib.crc32(raw[:TRAILER_CRC_SPAN]) == t[6]:
            end = size - TRAILER.size
            info = {
                "path": str(path), "version": header.version, "created_ns": header.created_ns,
                "endpoint": header.endpoint, "topic_frame": header.topic_frame, "meta": header.meta,
                "records": t[2], "frames": t[3], "blocks": t[1], "first_recv_ns": t[4], "last_recv_ns": t[5],
                "clean": True, "lost_records": 0, "lost_bytes": 0, "file_bytes": size,
                # frame bytes: what is left of the blocks after headers, timestamps and lengths
                "frame_bytes": end - header.size - t[1] * BLOCK.size - 12 * t[2] - 4 * t[3],
                "problems": [],
            }
    if info is None:
        info = scan(path, verify=verify)
        info.pop("_end_of_blocks")
    info["duration_s"] = (info["last_recv_ns"] - info["first_recv_ns"]) / 1e9 if info["records"] else 0.0
    return info



__all__ = ["Capture", "capture_info", "read_capture", "scan"]
