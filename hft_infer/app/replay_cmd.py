"""`hft-infer replay`: replay a LOBSTER day, a capture or synthetic data through a service."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from hft_infer.app.bench import check_harness_args, check_output_paths, exit_status, model_levels, run_with_floor
from hft_infer.app.drive import HarnessOptions, Load, Target, print_result
from hft_infer.app.verify import default_tolerance, verify
from hft_infer.config import load_config
from hft_infer.errors import UserError
from hft_infer.replay import pacer
from hft_infer.replay.capture import CaptureError, decode_events, read_capture
from hft_infer.replay.lobster import LobsterError, find_pairs, load_lobster
from hft_infer.replay.synthetic import SyntheticConfig, generate


def parse_instrument_ids(text: str) -> list[int] | dict[str, int]:
    """`--instrument-ids`: "3,4" (one id per file, in order) or "AAPL=3,MSFT=4" (by ticker)."""

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

    ids = parse_instrument_ids(instrument_ids) if instrument_ids else None
    try:
        result = load_lobster(find_pairs(paths), levels=levels, strict=strict, instrument_ids=ids)
    except LobsterError as e:
        raise UserError(str(e)) from None
    n = result.counts["malformed_lines"]
    if n:  # the count even with --quiet: a replay of fewer events than the file holds must say so
        if not quiet:
            for line in result.skipped[:10]:
                print(f"skipped {line}", file=sys.stderr)
        more = f" ({n - 10} more not shown)" if n > 10 and not quiet else ""
        print(f"{n} malformed lines skipped{more}; --strict makes them fatal", file=sys.stderr)
    return result


def read_capture_source(path: str, *, quiet: bool = False):
    """Capture file -> Capture, with one-line user errors and the recovered-loss summary."""

    try:
        capture = read_capture(path)
    except CaptureError as e:
        raise UserError(str(e)) from None
    if not quiet:
        clean = "" if capture.clean else " (not closed cleanly: recorded until a crash or kill)"
        print(f"{path}: {len(capture)} messages in {capture.blocks} blocks{clean}", file=sys.stderr)
    return capture




def source_kind(args: argparse.Namespace) -> str:
    """`--source`, or from SOURCE's names: 'synthetic', capture files (.cap), else LOBSTER."""
    if args.source != "auto":
        return args.source
    if args.sources == ["synthetic"]:
        return "synthetic"
    if all(p.endswith((".cap", ".capture")) for p in args.sources):
        return "capture"
    return "lobster"


def _load(args: argparse.Namespace, cfg, kind: str):
    """(events, feed, offsets, event_record, description) for the chosen source and pacing."""

    levels = args.levels
    if levels is None:
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


def check_numbers(args: argparse.Namespace) -> None:
    """Bad numbers are one-line usage errors, before anything is loaded."""
    if args.poisson and args.rate is None:
        raise UserError("--poisson goes with --rate")
    for name in ("speed", "rate"):
        v = getattr(args, name)
        if v is not None and not v > 0:
            raise UserError(f"--{name} must be > 0 (got {v:g})")
    for name, v, low in (("events", args.events, 1), ("instruments", args.instruments, 1),
                         ("levels", args.levels, 1), ("show-mismatches", args.show_mismatches, 0)):
        if v is not None and v < low:
            raise UserError(f"--{name} must be >= {low} (got {v})")
    if args.tolerance is not None and not args.tolerance >= 0:
        raise UserError(f"--tolerance must be >= 0 (got {args.tolerance:g})")
    check_harness_args(args)
    check_output_paths(args)


def main(args: argparse.Namespace) -> int:
    check_numbers(args)
    cfg = load_config(args.config, args.overrides)
    kind = source_kind(args)
    events, feed, offsets, event_record, how = _load(args, cfg, kind)
    run_dir = Path(args.run_dir or os.path.join("runs", f"replay-{time.strftime('%Y%m%d-%H%M%S')}"))
    load = Load(events, feed, offsets, description=f"{kind}, {how}", event_record=event_record)
    target = Target(cfg, args.config, list(args.overrides), args.start_service or args.null_service,
                    null=args.null_service, null_egress=args.null_egress, null_delay_us=args.null_delay_us)
    span_s = (offsets[-1] - offsets[0]) / 1e9 if len(feed) > 1 else 0.0
    harness = HarnessOptions(args.pacer, args.collectors, reset_first=True, feed_batch=args.feed_batch)
    out, _stats, result = run_with_floor(load, target, run_dir, with_floor=args.with_floor, label="replay",
                                         quiet=args.quiet, harness=harness,
                                         extra={"rate_offered": len(feed) / span_s if span_s > 0 else None,
                                                "source": kind, "sources": list(args.sources), "pacing": how})
    status = 0
    if args.verify:
        tol = args.tolerance
        if tol is None:
            tol, note = default_tolerance(cfg, out.get("precision"))
            if note:
                print(note, file=sys.stderr)
        try:
            vr = verify(result.decisions, events, cfg, tolerance=tol, service_model_version=out["model_version"])
        except ValueError as e:
            raise UserError(f"verify: {e}") from None
        out["verify"] = {"compared": vr.compared, "mismatches": len(vr.mismatches), "max_abs_diff": vr.max_abs_diff,
                         "tolerance": tol, "model_version": vr.model_version}
        print(vr.report(args.show_mismatches), file=sys.stderr)
        if not vr.ok or vr.compared == 0:
            print("replay: exit 1: verify found mismatches" if not vr.ok else
                  "replay: exit 1: verify compared no decision", file=sys.stderr)
            status = 1
    text = json.dumps(out, indent=2)
    (run_dir / "summary.json").write_text(text)
    if args.json:
        Path(args.json).write_text(text)
    what = "the null service (harness floor)" if out["service"] == "null" else f"model={out['model_version']}"
    print_result(out, f"hft-infer replay — {kind}, {how}, {out['rate_achieved']:,.0f} events/s achieved, {what}")
    if args.json:
        print(f"json: {args.json}")
    return exit_status(out, "replay") or status
