"""`hft-infer keys`: CURVE key pairs (generate, show) and a config's security check."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hft_infer.config import load_config
from hft_infer.errors import UserError
from hft_infer.security import (
    check_key_permissions,
    check_security,
    config_endpoints,
    curve_for_egress,
    curve_for_ingest,
    mode_problem,
    serves_curve,
)
from hft_infer.transport.curve import (
    CurveKeyError,
    load_authorized_keys,
    read_key_file,
    write_keypair,
)
from hft_infer.transport.sockets import is_local_endpoint


def main(args: argparse.Namespace) -> int:
    try:
        if args.keys_command == "generate":
            public, secret = write_keypair(args.dir, args.name)
            print(f"public key:  {public}  (give to peers; a client's goes into the server's authorized dir)")
            print(f"secret key:  {secret}  (mode 0600; point security.curve_server_secret here)")
            print(f"public-key = {read_key_file(public)[0].decode()}")
            return 0
        if args.keys_command == "show":
            public, secret = read_key_file(args.file)
            print(f"public-key = {public.decode()}")
            print(f"secret key: {'yes' if secret else 'no'}")
            problem = mode_problem(Path(args.file), secret=secret is not None)
            if problem:
                print(f"warning: {problem}", file=sys.stderr)
            return 0
        if args.keys_command == "check":
            return _check(args)
    except CurveKeyError as e:
        raise UserError(str(e)) from None
    raise UserError(f"unknown keys action {args.keys_command!r}")


def _check(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    warnings = check_security(cfg)
    warnings += [w for w in check_key_permissions(cfg, args.config) if w not in warnings]
    egress, ingest = curve_for_egress(cfg), curve_for_ingest(cfg)
    endpoints = {name: endpoint for name, endpoint, _ in config_endpoints(cfg)}
    print(f"egress {endpoints['egress.endpoint']}: {'CURVE server' if egress else 'plain'}")
    print(f"ingest {endpoints['ingest.endpoint']}: "
          f"{type(ingest).__name__.replace('Curve', 'CURVE ').lower() if ingest else 'plain'}")
    control = endpoints["metrics.control_endpoint"]
    # never CURVE: check_security has refused it off loopback unless allow_remote (then it warns)
    print(f"control {control}: {'plain (ipc/loopback)' if is_local_endpoint(control) else 'plain, NOT loopback'}")
    if serves_curve(cfg):
        keys = load_authorized_keys(cfg.security.curve_authorized_dir)
        print(f"authorized clients ({len(keys)}): {', '.join(sorted(keys.values())) or 'none'}")
    for w in warnings:
        print(f"warning: {w}")
    return 0
