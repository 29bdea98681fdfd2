"""`hft-infer record` and `hft-infer replay` (the latter a placeholder, issue 7).

Registered by hft_infer/cli.py, which imports this module to build the
parser: keep module-level imports to argparse and sys (no numpy, zmq or
torch until a command runs). User errors raise hft_infer.cli.UserError
(imported inside functions; `replay` must not import the service core at
module level), which the CLI prints as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import sys

# -- record ------------------------------------------------------------------


def add_record_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", required=True, metavar="E",
                        help="feed to record, e.g. ipc:///run/hft-infer/md.sock or tcp://127.0.0.1:5555")
    parser.add_argument("--out", required=True, metavar="FILE", help="capture file to write")
    parser.add_argument("--duration", type=float, default=None, metavar="S",
                        help="stop after S seconds (default: until SIGINT/SIGTERM or --count)")
    parser.add_argument("--count", type=int, default=None, metavar="N", help="stop after N messages")
    parser.add_argument("--socket-type", choices=("sub", "pull"), default="sub",
                        help="sub: subscribe to a PUB feed (default); pull: receive from PUSH publishers")
    parser.add_argument("--bind", action="store_true",
                        help="bind the endpoint instead of connecting (publishers connect to the recorder)")
    parser.add_argument("--instrument", type=int, action="append", default=None, metavar="ID",
                        help="record only this instrument's topic (repeatable; SUB only; default: everything)")
    parser.add_argument("--no-topic-frame", action="store_true",
                        help="mark the capture as single-frame messages (informational; frames are stored as received)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="permit a non-loopback tcp endpoint without CURVE (as security.allow_remote)")
    parser.add_argument("--flush-ms", type=float, default=None, metavar="MS",
                        help="write a block at least this often while messages are pending (default 200)")
    parser.add_argument("--flush-records", type=int, default=None, metavar="N",
                        help="write a block every N messages (default 4096)")
    parser.add_argument("--fsync", action="store_true", help="fsync every block (survives power loss; slower)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--force", action="store_true", help="overwrite an existing file")
    group.add_argument("--append", action="store_true",
                       help="append to an existing capture (a torn tail from a crash is cut first)")


def record_main(args: argparse.Namespace) -> int:
    import os

    from hft_infer.cli import UserError
    from hft_infer.replay import capture as cap
    from hft_infer.replay.recorder import record
    from hft_infer.transport.codec import topic_for
    from hft_infer.transport.sockets import is_local_endpoint

    if args.duration is not None and not args.duration > 0:
        raise UserError(f"--duration must be positive, got {args.duration}")
    if args.count is not None and args.count <= 0:
        raise UserError(f"--count must be positive, got {args.count}")
    if args.flush_ms is not None and not args.flush_ms > 0:
        raise UserError(f"--flush-ms must be positive, got {args.flush_ms}")
    if args.flush_records is not None and args.flush_records <= 0:
        raise UserError(f"--flush-records must be positive, got {args.flush_records}")
    if not args.allow_remote and not is_local_endpoint(args.endpoint):
        raise UserError(f"refusing non-loopback endpoint {args.endpoint!r}: pass --allow-remote to record it "
                        "without CURVE")
    if args.instrument and args.socket_type != "sub":
        raise UserError("--instrument filters topics: it needs --socket-type sub")
    parent = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(parent):
        raise UserError(f"cannot write {args.out}: directory {parent} does not exist")
    if os.path.exists(args.out) and not (args.force or args.append):
        raise UserError(f"{args.out} exists: pass --force to overwrite it or --append to add to it")
    for i in args.instrument or ():
        if not 0 <= i <= 0xFFFFFFFE:
            raise UserError(f"--instrument {i} is outside 0..4294967294")
    topics = [topic_for(i) for i in args.instrument] if args.instrument else None

    def ready(resolved: str) -> None:
        limits = [f"{args.duration:g} s" if args.duration else "", f"{args.count} messages" if args.count else ""]
        until = " or ".join(x for x in limits if x) or "SIGINT/SIGTERM"
        print(f"hft-infer record: recording {resolved} -> {args.out} until {until}", file=sys.stderr, flush=True)

    kw = {}
    if args.flush_ms is not None:
        kw["flush_ms"] = args.flush_ms
    if args.flush_records is not None:
        kw["flush_records"] = args.flush_records
    try:
        res = record(args.endpoint, args.out, duration_s=args.duration, max_events=args.count, topics=topics,
                     socket_type=args.socket_type, bind=args.bind, allow_remote=args.allow_remote,
                     topic_frame=not args.no_topic_frame, fsync=args.fsync, overwrite=args.force,
                     append=args.append, on_ready=ready, **kw)
    except (cap.CaptureError, FileExistsError) as e:
        raise UserError(str(e)) from None
    # Read the count back from the file itself: what a reader will see.
    info = cap.capture_info(args.out)
    print(f"recorded {res.recorded} messages ({res.frames} frames, {res.frame_bytes} bytes) "
          f"in {res.duration_s:.2f} s from {res.endpoint}; stopped by {res.stopped_by}")
    print(f"{args.out}: {info['records']} messages in {info['blocks']} blocks, {info['file_bytes']} bytes, "
          f"{'closed cleanly' if info['clean'] else 'NOT closed cleanly'}")
    return 0


# -- helpers for replay sources (used by `replay`) ------------------------------


def parse_instrument_ids(text: str) -> list[int] | dict[str, int]:
    """`--instrument-ids`: "3,4" (one id per file, in order) or "AAPL=3,MSFT=4" (by ticker)."""
    from hft_infer.cli import UserError

    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise UserError("--instrument-ids is empty")
    try:
        if all("=" in s for s in items):
            return {k.strip(): int(v) for k, v in (s.split("=", 1) for s in items)}
        if any("=" in s for s in items):
            raise ValueError
        return [int(s) for s in items]
    except ValueError:
        raise UserError(f"--instrument-ids {text!r}: expected ids (3,4) or TICKER=ID pairs (AAPL=3,MSFT=4)") from None


def load_lobster_source(paths: list[str], *, levels: int | None = None, strict: bool = False,
                        instrument_ids: str | None = None, quiet: bool = False):
    """LOBSTER files/folders -> LobsterResult, with one-line user errors and a skipped-lines summary."""
    from hft_infer.cli import UserError
    from hft_infer.replay.lobster import LobsterError, find_pairs, load_lobster

    ids = parse_instrument_ids(instrument_ids) if instrument_ids else None
    try:
        result = load_lobster(find_pairs(paths), levels=levels, strict=strict, instrument_ids=ids)
    except LobsterError as e:
        raise UserError(str(e)) from None
    n = result.counts["malformed_lines"]
    if n and not quiet:
        for line in result.skipped[:10]:
            print(f"skipped {line}", file=sys.stderr)
        more = f" ({n - 10} more not shown)" if n > 10 else ""
        print(f"{n} malformed lines skipped{more}; --strict makes them fatal", file=sys.stderr)
    return result


def read_capture_source(path: str, *, quiet: bool = False):
    """Capture file -> Capture, with one-line user errors and the recovered-loss summary."""
    from hft_infer.cli import UserError
    from hft_infer.replay.capture import CaptureError, read_capture

    try:
        capture = read_capture(path)
    except CaptureError as e:
        raise UserError(str(e)) from None
    if not quiet:
        clean = "" if capture.clean else " (not closed cleanly: recorded until a crash or kill)"
        print(f"{path}: {len(capture)} messages in {capture.blocks} blocks{clean}", file=sys.stderr)
    return capture


# -- replay (placeholder) ---------------------------------------------------------
# PLACEHOLDER, issue 7: the lead fills these in with the pacer and collector
# (replay/pacer.py, replay/collector.py). Sources are ready:
# load_lobster_source, read_capture_source, hft_infer.replay.synthetic.


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    """Placeholder: the replay options arrive with the pacer/collector."""


def replay_main(args: argparse.Namespace) -> int:
    """Placeholder until the pacer/collector land."""
    from hft_infer.cli import UserError

    raise UserError("replay: not implemented yet (issue 7); the pacer/collector are being built")
