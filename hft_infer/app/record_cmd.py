"""`hft-infer record`: record a live feed into a capture file.

The endpoint is checked before anything is created (malformed: exit 2;
`--bind` on a path or port in use: exit 2), and a feed that sends nothing
for `--warn-silent-after` seconds is reported once: a subscriber connected
to the wrong place records nothing and libzmq says nothing about it.
"""

from __future__ import annotations

import argparse
import os
import sys

from hft_infer.channels import check_transports, feed_address
from hft_infer.config import load_config
from hft_infer.errors import UserError
from hft_infer.replay import capture as cap
from hft_infer.replay.recorder import record
from hft_infer.transport.codec import topic_for
from hft_infer.transport.shm import EXTRA, available, service_of
from hft_infer.transport.sockets import ensure_bindable, is_local_endpoint, parse_endpoint


def main(args: argparse.Namespace) -> int:
    if args.duration is not None and not args.duration > 0:
        raise UserError(f"--duration must be positive, got {args.duration}")
    if args.count is not None and args.count <= 0:
        raise UserError(f"--count must be positive, got {args.count}")
    if args.flush_ms is not None and not args.flush_ms > 0:
        raise UserError(f"--flush-ms must be positive, got {args.flush_ms}")
    if args.flush_records is not None and args.flush_records <= 0:
        raise UserError(f"--flush-records must be positive, got {args.flush_records}")
    if not args.warn_silent_after >= 0:
        raise UserError(f"--warn-silent-after must be >= 0, got {args.warn_silent_after}")
    cfg = load_config(args.config, args.overrides)
    check_transports(cfg)
    service_feed = feed_address(cfg)
    endpoint = args.endpoint or service_feed
    shm = service_of(endpoint) is not None  # iceoryx2:SERVICE (transport/shm.py): host-local, nothing to bind
    if shm and (args.bind or args.socket_type != "sub" or args.instrument):
        raise UserError("--bind, --socket-type pull and --instrument are ZeroMQ options: not for an iceoryx2 feed")
    if shm and not available():
        raise UserError(f"recording {endpoint} needs the iceoryx2 package: {EXTRA}")
    if not shm:
        parse_endpoint(endpoint, bind=args.bind)
    if not shm and not args.allow_remote and not is_local_endpoint(endpoint):
        raise UserError(f"refusing non-loopback endpoint {endpoint!r}: pass --allow-remote to record it "
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
    if args.bind:
        ensure_bindable(endpoint)  # before the file is created: a busy endpoint leaves nothing behind
    topics = [topic_for(i) for i in args.instrument] if args.instrument else None

    def ready(resolved: str) -> None:
        limits = [f"{args.duration:g} s" if args.duration else "", f"{args.count} messages" if args.count else ""]
        until = " or ".join(x for x in limits if x) or "SIGINT/SIGTERM"
        print(f"hft-infer record: recording {resolved} -> {args.out} until {until}", file=sys.stderr, flush=True)

    def silent(seconds: float) -> None:
        hint = (f"the config's service reads {service_feed}" if endpoint != service_feed
                else "nothing publishes on the service's feed yet")
        print(f"hft-infer record: warning: no message from {endpoint} in {seconds:.0f} s ({hint}); "
              "still recording", file=sys.stderr, flush=True)

    kw = {}
    if args.flush_ms is not None:
        kw["flush_ms"] = args.flush_ms
    if args.flush_records is not None:
        kw["flush_records"] = args.flush_records
    try:
        res = record(endpoint, args.out, duration_s=args.duration, max_events=args.count, topics=topics,
                     socket_type=args.socket_type, bind=args.bind, allow_remote=args.allow_remote,
                     topic_frame=not args.no_topic_frame, fsync=args.fsync, overwrite=args.force,
                     append=args.append, on_ready=ready, on_silence=silent if args.warn_silent_after else None,
                     silence_s=args.warn_silent_after, shm_buffer=cfg.ingest.shm_buffer, **kw)
    except (cap.CaptureError, FileExistsError) as e:
        raise UserError(str(e)) from None
    # Read the count back from the file itself: what a reader will see.
    info = cap.capture_info(args.out)
    print(f"recorded {res.recorded} messages ({res.frames} frames, {res.frame_bytes} bytes) "
          f"in {res.duration_s:.2f} s from {res.endpoint}; stopped by {res.stopped_by}")
    print(f"{args.out}: {info['records']} messages in {info['blocks']} blocks, {info['file_bytes']} bytes, "
          f"{'closed cleanly' if info['clean'] else 'NOT closed cleanly'}")
    return 0
