"""The capture file format: header, blocks, trailer, and the one walk over blocks every reader shares.

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

import json
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"HFTCAP\r\n"
VERSION = 1
FLAG_TOPIC_FRAME = 1

FILE_HEAD = struct.Struct("<8sHHqI")
CRC = struct.Struct("<I")
BLOCK_MAGIC = b"CBLK"
BLOCK = struct.Struct("<4sIIIqqII")
BLOCK_CRC_SPAN = BLOCK.size - 4
TRAILER_MAGIC = b"CEND"
TRAILER = struct.Struct("<4sIQQqqI")
TRAILER_CRC_SPAN = TRAILER.size - 4


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


def encode_header(created_ns: int, topic_frame: bool, meta: dict) -> bytes:
    meta_bytes = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    head = FILE_HEAD.pack(MAGIC, VERSION, FLAG_TOPIC_FRAME if topic_frame else 0, created_ns, len(meta_bytes))
    body = head + meta_bytes
    return body + CRC.pack(zlib.crc32(body))


def decode_header(buf: bytes | memoryview, path: str | Path) -> CaptureHeader:
    if len(buf) < FILE_HEAD.size or bytes(buf[:8]) != MAGIC:
        if len(buf) >= 6 and bytes(buf[:6]) == MAGIC[:6]:
            raise CaptureError(f"{path}: capture header is damaged (line endings converted, or truncated)")
        raise CaptureError(f"{path}: not a capture file (no {MAGIC[:6].decode()} header)")
    magic, version, flags, created_ns, meta_len = FILE_HEAD.unpack_from(buf, 0)
    if version != VERSION:
        raise CaptureError(f"{path}: capture version {version} is not supported (this reader knows {VERSION})")
    end = FILE_HEAD.size + meta_len
    if len(buf) < end + 4:
        raise CaptureError(f"{path}: capture header is truncated")
    (crc,) = CRC.unpack_from(buf, end)
    if zlib.crc32(buf[:end]) != crc:
        raise CaptureError(f"{path}: capture header CRC mismatch (damaged file)")
    try:
        meta = json.loads(bytes(buf[FILE_HEAD.size:end]))
    except ValueError:
        raise CaptureError(f"{path}: capture metadata is not valid JSON") from None
    return CaptureHeader(version, bool(flags & FLAG_TOPIC_FRAME), created_ns, meta, end + 4)



def read_prefix(path: Path, n: int = 1 << 16) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def walk_blocks(buf, start: int, end_of_file: int, *, verify: bool, on_block) -> dict:
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
        if magic == TRAILER_MAGIC and remaining >= TRAILER.size:
            raw = buf(pos, TRAILER.size)
            t = TRAILER.unpack(raw)
            if zlib.crc32(raw[:TRAILER_CRC_SPAN]) == t[6]:
                st["trailer"] = t
                st["clean"] = remaining == TRAILER.size
                if not st["clean"]:
                    st["problems"].append(f"{remaining - TRAILER.size} bytes after the trailer ignored")
                if (t[1], t[2], t[3]) != (st["blocks"], st["records"], st["frames"]):
                    st["problems"].append(
                        f"trailer says {t[2]} records in {t[1]} blocks, found {st['records']} in {st['blocks']}")
                st["end"] = pos
                return st
        if magic == TRAILER_MAGIC:  # a crash while closing: every block before it is intact
            st["problems"].append(f"torn or damaged trailer at offset {pos} ({remaining} bytes): ignored")
            break
        if remaining < BLOCK.size:
            st["problems"].append(f"torn block header at offset {pos} ({remaining} bytes): ignored")
            break
        raw = buf(pos, BLOCK.size)
        h = BLOCK.unpack(raw)
        if h[0] != BLOCK_MAGIC or zlib.crc32(raw[:BLOCK_CRC_SPAN]) != h[7]:
            what = "bad block magic" if h[0] != BLOCK_MAGIC else "block header CRC mismatch"
            st["problems"].append(f"{what} at offset {pos}: the remaining {remaining} bytes are unreadable")
            break
        _, n_rec, n_frames, payload_len, _, _, payload_crc, _ = h
        body = pos + BLOCK.size
        if payload_len > end_of_file - body:
            st["problems"].append(f"torn last block at offset {pos} ({remaining} of {BLOCK.size + payload_len} "
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



__all__ = ["BLOCK", "BLOCK_MAGIC", "CRC", "FLAG_TOPIC_FRAME", "MAGIC", "TRAILER", "TRAILER_MAGIC", "VERSION",
           "CaptureError", "CaptureHeader", "decode_header", "encode_header", "read_prefix", "walk_blocks"]
