"""The `hft-infer` command line: parse, dispatch to one command module, map errors to exit codes.

Arguments are defined in `parser` (argparse only, fast); the command's module
`hft_infer.app.<module>` is imported only when it runs, so `--help` never
loads torch. User errors (bad config, busy endpoint, missing file: the
`hft_infer.errors` types, `EndpointError`, missing or unreadable files) print
one line and exit 2; anything else is a bug and prints a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from hft_infer import __version__
from hft_infer.app.parser import COMMANDS
from hft_infer.errors import UserError
from hft_infer.transport.sockets import EndpointError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

USER_ERRORS = (UserError, EndpointError, FileNotFoundError, PermissionError, IsADirectoryError,
               NotADirectoryError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hft-infer",
        description="Microsecond-scale model inference on a ZeroMQ market-data stream.",
    )
    parser.add_argument("--version", action="version", version=f"hft-infer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, add_arguments, module) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        p.set_defaults(module=module)
    return parser


def run_command(args: argparse.Namespace) -> int:
    module = importlib.import_module(f"hft_infer.app.{args.module}")
    return int(module.main(args) or 0)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "module", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return run_command(args)
    except KeyboardInterrupt:
        return 130
    except USER_ERRORS as e:
        msg = str(e) if not isinstance(e, OSError) or not e.filename else f"{e.filename}: {e.strerror}"
        print(f"hft-infer {args.command}: error: {msg}", file=sys.stderr)
        return EXIT_USAGE
