"""Capture files: every frame of a live feed with its receive time, append-safe.

Written by `hft-infer record` (replay/recorder.py), read back as a replay
source. The pieces, one job each:

- `capture_format`: the file layout (header, CRC-checked blocks, trailer)
  and the walk over blocks that the reader, the counter and the appending
  writer share, so that all three agree on what a good block is;
- `capture_writer`: `CaptureWriter`, `write_capture`;
- `capture_reader`: `read_capture` (columns over the whole file), `capture_info`
  (counts from the trailer or the block headers);
- `capture_events`: `decode_events`, `to_events` (Quote/Trade messages as
  an event table).

This module re-exports their public names, and

    python -m hft_infer.replay.capture FILE [--verify]

prints `capture_info` as JSON (exit 2 if FILE is not a readable capture).
"""

from __future__ import annotations

import argparse
import json
import sys

from .capture_events import DecodedCapture, decode_events, to_events
from .capture_format import CaptureError, CaptureHeader
from .capture_reader import Capture, capture_info, read_capture
from .capture_writer import FLUSH_BYTES, FLUSH_MS, FLUSH_RECORDS, CaptureWriter, write_capture

__all__ = [
    "FLUSH_BYTES",
    "FLUSH_MS",
    "FLUSH_RECORDS",
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


def main(argv: list[str] | None = None) -> int:
    """`python -m hft_infer.replay.capture FILE [--verify]`: print capture_info as JSON."""
    p = argparse.ArgumentParser(prog="python -m hft_infer.replay.capture", description=main.__doc__)
    p.add_argument("file")
    p.add_argument("--verify", action="store_true", help="also check every block's CRC (reads the whole file)")
    args = p.parse_args(argv)
    try:
        info = capture_info(args.file, verify=args.verify)
    except (CaptureError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
