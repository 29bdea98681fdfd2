"""`hft-infer record` and `hft-infer replay`.

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
        if not 0 <= i <= 0xFFFFFFFD:
            raise UserError(f"--instrument {i} is outside 0..4294967293")
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


# -- replay ----------------------------------------------------------------------


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Replay market data through a service, open loop, and account for every event. SOURCE is "
        "'synthetic', LOBSTER message/orderbook CSV files or folders, or a capture file from "
        "`hft-infer record`. By default the service named by the config must be running (replay binds "
        "its feed endpoint); --start-service runs one as a child instead.")
    parser.add_argument("sources", nargs="+", metavar="SOURCE",
                        help="'synthetic', LOBSTER files/folders, or a capture file (.cap)")
    parser.add_argument("--source", choices=("auto", "synthetic", "lobster", "capture"), default="auto",
                        help="source kind (default: from the names)")
    parser.add_argument("-c", "--config", metavar="FILE",
                        help="the service's config: endpoints, universe, model for --verify (default: embedded)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    pace = parser.add_mutually_exclusive_group()
    pace.add_argument("--speed", type=float, metavar="X",
                      help="original timestamps scaled by 1/X (default for LOBSTER and captures: 1)")
    pace.add_argument("--rate", type=float, metavar="R", help="a fixed rate, events/s (default for synthetic: 20000)")
    pace.add_argument("--max", action="store_true", help="as fast as possible")
    parser.add_argument("--poisson", action="store_true", help="with --rate: Poisson arrivals")
    parser.add_argument("--events", type=int, default=200_000, help="synthetic: number of events (default 200000)")
    parser.add_argument("--instruments", type=int, default=None, help="synthetic: instruments (default: universe)")
    parser.add_argument("--seed", type=int, default=1, help="synthetic: seed")
    parser.add_argument("--levels", type=int, default=None, help="book levels to send (default: the model's)")
    parser.add_argument("--strict", action="store_true", help="LOBSTER: a malformed line is fatal")
    parser.add_argument("--instrument-ids", metavar="IDS", help="LOBSTER: '3,4' by file or 'AAPL=3,MSFT=4' by ticker")
    parser.add_argument("--verify", action="store_true",
                        help="compare every decision with the model's offline reference; exit 1 on a mismatch")
    parser.add_argument("--tolerance", type=float, default=None, help="--verify: max |score difference| (1e-4)")
    parser.add_argument("--show-mismatches", type=int, default=10, metavar="N")
    parser.add_argument("--start-service", action="store_true",
                        help="run `hft-infer serve` with this config as a child for the replay")
    parser.add_argument("--json", metavar="PATH", help="write the result JSON (bench schema) here")
    parser.add_argument("--run-dir", metavar="DIR", help="where to write summary.json and histograms")
    parser.add_argument("--quiet", action="store_true", help="no progress display")


def _source_kind(args: argparse.Namespace) -> str:
    if args.source != "auto":
        return args.source
    if args.sources == ["synthetic"]:
        return "synthetic"
    if all(p.endswith((".cap", ".capture")) for p in args.sources):
        return "capture"
    return "lobster"


def _load(args: argparse.Namespace, cfg, kind: str):
    """(events, feed, offsets, event_record, description) for the chosen source and pacing."""
    import numpy as np

    from hft_infer.cli import UserError
    from hft_infer.replay import pacer
    from hft_infer.replay.capture import decode_events

    levels = args.levels
    if levels is None:
        from hft_infer.bench import model_levels

        levels = model_levels(cfg)
    event_record = None
    ts = None
    if kind == "capture":
        if len(args.sources) != 1:
            raise UserError("replay one capture file at a time")
        capture = read_capture_source(args.sources[0], quiet=args.quiet)
        decoded = decode_events(capture, levels)
        events, event_record = decoded.events, decoded.record_index
        msgs = capture.messages()
        feed = pacer.feed_from_frames([(m[0], m[-1]) if len(m) > 1 else (b"", m[0]) for m in msgs])
        if capture.header.topic_frame != cfg.ingest.topic_frame:
            raise UserError("the capture's topic framing differs from the service's (ingest.topic_frame)")
        ts = capture.recv_ts_ns
    elif kind == "lobster":
        result = load_lobster_source(args.sources, levels=levels, strict=args.strict,
                                     instrument_ids=args.instrument_ids, quiet=args.quiet)
        events = result.events
        feed = pacer.encode_feed(events)
        ts = events["ts_exchange_ns"]
    else:
        from hft_infer.replay.synthetic import SyntheticConfig, generate

        ids = cfg.universe.owned_ids()
        n_inst = args.instruments or len(ids)
        if n_inst > len(ids):
            raise UserError(f"--instruments {n_inst} exceeds the service's universe ({len(ids)})")
        events = generate(args.events, SyntheticConfig(instruments=n_inst, levels=levels, seed=args.seed,
                                                       rate_hz=args.rate or 20_000.0))
        if ids != list(range(len(ids))):
            events["instrument"] = np.asarray(ids, dtype=np.uint32)[events["instrument"]]
        feed = pacer.encode_feed(events)
        ts = events["ts_exchange_ns"]
    n = len(feed)
    if n == 0:
        raise UserError("the source holds no events")
    if args.max:
        return events, feed, pacer.as_fast_as_possible(n), event_record, "as fast as possible"
    if args.rate is not None:
        offsets = pacer.poisson_rate(n, args.rate, args.seed) if args.poisson else pacer.constant_rate(n, args.rate)
        return events, feed, offsets, event_record, f"{args.rate:g} events/s{' Poisson' if args.poisson else ''}"
    speed = args.speed if args.speed is not None else 1.0
    if kind == "synthetic" and args.speed is None:
        return events, feed, pacer.constant_rate(n, 20_000.0), event_record, "20000 events/s"
    return events, feed, pacer.by_timestamps(np.asarray(ts), speed), event_record, f"original timing x{speed:g}"


def replay_main(args: argparse.Namespace) -> int:
    import json
    import os
    import time
    from pathlib import Path

    from hft_infer.cli import UserError
    from hft_infer.config import load_config
    from hft_infer.drive import Load, Target, drive, print_result

    if args.poisson and args.rate is None:
        raise UserError("--poisson goes with --rate")
    for name in ("speed", "rate"):
        v = getattr(args, name)
        if v is not None and not v > 0:
            raise UserError(f"--{name} must be > 0")
    cfg = load_config(args.config, args.overrides)
    kind = _source_kind(args)
    events, feed, offsets, event_record, how = _load(args, cfg, kind)
    run_dir = Path(args.run_dir or os.path.join("runs", f"replay-{time.strftime('%Y%m%d-%H%M%S')}"))
    load = Load(events, feed, offsets, description=f"{kind}, {how}", event_record=event_record)
    out, _stats, result = drive(load, Target(cfg, args.config, list(args.overrides), args.start_service), run_dir,
                                quiet=args.quiet, label="replay",
                                extra={"rate_offered": float(len(feed) / max((offsets[-1] - offsets[0]) / 1e9, 1e-9))
                                       if len(feed) > 1 and offsets[-1] > offsets[0] else None,
                                       "source": kind, "sources": list(args.sources), "pacing": how})
    status = 0
    if args.verify:
        from hft_infer.verify import DEFAULT_TOLERANCE, verify

        tol = args.tolerance if args.tolerance is not None else DEFAULT_TOLERANCE
        try:
            vr = verify(result.decisions, events, cfg, tolerance=tol, service_model_version=out["model_version"])
        except ValueError as e:
            raise UserError(f"verify: {e}") from None
        out["verify"] = {"compared": vr.compared, "mismatches": len(vr.mismatches), "max_abs_diff": vr.max_abs_diff,
                         "tolerance": tol, "model_version": vr.model_version}
        print(vr.report(args.show_mismatches), file=sys.stderr)
        if not vr.ok or vr.compared == 0:
            status = 1
    text = json.dumps(out, indent=2)
    (run_dir / "summary.json").write_text(text)
    if args.json:
        Path(args.json).write_text(text)
    print_result(out, f"hft-infer replay — {kind}, {how}, {out['rate_achieved']:,.0f} events/s achieved, "
                      f"model={out['model_version']}")
    if out["accounting"]["lost"] != 0:
        status = 1
    return status
