"""The `hft-infer` command line.

Every subcommand's implementation is imported lazily, so `--help` and
`check-config` stay fast (torch takes seconds to import). User errors
(bad config, busy endpoint, missing file) print one line and exit 2; only
bugs print a traceback.
"""

from __future__ import annotations

import argparse
import sys

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class UserError(Exception):
    """An error the user can fix (bad arguments, files, config); printed as one line."""


def _user_error_types() -> tuple[type[BaseException], ...]:
    from hft_infer.config import ConfigError
    from hft_infer.transport.sockets import EndpointError

    return (UserError, ConfigError, EndpointError, FileNotFoundError, PermissionError)


def _not_implemented(name: str, issue: str):
    def run(args: argparse.Namespace) -> int:
        print(f"hft-infer {name}: not implemented yet ({issue})", file=sys.stderr)
        return EXIT_USAGE

    return run


def _add_config_args(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("-c", "--config", required=required, metavar="FILE",
                   help="TOML config (default: the embedded configs/default.toml; builtin:NAME for others)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (TOML syntax; repeatable), e.g. --set scheduler.policy=window")


def cmd_check_config(args: argparse.Namespace) -> int:
    from hft_infer.config import load_config
    from hft_infer.config import dump_toml

    cfg = load_config(args.file, args.overrides)
    print(dump_toml(cfg), end="")
    return EXIT_OK


def _lazy(module: str, func: str):
    def run(args: argparse.Namespace) -> int:
        import importlib

        return importlib.import_module(module).__getattribute__(func)(args)

    return run


def _register(sub, name: str, module: str, add_args: str, func: str, help_text: str, issue: str) -> None:
    """A subcommand whose arguments and body live in `module` (kept free of heavy
    imports at module level so that building the parser stays fast)."""
    import importlib

    p = sub.add_parser(name, help=help_text, description=help_text)
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or not module.startswith(e.name):
            raise
        p.set_defaults(func=_not_implemented(name, issue))
        return
    getattr(mod, add_args)(p)
    p.set_defaults(func=getattr(mod, func))


def build_parser() -> argparse.ArgumentParser:
    from hft_infer import __version__

    parser = argparse.ArgumentParser(
        prog="hft-infer",
        description="Microsecond-scale model inference on a ZeroMQ market-data stream.",
    )
    parser.add_argument("--version", action="version", version=f"hft-infer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("serve", help="run the service until SIGINT/SIGTERM",
                       description="Run the inference service: ingest, schedule, step, publish. "
                                   "On SIGTERM/SIGINT it drains, prints the latency table and exits 0.")
    _add_config_args(p)
    p.add_argument("--shard", metavar="I/N", help="serve only shard I of N (instrument position %% N == I)")
    p.add_argument("--run-dir", metavar="DIR", help="where to write summary JSON and histograms")
    p.add_argument("--no-control", action="store_true", help="do not start the control process (dashboard)")
    p.add_argument("--json", metavar="PATH", help="also write the final summary JSON here")
    p.set_defaults(func=_lazy("hft_infer.serve", "main"))

    p = sub.add_parser("bench", help="the main job: service + open-loop synthetic load + latency table",
                       description="Start the service as a subprocess, offer open-loop synthetic load at "
                                   "--rate events/s and print per-stage and tick-to-decision percentiles "
                                   "and the accounting.")
    _add_config_args(p)
    p.add_argument("--rate", type=float, default=20_000, help="offered events/s (default 20000)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of load (default 10)")
    p.add_argument("--instruments", type=int, default=None, help="instruments in the feed (default: universe size)")
    p.add_argument("--poisson", action="store_true", help="Poisson arrivals instead of a constant rate")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of load before measuring (default 1)")
    p.add_argument("--json", metavar="PATH", help="write the result JSON here")
    p.add_argument("--run-dir", metavar="DIR", help="keep the service's histograms and logs here")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--pacer", choices=("auto", "spin", "sleep"), default="auto",
                   help="spin: hit send times by spinning (accurate); sleep: sleep through every wait (for "
                        "machines with too few cores to give the service, the pacer and their I/O threads "
                        "one each); auto (default): spin with 4 or more cores, else sleep")
    p.add_argument("--quiet", action="store_true", help="no live progress display")
    p.set_defaults(func=_lazy("hft_infer.bench", "main"))

    _register(sub, "replay", "hft_infer.replay.cli", "add_replay_arguments", "replay_main",
              "replay recorded or synthetic market data through a running service", "issue 7")
    _register(sub, "record", "hft_infer.replay.cli", "add_record_arguments", "record_main",
              "record a live feed into a capture file", "issue 7")
    _register(sub, "report", "hft_infer.control.report", "add_arguments", "main",
              "HTML/PNG latency report comparing runs", "issue 8")
    _register(sub, "dashboard", "hft_infer.control.process", "add_arguments", "main",
              "run the control process (dashboard, /metrics, HDR logs) on its own", "issue 8")
    p = sub.add_parser("check-config", help="validate a config and print it resolved",
                       description="Print the resolved config; a bad file gives one line naming the "
                                   "field and exit code 2.")
    p.add_argument("file", nargs="?", default=None, help="TOML file (default: the embedded default)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.set_defaults(func=cmd_check_config)

    _register(sub, "systemd-unit", "hft_infer.systemd", "add_arguments", "main",
              "print a systemd unit for a config", "issue 9")
    _register(sub, "keys", "hft_infer.security", "add_arguments", "main",
              "CURVE key management (generate, show)", "issue 9")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    user_errors = _user_error_types()
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except user_errors as e:
        msg = str(e) if not isinstance(e, OSError) or not e.filename else f"{e.filename}: {e.strerror}"
        print(f"hft-infer {args.command}: error: {msg}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    from hft_infer.cli import main as _main  # one module object, so one UserError class

    sys.exit(_main())
